"""The examples under examples/ run and print what they claim (their RESULT lines are asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str) -> tuple[str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
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


def test_minimal_dsl() -> None:
    out, r = run_example("minimal_dsl.py")
    # 6 calls: two share a specialization; dtype, shape, strides and scalar type each give another
    assert r["calls"] == 6 and r["compiles"] == 5 and r["correct"] is True
    assert r["distinct_signature_keys"] == 5 and r["python_keys"] == 5 and r["same_bound_kernels"] is True
    assert r["stats"]["misses"] == 5
    for field in ("jitkey_dispatch_ns", "python_dispatch_ns", "dispatch_speedup", "warm_call_us"):
        value = r[field]
        assert isinstance(value, float) and value > 0
    assert f"-> {r['dispatch_speedup']:.2f}x" in out
    assert "torch.sigmoid(" in out and "out=_t" in out  # the generated, specialized source is printed


def test_shared_autotune() -> None:
    out, r = run_example("shared_autotune.py")
    # process 1 benchmarks every config and stores the winner; process 2 loads it and benchmarks nothing
    assert r["p1_bench_calls"] == 3 and r["p1_tunings"] == 1
    assert r["p2_bench_calls"] == 0 and r["p2_tunings"] == 0 and r["p2_disk_hits"] == 1
    assert r["same_config"] is True and r["correct"] is True
    if r["mode"] == "cpu":
        # the simulated cost model's optimum (per-program overhead vs. big-block penalty)
        assert r["simulated_timer"] is True and r["config"] == {"BLOCK": 1024}
        assert "SIMULATED" in out


def test_shared_autotune_second_host() -> None:
    """Two "hosts" (separate local indexes) share the choice through a redis-server the example starts."""
    from jitkey._redis_server import find_redis_server

    if find_redis_server() is None:
        reason = (
            "no redis-server (make test installs Debian's with apt as root; scripts/fetch_redis_server.sh)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (required under CI=true)")
        pytest.skip(reason)
    out, r = run_example("shared_autotune.py", "--second-host")
    assert r["second_host"] is True and r["p1_local_dir"] != r["p2_local_dir"]
    assert r["p1_tunings"] == 1 and r["p1_remote_puts"] == 1
    # host 2's local index is empty: the choice comes from the remote, nothing is benchmarked
    assert r["p2_bench_calls"] == 0 and r["p2_tunings"] == 0 and r["p2_disk_hits"] == 1
    assert r["p2_remote_hits"] == 1 and r["p2_remote_errors"] == r["p2_remote_timeouts"] == 0
    assert r["same_config"] is True and r["correct"] is True
    assert "second-host mode" in out and "host 2: benchmarked 0 configs" in out


def test_shared_autotune_gpu_mode_without_gpu_skips_clearly() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --mode gpu runs for real (test_shared_autotune)")
    out, r = run_example("shared_autotune.py", "--mode", "gpu", "--second-host")
    assert "NVIDIA GPU" in str(r["skipped"]) and out.startswith("skipped: ")
