from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI shares 2 cores with the build and other suites: never fail a property test because one example was slow
# (each test still sets its own example budget; deadlines are off everywhere).
settings.register_profile(
    "jitkey", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("jitkey")


@pytest.fixture
def fault_hook() -> None:
    """For the crash tests: they arm crash points with ``DiskIndex._arm_fault``, which exists only in
    builds with the cargo feature ``fault-injection`` (``make build``/``make test`` turn it on; the
    released wheel and sdist never have it). Without it they skip; under ``CI=true`` they fail, since
    CI builds with ``make test``."""
    import jitkey

    if hasattr(jitkey.DiskIndex, "_arm_fault"):
        return
    reason = (
        "needs DiskIndex._arm_fault: this jitkey was built without the cargo feature fault-injection "
        "(make build turns it on; release wheels never have it)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (required under CI=true)")
    pytest.skip(reason)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The torch/triton pair a run uses (the Triton CPU matrix runs twice with different tritons).

    Found without importing them (cheap for runs that never touch torch); the version assertion itself is
    tests/test_triton_matrix.py.
    """
    out = []
    for name in ("torch", "triton"):
        spec = importlib.util.find_spec(name)
        if spec is None:
            out.append(f"{name}: not installed")
            continue
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        where = os.path.dirname(os.path.dirname(spec.origin or "?"))
        out.append(f"{name}: {version} ({where})")
    expect = os.environ.get("JITKEY_EXPECT_TRITON")
    if expect:
        out.append(f"JITKEY_EXPECT_TRITON={expect} (checked by tests/test_triton_matrix.py)")
    return out


# ---- the Redis tier's server (tests/test_remote*.py, tests/test_triton_remote_cache.py) -------------------


def _redis_unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (required under CI=true: make test installs redis-server with apt)")
    pytest.skip(reason)


@pytest.fixture
def server() -> Iterator[Any]:
    """A throwaway ``redis-server`` on a free loopback port (``jitkey._redis_server.RedisServer``). Without a
    server binary or the ``redis`` client the test skips with the reason; under ``CI=true`` it fails."""
    from jitkey._redis_server import RedisServer, RedisServerError, find_redis_server

    try:
        import redis  # noqa: F401
    except ImportError:
        _redis_unavailable("the redis client is not installed (pip install 'jitkey[redis]')")
    if find_redis_server() is None:
        _redis_unavailable(
            "no redis-server on PATH or in .redis-debs/ (Debian: apt-get install redis-server; make test "
            "does it as root; or scripts/fetch_redis_server.sh)"
        )
    try:
        srv = RedisServer().start()
    except RedisServerError as exc:
        _redis_unavailable(f"redis-server did not start: {exc}")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def raw(server: Any) -> Iterator[Any]:
    """A plain redis-py client on the test server (to plant bad data and inspect keys)."""
    import redis

    client = redis.Redis.from_url(server.url)
    yield client
    client.close()
