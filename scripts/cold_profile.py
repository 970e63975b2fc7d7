"""Where a fresh process's first launch of an already-compiled kernel spends its time (GPU; issue 25).

    python scripts/cold_profile.py [KERNELS]

Prepares the cold bench's caches in a temporary directory (a module of KERNELS kernels x 2 dtypes, default 30,
compiled and recorded by one jitkey process with the L2 on), then runs one fresh process per mode (``jitkey``,
``plain``) that launches every variant once: the process's first launch untimed, then each further first launch
under ``cProfile``. Prints each mode's microseconds per first launch and its profile (top functions by total and
by cumulative time), so the pieces of a per-variant first launch (the L2 lookup, the record's files, the module
load, the launch) can be compared with Triton's (its binder, ``compile``'s cache lookup, the launcher).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from jitkey.bench import _cold

CHILD = r"""
import cProfile, io, json, pstats, sys, time
import importlib.util
import torch, triton
mode = sys.argv[1]
if mode == "jitkey":
    import jitkey.triton
    jitkey.triton.install()
spec = importlib.util.spec_from_file_location("cold_kernels", sys.argv[2])
mod = importlib.util.module_from_spec(spec); sys.modules["cold_kernels"] = mod; spec.loader.exec_module(mod)
n, kernels = 4096, int(sys.argv[3])
bufs = {dt: [torch.rand(n, device="cuda").to(getattr(torch, dt)) for _ in range(3)] for dt in ("float32", "float16")}
torch.cuda.synchronize()
calls = [(getattr(mod, f"k{i}"), bufs[dt]) for i in range(kernels) for dt in bufs]
k, (x, y, out) = calls[0]
k[(n // 1024,)](x, y, out, n, BLOCK=1024)  # the process's first launch: its one-time costs, not profiled
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
for k, (x, y, out) in calls[1:]:
    k[(n // 1024,)](x, y, out, n, BLOCK=1024)
prof.disable()
per = (time.perf_counter() - t0) / (len(calls) - 1) * 1e6
torch.cuda.synchronize()
s = io.StringIO()
st = pstats.Stats(prof, stream=s)
st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumulative").print_stats(45)
extra = {}
if mode == "jitkey":
    rep = jitkey.triton.report()
    extra = {"l2_hits": rep["l2_hits"], "l2_misses": rep["l2_misses"]}
print(f"== {mode}: {per:.1f} us per first launch (profiled, {len(calls) - 1} variants) {extra}")
print(s.getvalue())
"""


def main() -> None:
    kernels = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    root = Path(tempfile.mkdtemp(prefix="cold_profile_"))
    env = _cold._child_env(root)
    modules = {
        "plain": _cold.kernel_module(root / "plain_kernels.py", kernels, "triton.jit"),
        "jitkey": _cold.kernel_module(root / "jitkey_kernels.py", kernels, "triton.jit"),
    }
    for mode, path in modules.items():  # compile every variant once (and record it in the L2)
        cfg = {"phase": "launch", "mode": "plain" if mode == "plain" else "install", "module": str(path)}
        _cold._run_child({**cfg, "kernels": kernels, "dtypes": ["float32", "float16"]}, env)
    for mode, path in modules.items():
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(path), str(kernels)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        print(out.stdout[-12000:])
        if out.returncode != 0:
            print(out.stderr[-3000:])
    print(json.dumps({"root": str(root)}))


if __name__ == "__main__":
    main()
