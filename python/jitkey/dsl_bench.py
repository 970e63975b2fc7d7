"""GPU benchmark of kernel DSL calls: the torch op, the DSL plain, the DSL with only ``triton.jit`` routed through
jitkey, and the DSL through jitkey's DSL layer (:mod:`jitkey.integrations`).

``python -m jitkey bench --only dsl`` (or ``python -m jitkey.dsl_bench --json out.json``). Needs an NVIDIA GPU,
torch, triton and the DSL (Helion 1.4.0). Each mode runs in its own fresh process (a DSL's kernels are made
once per process: routed or not), ``--rounds`` processes per mode taking turns (plain, triton, dsl, plain, ...).
In every process each case's torch op and DSL call take turns batch by batch: ``--batches`` batches of
``--calls`` back-to-back calls, ``torch.cuda.synchronize()`` between batches (outside the timed region); a
figure is the median over batches of the host time per call, in µs, and a mode's figure the median over its
processes. Before timing, every DSL call's output is checked against the torch op (``torch.testing``
tolerances for the dtype), and in the ``dsl`` mode also bit for bit against the DSL's own path in the same
process. Inputs are small (4,096 fp32 elements for elementwise kernels), so the host, not the GPU, is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

MODES = ("plain", "triton", "dsl")
MODE_NAMES = {"plain": "DSL plain", "triton": "DSL + jitkey.triton", "dsl": "DSL + jitkey.dsl"}


# ---------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------


def helion_cases() -> list[tuple[str, Callable[..., Any], Any, tuple[Any, ...], dict[str, float]]]:
    """(name, torch op, Helion kernel, args, tolerances): elementwise, scalar arguments, reduction, softmax,
    matmul and a small attention (the kernels are in :mod:`jitkey._helion_kernels`)."""
    import torch

    from jitkey import _helion_kernels as hk

    dev = "cuda"
    f16 = torch.float16
    x, y = torch.randn(4096, device=dev), torch.randn(4096, device=dev)
    a2 = torch.randn(64, 256, device=dev)
    m1, m2 = torch.randn(64, 64, device=dev, dtype=f16), torch.randn(64, 64, device=dev, dtype=f16)
    q, kt, v = (torch.randn(64, 64, device=dev, dtype=f16) for _ in range(3))
    tol32 = {"rtol": 1.3e-6, "atol": 1e-5}
    tol16 = {"rtol": 2e-2, "atol": 2e-2}

    def axpby_ref(a: Any, b: Any, al: float, be: float) -> Any:
        return torch.add(a * al, b * be)

    def attn_ref(q: Any, kt: Any, v: Any) -> Any:
        return (torch.softmax((q @ kt).float() * 0.125, -1).to(f16) @ v).to(f16)

    return [
        ("add 4096 fp32", torch.add, hk.add, (x, y), tol32),
        ("axpby 4096 fp32 (2 scalars)", axpby_ref, hk.axpby, (x, y, 0.5, 2.0), tol32),
        ("row sum 64x256 fp32", lambda t: torch.sum(t, -1), hk.row_sum, (a2,), {"rtol": 1e-5, "atol": 1e-4}),
        ("softmax 64x256 fp32", lambda t: torch.softmax(t, 1), hk.softmax, (a2,), tol32),
        ("matmul 64x64 fp16", torch.mm, hk.matmul, (m1, m2), tol16),
        ("attention 64x64 fp16", attn_ref, hk.attention, (q, kt, v), tol16),
    ]


# ---------------------------------------------------------------------------------------------------------
# One process: one mode
# ---------------------------------------------------------------------------------------------------------


def _time(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def child(mode: str, batches: int, calls: int) -> dict[str, Any]:
    """Measure every case in this process under ``mode`` (see the module docs)."""
    if mode == "triton":
        import jitkey.triton

        jitkey.triton.install()
    elif mode == "dsl":
        import jitkey

        on = jitkey.install()
        if on.get("helion") is not None:
            raise SystemExit(f"dsl_bench: the Helion integration is off: {on['helion']}")
    own = None
    if mode == "dsl":
        from jitkey.integrations import helion as jh

        own = jh._saved[0]  # type: ignore[index]  # Helion's own Kernel.__call__
    rows: list[dict[str, Any]] = []
    for name, ref, kernel, args, tol in helion_cases():
        try:
            rows.append(_measure(name, ref, kernel, args, tol, own, batches, calls))
        except Exception as exc:  # a case that does not run here is reported, the others still run
            rows.append({"case": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    rep = None
    if mode == "dsl":
        import jitkey.dsl

        rep = jitkey.dsl.report(top=20)
    return {"mode": mode, "rows": rows, "dsl_report": rep}


def _measure(
    name: str,
    ref: Any,
    kernel: Any,
    args: tuple[Any, ...],
    tol: dict[str, float],
    own: Any,
    batches: int,
    calls: int,
) -> dict[str, Any]:
    import torch

    if True:
        for _ in range(3):  # compile, record, replay
            out = kernel(*args)
        torch.testing.assert_close(out, ref(*args), **tol)  # type: ignore[arg-type]
        if own is not None:
            mine = own(kernel, *args)
            for _ in range(2):
                out = kernel(*args)
            if not torch.equal(out, mine):
                raise AssertionError(f"{name}: jitkey.dsl's output differs from Helion's own path")
        impls = {"torch op": (ref, args), "torch.add": (torch.add, (args[0], args[0])), "dsl": (kernel, args)}
        times: dict[str, list[float]] = {k: [] for k in impls}
        for _ in range(3):  # warm-up batches
            for fn, a in impls.values():
                _time(fn, a, calls)
        torch.cuda.synchronize()
        for _ in range(batches):
            for impl, (fn, a) in impls.items():
                times[impl].append(_time(fn, a, calls))
                torch.cuda.synchronize()
    return {"case": name, **{k: statistics.median(v) for k, v in times.items()}}


# ---------------------------------------------------------------------------------------------------------
# The parent: processes per mode, taking turns
# ---------------------------------------------------------------------------------------------------------


def unavailable() -> str | None:
    """Why the benchmark cannot run here (None: it can)."""
    import importlib.util

    for mod in ("torch", "triton", "helion"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    from jitkey.integrations import helion as jh
    from jitkey.integrations import library_version

    v = library_version("helion")
    if v not in jh.SUPPORTED:
        return f"Helion {v} is not supported by the integration ({', '.join(jh.SUPPORTED)})"
    return None


def run_bench(rounds: int = 2, batches: int = 40, calls: int = 200) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            p = subprocess.run(
                [sys.executable, "-m", "jitkey.dsl_bench", "--child", mode, "--batches", str(batches),
                 "--calls", str(calls)],
                capture_output=True, text=True, env={**os.environ, "JITKEY_LOG": ""}, check=False,
            )  # fmt: skip
            if p.returncode != 0:
                raise RuntimeError(f"dsl_bench child {mode} failed:\n{p.stderr[-4000:]}")
            runs[mode].append(json.loads(p.stdout.strip().splitlines()[-1]))
    cases = [r["case"] for r in runs["plain"][0]["rows"]]
    results = []
    for i, case in enumerate(cases):
        row: dict[str, Any] = {"case": case}
        errors = [r["rows"][i]["error"] for m in MODES for r in runs[m] if "error" in r["rows"][i]]
        if errors:
            results.append({"case": case, "error": errors[0]})
            continue
        torch_op = [r["rows"][i]["torch op"] for m in MODES for r in runs[m]]
        add = [r["rows"][i]["torch.add"] for m in MODES for r in runs[m]]
        row["torch op"] = statistics.median(torch_op)
        row["torch.add"] = statistics.median(add)
        row["per_process"] = {}
        for m in MODES:
            vals = [r["rows"][i]["dsl"] for r in runs[m]]
            row[m] = statistics.median(vals)
            row["per_process"][m] = vals
        # The goal: the integrated call against the torch op and torch.add timed in the same processes.
        dsl_runs = runs["dsl"]
        row["dsl / torch op"] = statistics.median(
            r["rows"][i]["dsl"] / r["rows"][i]["torch op"] for r in dsl_runs
        )
        row["dsl / torch.add"] = statistics.median(
            r["rows"][i]["dsl"] / r["rows"][i]["torch.add"] for r in dsl_runs
        )
        results.append(row)
    import torch

    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rounds": rounds,
        "batches": batches,
        "calls": calls,
        "results": results,
        "dsl_report": runs["dsl"][-1]["dsl_report"],
    }


def format_table(res: dict[str, Any]) -> str:
    head = [
        "case",
        "torch op",
        "torch.add",
        "Helion plain",
        "+ jitkey.triton",
        "+ jitkey.dsl",
        "dsl/op",
        "dsl/add",
    ]
    lines = [
        f"Helion calls, host µs per call ({res['device']}, torch {res['torch']}; median of {res['batches']} "
        f"batches x {res['calls']} calls, {res['rounds']} processes per mode)",
        " | ".join(head),
    ]
    for r in res["results"]:
        if "error" in r:
            lines.append(f"{r['case']} | error: {r['error']}")
            continue
        lines.append(
            f"{r['case']} | {r['torch op']:.2f} | {r['torch.add']:.2f} | {r['plain']:.2f} | {r['triton']:.2f} | "
            f"{r['dsl']:.2f} | {r['dsl / torch op']:.2f}x | {r['dsl / torch.add']:.2f}x"
        )
    rep = res.get("dsl_report") or {}
    if rep:
        lines.append(
            f"jitkey.dsl in the last dsl process: {rep['replays']} replays, {rep['bound_calls']} bound calls, "
            f"{rep['fallbacks']} fallbacks, refused {rep['refused']}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dsl_bench", description=__doc__)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.batches, a.calls)))
        return 0
    why = unavailable()
    if why is not None:
        print(f"dsl_bench: skipped: {why}", file=sys.stderr)
        return 2
    res = run_bench(a.rounds, a.batches, a.calls)
    sys.stdout.write(format_table(res))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
