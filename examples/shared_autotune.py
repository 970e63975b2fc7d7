"""Two processes share autotuning results through a ``jitkey.DiskIndex``.

Process 1 calls an autotuned kernel: it benchmarks every config, launches the winner and stores the choice
in the index. Process 2 (a fresh interpreter, like a second pytest-xdist worker or the next training run)
makes the same call: it finds the choice on disk and launches it without benchmarking anything.

* **GPU mode** (``torch.cuda.is_available()``): a real Triton kernel (``@jitkey.triton.autotune`` over
  ``@jitkey.triton.jit``), timed by ``triton.testing.do_bench``.
* **CPU mode** (no GPU, e.g. CI): the *timer is simulated* and so is the launch. ``do_bench`` returns a
  deterministic cost-model time for the config it saw launched, and the launcher computes the kernel's
  result on the CPU block by block with the config's ``BLOCK`` (so the output is still checked). Everything
  else (keys, selection, the in-memory cache and the DiskIndex) is the real code path.

Run: ``python examples/shared_autotune.py [--mode cpu|gpu] [--index DIR]``. The last line is ``RESULT
{json}`` (asserted by ``tests/test_examples.py``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import triton
import triton.language as tl

import jitkey
import jitkey.triton as jt


@jt.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * alpha + y, mask=mask)


CONFIGS = [
    triton.Config({"BLOCK": 256}, num_warps=2),
    triton.Config({"BLOCK": 1024}, num_warps=4),
    triton.Config({"BLOCK": 4096}, num_warps=8),
]


def grid(meta: dict[str, Any]) -> tuple[int]:
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


class SimulatedGPU:
    """CPU stand-ins for the launch and the timer (CPU mode only)."""

    def __init__(self) -> None:
        self.bench_calls = 0
        self.last_block = 0

    def launcher(self, fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x, y, out, n, alpha = args
        block = kwargs["BLOCK"]
        programs = grid({**dict(zip(fn.arg_names, args, strict=False)), **kwargs})[0]
        for pid in range(programs):  # what each Triton program instance computes
            s, e = pid * block, min((pid + 1) * block, n)
            torch.add(x[s:e] * alpha, y[s:e], out=out[s:e])
        self.last_block = block

    def do_bench(self, kernel_call: Any, quantiles: tuple[float, ...]) -> list[float]:
        """Simulated time (ms): per-program launch overhead + per-element work + a penalty for big blocks."""
        self.bench_calls += 1
        kernel_call()
        b = self.last_block
        t = 1e-3 * (N / b) * 2.0 + N * 1e-6 + (b / 1024) ** 2 * 0.5
        return [t, t * 0.95, t * 1.05][: len(quantiles)]


N = 1 << 20


def worker(mode: str, index_dir: str) -> dict[str, Any]:
    device = "cuda" if mode == "gpu" else "cpu"
    sim = SimulatedGPU() if mode == "cpu" else None
    index = jitkey.DiskIndex(index_dir)
    try:
        kernel = jt.autotune(
            CONFIGS,
            key=["n"],
            index=index,
            do_bench=sim.do_bench if sim else None,
            launcher=sim.launcher if sim else None,
        )(scale_add)
        torch.manual_seed(0)
        x = torch.randn(N, device=device)
        y = torch.randn(N, device=device)
        out = torch.empty_like(x)
        t0 = time.perf_counter()
        kernel[grid](x, y, out, N, 0.5)
        if mode == "gpu":
            torch.cuda.synchronize()
        first_call_s = time.perf_counter() - t0
        correct = bool(torch.allclose(out, x * 0.5 + y))
        stats = kernel.cache_stats()
        return {
            "first_call_s": first_call_s,
            "correct": correct,
            "config": kernel.best_config.kwargs,
            "num_warps": kernel.best_config.num_warps,
            "stats": stats,
            "bench_calls": sim.bench_calls if sim else stats["benchmarks"],
        }
    finally:
        index.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--index", help="DiskIndex directory (default: a fresh temporary one)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.mode, a.index)))
        return
    index_dir = a.index or tempfile.mkdtemp(prefix="jitkey-shared-autotune-")
    try:
        run_pair(a.mode, index_dir)
    finally:
        if a.index is None:
            shutil.rmtree(index_dir, ignore_errors=True)


def run_pair(mode: str, index_dir: str) -> None:
    print(f"mode: {mode}" + (" (CPU: the launch and the timer are SIMULATED)" if mode == "cpu" else ""))
    print(f"index: {index_dir}")
    runs = []
    for i in (1, 2):
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", "--mode", mode, "--index", index_dir],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"process {i} failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(r)
        st = r["stats"]
        print(
            f"process {i}: benchmarked {r['bench_calls']} configs, tunings={st['tunings']}, "
            f"disk_hits={st['disk_hits']}, chose {r['config']} num_warps={r['num_warps']}, "
            f"first call {r['first_call_s'] * 1000:.1f} ms, result correct: {r['correct']}"
        )
    p1, p2 = runs
    result = {
        "mode": mode,
        "simulated_timer": mode == "cpu",
        "p1_bench_calls": p1["bench_calls"],
        "p1_tunings": p1["stats"]["tunings"],
        "p2_bench_calls": p2["bench_calls"],
        "p2_tunings": p2["stats"]["tunings"],
        "p2_disk_hits": p2["stats"]["disk_hits"],
        "same_config": p1["config"] == p2["config"] and p1["num_warps"] == p2["num_warps"],
        "config": p1["config"],
        "correct": p1["correct"] and p2["correct"],
        "p1_first_call_ms": p1["first_call_s"] * 1000,
        "p2_first_call_ms": p2["first_call_s"] * 1000,
    }
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
