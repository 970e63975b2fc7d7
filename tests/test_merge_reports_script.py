"""``scripts/merge_reports.py``: the shards of a client-suite run (``SHARDS=N scripts/gpu_clients.sh``) each write
a fast-path report; the merged report sums their counters and reasons and prints the plugin's summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

import jitkey.dsl
import jitkey.triton

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "merge_reports.py"


def _shard(launches: int, hits: int, misses: int, fallbacks: int, why: str, replays: int) -> dict[str, Any]:
    r = jitkey.triton.report()  # the real shape of a process's report, with this shard's counters
    r.update(kernels=1, launches=launches, hits=hits, misses=misses, fallbacks=fallbacks)
    r["fallback_reasons"] = {why: fallbacks}
    d = jitkey.dsl.report()
    d.update(sites=1, replays=replays, fallbacks=1)
    d["fallback_reasons"] = {"a torch function mode is active": 1}
    r["dsl"] = d
    return r


def test_merged_report_sums_the_shards_and_prints_the_share(tmp_path: Path) -> None:
    paths = []
    for i, rep in enumerate(
        [_shard(10, 8, 1, 1, "pre_run_hooks", 5), _shard(30, 27, 2, 1, "pre_run_hooks", 7)]
    ):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(rep))
    paths.append(tmp_path / "missing.json")  # a shard stopped before writing its report: skipped, said so
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "merged.json"), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skipped" in out.stderr and "missing.json" in out.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert (merged["kernels"], merged["launches"], merged["hits"], merged["fallbacks"]) == (2, 40, 35, 2)
    assert merged["fallback_reasons"] == {"pre_run_hooks": 2}
    assert merged["warm_fast_path"] == pytest.approx(35 / 37)
    assert merged["dsl"]["replays"] == 12 and merged["dsl"]["fallbacks"] == 2
    assert "2 reports merged" in out.stdout
    assert f"fast path {100 * 35 / 37:.2f}% of warm launches" in out.stdout


def test_no_report_at_all_is_an_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "merged.json"), str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "no report to merge" in out.stderr
    assert not (tmp_path / "merged.json").exists()
