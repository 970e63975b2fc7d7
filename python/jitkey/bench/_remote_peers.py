"""The Redis-tier benchmark's setup, for the ``remote`` section of ``python -m jitkey bench`` (which benches/ runs
too).

One throwaway ``redis-server`` (``jitkey._redis_server``) serves three clients that fetch the same stored
bytes: jitkey's :class:`jitkey.RemoteIndex`, a plain ``redis-py`` client (``GET`` of the same Redis key, so the
bare round trip), and Triton's own remote-cache backend (``triton.runtime.cache.RedisRemoteCacheBackend``,
constructed as Triton does from ``TRITON_REDIS_HOST`` / ``TRITON_REDIS_PORT``). A ``TieredIndex`` and its
``DiskIndex`` alone hold the same entry for the local-hit comparison.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import jitkey
from jitkey._redis_server import RedisServer, RedisServerError, find_redis_server

VALUE = bytes(range(256))  # about an autotune choice's JSON
TRITON_FILE = "kernel.json"


def triton_backend(host: str, port: int, key: str) -> Any:
    """Triton's ``RedisRemoteCacheBackend(key)`` for ``host:port``, or ``None`` without triton / the class.

    Triton 3.6's (and 3.9's) constructor reads ``knobs.cache.redis``, which those releases do not define (their
    Redis knobs are ``knobs.redis``), so it raises ``AttributeError``. Then the object is built with exactly the
    attributes the constructor sets (``_key``, ``_key_fmt`` and ``_redis = redis.Redis(host, port)``, from
    ``knobs.redis``); ``get`` / ``put`` are Triton's own methods either way.
    """
    try:
        from triton import knobs
        from triton.runtime.cache import RedisRemoteCacheBackend
    except ImportError:
        return None
    saved = {k: os.environ.get(k) for k in ("TRITON_REDIS_HOST", "TRITON_REDIS_PORT")}
    os.environ["TRITON_REDIS_HOST"], os.environ["TRITON_REDIS_PORT"] = host, str(port)
    try:
        try:
            return RedisRemoteCacheBackend(key)  # reads knobs.cache.redis.{host,port,key_format} here
        except AttributeError:
            import redis

            rk = getattr(knobs, "redis", None)
            if rk is None:
                return None
            backend = RedisRemoteCacheBackend.__new__(RedisRemoteCacheBackend)
            backend._key = key
            backend._key_fmt = rk.key_format
            backend._redis = redis.Redis(host=rk.host, port=rk.port)
            return backend
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclasses.dataclass
class RemoteSetup:
    server: RedisServer
    remote: jitkey.RemoteIndex
    plain: Any  # redis.Redis
    triton: Any  # RedisRemoteCacheBackend | None
    disk: jitkey.DiskIndex
    tier: jitkey.TieredIndex
    key: bytes
    redis_key: bytes
    envelope: bytes
    tmp: tempfile.TemporaryDirectory[str]

    def close(self) -> None:
        self.tier.close()
        self.plain.close()
        self.server.stop()
        self.tmp.cleanup()


def setup() -> RemoteSetup | str:
    """Start a server and the clients with ``VALUE`` stored; or the reason they cannot run here."""
    try:
        import redis
    except ImportError:
        return "the redis client is not installed (pip install 'jitkey[redis]')"
    if find_redis_server() is None:
        return "no redis-server found (PATH, $JITKEY_REDIS_SERVER, .redis-debs/)"
    try:
        server = RedisServer().start()
    except RedisServerError as exc:
        return f"redis-server did not start: {exc}"
    remote = jitkey.RemoteIndex(server.url, namespace="bench")
    plain = redis.Redis.from_url(server.url)
    key = jitkey.digest(("bench", "remote"))
    if not remote.put(key, VALUE):
        server.stop()
        return f"the test server did not take a put: {remote.stats()}"
    rkey = remote.redis_key(key)
    envelope = plain.get(rkey)
    if not isinstance(envelope, bytes):
        server.stop()
        return f"the test server did not return the stored bytes: {envelope!r}"
    tb = triton_backend("127.0.0.1", server.port, "bench")
    if tb is not None:
        tb.put(TRITON_FILE, VALUE)
    tmp = tempfile.TemporaryDirectory(prefix="jitkey-bench-remote-")
    disk = jitkey.DiskIndex(tmp.name)
    disk.put(key, VALUE)
    tier = jitkey.TieredIndex(disk, remote)
    return RemoteSetup(server, remote, plain, tb, disk, tier, key, rkey, envelope, tmp)
