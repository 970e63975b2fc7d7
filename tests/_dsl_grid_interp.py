"""A DSL op whose launch grid is a function (as FlagGems' ``zero_`` and ``zeros`` launch), through ``jitkey.dsl``
under Triton's interpreter (CPU): every replay matches the op's own result, for several keys, and the grid
function's closure is the recording's (fixed by the key).

Run as a script (``TRITON_INTERPRET=1``) by tests/test_dsl.py; prints one JSON line.
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

import jitkey.triton as jt
from jitkey import dsl


@jt.jit
def fill_kernel(out, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, value, mask=offs < n)


def fill_op(x, value):
    n = x.numel()
    fill_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n, value, BLOCK=64)
    return x


def fill_capturing(x, value):
    fill_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, x.numel(), value, BLOCK=64)
    return x


bad = []
sites = {
    name: dsl.Site(f"test:{name}", f, lambda args, f=f: dsl.Bound(f), fallback=f)
    for name, f in (("fill", fill_op), ("capturing", fill_capturing))
}
for site in sites.values():
    for n in (5, 64, 130, 5, 130, 64, 130):
        for _ in range(3):
            x = torch.zeros(n)
            got = site.call(x, 2.5)
            if got is not x or not torch.equal(x, torch.full((n,), 2.5)):
                bad.append((site.name, n))
out = {"bad": bad}
for name, site in sites.items():
    st = site.stats()
    out[name] = {"replays": st["replays"], "refused": st["refused"], "fallbacks": st["fallback_reasons"]}
out["steps"] = [kind for kind, _ in sites["fill"].plan(torch.zeros(130), 2.5).steps]
print(json.dumps(out))
