"""A hostile fake Redis server for tests/test_remote_hostile.py: RESP over loopback, scripted per command.

``FakeRedis(respond)`` listens on a free ``127.0.0.1`` port; for every command a client sends it calls
``respond(command)`` (the command as a list of ``bytes``) and performs what that returns: raw bytes to send, or
one of the actions below (trickle bytes, stream forever, stall, close). Every action is bounded in time (the
server gives up after ``MAX_ACTION_S`` or when the test stops it), so a client bug makes a test fail, never
hang. ``store()`` is a well-behaved responder (SET / GETRANGE / DEL on a dict) to build scripts on.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_ACTION_S = 20.0  # no action runs longer than this, whatever the client does


@dataclass
class Trickle:
    """Send ``data`` one byte every ``every`` seconds."""

    data: bytes
    every: float = 0.02


@dataclass
class Stream:
    """Send ``head``, then ``chunk`` over and over until the client goes away (or the bound)."""

    head: bytes
    chunk: bytes = b"x" * 65536


@dataclass
class Stall:
    """Send nothing for ``seconds``, then ``then``."""

    seconds: float
    then: bytes = b""


@dataclass
class Close:
    """Send ``data``, then close the connection."""

    data: bytes = b""


Action = bytes | Trickle | Stream | Stall | Close


@dataclass
class Stats:
    connections: int = 0
    commands: list[list[bytes]] = field(default_factory=list)
    bytes_sent: int = 0


class FakeRedis:
    """A scripted RESP server on 127.0.0.1 (a context manager); ``url`` is ``redis://127.0.0.1:<port>/0``."""

    def __init__(self, respond: Callable[[list[bytes]], Action]) -> None:
        self.respond = respond
        self.stats = Stats()
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> FakeRedis:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(timeout=MAX_ACTION_S + 5)
        self._listener.close()
        with self._lock:
            for s in self._socks:
                s.close()

    # -- serving ----------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(0.05)
            with self._lock:
                self._socks.append(conn)
                self.stats.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _recv(self, conn: socket.socket) -> bytes | None:
        """Some bytes from the client; ``None`` when it closed or the server stops."""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return None
            return data or None
        return None

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        while not self._stop.is_set():
            while True:
                cmd, buf = _parse_command(buf)
                if cmd is None:
                    break
                self.stats.commands.append(cmd)
                if not self._act(conn, self.respond(cmd)):
                    conn.close()
                    return
            data = self._recv(conn)
            if data is None:
                conn.close()
                return
            buf += data

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        try:
            conn.sendall(data)
        except OSError:  # the client went away (as it should, after refusing a reply)
            return False
        self.stats.bytes_sent += len(data)
        return True

    def _act(self, conn: socket.socket, action: Action) -> bool:
        """Performs one action; ``False`` when the connection is over."""
        end = time.monotonic() + MAX_ACTION_S
        if isinstance(action, bytes):
            return self._send(conn, action)
        if isinstance(action, Close):
            self._send(conn, action.data)
            return False
        if isinstance(action, Trickle):
            for i in range(len(action.data)):
                if (
                    self._stop.is_set()
                    or time.monotonic() > end
                    or not self._send(conn, action.data[i : i + 1])
                ):
                    return False
                time.sleep(action.every)
            return True
        if isinstance(action, Stream):
            if not self._send(conn, action.head):
                return False
            while not self._stop.is_set() and time.monotonic() < end:
                if not self._send(conn, action.chunk):
                    return False
            return False
        if isinstance(action, Stall):
            deadline = time.monotonic() + action.seconds
            while not self._stop.is_set() and time.monotonic() < min(end, deadline):
                time.sleep(0.005)
            return self._send(conn, action.then) if action.then else True
        raise TypeError(f"unknown action {action!r}")


def _parse_command(buf: bytes) -> tuple[list[bytes] | None, bytes]:
    """One RESP array of bulk strings from the front of ``buf`` (as a client sends them), or ``None``."""
    if not buf.startswith(b"*"):
        return None, buf
    end = buf.find(b"\r\n")
    if end < 0:
        return None, buf
    n = int(buf[1:end])
    pos = end + 2
    out = []
    for _ in range(n):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None, buf
        size = int(buf[pos + 1 : end])
        start = end + 2
        if len(buf) < start + size + 2:
            return None, buf
        out.append(buf[start : start + size])
        pos = start + size + 2
    return out, buf[pos:]


def store() -> Callable[[list[bytes]], bytes]:
    """A well-behaved responder: HELLO as Redis answers it, AUTH / SELECT / CLIENT ``+OK``; SET, GETRANGE
    and DEL on a dict."""
    data: dict[bytes, bytes] = {}

    def respond(cmd: list[bytes]) -> bytes:
        name = cmd[0].upper()
        if name in (b"AUTH", b"SELECT", b"CLIENT", b"PING"):
            return b"+OK\r\n"
        if name == b"HELLO":  # what redis-py sends first: answer as Redis does, in the protocol asked for
            proto = int(cmd[1]) if len(cmd) > 1 else 2
            return (b"%2\r\n" if proto == 3 else b"*4\r\n") + (
                b"$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:%d\r\n" % proto
            )
        if name == b"SET":
            data[cmd[1]] = cmd[2]
            return b"+OK\r\n"
        if name == b"GETRANGE":
            v = data.get(cmd[1], b"")[int(cmd[2]) : int(cmd[3]) + 1]
            return b"$%d\r\n%s\r\n" % (len(v), v)
        if name == b"DEL":
            return b":%d\r\n" % (data.pop(cmd[1], None) is not None)
        return b"-ERR unknown command\r\n"

    return respond
