"""The current CUDA device and stream through torch's stable C shim, proven equal to the Python getters.

Triton's CUDA driver reads the current device with ``torch.cuda.current_device`` and the stream with
``torch._C._cuda_getCurrentRawStream``; jitkey's launcher calls ``torch._C._cuda_getDevice`` (what the former
wraps) and the latter, about 0.1-0.2 µs each per launch, and a DSL site (``jitkey.dsl``) keys the current device
on every call. torch (2.11) exports the same two reads as C functions (``aoti_torch_get_current_device_index`` in
``libtorch_cpu``, ``aoti_torch_get_current_cuda_stream`` in ``libtorch_cuda``): :data:`PATH` resolves them from
the libraries torch has loaded (``jitkey._core._TorchCurrent``) and, once per process, proves on live state that
they return what ``torch._C._cuda_getDevice`` and ``torch._C._cuda_getCurrentRawStream`` return:

1. the current device and the current stream of that device, as they are;
2. the stream again while a probe stream (``torch.cuda.ExternalStream`` over an address nothing uses; making it
   current calls no CUDA function) is current on that device: the shim must follow ``torch.cuda.stream()``;
3. the stream once more after it, back to the first.

Anything else (the symbols absent, a mismatch, an error while proving, ``JITKEY_NATIVE_CURRENT=0``) keeps the
Python getters, with the reason (``jitkey info``: ``native_current``); so does a Triton driver whose getters are
not torch's (:func:`native_getters`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from jitkey._core import _TorchCurrent
from jitkey._proven import Proven, cuda_initialized

#: The probe stream's address: even (torch reads an even id as an external stream's pointer) and not one a
#: CUDA stream of this process has (it is never used for anything but the comparison).
PROBE_STREAM = 0x6A69_746B_6500


def resolve(torch: Any) -> tuple[_TorchCurrent | None, str | None]:
    """``(shim, None)``, or ``(None, why not)``: the shim functions from the torch libraries already loaded."""
    if os.environ.get("JITKEY_NATIVE_CURRENT", "").strip() == "0":
        return None, "JITKEY_NATIVE_CURRENT=0"
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        shim = _TorchCurrent(os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libtorch_cuda.so"))
    except OSError as exc:
        return None, f"torch's C shim is not available: {exc}"
    return shim, None


def verify(
    shim: Any,
    get_device: Callable[[], int],
    get_stream: Callable[[int], int],
    use_stream: Callable[[int], contextlib.AbstractContextManager[Any]],
) -> str | None:
    """Why ``shim`` does not read what ``get_device``/``get_stream`` read (``None``: it does, see the module
    docstring). ``use_stream(address)`` makes a stream with that address current on the current device. The
    Python getters are called first, so the shim is never asked before CUDA works for torch."""
    try:
        device = get_device()
        stream = get_stream(device)
        got = (shim.device(), shim.stream(device))
        if got != (device, stream):
            return f"torch's C shim read device/stream {got}, the Python getters {(device, stream)}"
        with use_stream(PROBE_STREAM):
            want = (get_device(), get_stream(device))
            got = (shim.device(), shim.stream(device))
        if want != (device, PROBE_STREAM):
            return f"a probe stream could not be made current (the Python getters read {want})"
        if got != want:
            return f"under another current stream torch's C shim read {got}, the Python getters {want}"
        got = (shim.device(), shim.stream(device))
        if got != (device, stream):
            return f"after the probe stream torch's C shim read {got}, the Python getters {(device, stream)}"
    except Exception as exc:  # proving failed: the Python getters it is
        return f"proving torch's C shim raised {type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def _torch_stream(torch: Any, address: int) -> Iterator[None]:
    with torch.cuda.stream(torch.cuda.ExternalStream(address)):
        yield


def _make(torch: Any) -> tuple[_TorchCurrent | None, str | None]:
    shim, why = resolve(torch)
    if shim is None:
        return None, why
    c = torch._C
    why = verify(
        shim, c._cuda_getDevice, c._cuda_getCurrentRawStream, lambda address: _torch_stream(torch, address)
    )
    return (None, why) if why is not None else (shim, None)


#: The path, decided once CUDA is initialized (at the first launch, or a DSL site's first miss): ``PATH.get()``
#: is the proven ``_TorchCurrent`` or None, ``PATH.status()`` says why.
PATH = Proven(
    "JITKEY_NATIVE_CURRENT",
    "not decided yet (decided at the first launch, or a DSL site's first call, once CUDA is initialized)",
    _make,
    ready=cuda_initialized,
)


def native_getters(
    torch: Any, get_device: Callable[[], int], get_stream: Callable[[int], int]
) -> tuple[_TorchCurrent | None, str | None]:
    """``(shim, None)`` when launches may read the device and stream through torch's C shim, else
    ``(None, why not)``. ``get_device``/``get_stream`` are the getters the launcher would call: the shim
    stands only for torch's own C functions."""
    c = getattr(torch, "_C", None)
    if get_device is not getattr(c, "_cuda_getDevice", None) or get_stream is not getattr(
        c, "_cuda_getCurrentRawStream", None
    ):
        return None, "Triton's driver does not read the device and stream through torch's C functions"
    shim = PATH.get()
    return (shim, None) if shim is not None else (None, PATH.status()["why"])
