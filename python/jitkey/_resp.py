"""The wire of jitkey's Redis tier: a minimal RESP2 client with one deadline per operation.

Not public. :class:`jitkey.remote.RemoteIndex` sends only the handshake (``AUTH``, ``SELECT``, ``CLIENT
SETNAME``), ``GETRANGE``, ``SET`` and ``DEL``, and this module owns every byte of that exchange, because a
general client (redis-py) trusts the server in ways a cache tier cannot afford:

* **One deadline per operation.** :meth:`Connection.call` gets an absolute deadline and every step (connect,
  TLS handshake, each ``send`` and ``recv``) waits at most what is left of it. A server that never answers,
  trickles a byte at a time or answers one reply of a pipeline and stalls cannot stretch a call past it.
* **Replies are bounded before they are buffered.** A bulk reply's announced length is checked against the
  command's bound (``GETRANGE``: the envelope size the caller asked for) before any of it is read; a line
  (status, error, integer, header) longer than :data:`MAX_LINE` is refused. Nothing of a refused reply is
  buffered past one ``recv``.
* **Each command has one reply shape** (:data:`OK`, :data:`INT`, :data:`BULK`), plus an error reply. Anything
  else (an integer where ``SET`` must say ``+OK``, an array or a RESP3 push where a bulk string is due, a
  malformed number) is a :class:`ProtocolError`. No reply is parsed recursively, so no nesting or flood of
  pushes can recurse or allocate.

Every failure is a :class:`WireError`, and the caller drops the connection after one (a late reply can never
be read as another command's). Name resolution (``getaddrinfo``) is the one step the deadline cannot bound.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "BULK",
    "INT",
    "MAX_LINE",
    "OK",
    "AuthError",
    "Command",
    "Connection",
    "ConnectionFailed",
    "Endpoint",
    "ErrorReply",
    "ProtocolError",
    "ServerError",
    "Timeout",
    "WireError",
]

OK: Final = "ok"
"""Reply shape: the status ``+OK``."""
INT: Final = "int"
"""Reply shape: an integer."""
BULK: Final = "bulk"
"""Reply shape: a bulk string (or the nil bulk), no longer than the command's bound."""

MAX_LINE: Final = 4096
"""The longest status, error, integer or bulk-header line accepted (bytes, without CRLF)."""
_RECV: Final = 65536
_INT_RE: Final = re.compile(rb"-?(?:0|[1-9][0-9]{0,18})")
_LEN_RE: Final = re.compile(rb"-1|0|[1-9][0-9]{0,18}")
_ERROR_TEXT_MAX: Final = 200


class WireError(Exception):
    """A failure on the wire; ``cause`` names its kind for counting and for one warning per kind.

    Each kind is a subclass that states its ``cause`` in its class line.
    """

    cause: str = "server"

    def __init_subclass__(cls, *, cause: str, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.cause = cause


class Timeout(WireError, cause="timeout"):
    """The operation's deadline passed (connect, send or read)."""


class ConnectionFailed(WireError, cause="connection"):
    """Connecting failed, or the connection broke or was closed by the server."""


class AuthError(WireError, cause="auth"):
    """The server refused the handshake's ``AUTH``."""


class ServerError(WireError, cause="server"):
    """The server answered the handshake (``SELECT``, ``CLIENT SETNAME``) with an error."""


class ProtocolError(WireError, cause="protocol"):
    """A reply that is not the one shape its command may answer with, or not RESP2 at all."""


@dataclass(frozen=True)
class ErrorReply:
    """An error reply (``-ERR ...``) to one command: data for the caller to judge, never raised."""

    text: str

    def __str__(self) -> str:
        return self.text


def _printable(raw: bytes) -> str:
    """A server's error text as something safe to put in a warning: decoded, control characters
    replaced, at most ``_ERROR_TEXT_MAX`` characters."""
    text = raw[: _ERROR_TEXT_MAX * 4].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= _ERROR_TEXT_MAX else text[:_ERROR_TEXT_MAX] + "..."


@dataclass(frozen=True)
class Command:
    """One command: its arguments, the reply shape it must get and, for :data:`BULK`, the longest one."""

    name: str
    args: tuple[bytes | str | int, ...]
    shape: str
    limit: int = 0


def _pack(commands: list[Command]) -> bytes:
    out = bytearray()
    for c in commands:
        out += b"*%d\r\n" % (len(c.args) + 1)
        for a in (c.name, *c.args):
            b = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n" % len(b)
            out += b
            out += b"\r\n"
    return bytes(out)


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: a TCP ``host``/``port`` or a unix socket ``path``, TLS, and the handshake."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    tls: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never shown
    db: int = 0
    client_name: str | None = None

    def handshake(self) -> list[Command]:
        """The commands a new connection sends first (each must be answered ``+OK``)."""
        out: list[Command] = []
        if self.password is not None:
            auth = (self.username, self.password) if self.username else (self.password,)
            out.append(Command("AUTH", auth, OK))
        if self.db:
            out.append(Command("SELECT", (self.db,), OK))
        if self.client_name:
            out.append(Command("CLIENT", ("SETNAME", self.client_name), OK))
        return out


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout("the operation's deadline passed")
    return left


def _connect(ep: Endpoint, deadline: float) -> socket.socket:
    """A connected (and, with TLS, handshaken) socket, all of it before ``deadline``."""
    try:
        if ep.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(_remaining(deadline))
                sock.connect(ep.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = _connect_tcp(ep, deadline)
        if ep.tls is not None:
            try:
                sock.settimeout(_remaining(deadline))
                # CPython runs the whole handshake under one deadline of the socket's timeout.
                sock = ep.tls.wrap_socket(sock, server_hostname=ep.host)
            except BaseException:
                sock.close()
                raise
        return sock
    except WireError:
        raise
    except TimeoutError:
        raise Timeout("connecting: the deadline passed") from None
    except (OSError, ValueError) as exc:  # refused, unreachable, TLS failure, bad address
        raise ConnectionFailed(f"cannot connect: {exc}") from None


def _connect_tcp(ep: Endpoint, deadline: float) -> socket.socket:
    err: Exception | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(_remaining(deadline))
            sock.connect(addr)
            return sock
        except (OSError, ValueError) as exc:
            sock.close()
            err = exc
            if isinstance(exc, TimeoutError):
                raise
        except BaseException:
            sock.close()
            raise
    raise err if err is not None else OSError(f"no address for {ep.host}:{ep.port}")


class Connection:
    """One socket to the server, its read buffer and whether its handshake is done.

    Not thread-safe (one per thread). After any :class:`WireError` (or any other exception) from
    :meth:`call` it is closed; make a new one.
    """

    __slots__ = ("__weakref__", "_buf", "_pos", "_sock", "endpoint", "pid")

    def __init__(self, endpoint: Endpoint, pid: int) -> None:
        self.endpoint = endpoint
        self.pid = pid
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._pos = 0

    def __del__(self) -> None:  # an index dropped without close(): no ResourceWarning, no leaked fd
        self.close()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buf.clear()
        self._pos = 0
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def call(
        self, commands: list[Command], deadline: float, connect_deadline: float | None = None
    ) -> list[object]:
        """Sends ``commands`` in one write and reads one reply each, all before ``deadline``.

        Connects first when needed (by ``min(deadline, connect_deadline)``), pipelining the handshake
        in front of ``commands``. Returns per command: ``True`` (``+OK``), an ``int``, ``bytes`` or
        ``None`` (nil bulk), or an :class:`ErrorReply`.

        Raises:
            WireError: any failure; the connection is closed then.
        """
        try:
            handshake: list[Command] = []
            if self._sock is None:
                self._sock = _connect(
                    self.endpoint, deadline if connect_deadline is None else min(deadline, connect_deadline)
                )
                handshake = self.endpoint.handshake()
            self._send(_pack(handshake + commands), deadline)
            for c in handshake:
                reply = self._read(c, deadline)
                if isinstance(reply, ErrorReply):
                    kind = AuthError if c.name == "AUTH" else ServerError
                    raise kind(f"{c.name} refused: {reply}")
            replies = [self._read(c, deadline) for c in commands]
            if self._pos < len(self._buf):  # bytes nobody asked for: later replies would be misread
                raise ProtocolError(f"{len(self._buf) - self._pos} bytes after the last reply")
            return replies
        except BaseException as exc:
            self.close()
            if isinstance(exc, WireError) or not isinstance(exc, Exception):
                raise
            if isinstance(exc, TimeoutError):
                raise Timeout("the operation's deadline passed") from None
            if isinstance(exc, OSError):
                raise ConnectionFailed(f"connection failed: {exc}") from None
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from None

    # -- I/O under the deadline ---------------------------------------------------------------------------
    def _send(self, data: bytes, deadline: float) -> None:
        sock = self._sock
        assert sock is not None
        view = memoryview(data)
        while view:
            sock.settimeout(_remaining(deadline))
            n = sock.send(view)
            view = view[n:]

    def _fill(self, deadline: float) -> None:
        sock = self._sock
        assert sock is not None
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(_RECV)
        if not chunk:
            raise ConnectionFailed("the server closed the connection")
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += chunk

    def _line(self, deadline: float) -> bytes:
        scanned = self._pos  # where the search for CRLF resumes (bytes before it hold none)
        while True:
            i = self._buf.find(b"\r\n", scanned)
            if i >= 0 and i - self._pos <= MAX_LINE:
                line = bytes(self._buf[self._pos : i])
                self._pos = i + 2
                return line
            if i >= 0 or len(self._buf) - self._pos > MAX_LINE + 1:
                raise ProtocolError(f"a reply line longer than {MAX_LINE} bytes")
            resume = max(0, len(self._buf) - self._pos - 1)  # the last byte may be the CR of a CRLF
            self._fill(deadline)  # may move the unread bytes to the front
            scanned = self._pos + resume

    def _exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) - self._pos < n:
            self._fill(deadline)
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out

    def _read(self, c: Command, deadline: float) -> object:
        line = self._line(deadline)
        kind, body = line[:1], line[1:]
        if kind == b"-":
            return ErrorReply(_printable(body) or "ERR (no message)")
        if c.shape == OK:
            if kind == b"+" and body == b"OK":
                return True
        elif c.shape == INT:
            if kind == b":" and _INT_RE.fullmatch(body):
                return int(body)
        elif c.shape == BULK and kind == b"$" and _LEN_RE.fullmatch(body):
            n = int(body)
            if n < 0:
                return None
            if n > c.limit:
                raise ProtocolError(f"a bulk reply of {n} bytes to {c.name} (at most {c.limit} expected)")
            data = self._exact(n + 2, deadline)
            if data[n:] != b"\r\n":
                raise ProtocolError(f"a bulk reply to {c.name} not terminated by CRLF")
            return data[:n]
        raise ProtocolError(f"unexpected reply to {c.name} ({c.shape} expected): {_printable(line[:40])!r}")
