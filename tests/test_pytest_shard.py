"""``scripts/pytest_shard.py`` (the shards of ``SHARDS=N scripts/gpu_clients.sh``): the shards of a suite are
disjoint and together run every test, and a plain and a jitkey run of one shard run the same tests; a deadline
stops a run between tests with its JUnit XML written; ``JITKEY_ONLY`` runs the tests a comparison names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _pytest(suite: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin on ``suite`` (a folder with one test file), the plugin's variables only from ``env``."""
    full = {
        k: v for k, v in os.environ.items() if k not in ("JITKEY_SHARD", "JITKEY_DEADLINE", "JITKEY_ONLY")
    }
    full.update(env, PYTHONPATH=os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    (suite / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_shard", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=suite, timeout=120)


def _ran(tmp_path: Path, shard: str | None) -> set[str]:
    out = _pytest(tmp_path, "-rA", **({} if shard is None else {"JITKEY_SHARD": shard}))
    assert out.returncode in (0, 1, 5), out.stdout + out.stderr
    return set(re.findall(r"^(?:PASSED|FAILED) (\S+)", out.stdout, re.M))


def test_shards_are_disjoint_and_cover_the_suite(tmp_path: Path) -> None:
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
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    out = _pytest(tmp_path, JITKEY_SHARD="3/3")
    assert out.returncode == 4 and "JITKEY_SHARD=3/3" in out.stdout + out.stderr


def test_a_deadline_stops_between_tests_and_the_xml_is_written(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(
        "import time, pytest\n\n@pytest.mark.parametrize('i', range(20))\ndef test_i(i):\n    time.sleep(0.2)\n"
    )
    xml = tmp_path / "out.xml"
    out = _pytest(tmp_path, f"--junitxml={xml}", JITKEY_DEADLINE=str(time.time() + 1.0))
    assert out.returncode == 2 and "JITKEY_DEADLINE passed" in out.stdout, out.stdout + out.stderr
    ran = re.findall(r"<testcase ", xml.read_text())
    assert 2 <= len(ran) < 20  # it ran some and stopped between two tests, XML written


def test_only_runs_the_tests_a_comparison_names(tmp_path: Path) -> None:
    (tmp_path / "test_c.py").write_text(
        "import pytest\n\nclass TestK:\n    @pytest.mark.parametrize('i', range(5))\n    def test_i(self, i):\n"
        "        pass\n\ndef test_free():\n    pass\n"
    )
    names = tmp_path / "names.txt"
    names.write_text("test_c.TestK::test_i[3]\ntest_c::test_free\ntest_c::test_gone\n")
    xml = tmp_path / "out.xml"
    out = _pytest(tmp_path, f"--junitxml={xml}", JITKEY_ONLY=str(names))
    assert out.returncode == 0, out.stdout + out.stderr
    ran = set(re.findall(r'<testcase classname="([^"]+)" name="([^"]+)"', xml.read_text()))
    assert ran == {("test_c.TestK", "test_i[3]"), ("test_c", "test_free")}  # the JUnit names round-trip
