"""Where a warm Helion call (and a FlagGems op) through jitkey.dsl spends its host time (GPU): each piece
timed alone; for FlagGems, each op's replayed plan (its steps) and how often a compiled step declined.

    python scripts/dsl_profile.py [helion] [flag_gems] [cases]

``cases``: every Helion case of the DSL bench, pieces timed interleaved (each item's batch in turn, 40
rounds, the host alone behind a GPU sleep): the call, the site's key, the plan's replay, and torch's and the
native allocations; prints each plan's steps.

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


def flag_gems() -> None:
    from jitkey import dsl, dsl_bench
    from jitkey.integrations import flag_gems as fg

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
            t("  plan(*args) (the replay alone)", plan, *args, n=500, reps=5)
            print(f"  compiled steps declined (LibEntry asked) {asked['n']} times in {500 * 8} replays")
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


if "cases" in WHICH:
    cases()
if "helion" in WHICH:
    helion()
if "flag_gems" in WHICH:
    flag_gems()
