"""The disk index under a hostile environment (issue 13): files that shrink or are replaced under a
live mapping, close() racing every operation, planted files (symlinks, FIFOs, other users' files),
shared sticky directories, a max_bytes too small for one record, and degraded puts made visible.

Cases that killed or hung the process before the fix run in a child process, so that a regression
fails the test instead of the test run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

import jitkey
from jitkey.errors import DiskIndexWarning, IndexClosedError

LOG = "index.v1.jki"


def quiet(d: Path | None = None, **kw: object) -> jitkey.DiskIndex:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiskIndexWarning)
        return jitkey.DiskIndex(d, **kw)  # type: ignore[arg-type]


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter; a signal death shows as a negative return code."""
    src = (
        "import os, shutil, sys, warnings\nimport jitkey\nwarnings.simplefilter('ignore')\n"
        + textwrap.dedent(code)
    )
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout)


def assert_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"child exited {r.returncode}\nstdout:{r.stdout}\nstderr:{r.stderr[-3000:]}"


# ----- class 1: the file shrinks or is replaced under a live mapping -----

SHRINKS = {
    "truncate_to_0": "os.truncate(ix.path, 0)",
    "truncate_to_half": "os.truncate(ix.path, os.path.getsize(ix.path) // 2)",
    "truncate_to_header": "os.truncate(ix.path, 64)",
    # `cp backup index` truncates the inode and writes the (shorter) backup into it.
    "backup_copied_over": "shutil.copyfile(backup, ix.path)",
}
AFTER = {
    "get": "r = ix.get(('k', 299)); assert r in (None, b'x' * 200), r",
    "put_existing": "assert ix.put(('k', 299), b'y' * 200)",
    "put_new": "assert ix.put(('new', 1), b'n')",
    "compact": "ix.compact()",
    "clear": "ix.clear()",
    "len": "len(ix)",
}


@pytest.mark.parametrize("after", sorted(AFTER))
@pytest.mark.parametrize("shrink", sorted(SHRINKS))
def test_shrink_under_mapping_never_kills(tmp_path: Path, shrink: str, after: str) -> None:
    d = tmp_path / "ix"
    r = run_child(
        f"""
        d = {str(d)!r}
        ix = jitkey.DiskIndex(d)
        ix.put(('k', 0), b'x' * 200)
        backup = os.path.join(d, 'backup')
        shutil.copyfile(ix.path, backup)
        for i in range(300):
            ix.put(('k', i), b'x' * 200)
        assert ix.get(('k', 299)) == b'x' * 200
        {SHRINKS[shrink]}
        {AFTER[after]}
        # Every later operation works, and whatever is returned is right.
        for i in range(300):
            assert ix.get(('k', i)) in (None, b'x' * 200, b'y' * 200)
        assert ix.put(('after', 1), b'a')
        assert ix.get(('after', 1)) == b'a'
        print('OK')
        """
    )
    assert_ok(r)
    # An acknowledged put after the shrink is in the file for a fresh process: not written past
    # a hole that fresh readers stop at.
    fresh = quiet(d)
    assert fresh.mode == "rw"
    assert fresh.get(("after", 1)) == b"a"


def test_put_after_shrink_is_not_written_past_a_hole(tmp_path: Path) -> None:
    """The reproducer of the issue, then a second writer elsewhere: both acknowledged puts survive."""
    d = tmp_path / "ix"
    r = run_child(
        f"""
        ix = jitkey.DiskIndex({str(d)!r})
        for i in range(300):
            ix.put(('k', i), b'x' * 200)
        os.truncate(ix.path, 0)
        assert ix.get(('k', 299)) is None
        assert ix.put(('mine', 1), b'one')
        other = jitkey.DiskIndex({str(d)!r})
        assert other.put(('theirs', 1), b'two')
        assert other.get(('mine', 1)) == b'one'
        print(ix.stats()['shrinks_seen'])
        """
    )
    assert_ok(r)
    assert int(r.stdout.split()[-1]) >= 1
    fresh = quiet(d)
    assert fresh.get(("mine", 1)) == b"one" and fresh.get(("theirs", 1)) == b"two"


def test_shrink_by_another_process_between_reads(tmp_path: Path) -> None:
    """A reader process keeps its mapping while another process truncates and refills the file."""
    d = tmp_path / "ix"
    ix = quiet(d)
    ix.put_many([(("k", i), b"v%d" % i) for i in range(2000)])
    reader = quiet(d)
    assert reader.get(("k", 1999)) == b"v1999"
    r = run_child(f"os.truncate({str(ix.path)!r}, 100)")
    assert_ok(r)
    for i in range(2000):
        assert reader.get(("k", i)) in (None, b"v%d" % i)
    with pytest.warns(DiskIndexWarning, match="shrank under this process"):
        assert ix.put(("k", 5), b"again")
    reader.refresh()
    assert reader.get(("k", 5)) == b"again"


def test_sigbus_elsewhere_still_reaches_the_previous_handler(tmp_path: Path) -> None:
    """The handler only swallows faults inside index mappings: a SIGBUS sent to the process still
    has its default action (the child dies of SIGBUS)."""
    r = run_child(
        f"""
        import signal
        ix = jitkey.DiskIndex({str(tmp_path / "ix")!r})
        ix.put('k', b'v')
        os.kill(os.getpid(), signal.SIGBUS)
        print('survived')
        """
    )
    assert r.returncode == -7 and "survived" not in r.stdout  # SIGBUS


# ----- class 2: close() racing every operation -----


@pytest.mark.parametrize("op", ["put", "put_many", "compact", "get", "delete", "clear", "len"])
def test_close_racing_operations_never_panics(tmp_path: Path, op: str) -> None:
    errors: list[BaseException] = []
    for round_ in range(40):
        ix = quiet(tmp_path / f"ix{round_ % 3}", max_bytes=1 << 16)
        busy = threading.Event()

        def work(ix: jitkey.DiskIndex = ix, busy: threading.Event = busy) -> None:
            try:
                for i in range(100_000):
                    if i == 3:
                        busy.set()
                    if op == "put":
                        ix.put(("k", i), b"x" * 3000)
                    elif op == "put_many":
                        ix.put_many([(("k", i, j), b"x" * 3000) for j in range(8)])
                    elif op == "compact":
                        ix.put(("k", i), b"x" * 300)
                        ix.compact()
                    elif op == "get":
                        ix.get(("k", i))
                    elif op == "delete":
                        ix.put(("k", i), b"x")
                        ix.delete(("k", i))
                    elif op == "clear":
                        ix.put(("k", i), b"x")
                        ix.clear()
                    else:
                        len(ix)
            except IndexClosedError:
                pass
            except BaseException as e:  # a PanicException is a BaseException
                errors.append(e)
            finally:
                busy.set()

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        busy.wait()
        ix.close()
        for t in threads:
            t.join()
    assert errors == []


# ----- class 3: planted files and shared directories -----


def _valid_index_with(tmp_path: Path, value: bytes) -> Path:
    src = tmp_path / "planted-src"
    quiet(src).put("artifact", value)
    return src / LOG


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file as another user needs root")
def test_planted_index_of_another_user_is_not_served(tmp_path: Path) -> None:
    d = tmp_path / "ix"
    d.mkdir(mode=0o700)
    shutil.copyfile(_valid_index_with(tmp_path, b"/evil/path"), d / LOG)
    os.chown(d / LOG, 65534, 65534)
    ix = quiet(d)
    assert ix.get("artifact") is None
    assert ix.mode == "memory" and "owned by uid 65534" in ix.mode_reason
    # The same for a file planted under a live index (noticed by the next refresh or write).
    e = tmp_path / "ix2"
    ix2 = quiet(e)
    ix2.put("x", b"1")
    planted = e / "planted"
    shutil.copyfile(_valid_index_with(tmp_path, b"/evil/path"), planted)
    os.chown(planted, 65534, 65534)
    os.replace(planted, e / LOG)
    ix2.refresh()
    assert ix2.get("artifact") is None
    with pytest.warns(DiskIndexWarning, match="owned by uid 65534"):
        assert ix2.put("y", b"2") is False  # kept in memory, and said so
    assert ix2.get("artifact") is None and ix2.get("y") == b"2"


def test_symlinked_index_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "ix"
    d.mkdir(mode=0o700)
    (d / LOG).symlink_to(_valid_index_with(tmp_path, b"/evil/path"))
    ix = quiet(d)
    assert ix.get("artifact") is None and ix.mode == "memory"


def test_symlinked_lock_creates_nothing(tmp_path: Path) -> None:
    d = tmp_path / "ix"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim-file"
    (d / "index.lock").symlink_to(victim)
    ix = quiet(d)
    ix.put("k", b"v")
    assert not os.path.lexists(victim)
    assert ix.mode in ("ro", "memory") and ix.get("k") == b"v"


def test_sticky_shared_directory_degrades_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xdg = tmp_path / "xdg"
    shared = xdg / "jitkey"
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    monkeypatch.delenv("JITKEY_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    with pytest.warns(DiskIndexWarning, match="sticky"):
        ix = jitkey.DiskIndex()
    assert ix.mode == "memory" and "sticky" in ix.mode_reason
    assert not (shared / LOG).exists()
    # Named explicitly (argument or $JITKEY_CACHE_DIR): used, with files required to be ours.
    assert quiet(shared).mode == "rw"
    monkeypatch.setenv("JITKEY_CACHE_DIR", str(shared))
    assert quiet().mode == "rw"


# ----- class 4: a FIFO under the index's name -----


def test_fifo_as_index_does_not_hang(tmp_path: Path) -> None:
    d = tmp_path / "ix"
    d.mkdir(mode=0o700)
    os.mkfifo(d / LOG)
    r = run_child(
        f"""
        ix = jitkey.DiskIndex({str(d)!r})
        ix.put('k', b'v')
        assert ix.get('k') == b'v'
        print(ix.mode)
        """,
        timeout=30,
    )
    assert_ok(r)
    assert r.stdout.split()[-1] == "memory"
    assert stat.S_ISFIFO(os.lstat(d / LOG).st_mode)


# ----- class 5: max_bytes at its minimum -----


def test_smallest_max_bytes_keeps_a_max_value(tmp_path: Path) -> None:
    ix = quiet(tmp_path / "ix", max_bytes=65536)
    big = bytes(range(256)) * (ix.MAX_VALUE // 256) + b"z" * (ix.MAX_VALUE % 256)
    for i in range(3):
        assert ix.put(("big", i), big)
        assert ix.get(("big", i)) == big
        assert quiet(tmp_path / "ix").get(("big", i)) == big
    assert ix.put_many([(("small", i), b"s" * 1000) for i in range(100)])
    assert all(ix.get(("small", i)) == b"s" * 1000 for i in range(100))
    assert ix.stats()["evictions"] > 0


# ----- class 10: a degraded put is visible to the caller -----


def test_put_says_whether_it_reached_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ix"
    assert quiet(d).put("k", b"v") is True
    assert quiet(d).put_many([("a", b"1"), ("b", b"2")]) is True
    monkeypatch.setenv("JITKEY_DISK_CACHE", "ro")
    ro = quiet(d)
    assert ro.put("k2", b"v") is False and ro.put_many([("c", b"3")]) is False
    assert ro.get("k2") == b"v"
    monkeypatch.setenv("JITKEY_DISK_CACHE", "0")
    assert quiet(d).put("k3", b"v") is False
