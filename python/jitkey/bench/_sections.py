"""The sections of ``python -m jitkey bench``: each builds its cases (checked before timing)."""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import jitkey
from jitkey import _reference
from jitkey.bench._harness import Case, Skipped

SectionResult = list[Case] | Skipped


def triton_style_key(n: int) -> tuple[Any, ...]:
    """A Triton-style flat key of ``n`` entries: per-arg (type, attr) pairs, a constexpr, num_warps."""
    kinds = ["*fp16", "*fp32", "*bf16", "i32"]
    items: list[Any] = [(kinds[i % 4], "D" if i % 3 else "") for i in range(n - 2)]
    items += [("constexpr", 1024), 4]
    return tuple(items)


def _expect(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")


def key_section(quick: bool) -> SectionResult:
    """encode / digest / fast_hash of key tuples vs hash(tuple) and blake2b(pickle)."""
    cases: list[Case] = []
    for n in (4, 16):
        key = triton_style_key(n)
        group = f"key/{n}-entry tuple"
        ref_enc, ref_digest = _reference.encode(key), _reference.digest(key)

        def check(key: Any = key, ref_enc: bytes = ref_enc, ref_digest: bytes = ref_digest) -> None:
            _expect(jitkey.encode(key), ref_enc, "jitkey.encode vs the reference encoder")
            _expect(jitkey.digest(key), ref_digest, "jitkey.digest vs hashlib.blake2b of the reference")
            _expect(jitkey.fast_hash(key), jitkey.fast_hash(key), "fast_hash determinism")

        env = {"k": key, "hash": hash, "pickle": pickle, "blake2b": hashlib.blake2b, "jk": jitkey}
        cases += [
            Case(group, "python hash(tuple)", "hash(k)", env, check, baseline=True),
            Case(
                group,
                "python blake2b(pickle)",
                "blake2b(pickle.dumps(k), digest_size=32).digest()",
                env,
                check,
            ),
            Case(group, "jitkey.fast_hash", "jk.fast_hash(k)", env, check),
            Case(group, "jitkey.encode", "jk.encode(k)", env, check),
            Case(group, "jitkey.digest", "jk.digest(k)", env, check),
        ]
    return cases


def cache_section(quick: bool) -> SectionResult:
    """Warm hits: LruCache vs dict, functools.lru_cache and cachetools.LRUCache, same key tuple."""
    try:
        import cachetools
    except ImportError:
        cachetools = None
    cases: list[Case] = []
    for n in (4, 16):
        key = triton_style_key(n)
        fresh = "k = (" + ", ".join(f"k{i}" for i in range(n)) + ",)"  # a new tuple per call
        value = object()
        d = {key: value}
        lru = jitkey.LruCache(1024)
        lru[key] = value

        @functools.lru_cache(maxsize=1024)
        def cached(*args: Any, _v: object = value) -> object:
            return _v

        cached(*key)
        env: dict[str, Any] = {"k": key, "d": d, "lru": lru, "cached": cached}
        env.update({f"k{i}": item for i, item in enumerate(key)})
        impls: list[tuple[str, str, Callable[[], object]]] = [
            ("dict[tuple]", "d[k]", lambda d=d, key=key: d[key]),
            ("jitkey LruCache[tuple]", "lru[k]", lambda lru=lru, key=key: lru[key]),
            ("jitkey LruCache.get(tuple)", "lru.get(k)", lambda lru=lru, key=key: lru.get(key)),
            ("functools.lru_cache(*args)", "cached(*k)", lambda cached=cached, key=key: cached(*key)),
        ]
        if cachetools is not None:
            tc = cachetools.LRUCache(maxsize=1024)
            tc[key] = value
            env["tc"] = tc
            impls.append(("cachetools.LRUCache[tuple]", "tc[k]", lambda tc=tc, key=key: tc[key]))
        for label, stmt, fn in impls:

            def check(fn: Callable[[], object] = fn, value: object = value, label: str = label) -> None:
                if fn() is not value:
                    raise AssertionError(f"{label} did not return the cached value")

            cases.append(
                Case(f"cache hit/{n}-entry", label, stmt, env, check, baseline=label == "dict[tuple]")
            )
        # The same lookups with a freshly built key tuple per call (what a launcher really does).
        for label, stmt in [("dict[fresh tuple]", "d[k]"), ("jitkey LruCache[fresh tuple]", "lru[k]")]:

            def check_fresh(
                stmt: str = stmt, env: dict[str, Any] = env, value: object = value, fresh: str = fresh
            ) -> None:
                scope = dict(env)
                exec(fresh + "\nout = " + stmt, scope)
                if scope["out"] is not value:
                    raise AssertionError(f"{stmt} with a fresh tuple missed")

            cases.append(
                Case(
                    f"cache hit, fresh key/{n}-entry",
                    label,
                    fresh + "; " + stmt,
                    env,
                    check_fresh,
                    baseline=label.startswith("dict"),
                )
            )
    return cases


SECTIONS: dict[str, Callable[[bool], SectionResult]] = {
    "key": key_section,
    "cache": cache_section,
}
