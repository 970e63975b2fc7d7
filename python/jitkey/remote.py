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

**The remote never makes a call fail or hang.** jitkey speaks the protocol itself (``jitkey._resp``): every
operation has one deadline for all of it, ``timeout`` (plus ``connect_timeout`` when it opens a connection),
however the server answers (not at all, a byte at a time, one reply of a pipeline); a reply's size is
checked before it is buffered (a bulk reply longer than the value bound, or an aggregate where a bulk string
is due, is refused unread) and its type is checked against the one its command may get (``SET`` must say
``+OK``). A connection error, timeout, malformed reply or server error, or any other exception on the wire,
turns the call into a miss (a put into a no-op), drops the connection, starts a back-off (``backoff``
seconds, doubling per consecutive failure up to ``backoff_max``) during which the remote is skipped, and
emits one :class:`jitkey.errors.RemoteCacheWarning` per cause. ``stats()`` counts ``hits``, ``misses``,
``rejects`` (values that failed verification), ``errors``, ``timeouts``, ``skipped`` (calls made during a
back-off), ``puts`` and ``put_failures``. Passwords and secrets never appear in ``repr``, ``url``,
``stats()`` or warnings.

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
Timeouts must be finite and in ``(0, 60]`` seconds, back-offs in ``(0, 86400]``, wherever they come from;
anything else is a :class:`jitkey.errors.RemoteConfigError` at construction naming the value and its source.

**Tiered puts.** :meth:`TieredIndex.put` / ``put_many`` check every key and value against the local index
first and raise there, before anything is stored; after the local store nothing raises. A value the remote
cannot take (over its ``max_value``) is stored locally only, and the call returns ``False`` as it does when
the remote fails.

Needs the ``redis`` client: ``pip install 'jitkey[redis]'``; without it :class:`RemoteIndex` raises
:class:`jitkey.errors.MissingDependencyError` and nothing else changes.
"""

from __future__ import annotations

import hmac
import math
import numbers
import os
import re
import ssl
import struct
import threading
import time
import urllib.parse
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from jitkey import _deps, _resp
from jitkey._core import DiskIndex, _key_digest, _TierBase, digest
from jitkey._remote_env import (
    ENV_BACKOFF,
    ENV_CONNECT_TIMEOUT,
    ENV_NAMESPACE,
    ENV_SECRET,
    ENV_TIMEOUT,
    ENV_URL,
)
from jitkey.errors import (
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
    "MAX_REMOTE_VALUE",
    "REMOTE_FORMAT",
    "Index",
    "RemoteIndex",
    "TieredIndex",
    "default_index",
]

MAX_REMOTE_VALUE: Final[int] = 256 << 20
"""The largest ``max_value`` a :class:`RemoteIndex` takes (256 MiB; Redis strings hold 512 MB). A
:class:`TieredIndex` copies only values up to ``DiskIndex.MAX_VALUE`` into its local index."""
REMOTE_FORMAT: Final[int] = 1
"""Version of the remote key layout and value envelope (part of every Redis key and value)."""
ENVELOPE_MAGIC: Final[bytes] = b"JKR" + bytes([REMOTE_FORMAT])


_DEFAULT_TIMEOUT: Final = 0.25
_DEFAULT_CONNECT_TIMEOUT: Final = 0.5
_DEFAULT_BACKOFF: Final = 1.0
_BACKOFF_MAX: Final = 60.0
_TIMEOUT_MAX: Final = (
    60.0  # the longest timeout / connect_timeout: a JIT call never waits longer on the remote
)
_BACKOFF_LIMIT: Final = 86400.0
_TTL_MAX: Final = 1e9  # seconds (about 31 years): PX stays far inside what Redis accepts

# Envelope: magic (4) | flags (1) | reserved (3, zero) | key digest (32) | value length (u32 LE) | value | tag
_HEADER: Final = struct.Struct("<4sB3s32sI")
_FLAG_CHECKSUM: Final = 0  # tag = jitkey.digest (blake2b) truncated to 128 bits (integrity only)
_FLAG_HMAC: Final = 1  # tag = HMAC-SHA256 with the shared secret
_TAG_LEN: Final = {_FLAG_CHECKSUM: 16, _FLAG_HMAC: 32}
_ZERO3: Final = b"\0\0\0"
_NAMESPACE_MAX: Final = 128
# How failures are named in warnings and ``last_error``.
_LABELS: Final[dict[type, str]] = {
    _resp.Timeout: "TimeoutError",
    _resp.ConnectionFailed: "ConnectionError",
    _resp.AuthError: "AuthenticationError",
    _resp.ServerError: "ServerError",
    _resp.ProtocolError: "ProtocolError",
}


def _import_redis() -> Any:
    try:
        import redis.connection
    except ImportError as exc:
        raise _deps.missing("redis", "jitkey's remote tier (the redis client)") from exc
    return redis


def _seconds(name: str, value: object, source: str, upper: float) -> float:
    """``value`` as seconds in ``(0, upper]``, else :class:`RemoteConfigError` naming it and where it came
    from. Rejects bools, non-numbers, NaN, infinities and values a socket timeout cannot hold."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RemoteConfigError(f"{name} must be a number of seconds, got {value!r} ({source})")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and 0 < v <= upper):
        raise RemoteConfigError(
            f"{name} must be a finite number of seconds in (0, {upper:g}], got {value!r} ({source})"
        )
    return v


def _env_seconds(name: str, env: str, default: float, upper: float) -> float:
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RemoteConfigError(f"{env}={raw!r} is not a number of seconds") from None
    return _seconds(name, value, f"from ${env}={raw!r}", upper)


_SECRET_QUERY = re.compile(r"pass|secret|token|cred", re.IGNORECASE)


def _redact(url: str) -> str:
    """``url`` with its secrets replaced by ``***``: the password of the user info (a user info without
    a ``:`` entirely, since it may be a password), and the values of query parameters whose names say
    password, secret, token or credential. Works on the text itself, so it never fails."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if colon else f"***@{hostport}"
    path, q, query = tail.partition("?")
    if q:
        query, h, fragment = query.partition("#")
        pairs = []
        for pair in query.split("&"):
            k, eq, _v = pair.partition("=")
            pairs.append(f"{k}=***" if eq and _SECRET_QUERY.search(urllib.parse.unquote(k)) else pair)
        tail = f"{path}?{'&'.join(pairs)}{h}{fragment}"
    return f"{scheme}://{netloc}{tail}"


def _secrets_of(url: str, endpoint: _resp.Endpoint | None, secret: bytes | None) -> tuple[str, ...]:
    """Every secret string ``url`` and ``secret`` hold, as text may show them (raw and percent-decoded),
    longest first: what :meth:`RemoteIndex._scrub` removes from messages."""
    found: set[str] = set()
    rest = url.partition("://")[2]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    userinfo = rest[:cut].rpartition("@")[0]
    if userinfo:
        found.add(userinfo.partition(":")[2] if ":" in userinfo else userinfo)
    query = rest[cut:].partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        k, eq, v = pair.partition("=")
        if eq and _SECRET_QUERY.search(urllib.parse.unquote(k)):
            found.add(v)
    if endpoint is not None and endpoint.password:
        found.add(endpoint.password)
    if secret:
        found.add(secret.decode("utf-8", "replace"))
    out: set[str] = set()
    for f in found:
        out.update((f, urllib.parse.unquote(f), urllib.parse.unquote_plus(f)))
    return tuple(sorted((f for f in out if f), key=len, reverse=True))


# URL query options of redis-py's syntax that tune its connection pool, not one connection per thread:
# accepted and ignored.
_IGNORED_OPTIONS: Final = frozenset(
    {
        "max_connections",
        "health_check_interval",
        "retry_on_timeout",
        "retry_on_error",
        "socket_keepalive",
        "socket_read_size",
        "protocol",
        "legacy_responses",
    }
)
_SSL_OPTIONS: Final = frozenset(
    {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
    }
)


def _tls_context(opts: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context of a ``rediss://`` URL, from redis-py's ``ssl_*`` options (as its SSLConnection
    builds it)."""
    ctx = ssl.create_default_context()
    reqs = opts.get("ssl_cert_reqs", "required")
    modes = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    if reqs not in modes:
        raise RemoteConfigError(f"ssl_cert_reqs must be none, optional or required, got {reqs!r}")
    check = opts.get("ssl_check_hostname", True)
    ctx.check_hostname = bool(check) and modes[reqs] != ssl.CERT_NONE
    ctx.verify_mode = modes[reqs]
    for flag in opts.get("ssl_include_verify_flags") or ():
        ctx.verify_flags |= flag
    for flag in opts.get("ssl_exclude_verify_flags") or ():
        ctx.verify_flags &= ~flag
    if opts.get("ssl_certfile") or opts.get("ssl_keyfile"):
        ctx.load_cert_chain(
            opts.get("ssl_certfile") or opts["ssl_keyfile"], opts.get("ssl_keyfile"), opts.get("ssl_password")
        )
    if any(opts.get(k) for k in ("ssl_ca_certs", "ssl_ca_path", "ssl_ca_data")):
        ctx.load_verify_locations(opts.get("ssl_ca_certs"), opts.get("ssl_ca_path"), opts.get("ssl_ca_data"))
    if opts.get("ssl_min_version") is not None:
        ctx.minimum_version = ssl.TLSVersion(opts["ssl_min_version"])
    if opts.get("ssl_ciphers"):
        ctx.set_ciphers(opts["ssl_ciphers"])
    return ctx


def _endpoint(redis: Any, url: str) -> tuple[_resp.Endpoint, dict[str, Any]]:
    """Where ``url`` points (redis-py's URL syntax, parsed by redis-py) and its timeout options.

    Raises:
        RemoteConfigError: a URL redis-py cannot parse, an option this tier does not support, a bad
            database number or TLS setting.
    """
    opts = dict(redis.connection.parse_url(url))
    scheme = url.partition("://")[0]
    timeouts = {k: opts.pop(k) for k in ("socket_timeout", "socket_connect_timeout") if k in opts}
    tls_opts = {k: opts.pop(k) for k in list(opts) if k in _SSL_OPTIONS}
    for k in list(opts):
        if k in _IGNORED_OPTIONS:
            del opts[k]
    opts.pop("connection_class", None)
    known = {"host", "port", "path", "username", "password", "db", "client_name"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise RemoteConfigError(
            f"unsupported URL option {unknown[0]!r} (the remote tier takes {sorted(known - {'host', 'port', 'path'})}, socket_timeout, socket_connect_timeout and ssl_* options)"
        )
    if tls_opts and scheme != "rediss":
        raise RemoteConfigError(f"URL option {sorted(tls_opts)[0]!r} needs a rediss:// (TLS) URL")
    db = opts.get("db", 0)
    if isinstance(db, str):
        try:
            db = int(db)
        except ValueError:
            raise RemoteConfigError(f"db must be an integer, got {db!r}") from None
    if type(db) is not int or not 0 <= db < 2**31:
        raise RemoteConfigError(f"db must be an integer in 0..2**31-1, got {db!r}")
    port = opts.get("port", 6379)
    if scheme == "unix" and not opts.get("path"):
        raise RemoteConfigError("a unix:// URL needs the socket's path")
    try:
        tls = _tls_context(tls_opts) if scheme == "rediss" else None
    except (OSError, ssl.SSLError, ValueError, TypeError) as exc:
        raise RemoteConfigError(f"cannot set up TLS from the URL's ssl_* options: {exc}") from None
    ep = _resp.Endpoint(
        host=opts.get("host") or "localhost",
        port=port,
        path=opts.get("path") if scheme == "unix" else None,
        tls=tls,
        username=opts.get("username") or None,
        password=opts.get("password"),
        db=db,
        client_name=opts.get("client_name") or None,
    )
    return ep, timeouts


@runtime_checkable
class Index(Protocol):
    """What jitkey's three stores share, and all that its users (the persistent autotuner, the L2, the
    per-installation facts) ask of one: :class:`jitkey.DiskIndex`, :class:`TieredIndex` and :class:`RemoteIndex`
    are each an ``Index`` (a ``typing.Protocol``: no base class to inherit; ``isinstance`` checks that the
    methods exist)."""

    def get(self, key: object) -> bytes | None: ...
    def put(self, key: object, value: bytes) -> bool: ...
    def put_many(self, items: Iterable[tuple[object, bytes]] | Mapping[object, bytes]) -> bool: ...
    def delete(self, key: object) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...


class RemoteIndex:
    """Key → bytes in a Redis (or Valkey) server shared by many hosts; the interface of a ``DiskIndex``.

    ``url``: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) or ``unix:///path`` (redis-py's
    URL syntax, parsed by redis-py; query parameters ``socket_timeout`` / ``socket_connect_timeout`` override
    the arguments below, ``db``, ``client_name``, ``password``, ``username`` and redis-py's ``ssl_*`` options
    are honoured, its pool-tuning options are ignored, any other option is refused); default
    ``$JITKEY_REMOTE_CACHE``. ``namespace`` (default ``$JITKEY_REMOTE_NAMESPACE`` or ``"default"``) separates
    teams or projects sharing a server. ``secret`` (default ``$JITKEY_REMOTE_SECRET``): when set, values are
    HMAC-SHA256 signed and only values signed with it are accepted. ``timeout`` (seconds, at most 60): the
    deadline of a whole operation (sending the commands and reading every reply); ``connect_timeout``
    (seconds, at most 60): the deadline for opening a connection (TCP, TLS, handshake), added to the
    operation's when one is opened. ``backoff``: seconds the remote is skipped after a failure, doubled per
    consecutive failure up to ``backoff_max`` (both at most 86400). ``max_value``: the largest value stored
    or accepted (default ``DiskIndex.MAX_VALUE``, at most :data:`MAX_REMOTE_VALUE`; a reply is never
    buffered past it). ``ttl``: seconds before the server may drop an entry
    (``None``: kept until evicted by the server's own policy; at most about 31 years).

    Keys and values follow :class:`jitkey.DiskIndex`: a 32-byte ``bytes`` key is a digest, any other keyable
    value is digested; values are ``bytes``. Nothing connects until the first operation. Every method is
    thread-safe and fork-safe: commands go through one connection per thread and process (a forked child
    opens its own), spoken by jitkey itself (``jitkey._resp``: one deadline per operation, replies bounded
    and type-checked before they are buffered).

    Raises:
        jitkey.errors.MissingDependencyError: the ``redis`` package is not installed (``jitkey[redis]``).
        jitkey.errors.RemoteConfigError: no URL, a URL redis-py cannot parse or with an unsupported option,
            a bad namespace or secret, a timeout / back-off / ttl that is not a finite number of seconds in
            its range (the message names the value and where it came from), a bad ``max_value``.
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
        url = url if url is not None else os.environ.get(ENV_URL)
        if not url:
            raise RemoteConfigError(f"RemoteIndex needs a URL (argument or ${ENV_URL})")
        if not isinstance(url, str):
            raise RemoteConfigError(f"the URL must be a str, got {type(url).__qualname__}")
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
        self._secrets = _secrets_of(url, None, secret)
        self._redacted = self._scrub(_redact(url))
        try:
            endpoint, url_timeouts = _endpoint(redis, url)
        except RemoteConfigError as exc:
            raise RemoteConfigError(
                f"cannot use remote cache URL {self._redacted!r}: {self._scrub(str(exc))}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise RemoteConfigError(
                f"cannot use remote cache URL {self._redacted!r}: {self._scrub(str(exc))}"
            ) from None
        if timeout is None:
            self._timeout = _env_seconds("timeout", ENV_TIMEOUT, _DEFAULT_TIMEOUT, _TIMEOUT_MAX)
        else:
            self._timeout = _seconds("timeout", timeout, "argument", _TIMEOUT_MAX)
        if connect_timeout is None:
            self._connect_timeout = _env_seconds(
                "connect_timeout", ENV_CONNECT_TIMEOUT, _DEFAULT_CONNECT_TIMEOUT, _TIMEOUT_MAX
            )
        else:
            self._connect_timeout = _seconds("connect_timeout", connect_timeout, "argument", _TIMEOUT_MAX)
        for opt, attr in (("socket_timeout", "_timeout"), ("socket_connect_timeout", "_connect_timeout")):
            if opt in url_timeouts:
                setattr(self, attr, _seconds(opt, url_timeouts[opt], "URL option", _TIMEOUT_MAX))
        if backoff is None:
            self._backoff = _env_seconds("backoff", ENV_BACKOFF, _DEFAULT_BACKOFF, _BACKOFF_LIMIT)
        else:
            self._backoff = _seconds("backoff", backoff, "argument", _BACKOFF_LIMIT)
        self._backoff_max = _seconds("backoff_max", backoff_max, "argument", _BACKOFF_LIMIT)
        if type(max_value) is not int or not 0 < max_value <= MAX_REMOTE_VALUE:
            raise RemoteConfigError(f"max_value must be an int in 1..{MAX_REMOTE_VALUE}, got {max_value!r}")
        self._px = None if ttl is None else max(1, int(_seconds("ttl", ttl, "argument", _TTL_MAX) * 1000))

        self._endpoint = endpoint
        self._secrets = _secrets_of(url, endpoint, secret)  # with the password redis-py parsed
        self._namespace = ns
        self._prefix = f"jitkey:r{REMOTE_FORMAT}:{ns}:".encode()
        self._secret: bytes | None = secret
        self._flag = _FLAG_HMAC if secret is not None else _FLAG_CHECKSUM
        self._tag_len = _TAG_LEN[self._flag]
        self._max_value = max_value
        self._max_raw = _HEADER.size + max_value + self._tag_len
        self._local = threading.local()
        self._conns: weakref.WeakSet[_resp.Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._failures = 0
        self._skip_until = 0.0
        self._warned: set[str] = set()
        self._last_error = ""
        self._closed = False
        self._stats = dict.fromkeys(
            ("hits", "misses", "rejects", "errors", "timeouts", "skipped", "puts", "put_failures"), 0
        )

    def _scrub(self, text: str) -> str:
        """``text`` with every secret of this index (URL password, secret query values, the HMAC secret)
        replaced by ``***``: applied to every text this index shows (warnings, ``last_error``)."""
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

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
        warnings.warn(
            f"jitkey remote cache {self._redacted}: {self._scrub(msg)}", RemoteCacheWarning, stacklevel=4
        )

    def _failed(self, exc: Exception | _resp.ErrorReply) -> None:
        """Counts a failure of the server or the wire, starts or doubles the back-off, warns once per kind.

        ``exc`` is what went wrong: a :class:`jitkey._resp.WireError`, an error reply, or any other exception
        an operation met on the wire (a server error too: the remote never raises into a JIT call)."""
        if isinstance(exc, _resp.ErrorReply):
            label, cause = "ResponseError", "server"
        else:
            label = _LABELS.get(type(exc), type(exc).__name__)
            cause = exc.cause if isinstance(exc, _resp.WireError) else "server"
        text = self._scrub(f"{label}: {exc}")
        with self._lock:
            self._stats["timeouts" if cause == "timeout" else "errors"] += 1
            self._failures += 1
            delay = min(self._backoff_max, self._backoff * 2 ** min(self._failures - 1, 30))
            self._skip_until = time.monotonic() + delay
            self._last_error = text
        self._warn_once(cause, f"{text}; skipping the remote for {delay:g} s (doubling on repeat)")

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
    def _call(self, commands: list[_resp.Command]) -> list[object]:
        """Sends ``commands`` in one write and reads their replies, all within one deadline: ``timeout``
        on an open connection, ``connect_timeout + timeout`` when one is opened first (connecting alone
        within ``connect_timeout``). One connection per thread and process (a forked child never uses
        its parent's socket).

        Raises:
            jitkey._resp.WireError: any failure (the connection is closed: a late reply can never be read
                as another command's).
        """
        local = self._local
        conn: _resp.Connection | None = getattr(local, "conn", None)
        pid = os.getpid()
        if conn is None or conn.pid != pid:
            conn = _resp.Connection(self._endpoint, pid)
            local.conn = conn
            self._conns.add(conn)
        start = time.monotonic()
        if conn.connected:
            return conn.call(commands, start + self._timeout)
        return conn.call(
            commands, start + self._connect_timeout + self._timeout, start + self._connect_timeout
        )

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
        # GETRANGE's end is inclusive: at most max_raw + 1 bytes, so an oversize value is seen as one.
        cmd = _resp.Command("GETRANGE", (rkey, 0, self._max_raw), _resp.BULK, self._max_raw + 1)
        try:
            (raw,) = self._call([cmd])
        except Exception as exc:  # the wire: a miss, never an exception into the JIT call
            self._failed(exc)
            return None
        if isinstance(raw, _resp.ErrorReply):
            if raw.text.startswith("WRONGTYPE"):  # something else lives under our key: bad data
                self._succeeded()
                self._reject("another Redis type under the key (WRONGTYPE)")
            else:  # NOAUTH, NOPERM, LOADING, ...: the server is not usable now
                self._failed(raw)
            return None
        self._succeeded()
        if not raw:  # GETRANGE of a missing key is b"" (a nil bulk is taken as absent too)
            with self._lock:
                self._stats["misses"] += 1
            return None
        assert isinstance(raw, bytes)
        try:
            value, why = self._open(rkey, d, raw)
        except Exception as exc:  # never trust bytes we did not write: a parse failure is a reject
            value, why = None, f"malformed value ({type(exc).__name__})"
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

        Every key and value is checked before anything is sent (errors as for :meth:`put`). An entry is
        acknowledged only by the status ``+OK``; any other reply fails the whole batch.
        """
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        sealed: list[tuple[bytes, bytes]] = []
        for i, (k, v) in enumerate(pairs):
            d = _key_digest(k)
            rkey = self._prefix + d.hex().encode()
            sealed.append((rkey, self._seal(rkey, d, self._check_value(v, i))))
        return self._send_sealed(sealed)

    def _send_sealed(self, sealed: list[tuple[bytes, bytes]]) -> bool:
        """The wire half of :meth:`put_many` (never raises)."""
        if not sealed:
            return True
        if self._skipping():
            return False
        px: tuple[str | int, ...] = () if self._px is None else ("PX", self._px)
        cmds = [_resp.Command("SET", (rkey, raw, *px), _resp.OK) for rkey, raw in sealed]
        try:
            replies = self._call(cmds)
        except Exception as exc:  # the wire: a no-op, never an exception into the JIT call
            with self._lock:
                self._stats["put_failures"] += len(sealed)
            self._failed(exc)
            return False
        acked = sum(1 for r in replies if r is True)
        with self._lock:
            self._stats["puts"] += acked
            self._stats["put_failures"] += len(replies) - acked
        refused = [r for r in replies if isinstance(r, _resp.ErrorReply)]
        if refused:  # e.g. OOM (maxmemory with noeviction) or READONLY (a replica): back off
            self._failed(refused[0])
        else:
            self._succeeded()
        return acked == len(replies)

    def _put_after_local(self, pairs: list[tuple[object, bytes]]) -> bool:
        """The remote half of :meth:`TieredIndex.put_many`, after the local index stored ``pairs``: never
        raises. An entry this index cannot take (over ``max_value``, or a key or value that no longer
        digests or checks) is left out, counted in ``put_failures`` and warned about once; the rest is sent.
        """
        sealed: list[tuple[bytes, bytes]] = []
        left_out: list[str] = []
        for i, (k, v) in enumerate(pairs):
            try:
                d = _key_digest(k)
                rkey = self._prefix + d.hex().encode()
                sealed.append((rkey, self._seal(rkey, d, self._check_value(v, i))))
            except ValueTooLargeError:
                left_out.append(
                    f"value over max_value ({self._max_value} bytes): stored in the local index only"
                )
            except Exception as exc:
                left_out.append(f"{type(exc).__name__} for entry #{i}: stored in the local index only")
        if left_out:
            with self._lock:
                self._stats["put_failures"] += len(left_out)
            for why in left_out:
                self._warn_once("left out:" + why.partition(" for entry")[0], why)
        return self._send_sealed(sealed) and not left_out

    def delete(self, key: object) -> bool:
        """Remove ``key`` from the server; whether it was there (``False`` also when the remote failed)."""
        rkey = self.redis_key(key)
        if self._skipping():
            return False
        try:
            (n,) = self._call([_resp.Command("DEL", (rkey,), _resp.INT)])
            if isinstance(n, int) and n not in (0, 1):
                raise _resp.ProtocolError(f"DEL of one key answered {n}")
        except Exception as exc:
            self._failed(exc)
            return False
        if isinstance(n, _resp.ErrorReply):
            self._failed(n)
            return False
        self._succeeded()
        return n == 1

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
            conn.close()

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
        self._tier_init(local)

    def _on_miss(self, key: object) -> bytes | None:
        # called by the native get() on a local miss
        return self._fill(key)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def put(self, key: object, value: bytes) -> bool:
        """Store in the local index, then the remote; ``True`` when the remote acknowledged it too.

        Caller mistakes (a bad key, a value that is not ``bytes`` or is over ``DiskIndex.MAX_VALUE``) raise
        before anything is stored. Once the local index has stored the value nothing raises: a value over
        the remote's ``max_value`` is kept locally only (``False``; counted in ``remote_put_failures``, one
        :class:`jitkey.errors.RemoteCacheWarning`), and a failing remote is a ``False`` as always.
        """
        return self.put_many(((key, value),))

    def put_many(self, items: Iterable[tuple[object, bytes]] | Mapping[object, bytes]) -> bool:
        """Store many entries locally (one write) and remotely (one round trip); ``True`` when the remote
        acknowledged every entry. Raises only before the local store, as :meth:`put`; entries over the
        remote's ``max_value`` are stored locally only."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        self.local.put_many(pairs)
        return self.remote._put_after_local(pairs)

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


if TYPE_CHECKING:  # mypy checks that each store is an Index

    def _stores_are_indexes(d: DiskIndex, t: TieredIndex, r: RemoteIndex) -> tuple[Index, Index, Index]:
        return d, t, r
