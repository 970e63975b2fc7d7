"""Two processes share autotuning results through a ``jitkey.DiskIndex`` (or, across hosts, through Redis).

Process 1 calls an autotuned kernel: it benchmarks every config, launches the winner and stores the choice
in the index. Process 2 (a fresh interpreter, like a second pytest-xdist worker or the next training run)
makes the same call: it finds the choice on disk and launches it without benchmarking anything.

**Second-host mode** (``--second-host``): the two processes play two machines. Each has its own local
``DiskIndex`` directory, and both share a ``jitkey.TieredIndex`` remote tier on Redis (``--redis-url``, or a
``redis-server`` started here on a free loopback port: from ``PATH``, ``$JITKEY_REDIS_SERVER`` or
``.redis-debs/``, see ``scripts/fetch_redis_server.sh``). Process 2's local index is empty: it finds the
choice on the remote, copies it into its local index and benchmarks nothing.

* **GPU mode** (``torch.cuda.is_available()``): a real Triton kernel (``@jitkey.triton.autotune`` over
  ``@jitkey.triton.jit``), timed by ``triton.testing.do_bench``.
* **CPU mode** (no GPU, e.g. CI): the *timer is simulated* and so is the launch. ``do_bench`` returns a
  deterministic cost-model time for the config it saw launched, and the launcher computes the kernel's
  result on the CPU block by block with the config's ``BLOCK`` (so the output is still checked). Everything
  else (keys, selection, the in-memory cache and the DiskIndex) is the real code path.

Run: ``python examples/shared_autotune.py [--mode cpu|gpu] [--index DIR] [--second-host [--redis-url URL]]``.
The last line is ``RESULT {json}`` (asserted by ``tests/test_examples.py``); ``--mode gpu`` without a GPU, or
``--second-host`` without a Redis server, prints why and a ``RESULT`` with ``"skipped"``, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
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


# tests/_autotune_workers.py tunes this kernel too (with its own configs and simulated times).
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


def worker(mode: str, index_dir: str, redis_url: str | None = None) -> dict[str, Any]:
    device = "cuda" if mode == "gpu" else "cpu"
    sim = SimulatedGPU() if mode == "cpu" else None
    index: Any = jitkey.DiskIndex(index_dir)
    if redis_url:  # one "host": its own local index, the shared remote tier
        index = jitkey.TieredIndex(index, jitkey.RemoteIndex(redis_url, namespace="shared-autotune-example"))
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
            "index_stats": {
                k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in index.stats().items()
            },
        }
    finally:
        index.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--index", help="DiskIndex directory (default: a fresh temporary one)")
    ap.add_argument(
        "--second-host",
        action="store_true",
        help="two hosts: separate local indexes, a shared Redis tier (a local redis-server unless --redis-url)",
    )
    ap.add_argument(
        "--redis-url", help="the shared Redis for --second-host (default: start a redis-server here)"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.mode, a.index, a.redis_url)))
        return
    if a.mode == "gpu" and not torch.cuda.is_available():
        skip(a.mode, "--mode gpu needs an NVIDIA GPU (torch.cuda.is_available() is False); use --mode cpu")
        return
    server = None
    if a.second_host and not a.redis_url:
        from jitkey._redis_server import RedisServer, RedisServerError

        try:
            server = RedisServer().start()
        except RedisServerError as exc:
            skip(a.mode, f"--second-host needs a Redis server: {exc}")
            return
        a.redis_url = server.url
    index_dir = a.index or tempfile.mkdtemp(prefix="jitkey-shared-autotune-")
    try:
        run_pair(a.mode, index_dir, a.redis_url if a.second_host else None)
    finally:
        if a.index is None:
            shutil.rmtree(index_dir, ignore_errors=True)
        if server is not None:
            server.stop()


def skip(mode: str, reason: str) -> None:
    print(f"skipped: {reason}")
    print("RESULT " + json.dumps({"mode": mode, "skipped": reason}, sort_keys=True))


def run_pair(mode: str, index_dir: str, redis_url: str | None = None) -> None:
    print(f"mode: {mode}" + (" (CPU: the launch and the timer are SIMULATED)" if mode == "cpu" else ""))
    if redis_url:
        print(
            f"second-host mode: each process has its own local index under {index_dir}; shared Redis {redis_url}"
        )
    else:
        print(f"index: {index_dir}")
    runs = []
    for i in (1, 2):
        cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--index", index_dir]
        if redis_url:
            cmd[-1] = os.path.join(index_dir, f"host{i}")
            cmd += ["--redis-url", redis_url]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"process {i} failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(r)
        st = r["stats"]
        ist = r["index_stats"]
        remote = (
            f", remote hits={ist['remote_hits']} puts={ist['remote_puts']} errors={ist['remote_errors']}"
            if redis_url
            else ""
        )
        print(
            f"{'host' if redis_url else 'process'} {i}: benchmarked {r['bench_calls']} configs, "
            f"tunings={st['tunings']}, disk_hits={st['disk_hits']}{remote}, chose {r['config']} "
            f"num_warps={r['num_warps']}, first call {r['first_call_s'] * 1000:.1f} ms, "
            f"result correct: {r['correct']}"
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
        "second_host": bool(redis_url),
    }
    if redis_url:
        for i, r in ((1, p1), (2, p2)):
            ist = r["index_stats"]
            for k in ("remote_hits", "remote_misses", "remote_puts", "remote_errors", "remote_timeouts"):
                result[f"p{i}_{k}"] = ist[k]
            result[f"p{i}_local_dir"] = ist["path"]
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
