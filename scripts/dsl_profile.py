"""Where a warm Helion call (and a FlagGems op) through jitkey.dsl spends its host time (GPU): each piece
timed alone; for FlagGems, each op's replayed plan (its steps), what each step adds to a replay (plans of its
first k steps timed interleaved) and how often a compiled step declined.

    python scripts/dsl_profile.py [helion] [flag_gems] [cases] [alloc]

``cases``: every Helion case of the DSL bench, pieces timed interleaved (each item's batch in turn, 40
rounds, the host alone behind a GPU sleep): the call, the site's key, the plan's replay, and torch's and the
native allocations; prints each plan's steps. ``alloc``: one allocation natively (alone and as plan steps) and
through torch, the same way.

Each figure is the median over 15 loops of 2,000 back-to-back calls (µs per call), synchronized between loops,
and the host alone: 300 calls queued behind a GPU sleep, so the GPU does not pace them.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import jitkey

os.environ.setdefault("GEMS_VENDOR", "nvidia")
WHICH = set(sys.argv[1:]) or {"helion", "flag_gems"}
jitkey.install()


def t(name, f, *a, n=2000, reps=15, **kw):
    """Prints two figures: back-to-back calls (the GPU may pace them), and the host alone: calls queued
    behind a ~20 ms ``torch.cuda._sleep`` so the GPU never paces them (300 calls per loop)."""
    for _ in range(3):
        f(*a, **kw)
    ts, hs = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f(*a, **kw)
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
        torch.cuda._sleep(40_000_000)
        t0 = time.perf_counter()
        for _ in range(300):
            f(*a, **kw)
        hs.append((time.perf_counter() - t0) / 300 * 1e6)
    print(f"{name:55s} {sorted(ts)[reps // 2]:7.3f} us   host alone {sorted(hs)[reps // 2]:7.3f} us")


def helion() -> None:
    from jitkey import _helion_kernels as hk

    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    k = hk.add
    for _ in range(3):
        k(x, y)
    site = k._jk_call.site
    plan = site.plan(x, y)
    print("plan steps:", plan.steps)
    launcher = next(t for kind, t in plan.steps if kind == "launch")
    out = torch.empty_like(x)
    grid = (4,)
    t("torch.add(x, y)", torch.add, x, y)
    t("helion kernel(x, y) through jitkey.dsl", k, x, y)
    from jitkey.integrations import helion as jh

    t("the same through jitkey's Python __call__ (the first call's path)", jh._call, k, x, y)
    t("site.call(x, y)", site.call, x, y)
    t("plan(x, y) (the replay alone)", plan, x, y)
    t("torch.empty_like(x)", torch.empty_like, x)
    t(
        "launcher.launch(grid, x, y, out, **3 options)",
        launcher.launch,
        grid,
        x,
        y,
        out,
        num_warps=4,
        num_stages=1,
        launch_cooperative_grid=False,
    )
    t("launcher.launch(grid, x, y, out)", launcher.launch, grid, x, y, out)
    t("site.key(x, y)", site.key, x, y)
    import tempfile

    from jitkey import triton_bench

    bench_add = triton_bench._add_kernel(3, tempfile.mkdtemp())  # the launch bench's 4-argument add kernel
    t(
        "the launch bench's add kernel[grid](x, y, out, n, BLOCK=1024)",
        lambda: bench_add[grid](x, y, out, 4096, BLOCK=1024),
    )
    t(
        "torch.empty_like(x) + that launch",
        lambda: bench_add[grid](x, y, torch.empty_like(x), 4096, BLOCK=1024),
    )
    from jitkey import _torch_alloc
    from jitkey._core import _Plan

    alloc = _torch_alloc.get()
    print("native allocation:", _torch_alloc.status())
    if alloc is not None:
        t("alloc.empty_like(x) (native)", alloc.empty_like, x)
        only = _Plan(1, [("empty_like", (alloc, torch.empty_like), [("a", 0)], None)], ("s", 0))
        t("a plan of the allocation step alone", only, x)
    from jitkey.triton import _kernel

    for ks in _kernel.registry():
        snap = ks.snapshot()
        if snap["hits"]:
            keep = (
                "hits",
                "misses",
                "driver_launches",
                "launcher_reasons",
                "unplanned_variants",
                "fallback_reasons",
            )
            print("kernel", getattr(ks, "name", ks), {k: snap[k] for k in keep})
    print("launcher state counts:", dict(launcher.state_counts()))
    for name, f in [
        ("is_grad_enabled", torch.is_grad_enabled),
        ("is_inference_mode_enabled", torch.is_inference_mode_enabled),
        ("_cuda_getDevice", torch._C._cuda_getDevice),
        ("_is_torch_function_mode_enabled", torch._C._is_torch_function_mode_enabled),
        ("_len_torch_dispatch_stack", torch._C._len_torch_dispatch_stack),
        ("dist.is_initialized", torch.distributed.is_initialized),
        ("_cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)),
    ]:
        t(name, f)
    t("Helion's own Kernel.__call__ (jitkey.triton kernels)", jh._saved[0], k, x, y)
    print(site.stats())


def _describe(target):
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__


def _prefixes(plan, spec, args):
    """Each step's host cost: plans of the first k steps (k = 0 .. all, result None) timed interleaved, so the
    difference of two neighbours is what step k costs on a replay."""
    from jitkey import dsl_bench
    from jitkey._core import _Plan

    nargs, steps = spec
    items = {f"first {k} steps": (_Plan(nargs, steps[:k], ("c", None)), args) for k in range(len(steps) + 1)}
    items["the whole plan"] = (plan, args)
    times, _paced = dsl_bench.time_interleaved(items, 15, 200, rotate=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    prev = None
    for k, (name, v) in enumerate(med.items()):
        what = "" if k == 0 or k > len(steps) else f"  + step {k - 1} {steps[k - 1][0]}: {v - prev:+.3f}"
        print(f"    {name:20s} {v:7.3f} us{what}")
        prev = v


def _bound_args(fn, args):
    """The call's arguments as the site binds them (every parameter, defaults applied), which a plan takes."""
    import inspect

    b = inspect.signature(fn).bind(*args)
    b.apply_defaults()
    return tuple(b.arguments.values())


def _compiled_pieces(spec, args):
    """Each compiled step's launch in pieces (host alone, interleaved): the step as a plan runs it
    (``_CompiledLaunch``), the same kernel through ``_LaunchPlan.launch`` (pack + launch, no stream or hook
    reads), and the driver floor of that kernel (``_LaunchPlan._floor(1, ...)``: one packed launch)."""
    from jitkey import dsl_bench
    from jitkey._core import _Plan
    from jitkey.triton import _installed

    nargs, steps = spec
    items = {}
    for k, (kind, target, srcs, _kw) in enumerate(steps):
        if kind != "compiled":
            continue
        cl, nfast, _fallback = target
        # The step's grid and parameters, resolved as a replay resolves them: a plan of the steps before it
        # that returns them.
        grid, *params = _Plan(nargs, steps[:k], ("t", tuple(srcs[:nfast])))(*args)
        ck = cl(grid, *params)
        lp, why = _installed.launch_plan(ck, ck.run, len(ck.src.signature))
        dev = torch.cuda.current_device()
        stream = torch._C._cuda_getCurrentRawStream(dev)
        items[f"step {k}: _CompiledLaunch(grid, *params)"] = (cl, (grid, *params))
        if lp is None:
            print(f"    step {k}: no launch plan ({why})")
            continue
        items[f"step {k}: _LaunchPlan.launch"] = (lp.launch, (*grid, stream, dev, *params))
        try:
            lp._floor(1, *grid, stream, dev, *params)
        except ValueError as exc:  # e.g. a kernel with scratch buffers
            print(f"    step {k}: no driver floor ({exc})")
            continue
        items[f"step {k}: driver floor (_floor(1))"] = (lp._floor, (1, *grid, stream, dev, *params))
    items["torch.cuda._sleep(0) (torch's own launch)"] = (torch.cuda._sleep, (0,))
    if not items:
        return
    times, _paced = dsl_bench.time_interleaved(items, 15, 200, rotate=True)
    for name, v in times.items():
        print(f"    {name:45s} {sorted(v)[len(v) // 2]:7.3f} us")


def flag_gems() -> None:
    from jitkey import dsl, dsl_bench
    from jitkey.integrations import flag_gems as fg

    specs = {}
    make_plan = dsl._Plan

    def keeping_plan(nargs, steps, ret, *rest, **kw):  # keeps each plan's spec, for the step ablation
        plan = make_plan(nargs, steps, ret, *rest, **kw)
        specs[id(plan)] = (plan, (nargs, list(steps)))
        return plan

    dsl._Plan = keeping_plan

    asked = {"n": 0}
    own_ask = fg._ask_libentry

    def counting_ask(*a, **kw):
        asked["n"] += 1
        return own_ask(*a, **kw)

    fg._ask_libentry = counting_ask  # recorded plans bind this (a declined compiled step asks LibEntry)
    for name, ref, call, args, _tol in dsl_bench.flag_gems_cases():
        for _ in range(3):
            call(*args)
        fn = getattr(call, "_jitkey_wraps", call)
        site = next((s for s in dsl.sites() if s.name == f"flag_gems:{fn.__name__}"), None)
        print(f"--- {name}: site {site.name if site else None}")
        if site is None:
            continue
        try:
            plan = site.plan(*args)
            print("  steps:", [(kind, _describe(t)) for kind, t in plan.steps])
            asked["n"] = 0
            bound = _bound_args(fn, args)
            t("  plan(*args) (the replay alone)", plan, *bound, n=500, reps=5)
            print(f"  compiled steps declined (LibEntry asked) {asked['n']} times in {500 * 8} replays")
            kept = specs.get(id(plan))
            if kept is not None and kept[0] is plan:
                _prefixes(plan, kept[1], bound)
                _compiled_pieces(kept[1], bound)
        except Exception as exc:
            print("  no plan:", type(exc).__name__, exc)
        t("  site.call(*args)", site.call, *args, n=500, reps=5)
        t("  op through the wrapper", call, *args, n=500, reps=5)
        t("  torch op", ref, *args, n=500, reps=5)
        print("  stats:", site.stats())


def cases() -> None:
    from jitkey import _torch_alloc, dsl_bench

    x = torch.randn(4096, device="cuda")
    items = {"torch.add(x, x)": (torch.add, (x, x))}
    for name, _ref, call, args, _tol in dsl_bench.helion_cases():
        for _ in range(3):
            call(*args)
        site = call._jk_call.site
        plan = site.plan(*args)
        print(f"{name}: steps {[(kind, _describe(t)) for kind, t in plan.steps]}")
        items[f"{name}: call"] = (call, args)
        items[f"{name}: site.key"] = (site.key, args)
        items[f"{name}: plan"] = (plan, args)
    alloc = _torch_alloc.get()
    print("native allocation:", _torch_alloc.status())
    f32 = torch.float32
    items["torch.empty_like(x)"] = (torch.empty_like, (x,))
    items["torch.empty([64], dtype, device)"] = (lambda: torch.empty([64], dtype=f32, device=x.device), ())
    if alloc is not None:
        items["native empty_like(x)"] = (alloc.empty_like, (x,))
        items["native empty_strided([64])"] = (alloc.empty_strided, ([64], [1], "float32", x.device.index))
    times, _paced = dsl_bench.time_interleaved(items, 40, 200, rotate=True)
    for k, v in times.items():
        print(
            f"{k:55s} {sorted(v)[len(v) // 2]:7.3f} us (host alone, median of {len(v)} interleaved batches)"
        )


def alloc() -> None:
    """The native allocation against torch's, host alone, interleaved: what one allocation step costs."""
    from jitkey import _torch_alloc, dsl_bench
    from jitkey._core import _Plan

    x = torch.randn(4096, device="cuda")
    native = _torch_alloc.get()
    print("native allocation:", _torch_alloc.status())
    dev = x.device.index
    f32 = torch.float32
    items = {
        "torch.empty(4096, dtype, device)": (lambda: torch.empty(4096, dtype=f32, device=x.device), ()),
        "torch.empty_like(x)": (torch.empty_like, (x,)),
        "torch.zeros(4096) (alloc + fill launch)": (lambda: torch.zeros(4096, device=x.device), ()),
        "empty plan of no step": (_Plan(0, [], ("c", None)), ()),
    }
    if native is not None:
        items["native empty_strided([4096])"] = (native.empty_strided, ([4096], [1], "float32", dev))
        items["native empty_like(x)"] = (native.empty_like, (x,))
        step = ("empty", (native, torch.empty, [4096], [1], "float32", dev), [], None)
        items["plan of one empty step"] = (_Plan(0, [step], ("c", None)), ())
        items["plan of two empty steps"] = (_Plan(0, [step, step], ("c", None)), ())
    times, _paced = dsl_bench.time_interleaved(items, 30, 200, rotate=True)
    for k, v in times.items():
        print(
            f"{k:55s} {sorted(v)[len(v) // 2]:7.3f} us (host alone, median of {len(v)} interleaved batches)"
        )


if "alloc" in WHICH:
    alloc()
if "cases" in WHICH:
    cases()
if "helion" in WHICH:
    helion()
if "flag_gems" in WHICH:
    flag_gems()
