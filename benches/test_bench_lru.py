"""Warm cache hits from Python: jitkey.LruCache vs dict[tuple], functools.lru_cache, cachetools.

Time them (release build: ``make build``) with
    .venv/bin/python -m pytest benches/test_bench_lru.py --benchmark-enable --benchmark-disable-gc \\
        --benchmark-min-time=0.2 --benchmark-sort=name
and compare medians within one group (``lru/4-entry``, ``lru/16-entry``). Every case first checks
that the lookup returns the stored value. ``jitkey-fast_hash`` is the key walk + hash alone, so
``jitkey-get`` minus it is roughly the cache's own cost (probe, compare, incref, call).
``jitkey-get_or_insert`` pays an extra Python lambda call to pass the factory.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

try:
    import cachetools
except ImportError:  # a peer, not a dependency of jitkey: its cases are skipped without it
    cachetools = None  # type: ignore[assignment]
import pytest

import jitkey

CAPACITY = 1024
FILL = 512  # other entries in every cache, so the probe is not into an empty table


def triton_key(n: int, salt: int = 0) -> tuple[object, ...]:
    """A Triton-style flat key: pointer args as (dtype, alignment), ints, constexprs."""
    items: list[object] = []
    for i in range(n):
        r = i % 4
        if r == 0:
            items.append(("*fp16", "D"))
        elif r == 1:
            items.append(1024 * (i + 1) + salt)
        elif r == 2:
            items.append(("constexpr", 1024))
        else:
            items.append(("*fp32", ""))
    return tuple(items)


class Value:
    """Stands for a compiled kernel."""


def _setup(impl: str, key: tuple[object, ...], value: Value) -> tuple[Callable[[Any], object], object]:
    """The call to time, as ``(fn, arg)``: subscripts go through ``operator.itemgetter(key)(cache)``,
    i.e. the same ``PyObject_GetItem`` path ``cache[key]`` takes, for dict and LruCache alike."""
    n = len(key)
    by_subscript = operator.itemgetter(key)
    others = [triton_key(n, salt=s) for s in range(1, FILL + 1)]
    if impl == "dict":
        d: dict[tuple[object, ...], object] = {k: Value() for k in others}
        d[key] = value
        return by_subscript, d
    if impl == "functools.lru_cache":
        table = {key: value}

        @functools.lru_cache(maxsize=CAPACITY)
        def compiled(k: tuple[object, ...]) -> object:
            return table.get(k, Value())

        for k in others:
            compiled(k)
        compiled(key)
        return compiled, key
    if impl == "cachetools.LRUCache":
        c: cachetools.LRUCache[tuple[object, ...], object] = cachetools.LRUCache(CAPACITY)
        for k in others:
            c[k] = Value()
        c[key] = value
        return by_subscript, c
    if impl == "jitkey-fast_hash":
        return jitkey.fast_hash, key
    jc = jitkey.LruCache(CAPACITY)
    for k in others:
        jc[k] = Value()
    jc[key] = value
    if impl == "jitkey-getitem":
        return by_subscript, jc
    if impl == "jitkey-get":
        return jc.get, key
    assert impl == "jitkey-get_or_insert"
    get_or_insert = jc.get_or_insert
    return (lambda k: get_or_insert(k, Value)), key


IMPLS = [
    "dict",
    "functools.lru_cache",
    "cachetools.LRUCache",
    "jitkey-getitem",
    "jitkey-get",
    "jitkey-get_or_insert",
    "jitkey-fast_hash",
]


@pytest.mark.parametrize("n", [4, 16], ids=lambda n: f"{n}-entry")
@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(i, marks=pytest.mark.skipif(cachetools is None, reason="cachetools is not installed"))
        if i.startswith("cachetools")
        else i
        for i in IMPLS
    ],
)
def test_warm_hit(benchmark, impl: str, n: int) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"lru/{n}-entry"
    key = triton_key(n)
    value = Value()
    fn, arg = _setup(impl, key, value)
    # Correct first: the timed call returns the stored value (or, for the hash alone, the same
    # hash as a fresh but equal key tuple).
    fresh = triton_key(n)
    assert fresh == key and fresh is not key
    if impl == "jitkey-fast_hash":
        assert fn(arg) == jitkey.fast_hash(fresh)
    else:
        assert fn(arg) is value
    benchmark(fn, arg)
