"""CPU benchmark of a warm autotuned call: jitkey.triton.autotune vs triton.autotune (launch replaced by a no-op).

Both autotuners have already chosen a config for the call; what is timed is the per-call work on top of the
inner launch: building the autotune key (key values + argument dtypes), the cache probe and merging the
config's kwargs. Triton's ``Autotuner`` wraps an object whose ``run`` is a no-op; jitkey's autotuner gets a
no-op ``launcher``. Each case checks it launches with the expected config before it is timed. In CI this runs
with ``--benchmark-disable`` (correctness only).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from triton.runtime.autotuner import Autotuner  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _autotune_workers as w  # noqa: E402

ARGS = w.args_for(4096)
WANT = w.CONFIGS[1]  # the simulated timer's winner


class _NoopKernel:
    """What Triton's Autotuner wraps: records the config kwargs of the last launch, launches nothing."""

    arg_names = list(w.scale_add.arg_names)
    fn = staticmethod(w.scale_add.fn)  # Autotuner looks for the Python function under .fn

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def run(self, *args: Any, **kwargs: Any) -> None:
        self.last = kwargs


def test_triton_autotune_warm_call(benchmark: Any) -> None:
    inner = _NoopKernel()

    def bench_launch(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        return [w.SIM_TIMES[inner.last["BLOCK"]]] * 3

    tuner = Autotuner(inner, inner.arg_names, w.CONFIGS, ["n"], None, None, do_bench=bench_launch)
    tuner.run(*ARGS, grid=(1,), warmup=False)
    assert tuner.best_config is WANT and inner.last["BLOCK"] == 256
    benchmark.group = "autotuned warm call (no-op launch)"
    benchmark(lambda: tuner.run(*ARGS, grid=(1,), warmup=False))
    assert inner.last["BLOCK"] == 256


def test_jitkey_autotune_warm_call(benchmark: Any, tmp_path: Path) -> None:
    gpu = w.SimulatedGPU()
    at = w.make(tmp_path / "idx", gpu)
    at[(1,)](*ARGS)
    assert at.best_config is WANT and gpu.bench_calls == 3
    last: dict[str, Any] = {}

    def noop(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        last.update(kwargs)

    at._launcher = noop
    benchmark.group = "autotuned warm call (no-op launch)"
    benchmark(lambda: at.run(*ARGS, grid=(1,), warmup=False))
    assert last["BLOCK"] == 256 and at.cache_stats()["tunings"] == 1
