"""The pytest plugin (``-p jitkey.pytest_plugin``) never changes a run's outcome (issue 24).

Its own failures (the report's JSON path not writable, Triton missing, ``-W error`` in force) are
``jitkey plugin warning:`` lines in the summary; the exit status is the tests' alone, and the report is still
printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PASSING = """
def test_passes():
    assert True
"""
FAILING = """
def test_fails():
    assert False
"""


def run_pytest(
    tmp_path: Path, body: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "jitkey.pytest_plugin", "-q", "-p", "no:cacheprovider", *args,
         str(tmp_path / "test_user.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    "report",
    ["{tmp}/no-such-dir/report.json", "{tmp}", "/dev/full"],
    ids=["missing-directory", "a-directory", "full-disk"],
)
@pytest.mark.parametrize("strict", [False, True], ids=["default", "W-error"])
def test_an_unwritable_report_path_is_a_warning_not_the_status(
    tmp_path: Path, report: str, strict: bool
) -> None:
    pytest.importorskip("triton")
    path = report.format(tmp=tmp_path)
    extra = ["-W", "error"] if strict else []
    ok = run_pytest(tmp_path, PASSING, f"--jitkey-report-json={path}", *extra)
    out = ok.stdout + ok.stderr
    assert ok.returncode == 0, out
    assert "jitkey plugin warning: writing --jitkey-report-json" in ok.stdout, out
    assert "jitkey fast-path report" in ok.stdout and "INTERNALERROR" not in out  # the report is not lost
    bad = run_pytest(tmp_path, FAILING, f"--jitkey-report-json={path}", *extra)
    assert bad.returncode == 1, bad.stdout + bad.stderr  # the tests' status, unchanged


def test_without_triton_the_plugin_warns_and_the_run_passes(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "triton"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('simulated: triton is not installed')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = run_pytest(tmp_path, PASSING, f"--jitkey-report-json={tmp_path / 'r.json'}", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jitkey plugin warning: not routing triton.jit through jitkey" in proc.stdout
    assert "pip install 'jitkey[triton]'" in proc.stdout


def test_a_bad_top_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, PASSING, "--jitkey-top=-3")
    assert proc.returncode == 4 and "expected a count >= 0" in proc.stderr, proc.stdout + proc.stderr


CONFTEST_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def conftest_kernel(x_ptr, BLOCK: tl.constexpr):
    pass
"""
USES_CONFTEST = """
import json


def test_the_conftest_kernel_is_routed(request):
    from conftest import conftest_kernel
    import jitkey.triton

    assert isinstance(conftest_kernel, jitkey.triton.TritonKernel), type(conftest_kernel)
"""


def test_a_kernel_decorated_by_the_suites_conftest_is_routed(tmp_path: Path) -> None:
    """A suite whose conftest.py imports its kernel library (FlagGems' does) gets routed kernels: the plugin
    installs before the initial conftests are imported, not at pytest_configure (which comes after them)."""
    pytest.importorskip("triton")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST_KERNEL))
    proc = run_pytest(tmp_path, USES_CONFTEST, f"--jitkey-report-json={tmp_path / 'r.json'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    off = run_pytest(tmp_path, USES_CONFTEST, "--jitkey-off")
    assert off.returncode == 1 and "JITFunction" in off.stdout, off.stdout + off.stderr


def test_the_summary_says_which_integrations_are_on(tmp_path: Path) -> None:
    """``--jitkey-integrations`` ends with one line naming each integration, on or off with why (a library that
    is missing, unsupported or fails to import here: FlagGems without a GPU)."""
    pytest.importorskip("triton")
    import jitkey.integrations

    proc = run_pytest(tmp_path, PASSING, "--jitkey-integrations")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("jitkey integrations: ")), None)
    assert line is not None, proc.stdout
    for name, st in jitkey.integrations.status().items():
        assert f"{name} on" in line or f"{name} off (" in line, line
        if st["library"] is None:
            assert f"{name} off ({st['why']})" in line, line
    off = run_pytest(tmp_path, PASSING, "--jitkey-integrations", "--jitkey-off")
    assert "jitkey integrations:" not in off.stdout, off.stdout


AS_WORKER = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # What pytest-xdist gives a worker's config; and a snapshot after every test.
    config.workerinput = {"workerid": "gw7"}
    config.workeroutput = {}
    import jitkey.pytest_plugin

    jitkey.pytest_plugin._SNAPSHOT_EVERY = 0.0
"""


def test_an_xdist_worker_keeps_a_snapshot_of_its_numbers(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(AS_WORKER))
    report = tmp_path / "r.json"
    proc = run_pytest(
        tmp_path, PASSING + "\n\ndef test_again():\n    pass\n", f"--jitkey-report-json={report}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    snap = tmp_path / "r.json.workers" / "gw7.json"
    import json

    rep = json.loads(snap.read_text())
    assert {"kernels", "launches", "hits", "fallback_reasons"} <= set(rep), rep
    assert not report.exists()  # a worker hands its report to the controller; only the controller writes it
    assert not [p for p in snap.parent.iterdir() if p.suffix == ".tmp"]


def test_a_worker_that_never_reported_is_counted_from_its_last_snapshot(tmp_path: Path) -> None:
    """A time limit that stops a run inside a long test loses that worker's final numbers: the controller
    counts it as of its last snapshot (and ignores an earlier run's snapshots), and says so."""
    pytest.importorskip("triton")
    import json
    import time

    import jitkey.triton

    report = tmp_path / "r.json"
    workers = tmp_path / "r.json.workers"
    workers.mkdir()
    snap = jitkey.triton.merge_reports([], 10)
    snap.update(kernels=3, launches=100, hits=90, misses=3, fallbacks=7, driver_launches=80, l2_hits=2)
    snap["l2_walks"] = {"replayed": 5, "walked": 1}
    snap["fallback_reasons"] = {"pre_run_hooks": 7}
    (workers / "gw3.json").write_text(json.dumps(snap))
    old = workers / "gw9.json"  # an earlier run's
    old.write_text(json.dumps({**snap, "launches": 10**6}))
    t = time.time()
    os.utime(old, (t - 3600, t - 3600))
    os.utime(workers / "gw3.json", (t + 60, t + 60))  # as if written during the run (which starts after now)
    proc = run_pytest(tmp_path, PASSING, f"--jitkey-report-json={report}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(report.read_text())
    assert rep["workers_from_snapshots"] == 1, rep
    assert (rep["launches"], rep["hits"], rep["fallbacks"]) == (100, 90, 7)
    assert rep["fallback_reasons"] == {"pre_run_hooks": 7}
    assert "1 xdist workers never reported their final numbers" in proc.stdout, proc.stdout
    # jitkey launched 80 of the 90 hits and 2 L2-served misses: 12 went through Triton's launcher.
    assert "launched by jitkey itself (cuLaunchKernelEx): 80; through Triton's launcher: 12" in proc.stdout
    assert rep["l2_walks"] == {"replayed": 5, "walked": 1}
    assert "replayed from the L2 5, walked by Triton 1" in proc.stdout
