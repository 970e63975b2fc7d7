"""The Redis tier (jitkey.remote) against a real redis-server: sharing, failures, bad data, concurrency.

Every test that needs a server starts Debian's ``redis-server`` on a free loopback port with a temp directory
(``jitkey._redis_server``) and stops it. Without a server binary or the ``redis`` client the tests skip with
the reason; under ``CI=true`` they fail instead (``make test`` installs the server with apt when it can).
Failures are real: ``SIGKILL``, ``SIGSTOP`` and a port nobody listens on.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import jitkey
from jitkey._redis_server import RedisServer, _free_port
from jitkey.errors import (
    KeyLengthError,
    MissingDependencyError,
    RemoteCacheWarning,
    RemoteConfigError,
    UnsupportedKeyError,
    ValueTooLargeError,
)
from jitkey.remote import RemoteIndex, TieredIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _remote_workers as rw


def fast_remote(url: str, **kw: Any) -> RemoteIndex:
    """A RemoteIndex with short timeouts and back-off, so failure tests run quickly."""
    kw.setdefault("timeout", 0.2)
    kw.setdefault("connect_timeout", 0.2)
    kw.setdefault("backoff", 0.05)
    kw.setdefault("backoff_max", 0.2)
    return RemoteIndex(url, **kw)


def wait_past_backoff(remote: RemoteIndex) -> None:
    """Sleep until the remote is out of its back-off (the counters say it is)."""
    for _ in range(200):
        if remote.stats()["state"] != "backoff":
            return
        time.sleep(0.01)
    raise AssertionError(f"still in back-off: {remote.stats()}")


@pytest.fixture
def record() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def remote_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RemoteCacheWarning)]


# ---------------------------------------------------------------------------------------------------------
# The interface, without failures
# ---------------------------------------------------------------------------------------------------------


def test_roundtrip_and_keys_follow_diskindex(server: RedisServer, raw: Any, tmp_path: Path) -> None:
    remote = RemoteIndex(server.url, namespace="team-a")
    key = ("matmul", 128, "sm_90")
    assert remote.get(key) is None and key not in remote
    assert remote.put(key, b"cfg") is True
    assert remote.get(key) == b"cfg" and key in remote
    d = jitkey.digest(key)
    assert remote.get(d) == b"cfg"  # a 32-byte bytes key is the digest itself, as for DiskIndex
    assert remote.redis_key(key) == b"jitkey:r1:team-a:" + d.hex().encode()
    assert raw.exists(remote.redis_key(key)) == 1
    with jitkey.DiskIndex(tmp_path / "ix") as ix:  # same digest as DiskIndex files the key under
        ix.put(key, b"cfg")
        assert ix.get(d) == b"cfg"
    assert remote.put_many({("a", i): bytes([i]) * i for i in range(1, 6)}) is True
    assert [remote.get(("a", i)) for i in range(1, 6)] == [bytes([i]) * i for i in range(1, 6)]
    assert remote.put(key, b"") and remote.get(key) == b""  # empty values are values
    assert remote.delete(key) is True and remote.get(key) is None and remote.delete(key) is False
    st = remote.stats()
    assert st["puts"] == 7 and st["hits"] == 9 and st["misses"] == 3 and st["errors"] == st["timeouts"] == 0
    assert st["state"] == "ok" and st["namespace"] == "team-a" and st["hmac"] is False
    # another namespace on the same server sees none of it
    assert RemoteIndex(server.url, namespace="team-b").get(("a", 1)) is None
    remote.close()
    assert remote.closed and remote.get(("a", 1)) is None and remote.put(("a", 1), b"x") is False


def test_caller_mistakes_raise_typed_errors(server: RedisServer) -> None:
    remote = RemoteIndex(server.url, max_value=100)
    with pytest.raises(KeyLengthError):
        remote.get(b"short")
    with pytest.raises(UnsupportedKeyError):
        remote.put([1], b"x")
    with pytest.raises(ValueTooLargeError):
        remote.put(("k",), b"x" * 101)
    with pytest.raises(TypeError):
        remote.put(("k",), "not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueTooLargeError):  # nothing of a batch is sent when one value is bad
        remote.put_many([(("ok",), b"x"), (("big",), b"x" * 101)])
    assert remote.get(("ok",)) is None
    assert issubclass(ValueTooLargeError, ValueError) and issubclass(KeyLengthError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"url": "http://example.com"}, "cannot use remote cache URL"),
        ({"url": "redis://h:6379", "namespace": "has space"}, "namespace"),
        ({"url": "redis://h:6379", "namespace": ""}, "namespace"),
        ({"url": "redis://h:6379", "timeout": 0}, "timeout"),
        ({"url": "redis://h:6379", "backoff": -1}, "backoff"),
        ({"url": "redis://h:6379", "max_value": (256 << 20) + 1}, "max_value"),
        ({"url": "redis://h:6379", "max_value": 0}, "max_value"),
        ({"url": "redis://h:6379", "secret": b""}, "secret"),
    ],
)
def test_bad_configuration_is_a_value_error(kwargs: dict[str, Any], match: str) -> None:
    pytest.importorskip("redis")
    url = kwargs.pop("url")
    with pytest.raises(RemoteConfigError, match=match) as info:
        RemoteIndex(url, **kwargs)
    assert isinstance(info.value, ValueError)


def test_url_password_is_redacted() -> None:
    pytest.importorskip("redis")
    remote = RemoteIndex("redis://user:hunter2@127.0.0.1:1/0")
    assert "hunter2" not in repr(remote) and "hunter2" not in str(remote.stats())
    assert remote.url == "redis://user:***@127.0.0.1:1/0"


def test_missing_redis_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    import jitkey.remote

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    with pytest.raises(MissingDependencyError, match=r"jitkey\[redis\]") as info:
        RemoteIndex("redis://127.0.0.1:6379/0")
    assert isinstance(info.value, ImportError)
    # the environment variable route warns (naming the extra) and keeps the DiskIndex alone
    monkeypatch.setenv("JITKEY_REMOTE_CACHE", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("JITKEY_CACHE_DIR", str(tmp_path / "local"))
    monkeypatch.setattr(jitkey.remote, "_default", None)
    ix = jitkey.remote.default_index()
    try:
        assert type(ix) is jitkey.DiskIndex
        assert any("jitkey[redis]" in m for m in remote_warnings(record))
    finally:
        ix.close()
        monkeypatch.setattr(jitkey.remote, "_default", None)


def test_default_index_is_tiered_with_the_env_var(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import jitkey.remote

    monkeypatch.setenv("JITKEY_REMOTE_CACHE", server.url)
    monkeypatch.setenv("JITKEY_REMOTE_NAMESPACE", "ci")
    monkeypatch.setenv("JITKEY_REMOTE_SECRET", "s3cret")
    monkeypatch.setenv("JITKEY_REMOTE_TIMEOUT", "0.3")
    monkeypatch.setenv("JITKEY_CACHE_DIR", str(tmp_path / "local"))
    monkeypatch.setattr(jitkey.remote, "_default", None)
    ix = jitkey.remote.default_index()
    try:
        assert isinstance(ix, TieredIndex) and jitkey.remote.default_index() is ix
        st = ix.stats()
        assert st["remote_namespace"] == "ci" and st["remote_hmac"] is True and st["remote_timeout_s"] == 0.3
        assert ix.local.path.parent == tmp_path / "local"
    finally:
        ix.close()
        monkeypatch.setattr(jitkey.remote, "_default", None)


def test_forked_children_use_their_own_connection(server: RedisServer) -> None:
    """A child never reads or writes on its parent's socket (interleaved replies would be misread)."""
    remote = RemoteIndex(server.url)
    assert remote.put(("shared",), b"1") and remote.get(("shared",)) == b"1"  # the parent's connection exists
    pids = []
    for i in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = all(remote.get(("shared",)) == b"1" for _ in range(200)) and remote.put(
                ("child", i), b"%d" % i
            )
            os._exit(0 if ok and remote.stats()["errors"] == 0 else 1)
        pids.append(pid)
    assert all(remote.get(("shared",)) == b"1" for _ in range(200))
    assert [os.waitpid(p, 0)[1] for p in pids] == [0, 0, 0, 0]
    assert [remote.get(("child", i)) for i in range(4)] == [b"0", b"1", b"2", b"3"]
    assert remote.stats()["errors"] == 0


def test_auth_from_the_url(server: RedisServer, record: list[warnings.WarningMessage]) -> None:
    """A password in the URL authenticates; without it the server refuses, which is an outage, not bad data."""
    with RedisServer(extra_args=("--requirepass", "pw")) as locked:
        url = locked.url.replace("redis://", "redis://:pw@")
        good = RemoteIndex(url)
        assert good.put(("k",), b"v") and good.get(("k",)) == b"v"
        assert "pw" not in good.url
        anonymous = fast_remote(locked.url)
        assert anonymous.get(("k",)) is None and anonymous.put(("k",), b"x") is False
        st = anonymous.stats()
        assert st["errors"] == 1 and st["rejects"] == 0 and st["state"] == "backoff", st
        assert "NOAUTH" in st["last_error"] or "Authentication" in st["last_error"]
        wrong = fast_remote(url.replace(":pw@", ":nope@"))
        assert wrong.get(("k",)) is None and wrong.stats()["errors"] == 1
        assert good.get(("k",)) == b"v"
        assert len(remote_warnings(record)) >= 2


# ---------------------------------------------------------------------------------------------------------
# The tiered index
# ---------------------------------------------------------------------------------------------------------


def test_tiered_local_first_remote_fill_and_put_to_both(server: RedisServer, tmp_path: Path) -> None:
    host1 = TieredIndex(jitkey.DiskIndex(tmp_path / "h1"), RemoteIndex(server.url))
    host2 = TieredIndex(jitkey.DiskIndex(tmp_path / "h2"), RemoteIndex(server.url))
    assert host1.put(("k", 1), b"v1") is True
    assert host1.local.get(("k", 1)) == b"v1" and host1.remote.get(("k", 1)) == b"v1"
    before = host1.remote.stats()
    assert host1.get(("k", 1)) == b"v1"  # a local hit: the remote is not touched
    after = host1.remote.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])
    # host 2: local miss, remote hit, copied into its local index, then served locally
    assert host2.local.get(("k", 1)) is None
    assert host2.get(("k", 1)) == b"v1"
    assert host2.local.get(("k", 1)) == b"v1" and host2.stats()["remote_fills"] == 1
    assert host2.get(("k", 1)) == b"v1" and host2.stats()["remote_hits"] == 1
    assert ("k", 2) not in host2 and host2.stats()["remote_misses"] == 1
    assert host2.put_many([(("m", i), b"x" * i) for i in range(3)]) is True
    assert [host1.get(("m", i)) for i in range(3)] == [b"x" * i for i in range(3)]
    assert host1.delete(("m", 1)) is True and host1.get(("m", 1)) is None
    assert len(host1) == 3 and host1.mode == "rw"
    host1.close()
    host2.close()
    assert host1.closed and host1.remote.closed


# ---------------------------------------------------------------------------------------------------------
# Two hosts sharing autotuning (separate processes, separate local directories)
# ---------------------------------------------------------------------------------------------------------


def test_two_hosts_share_autotuning(server: RedisServer, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        h1 = pool.submit(rw.tune_on_host, str(tmp_path / "host1"), server.url, [1000, 2000, 3000]).result()
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:  # host 2 configures through the environment
        h2 = pool.submit(
            rw.tune_on_host, str(tmp_path / "host2"), server.url, [1000, 2000, 3000, 4000], True
        ).result()
    assert h1["pid"] != h2["pid"]
    assert h1["blocks"] == [256, 256, 256] and h1["stats"]["tunings"] == 3 and h1["bench_calls"] == 9
    assert h1["index_stats"]["remote_puts"] == 3
    # host 2 tunes only what host 1 did not (n=4000) and gets the rest from the remote
    assert h2["blocks"] == [256, 256, 256, 256]
    assert h2["stats"]["tunings"] == 1 and h2["bench_calls"] == 3 and h2["stats"]["disk_hits"] == 3
    assert h2["index_stats"]["remote_hits"] == 3 and h2["index_stats"]["remote_fills"] == 3
    assert h2["index_stats"]["remote_misses"] == 1 and h2["index_stats"]["remote_puts"] == 1
    for st in (h1["index_stats"], h2["index_stats"]):
        assert st["remote_errors"] == st["remote_timeouts"] == st["remote_rejects"] == 0


# ---------------------------------------------------------------------------------------------------------
# Failures: killed, paused, restarted, absent
# ---------------------------------------------------------------------------------------------------------


def _tuner(index: Any) -> tuple[Any, Any]:
    pytest.importorskip("triton")
    import _autotune_workers as w

    gpu = w.SimulatedGPU()
    return w.make(index, gpu), gpu


def _args(n: int) -> tuple[Any, ...]:
    import _autotune_workers as w

    return w.args_for(n)


def test_absent_server_never_raises(tmp_path: Path, record: list[warnings.WarningMessage]) -> None:
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    remote = fast_remote(url)
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "h"), remote)
    at, gpu = _tuner(tier)
    assert at[(1,)](*_args(1000)) == 256 and gpu.bench_calls == 3  # tuned, stored locally
    at.cache_clear()
    assert at[(1,)](*_args(1000)) == 256 and gpu.bench_calls == 3  # from the local tier
    assert tier.get(("absent",)) is None and tier.put(("k",), b"v") is False
    assert tier.get(("k",)) == b"v"  # the local tier has it
    st = tier.stats()
    assert st["remote_errors"] >= 1 and st["remote_skipped"] >= 1 and st["remote_hits"] == 0
    assert st["remote_state"] == "backoff" and "Connection" in st["remote_last_error"]
    msgs = remote_warnings(record)
    assert len(msgs) == 1 and "skipping the remote" in msgs[0]  # one warning per cause
    tier.close()


def test_killed_mid_run_then_restarted(
    server: RedisServer, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "h1"), fast_remote(server.url))
    at, _ = _tuner(tier)
    assert [at[(1,)](*_args(n)) for n in (1000, 2000)] == [256, 256]
    assert tier.stats()["remote_puts"] == 2
    server.kill()  # SIGKILL: connections reset, nothing answers
    assert at[(1,)](*_args(3000)) == 256  # tunes and stores locally; the remote put fails quietly
    assert at[(1,)](*_args(1000)) == 256  # memory hit
    st = tier.stats()
    assert st["remote_errors"] == 1 and st["remote_skipped"] >= 1  # the put came during the back-off
    # a second host while the server is down: tunes everything itself, nothing raises
    tier2 = TieredIndex(jitkey.DiskIndex(tmp_path / "h2"), fast_remote(server.url))
    at2, gpu2 = _tuner(tier2)
    assert at2[(1,)](*_args(1000)) == 256 and gpu2.bench_calls == 3
    server.start()  # restarted, empty (no persistence)
    wait_past_backoff(tier.remote)
    wait_past_backoff(tier2.remote)
    assert at[(1,)](*_args(4000)) == 256  # tuned; the remote takes the put again
    assert tier.stats()["remote_puts"] == 3 and tier.stats()["remote_state"] == "ok"
    # host 3 after the restart: 4000 comes from the remote, 1000 (stored before the kill) is gone: retuned
    tier3 = TieredIndex(jitkey.DiskIndex(tmp_path / "h3"), fast_remote(server.url))
    at3, gpu3 = _tuner(tier3)
    assert at3[(1,)](*_args(4000)) == 256 and gpu3.bench_calls == 0
    assert at3[(1,)](*_args(1000)) == 256 and gpu3.bench_calls == 3
    assert tier3.stats()["remote_hits"] == 1 and tier3.stats()["remote_errors"] == 0
    assert remote_warnings(record)  # the outage was reported
    for t in (tier, tier2, tier3):
        t.close()


def test_sigkill_during_traffic(
    server: RedisServer, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    """A thread keeps doing get-or-put of new keys while the server is killed and restarted under it."""
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "h"), fast_remote(server.url))
    stop = threading.Event()
    problems: list[str] = []
    acked: list[tuple[int, int]] = []  # (key, generation of the server that acknowledged it)
    generation = [0]

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            key = ("traffic", i)
            try:
                got = tier.get(key)
                if got is not None:
                    problems.append(f"new key {i} had a value {got[:8]!r}")
                gen = generation[0]
                if tier.put(key, rw.value_for(i)) and generation[0] == gen:
                    acked.append((i, gen))
            except BaseException as exc:
                problems.append(repr(exc))
            i += 1

    def wait_for(what: str, cond: Any) -> None:  # a bound against a hang, not a timing assertion
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline and thread.is_alive(), (
                f"gave up waiting for {what}: {problems}"
            )
            time.sleep(0.01)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_for("50 acknowledged puts", lambda: len(acked) >= 50)
        server.kill()
        wait_for("the thread to meet the dead server", lambda: tier.remote.stats()["errors"] >= 1)
        generation[0] = 1
        server.start()
        wait_for("50 puts acknowledged by the restarted server", lambda: sum(g for _, g in acked) >= 50)
    finally:
        stop.set()
        thread.join()
    assert problems == []
    fresh = RemoteIndex(server.url)
    for i, gen in acked:
        assert tier.local.get(("traffic", i)) == rw.value_for(i)
        if gen == 1:  # acknowledged by the restarted server: readable from another host, exact bytes
            assert fresh.get(("traffic", i)) == rw.value_for(i), i
    st = tier.stats()
    assert st["remote_errors"] >= 1 and st["remote_puts"] >= 100 and st["remote_rejects"] == 0
    assert remote_warnings(record)
    tier.close()


def test_paused_server_times_out_then_recovers(
    server: RedisServer, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    remote = fast_remote(server.url)
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "h"), remote)
    assert tier.put(("before",), b"1") is True
    other = fast_remote(server.url)
    assert other.get(("before",)) == b"1"
    server.pause()  # SIGSTOP: the kernel still accepts connections, nothing answers
    try:
        assert other.get(("before",)) is None  # times out: a miss
        assert other.get(("before",)) is None  # in back-off: skipped without waiting
        st = other.stats()
        assert st["timeouts"] == 1 and st["skipped"] == 1 and st["state"] == "backoff"
        assert tier.get(("before",)) == b"1"  # the local tier still answers
        assert tier.put(("during",), b"2") is False and tier.get(("during",)) == b"2"
        wait_past_backoff(other)
        assert other.get(("before",)) is None  # times out again: the back-off doubles
        assert other.stats()["timeouts"] == 2 and other.stats()["consecutive_failures"] == 2
        assert any("Timeout" in m for m in remote_warnings(record))
    finally:
        server.resume()
    wait_past_backoff(other)
    assert other.get(("before",)) == b"1"  # recovered, same server, data intact
    assert other.stats()["state"] == "ok" and other.stats()["consecutive_failures"] == 0
    tier.close()
    other.close()


# ---------------------------------------------------------------------------------------------------------
# Bad remote data: every kind is a miss, never a wrong value
# ---------------------------------------------------------------------------------------------------------


def _envelope(remote: RemoteIndex, key: object, value: bytes) -> tuple[bytes, bytes]:
    rkey = remote.redis_key(key)
    return rkey, remote._seal(rkey, jitkey.digest(key), value)


def _bad_values(good: RemoteIndex, key: object) -> dict[str, Any]:
    _, env = _envelope(good, key, b"good value")
    _, other_key_env = _envelope(good, ("another key",), b"evil")
    hdr = struct.Struct("<4sB3s32sI")
    magic, flag, res, kd, n = hdr.unpack_from(env)
    return {
        "garbage": b"\x00garbage\xff" * 3,
        "pickle": b"\x80\x04\x95" + b"cos\nsystem\n" * 4,
        "empty-envelope": env[: hdr.size],
        "truncated": env[:-5],
        "truncated-value": env[: hdr.size + 3] + env[-16:],
        "extended": env + b"x",
        "foreign-key-copied": other_key_env,  # a valid envelope of another key under this key
        "future-format": b"JKR\x02" + env[4:],
        "bad-reserved": env[:5] + b"\x01\x00\x00" + env[8:],
        "flipped-byte": env[:-20] + bytes([env[-20] ^ 1]) + env[-19:],
        "length-lies": hdr.pack(magic, flag, res, kd, n + 1) + env[hdr.size :],
        "oversize": hdr.pack(magic, flag, res, kd, 70000) + b"y" * 70000 + b"t" * 16,
        "hmac-signed": _envelope(RemoteIndex(good.url, secret=b"team secret"), key, b"signed")[1],
    }


def test_bad_remote_data_is_a_miss(
    server: RedisServer, raw: Any, record: list[warnings.WarningMessage]
) -> None:
    remote = RemoteIndex(server.url)
    key = ("victim",)
    bad = _bad_values(remote, key)
    for i, (name, value) in enumerate(bad.items()):
        raw.set(remote.redis_key(key), value)
        assert remote.get(key) is None, name
        assert remote.stats()["rejects"] == i + 1, name
    raw.delete(remote.redis_key(key))
    raw.rpush(remote.redis_key(key), b"a list")  # WRONGTYPE
    assert remote.get(key) is None and remote.stats()["rejects"] == len(bad) + 1
    assert remote.stats()["errors"] == 0 and remote.stats()["state"] == "ok"  # bad data is no outage
    # foreign keys under the namespace are never read as ours; the good value still works
    raw.set(b"jitkey:r1:default:not-a-digest", b"junk")
    raw.delete(remote.redis_key(key))
    assert remote.put(key, b"good value") and remote.get(key) == b"good value"
    assert len(remote_warnings(record)) >= 5  # one per distinct cause, each naming it
    assert any("another key" in m for m in remote_warnings(record))


def test_hmac_rejects_unsigned_and_foreign_secrets(
    server: RedisServer, record: list[warnings.WarningMessage]
) -> None:
    team = RemoteIndex(server.url, namespace="t", secret=b"team secret")
    attacker = RemoteIndex(server.url, namespace="t", secret=b"guess")
    unsigned = RemoteIndex(server.url, namespace="t")
    key = ("kernel", 1)
    assert attacker.put(key, b"poison") and team.get(key) is None  # wrong HMAC
    assert unsigned.put(key, b"poison") and team.get(key) is None  # no HMAC at all
    assert team.stats()["rejects"] == 2
    assert team.put(key, b"good") and team.get(key) == b"good"
    assert unsigned.get(key) is None  # a reader without the secret cannot verify: a miss
    assert any("wrong HMAC" in m for m in remote_warnings(record))
    # the tag covers the namespace: the same envelope moved to another namespace is rejected
    moved = RemoteIndex(server.url, namespace="u", secret=b"team secret")
    import redis

    r = redis.Redis.from_url(server.url)
    r.set(moved.redis_key(key), r.get(team.redis_key(key)))
    assert moved.get(key) is None and moved.stats()["rejects"] == 1
    r.close()


def test_bad_payload_through_the_remote_retunes(server: RedisServer, raw: Any, tmp_path: Path) -> None:
    """A well-formed envelope whose payload is not the autotuner's schema: the autotuner rejects it."""
    remote = RemoteIndex(server.url)
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "h"), remote)
    at, gpu = _tuner(tier)
    key = at.disk_key(*_args(1000))
    remote.put(key, b'{"schema": "other.tool", "v": 1, "index": 0}')
    assert at[(1,)](*_args(1000)) == 256 and gpu.bench_calls == 3
    assert at.cache_stats()["disk_rejects"] == 1 and at.cache_stats()["tunings"] == 1
    tier.close()


# ---------------------------------------------------------------------------------------------------------
# Concurrency: 8 processes x 2 hosts
# ---------------------------------------------------------------------------------------------------------


def _hammer(server: RedisServer, tmp_path: Path, procs: int, keys_per_proc: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    go = tmp_path / "go"
    jobs = []
    with ProcessPoolExecutor(2 * procs, mp_context=ctx) as pool:
        for host in (1, 2):
            for p in range(procs):
                # overlapping ranges: each key is written by up to 4 processes on both hosts
                start = (p * keys_per_proc) // 2
                keys = list(range(start, start + keys_per_proc))
                jobs.append(pool.submit(rw.hammer, str(tmp_path / f"host{host}"), server.url, keys, str(go)))
        time.sleep(0.5)
        go.touch()
        results = [j.result(timeout=240) for j in jobs]
    acked = {k for r in results for k in r["acked"]}
    assert all(r["wrong"] == [] for r in results), [r["wrong"] for r in results]
    assert all(r["stats"]["remote_errors"] == r["stats"]["remote_timeouts"] == 0 for r in results)
    assert sum(r["hits"] for r in results) > 0 and len(acked) > keys_per_proc
    # every acknowledged value: exact bytes from a fresh host (remote) and from both hosts' local tiers
    fresh = RemoteIndex(server.url)
    for k in sorted(acked):
        assert fresh.get(("hammer", k)) == rw.value_for(k), k
    for host in (1, 2):  # a put goes to the local tier first: each host holds what its processes acked
        with jitkey.DiskIndex(tmp_path / f"host{host}") as ix:
            for r in results[(host - 1) * procs : host * procs]:
                for k in r["acked"]:
                    assert ix.get(("hammer", k)) == rw.value_for(k), (host, k)
    assert fresh.stats()["rejects"] == 0


def test_concurrent_hosts_every_acknowledged_value_exact(server: RedisServer, tmp_path: Path) -> None:
    _hammer(server, tmp_path, procs=8, keys_per_proc=150)


@pytest.mark.slow
def test_concurrent_hosts_soak(server: RedisServer, tmp_path: Path) -> None:
    _hammer(server, tmp_path, procs=8, keys_per_proc=3000)


# ---------------------------------------------------------------------------------------------------------
# The bench CLI's remote section
# ---------------------------------------------------------------------------------------------------------


def test_bench_cli_remote_section(server: RedisServer, tmp_path: Path) -> None:
    """``python -m jitkey bench --only remote`` starts its own server, checks every case and reports them."""
    import json
    import subprocess

    js = tmp_path / "remote.json"
    proc = subprocess.run(
        [sys.executable, "-m", "jitkey", "bench", "--quick", "--only", "remote", "--json", str(js)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {(r["group"], r["impl"]): r for r in json.loads(js.read_text())["results"]}
    impls = {impl for _, impl in rows}
    assert {"jitkey RemoteIndex.get", "redis-py GET (same bytes)", "jitkey RemoteIndex.put"} <= impls
    assert {"jitkey TieredIndex.get", "jitkey DiskIndex.get"} <= impls
    assert ("remote get hit (256 B)", "triton RedisRemoteCacheBackend.get") in rows
    assert all(r["median_ns"] > 0 for r in rows.values())
    assert "== remote ==" in proc.stdout
