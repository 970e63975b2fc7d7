"""jitkey's own kernel launch (``_LaunchPlan``) against Triton's own generated launcher, byte for byte.

Both run in a child process whose ``libcuda.so.1`` is a stand-in (``tests/data/standin_cuda.c``, built
here against Triton's bundled ``cuda.h``) that records what ``cuLaunchKernelEx`` receives: the launch
configuration, its attributes and every parameter's bytes. Every call jitkey claims must be recorded
exactly as Triton's launcher records it; calls jitkey declines go to Triton's launcher on a GPU (counted).
The GPU side (real kernels, graphs, streams, hooks) is in tests/test_triton_gpu.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
nv = pytest.importorskip("triton.backends.nvidia.driver")

from jitkey.triton._installed import _KNOWN_LAUNCHER_CODE, launcher_code_digest  # noqa: E402

HERE = Path(__file__).parent
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
PYTHON_H = Path(sysconfig.get_paths()["include"]) / "Python.h"  # Triton's launcher is C against CPython

pytestmark = [
    pytest.mark.skipif(CC is None, reason="no C compiler to build the stand-in driver"),
    pytest.mark.skipif(not PYTHON_H.exists(), reason=f"no {PYTHON_H} to build Triton's launcher against"),
    pytest.mark.skipif(not hasattr(nv, "make_launcher"), reason="this Triton's launcher is not generated C"),
]


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("standin")
    libdir = d / "lib"
    libdir.mkdir()
    subprocess.run(
        [
            CC,
            "-shared",
            "-fPIC",
            "-O1",
            f"-I{nv.include_dirs[0]}",
            str(HERE / "data" / "standin_cuda.c"),
            "-o",
            str(libdir / "libcuda.so.1"),
        ],
        check=True,
    )
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env["TRITON_LIBCUDA_PATH"] = str(libdir)
    env["TRITON_CACHE_DIR"] = str(d / "triton-cache")
    out = subprocess.run(
        [sys.executable, str(HERE / "_driver_launch_child.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


def test_the_installed_launcher_code_is_mirrored() -> None:
    # What this file compares is what hits use: the digest of the installed launcher code is a known one.
    assert launcher_code_digest() in _KNOWN_LAUNCHER_CODE, (triton.__version__, launcher_code_digest())


@pytest.mark.parametrize("case", ["ints", "floats", "tuples", "cluster16"])
def test_claimed_calls_are_byte_identical_to_triton(summary: dict, case: str) -> None:
    s = summary[case]
    assert s["mismatch"] == [], s["mismatch"][:5]
    assert s["counts"]["launched"] >= s["same"] > 0
    if case == "ints":
        # every in-range call is claimed; the out-of-range ones (and the 2**31 grid) are declined
        assert s["same"] == 120 and s["declined"] == 6, s
        assert set(s["counts"]["declined"]) == {
            "an integer argument is not an int in its type's range",
            "a pointer argument is not a CUDA tensor on the current device, an int or None",
            "the grid is not three int32 values",
        }
    if case == "floats":
        # fp16 overflow (1e300, 3.4e38, 1e6), NaN and infinities are declined (Triton raises or packs them)
        assert s["same"] >= 350 and s["declined"] >= 4, s
    if case == "tuples":
        assert s["same"] == 40 and s["declined"] == 2, s


def test_a_failing_launch_raises_what_triton_raises(summary: dict) -> None:
    triton_err, jitkey_err = summary["errors"]
    assert triton_err == jitkey_err == "RuntimeError: Triton Error [CUDA]: stand-in error 700"


def test_no_current_context_retains_the_primary_context(summary: dict) -> None:
    assert summary["ctx_retains"] == 1
