"""GPU launch-overhead benchmark: Triton ``fn[grid]`` vs the jitkey binding vs ``CompiledKernel.run`` direct,
Triton's compiled C launcher, Inductor's static CUDA launcher, ``torch.add`` and the driver floor.

``python benches/gpu_launch.py --json out.json`` (or ``from jitkey.triton_bench import main``). Needs an
NVIDIA GPU, torch and triton. Cases: add-style kernels with 2, 8 and 16 pointer args (plus ``n`` and a
constexpr ``BLOCK``: 4, 10 and 18 args) and a 13-arg mixed kernel (4 pointers, 4 ints, 4 floats, 1
constexpr). Every implementation's output is checked against a torch reference before it is timed. Timing:
``--batches`` batches of ``--launches`` back-to-back launches, ``torch.cuda.synchronize()`` between batches
(outside the timed region); the figure is the median over batches of the host time per launch, in µs.

The driver floor is the limit for a launch from Python: a native loop calling ``cuLaunchKernelEx`` on the same
function with the parameters packed once (``_LaunchPlan._floor``). "floor + launch steps" is the same loop with
what a jitkey hit does around each driver call added (the context check, the GIL hand-off, packing the
parameters again): the gap from it to jitkey is the per-call work on the Python side (binding, the device
and stream queries, the knob reads, the key and the lookup). Inductor's static launcher
(``torch._inductor.runtime.static_triton_launcher.StaticallyLaunchedCudaKernel``) is timed through its
``run`` and through its C++ ``_launch_kernel`` called directly.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

import jitkey
import jitkey.triton as jt
from jitkey.triton._installed import launch_plan, launch_target


# fmt: off
@triton.jit
def add2_kernel(p0, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p0 + offs, mask=mask)
    tl.store(out + offs, acc, mask=mask)


@triton.jit
def add8_kernel(p0, p1, p2, p3, p4, p5, p6, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p0 + offs, mask=mask)
    acc += tl.load(p1 + offs, mask=mask)
    acc += tl.load(p2 + offs, mask=mask)
    acc += tl.load(p3 + offs, mask=mask)
    acc += tl.load(p4 + offs, mask=mask)
    acc += tl.load(p5 + offs, mask=mask)
    acc += tl.load(p6 + offs, mask=mask)
    tl.store(out + offs, acc, mask=mask)


@triton.jit
def add16_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, out, n,
                 BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p0 + offs, mask=mask)
    acc += tl.load(p1 + offs, mask=mask)
    acc += tl.load(p2 + offs, mask=mask)
    acc += tl.load(p3 + offs, mask=mask)
    acc += tl.load(p4 + offs, mask=mask)
    acc += tl.load(p5 + offs, mask=mask)
    acc += tl.load(p6 + offs, mask=mask)
    acc += tl.load(p7 + offs, mask=mask)
    acc += tl.load(p8 + offs, mask=mask)
    acc += tl.load(p9 + offs, mask=mask)
    acc += tl.load(p10 + offs, mask=mask)
    acc += tl.load(p11 + offs, mask=mask)
    acc += tl.load(p12 + offs, mask=mask)
    acc += tl.load(p13 + offs, mask=mask)
    acc += tl.load(p14 + offs, mask=mask)
    tl.store(out + offs, acc, mask=mask)


@triton.jit
def mixed13_kernel(x, y, z, out, n, a, b, c, f0, f1, f2, f3, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x + offs, mask=mask) * f0 + tl.load(y + offs, mask=mask) * f1
    acc += tl.load(z + offs, mask=mask) * f2 + f3 + (a + b + c)
    tl.store(out + offs, acc, mask=mask)
# fmt: on

N = 4096
BLOCK = 1024
GRID = (triton.cdiv(N, BLOCK),)


def _case_add(nptr: int, kernel: Any) -> tuple[str, Any, tuple[Any, ...], torch.Tensor, torch.Tensor]:
    ins = [torch.randn(N, device="cuda") for _ in range(nptr - 1)]
    out = torch.empty(N, device="cuda")
    ref = torch.stack(ins).sum(0) if len(ins) > 1 else ins[0].clone()
    return f"add, {nptr} ptr ({nptr + 2} args)", kernel, (*ins, out, N, BLOCK), out, ref


def _case_mixed() -> tuple[str, Any, tuple[Any, ...], torch.Tensor, torch.Tensor]:
    x, y, z = (torch.randn(N, device="cuda") for _ in range(3))
    out = torch.empty(N, device="cuda")
    a, b, c = 3, 16, 7
    f0, f1, f2, f3 = 0.5, 1.5, -2.0, 0.25
    ref = x * f0 + y * f1 + z * f2 + f3 + (a + b + c)
    return (
        "mixed (4 ptr, 4 int, 4 float, 1 constexpr)",
        mixed13_kernel,
        (x, y, z, out, N, a, b, c, f0, f1, f2, f3, BLOCK),
        out,
        ref,
    )


def _time_interleaved(
    impls: dict[str, Callable[[], Any]],
    batches: int,
    launches: int,
    batch_impls: dict[str, Callable[[int], Any]],
) -> dict[str, list[float]]:
    """Host µs per launch of each batch, per implementation. The implementations take turns batch by batch
    (in a rotating order), so a slow phase of a noisy host hits every one of them alike. ``batch_impls`` run a
    whole batch of ``launches`` launches in one call (the driver floor's native loop)."""
    for _ in range(3):  # warm every path (allocator, caches, the host's clock) for a few batches first
        for fn in impls.values():
            for _ in range(launches):
                fn()
            torch.cuda.synchronize()
        for bfn in batch_impls.values():
            bfn(launches)
            torch.cuda.synchronize()
    per_launch: dict[str, list[float]] = {name: [] for name in (*impls, *batch_impls)}
    order: list[tuple[str, Callable[[], Any], bool]] = [(n, f, False) for n, f in impls.items()]
    order += [(n, f, True) for n, f in batch_impls.items()]  # type: ignore[misc]
    perf = time.perf_counter
    for b in range(batches):
        for name, fn, whole in order[b % len(order) :] + order[: b % len(order)]:
            torch.cuda.synchronize()
            t0 = perf()
            if whole:
                fn(launches)  # type: ignore[call-arg]
            else:
                for _ in range(launches):
                    fn()
            t1 = perf()
            per_launch[name].append((t1 - t0) / launches * 1e6)
    torch.cuda.synchronize()
    return per_launch


def _floor_batch(plan: Any, g0: int, dev: int, args: tuple[Any, ...], n: int, steps: int = 0) -> float:
    """``n`` launches in the driver floor's native loop (parameters packed once; ``steps=7``: with the context
    check, the GIL hand-off and the packing a hit does around each driver call)."""
    return float(plan._floor(n, g0, 1, 1, torch._C._cuda_getCurrentRawStream(dev), dev, *args, steps=steps))


def _inductor_static(ck: Any, args: tuple[Any, ...], dev: int, tmp: str) -> tuple[Any, tuple[Any, ...]] | str:
    """Inductor's static launcher over ``ck`` and its arguments (constexprs dropped), or why it cannot run."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel

        if not hasattr(ck, "_cubin_path"):  # set by Inductor's own compile; the raw cubin is used instead
            ck._cubin_path = None
        sk = StaticallyLaunchedCudaKernel(ck)
        sk.reload_cubin_from_raw(f"{tmp}/{ck.hash}.cubin")
        sk.load_kernel(dev)
        sargs = tuple(a for a, ty in zip(args, ck.src.signature.values(), strict=True) if ty != "constexpr")
        return sk, sargs
    except Exception as exc:  # another torch: the row is reported missing, with why
        return f"{type(exc).__name__}: {exc}"


def _check(name: str, run: Callable[[], Any], out: torch.Tensor, ref: torch.Tensor) -> None:
    out.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def run_bench(batches: int = 100, launches: int = 200) -> dict[str, Any]:
    """Run every case; returns the results (also what ``--json`` writes)."""
    if not torch.cuda.is_available():
        raise SystemExit("gpu_launch: needs a CUDA GPU")
    dev = torch.cuda.current_device()
    get_stream = torch._C._cuda_getCurrentRawStream
    cases = [_case_add(2, add2_kernel), _case_add(8, add8_kernel), _case_add(16, add16_kernel), _case_mixed()]
    results = []
    tmp = tempfile.mkdtemp(prefix="jitkey-bench-")
    for label, kernel, args, out, ref in cases:
        jk = jt.bind(kernel)
        ck = kernel[GRID](*args)  # compile (Triton's own path) and get the CompiledKernel
        run, function, pm = ck.run, ck.function, ck.packed_metadata
        g0 = GRID[0]
        x0, y0 = args[0], args[1]
        # Called with no arguments; `...` because mypy cannot check a lambda with default arguments
        # (the bound values) against `Callable[[], Any]`.
        impls: dict[str, Callable[..., Any]] = {
            "triton fn[grid]": lambda kernel=kernel, args=args: kernel[GRID](*args),
            "jitkey": lambda jk=jk, args=args: jk[GRID](*args),
            "CompiledKernel.run": lambda run=run, function=function, pm=pm, args=args, g0=g0: run(
                g0, 1, 1, get_stream(dev), function, pm, None, None, None, *args
            ),
        }
        target, mid = launch_target(run, pm)
        if target is not run:  # Triton's compiled C launcher, called as CudaLauncher.__call__ would
            impls["C launcher direct"] = lambda t=target, f=function, mid=mid, args=args, g0=g0: t(
                g0, 1, 1, get_stream(dev), f, *mid, None, None, None, *args
            )
        row: dict[str, Any] = {"case": label, "args": len(args)}
        static = _inductor_static(ck, args, dev, tmp)
        if isinstance(static, str):
            row["inductor static: unavailable"] = static
        else:
            sk, sargs = static
            impls["inductor static run"] = lambda sk=sk, sargs=sargs, g0=g0: sk.run(
                g0, 1, 1, get_stream(dev), *sargs
            )
            tys = sk.arg_tys + "O" * (sk.has_global_scratch + sk.has_profile_scratch)
            full = (*sargs, *(None,) * (sk.has_global_scratch + sk.has_profile_scratch))
            impls["inductor _launch_kernel"] = lambda sk=sk, tys=tys, full=full, g0=g0: (
                sk.C_impl._launch_kernel(
                    sk.function, g0, 1, 1, sk.num_warps, sk.shared, tys, full, get_stream(dev)
                )
            )
        tmp_out = torch.empty_like(x0)
        impls["torch.add"] = lambda x0=x0, y0=y0, tmp_out=tmp_out: torch.add(x0, y0, out=tmp_out)
        batch_impls: dict[str, Callable[[int], Any]] = {}
        plan, why = launch_plan(ck, run, len(kernel.params))
        if plan is None:
            row["driver floor: unavailable"] = why
        else:
            floor = functools.partial(_floor_batch, plan, g0, dev, args)
            batch_impls["driver floor"] = floor
            _check(f"{label} / driver floor", functools.partial(floor, 1), out, ref)
            steps: Callable[[int], float] = functools.partial(_floor_batch, plan, g0, dev, args, steps=7)
            batch_impls["floor + launch steps"] = steps
            _check(f"{label} / floor + launch steps", functools.partial(steps, 1), out, ref)
        for name, fn in impls.items():
            if name == "torch.add":
                _check(f"{label} / {name}", fn, tmp_out, x0 + y0)
            else:
                _check(f"{label} / {name}", fn, out, ref)
        stats0 = jk.cache_stats()
        spread: dict[str, tuple[float, float]] = {}
        for name, per_batch in _time_interleaved(impls, batches, launches, batch_impls).items():
            row[name] = statistics.median(per_batch)
            spread[name] = (min(per_batch), max(per_batch))
        stats = jk.cache_stats()
        # the jitkey figure must be the fast path: only hits while timing, no fallback at all
        assert stats["fallbacks"] == 0, stats
        assert stats["misses"] == stats0["misses"] and stats["hits"] > stats0["hits"], (stats0, stats)
        if jt.fast_paths()["driver_launch"]["on"]:  # and every hit launched by jitkey itself
            launched = stats["driver_launches"] - stats0["driver_launches"]
            assert launched == stats["hits"] - stats0["hits"], (stats0, stats)
        row["spread"] = spread
        row["speedup vs fn[grid]"] = row["triton fn[grid]"] / row["jitkey"]
        row["jitkey / CompiledKernel.run"] = row["jitkey"] / row["CompiledKernel.run"]
        if "C launcher direct" in row:
            row["jitkey / C launcher"] = row["jitkey"] / row["C launcher direct"]
        if "driver floor" in row:
            row["jitkey / driver floor"] = row["jitkey"] / row["driver floor"]
        row["jitkey stats"] = stats
        results.append(row)
    return {
        "device": torch.cuda.get_device_name(dev),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "jitkey": jitkey.__version__,
        "fast_paths": jt.fast_paths(),
        "method": f"median over {batches} batches of {launches} back-to-back launches, implementations taking "
        "turns batch by batch, synchronize between batches (not timed); host µs per launch",
        "results": results,
    }


_COLUMNS = (
    "triton fn[grid]",
    "jitkey",
    "CompiledKernel.run",
    "C launcher direct",
    "inductor static run",
    "inductor _launch_kernel",
    "torch.add",
    "driver floor",
    "floor + launch steps",
)


def _print_table(res: dict[str, Any]) -> None:
    print(
        f"{res['device']} · Python {res['python']} · torch {res['torch']} · triton {res['triton']} · "
        f"jitkey {res['jitkey']} (fast paths: {res['fast_paths']})"
    )
    print(res["method"])
    rows = res["results"]
    cols = [c for c in _COLUMNS if all(c in r for r in rows)]
    print(
        f"{'case':<44}" + "".join(f"{c:>24}" for c in cols) + f"{'fn[grid]/jitkey':>17}{'jitkey/ck.run':>15}"
    )
    for r in rows:
        print(
            f"{r['case']:<44}"
            + "".join(f"{r[c]:>24.2f}" for c in cols)
            + f"{r['speedup vs fn[grid]']:>16.2f}x{r['jitkey / CompiledKernel.run']:>14.2f}x"
        )
    for r in rows:
        for k, v in r.items():
            if k.endswith(": unavailable"):
                print(f"{r['case']}: {k.removesuffix(': unavailable')} unavailable: {v}")
    four, eighteen = rows[0], rows[2]
    goals: dict[str, bool] = {
        "≥2.6x vs fn[grid] at 4 args": four["speedup vs fn[grid]"] >= 2.6,
        "≥3.5x vs fn[grid] at 18 args (16 ptr)": eighteen["speedup vs fn[grid]"] >= 3.5,
        "≤1.0x of CompiledKernel.run (all cases)": all(r["jitkey / CompiledKernel.run"] <= 1.0 for r in rows),
    }
    if all("jitkey / C launcher" in r for r in (four, eighteen)):
        goals["≤0.85x of the C launcher at 4 args"] = four["jitkey / C launcher"] <= 0.85
        goals["≤0.7x of the C launcher at 18 args"] = eighteen["jitkey / C launcher"] <= 0.7
    if all("jitkey / driver floor" in r for r in rows):
        goals["≤1.25x of the driver floor (all cases)"] = all(
            r["jitkey / driver floor"] <= 1.25 for r in rows
        )
    goals["faster than torch.add (all cases)"] = all(r["jitkey"] < r["torch.add"] for r in rows)
    if all("inductor static run" in r for r in rows):
        goals["faster than Inductor's static launcher (all cases)"] = all(
            r["jitkey"] < min(r["inductor static run"], r["inductor _launch_kernel"]) for r in rows
        )
    res["goals"] = goals
    for g, ok in goals.items():
        print(f"goal {g}: {'met' if ok else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_launch", description=__doc__)
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--launches", type=int, default=200)
    args = parser.parse_args(argv)
    res = run_bench(args.batches, args.launches)
    _print_table(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
