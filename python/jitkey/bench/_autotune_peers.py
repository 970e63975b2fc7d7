"""The warm autotuned call of ``jitkey bench`` (``autotune``): ``triton.autotune``'s ``Autotuner`` against
``jitkey.triton.autotune``, each past its tuning, with the launch replaced by a no-op that records the config's
kwargs. What is timed is the per-call work on top of the inner launch: the autotune key (key values and argument
dtypes), the cache probe and merging the config's kwargs. A simulated timer (from the config the benchmark closure
actually launched) makes ``BLOCK=256`` the winner of both. Importing this module needs torch and triton (CPU is
enough: nothing is compiled).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

import jitkey.triton as jt


@jt.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pass  # never compiled: both launches are no-ops


CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 4), (512, 8))]
WINNER = CONFIGS[1]
SIMULATED_MS = {128: 3.0, 256: 1.0, 512: 2.0}
N = 4096
X = torch.zeros(N, dtype=torch.float16)
ARGS = (X, torch.zeros_like(X), torch.empty_like(X), N, 2.0)


class NoopLaunch:
    """Records the kwargs of the last launch (so the config a call launched with), launches nothing. Serves as
    Triton's inner kernel (``run``; ``arg_names`` and ``fn`` as Autotuner reads them) and as jitkey's
    ``launcher``; ``do_bench`` times a config by what the benchmark closure launched."""

    arg_names = list(scale_add.arg_names)
    fn = staticmethod(scale_add.fn)

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def run(self, *args: Any, **kwargs: Any) -> None:
        self.last = kwargs

    def launcher(self, fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.last = kwargs

    def do_bench(self, kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        return [SIMULATED_MS[self.last["BLOCK"]]] * 3


def triton_tuner() -> tuple[Autotuner, NoopLaunch]:
    """Triton's Autotuner over a no-op kernel, tuned for ``ARGS``."""
    inner = NoopLaunch()
    tuner = Autotuner(inner, inner.arg_names, CONFIGS, ["n"], None, None, do_bench=inner.do_bench)
    tuner.run(*ARGS, grid=(1,), warmup=False)
    return tuner, inner


def jitkey_tuner() -> tuple[Any, NoopLaunch]:
    """``jt.autotune`` (in memory: ``index=False``) with a no-op launcher, tuned for ``ARGS``."""
    rec = NoopLaunch()
    at = jt.autotune(CONFIGS, key=["n"], index=False, do_bench=rec.do_bench, launcher=rec.launcher)(scale_add)
    at.run(*ARGS, grid=(1,), warmup=False)
    return at, rec
