"""fork() while other threads are inside jitkey, and signals reaching waiters (issue 13, class 11).

Each scenario runs in a fresh interpreter: before the fix the forked child (or the waiter) hung,
so the parent bounds it and reports a hang as a failure instead of hanging the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and signals: unix only")


def run(code: str, timeout: float = 120, prelude: str = "") -> str:
    src = (
        "import os, sys, threading, time, signal, warnings\nimport jitkey\n" + prelude + textwrap.dedent(code)
    )
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


CHILD_WAIT = """
def wait_child(pid, seconds=60):
    # The child must finish on its own; a hung child is killed and reported.
    for _ in range(int(seconds * 20)):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"
"""


def test_fork_while_another_thread_leads_a_flight() -> None:
    out = run(
        prelude=CHILD_WAIT,
        code="""
        cache = jitkey.LruCache(16)
        inside, release = threading.Event(), threading.Event()

        def slow():
            inside.set()
            release.wait(60)
            return "parent"

        t = threading.Thread(target=lambda: cache.get_or_insert("k", slow))
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            v = cache.get_or_insert("k", lambda: "child")  # the parent's leader does not exist here
            os._exit(0 if v == "child" else 3)
        code = wait_child(pid)
        release.set()
        t.join()
        assert cache.get("k") == "parent"
        print(code)
        """,
    )
    assert out.split()[-1] == "0"


def test_fork_while_another_thread_writes_the_disk_index(tmp_path: Path) -> None:
    out = run(
        prelude=CHILD_WAIT,
        code=f"""
        warnings.simplefilter("ignore")
        ix = jitkey.DiskIndex({str(tmp_path / "ix")!r})
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                ix.put_many([(("p", i, j), b"x" * 500) for j in range(64)])
                ix.refresh()
                i += 1

        threads = [threading.Thread(target=writer) for _ in range(2)]
        for t in threads:
            t.start()
        codes = []
        for _ in range(20):
            time.sleep(0.01)
            pid = os.fork()
            if pid == 0:
                ok = ix.put(("child", os.getpid()), b"c") and ix.get(("child", os.getpid())) == b"c"
                ix.refresh()
                os._exit(0 if ok else 3)
            codes.append(wait_child(pid))
        stop.set()
        for t in threads:
            t.join()
        fresh = jitkey.DiskIndex({str(tmp_path / "ix")!r})
        print(codes.count(0), fresh.mode)
        """,
        timeout=300,
    )
    assert out.split()[0] == "20"


def test_ctrl_c_interrupts_a_get_or_insert_waiter() -> None:
    out = run(
        """
        # Python's own Ctrl-C handler, whatever the runner left: a process started in the background without job
        # control inherits SIGINT ignored, and then the signal below would never reach the waiter.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cache = jitkey.LruCache(16)
        inside, release, finished = threading.Event(), threading.Event(), threading.Event()

        def slow():
            inside.set()
            release.wait(20)
            finished.set()
            return 1

        t = threading.Thread(target=lambda: cache.get_or_insert("k", slow))
        t.start()
        inside.wait()
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            cache.get_or_insert("k", lambda: 2)
            result = "returned"
        except KeyboardInterrupt:
            result = "interrupted-early" if not finished.is_set() else "interrupted-late"
        release.set()
        t.join()
        assert cache.get("k") == 1  # the flight itself went on and stored its value
        print(result)
        """
    )
    assert out.split()[-1] == "interrupted-early"
