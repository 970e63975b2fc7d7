"""GPU benchmark of kernel DSL calls: the torch op, the DSL plain, the DSL with only ``triton.jit`` routed through
jitkey, and the DSL through jitkey's DSL layer (:mod:`jitkey.integrations`).

``python -m jitkey bench --only dsl`` (or ``python -m jitkey.dsl_bench --json out.json``). Needs an NVIDIA GPU,
torch, triton and a DSL: the Helion suite needs Helion 1.4.0, the FlagGems suite FlagGems 5.0.0 (a suite whose
DSL is missing is skipped, with why). Each mode runs in its own fresh process (a DSL's kernels are made
once per process: routed or not), ``--rounds`` processes per mode taking turns (plain, triton, dsl, plain, ...).
In every process each case's torch op and DSL call take turns batch by batch: ``--batches`` batches of
``--calls`` back-to-back calls, ``torch.cuda.synchronize()`` between batches (outside the timed region). Each
batch is queued behind a GPU sleep (``torch.cuda._sleep``) that outlasts it, so the figure is the host's own
time per call, never paced by the GPU (a batch that the sleep did not outlast is counted in ``paced`` and the
next sleep doubled); a figure is the median over batches of the host µs per call, and a mode's figure the
median over its processes. Before timing, every DSL call's output is checked against the torch op (``torch.testing``
tolerances for the dtype), and in the ``dsl`` mode also bit for bit against the DSL's own path in the same
process. Inputs are small (4,096 fp32 elements for elementwise kernels).
"""

from __future__ import annotations

import argparse
import functools
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


def helion_cases() -> list[
    tuple[str, Callable[..., Any], Callable[..., Any], tuple[Any, ...], dict[str, float]]
]:
    """(name, torch op, DSL call, args, tolerances): elementwise, scalar arguments, reduction, softmax, matmul
    and a small attention (the kernels are in :mod:`jitkey._helion_kernels`)."""
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


def flag_gems_cases() -> list[
    tuple[str, Callable[..., Any], Callable[..., Any], tuple[Any, ...], dict[str, float]]
]:
    """(name, torch op, FlagGems op, args, tolerances): pointwise (add, mul, exp, gelu, where), reductions
    (sum, mean), normalization (softmax, layer_norm, rms_norm) and indexing (index_select, embedding)."""
    import flag_gems
    import torch

    dev = "cuda"
    x, y = torch.randn(4096, device=dev), torch.randn(4096, device=dev)
    a2 = torch.randn(64, 256, device=dev)
    w, b = torch.randn(256, device=dev), torch.randn(256, device=dev)
    idx = torch.randint(0, 64, (32,), device=dev)
    table, tokens = torch.randn(1024, 256, device=dev), torch.randint(0, 1024, (64,), device=dev)
    cond = x > 0
    tol = {"rtol": 1.3e-6, "atol": 1e-5}
    red = {"rtol": 1e-5, "atol": 1e-4}

    def ln_ref(t: Any, shape: Any, w: Any, b: Any, eps: float) -> Any:
        return torch.native_layer_norm(t, shape, w, b, eps)[0]

    def ln(t: Any, shape: Any, w: Any, b: Any, eps: float) -> Any:
        return flag_gems.layer_norm(t, shape, w, b, eps)[0]

    return [
        ("add 4096 fp32", torch.add, flag_gems.add, (x, y), tol),
        ("mul 4096 fp32", torch.mul, flag_gems.mul, (x, y), tol),
        ("exp 4096 fp32", torch.exp, flag_gems.exp, (x,), tol),
        ("gelu 4096 fp32", torch.nn.functional.gelu, flag_gems.gelu, (x,), tol),
        ("where 4096 fp32", torch.where, flag_gems.where_self, (cond, x, y), tol),
        ("sum 4096 fp32", torch.sum, flag_gems.sum, (x,), red),
        ("mean 4096 fp32", torch.mean, flag_gems.mean, (x,), red),
        ("softmax 64x256 fp32", torch.softmax, flag_gems.softmax, (a2, 1), tol),
        ("layer_norm 64x256 fp32", ln_ref, ln, (a2, (256,), w, b, 1e-5), red),
        ("rms_norm 64x256 fp32", torch.rms_norm, flag_gems.rms_norm, (a2, (256,), w, 1e-5), red),
        ("index_select 64x256 fp32", torch.index_select, flag_gems.index_select, (a2, 0, idx), tol),
        ("embedding 64 of 1024x256 fp32", torch.embedding, flag_gems.embedding, (table, tokens), tol),
    ]


SUITES = {"helion": (helion_cases, "helion"), "flag_gems": (flag_gems_cases, "flag_gems")}


# ---------------------------------------------------------------------------------------------------------
# One process: one suite, one mode
# ---------------------------------------------------------------------------------------------------------


def _time(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


@functools.cache
def _cycles_per_us() -> float:
    """``torch.cuda._sleep`` cycles per µs on this GPU (measured once per process with CUDA events)."""
    import torch

    torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return float(20_000_000 / (start.elapsed_time(end) * 1000.0))


def _time_held(
    fn: Callable[..., Any], args: tuple[Any, ...], calls: int, hold_us: float
) -> tuple[float, bool]:
    """Host µs per call of ``calls`` calls queued behind a GPU sleep of ``hold_us``, and whether the sleep
    outlasted them (else the GPU may have paced the tail of the batch)."""
    import torch

    torch.cuda._sleep(int(hold_us * _cycles_per_us()))
    held = torch.cuda.Event()
    held.record()
    t = _time(fn, args, calls)
    return t, not held.query()


def _own_path(suite: str, call: Any) -> Callable[..., Any]:
    """The DSL's own path for ``call`` (the integration bypassed), for the bit-for-bit check."""
    if suite == "helion":
        from jitkey.integrations import helion as jh

        own = jh._saved[0]  # type: ignore[index]  # Helion's own Kernel.__call__

        def helion_own(*a: Any) -> Any:
            return own(call, *a)

        return helion_own
    fn: Callable[..., Any] | None = getattr(call, "_jitkey_wraps", None)
    if fn is not None:
        return fn
    out: Callable[..., Any] = call  # a case calling a wrapped op inside (layer_norm's [0]): checked as is
    return out


def child(suite: str, mode: str, batches: int, calls: int) -> dict[str, Any]:
    """Measure every case of ``suite`` in this process under ``mode`` (see the module docs)."""
    if mode == "triton":
        import jitkey.triton

        jitkey.triton.install()
    elif mode == "dsl":
        import jitkey

        on = jitkey.install()
        if on.get(suite) is not None:
            raise SystemExit(f"dsl_bench: the {suite} integration is off: {on[suite]}")
    rows: list[dict[str, Any]] = []
    for name, ref, call, args, tol in SUITES[suite][0]():
        own = _own_path(suite, call) if mode == "dsl" else None
        try:
            rows.append(_measure(name, ref, call, args, tol, own, batches, calls))
        except Exception as exc:  # a case that does not run here is reported, the others still run
            rows.append({"case": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    rep = None
    if mode == "dsl":
        import jitkey.dsl

        rep = jitkey.dsl.report(top=20)
    return {"suite": suite, "mode": mode, "rows": rows, "dsl_report": rep}


def _measure(
    name: str,
    ref: Any,
    call: Any,
    args: tuple[Any, ...],
    tol: dict[str, float],
    own: Any,
    batches: int,
    calls: int,
) -> dict[str, Any]:
    import torch

    for _ in range(3):  # compile, record, replay
        out = call(*args)
    torch.testing.assert_close(out, ref(*args), **tol)  # type: ignore[arg-type]
    if own is not None:
        mine = own(*args)
        for _ in range(2):
            out = call(*args)
        if not torch.equal(out, mine):
            raise AssertionError(f"{name}: the output through jitkey.dsl differs from the DSL's own path")
    impls = {"torch op": (ref, args), "torch.add": (torch.add, (args[0], args[0])), "dsl": (call, args)}
    if not isinstance(args[0], torch.Tensor) or args[0].dtype == torch.bool:
        impls["torch.add"] = (torch.add, (args[1], args[1]))
    times, paced = time_interleaved(impls, batches, calls)
    return {"case": name, **{k: statistics.median(v) for k, v in times.items()}, "paced": paced}


def time_interleaved(
    items: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]],
    batches: int,
    calls: int,
    *,
    rotate: bool = False,
) -> tuple[dict[str, list[float]], int]:
    """Host µs per call of each item, per batch: ``batches`` rounds of one held batch of ``calls`` calls per item
    (queued behind a GPU sleep, see the module docs), the items taking turns (``rotate``: each round starts one
    item later). Also how many batches the GPU may have paced (their sleep then doubles, within reason)."""
    import torch

    times: dict[str, list[float]] = {k: [] for k in items}
    hold: dict[str, float] = {}
    for _ in range(3):  # warm-up batches (back to back): how long a held batch must be covered
        for k, (fn, a) in items.items():
            torch.cuda.synchronize()
            hold[k] = 2.0 * _time(fn, a, calls) * calls + 1000.0
    paced = 0
    keys = list(items)
    torch.cuda.synchronize()
    for b in range(batches):
        order = keys[b % len(keys) :] + keys[: b % len(keys)] if rotate else keys
        for k in order:
            fn, a = items[k]
            t, outlasted = _time_held(fn, a, calls, hold[k])
            times[k].append(t)
            if not outlasted:
                # the sleep was too short (or the launch queue filled): a longer one, within reason
                paced += 1
                hold[k] = min(hold[k] * 2.0, 200_000.0)
            torch.cuda.synchronize()
    return times, paced


# ---------------------------------------------------------------------------------------------------------
# The parent: processes per mode, taking turns
# ---------------------------------------------------------------------------------------------------------


def unavailable(suite: str) -> str | None:
    """Why ``suite`` cannot run here (None: it can)."""
    import importlib.util

    from jitkey.integrations import adapter, library_version

    lib = SUITES[suite][1]
    for mod in ("torch", "triton", lib):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    ad = adapter(suite)
    v = library_version(ad.LIBRARY)
    if v not in ad.SUPPORTED:
        return f"{ad.LIBRARY} {v} is not supported by the integration ({', '.join(ad.SUPPORTED)})"
    return None


def run_suite(suite: str, rounds: int = 2, batches: int = 40, calls: int = 200) -> dict[str, Any]:
    """Every mode of ``suite`` in fresh processes, taking turns; the table's figures (see the module docs)."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    env = {**os.environ, "JITKEY_LOG": ""}
    if suite == "flag_gems":
        env.setdefault("GEMS_VENDOR", "nvidia")
    for _ in range(rounds):
        for mode in MODES:
            p = subprocess.run(
                [sys.executable, "-m", "jitkey.dsl_bench", "--child", suite, mode, "--batches", str(batches),
                 "--calls", str(calls)],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            if p.returncode != 0:
                raise RuntimeError(f"dsl_bench child {suite}/{mode} failed:\n{p.stderr[-4000:]}")
            runs[mode].append(json.loads(p.stdout.strip().splitlines()[-1]))
            done = runs[mode][-1]["rows"]
            print(  # progress, so a run stopped early still shows what it measured
                f"[dsl_bench] {suite}/{mode}: "
                + "; ".join(
                    f"{r['case']}: "
                    + (
                        r["error"][:60]
                        if "error" in r
                        else f"{r['dsl']:.2f} vs torch.add {r['torch.add']:.2f}"
                    )
                    for r in done
                ),
                file=sys.stderr,
                flush=True,
            )
    cases = [r["case"] for r in runs["plain"][0]["rows"]]
    results = []
    for i, case in enumerate(cases):
        row: dict[str, Any] = {"case": case}
        errors = [r["rows"][i]["error"] for m in MODES for r in runs[m] if "error" in r["rows"][i]]
        if errors:
            results.append({"case": case, "error": errors[0]})
            continue
        row["torch op"] = statistics.median(r["rows"][i]["torch op"] for m in MODES for r in runs[m])
        row["torch.add"] = statistics.median(r["rows"][i]["torch.add"] for m in MODES for r in runs[m])
        row["paced"] = sum(r["rows"][i].get("paced", 0) for m in MODES for r in runs[m])
        row["per_process"] = {}
        for m in MODES:
            vals = [r["rows"][i]["dsl"] for r in runs[m]]
            row[m] = statistics.median(vals)
            row["per_process"][m] = vals
        # The goals: the integrated call against the torch op and torch.add timed in the same processes.
        dsl_runs = runs["dsl"]
        per = [r["rows"][i]["dsl"] / r["rows"][i]["torch op"] for r in dsl_runs]
        row["dsl / torch op, per process"] = per
        row["dsl / torch op"] = statistics.median(per)
        row["dsl / torch.add"] = statistics.median(
            r["rows"][i]["dsl"] / r["rows"][i]["torch.add"] for r in dsl_runs
        )
        results.append(row)
    import torch

    return {
        "suite": suite,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rounds": rounds,
        "batches": batches,
        "calls": calls,
        "results": results,
        "dsl_report": runs["dsl"][-1]["dsl_report"],
    }


def run_bench(rounds: int = 2, batches: int = 40, calls: int = 200) -> dict[str, Any]:
    """Every suite that can run here: ``{"suites": [...], "skipped": {suite: why}}``."""
    out: dict[str, Any] = {"suites": [], "skipped": {}}
    for suite in SUITES:
        why = unavailable(suite)
        if why is not None:
            out["skipped"][suite] = why
            continue
        try:
            out["suites"].append(run_suite(suite, rounds, batches, calls))
        except RuntimeError as exc:  # one suite's failure is reported; the others still run
            out["skipped"][suite] = f"failed: {str(exc)[-2000:]}"
    return out


def format_table(res: dict[str, Any]) -> str:
    lines: list[str] = []
    for suite in res["suites"]:
        label = {"helion": "Helion", "flag_gems": "FlagGems"}[suite["suite"]]
        lines += [
            f"{label} calls, host µs per call ({suite['device']}, torch {suite['torch']}; median of "
            f"{suite['batches']} batches x {suite['calls']} calls, {suite['rounds']} processes per mode)",
            f"case | torch op | torch.add | {label} plain | + jitkey.triton | + jitkey.dsl | dsl/op | dsl/add",
        ]
        for r in suite["results"]:
            if "error" in r:
                lines.append(f"{r['case']} | error: {r['error']}")
                continue
            lines.append(
                f"{r['case']} | {r['torch op']:.2f} | {r['torch.add']:.2f} | {r['plain']:.2f} | "
                f"{r['triton']:.2f} | {r['dsl']:.2f} | {r['dsl / torch op']:.2f}x | {r['dsl / torch.add']:.2f}x"
                + (f" | {r['paced']} batches paced by the GPU" if r.get("paced") else "")
            )
        rep = suite.get("dsl_report") or {}
        if rep:
            lines.append(
                f"jitkey.dsl in the last dsl process: {rep['replays']} replays, {rep['bound_calls']} bound "
                f"calls, {rep['fallbacks']} fallbacks; refused {rep['refused']}; fallbacks {rep['fallback_reasons']}"
            )
        lines.append("")
    for suite, why in res["skipped"].items():
        lines.append(f"{suite}: skipped: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dsl_bench", description=__doc__)
    p.add_argument("--child", nargs=2, metavar=("SUITE", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--only", choices=list(SUITES), action="append", help="run only these suites")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], a.batches, a.calls)))
        return 0
    if a.only:
        for s in list(SUITES):
            if s not in a.only:
                del SUITES[s]
    res = run_bench(a.rounds, a.batches, a.calls)
    sys.stdout.write(format_table(res))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0 if res["suites"] else 2


if __name__ == "__main__":
    raise SystemExit(main())
