"""Calibrates jitkey's direct reads of torch's tensor fields, and proves them equal to the attribute path.

``Signature`` reads tensor metadata (dtype, ``data_ptr()``, sizes, strides) either through Python
attributes (always correct, ~40-100 ns each) or, when this module has installed a verified layout,
straight from the C++ ``TensorImpl`` behind the Python object (a few ns).

The layout is a *hypothesis* about the installed torch build (the offsets below are those of torch
2.x on 64-bit Linux). It is installed only if every probe tensor (every dtype, views with storage
offsets, 0-d to 8-d shapes, transposes, empty and meta tensors) reads back exactly what the
attribute path says, and the only pointer followed during calibration (TensorImpl → StorageImpl) is
first confirmed independently through ``untyped_storage()``. At run time the Rust side uses the
direct path only for objects of exactly ``torch.Tensor`` / ``torch.nn.Parameter`` whose
``TensorImpl`` and ``StorageImpl`` vtables equal the calibrated plain ones (so sparse, nested,
functional, batched and other wrapper tensors take the attribute path), and only for dtypes seen
during calibration. ``JITKEY_TENSOR_FIELDS=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from typing import Any

# Offsets (bytes) of the hypothesis, torch 2.x, 64-bit.
PYOBJ_TENSORIMPL = 16  # THPVariable: PyObject_HEAD, then at::Tensor (a TensorImpl*)
IMPL_STORAGE = 16  # TensorImpl: vtable, refcounts, then Storage (a StorageImpl*)
STORAGE_DATA = 16  # StorageImpl: vtable, refcounts, then DataPtr (data pointer first)
IMPL_NDIM = 64  # SizesAndStrides::size_
IMPL_SIZES = 72  # inline sizes (ndim <= 5), or a pointer to sizes then strides
IMPL_INLINE_STRIDES = 112  # inline strides (72 + 5 * 8)
MAX_INLINE_DIMS = 5
IMPL_STORAGE_OFFSET = 152
IMPL_NUMEL = 160
IMPL_DTYPE = 168  # caffe2::TypeMeta index (u16)
IMPL_DEVICE = 170  # std::optional<c10::Device>: type (i8), index (i8), has_value (bool)
THPSTORAGE_IMPL = 16  # THPStorage: PyObject_HEAD, then the StorageImpl*


def _u64(addr: int) -> int:
    return int(struct.unpack("<Q", ctypes.string_at(addr, 8))[0])


def _i64(addr: int) -> int:
    return int(struct.unpack("<q", ctypes.string_at(addr, 8))[0])


def _u16(addr: int) -> int:
    return int(struct.unpack("<H", ctypes.string_at(addr, 2))[0])


def _probe_tensors(torch: Any) -> list[Any]:
    out = []
    base = torch.arange(2 * 3 * 4 * 5 * 6 * 7 * 2, dtype=torch.float32)
    out += [base, base[3:], base[5:77:3]]
    out += [base.view(2, 3, 4, 5, 6, 14), base.view(2, 3, 4, 5, 6, 14).transpose(0, 5)]
    out += [base.view(2, 3, 4, 5, 6, 7, 2, 1)[1:, :, 2:], base.view(4, 5, 6, 7, 12)[:, 1:]]
    out += [base[:0], torch.zeros(()), base.view(120, 84).t(), base.view(120, 84)[:, 2:]]
    out += [torch.zeros(3, 1, 2).expand(3, 5, 2), torch.nn.Parameter(torch.zeros(7))]
    out += [torch.zeros(5, 3, device="meta")[1:]]
    return out


def calibrate(torch: Any) -> dict[str, Any] | None:
    """The verified layout, or ``None`` if the hypothesis does not hold for this torch build."""
    layout = _calibrate(torch)
    return layout if isinstance(layout, dict) else None


def _calibrate(torch: Any) -> dict[str, Any] | str:
    """The verified layout, or why the hypothesis does not hold for this torch build."""
    if sys.maxsize != 2**63 - 1 or sys.byteorder != "little":
        return "not a 64-bit little-endian build"
    tensor_t, param_t = torch.Tensor, torch.nn.Parameter
    plain = torch.zeros(4)
    impl_vtable = _u64(_u64(id(plain) + PYOBJ_TENSORIMPL))
    storage = plain.untyped_storage()
    storage_ptr = _u64(id(storage) + THPSTORAGE_IMPL)
    if storage_ptr != _u64(_u64(id(plain) + PYOBJ_TENSORIMPL) + IMPL_STORAGE):
        return "TensorImpl -> StorageImpl pointer not where expected"
    if _u64(storage_ptr + STORAGE_DATA) != storage.data_ptr():
        return "StorageImpl data pointer not where expected"
    storage_vtable = _u64(storage_ptr)

    dtypes: dict[int, tuple[str, int]] = {}
    for name in dir(torch):
        dt = getattr(torch, name)
        if not isinstance(dt, torch.dtype) or dt.is_complex:
            continue
        try:
            t = torch.empty(2, dtype=dt)
        except (RuntimeError, TypeError):
            continue
        impl = _u64(id(t) + PYOBJ_TENSORIMPL)
        if _u64(impl) != impl_vtable:
            continue  # e.g. quantized dtypes live in another TensorImpl class: attribute path
        idx = _u16(impl + IMPL_DTYPE)
        short = str(dt).removeprefix("torch.")
        if idx in dtypes and dtypes[idx][0] != short:
            return f"dtype index {idx} read for two dtypes"
        dtypes[idx] = (short, t.element_size())

    devices: dict[int, str] = {}
    for dev in ("cpu", "meta"):
        t = torch.zeros(2, device=dev)
        impl = _u64(id(t) + PYOBJ_TENSORIMPL)
        code, index, has = struct.unpack("<bbB", ctypes.string_at(impl + IMPL_DEVICE, 3))
        want_index = -1 if t.device.index is None else t.device.index
        if has != 1 or index != want_index or code < 0 or code in devices:
            return f"device field of a {dev} tensor not as expected"
        devices[code] = t.device.type

    for t in _probe_tensors(torch):
        if type(t) not in (tensor_t, param_t):
            return f"probe tensor of type {type(t).__name__}"
        impl = _u64(id(t) + PYOBJ_TENSORIMPL)
        if _u64(impl) != impl_vtable:
            return "probe tensor with another TensorImpl vtable"
        st = t.untyped_storage()
        sptr = _u64(id(st) + THPSTORAGE_IMPL)
        if sptr != _u64(impl + IMPL_STORAGE) or _u64(sptr) != storage_vtable:
            return "probe tensor's StorageImpl not as expected"
        name, itemsize = dtypes.get(_u16(impl + IMPL_DTYPE), ("?", 0))
        if name != str(t.dtype).removeprefix("torch."):
            return f"dtype field read {name!r} for {t.dtype}"
        off = _i64(impl + IMPL_STORAGE_OFFSET)
        if off != t.storage_offset() or _i64(impl + IMPL_NUMEL) != t.numel():
            return "storage offset or numel field differs from the attribute"
        data = _u64(sptr + STORAGE_DATA)
        if (data + off * itemsize if t.numel() else 0) != t.data_ptr():  # torch: empty -> nullptr
            return "data pointer read differs from data_ptr()"
        ndim = _i64(impl + IMPL_NDIM)
        if ndim != t.dim():
            return "ndim field differs from dim()"
        if ndim <= MAX_INLINE_DIMS:
            sizes_at, strides_at = impl + IMPL_SIZES, impl + IMPL_INLINE_STRIDES
        else:
            sizes_at = _u64(impl + IMPL_SIZES)
            strides_at = sizes_at + 8 * ndim
        sizes = tuple(_i64(sizes_at + 8 * i) for i in range(ndim))
        strides = tuple(_i64(strides_at + 8 * i) for i in range(ndim))
        if sizes != tuple(t.shape) or strides != tuple(t.stride()):
            return "sizes or strides read differ from the attributes"
        code, index, has = struct.unpack("<bbB", ctypes.string_at(impl + IMPL_DEVICE, 3))
        want_index = -1 if t.device.index is None else t.device.index
        if has != 1 or devices.get(code) != t.device.type or index != want_index:
            return "device field differs from the attribute"
    return {
        "tensor_types": (tensor_t, param_t),
        "impl_vtable": impl_vtable,
        "storage_vtable": storage_vtable,
        "dtypes": sorted((i, n, s) for i, (n, s) in dtypes.items()),
        "devices": sorted(devices.items()),
        "offsets": {
            "pyobj_tensorimpl": PYOBJ_TENSORIMPL,
            "impl_storage": IMPL_STORAGE,
            "storage_data": STORAGE_DATA,
            "impl_ndim": IMPL_NDIM,
            "impl_sizes": IMPL_SIZES,
            "impl_inline_strides": IMPL_INLINE_STRIDES,
            "max_inline_dims": MAX_INLINE_DIMS,
            "impl_storage_offset": IMPL_STORAGE_OFFSET,
            "impl_numel": IMPL_NUMEL,
            "impl_dtype": IMPL_DTYPE,
            "impl_device": IMPL_DEVICE,
        },
    }


# What install() decided: None until it ran, then {"on": bool, "why": str | None, "chosen": bool}.
_STATUS: dict[str, Any] | None = None


def status() -> dict[str, Any] | None:
    """What :func:`install` decided (``None`` if it has not run in this process yet)."""
    return None if _STATUS is None else dict(_STATUS)


def _decide() -> tuple[bool, str | None, bool]:
    """(on, why it is off, whether off was the user's choice)."""
    from jitkey import _core

    if os.environ.get("JITKEY_TENSOR_FIELDS", "1") == "0":
        return False, "turned off by JITKEY_TENSOR_FIELDS=0", True
    import torch

    try:
        layout = _calibrate(torch)
    except Exception as e:  # any surprise means: keep the attribute path
        return False, f"calibration against torch {torch.__version__} failed: {type(e).__name__}: {e}", False
    if isinstance(layout, str):
        return False, f"torch {torch.__version__}'s tensor layout is not the verified one ({layout})", False
    _core._install_tensor_layout(layout)
    return True, None, False


def install() -> bool:
    """Calibrate and hand the layout to the Rust side (once per process); returns whether the direct
    path is on. Says so on the ``jitkey.fastpath`` logger when it is off: a warning unless the user chose it."""
    global _STATUS
    if _STATUS is not None:
        return bool(_STATUS["on"])
    on, why, chosen = _decide()
    _STATUS = {"on": on, "why": why, "chosen": chosen}
    if not on:
        from jitkey._log import logger

        log = logger.getChild("fastpath")
        if chosen:
            log.info("direct tensor-field reads are off: %s", why)
        else:
            log.warning(
                "direct tensor-field reads are off: %s; Signature lookups read tensors through Python "
                "attributes instead (2-7x slower, same keys). Set JITKEY_TENSOR_FIELDS=0 to choose this "
                "and silence this warning.",
                why,
            )
    return on
