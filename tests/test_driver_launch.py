"""jitkey's own kernel launch (``_LaunchPlan``) against Triton's own launcher, byte for byte.

Both run in a child process whose ``libcuda.so.1`` is a stand-in (``tests/data/standin_cuda.c``, built
here against the bundled ``cuda.h`` of the Triton under test) that records what ``cuLaunchKernelEx``
receives: the launch configuration, its attributes and every parameter's bytes, and the driver calls made
around it. Triton's side is a real ``CudaLauncher``: under Triton 3.6 its generated C launcher, under 3.9
(``make test-triton-latest``) the generic ``launch`` of the backend's ``driver.c``, compiled by Triton against
the stand-in. Every call jitkey claims must do exactly what Triton's launcher does; calls jitkey declines go
to Triton's launcher on a GPU (counted). The GPU side (real kernels, graphs, streams, hooks) is in
tests/test_triton_gpu.py.
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

from jitkey._triton_table import LAUNCHER_CODE  # noqa: E402
from jitkey.triton._installed import launcher_code_digest  # noqa: E402

HERE = Path(__file__).parent
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
PYTHON_H = Path(sysconfig.get_paths()["include"]) / "Python.h"  # Triton's launcher is C against CPython

pytestmark = [
    pytest.mark.skipif(CC is None, reason="no C compiler to build the stand-in driver"),
    pytest.mark.skipif(not PYTHON_H.exists(), reason=f"no {PYTHON_H} to build Triton's launcher against"),
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
    assert launcher_code_digest() in LAUNCHER_CODE, (triton.__version__, launcher_code_digest())


def test_the_child_mirrored_the_installed_dialect(summary: dict) -> None:
    assert summary["dialect"] == LAUNCHER_CODE[launcher_code_digest()]


CLAIMED = [
    "ints",
    "floats",
    "tuples",
    "cluster16",
    "wide_ints",
    "wide40",
    "wide90",
    "smem228",
    "smem_big",
    "smem_big_coop_cluster",
]


@pytest.mark.parametrize("case", CLAIMED)
def test_claimed_calls_are_byte_identical_to_triton(summary: dict, case: str) -> None:
    s = summary[case]
    assert s["mismatch"] == [], s["mismatch"][:5]
    assert s["counts"]["launched"] >= s["same"] > 0
    v39 = summary["dialect"] == "3.9"
    # Under 3.6, the L2's lazy launcher (the C launcher built at its first call) behaves as the launcher.
    assert s["lazy_mismatch"] == [], s["lazy_mismatch"][:5]
    assert s["lazy_same"] == (0 if v39 else s["same"] + s["declined"])
    if case == "ints":
        # every in-range call is claimed; the out-of-range ones (and the 2**31 grid) are declined. Triton 3.9
        # reads i1 as int32 and truncates ints that fit in a C long: there only the pointer and grid ones are.
        assert (s["same"], s["declined"]) == ((123, 3) if v39 else (120, 6)), s
        reasons = {
            "a pointer argument is not a CUDA tensor on the current device, an int or None",
            "the grid is not three int32 values",
        }
        if not v39:
            reasons.add("an integer argument is not an int in its type's range")
        assert set(s["counts"]["declined"]) == reasons
        assert s["declined_triton"] == {"raised": s["declined"]}
    if case == "floats":
        # fp16 overflow (1e300, 3.4e38, 1e6), NaN and infinities are declined (Triton raises or packs them)
        assert s["same"] >= 350 and s["declined"] >= 4, s
    if case == "tuples":
        assert s["same"] == 40 and s["declined"] == 2, s
    if case.startswith("wide") and case != "wide_ints":
        assert (s["same"], s["declined"]) == (30, 0), s


def test_ints_beyond_64_bits_for_float_parameters_are_packed_as_triton_converts_them(summary: dict) -> None:
    """Triton's launcher reads a float parameter with PyFloat_AsDouble, which converts an int of any size;
    jitkey packs the same bytes, and declines (Triton raises OverflowError) only past a double, or for an int
    subclass whose __float__ Triton would call; each decline says what happened."""
    s = summary["big_int_floats"]
    assert s["mismatch"] == [], s["mismatch"][:5]
    assert (s["same"], s["declined"]) == (16, 3), s
    assert s["declined_triton"] == {"raised": 2, "launched": 1}, s
    assert set(s["counts"]["declined"]) == {
        "a float argument is NaN, or too large for its float type (or an int too large for a double)",
        "a float argument is neither a float nor an exact int",
    }, s["counts"]


def test_ints_outside_their_type_are_read_as_triton_reads_them(summary: dict) -> None:
    s = summary["wide_ints"]
    if summary["dialect"] == "3.9":
        # what 3.9's extractors read (a C long, truncated) is claimed; jitkey declines exactly what raises
        assert (s["same"], s["declined"]) == (19, 12), s
        assert s["declined_triton"] == {"raised": 12}
    else:
        assert (s["same"], s["declined"]) == (2, 29), s  # i1=2 and u1=2 are in 3.6's 0..255


# CU_LAUNCH_ATTRIBUTE_*: 2 cooperative, 4 cluster dimension, 5 cluster scheduling, 6 PDL, 18 shared memory mode
def test_oversized_shared_memory_sets_the_attribute_triton_sets(summary: dict) -> None:
    v39 = summary["dialect"] == "3.9"
    assert summary["smem228"]["attrs"] == [[6]]  # 228 KiB exactly: no attribute
    assert summary["smem_big"]["attrs"] == ([[18, 6]] if v39 else [[6]])
    assert summary["smem_big_coop_cluster"]["attrs"] == ([[18, 2, 4, 5]] if v39 else [[2, 4, 5]])
    assert summary["cluster16"]["attrs"] == [[6, 2, 4, 5]]
    assert summary["cluster16"]["did"] == {"launched GAL": 1}  # cuFuncSetAttribute, then the launch
    s = summary["smem_big_all"]
    if v39:  # five attributes: Triton 3.9 writes past its array of four, so jitkey makes no plan
        assert s["plan"] is None and "5 launch attributes" in s["why"], s
    else:
        assert s["mismatch"] == [] and s["same"] == 2 and s["attrs"] == [[6, 2, 4, 5]], s


def test_a_failing_cluster_attribute_does_what_triton_does(summary: dict) -> None:
    s = summary["func_attr_error"]
    assert s["mismatch"] == [] and s["same"] == 1, s
    # 3.6 records the error and launches anyway; 3.9 returns at the failed check
    assert s["did"] == ({"raised GA": 1} if summary["dialect"] == "3.9" else {"raised GAL": 1})


def test_scratch_buffers_are_allocated_and_passed_as_triton_does(summary: dict) -> None:
    s = summary["scratch"]
    assert all(c["same"] for c in s.values()), s
    assert s["global"]["allocs"] == [[[1152, 128, 0x5EED], [1344, 128, 0x5EED]]]  # grid * num_ctas * size
    assert s["global+profile"]["allocs"][1] == [[480, 16, 0x5EED], [560, 16, 0x5EED]]
    assert s["device object scratch"]["did"] == ["GPL", "GPL"]  # data_ptr() checked by the driver
    at = "" if summary["dialect"] == "3.9" else " (at -1)"
    host = f"ValueError: Pointer argument{at} cannot be accessed from Triton (cpu tensor?)"
    assert s["host object scratch"]["did"] == [host, host]
    if summary["dialect"] == "3.9":  # no profile allocator set: the driver's default profile scratch
        assert s["default profile"]["allocs"] == [[[288, 8, 0x5EED], [336, 8, 0x5EED]]]
    else:
        assert s["null profile"]["did"][0].startswith(
            "RuntimeError: Kernel requires a runtime memory allocation"
        )


def test_a_failing_launch_raises_what_triton_raises(summary: dict) -> None:
    triton_err, jitkey_err = summary["errors"]
    assert triton_err == jitkey_err == "RuntimeError: Triton Error [CUDA]: stand-in error 700"


def test_the_driver_floor_packs_and_launches_as_a_launch_does(summary: dict) -> None:
    """``_LaunchPlan._floor(n, ...)`` (the benches' floor) takes a launch's arguments: the same record, n
    launches; a call the plan would decline raises ValueError, too few arguments TypeError."""
    floor = summary["floor"]
    assert floor["same"] and floor["launches"] == 4 and floor["seconds"], floor
    assert floor["errors"] == ["ValueError", "TypeError"], floor


def test_the_floor_from_python_launches_the_packed_call_once_per_call(summary: dict) -> None:
    """``_LaunchPlan._packed(...)`` (the benches' floor from Python) packs as a launch does and launches
    nothing until called; each call is one launch with the same record; it keeps the call's arguments alive
    until it goes; a declined call raises ValueError."""
    packed = summary["packed"]
    expected = {
        "made": 0,
        "same": True,
        "launches": 2,
        "keeps_args": 1,
        "releases_args": True,
        "error": "ValueError",
    }
    assert packed == expected, packed


def test_no_current_context_retains_the_primary_context(summary: dict) -> None:
    assert summary["ctx_retains"] == 1
    triton_did, jitkey_did = summary["no_context"]
    assert triton_did == jitkey_did and triton_did.endswith("'GDRSL')")


def test_a_context_error_does_what_triton_does(summary: dict) -> None:
    triton_did, jitkey_did = summary["ctx_error"]
    assert triton_did == jitkey_did
    assert triton_did.startswith("('raised', 'RuntimeError: Triton Error [CUDA]: stand-in error 201'")
    # 3.6 carries on after the failed cuCtxGetCurrent and launches; 3.9 stops there and never launches
    assert triton_did.endswith("'G')" if summary["dialect"] == "3.9" else "'GDRSL')")


def test_launchers_jitkey_does_not_mirror_get_no_plan(summary: dict) -> None:
    r = summary["refusals"]
    assert r["wrapped launch"] == "Triton's launcher wraps this kernel's launch (tensor descriptors)"
    assert r["another __call__"] == "ck.run is not the CUDA launcher jitkey knows"
    if summary["dialect"] == "3.9":
        assert r["gsan"] == "GSan instruments this kernel (Triton's launcher adds its own arguments)"
        assert r["kernel signature"] == "Triton's launcher packs another signature than the compiled kernel's"


def test_a_patched_cuda_launcher_turns_the_driver_launch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from jitkey.triton import _installed

    original = nv.CudaLauncher.__call__
    assert _installed._launcher_code("x")[1] is None

    @functools.wraps(original)  # inspect.getsource would show the original's code
    def wrapped(self: object, *args: object) -> object:
        return original(self, *args)

    monkeypatch.setattr(nv.CudaLauncher, "__call__", wrapped)
    dialect, why = _installed._launcher_code("x")
    assert dialect is None
    assert why == "triton x: CudaLauncher.__call__ is not its own code (patched or wrapped)"
