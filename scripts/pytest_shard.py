"""pytest plugin of ``scripts/gpu_clients.sh``: with ``JITKEY_SHARD=K/N``, run only shard K of N.

A test belongs to shard ``crc32(node id) % N``, so the plain and the jitkey run of one shard run the same tests
and the shards of a suite spread its heavy files across processes (and GPUs). Without ``JITKEY_SHARD`` it does
nothing.

With ``JITKEY_ONLY=FILE``, only the tests FILE names run, one per line as JUnit XML and ``compare_junit.py``
name them (``classname::name``): the rerun of a comparison's regressions.

With ``JITKEY_DEADLINE=T`` (seconds since the epoch), the session stops at the first test boundary after ``T``
the way ``-x`` stops it: the test under way finishes and pytest still writes its JUnit XML. A signal would have
to land between tests for that: one that lands inside a compiler's C++ code aborts the process, and the XML of
every test it ran is lost.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable

import pytest


def shard_of(nodeid: str, n: int) -> int:
    """The shard (of ``n``) a test with this node id belongs to."""
    return zlib.crc32(nodeid.encode()) % n


def junit_name(nodeid: str) -> str:
    """A test's name as pytest's JUnit XML writes it (``classname::name``), from its node id."""
    from _pytest.junitxml import mangle_test_address

    names = mangle_test_address(nodeid)
    return ".".join(names[:-1]) + "::" + names[-1]


def _select(config: pytest.Config, items: list[pytest.Item], wanted: Callable[[pytest.Item], bool]) -> None:
    """Keep the items ``wanted`` takes (asked once each); the others are reported deselected."""
    keep, drop = [], []
    for it in items:
        (keep if wanted(it) else drop).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = os.environ.get("JITKEY_ONLY")
    if only:
        with open(only, encoding="utf-8") as f:
            names = {line.strip() for line in f if line.strip()}
        _select(config, items, lambda it: junit_name(it.nodeid) in names)
    spec = os.environ.get("JITKEY_SHARD")
    if not spec:
        return
    k, n = (int(x) for x in spec.split("/"))
    if not 0 <= k < n:
        raise pytest.UsageError(f"JITKEY_SHARD={spec}: want K/N with 0 <= K < N")
    _select(config, items, lambda it: shard_of(it.nodeid, n) == k)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    deadline = os.environ.get("JITKEY_DEADLINE")
    if deadline and nextitem is not None and time.time() >= float(deadline):
        item.session.shouldstop = f"JITKEY_DEADLINE passed: stopped before {nextitem.nodeid}"
