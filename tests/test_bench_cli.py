"""The bench CLI end to end: ``python -m jitkey bench --quick`` on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CPU_SECTIONS = {"key", "cache", "lookup", "disk"}


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jitkey", "bench", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    out = tmp_path_factory.mktemp("bench")
    js, png = out / "bench.json", out / "bench.png"
    proc = run_bench("--quick", "--json", str(js), "--plot", str(png))
    return proc, js, png


def test_quick_run_writes_valid_json_with_every_cpu_section(
    quick_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    proc, js, _ = quick_run
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(js.read_text())
    assert doc["schema"] == 1
    sections = {r["section"] for r in doc["results"]}
    assert sections >= CPU_SECTIONS
    for r in doc["results"]:
        assert r["median_ns"] > 0 and r["min_ns"] <= r["median_ns"] <= r["max_ns"]
        assert r["repeats"] >= 3 and r["number"] >= 1
    groups = {r["group"] for r in doc["results"]}
    for g in groups:  # every group has exactly one baseline, whose ratio is 1
        base = [r for r in doc["results"] if r["group"] == g and r["baseline"]]
        assert len(base) == 1 and base[0]["ratio"] == pytest.approx(1.0)
    env = doc["environment"]
    for field in ("jitkey", "python", "cpu", "torch", "triton"):
        assert env[field]
    # Without a GPU the launch section is reported as skipped, with the reason, in both outputs.
    if env["gpu"] is None:
        skipped = {s["section"]: s["reason"] for s in doc["skipped"]}
        assert "CUDA GPU" in skipped["launch"]
        assert "== launch == skipped: no CUDA GPU" in proc.stdout
    else:
        assert "launch" in sections
    # Table on stdout, progress on stderr.
    assert "== key ==" in proc.stdout and "[jitkey bench]" in proc.stderr


def test_quick_run_writes_a_png(quick_run: tuple[subprocess.CompletedProcess[str], Path, Path]) -> None:
    pytest.importorskip("matplotlib")
    _, _, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_matplotlib_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "matplotlib.py").write_text("raise ImportError('simulated: matplotlib not installed')\n")
    import os

    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = run_bench("--quick", "--only", "key", "--plot", str(tmp_path / "x.png"), env=env)
    assert proc.returncode == 1
    assert "needs matplotlib" in proc.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args", [["--only", "nosuch"], ["--frobnicate"], ["--json"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = run_bench(*args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
