"""Crash torture of the disk index (issue 13, class 10): writer processes using put, put_many and
delete, readers, SIGKILLs at random moments and injected torn writes. Every operation a writer saw
complete is checked afterwards: a put acknowledged as stored in the file (``put`` returned True) is
there with its value, an acknowledged delete is gone; a put that returned False (kept in memory
only, e.g. after a lock timeout) is the only kind allowed to be missing, and the caller was told.

The short run is part of ``make test``; ``-m slow`` runs the long crash loop."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import signal
import struct
import time
import warnings
from pathlib import Path

import pytest

import jitkey

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: unix only")

# Large enough that nothing is evicted: a missing key is then a lost write, not a policy.
MAX_BYTES = 1 << 30
REC = struct.Struct("<cII")  # kind, first key, count: one atomic pipe write each


def value(wid: int, i: int, gen: int) -> bytes:
    return f"w{wid}:{i}:{gen}:".encode() + b"v" * (i % 97)


def writer(directory: str, log: str, wid: int, start: int, seed: int, fault: str | None) -> None:
    """Forever: intent record, the operation, then a done record saying how it ended (appended to
    `log`, a file: records written before a SIGKILL survive it)."""
    warnings.simplefilter("ignore")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ix = jitkey.DiskIndex(directory, max_bytes=MAX_BYTES)
    if fault is not None:
        ix._arm_fault(fault, random.Random(seed).randrange(5, 60))
    rng = random.Random(seed)
    i = start
    while True:
        op = rng.random()
        if op < 0.5:
            os.write(fd, REC.pack(b"P", i, 1))
            ok = ix.put(("k", wid, i), value(wid, i, 0))
            os.write(fd, REC.pack(b"p" if ok else b"m", i, 1))
            i += 1
        elif op < 0.85:
            n = rng.randrange(2, 40)
            os.write(fd, REC.pack(b"P", i, n))
            ok = ix.put_many([(("k", wid, j), value(wid, j, 0)) for j in range(i, i + n)])
            os.write(fd, REC.pack(b"p" if ok else b"m", i, n))
            i += n
        elif i > start:
            j = rng.randrange(start, i)
            os.write(fd, REC.pack(b"D", j, 1))
            ix.delete(("k", wid, j))
            os.write(fd, REC.pack(b"d", j, 1))


def reader(directory: str, wid_count: int, seed: int) -> None:
    warnings.simplefilter("ignore")
    ix = jitkey.DiskIndex(directory, max_bytes=MAX_BYTES)
    rng = random.Random(seed)
    while True:
        wid = rng.randrange(wid_count)
        i = rng.randrange(1 << 20)
        v = ix.get(("k", wid, i))
        if v is not None and v != value(wid, i, 0):
            os._exit(7)  # a wrong value: reported through the exit code


def read_records(log: Path) -> list[tuple[bytes, int, int]]:
    data = log.read_bytes()
    n = len(data) // REC.size
    return [REC.unpack_from(data, k * REC.size) for k in range(n)]


def torture(tmp_path: Path, *, kills: int, writers: int = 5, readers: int = 2) -> dict[str, int]:
    d = tmp_path / "ix"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jitkey.DiskIndex(d, max_bytes=MAX_BYTES).put("init", b"1")
    ctx = mp.get_context("fork")
    rng = random.Random(1234)
    # Per writer: key -> "present" / "absent" / "unknown" (in flight at a kill) / "memory".
    state: list[dict[int, str]] = [{} for _ in range(writers)]
    next_start = [w * (1 << 24) for w in range(writers)]
    starts = list(next_start)
    memory_only = 0
    procs: dict[int, tuple[mp.Process, Path]] = {}
    incarnation = 0
    rdrs = [ctx.Process(target=reader, args=(str(d), writers, s)) for s in range(readers)]
    for p in rdrs:
        p.start()

    def spawn(w: int) -> None:
        nonlocal incarnation
        incarnation += 1
        log = tmp_path / f"acks-{incarnation}"
        fault = "split_write" if rng.random() < 0.3 else None
        p = ctx.Process(
            target=writer, args=(str(d), str(log), w, next_start[w], rng.randrange(1 << 30), fault)
        )
        p.start()
        procs[w] = (p, log)

    def reap(w: int) -> None:
        nonlocal memory_only
        p, log = procs.pop(w)
        p.join(60)
        assert not p.is_alive()
        pending: tuple[bytes, int, int] | None = None
        for kind, first, count in read_records(log) if log.exists() else []:
            if kind in (b"P", b"D"):
                pending = (kind, first, count)
                continue
            pending = None
            for j in range(first, first + count):
                if kind == b"p":
                    state[w][j] = "present"
                elif kind == b"m":
                    state[w][j] = "memory"
                    memory_only += 1
                elif kind == b"d":
                    state[w][j] = "absent"
            if kind in (b"p", b"m"):
                next_start[w] = max(next_start[w], first + count)
        if pending is not None:
            kind, first, count = pending
            for j in range(first, first + count):
                state[w][j] = "unknown"
            if kind == b"P":
                next_start[w] = max(next_start[w], first + count)

    for w in range(writers):
        spawn(w)
    for _ in range(kills):
        time.sleep(rng.uniform(0.005, 0.05))
        w = rng.randrange(writers)
        p, _ = procs[w]
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        reap(w)
        spawn(w)
    for w in list(procs):
        if procs[w][0].is_alive():
            os.kill(procs[w][0].pid, signal.SIGKILL)
        reap(w)
    for p in rdrs:
        assert p.is_alive(), f"reader exited {p.exitcode} (7: a wrong value)"
        os.kill(p.pid, signal.SIGKILL)
        p.join(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check = jitkey.DiskIndex(d, max_bytes=MAX_BYTES)
    lost = wrong = resurrected = acked = 0
    for w in range(writers):
        for j, st in state[w].items():
            got = check.get(("k", w, j))
            if st == "present":
                acked += 1
                if got is None:
                    lost += 1
                elif got != value(w, j, 0):
                    wrong += 1
            elif st == "absent" and got is not None:
                resurrected += 1
            elif got is not None and got != value(w, j, 0):
                wrong += 1
    fig = {
        "kills": kills,
        "acked_puts": acked,
        "lost": lost,
        "wrong": wrong,
        "resurrected": resurrected,
        "memory_only_puts": memory_only,
        "keys_written": sum(next_start[w] - starts[w] for w in range(writers)),
        "file_mb": check.stats()["file_bytes"] >> 20,
    }
    print("torture", fig)
    return fig


@pytest.mark.usefixtures("fault_hook")
def test_crash_torture_short(tmp_path: Path) -> None:
    fig = torture(tmp_path, kills=12)
    assert fig["acked_puts"] > 0
    assert fig["lost"] == fig["wrong"] == fig["resurrected"] == 0, fig


@pytest.mark.usefixtures("fault_hook")
@pytest.mark.slow
def test_crash_torture_long(tmp_path: Path) -> None:
    for rnd in range(8):
        fig = torture(tmp_path / f"r{rnd}", kills=60)
        assert fig["lost"] == fig["wrong"] == fig["resurrected"] == 0, (rnd, fig)
        shutil.rmtree(tmp_path / f"r{rnd}")
