"""Helion kernels through jitkey.dsl under Triton's interpreter (CPU), against Helion's own path.

Run as a script (``TRITON_INTERPRET=1``) by tests/test_dsl_helion.py; prints one JSON line.
"""

from __future__ import annotations

import json
import random

import torch

import jitkey.integrations.helion as jh

jh.install()
import _dsl_helion_kernels as k  # noqa: E402 (after install: Helion's kernels are made routed)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


rng = random.Random(7)
own = jh._saved[0]
mismatches = []
cases = []
for _ in range(2):
    m, n = rng.choice([1, 5, 16]), rng.choice([1, 8, 33])
    x, b = torch.randn(m, n), torch.randn(n)
    cases += [
        (k.add_bcast, (x, b)),
        (k.add_bcast, (torch.randn(n, m).t(), b)),  # non-contiguous
        (k.add_bcast, (x.half(), b)),  # dtype promotion
        (k.col_sum, (x,)),
    ]
    n1 = rng.choice([0, 3, 64])
    v, w = torch.randn(n1), torch.randn(n1)
    cases += [
        (k.scale_shift, (v, rng.choice([0.5, -2.0]), rng.choice([0, 7]))),
        (k.add_out, (v, w, torch.empty(n1))),
        (k.add_inplace, (v.clone(), w)),
    ]
for kernel, args in cases:
    for i in range(3):
        a1, a2 = clone(args), clone(args)
        got, want = kernel(*a1), own(kernel, *a2)
        if not (same(got, want) and all(same(p, q) for p, q in zip(a1, a2, strict=True))):
            mismatches.append(f"{kernel.name} call {i} {[getattr(a, 'shape', a) for a in args]}")
# A kernel whose site cannot be made (a default jitkey cannot key): left to Helion, counted, results Helion's.
v, w = torch.randn(16), torch.randn(16)
epilogue_ok = all(same(k.add_epilogue(v, w), own(k.add_epilogue, v, w)) for _ in range(3))
epilogue_ok = epilogue_ok and same(k.add_epilogue(v, w), (v + w) * 2)
declined = {r: n for r, n in jh.report()["declined"].items() if "epilogue" in r}
x, b = torch.randn(4, 8), torch.randn(8)
site = k.add_bcast._jk_call.site
keys = {
    "base": site.key(x, b),
    "strides": site.key(torch.randn(8, 4).t(), b),
    "dtype": site.key(x.half(), b),
    "shape": site.key(torch.randn(5, 8), b),
}
v = torch.randn(8)
ss = k.scale_shift._jk_call.site
keys["scalar"] = ss.key(v, 0.5, 1) != ss.key(v, 0.25, 1) and ss.key(v, 0.5, 1) != ss.key(v, 0.5, 1.0)
with torch.no_grad():
    keys["grad_mode"] = site.key(x, b) != keys["base"]
k.add_bcast(x, b)
k.add_bcast(x, b)
had_plan = site.plan(x, b) is not None
k.add_bcast.reset()
# A kernel with a site is called with no Python frame of jitkey's: its __call__ is the site's native call; a
# kernel left to Helion gets jitkey's Python __call__ bound to it, and the class shows a plain function.
Kernel = type(k.add_bcast)
native_call = {
    "descriptor": type(Kernel.__dict__["__call__"]).__name__ == "_SiteMethod",
    "class_reads_function": Kernel.__call__ is jh._call,
    "site_kernel": k.add_bcast.__call__ is k.add_bcast._jk_call.call,
    "declined_kernel": getattr(k.add_epilogue.__call__, "__func__", None) is jh._call,
}
rep = jh.report()
print(
    json.dumps(
        {
            "mismatches": mismatches,
            "replays": rep["replays"],
            "fallbacks": rep["fallback_reasons"],
            "refused": rep["refused"],
            "keys_differ": len({keys[n] for n in ("base", "strides", "dtype", "shape")}) == 4,
            "scalar_keyed": keys["scalar"],
            "grad_mode_keyed": keys["grad_mode"],
            "reset_drops_plans": had_plan and site.plan(x, b) is None,
            "epilogue_ok": epilogue_ok,
            "epilogue_declined": declined,
            "native_call": native_call,
        }
    )
)
