"""Process workers for tests/test_triton_remote_cache.py: one "host" compiling Triton kernels.

``compile_on_host`` runs in a spawned process with its own ``TRITON_CACHE_DIR`` and environment, wires the
remote compile cache as a user would (``jitkey.triton.install()``, or Triton's own ``TRITON_CACHE_MANAGER`` /
``TRITON_REMOTE_CACHE_BACKEND``), and compiles variants of ``add`` with ``triton.compile`` for an sm_90 target
(compile-only: no GPU needed). Triton's compilation listener says, per compile, whether it was a cache hit.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any

import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


SIGNATURE = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def compile_on_host(
    cache_dir: str, env: dict[str, str], blocks: list[int], install: bool = True
) -> dict[str, Any]:
    """Compiles ``add`` for each BLOCK; returns per compile whether it was a cache hit and the cubin's digest,
    the remote compile counters, and the RemoteCacheWarning texts."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.update(env)
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import jitkey.triton as jt
    from jitkey.errors import RemoteCacheWarning
    from jitkey.triton import remote_cache

    if install:
        jt.install()
    hits: list[bool] = []
    knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
    cubins = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for block in blocks:
            src = ASTSource(add, SIGNATURE, constexprs={"BLOCK": block})
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            cubins.append(hashlib.sha256(ck.asm["cubin"]).hexdigest())
    return {
        "hits": hits,
        "cubins": cubins,
        "stats": remote_cache.stats(),
        "state": remote_cache.state(),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RemoteCacheWarning)],
        "manager": f"{knobs.cache.manager_class}",
    }
