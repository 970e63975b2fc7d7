"""The L2 of compiled kernels on a GPU (every test is marked ``cuda`` and skipped without one): fresh processes
load kernels an earlier one compiled, launch them (jitkey's own driver launch, and under Triton 3.6 the lazy C
launcher for calls the plan declines) with the results plain Triton gives, and never run Triton's compile path.
The CPU side (every cache-test change, damaged files, an upgrade) is tests/test_triton_l2.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CHILD = """
import json, sys
import torch, triton
import triton.language as tl

mode = sys.argv[1]
if mode == "jitkey":
    import jitkey.triton
    jitkey.triton.install()

watched = []
def profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and (code.co_name, code.co_filename.rsplit("/", 2)[-2:]) in (
        ("compile", ["compiler", "compiler.py"]), ("triton_key", ["runtime", "cache.py"])):
        watched.append(code.co_name)
sys.setprofile(profile)


@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, n, A: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * A + tl.load(y_ptr + offs, mask=m), mask=m)


out = {"calls": []}
n = 5000
for dt in (torch.float32, torch.float16, torch.bfloat16):
    for a, offset in ((2, 0), (3, 1)):
        x = torch.randn(n + 1, device="cuda", dtype=dt)[offset : offset + n]
        y = torch.randn(n + 1, device="cuda", dtype=dt)[offset : offset + n]
        o = torch.empty_like(x)
        ck = axpy[(triton.cdiv(n, 512),)](x, y, o, n, A=a, BLOCK=512)
        torch.cuda.synchronize()
        ok = torch.allclose(o.float(), (x.float() * a + y.float()), rtol=2e-2, atol=2e-2)
        out["calls"].append([str(dt), a, offset, ck.hash, bool(ok), type(ck._run).__name__])
# A call the launch plan declines (a tensor subclass; nn.Parameter is launched natively): Triton's
# launcher, built now if it was deferred.
class Sub(torch.Tensor):
    pass
x = torch.randn(n, device="cuda").as_subclass(Sub)
y = torch.randn(n, device="cuda")
o = torch.empty_like(y)
ck = axpy[(triton.cdiv(n, 512),)](x, y, o, n, A=2, BLOCK=512)
torch.cuda.synchronize()
out["declined"] = [bool(torch.allclose(o, x * 2 + y, rtol=1e-4, atol=1e-4)), type(ck._run).__name__]
sys.setprofile(None)
out["watched"] = sorted(set(watched))
if mode == "jitkey":
    out["stats"] = axpy.cache_stats()
print(json.dumps(out))
"""


def run(tmp: Path, mode: str, **env: str) -> dict[str, Any]:
    script = tmp / "l2_gpu_child.py"
    script.write_text(textwrap.dedent(CHILD))
    full = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp / "triton"),
        "JITKEY_CACHE_DIR": str(tmp / "jitkey"),
        "JITKEY_TRITON_L2": "1",  # opt-in (see jitkey.triton._l2)
        **env,
    }
    out = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, env=full, timeout=900
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_fresh_process_launches_kernels_from_the_l2(tmp_path: Path) -> None:
    import triton

    first = run(tmp_path, "jitkey")
    assert first["stats"]["l2_misses"] == 6 and first["stats"]["l2_recorded"] == 6  # 6 variants compiled
    second = run(tmp_path, "jitkey")
    plain = run(tmp_path, "plain")
    assert all(c[4] for c in first["calls"] + second["calls"] + plain["calls"])  # every result right
    # the same kernels as plain Triton's, loaded without its compile path or its installation hash
    assert [c[:4] for c in second["calls"]] == [c[:4] for c in plain["calls"]]
    assert second["watched"] == [] and "triton_key" in plain["watched"]
    s = second["stats"]
    # 6 variants (and the tensor subclass, keyed apart in memory, the same kernel on disk) from the L2
    assert s["l2_hits"] >= 6 and s["l2_misses"] == 0 and s["fallbacks"] == 0
    assert s["driver_launches"] >= 6  # jitkey launched the L2's kernels itself
    if triton.__version__ == "3.6.0":  # the C launcher is made only for the declined call
        assert {c[5] for c in second["calls"]} == {"LazyLauncher36"}
        assert second["declined"] == [True, "CudaLauncher"]
    else:
        assert second["declined"][0] is True


def test_the_l2_off_is_tritons_path(tmp_path: Path) -> None:
    run(tmp_path, "jitkey")
    off = run(tmp_path, "jitkey", JITKEY_TRITON_L2="0")
    assert off["stats"]["l2_hits"] == 0 and "triton_key" in off["watched"]
    assert all(c[4] for c in off["calls"])
