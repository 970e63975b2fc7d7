"""Where a warm Helion call through jitkey.dsl spends its host time (GPU): each piece timed alone.

    python scripts/dsl_profile.py

Each figure is the median over 15 loops of 2,000 back-to-back calls (µs per call), synchronized between loops.
"""

from __future__ import annotations

import time

import torch

import jitkey

jitkey.install()
from jitkey import _helion_kernels as hk  # noqa: E402


def t(name, f, *a, n=2000, reps=15, **kw):
    for _ in range(3):
        f(*a, **kw)
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f(*a, **kw)
        ts.append((time.perf_counter() - t0) / n * 1e6)
    print(f"{name:55s} {sorted(ts)[reps // 2]:7.3f} us")


x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
k = hk.add
for _ in range(3):
    k(x, y)
site = k._jk_call.site
plan = site.plan(x, y)
print("plan steps:", plan.steps)
launcher = next(t for kind, t in plan.steps if kind == "launch")
tk = launcher.kernel if hasattr(launcher, "kernel") else None
out = torch.empty_like(x)
grid = (4,)
t("torch.add(x, y)", torch.add, x, y)
t("helion kernel(x, y) through jitkey.dsl", k, x, y)
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
from jitkey.integrations import helion as jh  # noqa: E402

t("Helion's own Kernel.__call__ (jitkey.triton kernels)", jh._saved[0], k, x, y)
print(site.stats())
