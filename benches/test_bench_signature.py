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

from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

from jitkey import MISS, LruCache, Signature, rules  # noqa: E402
from jitkey.bench._lookup_peers import (  # noqa: E402
    BACKEND,
    HELION_ARGS,
    KERNELS,
    OTHER,
    TENSOR,
    helion_python_key,
    helion_style_key,
    python_triton_key,
    triton_args,
)

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

    key = helion_python_key
    d = {key(HELION_ARGS): sentinel}

    def lookup(a: tuple[Any, ...]) -> Any:
        return d.get(key(a))

    assert lookup((*HELION_ARGS[:3], OTHER.view(4, 256))) is None
    assert benchmark(lookup, HELION_ARGS) is sentinel
