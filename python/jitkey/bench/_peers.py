"""Peer implementations the benchmarks compare jitkey against (same API, honest settings).

- ``SqliteStore``: sqlite3 in WAL mode with ``synchronous=NORMAL``, one table keyed by blob.
- ``FileStore``: one file per entry, ``entries/<h[:2]>/<h[2:]>``, written through ``mkstemp`` +
  ``os.replace`` without fsync, like cuda.core's ``FileStreamProgramCache``.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path


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
