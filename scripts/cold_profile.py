"""Where a fresh process's first launch of an already-compiled kernel spends its time (GPU; issue 25).

    python scripts/cold_profile.py [KERNELS]

Prepares the cold bench's caches in a temporary directory (a module of KERNELS kernels x 2 dtypes, default 30,
compiled and recorded by one jitkey process with the L2 on), then runs one fresh process per mode (``jitkey``,
``plain``) that launches every variant once: the process's first launch untimed, then each further first launch
under ``cProfile``. Prints each mode's microseconds per first launch and its profile (top functions by total and
by cumulative time), so the pieces of a per-variant first launch (the L2 lookup, the record's files, the module
load, the launch) can be compared with Triton's (its binder, ``compile``'s cache lookup, the launcher).

    python scripts/cold_profile.py --parts [KERNELS] [ROUNDS]

The same caches, without a profiler (which inflates every Python call): ROUNDS (default 3) fresh processes per
mode, taking turns, each timing every further first launch and, with ``perf_counter`` around them, its pieces
(jitkey: the L2 lookup, ``_build`` (the record and Triton's files), Triton's ``cache_key``, the handles and module
load, jitkey's per-kernel set-up; Triton: ``_do_compile``, ``compile``, its binder, ``_init_handles``; both:
``load_binary``). A kernel's first variant (float32) and its second (float16) are reported apart: the first also
pays what is made once per kernel. Outputs are checked against torch at the end.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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


PARTS_CHILD = r"""
import collections, functools, json, sys, time
import importlib.util
import torch, triton
mode, path, kernels = sys.argv[1], sys.argv[2], int(sys.argv[3])
acc = collections.defaultdict(float)
def timed(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t0
    setattr(obj, name, w)
if mode == "jitkey":
    import jitkey.triton
    jitkey.triton.install()
    import jitkey._triton_table as table
    from jitkey.triton import _l2
    from jitkey.triton._kernel import TritonKernel
    for name in ("lookup", "_build", "_init_handles"):
        timed(_l2, name, "l2." + name)
    timed(table, "cache_key", "cache_key")
    timed(TritonKernel, "_jk_make_launch", "jitkey per-kernel set-up")
else:
    import triton.compiler
    from triton.runtime import jit
    timed(jit.JITFunction, "_do_compile", "_do_compile")
    timed(jit.JITFunction, "create_binder", "create_binder")
    timed(triton.compiler, "compile", "compile")  # what create_binder imports
    timed(triton.compiler.CompiledKernel, "_init_handles", "_init_handles")
from triton.runtime.driver import driver
timed(driver.active.utils, "load_binary", "load_binary")
spec = importlib.util.spec_from_file_location("cold_kernels", path)
mod = importlib.util.module_from_spec(spec); sys.modules["cold_kernels"] = mod; spec.loader.exec_module(mod)
n = 4096
bufs = {dt: [torch.rand(n, device="cuda").to(getattr(torch, dt)) for _ in range(3)] for dt in ("float32", "float16")}
torch.cuda.synchronize()
x, y, out = bufs["float32"]
mod.k0[(n // 1024,)](x, y, out, n, BLOCK=1024)  # the process's first launch: its one-time costs, not counted
torch.cuda.synchronize()
times = {"float32": [], "float16": []}
parts = {"float32": collections.defaultdict(float), "float16": collections.defaultdict(float)}
for i in range(kernels):
    k = getattr(mod, f"k{i}")
    for dt in ("float32", "float16"):
        if i or dt != "float32":
            x, y, out = bufs[dt]
            acc.clear()
            t0 = time.perf_counter()
            k[(n // 1024,)](x, y, out, n, BLOCK=1024)
            times[dt].append(time.perf_counter() - t0)
            for label, v in acc.items():
                parts[dt][label] += v
torch.cuda.synchronize()
for i in range(kernels):
    k = getattr(mod, f"k{i}")
    for dt in ("float32", "float16"):
        x, y, out = bufs[dt]
        k[(n // 1024,)](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        if not torch.allclose(out.float(), (x + y * i).float(), atol=1e-2, rtol=1e-2):
            raise SystemExit(f"k{i} {dt}: wrong output")
extra = {}
if mode == "jitkey":
    rep = jitkey.triton.report()
    extra = {"l2_hits": rep["l2_hits"], "l2_misses": rep["l2_misses"]}
print(json.dumps({"mode": mode, "times": times, **extra,
                  "parts": {dt: {k: v / len(times[dt]) for k, v in p.items()} for dt, p in parts.items()}}))
"""


def _prepare(kernels: int) -> tuple[dict[str, str], dict[str, Path]]:
    """The cold bench's caches in a temporary directory: every variant compiled and recorded in the L2."""
    root = Path(tempfile.mkdtemp(prefix="cold_profile_"))
    env = _cold._child_env(root)
    modules = {
        "plain": _cold.kernel_module(root / "plain_kernels.py", kernels, "triton.jit"),
        "jitkey": _cold.kernel_module(root / "jitkey_kernels.py", kernels, "triton.jit"),
    }
    for mode, path in modules.items():  # compile every variant once (and record it in the L2)
        cfg = {"phase": "launch", "mode": "plain" if mode == "plain" else "install", "module": str(path)}
        _cold._run_child({**cfg, "kernels": kernels, "dtypes": ["float32", "float16"]}, env)
    return env, modules


def parts(kernels: int, rounds: int) -> None:
    env, modules = _prepare(kernels)
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "jitkey": []}
    for i in range(rounds):
        for mode in ("plain", "jitkey") if i % 2 == 0 else ("jitkey", "plain"):
            out = subprocess.run(
                [sys.executable, "-c", PARTS_CHILD, mode, str(modules[mode]), str(kernels)],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            if out.returncode != 0:
                raise SystemExit(out.stderr[-3000:])
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for mode, rs in runs.items():
        for r in rs:
            t = r["times"]
            every = t["float32"] + t["float16"]
            print(
                f"{mode:6s} median us: every further first launch {statistics.median(every) * 1e6:7.1f}, "
                f"a kernel's first {statistics.median(t['float32']) * 1e6:7.1f}, its second "
                f"{statistics.median(t['float16']) * 1e6:7.1f}; sum {sum(every) * 1e3:6.1f} ms"
                + (f"; L2 hits {r['l2_hits']}, misses {r['l2_misses']}" if "l2_hits" in r else "")
            )
        for dt, what in (("float32", "a kernel's first variant"), ("float16", "its second")):
            per: dict[str, list[float]] = {}
            for r in rs:
                for label, v in r["parts"][dt].items():
                    per.setdefault(label, []).append(v * 1e6)
            row = sorted(((statistics.median(v), k) for k, v in per.items()), reverse=True)
            print(
                f"   {what}, mean us per launch (median over processes): "
                + ", ".join(f"{k} {v:.0f}" for v, k in row)
            )
    print(json.dumps({"runs": runs}))


def main() -> None:
    if sys.argv[1:2] == ["--parts"]:
        kernels = int(sys.argv[2]) if len(sys.argv) > 2 else 30
        parts(kernels, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
        return
    kernels = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    env, modules = _prepare(kernels)
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
    print(json.dumps({"root": env["TRITON_CACHE_DIR"]}))


if __name__ == "__main__":
    main()
