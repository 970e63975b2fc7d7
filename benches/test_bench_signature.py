"""Signature.lookup hit vs the Python peers, side by side in one run.

Groups: ``triton-N`` (N = 2, 4, 8, 16 arguments: tensors and ints cycling, the last one a
constexpr) and ``helion-4`` (four tensors). In each group:

* ``jitkey``: ``sig.lookup(cache, args)``, one native call (key + hash + cache probe);
* ``py-tuple``: an unrolled Python flat-tuple key with the same information + ``dict`` lookup (a);
* ``helion-dataclass``: Helion's style, per-argument extractors by type, wrapped in a frozen
  dataclass key + ``dict`` lookup (b);
* ``triton-binder`` (triton groups): Triton 3.6's own binder (``create_function_from_signature``
  with a real ``CUDABackend``) + ``compute_cache_key`` + ``dict`` lookup, i.e. what
  ``JITFunction.run`` does per call before the launch (c).

Every case checks its result before it is timed. Timing (ratios within one run)::

    .venv/bin/python -m pytest benches/test_bench_signature.py --benchmark-enable \
        --benchmark-disable-gc --benchmark-min-time=0.2 --benchmark-group-by=group
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

from jitkey import MISS, LruCache, Signature, rules  # noqa: E402


@triton.jit
def k2(a0, BLOCK: tl.constexpr):
    pass


@triton.jit
def k4(a0, a1, a2, BLOCK: tl.constexpr):
    pass


@triton.jit
def k8(a0, a1, a2, a3, a4, a5, a6, BLOCK: tl.constexpr):
    pass


@triton.jit
def k16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, BLOCK: tl.constexpr):
    pass


KERNELS = {2: k2, 4: k4, 8: k8, 16: k16}
BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))
TENSOR = torch.zeros(1024, dtype=torch.float16)
OTHER = torch.zeros(1024, dtype=torch.float32)


def triton_args(n: int) -> tuple[Any, ...]:
    dyn: list[Any] = []
    for i in range(n - 1):
        dyn.append([TENSOR, OTHER, 4096 + 16 * i][i % 3])
    return (*dyn, 1024)


def python_triton_key(n: int) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """An unrolled Python key with the information Triton's specialization has (a)."""
    parts = []
    for i, a in enumerate(triton_args(n)[:-1]):
        if isinstance(a, torch.Tensor):
            parts.append(f"a[{i}].dtype, a[{i}].data_ptr() & 15 == 0")
        else:
            parts.append(f"a[{i}] == 1, a[{i}] & 15 == 0, -2147483648 <= a[{i}] < 2147483648")
    parts.append(f"type(a[{n - 1}]), a[{n - 1}]")
    ns: dict[str, Any] = {}
    exec(f"def key(a):\n    return ({', '.join(parts)},)\n", ns)
    return ns["key"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BoundKernelKey:
    """Helion's ``BoundKernelInMemoryCacheKey`` shape: a spec tuple plus extras."""

    specialization_key: tuple[Any, ...]
    extra_results: tuple[Any, ...]


def _tensor_key_static(t: Any) -> Any:
    return (t.dtype, t.size(), t.stride())


_EXTRACTORS: dict[type, Callable[[Any], Any]] = {
    torch.Tensor: _tensor_key_static,
    int: lambda v: int,
    float: lambda v: float,
    bool: lambda v: bool,
}


def helion_style_key(args: tuple[Any, ...]) -> BoundKernelKey:
    """Helion's per-argument extractors (static shapes) + device type, in a frozen dataclass (b)."""
    spec = [_EXTRACTORS[type(a)](a) for a in args]
    return BoundKernelKey((*spec, "cpu"), ())


CASES = [2, 4, 8, 16]


@pytest.mark.parametrize("n", CASES)
def test_jitkey_lookup_triton(benchmark: Any, n: int) -> None:
    benchmark.group = f"triton-{n}"
    sig = Signature(rules.triton(KERNELS[n]), extra=("kernel", n, 0))
    cache = LruCache(256)
    args = triton_args(n)
    sentinel = object()
    sig.insert(cache, args, sentinel)
    assert sig.lookup(cache, args) is sentinel
    misaligned = (TENSOR[1:], *args[1:]) if n > 1 else args
    assert sig.lookup(cache, misaligned) is MISS
    assert benchmark(sig.lookup, cache, args) is sentinel


@pytest.mark.parametrize("n", CASES)
def test_python_tuple_dict_triton(benchmark: Any, n: int) -> None:
    benchmark.group = f"triton-{n}"
    key = python_triton_key(n)
    args = triton_args(n)
    sentinel = object()
    d = {key(args): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        return d.get(key(a))

    assert lookup(args) is sentinel
    assert benchmark(lookup, args) is sentinel


@pytest.mark.parametrize("n", CASES)
def test_helion_dataclass_dict_triton(benchmark: Any, n: int) -> None:
    benchmark.group = f"triton-{n}"
    args = triton_args(n)
    sentinel = object()
    d = {helion_style_key(args): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        return d.get(helion_style_key(a))

    assert lookup(args) is sentinel
    assert benchmark(lookup, args) is sentinel


@pytest.mark.parametrize("n", CASES)
def test_triton_binder(benchmark: Any, n: int) -> None:
    benchmark.group = f"triton-{n}"
    fn = KERNELS[n]
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    kernel_key_cache: dict[Any, Any] = {}
    args = triton_args(n)
    _, spec, options = binder(*args)
    sentinel = object()
    kernel_cache = {compute_cache_key(kernel_key_cache, spec, options): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        _, spec, options = binder(*a)
        return kernel_cache.get(compute_cache_key(kernel_key_cache, spec, options))

    assert lookup(args) is sentinel
    assert benchmark(lookup, args) is sentinel


# ---- Helion-style: four tensors ----------------------------------------------------------------

HELION_ARGS = (TENSOR.view(32, 32), OTHER.view(32, 32), TENSOR[:512], OTHER.view(4, 256).t())


def test_jitkey_lookup_helion(benchmark: Any) -> None:
    benchmark.group = "helion-4"
    sig = Signature(rules.helion(["a", "b", "c", "d"], static_shapes=True), extra=("helion", (9, 0)))
    cache = LruCache(256)
    sentinel = object()
    sig.insert(cache, HELION_ARGS, sentinel)
    assert sig.lookup(cache, HELION_ARGS) is sentinel
    assert sig.lookup(cache, (*HELION_ARGS[:3], OTHER.view(4, 256))) is MISS
    assert benchmark(sig.lookup, cache, HELION_ARGS) is sentinel


def test_helion_dataclass_dict_helion(benchmark: Any) -> None:
    benchmark.group = "helion-4"
    sentinel = object()
    d = {helion_style_key(HELION_ARGS): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        return d.get(helion_style_key(a))

    assert lookup((*HELION_ARGS[:3], OTHER.view(4, 256))) is None
    assert benchmark(lookup, HELION_ARGS) is sentinel


def test_python_tuple_dict_helion(benchmark: Any) -> None:
    benchmark.group = "helion-4"
    sentinel = object()

    def key(a: tuple[Any, ...]) -> tuple[Any, ...]:
        a0, a1, a2, a3 = a
        return (
            a0.dtype, a0.shape, a0.stride(), a1.dtype, a1.shape, a1.stride(),
            a2.dtype, a2.shape, a2.stride(), a3.dtype, a3.shape, a3.stride(),
        )  # fmt: skip

    d = {key(HELION_ARGS): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        return d.get(key(a))

    assert lookup((*HELION_ARGS[:3], OTHER.view(4, 256))) is None
    assert benchmark(lookup, HELION_ARGS) is sentinel
