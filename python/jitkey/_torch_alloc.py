"""Native allocation for replayed plans (``jitkey.dsl``): ``jitkey._core._TorchAlloc`` makes the fresh CUDA tensors
of a plan's ``torch.empty(...)`` / ``torch.empty_like(x)`` steps through torch's stable C shim
(``aoti_torch_empty_strided``) and torch's own tensor wrapper (``THPVariable_Wrap``), without torch's Python
argument parser. Only after it has been proven, once per process and on live CUDA tensors, to make what torch's
functions make: the same type, sizes, strides, dtype and device, a tensor that owns fresh writable memory, no
gradient, the same reference count, and the memory given back when the tensor goes. Until then, and whenever the
proof fails, the shim's symbols are missing or ``JITKEY_NATIVE_ALLOC=0``, plans call torch's functions (``jitkey
info``: ``native_alloc``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from jitkey._proven import Proven, cuda_initialized


def _make(torch: Any) -> tuple[Any, str | None]:
    from jitkey import _tensor_fields
    from jitkey._core import _TorchAlloc

    # ``empty_like`` reads its tensor's sizes, strides, dtype and device through the calibrated tensor layout,
    # which is otherwise installed only when the first tensor rule is compiled.
    if not _tensor_fields.install():
        return None, f"direct tensor-field reads are off: {(_tensor_fields.status() or {}).get('why')}"

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        alloc = _TorchAlloc(os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libtorch_python.so"))
    except OSError as exc:
        return None, f"torch's C shim or tensor wrapper is not available: {exc}"
    try:
        return alloc, prove(torch, alloc)
    except Exception as exc:  # proving failed: torch's functions it is
        return None, f"proving the native allocation raised {type(exc).__name__}: {exc}"


#: The path (decided at the first recorded CUDA allocation: CUDA must be initialized to prove it).
PATH = Proven(
    "JITKEY_NATIVE_ALLOC",
    "not decided yet (decided at the first recorded CUDA allocation)",
    _make,
    ready=cuda_initialized,
)
#: The proven ``_TorchAlloc``, or None (CUDA not initialized yet: undecided; otherwise see :func:`status`).
get = PATH.get
#: ``{"on": bool | None, "why": reason or None}`` for ``jitkey info`` (``on`` is None while undecided).
status = PATH.status


def _same(torch: Any, got: Any, want: Any) -> str | None:
    if type(got) is not torch.Tensor:
        return f"made a {type(got).__name__}"
    for what in ("shape", "dtype", "device", "requires_grad", "is_leaf", "layout"):
        if getattr(got, what) != getattr(want, what):
            return f"{what} {getattr(got, what)} where torch makes {getattr(want, what)}"
    if got.stride() != want.stride():
        return f"strides {got.stride()} where torch makes {want.stride()}"
    if got.numel() and (got.data_ptr() == 0 or got.data_ptr() == want.data_ptr()):
        return "no fresh memory"
    if sys.getrefcount(got) != sys.getrefcount(want):
        return f"{sys.getrefcount(got)} references where torch's tensor has {sys.getrefcount(want)}"
    return None


def prove(torch: Any, alloc: Any) -> str | None:
    """Why ``alloc`` does not make what torch makes (None: it does; see the module docstring)."""
    dev = torch.cuda.current_device()
    cases = [
        torch.empty(4096, device="cuda"),
        torch.empty(64, 256, device="cuda", dtype=torch.float16).t(),
        torch.empty(0, 3, device="cuda", dtype=torch.int64),
        torch.empty((), device="cuda", dtype=torch.bfloat16),
        torch.empty(2, 3, 4, 5, device="cuda", dtype=torch.bool).permute(0, 2, 3, 1),
    ]
    for x in cases:
        want = torch.empty_like(x)
        got = alloc.empty_like(x)
        if got is None:
            return f"could not make empty_like of a {tuple(x.shape)} {x.dtype} tensor"
        why = _same(torch, got, want)
        if why is not None:
            return f"empty_like of a {tuple(x.shape)} {x.dtype} tensor: {why}"
    if alloc.empty_like(torch.empty(8, 8, device="cuda")[:, :4]) is not None:
        return "made empty_like of a tensor that is not dense (torch chooses other strides)"
    if alloc.empty_like(torch.empty(4)) is not None:
        return "made empty_like of a CPU tensor"
    want = torch.empty_strided((3, 5), (1, 3), dtype=torch.float16, device=f"cuda:{dev}")
    got = alloc.empty_strided([3, 5], [1, 3], "float16", dev)
    why = "nothing made" if got is None else _same(torch, got, want)
    if why is not None:
        return f"empty_strided: {why}"
    got.fill_(1)
    if int(got.sum().item()) != 15:
        return "the memory it made does not hold what is written to it"
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    t = alloc.empty_strided([1 << 20], [1], "float32", dev)
    if torch.cuda.memory_allocated(dev) - before != 4 << 20:
        return "its allocation is not accounted by torch's caching allocator"
    del t
    if torch.cuda.memory_allocated(dev) != before:
        return "the memory is not given back when the tensor goes"
    if alloc.failed:
        return "torch's C shim reported an error"
    return None
