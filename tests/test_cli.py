"""The ``jitkey`` command: --version, info, cache (bench: tests/test_bench_cli.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import jitkey


def jk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jitkey", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_version() -> None:
    proc = jk("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"jitkey {jitkey.__version__}"


def test_console_script_names_itself_jitkey() -> None:
    script = shutil.which("jitkey", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no jitkey console script next to this interpreter (a develop install without scripts)")
    proc = subprocess.run([script, "bench", "--only", "nosuch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: jitkey bench" in proc.stderr, proc.stderr


def test_no_command_is_a_usage_error_listing_the_commands() -> None:
    proc = jk()
    assert proc.returncode == 2
    assert "info" in proc.stderr and "cache" in proc.stderr and "bench" in proc.stderr


def test_info_text_and_json_agree(tmp_path: Path) -> None:
    env = dict(os.environ, JITKEY_CACHE_DIR=str(tmp_path))
    text = jk("info", env=env)
    doc = json.loads(jk("info", "--json", env=env).stdout)
    assert text.returncode == 0, text.stderr
    assert doc["jitkey"] == jitkey.__version__ and f"jitkey {jitkey.__version__}" in text.stdout
    assert set(doc["fast_paths"]) >= {"cpython_layout", "tensor_fields", "native_launcher", "driver_launch"}
    for name, fp in doc["fast_paths"].items():
        assert fp["on"] in (True, False, None), name
        assert name in text.stdout
        if fp["on"] is not True:
            assert fp["why"], name  # off or unknown always says why
    assert doc["disk_index"]["directory"] == str(tmp_path) and doc["disk_index"]["exists"] is False
    assert doc["env"]["JITKEY_CACHE_DIR"] == str(tmp_path)
    assert f"JITKEY_CACHE_DIR={tmp_path}" in text.stdout


def test_info_reports_a_fast_path_forced_off() -> None:
    pytest.importorskip("torch")
    on = json.loads(jk("info", "--json").stdout)["fast_paths"]["tensor_fields"]
    off_proc = jk("info", "--json", env=dict(os.environ, JITKEY_TENSOR_FIELDS="0"))
    off = json.loads(off_proc.stdout)["fast_paths"]["tensor_fields"]
    assert on["on"] is True
    assert off == {**off, "on": False, "chosen": True}
    assert "JITKEY_TENSOR_FIELDS=0" in off["why"]
    text = jk("info", env=dict(os.environ, JITKEY_TENSOR_FIELDS="0")).stdout
    assert "tensor_fields    OFF" in text and "turned off by JITKEY_TENSOR_FIELDS=0" in text
    assert "WARNING" not in off_proc.stderr  # the user's choice: no warning


def test_info_reports_the_triton_binding_switched_to_plain() -> None:
    pytest.importorskip("triton")
    doc = json.loads(jk("info", "--json", env=dict(os.environ, JITKEY_TRITON="plain")).stdout)
    binding = doc["fast_paths"]["binding"]
    assert binding["on"] is False and "JITKEY_TRITON=plain" in binding["why"] and binding["chosen"] is True
    assert json.loads(jk("info", "--json").stdout)["fast_paths"]["binding"]["on"] is True


def test_without_torch_a_tensor_rule_names_the_package_and_the_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None  # torch not installed, as far as imports go\n"
        "import jitkey\n"
        "try:\n"
        "    jitkey.rules.tensor()\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("torch | jitkey.rules.tensor (a tensor parameter) needs torch")
    assert "pip install torch" in proc.stdout and "pip install 'jitkey[torch]'" in proc.stdout


def test_missing_torch_names_the_package_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from jitkey import _deps

    err = _deps.missing("torch", "jitkey.rules.tensor (a tensor parameter)")
    assert isinstance(err, ModuleNotFoundError) and err.name == "torch"
    assert "pip install torch" in str(err) and "jitkey[torch]" in str(err)
    assert "jitkey[triton]" in str(_deps.missing("triton", "jitkey.triton"))
    monkeypatch.delitem(sys.modules, "jitkey_no_such_module", raising=False)
    with pytest.raises(ModuleNotFoundError, match="needs jitkey_no_such_module"):
        _deps.require("jitkey_no_such_module", "a feature")


def _index_with_entries(d: Path, n: int) -> None:
    with jitkey.DiskIndex(d) as ix:
        ix.put_many([(("k", i), b"v" * 40) for i in range(n)])


def test_cache_info_on_an_empty_directory(tmp_path: Path) -> None:
    proc = jk("cache", "info", str(tmp_path))
    assert proc.returncode == 0 and "no index here yet" in proc.stdout
    assert not (tmp_path / "index.v1.jki").exists()  # looking does not create one


def test_cache_info_verify_compact_clear(tmp_path: Path) -> None:
    _index_with_entries(tmp_path, 10)
    with jitkey.DiskIndex(tmp_path) as ix:
        for i in range(5):
            ix.delete(("k", i))
    info = json.loads(jk("cache", "info", "--json", str(tmp_path)).stdout)
    assert info["entries"] == 5 and info["mode"] == "rw" and info["damaged_records"] == 0
    assert info["file_bytes"] > info["live_bytes"]
    assert jk("cache", "verify", str(tmp_path)).returncode == 0
    proc = jk("cache", "compact", str(tmp_path))
    assert proc.returncode == 0 and "5 entries" in proc.stdout
    after = json.loads(jk("cache", "info", "--json", str(tmp_path)).stdout)
    assert after["entries"] == 5 and after["file_bytes"] < info["file_bytes"]
    proc = jk("cache", "clear", str(tmp_path))
    assert proc.returncode == 0 and "cleared 5 entries" in proc.stdout
    assert json.loads(jk("cache", "info", "--json", str(tmp_path)).stdout)["entries"] == 0


def test_cache_defaults_to_the_default_directory(tmp_path: Path) -> None:
    _index_with_entries(tmp_path, 3)
    proc = jk("cache", "info", env=dict(os.environ, JITKEY_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0 and str(tmp_path) in proc.stdout
    assert [line.split() for line in proc.stdout.splitlines() if line.startswith("entries")] == [
        ["entries", "3"]
    ]


def test_cache_verify_finds_a_damaged_record(tmp_path: Path) -> None:
    _index_with_entries(tmp_path, 20)
    log = tmp_path / "index.v1.jki"
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip a byte inside some record
    log.write_bytes(bytes(data))
    proc = jk("cache", "verify", "--json", str(tmp_path))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["ok"] is False, proc.stdout
    # the damaged record is skipped, or (the scan stops there) the bytes after it are not served
    assert doc["damaged_records"] + doc["unvalidated_bytes"] > 0, proc.stdout
    text = jk("cache", "verify", str(tmp_path))
    assert text.returncode == 1 and "DAMAGED" in text.stdout


def test_cache_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    proc = jk("cache", "info", str(f))
    assert proc.returncode == 2 and "not a directory" in proc.stderr


# ---- issue 24: verify reads one committed snapshot; every user error is one line and a status ----------

_APPENDER = """
import sys, jitkey
ix = jitkey.DiskIndex(sys.argv[1])
i = int(sys.argv[2]) * 10_000_000
while True:
    ix.put_many([(("live", i + j), b"v" * (40 + (i + j) % 900)) for j in range(8)])
    i += 8
    if i % 4096 == 0:
        ix.compact()  # compactions too: a rename under the reader
"""


def test_verify_is_healthy_while_other_processes_append(tmp_path: Path) -> None:
    """Two processes append (and compact) without pause; every verify in the meantime is ok, exit 0,
    and no verdict ever advises a command that loses data."""
    _index_with_entries(tmp_path, 50)
    writers = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), str(w)], stderr=subprocess.DEVNULL)
        for w in range(2)
    ]
    try:
        runs = [jk("cache", "verify", "--json", str(tmp_path)) for _ in range(12)]
        assert all(w.poll() is None for w in writers), "an appender died"
    finally:
        for w in writers:
            w.kill()
            w.wait()
    verdicts = [(p.returncode, json.loads(p.stdout)) for p in runs]
    assert [rc for rc, _ in verdicts] == [0] * 12, [d for rc, d in verdicts if rc]
    for _, doc in verdicts:
        assert doc["ok"] is True and doc["locked"] is True and doc["unvalidated_bytes"] == 0
        assert "clear" not in doc["verdict"]


def test_a_damaged_index_verdict_never_advises_clear(tmp_path: Path) -> None:
    _index_with_entries(tmp_path, 20)
    log = tmp_path / "index.v1.jki"
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    text = jk("cache", "verify", str(tmp_path))
    assert text.returncode == 1 and "DAMAGED" in text.stdout
    assert "clear" not in text.stdout and "compact" in text.stdout


def test_verify_of_a_file_that_is_not_an_index_is_not_usable(tmp_path: Path) -> None:
    (tmp_path / "index.v1.jki").write_bytes(b"something else entirely" * 10)
    proc = jk("cache", "verify", "--json", str(tmp_path))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["ok"] is False and "not a jitkey index" in doc["problem"], proc.stdout
    assert proc.stderr == "" or "Traceback" not in proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _unprivileged(*args: str) -> list[str]:
    """``python -m jitkey *args`` as an ordinary user (root reads everything): as is when not root, else
    through ``setpriv`` as nobody (skips without it)."""
    cmd = [sys.executable, "-m", "jitkey", *args]
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop privileges to meet a permission error")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory the unprivileged child can use (pytest's tmp_path is private to its owner)."""
    d = Path(tempfile.mkdtemp(prefix="jitkey-cli-"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        for p in d.rglob("*"):
            with contextlib.suppress(OSError):
                p.chmod(0o700)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("action", ["info", "verify", "compact", "clear"])
def test_cache_on_an_unreadable_directory_is_one_line(action: str, shared_tmp: Path) -> None:
    d = shared_tmp / "locked"
    _index_with_entries(d, 3)
    for p in (d, *d.iterdir()):
        os.chown(p, 0, 0)
    d.chmod(0o000)
    proc = subprocess.run(
        _unprivileged("cache", action, str(d)),
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=str(shared_tmp)),
    )
    line = _one_line_error(proc)
    assert proc.returncode == 2 and "Permission denied" in line and str(d) in line, proc.stderr


def test_info_with_an_unreadable_cache_directory_reports_it(shared_tmp: Path) -> None:
    d = shared_tmp / "locked"
    _index_with_entries(d, 3)
    d.chmod(0o000)
    proc = subprocess.run(
        _unprivileged("info", "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, JITKEY_CACHE_DIR=str(d), HOME=str(shared_tmp)),
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "Permission denied" in json.loads(proc.stdout)["disk_index"]["error"]


@pytest.mark.parametrize("opt", ["--json", "--plot"])
def test_bench_output_check_that_fails_is_one_usage_line(opt: str, shared_tmp: Path) -> None:
    locked = shared_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o000)
    for path, why in (
        (str(locked / "sub" / "out.x"), "Permission denied"),  # the check itself fails: unsearchable parent
        ("x" * 5000 + ".json", "too long"),  # ENAMETOOLONG, even for root
    ):
        proc = subprocess.run(
            _unprivileged("bench", "--quick", "--only", "key", opt, path),
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, HOME=str(shared_tmp)),
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert why in proc.stderr and "[1/" not in proc.stderr, proc.stderr


def test_an_output_that_fails_after_the_run_is_one_line(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    proc = subprocess.run(
        [sys.executable, "-m", "jitkey", "bench", "--quick", "--only", "key", "--json", "/dev/full"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "--json /dev/full: writing failed" in proc.stderr
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "jitkey", "info"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    line = _one_line_error(proc)
    assert proc.returncode == 1 and "No space left on device" in line


@pytest.mark.parametrize("args", [["info"], ["info", "--json"], ["--version"], ["cache", "info"], ["--help"]])
def test_a_closed_stdout_is_quiet(args: list[str], tmp_path: Path) -> None:
    """`jitkey info | head -0`: the reader is gone before anything is written (deterministically: the
    pipe's read end is closed before the child starts)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jitkey", *args],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=dict(os.environ, JITKEY_CACHE_DIR=str(tmp_path)),
        )
    finally:
        os.close(w)
    assert proc.stderr == "", proc.stderr
    # argparse prints --help/--version itself and drops a write error; nothing is lost that was wanted
    assert proc.returncode == 141 or (args[0].startswith("--") and proc.returncode == 0)


@pytest.mark.parametrize("action", ["info", "verify", "compact", "clear"])
def test_a_bad_disk_cache_setting_is_one_usage_line(action: str, tmp_path: Path) -> None:
    _index_with_entries(tmp_path, 2)
    proc = jk("cache", action, str(tmp_path), env=dict(os.environ, JITKEY_DISK_CACHE="bogus"))
    line = _one_line_error(proc)
    assert proc.returncode == 2 and "JITKEY_DISK_CACHE" in line, proc.stderr
