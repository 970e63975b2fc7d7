"""Kernels, a simulated GPU and process workers for tests/test_autotune.py (importable by spawned children).

The *simulated GPU* replaces only what needs a GPU: the launch (``launcher=``) and the timer
(``do_bench=``). Keying, selection, the in-memory cache and the DiskIndex are the real ones.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

import jitkey
import jitkey.triton as jt

# The kernel is the one examples/shared_autotune.py tunes: what the example shows is what these tests tune (the
# example stays a script a user can copy, so the tests take it from there).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from shared_autotune import scale_add

CONFIGS = [
    triton.Config({"BLOCK": 128}, num_warps=4),
    triton.Config({"BLOCK": 256}, num_warps=4),
    triton.Config({"BLOCK": 512}, num_warps=8),
]
# Simulated median times (ms) per BLOCK: 256 wins.
SIM_TIMES = {128: 3.0, 256: 1.0, 512: 2.0, 1024: 4.0}


class SimulatedGPU:
    """A launcher that records launches and a timer that runs the benchmark closure once.

    The timer derives the time from the config the closure *actually launched*, so a config that is
    not passed through to the launch would be timed wrongly and the test would see it.
    """

    def __init__(self, times: dict[int, float] | None = None) -> None:
        self.times = dict(SIM_TIMES if times is None else times)
        self.launches: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = []
        self.bench_calls = 0

    def launcher(self, fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        self.launches.append((fn, grid, args, dict(kwargs)))
        return int(kwargs["BLOCK"])

    def do_bench(self, kernel_call: Any, quantiles: tuple[float, ...]) -> list[float]:
        self.bench_calls += 1
        before = len(self.launches)
        kernel_call()
        assert len(self.launches) == before + 1, "the benchmark closure must launch exactly once"
        t = self.times[self.launches[-1][3]["BLOCK"]]
        return [t, t * 0.9, t * 1.1][: len(quantiles)]


def make(index: Any, gpu: SimulatedGPU, kernel: Any = scale_add, configs: Any = None, **kw: Any) -> Any:
    return jt.autotune(
        CONFIGS if configs is None else configs,
        key=["n"],
        index=index,
        do_bench=gpu.do_bench,
        launcher=gpu.launcher,
        **kw,
    )(kernel)


def args_for(n: int, dtype: torch.dtype = torch.float16) -> tuple[Any, ...]:
    x = torch.zeros(n, dtype=dtype)
    return (x, torch.zeros_like(x), torch.empty_like(x), n, 2.0)


def tune_once(index_dir: str, n: int) -> dict[str, Any]:
    """One process's run: an autotuner over ``index_dir``, one call; what it did."""
    gpu = SimulatedGPU()
    index = jitkey.DiskIndex(index_dir)
    try:
        at = make(index, gpu)
        block = at[(1,)](*args_for(n))
        result = {
            "pid": os.getpid(),
            "block": block,
            "bench_calls": gpu.bench_calls,
            "launched_blocks": [launch[3]["BLOCK"] for launch in gpu.launches],
            "stats": at.cache_stats(),
            "disk_key": at.disk_key(*args_for(n)).hex(),
        }
    finally:
        index.close()
    return result


@jt.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sa, sb, sc, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """C (f32, row-major) = A (f16, row-major, stride sa) @ B (f16, row-major, stride sb)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(
            a_ptr + rm[:, None] * sa + (k0 + rk)[None, :],
            mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k0 + rk)[:, None] * sb + rn[None, :],
            mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * sc + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
