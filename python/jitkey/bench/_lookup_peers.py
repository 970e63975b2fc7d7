"""Peers of ``Signature.lookup``: the argument → key → cached-kernel step as Python, Helion and
Triton do it, for the ``lookup`` section of ``python -m jitkey bench`` (which benches/ runs too). Importing this
module needs torch and triton (CPU is enough).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend


# fmt: off
@triton.jit
def k2(a0, BLOCK: tl.constexpr):
    pass


@triton.jit
def k4(a0, a1, a2, BLOCK: tl.constexpr):
    pass


@triton.jit
def k8(a0, a1, a2, a3, a4, a5, a6, BLOCK: tl.constexpr):
    pass


@triton.jit
def k16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, BLOCK: tl.constexpr):
    pass


KERNELS = {2: k2, 4: k4, 8: k8, 16: k16}
BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))
TENSOR = torch.zeros(1024, dtype=torch.float16)
OTHER = torch.zeros(1024, dtype=torch.float32)


def triton_args(n: int) -> tuple[Any, ...]:
    dyn: list[Any] = []
    for i in range(n - 1):
        dyn.append([TENSOR, OTHER, 4096 + 16 * i][i % 3])
    return (*dyn, 1024)


def python_triton_key(n: int) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """An unrolled Python key with the information Triton's specialization has (a)."""
    parts = []
    for i, a in enumerate(triton_args(n)[:-1]):
        if isinstance(a, torch.Tensor):
            parts.append(f"a[{i}].dtype, a[{i}].data_ptr() & 15 == 0")
        else:
            parts.append(f"a[{i}] == 1, a[{i}] & 15 == 0, -2147483648 <= a[{i}] < 2147483648")
    parts.append(f"type(a[{n - 1}]), a[{n - 1}]")
    ns: dict[str, Any] = {}
    exec(f"def key(a):\n    return ({', '.join(parts)},)\n", ns)
    return ns["key"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BoundKernelKey:
    """Helion's ``BoundKernelInMemoryCacheKey`` shape: a spec tuple plus extras."""

    specialization_key: tuple[Any, ...]
    extra_results: tuple[Any, ...]


def _tensor_key_static(t: Any) -> Any:
    return (t.dtype, t.size(), t.stride())


_EXTRACTORS: dict[type, Callable[[Any], Any]] = {
    torch.Tensor: _tensor_key_static,
    int: lambda v: int,
    float: lambda v: float,
    bool: lambda v: bool,
}


def helion_style_key(args: tuple[Any, ...]) -> BoundKernelKey:
    """Helion's per-argument extractors (static shapes) + device type, in a frozen dataclass (b)."""
    spec = [_EXTRACTORS[type(a)](a) for a in args]
    return BoundKernelKey((*spec, "cpu"), ())


# fmt: on

HELION_ARGS = (TENSOR.view(32, 32), OTHER.view(32, 32), TENSOR[:512], OTHER.view(4, 256).t())


def helion_python_key(a: tuple[Any, ...]) -> tuple[Any, ...]:
    """An unrolled Python flat-tuple key over four tensors: dtype, sizes, strides (a)."""
    a0, a1, a2, a3 = a
    return (
        a0.dtype, a0.shape, a0.stride(), a1.dtype, a1.shape, a1.stride(),
        a2.dtype, a2.shape, a2.stride(), a3.dtype, a3.shape, a3.stride(),
    )  # fmt: skip
