"""The Redis tier against a hostile server (tests/_fake_redis.py: RESP over loopback) and careless configuration.

What a wrong port, a proxy or a compromised cache host can answer: replies that never end, trickle, announce
gigabytes, have the wrong type or no valid type at all, at any step (handshake, GETRANGE, SET, DEL). Every one
must be a miss or a no-op with a warning, within the operation's deadline, with bounded memory; never an
exception into the caller. Also: timeouts validated at construction, secrets redacted everywhere, and
``TieredIndex`` puts that never raise after the local store. Needs the ``redis`` client (URL parsing) only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import jitkey
from jitkey.errors import RemoteCacheWarning, RemoteConfigError, ValueTooLargeError

pytest.importorskip("redis")
# Every failure warns once per cause; tests that check the warnings record them (the `record` fixture).
pytestmark = pytest.mark.filterwarnings("ignore::jitkey.errors.RemoteCacheWarning")

from jitkey.remote import RemoteIndex, TieredIndex  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fake_redis import Action, Close, FakeRedis, Stall, Stream, Trickle, store  # noqa: E402
from test_remote import fast_remote as fast  # noqa: E402


def hostile(overrides: dict[bytes, Action], base: Callable[[list[bytes]], bytes] | None = None) -> Any:
    """``store()`` except that the commands named in ``overrides`` get that action."""
    good = base or store()

    def respond(cmd: list[bytes]) -> Action:
        name = cmd[0].upper()
        return overrides[name] if name in overrides else good(cmd)

    return respond


@pytest.fixture
def record() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def past_backoff(remote: RemoteIndex) -> None:
    """Ends the current back-off now, so the next call goes to the server (its counters stay)."""
    remote._skip_until = 0.0


def remote_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RemoteCacheWarning)]


def test_the_fake_server_speaks_resp_to_the_client() -> None:
    """The well-behaved script works: what the hostile cases break is the protocol, not the harness."""
    with FakeRedis(store()) as srv:
        remote = RemoteIndex(srv.url.replace("redis://", "redis://u:pw@").replace("/0", "/3"))
        assert remote.get(("k",)) is None and remote.put(("k",), b"v") is True
        assert remote.get(("k",)) == b"v" and ("k",) in remote
        assert remote.put_many({("a", i): b"%d" % i for i in range(5)}) is True
        assert remote.delete(("k",)) is True and remote.delete(("k",)) is False
        st = remote.stats()
        assert st["errors"] == st["timeouts"] == st["rejects"] == 0 and st["puts"] == 6, st
        assert srv.stats.commands[:2] == [[b"AUTH", b"u", b"pw"], [b"SELECT", b"3"]]
        remote.close()


# ---------------------------------------------------------------------------------------------------------
# One deadline per operation
# ---------------------------------------------------------------------------------------------------------


def test_a_trickled_reply_cannot_stretch_a_get_past_its_deadline(
    record: list[warnings.WarningMessage],
) -> None:
    """A valid value sent a byte every 20 ms: each read is quick, the whole is far past the deadline."""
    respond = store()
    with FakeRedis(respond) as srv:
        writer = RemoteIndex(srv.url)
        assert writer.put(("k",), b"the value")
        full = respond([b"GETRANGE", writer.redis_key(("k",)), b"0", b"100000"])
        srv.respond = hostile({b"GETRANGE": Trickle(full, every=0.02)}, respond)
        remote = fast(srv.url)
        assert remote.get(("k",)) is None  # a miss: the deadline passed before the reply was complete
        st = remote.stats()
        assert st["timeouts"] == 1 and st["hits"] == 0, st
        assert any("TimeoutError" in m for m in remote_warnings(record))


def test_put_many_has_one_deadline_not_one_per_reply() -> None:
    """Every reply comes within the timeout of the one before; together they take longer."""
    with FakeRedis(hostile({b"SET": Stall(0.12, b"+OK\r\n")})) as srv:
        remote = fast(srv.url, timeout=0.3)
        assert remote.put_many({("p", i): b"v" for i in range(5)}) is False
        st = remote.stats()
        assert st["timeouts"] == 1 and st["puts"] == 0 and st["put_failures"] == 5, st


def test_a_slow_handshake_is_inside_the_deadline() -> None:
    """The AUTH reply trickles: connecting and the handshake count against the operation's deadline."""
    with FakeRedis(hostile({b"AUTH": Trickle(b"+OK\r\n", every=0.1)})) as srv:
        remote = fast(srv.url.replace("redis://", "redis://:pw@"))
        assert remote.get(("k",)) is None
        assert remote.stats()["timeouts"] == 1, remote.stats()


def test_a_huge_bulk_reply_is_refused_before_it_is_buffered() -> None:
    """A server announcing 4 GB and streaming it: refused on the header, with bounded memory."""
    with FakeRedis(hostile({b"GETRANGE": Stream(b"$4000000000\r\n")})) as srv:
        remote = fast(srv.url, timeout=5.0)
        tracemalloc.start()
        try:
            assert remote.get(("k",)) is None
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        st = remote.stats()
        assert st["errors"] == 1 and "ProtocolError" in st["last_error"], st
        assert peak < 4 << 20, peak  # one recv buffer, not the announced length


def test_a_bulk_reply_over_the_value_bound_is_refused_unread() -> None:
    body = b"y" * 200
    with FakeRedis(hostile({b"GETRANGE": b"$200\r\n" + body + b"\r\n"})) as srv:
        remote = fast(srv.url, max_value=100)
        assert remote.get(("k",)) is None
        assert "ProtocolError" in remote.stats()["last_error"]


# ---------------------------------------------------------------------------------------------------------
# Malformed replies: a miss or a no-op, never an exception
# ---------------------------------------------------------------------------------------------------------

NOT_A_BULK = {
    "integer": b":1\r\n",
    "float": b",1.5\r\n",
    "bool": b"#t\r\n",
    "array": b"*1\r\n$3\r\nabc\r\n",
    "deep-nesting": b"*1\r\n" * 200_000 + b":1\r\n",
    "push-flood": b">2\r\n+a\r\n+b\r\n" * 50_000,
    "empty-push": b">0\r\n",
    "resp3-null": b"_\r\n",
    "map": b"%1\r\n+a\r\n+b\r\n",
    "set": b"~1\r\n+a\r\n",
    "attribute": b"|1\r\n+a\r\n+b\r\n$0\r\n\r\n",
    "big-number": b"(12345678901234567890\r\n",
    "blob-error": b"!3\r\nerr\r\n",
    "verbatim": b"=7\r\ntxt:abc\r\n",
    "status": b"+OK\r\n",
    "bad-length": b"$abc\r\n",
    "negative-length": b"$-2\r\n",
    "signed-length": b"$+3\r\nabc\r\n",
    "padded-length": b"$03\r\nabc\r\n",
    "length-overflow": b"$99999999999999999999999\r\n",
    "unterminated-bulk": b"$3\r\nabcXY",
    "empty-line": b"\r\n",
    "endless-line": Stream(b"+", b"x" * 4096),
    "truncated-then-closed": Close(b"$50\r\nabc"),
    "closed": Close(),
}
NOT_OK = {
    "integer": b":1\r\n",
    "bulk-OK": b"$2\r\nOK\r\n",
    "queued": b"+QUEUED\r\n",
    "lowercase-ok": b"+ok\r\n",
    "resp3-null": b"_\r\n",
    "array": b"*1\r\n+OK\r\n",
    "bool": b"#t\r\n",
}
NOT_AN_INT = {
    "bulk": b"$1\r\n1\r\n",
    "count-too-big": b":5\r\n",
    "negative": b":-1\r\n",
    "status": b"+OK\r\n",
    "float": b",1\r\n",
    "bad-number": b":1x\r\n",
}
BAD_HANDSHAKE = {
    "integer": b":1\r\n",
    "empty-array": b"*0\r\n",
    "nil": b"$-1\r\n",
    "pong": b"+PONG\r\n",
    "garbage": b"garbage\r\n",
    "empty-push": b">0\r\n",
}


def _no_exception(op: Callable[[], Any]) -> Any:
    try:
        return op()
    except Exception as exc:  # the test's point: name what escaped
        pytest.fail(f"{type(exc).__name__} escaped: {exc}")


@pytest.mark.parametrize("name", list(NOT_A_BULK))
def test_get_in_and_tiered_get_survive_a_reply_that_is_not_a_bulk_string(
    name: str, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    with FakeRedis(hostile({b"GETRANGE": NOT_A_BULK[name]})) as srv:
        remote = fast(srv.url)
        tier = TieredIndex(jitkey.DiskIndex(tmp_path / "ix"), fast(srv.url))
        assert _no_exception(lambda: remote.get(("k",))) is None
        past_backoff(remote)
        assert _no_exception(lambda: ("k",) in remote) is False
        assert _no_exception(lambda: tier.get(("k",))) is None
        st = remote.stats()
        assert st["errors"] + st["timeouts"] == 2 and st["hits"] == 0, st
        assert tier.stats()["remote_errors"] + tier.stats()["remote_timeouts"] == 1
        assert remote_warnings(record)
        tier.close()


@pytest.mark.parametrize("name", list(NOT_OK))
def test_a_set_is_acknowledged_only_by_ok(name: str) -> None:
    with FakeRedis(hostile({b"SET": NOT_OK[name]})) as srv:
        remote = fast(srv.url)
        assert _no_exception(lambda: remote.put(("k",), b"v")) is False
        past_backoff(remote)
        assert _no_exception(lambda: remote.put_many({("a", i): b"v" for i in range(3)})) is False
        st = remote.stats()
        assert st["puts"] == 0 and st["put_failures"] == 4 and st["errors"] == 2, st


@pytest.mark.parametrize("name", list(NOT_AN_INT))
def test_delete_survives_a_reply_that_is_not_its_count(name: str) -> None:
    with FakeRedis(hostile({b"DEL": NOT_AN_INT[name]})) as srv:
        remote = fast(srv.url)
        assert _no_exception(lambda: remote.delete(("k",))) is False
        assert remote.stats()["errors"] == 1


@pytest.mark.parametrize("name", list(BAD_HANDSHAKE))
def test_a_malformed_handshake_reply_fails_every_call_quietly(name: str, tmp_path: Path) -> None:
    with FakeRedis(hostile({b"AUTH": BAD_HANDSHAKE[name]})) as srv:
        remote = fast(srv.url.replace("redis://", "redis://:pw@"))
        for _ in range(3):  # each call reconnects and fails the same way (no half-set-up connection)
            assert _no_exception(lambda: remote.get(("k",))) is None
            past_backoff(remote)
            assert _no_exception(lambda: remote.put(("k",), b"v")) is False
            past_backoff(remote)
            assert _no_exception(lambda: remote.delete(("k",))) is False
            past_backoff(remote)
        assert remote.stats()["errors"] == 9 and remote.stats()["puts"] == 0


def test_an_error_reply_to_select_is_a_server_error() -> None:
    with FakeRedis(hostile({b"SELECT": b"-ERR DB index is out of range\r\n"})) as srv:
        remote = fast(srv.url.replace("/0", "/7"))
        assert remote.get(("k",)) is None
        st = remote.stats()
        assert st["errors"] == 1 and "out of range" in st["last_error"], st


def test_hostile_error_text_is_bounded_and_printable(record: list[warnings.WarningMessage]) -> None:
    with FakeRedis(hostile({b"GETRANGE": b"-ERR \x1b[31m" + b"A" * 4000 + b"\r\n"})) as srv:
        remote = fast(srv.url)
        assert remote.get(("k",)) is None
        err = remote.stats()["last_error"]
        assert "\x1b" not in err and len(err) < 400, err


# ---------------------------------------------------------------------------------------------------------
# Configuration: timeouts validated at construction, wherever they come from
# ---------------------------------------------------------------------------------------------------------

BAD_SECONDS = ["-1", "0", "nan", "inf", "-inf", "1e300", "61"]


@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize("option", ["socket_timeout", "socket_connect_timeout"])
def test_bad_timeouts_in_the_url_are_config_errors(option: str, value: str) -> None:
    with pytest.raises(RemoteConfigError, match=option) as info:
        RemoteIndex(f"redis://127.0.0.1:1/0?{option}={value}")
    assert isinstance(info.value, ValueError) and "URL" in str(info.value)


@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize(
    "var", ["JITKEY_REMOTE_TIMEOUT", "JITKEY_REMOTE_CONNECT_TIMEOUT", "JITKEY_REMOTE_BACKOFF"]
)
def test_bad_timeouts_in_the_environment_are_config_errors(
    var: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if var == "JITKEY_REMOTE_BACKOFF" and value == "61":
        value = "1e6"  # a back-off may be long, within a day
    monkeypatch.setenv(var, value)
    with pytest.raises(RemoteConfigError) as info:
        RemoteIndex("redis://127.0.0.1:1/0")
    assert var in str(info.value) and value in str(info.value)


@pytest.mark.parametrize(
    ("kw", "value"),
    [
        ("timeout", float("inf")),
        ("timeout", float("nan")),
        ("timeout", 10**400),
        ("timeout", -0.5),
        ("timeout", "0.1"),
        ("timeout", True),
        ("connect_timeout", float("inf")),
        ("connect_timeout", 1e300),
        ("backoff", float("nan")),
        ("backoff_max", float("inf")),
        ("ttl", float("inf")),
        ("ttl", float("nan")),
        ("ttl", 1e300),
    ],
)
def test_bad_timeout_arguments_are_config_errors(kw: str, value: object) -> None:
    with pytest.raises(RemoteConfigError, match=kw) as info:
        RemoteIndex("redis://127.0.0.1:1/0", **{kw: value})
    assert repr(value) in str(info.value)


def test_good_timeouts_from_every_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITKEY_REMOTE_TIMEOUT", "0.3")
    r = RemoteIndex("redis://127.0.0.1:1/0?socket_connect_timeout=0.7", backoff=2, ttl=60)
    st = r.stats()
    assert (st["timeout_s"], st["connect_timeout_s"]) == (0.3, 0.7)
    assert RemoteIndex("redis://127.0.0.1:1/0?socket_timeout=1.5", timeout=0.1).stats()["timeout_s"] == 1.5


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis://127.0.0.1:1/0?bogus=1", "unsupported URL option 'bogus'"),
        ("redis://127.0.0.1:1/0?ssl_cert_reqs=none", "rediss://"),
        ("rediss://127.0.0.1:1/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("rediss://127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem", "TLS"),
        ("redis://127.0.0.1:1/0?db=-1", "db"),
        ("redis://127.0.0.1:99999/0", "cannot use remote cache URL"),
    ],
)
def test_url_options_are_checked_at_construction(url: str, match: str) -> None:
    with pytest.raises(RemoteConfigError, match=match):
        RemoteIndex(url)


# ---------------------------------------------------------------------------------------------------------
# Secrets never shown
# ---------------------------------------------------------------------------------------------------------

SECRET = "hunter2"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://:{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://127.0.0.1:{{port}}/0?password={SECRET}",
        "redis://user:hun%74er2@127.0.0.1:{port}/0",
        f"redis://user:{SECRET}@[::1]:{{port}}/0",
    ],
)
def test_secrets_are_redacted_everywhere_a_url_is_shown(
    url: str, tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    from jitkey._redis_server import _free_port

    url = url.format(port=_free_port())  # nothing listens: every call fails and warns
    remote = fast(url, secret="s3cr3t-hmac")
    tier = TieredIndex(jitkey.DiskIndex(tmp_path / "ix"), remote)
    assert remote.get(("k",)) is None and remote.put(("k",), b"v") is False
    shown = [
        repr(remote),
        remote.url,
        str(remote.stats()),
        repr(tier),
        str(tier.stats()),
        *remote_warnings(record),
    ]
    assert remote_warnings(record) and remote.stats()["last_error"]
    for text in shown:
        assert SECRET not in text and "s3cr3t-hmac" not in text, text
    tier.close()


def test_secrets_are_redacted_in_config_errors() -> None:
    with pytest.raises(RemoteConfigError) as info:
        RemoteIndex(f"redis://user:{SECRET}@127.0.0.1:1/0?socket_timeout=nan&bogus=1")
    assert SECRET not in str(info.value)
    with pytest.raises(RemoteConfigError) as info:
        RemoteIndex(f"redis://user:{SECRET}@127.0.0.1:1/0?bogus={SECRET}")
    assert SECRET not in str(info.value)


def test_jitkey_info_redacts_the_remote_url_and_secret() -> None:
    env = dict(
        os.environ,
        JITKEY_REMOTE_CACHE=f"redis://user:{SECRET}@cache-host:6379/0",
        JITKEY_REMOTE_SECRET="team-s3cr3t",
    )
    for args in (["info"], ["info", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "jitkey", *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr and "team-s3cr3t" not in proc.stdout + proc.stderr
        assert "cache-host" in proc.stdout
    doc = json.loads(proc.stdout)
    assert doc["env"]["JITKEY_REMOTE_CACHE"] == "redis://user:***@cache-host:6379/0"


# ---------------------------------------------------------------------------------------------------------
# TieredIndex puts: caller errors before the local store, nothing raises after it
# ---------------------------------------------------------------------------------------------------------


def test_tiered_put_over_the_remote_bound_is_stored_locally_and_never_raises(
    tmp_path: Path, record: list[warnings.WarningMessage]
) -> None:
    with FakeRedis(store()) as srv:
        tier = TieredIndex(jitkey.DiskIndex(tmp_path / "ix"), fast(srv.url, max_value=100))
        assert _no_exception(lambda: tier.put(("big",), b"x" * 200)) is False
        assert tier.local.get(("big",)) == b"x" * 200 and tier.remote.get(("big",)) is None
        batch = {("b", 0): b"x" * 10, ("b", 1): b"x" * 500, ("b", 2): b"x" * 20}
        assert _no_exception(lambda: tier.put_many(batch)) is False
        assert [tier.remote.get(("b", i)) for i in range(3)] == [b"x" * 10, None, b"x" * 20]
        assert all(tier.local.get(k) == v for k, v in batch.items())
        st = tier.stats()
        assert st["remote_put_failures"] == 2 and st["remote_puts"] == 2, st
        assert sum("local index only" in m for m in remote_warnings(record)) == 1  # once per cause
        # caller mistakes still raise, and before anything is stored
        with pytest.raises(ValueTooLargeError):
            tier.put(("huge",), b"x" * (jitkey.DiskIndex.MAX_VALUE + 1))
        with pytest.raises(TypeError):
            tier.put_many([(("ok",), b"v"), (("bad",), "not bytes")])  # type: ignore[list-item]
        assert tier.local.get(("ok",)) is None and tier.remote.get(("ok",)) is None
        tier.close()


def test_bytes_nobody_asked_for_end_the_connection() -> None:
    """Two replies to one GETRANGE: the second would be read as the next command's (an acknowledged SET that
    was never one); the connection is dropped instead."""
    respond = store()
    with FakeRedis(respond) as srv:
        remote = fast(srv.url)
        assert remote.put(("k",), b"v")
        full = respond([b"GETRANGE", remote.redis_key(("k",)), b"0", b"100000"])
        srv.respond = hostile({b"GETRANGE": full + b"+OK\r\n"}, respond)
        assert remote.get(("k",)) is None
        st = remote.stats()
        assert st["errors"] == 1 and "after the last reply" in st["last_error"], st
        past_backoff(remote)
        srv.respond = hostile({b"SET": b"-ERR not stored\r\n"}, respond)
        assert remote.put(("other",), b"x") is False  # the stray +OK was never taken as its answer
