"""The Redis tier: RemoteIndex vs a bare redis-py GET/SET of the same bytes vs Triton's own Redis backend
(``triton.runtime.cache.RedisRemoteCacheBackend``), and the TieredIndex local hit vs DiskIndex alone.

    .venv/bin/python -m pytest benches/test_bench_remote.py --benchmark-enable -s

One redis-server on a loopback port (``jitkey._redis_server``); every client reads the same stored bytes
(jitkey's envelope under jitkey's Redis key for jitkey and redis-py; the same 256-byte value under Triton's key
format for Triton). Every benchmark checks its result before timing. ``test_ratios`` times the cases in
interleaved rounds (min of each) and, only when benchmarks are enabled, asserts the goals: a remote hit within
1.2x of the bare redis-py GET and faster than Triton's backend; the tiered local hit within 1.2x of
``DiskIndex.get``. Skips without a redis-server or redis-py (``CI=true``: fails).
"""

from __future__ import annotations

import os
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jitkey.bench import _remote_peers as rp


@pytest.fixture(scope="module")
def setup() -> Iterator[rp.RemoteSetup]:
    s = rp.setup()
    if isinstance(s, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{s} (required under CI=true)")
        pytest.skip(s)
    yield s
    s.close()


def bench_enabled(request: pytest.FixtureRequest) -> bool:
    opt = request.config.getoption
    return bool(opt("benchmark_enable")) or not opt("benchmark_disable")


def _calls(s: rp.RemoteSetup) -> dict[str, tuple[Callable[[], Any], Any]]:
    """name -> (call, expected result)."""
    out: dict[str, tuple[Callable[[], Any], Any]] = {
        "redis-py GET": (lambda: s.plain.get(s.redis_key), s.envelope),
        "jitkey RemoteIndex.get": (lambda: s.remote.get(s.key), rp.VALUE),
        "redis-py SET": (lambda: s.plain.set(s.redis_key, s.envelope), True),
        "jitkey RemoteIndex.put": (lambda: s.remote.put(s.key, rp.VALUE), True),
        "DiskIndex.get": (lambda: s.disk.get(s.key), rp.VALUE),
        "TieredIndex.get": (lambda: s.tier.get(s.key), rp.VALUE),
    }
    if s.triton is not None:
        f = rp.TRITON_FILE
        out["triton backend get"] = (lambda: s.triton.get([f]), {f: rp.VALUE})
        out["triton backend put"] = (lambda: s.triton.put(f, rp.VALUE), None)
    return out


GROUPS = {
    "remote get hit": ["redis-py GET", "jitkey RemoteIndex.get", "triton backend get"],
    "remote put": ["redis-py SET", "jitkey RemoteIndex.put", "triton backend put"],
    "tiered local hit": ["DiskIndex.get", "TieredIndex.get"],
}


@pytest.mark.parametrize("name", [n for names in GROUPS.values() for n in names])
def test_remote(benchmark: Any, setup: rp.RemoteSetup, name: str) -> None:
    calls = _calls(setup)
    if name not in calls:
        pytest.skip("triton (RedisRemoteCacheBackend) is not installed")
    fn, expected = calls[name]
    assert fn() == expected
    benchmark.group = next(g for g, names in GROUPS.items() if name in names)
    assert benchmark(fn) == expected
    # the envelope still verifies and nothing was rejected or failed along the way
    st = setup.remote.stats()
    assert st["rejects"] == st["errors"] == st["timeouts"] == 0 and setup.remote.get(setup.key) == rp.VALUE


def test_tiered_local_hit_does_not_touch_the_remote(setup: rp.RemoteSetup) -> None:
    before = setup.remote.stats()
    for _ in range(100):
        assert setup.tier.get(setup.key) == rp.VALUE
    after = setup.remote.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_ratios(request: pytest.FixtureRequest, setup: rp.RemoteSetup) -> None:
    """Interleaved rounds (each case's best round) in one run: the issue's goals as ratios."""
    calls = _calls(setup)
    for fn, expected in calls.values():
        assert fn() == expected
    enabled = bench_enabled(request)
    rounds, number = (15, 300) if enabled else (2, 5)
    best: dict[str, float] = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, (fn, _) in calls.items():
            n = number * 100 if "Index.get" in name and "Remote" not in name else number
            best[name] = min(best[name], timeit.timeit(fn, number=n) / n * 1e9)
    print("ns/op (best of", rounds, "interleaved rounds):", {k: round(v) for k, v in best.items()})
    if enabled:
        get_ratio = best["jitkey RemoteIndex.get"] / best["redis-py GET"]
        assert get_ratio <= 1.2, best
        if "triton backend get" in best:
            assert best["jitkey RemoteIndex.get"] < best["triton backend get"], best
        assert best["TieredIndex.get"] <= 1.2 * best["DiskIndex.get"], best
