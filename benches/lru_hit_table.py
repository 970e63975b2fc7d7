"""Print the warm-hit table of benches/test_bench_lru.py with timeit, interleaved, min of N rounds.

    .venv/bin/python benches/lru_hit_table.py [rounds]

pytest-benchmark's per-round timer overhead and scheduling noise swamp ~100 ns calls on a shared
machine; this runs every implementation in turn for each round (so they share the machine's
state), keeps each one's fastest round, and prints ratios to ``dict`` and ``functools.lru_cache``.
Each call is checked before it is timed. Figures include ~7 ns of timeit loop overhead.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

import jitkey

sys.path.insert(0, str(Path(__file__).parent))
from test_bench_lru import IMPLS as _ALL_IMPLS
from test_bench_lru import Value, _setup, cachetools, triton_key

IMPLS = [i for i in _ALL_IMPLS if cachetools is not None or not i.startswith("cachetools")]


def main(rounds: int = 25, number: int = 20_000) -> None:
    for n in (4, 16):
        key = triton_key(n)
        calls = {}
        for impl in IMPLS:
            value = Value()
            fn, arg = _setup(impl, key, value)
            expected = jitkey.fast_hash(triton_key(n)) if impl == "jitkey-fast_hash" else value
            got = fn(arg)
            assert got == expected if impl == "jitkey-fast_hash" else got is expected, impl
            calls[impl] = timeit.Timer("fn(arg)", globals={"fn": fn, "arg": arg})
        best = dict.fromkeys(IMPLS, float("inf"))
        for _ in range(rounds):
            for impl, timer in calls.items():
                best[impl] = min(best[impl], timer.timeit(number) / number * 1e9)
        print(f"{n}-entry key: min of {rounds} rounds x {number} calls (ns per call)")
        for impl in IMPLS:
            print(
                f"  {impl:22s} {best[impl]:7.1f}   {best[impl] / best['dict']:5.2f}x dict"
                f"   {best[impl] / best['functools.lru_cache']:5.2f}x lru_cache"
            )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
