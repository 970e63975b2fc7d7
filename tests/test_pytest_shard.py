"""``scripts/pytest_shard.py`` (the shards of ``SHARDS=N scripts/gpu_clients.sh``): the shards of a suite are
disjoint and together run every test, and a plain and a jitkey run of one shard run the same tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _ran(tmp_path: Path, shard: str | None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "JITKEY_SHARD"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), env.get("PYTHONPATH", "")])
    if shard is not None:
        env["JITKEY_SHARD"] = shard
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "pytest_shard",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-q",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode in (0, 1, 5), out.stdout + out.stderr
    return set(re.findall(r"^(?:PASSED|FAILED) (\S+)", out.stdout, re.M))


def test_shards_are_disjoint_and_cover_the_suite(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_many.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(40))\ndef test_i(i):\n    assert i != 7\n"
    )
    everything = _ran(tmp_path, None)
    assert len(everything) == 40
    shards = [_ran(tmp_path, f"{k}/3") for k in range(3)]
    assert all(shards) and sum(len(s) for s in shards) == 40
    assert set().union(*shards) == everything
    assert _ran(tmp_path, "1/3") == shards[1]  # the same tests every time (the node id decides)


def test_a_bad_shard_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), JITKEY_SHARD="3/3")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_shard", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 4 and "JITKEY_SHARD=3/3" in out.stdout + out.stderr
