"""Triton 3.6's own unit tests, plain and under ``-p jitkey.pytest_plugin``, on the CPU: every test that passes
plain must pass with every user kernel routed through jitkey (the CPU part of the real-client check; the GPU
part is ``scripts/gpu_clients.sh``). The suite is the one beside the repository (``../shared/clients``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT.parent / "shared" / "clients" / "triton-3.6"
# The modules of the suite that import and collect without a GPU (others need a driver at import).
MODULES = [
    "unit/language/test_tuple.py",
    "unit/language/test_decorator.py",
    "unit/language/test_annotations.py",
    "unit/language/test_frontend.py",
    "unit/runtime/test_specialize.py",
    "unit/runtime/test_bindings.py",
    "unit/runtime/test_compilation_listener.py",
    "unit/runtime/test_driver.py",
]

pytestmark = [
    pytest.mark.skipif(not SUITE.is_dir(), reason=f"no Triton client suite at {SUITE}"),
    pytest.mark.skipif(triton.__version__ != "3.6.0", reason="the client suite is Triton 3.6.0's own"),
]


def _compare():
    spec = importlib.util.spec_from_file_location("compare_junit", ROOT / "scripts" / "compare_junit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, tag: str, *extra: str) -> Path:
    xml = tmp_path / f"{tag}.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "jitkey.pytest_plugin",
        f"--junitxml={xml}",
        f"--jitkey-report-json={tmp_path / tag}.json",
        *extra,
        *MODULES,
    ]
    env = {**__import__("os").environ, "TRITON_CACHE_DIR": str(tmp_path / f"cache-{tag}")}
    out = subprocess.run(cmd, cwd=SUITE, capture_output=True, text=True, timeout=600, env=env)
    assert xml.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    return xml


def test_triton_suite_passes_under_the_plugin(tmp_path):
    cmp = _compare()
    plain = cmp.outcomes(str(_run(tmp_path, "plain", "--jitkey-off")))
    routed = cmp.outcomes(str(_run(tmp_path, "jitkey")))
    passed = [n for n, s in plain.items() if s == "passed"]
    assert len(passed) > 100  # the check is real: most of the selection runs on a CPU
    regressions = [n for n in passed if routed.get(n) != "passed"]
    assert regressions == []
    import json

    report = json.loads((tmp_path / "jitkey.json").read_text())
    assert report["kernels"] > 50  # the suite's kernels were routed through jitkey
