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
