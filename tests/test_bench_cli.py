"""The bench CLI end to end: ``python -m jitkey bench --quick`` on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CPU_SECTIONS = {"key", "cache", "lookup", "disk", "fnkey", "autotune"}


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jitkey", "bench", *args], capture_output=True, text=True, timeout=300, env=env
    )


def _has_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


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
    assert sections >= CPU_SECTIONS and "cold" not in sections  # cold runs only when named
    for r in doc["results"]:
        assert r["median_ns"] > 0 and r["min_ns"] <= r["median_ns"] <= r["max_ns"]
        assert r["repeats"] >= 3 and r["number"] >= 1
        # noisy is decided on the unrounded spread; spread_pct is rounded to 2 decimals
        at_boundary = abs(r["spread_pct"] - doc["spread_flag_pct"]) <= 0.005
        assert at_boundary or r["noisy"] == (r["spread_pct"] > doc["spread_flag_pct"])
    groups = {r["group"] for r in doc["results"]}
    for g in groups:  # every group has exactly one baseline, whose ratio is 1
        base = [r for r in doc["results"] if r["group"] == g and r["baseline"]]
        assert len(base) == 1 and base[0]["ratio"] == pytest.approx(1.0)
    env = doc["environment"]
    for field in ("jitkey", "python", "cpu", "torch", "triton"):
        assert env[field]
    # The same fast-path facts as `jitkey info`, in the JSON and the table's header.
    assert env["fast_paths"]["tensor_fields"]["on"] in (True, False)
    assert "fast paths: cpython_layout " in proc.stdout
    # Without a GPU the launch section is reported as skipped, with the reason, in both outputs.
    if env["gpu"] is None:
        skipped = {s["section"]: s["reason"] for s in doc["skipped"]}
        assert "CUDA GPU" in skipped["launch"]
        assert "== launch == skipped: no CUDA GPU" in proc.stdout
    else:
        assert "launch" in sections
    # Table on stdout; progress, case by case with [i/N], on stderr.
    assert "== key ==" in proc.stdout and "[jitkey bench]" in proc.stderr
    n = len(doc["results"])
    assert f"[1/{n}] " in proc.stderr and f"[{n}/{n}] " in proc.stderr


def test_one_unit_per_group(quick_run: tuple[subprocess.CompletedProcess[str], Path, Path]) -> None:
    proc, _, _ = quick_run
    units: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        for unit in ("ns", "µs"):
            if f" {unit} " in line:
                units.setdefault(line.split("  ")[0], set()).add(unit)
    assert units and all(len(u) == 1 for u in units.values()), units


def test_quick_run_writes_a_png(quick_run: tuple[subprocess.CompletedProcess[str], Path, Path]) -> None:
    pytest.importorskip("matplotlib")
    _, _, png = quick_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_to_stdout_and_repeated_only_adds(tmp_path: Path) -> None:
    proc = run_bench("--quick", "--only", "key", "--only", "cache", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout is only the JSON; the table went to stderr
    assert {r["section"] for r in doc["results"]} == {"key", "cache"}
    assert "== key ==" in proc.stderr
    assert not (tmp_path / "-").exists() and not Path("-").exists()


def test_compare_prints_ratios_against_an_earlier_run(
    quick_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    _, js, _ = quick_run
    proc = run_bench("--quick", "--only", "key", "--compare", str(js))
    assert proc.returncode == 0, proc.stderr
    part = proc.stdout.split(f"== compared with {js}")[1]
    assert "new/old" in part
    rows = [line for line in part.splitlines() if line.startswith("key/4-entry tuple")]
    assert len(rows) == 5 and all(line.rstrip(" !").endswith("x") for line in rows), part


def test_compare_reports_a_changed_fast_path(
    quick_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    pytest.importorskip("torch")
    _, js, _ = quick_run
    env = dict(os.environ, JITKEY_TENSOR_FIELDS="0")
    proc = run_bench("--quick", "--only", "key", "--compare", str(js), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "fast path tensor_fields: True -> False" in proc.stdout
    assert "tensor_fields OFF" in proc.stdout and "JITKEY_TENSOR_FIELDS=0" in proc.stdout


def test_missing_matplotlib_is_a_clear_error_before_running(tmp_path: Path) -> None:
    (tmp_path / "matplotlib.py").write_text("raise ImportError('simulated: matplotlib not installed')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = run_bench("--quick", "--only", "key", "--plot", str(tmp_path / "x.png"), env=env)
    assert proc.returncode == 1
    assert "needs matplotlib" in proc.stderr and "jitkey[plot]" in proc.stderr
    assert "[1/" not in proc.stderr  # nothing was timed
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
        (["--plot", "/nonexistent-dir/x.png"], "does not exist"),
        (["--json", "."], "is a directory"),
        (["--compare", "/nonexistent-dir/old.json"], "--compare"),
    ],
)
def test_bad_paths_fail_before_running(args: list[str], message: str) -> None:
    proc = run_bench("--quick", "--only", "key", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "usage:" in proc.stderr
    assert "[1/" not in proc.stderr


def test_compare_rejects_a_file_that_is_not_a_bench_result(tmp_path: Path) -> None:
    bad = tmp_path / "old.json"
    bad.write_text('{"schema": 99}')
    proc = run_bench("--quick", "--only", "key", "--compare", str(bad))
    assert proc.returncode == 2 and "not a jitkey bench --json file" in proc.stderr


@pytest.mark.parametrize(
    "doc",
    [
        '{"schema": 1, "results": [{"section": "key", "group": "g", "impl": "i", "median_ns": "fast"}]}',
        '{"schema": 1, "results": [{"section": ["key"], "group": "g", "impl": "i", "median_ns": 1}]}',
        '{"schema": 1, "results": [{"section": "key", "group": "g", "impl": "i", "median_ns": 1, "max_ns": null}]}',
        '{"schema": 1, "results": [], "environment": ["not", "an", "object"]}',
        '{"schema": 1, "results": [], "environment": {"fast_paths": {"tensor_fields": true}}}',
    ],
    ids=["median-str", "section-list", "max-null", "env-list", "fast-path-bool"],
)
def test_compare_checks_every_field_it_reads_before_the_run(tmp_path: Path, doc: str) -> None:
    """A --compare file that would crash the comparison after the run is refused before it (issue 24)."""
    bad = tmp_path / "old.json"
    bad.write_text(doc)
    proc = run_bench("--quick", "--only", "key", "--compare", str(bad))
    assert proc.returncode == 2 and "--compare" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "[1/" not in proc.stderr


def test_only_launch_without_a_gpu_is_an_error() -> None:
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    proc = run_bench("--quick", "--only", "launch")
    assert proc.returncode == 2
    assert "--only launch: no CUDA GPU here" in proc.stderr
    assert "[1/" not in proc.stderr


@pytest.mark.parametrize("args", [["--only", "nosuch"], ["--frobnicate"], ["--json"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = run_bench(*args)
    assert proc.returncode == 2
    assert "usage: " in proc.stderr and "bench" in proc.stderr


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        ("gpu_launch_h200.json", set()),
        # the driver-launch build: the driver floor and Inductor's static launcher as peer rows
        ("gpu_launch_h100_driver.json", {"driver floor", "inductor static run", "inductor _launch_kernel"}),
        # and the floor with a hit's launch steps (context check, GIL hand-off, packing) per launch
        ("gpu_launch_h200_driver.json", {"driver floor", "floor + launch steps", "inductor static run"}),
        # and the floors from Python, and the empty-grid hit (the hit without its driver call)
        (
            "gpu_launch_h200_pyfloor.json",
            {"driver floor", "floor from Python", "_LaunchPlan.launch", "jitkey, empty grid"},
        ),
    ],
)
def test_launch_section_reads_a_real_gpu_result(recorded: str, expected: set[str]) -> None:
    """The launch section turns triton_bench's result (recorded on a GPU host) into table rows: every
    implementation, the baseline marked, medians in ns (CPU machines never run it)."""
    from jitkey.bench._harness import format_table
    from jitkey.bench._sections import LaunchRun

    res = json.loads((Path(__file__).parent / "data" / recorded).read_text())
    rows = LaunchRun(lambda: res, 100, 200).results()
    impls = {r.impl for r in rows}
    assert {"triton fn[grid]", "jitkey kernel[grid]", "CompiledKernel.run", "torch.add"} | expected <= impls
    assert len(rows) == sum(len(r["spread"]) for r in res["results"])
    for r in rows:
        assert r.baseline == (r.impl == "triton fn[grid]") and r.min_ns <= r.median_ns <= r.max_ns
    # the "vs floor" column: each row against its case's driver floor, where one was measured
    for case in res["results"]:
        got = {r.impl: r.floor_ratio for r in rows if r.group == f"launch/{case['case']}"}
        if "driver floor" not in case:
            assert set(got.values()) == {None}
            continue
        assert got["driver floor"] == 1.0
        assert got["jitkey kernel[grid]"] == pytest.approx(case["jitkey / driver floor"])
    table = format_table(rows, [], {})
    assert ("vs floor" in table) == ("driver floor" in expected)


def test_gpu_bench_wide_kernels_and_goals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The add kernels are generated from their pointer count (no GPU needed to build them), every width the bench
    launches, and the table's goals and jitkey / driver floor column follow the rows (here: a recorded run's rows with two
    wider ones added)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from jitkey import triton_bench

    for nptr in triton_bench.POINTERS:
        k = triton_bench._add_kernel(nptr, str(tmp_path))
        assert len(k.params) == nptr + 2 and k.arg_names[-3:] == ["out", "n", "BLOCK"]
        assert k.src.count("tl.load(") == nptr - 1 and k.params[-1].is_constexpr
    assert "acc += tl.load(p54 + offs, mask=mask)" in k.src  # the last one: 56 pointers
    res = json.loads((Path(__file__).parent / "data" / "gpu_launch_h200_driver.json").read_text())
    rows = res["results"]
    for nptr, speedup in ((32, 8.0), (56, 9.5)):
        wide = dict(rows[2], case=f"add, {nptr} ptr ({nptr + 2} args)", args=nptr + 2)
        wide["speedup vs fn[grid]"] = speedup
        rows.append(wide)
    triton_bench._print_table(res)
    out = capsys.readouterr().out
    assert "jitkey/driver floor" in out and "add, 56 ptr (58 args)" in out
    assert set(res["goals"]) >= {
        "≥3x vs fn[grid] at 4 args",
        "≥9x vs fn[grid] at 58 args",
        "≤1.15x of the driver floor (all cases)",
    }
    assert res["goals"]["≥9x vs fn[grid] at 58 args"] is True
    assert res["goals"]["≤1.15x of the driver floor (all cases)"] is False  # that run was 1.38-1.65x


def test_cold_section_runs_fresh_processes_and_is_only_run_when_named(tmp_path: Path) -> None:
    """``--only cold``: decoration in fresh processes, plain Triton as the baseline (first launches need a GPU and
    are skipped here with the reason); a plain ``jitkey bench`` never runs it."""
    pytest.importorskip("triton")
    js = tmp_path / "cold.json"
    proc = run_bench("--only", "cold", "--quick", "--json", str(js))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(js.read_text())
    rows = {(r["group"], r["impl"]): r for r in doc["results"]}
    assert set(rows) >= {
        ("decoration/150 kernels (import incl. one-time costs)", "triton.jit"),
        ("decoration/150 kernels (import incl. one-time costs)", "jitkey.triton.jit"),
        ("decoration/library of 700 kernels", "triton.jit"),
        ("decoration/library of 700 kernels", "triton.jit + jitkey install()"),
    }
    for (_group, impl), r in rows.items():
        assert r["section"] == "cold" and r["unit"] == "ms" and r["repeats"] == 2
        assert r["baseline"] == (impl == "triton.jit")
        assert 0 < r["min_ns"] <= r["median_ns"] <= r["max_ns"]
    assert "ms" in proc.stdout and "== cold ==" in proc.stdout
    if not _has_gpu():
        from jitkey.bench._sections import gpu_unavailable_reason

        assert [s["reason"] for s in doc["skipped"]] == [f"first launches: {gpu_unavailable_reason()}"]
    else:
        assert any(g.startswith("launch/") for g, _ in rows)
