"""CPU benchmark of the jitkey Triton binding's host path (no GPU: the launcher is a recording no-op).

Compares, in one run (one benchmark group per case): Triton's own binder + ``compute_cache_key`` (the part of
``fn[grid]`` that runs without a driver), each available keyer's lookup, the whole jitkey hit path including
the (no-op) launcher call, and that launcher call alone, as a hand-written launcher would make it. Each case
checks its result before it is timed. In CI this runs with ``--benchmark-disable`` (correctness only).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

import jitkey.triton as jt  # noqa: E402
from jitkey.triton import _installed  # noqa: E402


@triton.jit
def bench4_kernel(x, y, out, n, BLOCK: tl.constexpr):
    pass


@triton.jit
def bench13_kernel(x, y, z, out, n, a, b, c, f0, f1, f2, f3, BLOCK: tl.constexpr):
    pass


# fmt: off
@triton.jit
def bench18_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, out, n,
                   BLOCK: tl.constexpr):
    pass
# fmt: on


_X = torch.empty(4096)
CASES = {
    "5 args": (bench4_kernel, (_X, _X, _X, 4096, 1024)),
    "13 args": (bench13_kernel, (_X, _X, _X, _X, 4096, 3, 16, 7, 0.5, 1.5, -2.0, 0.25, 1024)),
    "18 args": (bench18_kernel, (*(_X,) * 16, 4096, 1024)),
}


class _Runtime:
    @staticmethod
    def get_device():
        return 0

    @staticmethod
    def get_stream(dev):
        return 0


class _NoopCK:
    function = 1
    packed_metadata = (4, 1, 0)

    def __init__(self):
        self.launches = 0

    def run(self, *args):
        self.launches += 1

    def _init_handles(self):
        pass

    def launch_metadata(self, *args):
        return None


@pytest.mark.parametrize("case", list(CASES))
def test_triton_binder_and_key(benchmark, case):
    benchmark.group = case
    fn, args = CASES[case]
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))
    kkc: dict = {}

    def triton_key():
        _, spec, options = binder(*args)
        return compute_cache_key(kkc, spec, options)

    assert triton_key() == triton_key() and "*fp32" in triton_key()
    benchmark(triton_key)


@pytest.mark.parametrize("case", list(CASES))
def test_jitkey_key(benchmark, case):
    """The native key of a call (what a hit computes before its cache probe), through ``key_of``."""
    benchmark.group = case
    fn, args = CASES[case]
    kernel = jt.bind(fn)
    key = kernel.key_of(args, {}, device=0)
    assert key == kernel.key_of(args, {}, device=0)
    benchmark(kernel.key_of, args, {}, device=0)


@pytest.mark.parametrize("case", list(CASES))
def test_jitkey_hit_path(benchmark, monkeypatch, case):
    benchmark.group = case
    fn, args = CASES[case]
    monkeypatch.setattr(_installed, "runtime", _Runtime())
    ck = _NoopCK()
    kernel = jt.bind(fn)

    def triton_run(*a, grid, warmup, **kw):  # Triton's path: keeps the kernel where Triton would
        dict.setdefault(kernel.device_caches, 0, ({}, {}, None, None, None))[0]["key"] = ck
        return ck

    kernel._jk_triton_run = triton_run
    assert kernel[(1,)](*args) is ck and ck.launches == 0  # the miss went to "Triton"
    assert kernel[(1,)](*args) is ck and ck.launches == 1  # the hit launched directly
    benchmark(lambda: kernel[(1,)](*args))
    assert kernel.cache_stats()["fallbacks"] == 0


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_kernel_run_direct(benchmark, case):
    """The floor the hit path is compared with: the same no-op ``run`` called as a hand-written launcher
    would (stream read per call, everything else precomputed)."""
    benchmark.group = case
    _, args = CASES[case]
    ck = _NoopCK()
    rt = _Runtime()

    def launch():
        ck.run(
            1, 1, 1, rt.get_stream(rt.get_device()), ck.function, ck.packed_metadata, None, None, None, *args
        )

    launch()
    assert ck.launches == 1
    benchmark(launch)
