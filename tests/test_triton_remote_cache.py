"""Triton's compile cache on the Redis tier (jitkey.triton.remote_cache, issue 27), against a real redis-server.

Each "host" is a spawned process with its own ``TRITON_CACHE_DIR`` compiling ``add`` for an sm_90 target with
``triton.compile`` (compile-only, so on the CPU); Triton's compilation listener says whether a compile was a cache
hit. The GPU half (a kernel compiled on host 1 runs correctly on host 2, time to first launch) is
``scripts/gpu_remote_compile.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("redis")

from jitkey._redis_server import RedisServer  # noqa: E402
from jitkey.errors import RemoteCacheWarning  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _compile_workers as cw  # noqa: E402

SECRET = "team-secret"


def host(
    tmp_path: Path, name: str, env: dict[str, str], blocks: list[int], install: bool = True
) -> dict[str, Any]:
    """One host: a fresh process and its own Triton cache directory."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(cw.compile_on_host, str(tmp_path / name), env, blocks, install).result(timeout=600)


def tier_env(url: str, **extra: str) -> dict[str, str]:
    return {"JITKEY_REMOTE_CACHE": url, "JITKEY_REMOTE_COMPILE_TIMEOUT": "1", **extra}


def test_host_2_compiles_nothing_host_1_compiled(server: RedisServer, tmp_path: Path) -> None:
    env = tier_env(server.url, JITKEY_REMOTE_SECRET=SECRET)
    h1 = host(tmp_path, "host1", env, [64, 128])
    assert h1["hits"] == [False, False] and h1["state"]["on"] and h1["state"]["wired"], h1
    assert h1["stats"]["puts"] >= 2 * 8 and h1["stats"]["put_failures"] == 0, h1["stats"]
    assert h1["warnings"] == []
    h2 = host(tmp_path, "host2", env, [64, 128, 256])
    assert h2["hits"] == [True, True, False], h2  # 256 is new: compiled (and shared) by host 2
    assert h2["cubins"][:2] == h1["cubins"]  # the very binaries host 1 compiled
    assert h2["stats"]["hits"] >= 2 * 8 and h2["stats"]["remote_rejects"] == 0, h2["stats"]
    # the remote hit was written into host 2's local cache: a third run there touches no remote
    h2b = host(
        tmp_path, "host2", tier_env("redis://127.0.0.1:1/0", JITKEY_REMOTE_SECRET=SECRET), [64, 128, 256]
    )
    assert h2b["hits"] == [True, True, True] and h2b["stats"]["hits"] == h2b["stats"]["misses"] == 0, h2b


def test_forged_and_damaged_artifacts_are_never_loaded(server: RedisServer, raw: Any, tmp_path: Path) -> None:
    # an attacker who can write to the server but has another secret (or none, with the opt-in)
    for i, attacker_env in enumerate(
        [{"JITKEY_REMOTE_SECRET": "guessed"}, {"JITKEY_REMOTE_COMPILE_UNSIGNED": "1"}]
    ):
        host(tmp_path, f"attacker{i}", tier_env(server.url, **attacker_env), [64])
    team = host(tmp_path, "team1", tier_env(server.url, JITKEY_REMOTE_SECRET=SECRET), [64])
    assert team["hits"] == [False] and team["stats"]["remote_rejects"] >= 1, team["stats"]
    assert team["stats"]["hits"] == 0
    # damage every value team1 stored (a flipped byte in each): a miss, a local compile, the same binary
    keys = [k for k in raw.keys(b"jitkey:r1:default.triton-*") if raw.type(k) == b"string"]
    assert keys
    for k in keys:
        v = bytearray(raw.get(k))
        v[len(v) // 2] ^= 0x40
        raw.set(k, bytes(v))
    team2 = host(tmp_path, "team2", tier_env(server.url, JITKEY_REMOTE_SECRET=SECRET), [64])
    assert team2["hits"] == [False] and team2["cubins"] == team["cubins"], team2
    assert team2["stats"]["remote_rejects"] >= 1 and team2["stats"]["hits"] == 0, team2["stats"]


def test_without_a_secret_nothing_is_read_or_written_unless_opted_in(
    server: RedisServer, raw: Any, tmp_path: Path
) -> None:
    h = host(tmp_path, "nosecret", tier_env(server.url), [64])
    assert h["hits"] == [False] and h["stats"]["refused"] >= 1 and not h["state"]["on"], h
    assert raw.dbsize() == 0  # nothing written either
    assert len([w for w in h["warnings"] if "JITKEY_REMOTE_SECRET" in w]) == 1, h["warnings"]
    opt_in = tier_env(server.url, JITKEY_REMOTE_COMPILE_UNSIGNED="1")
    host(tmp_path, "unsigned1", opt_in, [64])
    h2 = host(tmp_path, "unsigned2", opt_in, [64])
    assert h2["hits"] == [True], h2


def test_failures_of_the_tier_degrade_to_local_compiles(server: RedisServer, tmp_path: Path) -> None:
    env = tier_env(server.url, JITKEY_REMOTE_SECRET=SECRET, JITKEY_REMOTE_COMPILE_TIMEOUT="0.3")
    host(tmp_path, "host1", env, [64])
    server.pause()  # SIGSTOP: connections accepted, nothing answers
    try:
        paused = host(tmp_path, "paused", env, [64, 128])
    finally:
        server.resume()
    assert paused["hits"] == [False, False], paused
    assert paused["stats"]["remote_timeouts"] >= 1 and any("Timeout" in w for w in paused["warnings"])
    server.kill()
    dead = host(tmp_path, "dead", env, [64])
    assert dead["hits"] == [False] and dead["stats"]["remote_errors"] >= 1, dead
    server.start()  # restarted, empty
    again = host(tmp_path, "again", env, [128])
    later = host(tmp_path, "later", env, [128])
    assert again["hits"] == [False] and later["hits"] == [True], (again, later)


def test_files_over_the_bound_stay_local(server: RedisServer, tmp_path: Path) -> None:
    env = tier_env(server.url, JITKEY_REMOTE_SECRET=SECRET, JITKEY_REMOTE_COMPILE_MAX_BYTES="4096")
    h1 = host(tmp_path, "host1", env, [64])
    assert h1["stats"]["put_failures"] >= 1 and any("kept local" in w for w in h1["warnings"]), h1
    h2 = host(tmp_path, "host2", env, [64])
    assert h2["hits"] == [False], h2  # a group is used whole or not at all


def test_tritons_own_remote_cache_manager_accepts_the_backend(server: RedisServer, tmp_path: Path) -> None:
    env = tier_env(
        server.url,
        JITKEY_REMOTE_SECRET=SECRET,
        TRITON_CACHE_MANAGER="triton.runtime.cache:RemoteCacheManager",
        TRITON_REMOTE_CACHE_BACKEND="jitkey.triton.remote_cache:RedisBackend",
    )
    h1 = host(tmp_path, "host1", env, [64], install=False)
    h2 = host(tmp_path, "host2", env, [64], install=False)
    assert h1["hits"] == [False] and h2["hits"] == [True], (h1, h2)
    assert h2["state"]["wired"] and "RemoteCacheManager" in h2["manager"]


def test_a_signed_manifest_naming_files_outside_the_cache_is_refused(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a manifest with a valid HMAC lists plain file names only: no path is ever written outside."""
    from jitkey.remote import RemoteIndex
    from jitkey.triton import remote_cache

    monkeypatch.setenv("JITKEY_REMOTE_CACHE", server.url)
    monkeypatch.setenv("JITKEY_REMOTE_SECRET", SECRET)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(remote_cache, "_shared", remote_cache._Shared())
    writer = RemoteIndex(server.url, namespace=remote_cache.namespace(), secret=SECRET, max_value=1 << 20)
    key = "K" * 52
    for names in (
        ["../../escaped.json"],
        ["ok.json", "/etc/passwd"],
        [],
        ["x.json"] * 2,
        ["a.so"],
        ["a"] * 65,
    ):
        writer.put(
            remote_cache._file_key(key, "__grp__add.json"), json.dumps({"child_paths": names}).encode()
        )
        for n in names:
            writer.put(remote_cache._file_key(key, n), b"{}")
        assert remote_cache.TieredCacheManager(key).get_group("add.json") is None, names
    assert not (tmp_path / "escaped.json").exists() and not list(tmp_path.rglob("escaped.json"))
    # a good manifest of verified files is materialized locally
    writer.put(
        remote_cache._file_key(key, "__grp__add.json"), json.dumps({"child_paths": ["add.json"]}).encode()
    )
    writer.put(remote_cache._file_key(key, "add.json"), b'{"name": "add"}')
    group = remote_cache.TieredCacheManager(key).get_group("add.json")
    assert group is not None and Path(group["add.json"]).read_bytes() == b'{"name": "add"}'
    assert Path(group["add.json"]).parent == tmp_path / "cache" / key


def test_install_wires_and_uninstall_restores_the_cache_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton import knobs

    import jitkey.triton as jt
    from jitkey.triton import remote_cache

    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    monkeypatch.setenv("JITKEY_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    was = jt.installed()
    jt.uninstall()
    try:
        jt.install()
        assert knobs.cache.manager_class is remote_cache.TieredCacheManager
        jt.uninstall()
        assert knobs.cache.manager_class is None
        # a manager the user configured stands
        monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:FileCacheManager")
        jt.install()
        assert knobs.cache.manager_class.__name__ == "FileCacheManager"
        jt.uninstall()
    finally:
        if was:
            jt.install()


@pytest.mark.cuda
def test_gpu_host_2_runs_what_host_1_compiled() -> None:
    """The GPU half: scripts/gpu_remote_compile.py (two hosts, a real kernel, results checked against torch)."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_remote_compile.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "host 2 compiled nothing host 1 compiled: True" in proc.stdout


def test_a_native_module_lookup_never_makes_the_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's driver builds its modules (cuda_utils, launchers) through the cache while it starts up: those
    names are never shared, so their lookups must not make the remote (which asks the driver for its target)."""
    from jitkey.triton import remote_cache

    made: list[int] = []
    monkeypatch.setattr(remote_cache, "_shared", remote_cache._Shared())
    monkeypatch.setattr(remote_cache, "_make_remote", lambda: made.append(1) or (None, "test"))
    backend = remote_cache.RedisBackend("K" * 52)
    assert backend.get(["cuda_utils.cpython-312-x86_64-linux-gnu.so"]) == {}
    assert backend.get(["ok.json", "launcher.so"]) == {}
    backend.put("cuda_utils.so", b"\x7fELF")
    assert made == []
    with pytest.warns(RemoteCacheWarning, match="off: test"):
        assert backend.get(["ok.json"]) == {}  # a shareable name does
    assert made == [1]


def test_the_remote_asked_again_while_it_is_made_is_a_miss_not_a_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making the remote asks Triton's driver for its target; a driver that starts up then may look up a file
    through this tier on the same thread: that lookup is a miss (it used to wait forever on the tier's lock)."""
    import threading
    import warnings

    from jitkey.triton import remote_cache

    nested: list[dict[str, bytes]] = []

    def make_remote() -> tuple[None, str]:
        nested.append(remote_cache.RedisBackend("K" * 52).get(["add.json"]))  # the re-entrant lookup
        return None, "test"

    monkeypatch.setattr(remote_cache, "_shared", remote_cache._Shared())
    monkeypatch.setattr(remote_cache, "_make_remote", make_remote)
    out: list[dict[str, bytes]] = []

    def lookup() -> None:
        with warnings.catch_warnings(record=True):  # the tier says once that it is off
            warnings.simplefilter("always")
            out.append(remote_cache.RedisBackend("K" * 52).get(["add.json"]))

    t = threading.Thread(target=lookup)
    t.daemon = True
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the lookup deadlocked"
    assert out == [{}] and nested == [{}]
    assert remote_cache._shared.made and remote_cache._shared.off_reason == "test"
