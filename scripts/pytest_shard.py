"""pytest plugin of ``scripts/gpu_clients.sh``: with ``JITKEY_SHARD=K/N``, run only shard K of N.

A test belongs to shard ``crc32(node id) % N``, so the plain and the jitkey run of one shard run the same tests
and the shards of a suite spread its heavy files across processes (and GPUs). Without ``JITKEY_SHARD`` it does
nothing.
"""

from __future__ import annotations

import os
import zlib

import pytest


def shard_of(nodeid: str, n: int) -> int:
    """The shard (of ``n``) a test with this node id belongs to."""
    return zlib.crc32(nodeid.encode()) % n


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = os.environ.get("JITKEY_SHARD")
    if not spec:
        return
    k, n = (int(x) for x in spec.split("/"))
    if not 0 <= k < n:
        raise pytest.UsageError(f"JITKEY_SHARD={spec}: want K/N with 0 <= K < N")
    keep = [it for it in items if shard_of(it.nodeid, n) == k]
    drop = [it for it in items if shard_of(it.nodeid, n) != k]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
