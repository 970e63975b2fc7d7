"""torch's mode state for DSL sites, read natively (``jitkey._core._TorchModes``) once proven.

A :class:`jitkey.dsl.Site` reads torch's modes on every call: whether a torch function mode or a torch dispatch
mode is active (its checks: the DSL's own path runs then) and the grad and inference modes (in its key). Through
``torch.is_grad_enabled``, ``torch.is_inference_mode_enabled``, ``torch._C._is_torch_function_mode_enabled`` and
``torch._C._len_torch_dispatch_stack`` each read is a Python call (about 0.05-0.1 µs on an H200 host); the C++
functions they wrap are exported by torch's libraries, and ``_TorchModes`` calls them directly.

Three of the four are resolved by C++ mangled names, so they are used only after :func:`prove` has shown, once
per process, that every read returns what its Python function returns (the same value and type) in every state
it can be put in: each mode on and off, nested, and torch function modes disabled inside an active one, and
again on a second thread (the state is per thread). Until then, and whenever the proof fails, the symbols are
missing or ``JITKEY_NATIVE_MODES=0``, sites call the Python functions (``jitkey info``: ``native_modes``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from jitkey._proven import Proven


def functions(torch: Any) -> tuple[Any, Any, Any, Any]:
    """The Python functions the native reads stand for, in ``_TorchModes``' order."""
    return (
        torch.is_grad_enabled,
        torch.is_inference_mode_enabled,
        torch._C._is_torch_function_mode_enabled,
        torch._C._len_torch_dispatch_stack,
    )


def _make(torch: Any) -> tuple[Any, str | None]:
    from jitkey._core import _TorchModes

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        modes = _TorchModes(
            os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libc10.so"), functions(torch)
        )
    except OSError as exc:
        return None, f"torch's mode functions are not available: {exc}"
    try:
        return modes, prove(torch, modes)
    except Exception as exc:  # proving failed: the Python functions it is
        return None, f"proving the native mode reads raised {type(exc).__name__}: {exc}"


#: The path (decided when the first DSL site of the process is made).
PATH = Proven("JITKEY_NATIVE_MODES", "not decided yet (decided when the first DSL site is made)", _make)
#: The proven ``_TorchModes``, or None (see :func:`status`).
get = PATH.get
#: ``{"on": bool | None, "why": reason or None}`` for ``jitkey info`` (``on`` is None while undecided).
status = PATH.status


def _states(torch: Any) -> list[tuple[str, Any]]:
    """``(name, context manager factory)``: the states the proof puts the thread in, one after another."""
    from contextlib import ExitStack, nullcontext

    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class _FunctionProbe(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    class _DispatchProbe(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    def nested(*factories: Any) -> Any:
        stack = ExitStack()
        for f in factories:
            stack.enter_context(f())
        return stack

    return [
        ("no mode set", nullcontext),
        ("torch.no_grad()", torch.no_grad),
        ("torch.enable_grad() inside torch.no_grad()", lambda: nested(torch.no_grad, torch.enable_grad)),
        ("torch.inference_mode()", torch.inference_mode),
        ("inference_mode(False) inside inference_mode()", lambda: nested(torch.inference_mode,
                                                                          lambda: torch.inference_mode(False))),
        ("a torch function mode", _FunctionProbe),
        ("two torch function modes", lambda: nested(_FunctionProbe, _FunctionProbe)),
        ("DisableTorchFunction inside a torch function mode", lambda: nested(_FunctionProbe,
                                                                             torch._C.DisableTorchFunction)),
        ("DisableTorchFunctionSubclass inside a torch function mode", lambda: nested(
            _FunctionProbe, torch._C.DisableTorchFunctionSubclass)),
        ("a torch dispatch mode", _DispatchProbe),
        ("two torch dispatch modes", lambda: nested(_DispatchProbe, _DispatchProbe)),
        ("every mode at once", lambda: nested(torch.no_grad, torch.inference_mode, _FunctionProbe, _DispatchProbe)),
    ]  # fmt: skip


def _compare(modes: Any, where: str) -> str | None:
    want = tuple(f() for f in modes.functions)
    got = tuple(modes.values())
    if got != want or [type(v) for v in got] != [type(v) for v in want]:
        return f"{where}: torch's C++ functions read {got!r}, the Python functions {want!r}"
    return None


def _prove_here(torch: Any, modes: Any) -> str | None:
    for name, factory in _states(torch):
        with factory():
            why = _compare(modes, name)
        if why is not None:
            return why
        why = _compare(modes, f"after {name}")
        if why is not None:
            return why
    return None


def prove(torch: Any, modes: Any) -> str | None:
    """Why ``modes`` does not read what torch's Python functions read (None: it does; see the module docstring)."""
    why = _prove_here(torch, modes)
    if why is not None:
        return why
    out: list[str | None] = ["the proof's thread did not finish"]

    def other_thread() -> None:
        try:
            out[0] = _prove_here(torch, modes)
        except Exception as exc:
            out[0] = f"on another thread: {type(exc).__name__}: {exc}"

    with torch.no_grad():  # per-thread state: the main thread's no_grad must not show on the other thread
        t = threading.Thread(target=other_thread, name="jitkey-modes-proof")
        t.start()
        t.join()
    return None if out[0] is None else f"on another thread: {out[0]}"
