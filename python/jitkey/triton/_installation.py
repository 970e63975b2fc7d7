"""What ``jitkey.triton`` learns once per installation of Triton and keeps in its :class:`jitkey.DiskIndex`.

Reading and hashing Triton's source (``inspect``), its whole compiler (``triton_key()``) or running ``ptxas
--version`` costs tens to hundreds of milliseconds, and every fresh process would pay it again. Here each such
result is stored under a fingerprint of what it was computed from, the way ccache trusts a compiler by its
path, size and modification time:

* :func:`fingerprint`: the installed Triton's files (path, size, mtime, inode of every file of the package but
  its C headers), computed at most once per process. A Triton upgrade, reinstall or edit changes it.
* :func:`code_identity`: the code objects a source inspection reads (their bytecode, constants and line
  table, which name their file and first line) and their files' identities; a function patched or wrapped at run time has
  another identity, so an inspection is never served for code it did not read.
* :func:`memo`: a JSON-able result stored under such a key; computed (and stored) on a miss, on a damaged
  record, or when the index cannot be used. A memo never raises what its computation would not.

The index is the default ``DiskIndex()`` (``$JITKEY_CACHE_DIR``, else ``$XDG_CACHE_HOME/jitkey``, else
``~/.cache/jitkey``), opened once per process on first need; an unusable one runs memory-only and says why
(:func:`index_problem`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jitkey._core import DiskIndex, digest

SCHEMA = "jitkey.triton.installation"
VERSION = 1

_lock = threading.Lock()
_index: DiskIndex | None = None
_index_opened = False
_index_problem: str | None = None
_passive = [0]


@contextlib.contextmanager
def passive() -> Iterator[None]:
    """Within it, an index that does not exist yet is not created (``jitkey info`` reports, it never creates
    an index): memos are computed and not stored."""
    with _lock:
        _passive[0] += 1
    try:
        yield
    finally:
        with _lock:
            _passive[0] -= 1


def _exists() -> bool:
    from jitkey._info import INDEX_FILE

    d = DiskIndex.default_directory()
    return d is not None and (d / INDEX_FILE).exists()


def index() -> DiskIndex | None:
    """jitkey.triton's own DiskIndex, opened once per process (``None`` if it could not be made at all, or
    under :func:`passive` when it does not exist yet)."""
    global _index, _index_opened, _index_problem
    if _index_opened:
        return _index
    if _passive[0] and not _exists():
        return None
    with _lock:
        if not _index_opened:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    ix = DiskIndex()
                if ix.mode != "rw":
                    _index_problem = f"the disk index is {ix.mode}: {ix.mode_reason}"
                elif caught:
                    _index_problem = str(caught[0].message)
                _index = ix
            except Exception as exc:  # a bad JITKEY_DISK_CACHE: run without
                _index_problem = f"no disk index ({type(exc).__name__}: {exc})"
            _index_opened = True
    return _index


def index_problem() -> str | None:
    """Why results do not persist across processes (``None``: they do, or, under :func:`passive`, the index is
    not created yet), after :func:`index`."""
    index()
    return _index_problem


def file_identity(path: str) -> tuple[Any, ...]:
    """``(path, size, mtime_ns, inode, device)``, or ``(path,)`` when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def package_files(root: str) -> list[str]:
    """Every file under ``root`` but C headers (``include`` folders) and bytecode caches, sorted."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "include"))
        out.extend(os.path.join(dirpath, f) for f in filenames)
    return sorted(out)


@functools.cache
def fingerprint() -> bytes:
    """The installed Triton's fingerprint (32 bytes), at most once per process: its version and the identity
    of every file of the package (the compiler, backends, language, runtime, ``libtriton``, ``ptxas``) but its C
    headers. What ``triton_key()`` hashes is among these files."""
    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__))
    files = tuple(file_identity(p) for p in package_files(root))
    return digest((SCHEMA, VERSION, str(getattr(triton, "__version__", "?")), root, files))


def _codes(obj: Any) -> Iterable[tuple[str, Any]]:
    """``(name, code or text)`` for what ``inspect`` reads of ``obj``: a function's code (and, for a wrapper,
    the code it wraps: ``inspect`` shows that one), a class's functions, a plain value's ``repr``."""
    if isinstance(obj, type):
        for name, member in sorted(vars(obj).items()):
            if callable(member) or isinstance(member, (staticmethod, classmethod, property)):
                yield from _member_codes(f"{obj.__qualname__}.{name}", member, 0)
        return
    yield from _member_codes(str(getattr(obj, "__qualname__", type(obj).__qualname__)), obj, 0)


def _member_codes(name: str, obj: Any, depth: int) -> Iterable[tuple[str, Any]]:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for part in (obj.fget, obj.fset, obj.fdel):
            if part is not None:
                yield from _member_codes(name, part, depth + 1)
        return
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        yield name, code
    elif callable(obj):  # a wrapper object (functools.lru_cache): its type, never its address
        yield name, type(obj).__qualname__
    else:
        yield name, repr(obj)
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and depth < 8:
        yield from _member_codes(f"{name}.__wrapped__", wrapped, depth + 1)


def _const_key(c: Any) -> Any:
    """A code object's constant as a key, the same in every process: a ``frozenset`` (what a set display of
    constants compiles to) by its sorted members, since its ``repr`` follows the per-process string hash."""
    if isinstance(c, types.CodeType):
        return _code_key(c)
    if isinstance(c, frozenset):
        return ("frozenset", tuple(sorted(repr(_const_key(x)) for x in c)))
    if isinstance(c, tuple):
        return ("tuple", tuple(_const_key(x) for x in c))
    return (type(c).__qualname__, repr(c))


def _code_key(code: types.CodeType) -> tuple[Any, ...]:
    """What a code object holds, as a key: its bytecode, constants (nested code recursively), names, line table,
    file and first line. (``marshal`` output also depends on reference counts, so it is not used.)"""
    consts = tuple(_const_key(c) for c in code.co_consts)
    return (
        code.co_filename,
        code.co_name,
        code.co_firstlineno,
        code.co_flags,
        code.co_argcount,
        code.co_kwonlyargcount,
        code.co_code,
        consts,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_linetable,
    )


def code_identity(objs: Iterable[Any], files: Iterable[str] = ()) -> bytes:
    """The identity of the code of ``objs`` (functions, classes, plain values by ``repr``) and of ``files``: equal
    identities mean an inspection of them reads the same text."""
    parts: list[Any] = []
    paths = set(files)
    for obj in objs:
        for name, code in _codes(obj):
            if isinstance(code, types.CodeType):
                parts.append((name, _code_key(code)))
                paths.add(code.co_filename)
            else:
                parts.append((name, code))
    return digest((SCHEMA, VERSION, tuple(parts), tuple(file_identity(p) for p in sorted(paths))))


def memo(name: str, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` (a JSON-able value), stored in the index under ``(name, key)``: a later process with an
    equal key reads it back instead. A record that does not decode, or that :func:`index` cannot serve, is
    computed again."""
    k = digest((SCHEMA, VERSION, name, key))
    ix = index()
    if ix is not None:
        try:
            raw = ix.get(k)
            if raw is not None:
                return json.loads(raw)["v"]
        except Exception:  # a damaged record: computed and stored again
            pass
    value = compute()
    if ix is not None:
        with contextlib.suppress(Exception):  # not stored: the value stays valid for this process
            ix.put(k, json.dumps({"v": value}).encode())
    return value


@functools.cache
def triton_key_digest() -> str | None:
    """A digest of Triton's ``triton_key()`` (its hash of the whole compiler: about a second to compute), kept
    per installation :func:`fingerprint` (``jitkey.env_key``'s ``triton_key``)."""
    from jitkey.env import compute_triton_key

    value = memo("triton_key", fingerprint(), compute_triton_key)
    return None if value is None else str(value)
