"""Child-process bodies for the DiskIndex multi-process tests (importable under spawn)."""

from __future__ import annotations

import json
import os
import struct
import time
import warnings
from pathlib import Path

import jitkey


def value_for(tag: object, i: int, size: int = 24) -> bytes:
    """A value that identifies who wrote it, padded to `size` bytes."""
    head = f"{tag}:{i}:".encode()
    return head + b"v" * max(0, size - len(head))


def t1_writer(directory: str, wid: int, m: int, durability: str, out: str, batch: int = 1) -> None:
    """M puts: distinct keys, ~10% shared keys with the same value, ~1% contended keys with
    per-writer values. Records the last value it wrote per contended key. ``batch`` > 1: in
    ``put_many`` calls of that many records instead of one ``put`` each."""
    ix = jitkey.DiskIndex(directory, durability=durability)
    last_contended: dict[int, str] = {}
    pending: list[tuple[object, bytes]] = []
    t0 = time.perf_counter()
    for i in range(m):
        r = i % 100
        if r < 10:
            pending.append((("shared", i % 500), value_for("shared", i % 500)))
        elif r == 10:
            c = i % 7
            v = value_for(f"c{wid}", i)
            pending.append((("contended", c), v))
            last_contended[c] = v.decode()
        else:
            pending.append((("w", wid, i), value_for(wid, i)))
        if len(pending) >= batch or i == m - 1:
            if batch == 1:
                ix.put(*pending[0])
            else:
                ix.put_many(pending)
            pending = []
    dt = time.perf_counter() - t0
    st = ix.stats()
    ix.close()
    Path(out).write_text(
        json.dumps(
            {
                "seconds": dt,
                "last_contended": last_contended,
                "appends": st["appends"],
                "dedup": st["dedup_skips"],
                "lock_p50": st["lock_wait_us_p50"],
                "lock_p99": st["lock_wait_us_p99"],
            }
        )
    )


def acked_writer(directory: str, fd: int, start: int, fault: str | None, after: int, batch: int) -> None:
    """Puts keys start, start+1, ... forever; after each acknowledged put (or batch) writes the
    acknowledged indices to pipe `fd` (4 bytes each, atomic writes). Dies by SIGKILL: from the
    parent, or from an armed crash point."""
    ix = jitkey.DiskIndex(directory)
    if fault is not None:
        ix._arm_fault(fault, after)
    i = start
    while True:
        if batch == 1:
            ix.put(("k", i), value_for("k", i))
            os.write(fd, struct.pack("<I", i))
            i += 1
        else:
            items = [(("k", j), value_for("k", j)) for j in range(i, i + batch)]
            ix.put_many(items)
            os.write(fd, b"".join(struct.pack("<I", j) for j in range(i, i + batch)))
            i += batch


def compact_with_fault(directory: str, fault: str) -> None:
    """Arms a compaction crash point and compacts (the process SIGKILLs itself there)."""
    ix = jitkey.DiskIndex(directory)
    ix._arm_fault(fault, 0)
    ix.compact()
    raise SystemExit(3)  # not reached when the fault fires


def appender(directory: str, fd: int, start: int, n: int) -> None:
    """Appends n keys, acknowledging each through pipe `fd`."""
    ix = jitkey.DiskIndex(directory)
    for i in range(start, start + n):
        ix.put(("k", i), value_for("k", i))
        os.write(fd, struct.pack("<I", i))
    ix.close()


def t5_writer(directory: str, acked, done, n: int, compact_every: int) -> None:  # type: ignore[no-untyped-def]
    ix = jitkey.DiskIndex(directory)
    for i in range(n):
        ix.put(("k", i), value_for("k", i, 40))
        acked.value = i + 1
        if (i + 1) % compact_every == 0:
            assert ix.compact()
    ix.close()
    done.value = 1


def t5_reader(directory: str, acked, done, seed: int, out: str) -> None:  # type: ignore[no-untyped-def]
    """Random gets of acknowledged keys while the writer appends and compacts; every value is
    checked. A miss of an acknowledged key counts as lost (a miss refreshes the view first)."""
    import random

    rng = random.Random(seed)
    ix = jitkey.DiskIndex(directory)
    wrong = missing = gets = 0
    while not done.value:
        n = acked.value
        if n:
            i = rng.randrange(n)
            v = ix.get(("k", i))
            gets += 1
            if v is None:
                missing += 1
            elif v != value_for("k", i, 40):
                wrong += 1
    n = acked.value
    for i in range(n):
        v = ix.get(("k", i))
        gets += 1
        missing += v is None
        wrong += v is not None and v != value_for("k", i, 40)
    st = ix.stats()
    Path(out).write_text(
        json.dumps({"gets": gets, "wrong": wrong, "missing": missing, "reopens": st["reopens"]})
    )


def fsize_limited_writer(directory: str, limit: int, n: int, out: str) -> None:
    """Puts n keys under RLIMIT_FSIZE = limit bytes; records what it saw (no exception may escape)."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ix = jitkey.DiskIndex(directory)
        for i in range(n):
            ix.put(("k", i), value_for("k", i, 200))
        # Every value is still served in this process (file or memory).
        served = sum(ix.get(("k", i)) == value_for("k", i, 200) for i in range(n))
        st = ix.stats()
    Path(out).write_text(
        json.dumps(
            {
                "served": served,
                "warnings": [str(w.message) for w in caught if w.category is jitkey.errors.DiskIndexWarning],
                "write_errors": st["write_errors"],
                "memory_only_puts": st["memory_only_puts"],
                "appends": st["appends"],
            }
        )
    )


def read_acks(fd: int) -> list[int]:
    """All acknowledged indices a child wrote to pipe `fd` before it died."""
    chunks = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    data = b"".join(chunks)
    return [struct.unpack_from("<I", data, i)[0] for i in range(0, len(data) - len(data) % 4, 4)]


def verify_all(ix: jitkey.DiskIndex, acked: set[int]) -> tuple[int, int]:
    """(lost, wrong) over the acknowledged keys ("k", i)."""
    lost = wrong = 0
    for i in acked:
        v = ix.get(("k", i))
        lost += v is None
        wrong += v is not None and v != value_for("k", i)
    return lost, wrong
