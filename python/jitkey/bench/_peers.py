"""Peer implementations the benchmarks compare jitkey against (same API, honest settings).

- ``SqliteStore``: sqlite3 in WAL mode with ``synchronous=NORMAL``, one table keyed by blob.
- ``FileStore``: one file per entry, ``entries/<h[:2]>/<h[2:]>``, written through ``mkstemp`` +
  ``os.replace`` without fsync, like cuda.core's ``FileStreamProgramCache``.
- ``triton_globals_check``: the loop Triton's ``JITFunction.run`` executes on every launch over
  ``used_global_vals`` (``globals_dict.get(name, not_present) != val`` per global), the peer of
  ``GlobalsGuard.check``;
- ``source_sha256``: the naive function key (``inspect.getsource`` + sha256): source only, no globals, closures
  or helpers (how ninetoothed's two kernel names collided), the peer of ``jitkey.function_key``.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


class SqliteStore:
    def __init__(self, d: Path) -> None:
        self.con = sqlite3.connect(d / "cache.sqlite", isolation_level=None, check_same_thread=False)
        self.con.execute("pragma journal_mode=wal")
        self.con.execute("pragma synchronous=normal")
        self.con.execute("create table if not exists t (k blob primary key, v blob not null) without rowid")

    def get(self, k: bytes) -> bytes | None:
        row = self.con.execute("select v from t where k = ?", (k,)).fetchone()
        return None if row is None else row[0]

    def put(self, k: bytes, v: bytes) -> None:
        self.con.execute("insert or replace into t values (?, ?)", (k, v))

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.con:
            self.con.execute("begin")
            self.con.executemany("insert or replace into t values (?, ?)", items)


class FileStore:
    """entries/<h[:2]>/<h[2:]>, written via mkstemp in tmp/ + os.replace (no fsync)."""

    def __init__(self, d: Path) -> None:
        self.root = d
        (d / "entries").mkdir(exist_ok=True)
        (d / "tmp").mkdir(exist_ok=True)

    def _path(self, k: bytes) -> str:
        h = k.hex()
        return os.path.join(self.root, "entries", h[:2], h[2:])

    def get(self, k: bytes) -> bytes | None:
        try:
            with open(self._path(k), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, k: bytes, v: bytes) -> None:
        p = self._path(k)
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(v)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.replace(tmp, p)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        for k, v in items:
            self.put(k, v)


def kernel_with_globals(n_globals: int) -> tuple[Callable[..., Any], dict[str, Any]]:
    """A function reading ``n_globals`` module globals ``G0..``, and its module namespace."""
    names = [f"G{i}" for i in range(n_globals)]
    src = "def kernel(x):\n    return x + " + " + ".join(names) + "\n"
    ns: dict[str, Any] = {"__name__": "bench_kernels", **{n: i for i, n in enumerate(names)}}
    exec(compile(src, "<bench>", "exec"), ns)
    return ns["kernel"], ns


def triton_globals_check(used: dict[tuple[str, int], tuple[object, dict[str, Any]]]) -> None:
    """Triton's per-launch check of ``used_global_vals`` ({(name, id(globals)): (value, globals)})."""
    not_present = object()
    for (name, _), (val, globals_dict) in used.items():
        if (new_val := globals_dict.get(name, not_present)) != val:
            raise RuntimeError(
                f"Global variable {name} has changed since we compiled this kernel, to {new_val}"
            )


def source_sha256(fn: Callable[..., Any]) -> bytes:
    return hashlib.sha256(inspect.getsource(fn).encode()).digest()


def helper(x: int) -> int:
    return x * 2


def kernel_with_helper(x: int, scale: int = 3) -> int:
    """What the function keys are taken of: a function calling a helper."""
    return helper(x) * scale
