"""jitkey.DiskIndex: API, typed errors, degraded environments (T6, T7), synthetic torn tails (T2c)
and file-level corruption (T4). Multi-process tests live in test_disk_processes.py."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import struct
import sys
import warnings
from pathlib import Path

import pytest

import jitkey
from _disk_workers import fsize_limited_writer, value_for
from jitkey.errors import (
    DiskIndexWarning,
    IndexClosedError,
    KeyLengthError,
    UnsupportedKeyError,
    ValueTooLargeError,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="DiskIndex is unix-only")

LOG = "index.v1.jki"


def quiet_open(d: Path, **kw: object) -> tuple[jitkey.DiskIndex, list[str]]:
    """Opens an index, returning the DiskIndexWarnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ix = jitkey.DiskIndex(d, **kw)  # type: ignore[arg-type]
    return ix, [str(w.message) for w in caught if issubclass(w.category, DiskIndexWarning)]


# ----- API -----


def test_put_get_contains_len_delete(tmp_path: Path) -> None:
    with jitkey.DiskIndex(tmp_path / "ix") as ix:
        assert ix.mode == "rw" and ix.mode_reason == ""
        assert ix.get(("a", 1)) is None
        assert ("a", 1) not in ix
        ix.put(("a", 1), b"one")
        assert ix.get(("a", 1)) == b"one"
        # A 32-byte bytes key is a digest: the same entry as the value it digests.
        assert ix.get(jitkey.digest(("a", 1))) == b"one"
        assert ("a", 1) in ix
        ix.put(("a", 1), b"uno")
        assert ix.get(("a", 1)) == b"uno"
        ix.put_many([(("b", i), bytes([i])) for i in range(10)])
        ix.put_many({("c", 0): b"", ("c", 1): b"x" * jitkey.DiskIndex.MAX_VALUE})
        assert ix.get(("c", 0)) == b""
        assert ix.get(("c", 1)) == b"x" * jitkey.DiskIndex.MAX_VALUE
        assert len(ix) == 13
        assert ix.delete(("a", 1)) is True
        assert ix.delete(("a", 1)) is False
        assert ix.get(("a", 1)) is None
        assert len(ix) == 12
        st = ix.stats()
        assert st["entries"] == 12 and st["mode"] == "rw" and st["appends"] == 15
        assert ix.path == tmp_path / "ix" / LOG
        assert oct(os.stat(tmp_path / "ix").st_mode & 0o777) == "0o700"


def test_dedup_and_visibility_across_instances(tmp_path: Path) -> None:
    a = jitkey.DiskIndex(tmp_path)
    b = jitkey.DiskIndex(tmp_path)
    a.put("k", b"v")
    b.put("k", b"v")  # same key, same value: no second record
    assert b.stats()["dedup_skips"] == 1
    assert a.stats()["file_bytes"] == b.stats()["file_bytes"]
    b.put("k", b"w")
    b.put("new", b"n")
    assert a.get("new") == b"n"  # a miss refreshes at once
    a.refresh()  # hits see other processes' updates within the refresh interval, or on refresh()
    assert a.get("k") == b"w"


def test_compact_clear_and_eviction(tmp_path: Path) -> None:
    ix = jitkey.DiskIndex(tmp_path, max_bytes=256 * 1024)
    for i in range(5000):
        ix.put(("k", i), value_for("k", i, 60))
    st = ix.stats()
    assert st["compactions"] > 0 and st["evictions"] > 0
    assert st["file_bytes"] <= 256 * 1024
    assert ix.get(("k", 4999)) == value_for("k", 4999, 60)
    for i in range(5000):
        v = ix.get(("k", i))
        assert v is None or v == value_for("k", i, 60)
    gen = ix.stats()["generation"]
    assert ix.compact() is True
    assert ix.stats()["generation"] == gen + 1
    assert ix.clear() is True
    assert len(ix) == 0 and ix.get(("k", 4999)) is None


def test_durability_full(tmp_path: Path) -> None:
    ix = jitkey.DiskIndex(tmp_path, durability="full")
    ix.put("k", b"v")
    assert jitkey.DiskIndex(tmp_path).get("k") == b"v"


def test_caller_mistakes_raise_typed_errors(tmp_path: Path) -> None:
    ix = jitkey.DiskIndex(tmp_path)
    with pytest.raises(KeyLengthError, match="32-byte digest"):
        ix.get(b"short")
    with pytest.raises(UnsupportedKeyError):
        ix.put(object(), b"v")
    with pytest.raises(TypeError):
        ix.put("k", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueTooLargeError, match="at most 65472"):
        ix.put("k", b"x" * (jitkey.DiskIndex.MAX_VALUE + 1))
    with pytest.raises(ValueTooLargeError):
        ix.put_many([("a", b"ok"), ("b", b"x" * 70000)])
    assert ix.get("a") is None, "a refused batch writes nothing"
    with pytest.raises(ValueError, match="durability"):
        jitkey.DiskIndex(tmp_path, durability="fsync")
    with pytest.raises(ValueError, match="max_bytes"):
        jitkey.DiskIndex(tmp_path, max_bytes=100)
    ix.close()
    assert ix.closed
    for call in (
        lambda: ix.get("k"),
        lambda: ix.put("k", b"v"),
        lambda: ix.put_many([]),
        lambda: ix.delete("k"),
        lambda: "k" in ix,
        lambda: len(ix),
        ix.compact,
        ix.clear,
        ix.refresh,
    ):
        with pytest.raises(IndexClosedError):
            call()
    ix.close()  # idempotent
    with pytest.raises(IndexClosedError), ix:
        pass


def test_default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITKEY_CACHE_DIR", str(tmp_path / "explicit"))
    assert jitkey.DiskIndex().path == tmp_path / "explicit" / LOG
    monkeypatch.delenv("JITKEY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jitkey.DiskIndex().path == tmp_path / "xdg" / "jitkey" / LOG
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ix = jitkey.DiskIndex()
    assert ix.path == tmp_path / "home" / ".cache" / "jitkey" / LOG
    assert ix.mode == "rw"
    assert os.stat(tmp_path / "home" / ".cache" / "jitkey").st_mode & 0o777 == 0o700


def test_env_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jitkey.DiskIndex(tmp_path).put("k", b"v")
    monkeypatch.setenv("JITKEY_DISK_CACHE", "ro")
    with pytest.warns(DiskIndexWarning, match="read-only requested"):
        ro = jitkey.DiskIndex(tmp_path)
    assert ro.mode == "ro" and ro.get("k") == b"v"
    ro.put("k2", b"mem")  # kept in memory, not written
    assert ro.get("k2") == b"mem"
    monkeypatch.setenv("JITKEY_DISK_CACHE", "0")
    with pytest.warns(DiskIndexWarning, match="disabled"):
        assert jitkey.DiskIndex(tmp_path).mode == "memory"
    monkeypatch.setenv("JITKEY_DISK_CACHE", "maybe")
    with pytest.raises(ValueError, match="JITKEY_DISK_CACHE"):
        jitkey.DiskIndex(tmp_path)
    monkeypatch.delenv("JITKEY_DISK_CACHE")
    assert jitkey.DiskIndex(tmp_path).get("k2") is None


# ----- T7: directories -----


def test_t7_world_writable_dir_is_memory_only(tmp_path: Path) -> None:
    d = tmp_path / "ww"
    d.mkdir()
    d.chmod(0o777)
    ix, warned = quiet_open(d)
    assert ix.mode == "memory" and "world-writable" in ix.mode_reason
    assert len(warned) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning from later operations
        ix.put("k", b"v")
        assert ix.get("k") == b"v" and len(ix) == 1
    assert not (d / LOG).exists()
    d.chmod(0o1777)  # sticky: like /tmp, allowed
    assert quiet_open(d)[0].mode == "rw"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_t7_foreign_owned_dir_is_memory_only(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    ix, warned = quiet_open(d)
    assert ix.mode == "memory" and "owned by uid 65534" in ix.mode_reason
    assert len(warned) == 1
    assert ix.get("k") is None


def _ro_child(d: str, out: str) -> None:
    os.setgid(65534)
    os.setuid(65534)
    ix, warned = quiet_open(Path(d))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ix.put("new", b"mem")
        res = {"mode": ix.mode, "reason": ix.mode_reason, "warned": len(warned), "hit": ix.get("k") == b"v"}
        res["mem"] = ix.get("new") == b"mem"
    Path(out).write_text(json.dumps(res))


def test_t7_read_only_dir_serves_hits(tmp_path: Path) -> None:
    """A directory this user cannot write: hits from the file, puts in memory, one warning.
    As root, permission bits do not bind, so a forked child drops to uid 65534 (nobody)."""
    d = tmp_path / "ro"
    jitkey.DiskIndex(d).put("k", b"v")
    if os.geteuid() == 0:
        import tempfile

        base = Path(tempfile.mkdtemp(prefix="jitkey-ro-"))
        try:
            base.chmod(0o755)
            d2 = base / "ix"
            shutil.copytree(d, d2)
            for p in [d2, *d2.iterdir()]:
                os.chown(p, 65534, 65534)
            (d2 / "index.lock").unlink()
            (d2 / LOG).chmod(0o400)
            d2.chmod(0o500)
            out = base / "out.json"
            base.chmod(0o777)  # the child writes its result here
            p = mp.get_context("fork").Process(target=_ro_child, args=(str(d2), str(out)))
            p.start()
            p.join(60)
            assert p.exitcode == 0
            res = json.loads(out.read_text())
        finally:
            shutil.rmtree(base)
        assert res == {"mode": "ro", "reason": res["reason"], "warned": 1, "hit": True, "mem": True}
        assert "index.lock" in res["reason"]
    else:
        d.chmod(0o500)
        (d / "index.lock").unlink()
        try:
            ix, warned = quiet_open(d)
            assert ix.mode == "ro" and len(warned) == 1 and ix.get("k") == b"v"
        finally:
            d.chmod(0o700)


def test_t7_missing_parent_and_unusable_path(tmp_path: Path) -> None:
    ix = jitkey.DiskIndex(tmp_path / "a" / "b" / "c")
    assert ix.mode == "rw"
    (tmp_path / "file").write_text("x")
    ix, warned = quiet_open(tmp_path / "file" / "sub")
    assert ix.mode == "memory" and "cannot create" in ix.mode_reason and len(warned) == 1


# ----- T6: disk full (RLIMIT_FSIZE -> EFBIG) -----


def test_t6_file_size_limit(tmp_path: Path) -> None:
    d = tmp_path / "ix"
    n = 1000
    out = tmp_path / "t6.json"
    p = mp.get_context("fork").Process(target=fsize_limited_writer, args=(str(d), 64 * 1024, n, str(out)))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    res = json.loads(out.read_text())
    print("T6", {k: v for k, v in res.items() if k != "warnings"}, res["warnings"])
    assert res["served"] == n, "every put is still served in the writing process"
    assert res["write_errors"] >= 1 and res["memory_only_puts"] > 0
    assert len(res["warnings"]) == 1 and "File too large" in res["warnings"][0]
    # Another process (no limit) sees a valid file: a prefix of the puts, then writes again.
    ix = jitkey.DiskIndex(d)
    present = 0
    for i in range(n):
        v = ix.get(("k", i))
        assert v is None or v == value_for("k", i, 200)
        present += v is not None
    assert 0 < present < n
    assert present == res["appends"]
    ix.put(("after", 0), b"ok")
    assert jitkey.DiskIndex(d).get(("after", 0)) == b"ok"


# ----- T2c: synthetic torn tails -----


def test_t2_synthetic_tails(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ix = jitkey.DiskIndex(src)
    for i in range(20):
        ix.put(("k", i), value_for("k", i, 40))
    before = (src / LOG).stat().st_size
    ix.put(("last", 0), value_for("last", 0, 40))
    data = (src / LOG).read_bytes()
    ix.close()
    rng = random.Random(7)
    work = tmp_path / "work"
    cases = 0
    for cut in range(before, len(data)):
        for tail in (b"", bytes(rng.randrange(1, 4096)), rng.randbytes(rng.randrange(1, 4096))):
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(mode=0o700)
            (work / LOG).write_bytes(data[:cut] + tail)
            r = jitkey.DiskIndex(work)
            assert r.get(("last", 0)) is None
            for i in range(20):
                assert r.get(("k", i)) == value_for("k", i, 40)
            r.put(("again", 0), b"again")
            assert r.stats()["torn_tails_padded"] == (1 if cut > before or tail else 0)
            r2 = jitkey.DiskIndex(work)
            assert r2.get(("again", 0)) == b"again"
            assert all(r2.get(("k", i)) == value_for("k", i, 40) for i in range(20))
            cases += 1
    assert cases == 3 * (len(data) - before)


# ----- T4: file-level corruption -----


def _base_file(tmp_path: Path, n: int) -> bytes:
    d = tmp_path / "base"
    ix = jitkey.DiskIndex(d)
    ix.put_many([(("k", i), value_for("k", i, 30 + i % 50)) for i in range(n)])
    ix.close()
    return (d / LOG).read_bytes()


def _record_offsets(data: bytes) -> list[int]:
    offs, pos = [], 64
    while pos + 8 <= len(data):
        offs.append(pos)
        pos += struct.unpack_from("<I", data, pos + 4)[0]
    return offs


def _check_mutant(work: Path, blob: bytes, n: int) -> tuple[int, str]:
    """Opens a mutated file; every value returned must be right. Returns (recovered, mode)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(mode=0o700)
    (work / LOG).write_bytes(blob)
    ix, _ = quiet_open(work)
    recovered = 0
    for i in range(n):
        v = ix.get(("k", i))
        assert v is None or v == value_for("k", i, 30 + i % 50), f"wrong value for key {i}"
        recovered += v is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiskIndexWarning)
        ix.put(("after", 0), b"after")
        assert ix.get(("after", 0)) == b"after"
        ix2, _ = quiet_open(work)
        for i in range(n):
            v = ix2.get(("k", i))
            assert v is None or v == value_for("k", i, 30 + i % 50)
    return recovered, ix.mode


def _mutants(data: bytes, rng: random.Random, count: int):  # type: ignore[no-untyped-def]
    offs = _record_offsets(data)
    for _ in range(count):
        b = bytearray(data)
        kind = rng.choice(["flip", "flip", "zero", "trunc", "header", "len0", "lenpast", "lenhuge"])
        if kind == "flip":
            for _ in range(rng.randrange(1, 101)):
                b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        elif kind == "zero":
            at, size = rng.randrange(len(b)), rng.randrange(8, 4096)
            b[at : at + size] = bytes(len(b[at : at + size]))
        elif kind == "trunc":
            del b[rng.randrange(len(b)) :]
        elif kind == "header":
            b[rng.randrange(64)] ^= rng.randrange(1, 256)
        else:
            at = rng.choice(offs) + 4
            val = {"len0": 0, "lenpast": len(b) + 8, "lenhuge": 0xFFFFFFF8}[kind]
            b[at : at + 4] = struct.pack("<I", val)
        yield kind, bytes(b)


def run_t4(tmp_path: Path, count: int) -> None:
    n = 300
    data = _base_file(tmp_path, n)
    rng = random.Random(2024)
    work = tmp_path / "work"
    by_kind: dict[str, list[int]] = {}
    for kind, blob in _mutants(data, rng, count):
        rec, _ = _check_mutant(work, blob, n)
        by_kind.setdefault(kind, []).append(rec)
    print("T4", {k: (len(v), round(sum(v) / (len(v) * n), 3)) for k, v in sorted(by_kind.items())})


def test_t4_mutations(tmp_path: Path) -> None:
    run_t4(tmp_path, 150)


@pytest.mark.slow
def test_t4_mutations_long(tmp_path: Path) -> None:
    run_t4(tmp_path, 5000)


def _sqlite_bytes(tmp_path: Path) -> bytes:
    p = tmp_path / "db.sqlite"
    con = sqlite3.connect(p)
    con.execute("create table t (k, v)")
    con.execute("insert into t values (1, 2)")
    con.commit()
    con.close()
    return p.read_bytes()


@pytest.mark.parametrize(
    "name", ["empty", "one_byte", "zeros", "png", "sqlite", "random", "our_magic_short", "bad_header_crc"]
)
def test_t4_foreign_files(tmp_path: Path, name: str) -> None:
    good = _base_file(tmp_path, 10)
    blob = {
        "empty": b"",
        "one_byte": b"J",
        "zeros": bytes(4096),
        "png": b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(500),
        "sqlite": _sqlite_bytes(tmp_path),
        "random": random.Random(2).randbytes(10_000),
        "our_magic_short": b"JITKIDX\0" + bytes(20),
        "bad_header_crc": good[:20] + bytes([good[20] ^ 1]) + good[21:],
    }[name]
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    (work / LOG).write_bytes(blob)
    ix, warned = quiet_open(work)
    assert len(warned) == 1
    if name in ("bad_header_crc", "empty", "one_byte", "our_magic_short"):
        # Our own damaged file (a bad header, or one cut inside our magic, e.g. truncated to 0
        # while mapped): set aside (not deleted), fresh start.
        assert ix.mode == "rw"
        aside = [p for p in work.iterdir() if ".corrupt-" in p.name]
        assert len(aside) == 1 and aside[0].read_bytes() == blob
    else:
        # Someone else's file: left untouched, memory-only.
        assert ix.mode == "memory" and "not a jitkey index" in ix.mode_reason
        assert (work / LOG).read_bytes() == blob
    assert ix.get(("k", 0)) is None
    ix.put(("k", 0), b"x")
    assert ix.get(("k", 0)) == b"x"
