"""A shared tier across machines on Redis (or Valkey): :class:`RemoteIndex` and :class:`TieredIndex`.

:class:`jitkey.DiskIndex` shares small values (autotuning choices, artifact locations) between the processes
of one host. :class:`RemoteIndex` puts the same values in a Redis server shared by many hosts, behind the
same interface (``get`` / ``put`` / ``put_many`` / ``in`` / ``delete`` / ``stats``), and
:class:`TieredIndex` stacks the two: the local ``DiskIndex`` first; on a local miss, the remote; a remote
hit is copied into the local index; a put goes to both. A local hit never touches the network::

    ix = jitkey.TieredIndex(jitkey.DiskIndex(), jitkey.RemoteIndex("redis://cache-host:6379/0"))
    jt.autotune(configs, key=["n"], index=ix)(kernel)

or, with no code change, ``JITKEY_REMOTE_CACHE=redis://cache-host:6379/0`` makes :func:`default_index`
(the index ``jitkey.triton.autotune`` uses by default) a ``TieredIndex`` over the default ``DiskIndex``.

**The remote never makes a call fail or hang.** Connecting and every operation have small timeouts
(``connect_timeout``, ``timeout``; redis-py's own retries are off). A connection error, timeout or server
error turns the call into a miss (a put into a no-op), starts a back-off (``backoff`` seconds, doubling per
consecutive failure up to ``backoff_max``) during which the remote is skipped, and emits one
:class:`jitkey.errors.RemoteCacheWarning` per cause. ``stats()`` counts ``hits``, ``misses``, ``rejects``
(values that failed verification), ``errors``, ``timeouts``, ``skipped`` (calls made during a back-off),
``puts`` and ``put_failures``.

**Remote values are untrusted.** A Redis key is ``jitkey:r1:<namespace>:<hex digest>``: the remote format
version, the user namespace, the same 32-byte digest the ``DiskIndex`` uses. The stored value is an envelope
(``ENVELOPE_MAGIC``, a flags byte, the key digest, the value length, the value, a tag). A reader fetches at
most ``max_value`` + the envelope's overhead bytes (``GETRANGE``, so an oversize value is never
transferred whole) and accepts the value only if the magic and format version, the key digest, the length
and the tag all check; the tag covers the Redis key (so the namespace) and everything before the tag.
Without a secret the tag is a 128-bit checksum (:func:`jitkey.digest`, blake2b): it catches truncation and
corruption, not forgery. With ``secret=`` it is an HMAC-SHA256, and a reader with the secret rejects
anything a writer without it stored. A reader without a secret rejects HMAC-tagged values and vice versa. Anything else is a miss
(``rejects``), never a wrong value; nothing is ever unpickled. Schema checks of the payload itself stay the
caller's (``jitkey.triton.autotune`` checks its JSON as it does for the ``DiskIndex``).

**Configuration** (constructor arguments win over the environment, the URL's query string over both):
``JITKEY_REMOTE_CACHE`` (URL: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS,
``unix:///path/redis.sock``), ``JITKEY_REMOTE_NAMESPACE`` (default ``"default"``),
``JITKEY_REMOTE_SECRET`` (HMAC secret), ``JITKEY_REMOTE_TIMEOUT`` (seconds per operation, default 0.25),
``JITKEY_REMOTE_CONNECT_TIMEOUT`` (default 0.5), ``JITKEY_REMOTE_BACKOFF`` (default 1.0; the cap is 60).

Needs the ``redis`` client: ``pip install 'jitkey[redis]'``; without it :class:`RemoteIndex` raises
:class:`jitkey.errors.MissingDependencyError` and nothing else changes.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import struct
import threading
import time
import urllib.parse
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Final

from jitkey._core import DiskIndex, _TierBase, digest
from jitkey.errors import (
    KeyLengthError,
    MissingDependencyError,
    RemoteCacheWarning,
    RemoteConfigError,
    ValueTooLargeError,
)

__all__ = [
    "ENVELOPE_MAGIC",
    "ENV_BACKOFF",
    "ENV_CONNECT_TIMEOUT",
    "ENV_NAMESPACE",
    "ENV_SECRET",
    "ENV_TIMEOUT",
    "ENV_URL",
    "REMOTE_FORMAT",
    "RemoteIndex",
    "TieredIndex",
    "default_index",
]

REMOTE_FORMAT: Final[int] = 1
"""Version of the remote key layout and value envelope (part of every Redis key and value)."""
ENVELOPE_MAGIC: Final[bytes] = b"JKR" + bytes([REMOTE_FORMAT])

ENV_URL: Final[str] = "JITKEY_REMOTE_CACHE"
ENV_NAMESPACE: Final[str] = "JITKEY_REMOTE_NAMESPACE"
ENV_SECRET: Final[str] = "JITKEY_REMOTE_SECRET"
ENV_TIMEOUT: Final[str] = "JITKEY_REMOTE_TIMEOUT"
ENV_CONNECT_TIMEOUT: Final[str] = "JITKEY_REMOTE_CONNECT_TIMEOUT"
ENV_BACKOFF: Final[str] = "JITKEY_REMOTE_BACKOFF"

_DEFAULT_TIMEOUT: Final = 0.25
_DEFAULT_CONNECT_TIMEOUT: Final = 0.5
_DEFAULT_BACKOFF: Final = 1.0
_BACKOFF_MAX: Final = 60.0

# Envelope: magic (4) | flags (1) | reserved (3, zero) | key digest (32) | value length (u32 LE) | value | tag
_HEADER: Final = struct.Struct("<4sB3s32sI")
_FLAG_CHECKSUM: Final = 0  # tag = jitkey.digest (blake2b) truncated to 128 bits (integrity only)
_FLAG_HMAC: Final = 1  # tag = HMAC-SHA256 with the shared secret
_TAG_LEN: Final = {_FLAG_CHECKSUM: 16, _FLAG_HMAC: 32}
_ZERO3: Final = b"\0\0\0"
_NAMESPACE_MAX: Final = 128


def _key_digest(key: object) -> bytes:
    """The 32-byte digest a :class:`jitkey.DiskIndex` files ``key`` under (same rules)."""
    if type(key) is bytes:
        if len(key) != 32:
            raise KeyLengthError(
                f"a bytes key must be a 32-byte digest (got {len(key)} bytes); use jitkey.digest(value) "
                "or pass a non-bytes keyable value"
            )
        return key
    return digest(key)


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as exc:
        raise MissingDependencyError(
            "jitkey's remote tier needs the redis client: pip install 'jitkey[redis]'"
        ) from exc
    return redis


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RemoteConfigError(f"{name}={raw!r} is not a number of seconds") from None
    return value


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for stats, warnings and repr)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RemoteIndex:
    """Key → bytes in a Redis (or Valkey) server shared by many hosts; the interface of a ``DiskIndex``.

    ``url``: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) or ``unix:///path`` (redis-py's
    URL syntax; query parameters such as ``?socket_timeout=0.1`` override the arguments below); default
    ``$JITKEY_REMOTE_CACHE``. ``namespace`` (default ``$JITKEY_REMOTE_NAMESPACE`` or ``"default"``) separates
    teams or projects sharing a server. ``secret`` (default ``$JITKEY_REMOTE_SECRET``): when set, values are
    HMAC-SHA256 signed and only values signed with it are accepted. ``timeout`` / ``connect_timeout``
    (seconds): per operation and per connection attempt. ``backoff``: seconds the remote is skipped after a
    failure, doubled per consecutive failure up to ``backoff_max``. ``max_value``: the largest value stored or
    accepted (default ``DiskIndex.MAX_VALUE``). ``ttl``: seconds before the server may drop an entry
    (``None``: kept until evicted by the server's own policy).

    Keys and values follow :class:`jitkey.DiskIndex`: a 32-byte ``bytes`` key is a digest, any other keyable
    value is digested; values are ``bytes``. Nothing connects until the first operation. Every method is
    thread-safe and fork-safe: commands go through one connection per thread and process (a forked child
    opens its own), made by redis-py from the URL (auth, TLS, database) but not dispatched through
    ``redis.Redis``.

    Raises:
        jitkey.errors.MissingDependencyError: the ``redis`` package is not installed (``jitkey[redis]``).
        jitkey.errors.RemoteConfigError: no URL, a URL redis-py cannot parse, a bad namespace or a
            non-positive timeout / back-off / size bound.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str | None = None,
        secret: bytes | str | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        backoff: float | None = None,
        backoff_max: float = _BACKOFF_MAX,
        max_value: int = DiskIndex.MAX_VALUE,
        ttl: float | None = None,
    ) -> None:
        redis = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        url = url if url is not None else os.environ.get(ENV_URL)
        if not url:
            raise RemoteConfigError(f"RemoteIndex needs a URL (argument or ${ENV_URL})")
        ns = namespace if namespace is not None else os.environ.get(ENV_NAMESPACE) or "default"
        if (
            not isinstance(ns, str)
            or not 0 < len(ns) <= _NAMESPACE_MAX
            or not ns.isascii()
            or not ns.isprintable()
            or any(c.isspace() for c in ns)
        ):
            raise RemoteConfigError(
                f"namespace must be 1-{_NAMESPACE_MAX} printable ASCII characters without spaces, got {ns!r}"
            )
        if secret is None:
            secret = os.environ.get(ENV_SECRET) or None
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise RemoteConfigError("secret must be non-empty bytes or str")
        timeout = timeout if timeout is not None else _env_float(ENV_TIMEOUT, _DEFAULT_TIMEOUT)
        connect_timeout = (
            connect_timeout
            if connect_timeout is not None
            else _env_float(ENV_CONNECT_TIMEOUT, _DEFAULT_CONNECT_TIMEOUT)
        )
        backoff = backoff if backoff is not None else _env_float(ENV_BACKOFF, _DEFAULT_BACKOFF)
        for name, v in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("backoff", backoff),
            ("backoff_max", backoff_max),
        ):
            if not v > 0:
                raise RemoteConfigError(f"{name} must be > 0 seconds, got {v!r}")
        if type(max_value) is not int or not 0 < max_value <= DiskIndex.MAX_VALUE:
            raise RemoteConfigError(
                f"max_value must be an int in 1..{DiskIndex.MAX_VALUE}, got {max_value!r}"
            )
        if ttl is not None and not ttl > 0:
            raise RemoteConfigError(f"ttl must be > 0 seconds or None, got {ttl!r}")

        self._url = url
        self._redacted = _redact(url)
        self._namespace = ns
        self._prefix = f"jitkey:r{REMOTE_FORMAT}:{ns}:".encode()
        self._secret: bytes | None = secret
        self._flag = _FLAG_HMAC if secret is not None else _FLAG_CHECKSUM
        self._tag_len = _TAG_LEN[self._flag]
        self._max_value = max_value
        self._max_raw = _HEADER.size + max_value + self._tag_len
        self._px = None if ttl is None else max(1, int(ttl * 1000))
        self._timeout, self._connect_timeout = float(timeout), float(connect_timeout)
        self._backoff, self._backoff_max = float(backoff), float(backoff_max)
        self._exc = redis.exceptions
        try:
            # redis-py parses the URL (auth, TLS, unix sockets, db) and makes the connections; the commands
            # go straight through one connection per thread (see _call), not through redis.Redis.
            self._pool = redis.ConnectionPool.from_url(
                url,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._connect_timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=False,
            )
        except (ValueError, TypeError) as exc:
            raise RemoteConfigError(f"cannot use remote cache URL {self._redacted!r}: {exc}") from None
        self._local = threading.local()
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._failures = 0
        self._skip_until = 0.0
        self._warned: set[str] = set()
        self._last_error = ""
        self._closed = False
        self._stats = dict.fromkeys(
            ("hits", "misses", "rejects", "errors", "timeouts", "skipped", "puts", "put_failures"), 0
        )

    # -- keys and envelopes ---------------------------------------------------------------------------------
    def redis_key(self, key: object) -> bytes:
        """The Redis key ``key`` is stored under (``jitkey:r1:<namespace>:<hex digest>``)."""
        return self._prefix + _key_digest(key).hex().encode()

    def _seal(self, rkey: bytes, d: bytes, value: bytes) -> bytes:
        body = _HEADER.pack(ENVELOPE_MAGIC, self._flag, _ZERO3, d, len(value)) + value
        return body + self._tag(rkey, body)

    def _tag(self, rkey: bytes, body: bytes) -> bytes:
        if self._secret is not None:
            return hmac.digest(self._secret, rkey + body, "sha256")
        return digest(rkey + body)[:16]  # jitkey's blake2b-256 (native), truncated

    def _open(self, rkey: bytes, d: bytes, raw: bytes) -> tuple[bytes | None, str]:
        """The value inside envelope ``raw`` fetched under ``rkey``, or ``(None, why it was rejected)``."""
        n = len(raw)
        if n > self._max_raw:
            return None, f"oversize value (more than {self._max_raw} bytes)"
        if n < _HEADER.size + self._tag_len:
            return None, "truncated or foreign value (shorter than the envelope)"
        magic, flag, reserved, kd, length = _HEADER.unpack_from(raw)
        if magic != ENVELOPE_MAGIC or reserved != _ZERO3:
            return None, "foreign value or another remote format version"
        if flag != self._flag:
            return None, (
                "HMAC-signed value but no secret is configured"
                if flag == _FLAG_HMAC
                else "unsigned value but a secret is configured"
                if flag == _FLAG_CHECKSUM
                else "unknown envelope flags"
            )
        if kd != d:
            return None, "value stored for another key"
        if _HEADER.size + length + self._tag_len != n:
            return None, "truncated value (length does not match)"
        body = raw[: n - self._tag_len]
        if not hmac.compare_digest(self._tag(rkey, body), raw[n - self._tag_len :]):
            return None, "wrong HMAC (another secret, or tampered)" if self._secret else "bad checksum"
        return body[_HEADER.size :], ""

    # -- failure handling --------------------------------------------------------------------------------
    def _skipping(self) -> bool:
        if self._closed:
            return True
        if self._failures and time.monotonic() < self._skip_until:
            with self._lock:
                self._stats["skipped"] += 1
            return True
        return False

    def _warn_once(self, cause: str, msg: str) -> None:
        with self._lock:
            if cause in self._warned:
                return
            self._warned.add(cause)
        warnings.warn(f"jitkey remote cache {self._redacted}: {msg}", RemoteCacheWarning, stacklevel=4)

    def _failed(self, exc: BaseException) -> None:
        exceptions = self._exc
        if isinstance(exc, exceptions.TimeoutError):
            counter, cause = "timeouts", "timeout"
        else:
            counter = "errors"
            cause = (
                "auth"
                if isinstance(exc, exceptions.AuthenticationError)
                else "connection"
                if isinstance(exc, exceptions.ConnectionError)
                else "server"
            )
        with self._lock:
            self._stats[counter] += 1
            self._failures += 1
            delay = min(self._backoff_max, self._backoff * 2 ** min(self._failures - 1, 30))
            self._skip_until = time.monotonic() + delay
            self._last_error = f"{type(exc).__name__}: {exc}"
        self._warn_once(
            cause, f"{type(exc).__name__}: {exc}; skipping the remote for {delay:g} s (doubling on repeat)"
        )

    def _succeeded(self) -> None:
        if self._failures:
            with self._lock:
                self._failures = 0
                self._skip_until = 0.0

    def _reject(self, why: str) -> None:
        with self._lock:
            self._stats["rejects"] += 1
        self._warn_once("reject:" + why, f"rejected a remote value ({why}); treated as a miss")

    # -- the wire -------------------------------------------------------------------------------------------
    def _conn(self) -> Any:
        """This thread's connection (a new one in a forked child: never share a parent's socket)."""
        local = self._local
        conn = getattr(local, "conn", None)
        pid = os.getpid()
        if conn is None or local.pid != pid:
            conn = self._pool.make_connection()
            local.conn, local.pid = conn, pid
            self._conns.add(conn)
        return conn

    def _call(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` in one write and read their replies (an error reply is returned as its
        ``ResponseError``). A connection, timeout or protocol error disconnects (the next call reconnects,
        so a late reply can never be read as another command's) and raises."""
        conn = self._conn()
        try:
            if len(commands) == 1:
                conn.send_command(*commands[0])
            else:
                conn.send_packed_command(conn.pack_commands(commands))
            out: list[Any] = []
            for _ in commands:
                try:
                    out.append(conn.read_response())
                except self._exc.ResponseError as exc:
                    out.append(exc)
            return out
        except BaseException:
            conn.disconnect()
            raise

    # -- the DiskIndex interface ------------------------------------------------------------------------------
    def get(self, key: object) -> bytes | None:
        """The value stored under ``key``, or ``None`` (absent, rejected, remote failing or in back-off).

        Raises:
            jitkey.errors.KeyLengthError: a ``bytes`` key that is not 32 bytes long.
            jitkey.errors.UnsupportedKeyError: a key jitkey cannot encode.
        """
        d = _key_digest(key)
        if (self._failures or self._closed) and self._skipping():
            return None
        rkey = self._prefix + d.hex().encode()
        try:
            (raw,) = self._call(("GETRANGE", rkey, 0, self._max_raw))
        except self._exc.RedisError as exc:
            self._failed(exc)
            return None
        except OSError as exc:  # pragma: no cover - redis-py wraps socket errors; belt and braces
            self._failed(self._exc.ConnectionError(str(exc)))
            return None
        if isinstance(raw, self._exc.ResponseError):
            if str(raw).startswith("WRONGTYPE"):  # something else lives under our key: bad data
                self._succeeded()
                self._reject("another Redis type under the key (WRONGTYPE)")
            else:  # NOAUTH, NOPERM, LOADING, ...: the server is not usable now
                self._failed(raw)
            return None
        self._succeeded()
        if not raw:  # GETRANGE of a missing key is b""
            with self._lock:
                self._stats["misses"] += 1
            return None
        value, why = self._open(rkey, d, raw)
        if value is None:
            self._reject(why)
            return None
        with self._lock:
            self._stats["hits"] += 1
        return value

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def _check_value(self, value: object, i: int = 0) -> bytes:
        if not isinstance(value, bytes):
            raise TypeError(f"values must be bytes, got {type(value).__qualname__}")
        if len(value) > self._max_value:
            raise ValueTooLargeError(
                f"value #{i} is {len(value)} bytes; this RemoteIndex stores at most {self._max_value} bytes"
            )
        return value

    def put(self, key: object, value: bytes) -> bool:
        """Store ``value`` under ``key``; ``True`` when the server acknowledged it (else counted, not raised).

        Raises:
            jitkey.errors.ValueTooLargeError: ``value`` is longer than ``max_value``.
            TypeError: ``value`` is not ``bytes``; key errors as for :meth:`get`.
        """
        return self.put_many(((key, value),))

    def put_many(self, items: Iterable[tuple[object, bytes]] | Mapping[object, bytes]) -> bool:
        """Store many entries in one round trip; ``True`` when the server acknowledged all of them.

        Every key and value is checked before anything is sent (errors as for :meth:`put`).
        """
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        sealed: list[tuple[bytes, bytes]] = []
        for i, (k, v) in enumerate(pairs):
            d = _key_digest(k)
            rkey = self._prefix + d.hex().encode()
            sealed.append((rkey, self._seal(rkey, d, self._check_value(v, i))))
        if not sealed:
            return True
        if self._skipping():
            return False
        px = () if self._px is None else ("PX", self._px)
        try:
            replies = self._call(*[("SET", rkey, raw, *px) for rkey, raw in sealed])
        except (self._exc.RedisError, OSError) as exc:
            with self._lock:
                self._stats["put_failures"] += len(sealed)
            self._failed(
                exc if isinstance(exc, self._exc.RedisError) else self._exc.ConnectionError(str(exc))
            )
            return False
        refused = [r for r in replies if isinstance(r, self._exc.ResponseError)]
        ok = not refused and all(r in (b"OK", "OK", True) for r in replies)
        with self._lock:
            self._stats["puts"] += sum(1 for r in replies if r in (b"OK", "OK", True))
            self._stats["put_failures"] += len(replies) - sum(1 for r in replies if r in (b"OK", "OK", True))
        if refused:  # e.g. OOM (maxmemory with noeviction) or READONLY (a replica): back off
            self._failed(refused[0])
        else:
            self._succeeded()
        return ok

    def delete(self, key: object) -> bool:
        """Remove ``key`` from the server; whether it was there (``False`` also when the remote failed)."""
        rkey = self.redis_key(key)
        if self._skipping():
            return False
        try:
            (n,) = self._call(("DEL", rkey))
        except (self._exc.RedisError, OSError) as exc:
            self._failed(
                exc if isinstance(exc, self._exc.RedisError) else self._exc.ConnectionError(str(exc))
            )
            return False
        if isinstance(n, self._exc.ResponseError):
            self._failed(n)
            return False
        self._succeeded()
        return bool(n)

    def stats(self) -> dict[str, Any]:
        """Counters (per process): ``hits``, ``misses``, ``rejects`` (values that failed verification),
        ``errors`` (connection and server errors), ``timeouts``, ``skipped`` (calls during a back-off),
        ``puts`` and ``put_failures`` (entries); and state: ``state`` (``"ok"``, ``"backoff"`` or
        ``"closed"``), ``consecutive_failures``, ``last_error``, ``url`` (password redacted), ``namespace``,
        ``hmac`` (whether a secret is set), ``timeout_s``, ``connect_timeout_s``."""
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
            failing = self._failures and time.monotonic() < self._skip_until
            out.update(
                state="closed" if self._closed else "backoff" if failing else "ok",
                consecutive_failures=self._failures,
                last_error=self._last_error,
            )
        out.update(
            url=self._redacted,
            namespace=self._namespace,
            hmac=self._secret is not None,
            timeout_s=self._timeout,
            connect_timeout_s=self._connect_timeout,
        )
        return out

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def url(self) -> str:
        """The server URL with any password redacted."""
        return self._redacted

    @property
    def max_value(self) -> int:
        return self._max_value

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connections; later calls are misses / no-ops (a closed remote is skipped)."""
        self._closed = True
        for conn in list(self._conns):
            with contextlib.suppress(self._exc.RedisError, OSError):
                conn.disconnect()
        with contextlib.suppress(self._exc.RedisError, OSError):
            self._pool.disconnect()

    def __enter__(self) -> RemoteIndex:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"jitkey.RemoteIndex({self._redacted!r}, namespace={self._namespace!r})"


class _Fill:
    """The remote half of :meth:`TieredIndex.get` (holds no reference to the TieredIndex: no cycle)."""

    __slots__ = ("fills", "local", "lock", "remote")

    def __init__(self, local: DiskIndex, remote: RemoteIndex) -> None:
        self.local, self.remote = local, remote
        self.fills = 0
        self.lock = threading.Lock()

    def __call__(self, key: object) -> bytes | None:
        value = self.remote.get(key)
        if value is not None and len(value) <= DiskIndex.MAX_VALUE:
            self.local.put(key, value)
            with self.lock:
                self.fills += 1
        return value


class TieredIndex(_TierBase):
    """A local :class:`jitkey.DiskIndex` in front of a :class:`RemoteIndex`; the interface of a ``DiskIndex``.

    ``get``: the local index; on a local miss the remote, and a remote hit is copied into the local
    index (``remote_fills``). ``put`` / ``put_many``: the local index, then the remote. A local hit does
    not touch the remote and costs what ``DiskIndex.get`` costs (``get`` is native up to the local
    miss). Caller mistakes raise as for ``DiskIndex`` (checked by the local index first); the remote
    never raises (see :class:`RemoteIndex`).
    """

    __slots__ = ("_fill", "local", "remote")

    def __init__(self, local: DiskIndex, remote: RemoteIndex) -> None:
        if not isinstance(local, DiskIndex):
            raise TypeError(f"local must be a jitkey.DiskIndex, not {type(local).__qualname__}")
        if not isinstance(remote, RemoteIndex):
            raise TypeError(f"remote must be a jitkey.RemoteIndex, not {type(remote).__qualname__}")
        self.local = local
        self.remote = remote
        self._fill = _Fill(local, remote)
        self._tier_init(local, self._fill)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def put(self, key: object, value: bytes) -> bool:
        """Store in the local index, then the remote; ``True`` when the remote acknowledged it too."""
        self.local.put(key, value)
        return self.remote.put(key, value)

    def put_many(self, items: Iterable[tuple[object, bytes]] | Mapping[object, bytes]) -> bool:
        """Store many entries locally (one write) and remotely (one round trip)."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        self.local.put_many(pairs)
        return self.remote.put_many(pairs)

    def delete(self, key: object) -> bool:
        """Remove ``key`` from both tiers; whether either held it."""
        here = self.local.delete(key)
        there = self.remote.delete(key)
        return here or there

    def __len__(self) -> int:
        """The number of live keys in the local index."""
        return len(self.local)

    def refresh(self) -> None:
        self.local.refresh()

    def stats(self) -> dict[str, Any]:
        """The local index's :meth:`jitkey.DiskIndex.stats`, plus the remote's counters and state with a
        ``remote_`` prefix (``remote_hits``, ``remote_misses``, ``remote_rejects``, ``remote_errors``,
        ``remote_timeouts``, ``remote_skipped``, ``remote_puts``, ``remote_state``, ...) and
        ``remote_fills`` (remote hits copied into the local index)."""
        out = dict(self.local.stats())
        for k, v in self.remote.stats().items():
            out["remote_" + k] = v
        with self._fill.lock:
            out["remote_fills"] = self._fill.fills
        return out

    @property
    def mode(self) -> str:
        """The local index's mode (``"rw"``, ``"ro"`` or ``"memory"``)."""
        return self.local.mode

    @property
    def closed(self) -> bool:
        return self.local.closed

    def close(self) -> None:
        """Close both tiers."""
        self.remote.close()
        self.local.close()

    def __enter__(self) -> TieredIndex:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"jitkey.TieredIndex({self.local.path.parent}, {self.remote!r})"


_default_lock = threading.Lock()
_default: DiskIndex | TieredIndex | None = None


def default_index() -> DiskIndex | TieredIndex:
    """The process-wide default index: ``DiskIndex()``, or with ``$JITKEY_REMOTE_CACHE`` set, a
    :class:`TieredIndex` over it and ``RemoteIndex()`` (configured from the environment).

    Made once per process. It never raises for the remote: a missing ``redis`` package or an unusable
    ``JITKEY_REMOTE_CACHE`` gives one :class:`jitkey.errors.RemoteCacheWarning` and the ``DiskIndex`` alone.
    """
    global _default
    with _default_lock:
        if _default is None:
            local = DiskIndex()
            _default = local
            if os.environ.get(ENV_URL):
                try:
                    _default = TieredIndex(local, RemoteIndex())
                except (MissingDependencyError, RemoteConfigError) as exc:
                    warnings.warn(
                        f"${ENV_URL} is set but the remote tier is off: {exc}",
                        RemoteCacheWarning,
                        stacklevel=2,
                    )
        return _default
