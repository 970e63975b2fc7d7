"""The examples under examples/ run and print what they claim (their RESULT lines are asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str) -> tuple[str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and lines[-1].startswith("RESULT "), proc.stdout
    return proc.stdout, json.loads(lines[-1].removeprefix("RESULT "))


def test_ninetoothed_scenario() -> None:
    out, r = run_example("ninetoothed_scenario.py")
    # one arrangement x 2 kernel names x 3 block sizes: 6 builds, 6 distinct keys
    assert r["builds"] == 6 and r["distinct_keys"] == 6 and r["first_pass_misses"] == 6
    # the pre-fix key (sources + block size, no kernel name) collides across the two names
    assert r["naive_distinct_keys"] == 3
    # the repeated builds all hit and return the very kernels built the first time
    assert r["repeat_hits"] == 6 and r["repeat_same_objects"] is True
    # editing a global the arrangement reads re-keys it: one miss, and the new kernel uses the new value
    assert r["drift_misses"] == 1 and r["drift_rekeys"] == 1 and r["drift_pads_with_new_value"] is True
    # the timing is measured and printed (its size is a benchmark matter, not asserted here)
    for field in ("rebuild_us", "cached_us", "speedup"):
        value = r[field]
        assert isinstance(value, float) and value > 0
    assert f"{r['speedup']:.0f}x faster" in out
    assert "add_scaled" in out and "fused_axpy" in out
