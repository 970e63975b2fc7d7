"""A throwaway ``redis-server`` on a free loopback port, for jitkey's tests, benchmarks and examples.

Not part of the public API. :func:`find_redis_server` looks for the binary in ``$JITKEY_REDIS_SERVER``, on
``PATH``, then in ``.redis-debs/root/usr/bin`` (Debian's packages unpacked by ``scripts/fetch_redis_server.sh``,
for machines without network or apt) under the current directory and the source checkout.
:class:`RedisServer` starts it with a temp directory and no persistence, waits until it answers ``PING``, and
can kill (``SIGKILL``), pause (``SIGSTOP``), resume and restart it on the same port.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

__all__ = ["RedisServer", "RedisServerError", "find_redis_server"]

_DEBS_BIN = Path(".redis-debs") / "root" / "usr" / "bin" / "redis-server"


class RedisServerError(RuntimeError):
    """The server could not be found or started (the message says why)."""


def find_redis_server() -> Path | None:
    """The ``redis-server`` binary to use, or ``None``."""
    env = os.environ.get("JITKEY_REDIS_SERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    which = shutil.which("redis-server")
    if which:
        return Path(which)
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        cand = base / _DEBS_BIN
        if cand.is_file():
            return cand
    return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up (with --requirepass: NOAUTH)
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:<port>`` (a fresh free port unless given).

    ``binary`` defaults to :func:`find_redis_server`. Use as a context manager or call :meth:`start` /
    :meth:`stop`. :attr:`url` is ``redis://127.0.0.1:<port>/0``.
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        found = Path(binary) if binary is not None else find_redis_server()
        if found is None or not found.is_file():
            raise RedisServerError(
                "no redis-server found (looked at $JITKEY_REDIS_SERVER, PATH and .redis-debs/); install "
                "Debian's redis-server (make test does it with apt as root) or run scripts/fetch_redis_server.sh"
            )
        self.binary = found
        self.port = port or _free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="jitkey-redis-")
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = self.binary.resolve().parents[2]  # .../root/usr/bin/redis-server -> .../root
        libs = [
            str(p) for p in (root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu") if p.is_dir()
        ]
        if libs and ".redis-debs" in str(self.binary):
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(
                os.pathsep
            )
        return env

    def _args(self) -> list[str]:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.dir),
            "save": "",  # no persistence: a restart after kill() comes back empty
            "appendonly": "no",
            "daemonize": "no",
            "unixsocket": "",
            "databases": "2",
            "loglevel": "warning",
        }
        return [x for k, v in options.items() for x in (f"--{k}", v)] + list(self.extra_args)

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (again, on the same port, after :meth:`kill`) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(
                [str(self.binary), *self._args()],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        finally:
            log.close()
        weakref.finalize(self, _kill, self.proc)  # never outlives this object or the interpreter
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RedisServerError(f"redis-server exited with {self.proc.returncode}:\n{text}")
            if _ping(self.port):
                return self
            time.sleep(0.02)
        self.kill()
        raise RedisServerError(f"redis-server did not answer PING on port {self.port} within {timeout} s")

    def kill(self) -> None:
        """``SIGKILL`` the server (no shutdown, no save) and reap it."""
        if self.proc is not None:
            _kill(self.proc)

    def pause(self) -> None:
        """``SIGSTOP``: connections are still accepted by the kernel, but nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """Kill the server and remove its directory."""
        self.kill()
        self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
