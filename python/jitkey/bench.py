"""The jitkey microbenchmark (``python -m jitkey bench``).

First version: the ``key`` section only (encode / digest / fast_hash of Triton-style key tuples
against Python's ``hash(tuple)`` and ``hashlib.blake2b(pickle.dumps(...))``). Each case checks its
result against the pure-Python reference encoder before it is timed.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

import jitkey
from jitkey import _reference


def _triton_style_key(n: int) -> tuple[Any, ...]:
    items: list[Any] = []
    dtypes = ["*fp16", "*fp32", "*bf16", "i32"]
    for i in range(n):
        items.append((dtypes[i % len(dtypes)], "D" if i % 3 else ""))
    items.append(("constexpr", 1024))
    items.append(4)  # num_warps
    return tuple(items)


def _time_ns(fn: Callable[[], object], repeat: int, number: int) -> tuple[float, float]:
    times = [t / number * 1e9 for t in timeit.repeat(fn, repeat=repeat, number=number)]
    return statistics.median(times), (max(times) - min(times))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m jitkey bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (about 5x faster)")
    args = parser.parse_args(argv)
    repeat, number = (5, 2_000) if args.quick else (9, 20_000)

    print(f"jitkey {jitkey.__version__} · Python {sys.version.split()[0]} · median ns/call of {repeat} repeats")
    print(f"{'case':<28}{'impl':<26}{'ns':>10}{'ratio':>9}")
    for n in (4, 16):
        key = _triton_style_key(n)
        assert jitkey.encode(key) == _reference.encode(key)
        assert jitkey.digest(key) == _reference.digest(key)
        cases: list[tuple[str, Callable[[], object]]] = [
            ("python hash(tuple)", lambda key=key: hash(key)),
            ("blake2b(pickle) [py]", lambda key=key: hashlib.blake2b(pickle.dumps(key), digest_size=32).digest()),
            ("jitkey.fast_hash", lambda key=key: jitkey.fast_hash(key)),
            ("jitkey.encode", lambda key=key: jitkey.encode(key)),
            ("jitkey.digest", lambda key=key: jitkey.digest(key)),
        ]
        base = None
        for name, fn in cases:
            med, _spread = _time_ns(fn, repeat, number)
            base = base or med
            print(f"{f'key/{n}-entry tuple':<28}{name:<26}{med:>10.1f}{med / base:>8.2f}x")
    return 0
