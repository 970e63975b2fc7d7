"""Triton's compile cache on jitkey's Redis tier: a cluster compiles each kernel once, and never loads a binary
it cannot verify.

Triton keeps what a compile produces (the cache group of a kernel variant: cubin, metadata JSON, PTX and the
other stages, ``__grp__<name>.json``) in a cache manager; its remote mechanism (``RemoteCacheManager`` with a
``TRITON_REMOTE_CACHE_BACKEND``) would share it between hosts, but the Redis backend Triton ships does not
construct in Triton 3.6 or 3.9 (it reads ``knobs.cache.redis``, which they do not define), and it stores
executables with no authentication. This module is both halves, on :class:`jitkey.RemoteIndex`:

* :class:`RedisBackend`: a ``triton.runtime.cache.RemoteCacheBackend`` for Triton's own mechanism::

      TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
      TRITON_REMOTE_CACHE_BACKEND=jitkey.triton.remote_cache:RedisBackend

  (Triton's ``RemoteCacheManager`` asks the remote on every lookup, even when its local files have the
  variant.)
* :class:`TieredCacheManager`: Triton's local ``FileCacheManager`` in front of the same backend: a local hit
  never touches the network; on a local miss the remote, and a remote hit is written into the local cache; a
  compile result goes to both. :func:`jitkey.triton.install` sets it as ``knobs.cache.manager_class`` when
  ``JITKEY_REMOTE_CACHE`` is set and no cache manager is configured (``TRITON_CACHE_MANAGER``).

**Executables are untrusted until proven.** Every file of a group decides what runs on the GPU (the cubin, and
the metadata that launches it), so every file is stored in the tier's envelope under a key derived from Triton's
cache key and the file name: with ``JITKEY_REMOTE_SECRET`` it is an HMAC-SHA256 over the Redis key and the value,
and a value without a valid HMAC is a miss (``rejects``), never a load. Without a secret the backend neither reads
nor writes (one :class:`jitkey.errors.RemoteCacheWarning` says so): anyone who can write to the server could run
code on every host that reads it. ``JITKEY_REMOTE_COMPILE_UNSIGNED=1`` opts in to checksummed, unsigned values (a
trusted network only). A value is at most ``JITKEY_REMOTE_COMPILE_MAX_BYTES`` (default 64 MiB; larger files stay
local, with a warning); a group's manifest must list plain file names (at most 64); a group is used only when
every file of it verifies. Native modules Triton builds (its launcher ``.so``) are never shared: they link against
the host's Python and libc.

**Never a failed or hung compile.** The tier's failures (refused, timed out, a dead, paused or hostile server)
are misses and no-ops with one warning per cause and a back-off (see :class:`jitkey.RemoteIndex`); Triton then
compiles locally. Operations use ``JITKEY_REMOTE_COMPILE_TIMEOUT`` (default 2 s: artifacts are larger than
autotune values, and a compile costs seconds anyway). Redis keys live in the namespace
``<JITKEY_REMOTE_NAMESPACE>.triton-<version>.<backend>-<arch>.k<jitkey key format>`` (``any`` for the target when
no driver is active, e.g. compile-only), on top of Triton's cache key, which already covers its version, the
backend and the target. :func:`stats` (also in ``cache_stats()`` of every jitkey kernel, and ``jitkey info``)
counts files served from the remote (``hits``), absent (``misses``), refused without a secret (``refused``),
stored (``puts``) and not stored (``put_failures``), plus the tier's own counters.
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from typing import Any, Final

from triton.runtime.cache import FileCacheManager, RemoteCacheBackend

from jitkey.errors import MissingDependencyError, RemoteCacheWarning, RemoteConfigError

__all__ = [
    "ENV_COMPILE_MAX_BYTES",
    "ENV_COMPILE_TIMEOUT",
    "ENV_COMPILE_UNSIGNED",
    "RedisBackend",
    "TieredCacheManager",
    "state",
    "stats",
]

ENV_COMPILE_UNSIGNED: Final = "JITKEY_REMOTE_COMPILE_UNSIGNED"
ENV_COMPILE_MAX_BYTES: Final = "JITKEY_REMOTE_COMPILE_MAX_BYTES"
ENV_COMPILE_TIMEOUT: Final = "JITKEY_REMOTE_COMPILE_TIMEOUT"
_DEFAULT_MAX_BYTES: Final = 64 << 20
_DEFAULT_TIMEOUT: Final = 2.0
_GROUP_PREFIX: Final = "__grp__"
_MAX_GROUP_FILES: Final = 64
_NATIVE_SUFFIXES: Final = (".so", ".pyd", ".dylib", ".dll")
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9_.+\-]{1,255}")


class _Shared:
    """The process's one remote for compiled artifacts (made on first use, from the environment), its
    counters, and why it is off when it is."""

    def __init__(self) -> None:
        #: Held while the remote is made (``making.on`` on that thread, see :meth:`get`).
        self.lock = threading.Lock()
        self.making = threading.local()
        #: Held for the counters and warnings only, never across a call out (so a lookup made while the
        #: remote is made can count itself).
        self.counts_lock = threading.Lock()
        self.remote: Any = None
        self.made = False
        self.off_reason: str | None = None
        self.warned: set[str] = set()
        self.counts = dict.fromkeys(("hits", "misses", "refused", "puts", "put_failures"), 0)

    def count(self, name: str, n: int = 1) -> None:
        with self.counts_lock:
            self.counts[name] += n

    def warn_once(self, cause: str, msg: str) -> None:
        with self.counts_lock:
            if cause in self.warned:
                return
            self.warned.add(cause)
        warnings.warn(f"jitkey remote compile cache: {msg}", RemoteCacheWarning, stacklevel=3)

    def get(self) -> Any:
        """The :class:`jitkey.RemoteIndex`, or ``None`` (off: ``off_reason`` says why; or not made yet, when
        asked again by the thread that is making it: the namespace asks Triton's driver for its target, and a
        driver that is starting up builds its modules through Triton's cache, so through this tier; that
        lookup is a miss, never a wait on the lock this thread holds)."""
        if self.made:
            return self.remote
        if getattr(self.making, "on", False):
            return None
        with self.lock:
            if not self.made:
                self.making.on = True
                try:
                    self.remote, self.off_reason = _make_remote()
                finally:
                    self.making.on = False
                self.made = True
        if self.remote is None and self.off_reason is not None:
            self.warn_once("off", f"off: {self.off_reason}; Triton compiles locally")
        return self.remote


_shared = _Shared()


def _target() -> str:
    """``<backend>-<arch>`` of the active driver, or ``any`` (no driver: compile-only, a CPU host)."""
    try:
        from triton.runtime import driver

        t = driver.active.get_current_target()
        return f"{t.backend}-{t.arch}"
    except Exception:
        return "any"


def namespace() -> str:
    """The Redis namespace of this process's compiled artifacts (see the module doc)."""
    import triton

    import jitkey

    base = os.environ.get("JITKEY_REMOTE_NAMESPACE") or "default"
    tail = f".triton-{triton.__version__}.{_target()}.k{jitkey.FORMAT_VERSION}"
    tail = re.sub(r"[^A-Za-z0-9_.+\-]", "_", tail)
    return base[: 128 - len(tail)] + tail


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise RemoteConfigError(f"{name}={raw!r} is not a number of bytes") from None


def _make_remote() -> tuple[Any, str | None]:
    """A RemoteIndex for compiled artifacts, or ``(None, why not)``. Never raises."""
    from jitkey.remote import ENV_SECRET, ENV_URL, RemoteIndex, _env_seconds

    if not os.environ.get(ENV_URL):
        return None, f"${ENV_URL} is not set"
    secret = os.environ.get(ENV_SECRET) or None
    if secret is None and os.environ.get(ENV_COMPILE_UNSIGNED) != "1":
        return None, (
            f"no ${ENV_SECRET}: compiled artifacts are executables, and without an HMAC anyone who can write to "
            f"the server could run code on this host; set a secret (or {ENV_COMPILE_UNSIGNED}=1 on a trusted "
            "network)"
        )
    try:
        timeout = _env_seconds("compile timeout", ENV_COMPILE_TIMEOUT, _DEFAULT_TIMEOUT, 60.0)
        max_bytes = _env_int(ENV_COMPILE_MAX_BYTES, _DEFAULT_MAX_BYTES)
        return RemoteIndex(namespace=namespace(), secret=secret, timeout=timeout, max_value=max_bytes), None
    except (RemoteConfigError, MissingDependencyError) as exc:
        return None, str(exc)
    except Exception as exc:  # the tier never fails a compile
        return None, f"{type(exc).__name__}: {exc}"


def _file_key(key: str, filename: str) -> tuple[str, str, str]:
    return ("triton-cache", key, filename)


def _shareable(filename: str) -> bool:
    return (
        bool(_SAFE_NAME.fullmatch(filename))
        and filename not in (".", "..")
        and (not filename.endswith(_NATIVE_SUFFIXES))
    )


class RedisBackend(RemoteCacheBackend):  # type: ignore[misc]  # Triton ships no types
    """A ``triton.runtime.cache.RemoteCacheBackend`` on jitkey's Redis tier (see the module doc).

    ``get(filenames)`` returns the files of Triton's cache key ``key``, all of them or none: a name that is
    not a plain file name, a file the remote lacks or one that does not verify makes the whole answer empty
    (Triton asks for a group's files at once, and a partial group must not load). ``put(filename, data)``
    stores one. Neither raises: a failing, refusing or hostile remote is a miss or a no-op, and Triton
    compiles locally.
    """

    def __init__(self, key: str) -> None:
        self._key = key

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        try:
            # A name the tier never shares (a native module Triton's driver builds, often while it starts up)
            # is a local matter: the remote is not even made for it.
            if not all(isinstance(name, str) and _shareable(name) for name in filenames):
                return {}
            remote = _shared.get()
            if remote is None:
                _shared.count("refused", len(filenames))
                return {}
            out: dict[str, bytes] = {}
            for name in filenames:
                value = remote.get(_file_key(self._key, name))
                if value is None:
                    _shared.count("misses")
                    return {}
                out[name] = value
            _shared.count("hits", len(out))
            return out
        except Exception as exc:  # never into a compile
            _shared.warn_once("get", f"a lookup failed ({type(exc).__name__}: {exc}); compiling locally")
            return {}

    def put(self, filename: str, data: bytes) -> None:
        try:
            if not _shareable(filename):
                return
            remote = _shared.get()
            if remote is None:
                return
            if not isinstance(data, bytes):
                data = str(data).encode("utf-8")
            if len(data) > remote.max_value:
                _shared.count("put_failures")
                _shared.warn_once(
                    "oversize",
                    f"{filename} is {len(data)} bytes, over {ENV_COMPILE_MAX_BYTES}={remote.max_value}: kept local",
                )
                return
            _shared.count("puts" if remote.put(_file_key(self._key, filename), data) else "put_failures")
        except Exception as exc:  # never into a compile
            _shared.warn_once("put", f"storing failed ({type(exc).__name__}: {exc}); kept local")


def _group_names(raw: bytes) -> list[str] | None:
    """The file names a remote group manifest lists, or ``None`` when it is not one jitkey would write:
    ``{"child_paths": [names]}`` with 1-64 plain, shareable file names."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    names = doc.get("child_paths") if isinstance(doc, dict) else None
    if (
        not isinstance(names, list)
        or not 0 < len(names) <= _MAX_GROUP_FILES
        or not all(isinstance(n, str) and _shareable(n) for n in names)
        or len(set(names)) != len(names)
    ):
        return None
    return names


class TieredCacheManager(FileCacheManager):  # type: ignore[misc]  # Triton ships no types
    """Triton's local ``FileCacheManager`` in front of :class:`RedisBackend` (see the module doc): local
    first, the remote on a local miss (its files written locally), every put to both. The dump and override
    managers Triton makes stay local."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        self._remote: RedisBackend | None = None if (override or dump) else RedisBackend(key)

    def get_file(self, filename: str) -> str | None:
        path: str | None = super().get_file(filename)
        if path is not None or self._remote is None:
            return path
        data = self._remote.get([filename]).get(filename)
        return None if data is None else self._local_put(data, filename)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path: str = super().put(data, filename, binary=binary)
        # A group file holds local paths; the remote gets its own manifest of names (put_group).
        if self._remote is not None and not filename.startswith(_GROUP_PREFIX):
            self._remote.put(filename, data if isinstance(data, bytes) else str(data).encode("utf-8"))
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        group: dict[str, str] | None = super().get_group(filename)
        if group is not None or self._remote is None:
            return group
        grp = _GROUP_PREFIX + filename
        raw = self._remote.get([grp]).get(grp)
        names = None if raw is None else _group_names(raw)
        if names is None:
            return None
        files = self._remote.get(names)  # whole or nothing
        if len(files) != len(names):
            return None
        paths = {}
        for name in names:
            path = self._local_put(files[name], name)
            if path is None:
                return None
            paths[name] = path
        try:
            super().put_group(filename, paths)
        except OSError:
            return None
        local: dict[str, str] | None = super().get_group(filename)
        return local

    def put_group(self, filename: str, group: dict[str, str]) -> Any:
        out = super().put_group(filename, group)
        if self._remote is not None:  # the manifest Triton's RemoteCacheManager writes: names, not paths
            manifest = json.dumps({"child_paths": sorted(group)}).encode("utf-8")
            self._remote.put(_GROUP_PREFIX + filename, manifest)
        return out

    def _local_put(self, data: bytes, filename: str) -> str | None:
        try:
            path: str = super().put(data, filename, binary=True)
            return path
        except OSError:  # the local cache cannot take it: a miss
            return None


def state() -> dict[str, Any]:
    """What the remote compile cache does in this process, without connecting: ``on`` (whether Triton's
    compiles would use the remote now, or once :func:`jitkey.triton.install` wires it), ``why`` when not,
    ``wired`` (Triton's cache manager is :class:`TieredCacheManager` now, or Triton's RemoteCacheManager with
    :class:`RedisBackend`), ``hmac`` (a secret is set), ``namespace``."""
    from triton import knobs

    from jitkey.remote import ENV_SECRET, ENV_URL

    try:
        manager = knobs.cache.manager_class
        backend = knobs.cache.remote_manager_class
        bad_manager = None
    except Exception as exc:  # a malformed TRITON_CACHE_MANAGER: a fact to report
        manager = backend = None
        bad_manager = f"{type(exc).__name__}: {exc}"
    ours = manager is TieredCacheManager or (
        manager is not None and manager.__name__ == "RemoteCacheManager" and backend is RedisBackend
    )
    secret = bool(os.environ.get(ENV_SECRET))
    why = (
        bad_manager
        if bad_manager
        else f"${ENV_URL} is not set"
        if not os.environ.get(ENV_URL)
        else f"TRITON_CACHE_MANAGER is {manager.__module__}:{manager.__name__}"
        if manager is not None and not ours
        else None
        if secret or os.environ.get(ENV_COMPILE_UNSIGNED) == "1"
        else f"no ${ENV_SECRET} (and no {ENV_COMPILE_UNSIGNED}=1): remote artifacts would be refused"
    )
    return {"on": why is None, "why": why, "wired": ours, "hmac": secret, "namespace": namespace()}


def stats() -> dict[str, Any]:
    """This process's counters: ``hits``, ``misses``, ``refused``, ``puts``, ``put_failures`` (files), and
    the tier's own (``remote_hits``, ``remote_rejects``, ``remote_errors``, ... of :class:`jitkey.RemoteIndex`)
    once it was made; ``off_reason`` when it is off."""
    with _shared.counts_lock:
        out: dict[str, Any] = dict(_shared.counts)
    remote, off = _shared.remote, _shared.off_reason
    if remote is not None:
        for k, v in remote.stats().items():
            out["remote_" + k] = v
    if off is not None:
        out["off_reason"] = off
    return out


_installed_manager: list[Any] = []


def _wire() -> None:
    """``install()``'s part: Triton's cache manager becomes :class:`TieredCacheManager` when
    ``JITKEY_REMOTE_CACHE`` is set and no manager is configured. Never raises; imports the tier only when set."""
    from jitkey._remote_env import ENV_URL

    if not os.environ.get(ENV_URL) or _installed_manager:
        return
    try:
        from triton import knobs

        if knobs.cache.manager_class is not None:  # the user's choice (TRITON_CACHE_MANAGER) stands
            return
        knobs.cache.manager_class = TieredCacheManager
        _installed_manager.append(TieredCacheManager)
    except Exception as exc:
        _shared.warn_once("wire", f"could not set Triton's cache manager ({type(exc).__name__}: {exc})")


def _unwire() -> None:
    if not _installed_manager:
        return
    try:
        from triton import knobs

        if knobs.cache.__dict__.get("manager_class") is TieredCacheManager:
            del knobs.cache.manager_class  # back to TRITON_CACHE_MANAGER / the default
    except Exception as exc:
        _shared.warn_once("unwire", f"could not restore Triton's cache manager ({type(exc).__name__}: {exc})")
    _installed_manager.clear()
