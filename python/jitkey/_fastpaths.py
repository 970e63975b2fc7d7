"""Which of jitkey's fast paths are on in this process, and why not when one is off.

Every fast path proves itself on live objects before it is used and falls back to a slower, always
correct path otherwise; this module reports the outcome (``jitkey info``, the bench header and JSON).

- ``cpython_layout``: tuple items and cached ``str`` hashes read straight from the objects (LruCache's
  structural keys, Signature), and one-digit ints (LruCache's structural keys). Decided at import by
  ``jitkey._core`` (CPython 3.10-3.14 GIL builds whose layout a probe confirms); elsewhere the C API is called.
- ``tensor_fields``: dtype, ``data_ptr()``, sizes, strides read from torch's ``TensorImpl``
  (``jitkey._tensor_fields``, decided when the first tensor rule is compiled). ``JITKEY_TENSOR_FIELDS=0``
  turns it off.
- ``native_alloc``, ``native_modes``: a replayed DSL plan's CUDA tensors made through torch's C shim
  (``jitkey._torch_alloc``), and a DSL site's reads of torch's modes through torch's C++ functions
  (``jitkey._torch_modes``); each proven once per process. ``JITKEY_NATIVE_ALLOC=0`` / ``JITKEY_NATIVE_MODES=0``
  turn them off.
- ``native_launcher`` (and other Triton facts): reported by
  ``jitkey.triton.fast_paths()`` where the installed binding provides it; ``unknown`` otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from jitkey import _core
from jitkey._log import logger

FastPath = dict[str, Any]  # {"on": bool | None, "why": str | None, "what": str}

_DESCRIPTIONS = {
    "cpython_layout": "tuple items, str hashes and small ints read directly (CPython layout)",
    "tensor_fields": "tensor dtype/data_ptr/sizes/strides read from torch's TensorImpl",
    "binding": "jitkey.triton.jit returns jitkey kernels (JITKEY_TRITON=plain: plain Triton)",
    "native_launcher": "Triton warm launch in one native call",
    "driver_launch": "Triton hit packs the parameters and calls cuLaunchKernelEx itself",
    "watched_state": "Triton state (kernel attrs, knobs, hooks): watched, kept while unchanged (OFF: per-call reads)",
    "native_current": "Triton hits read the device and stream, DSL sites the device, through torch's C shim (OFF: "
    "torch's Python getters)",
    "native_alloc": "a replayed DSL plan makes its CUDA tensors through torch's C shim (OFF: torch's Python functions)",
    "native_modes": "a DSL site reads torch's grad, inference, function and dispatch modes through torch's C++ "
    "functions (OFF: torch's Python functions)",
    "l2": "a fresh process loads kernels compiled earlier from jitkey's disk index (no Triton compile path)",
}


def _gil_enabled() -> bool:
    f = getattr(sys, "_is_gil_enabled", None)
    return True if f is None else bool(f())


def cpython_layout() -> FastPath:
    """The CPython layout reads (decided by ``jitkey._core`` at import; the reasons mirror its checks)."""
    on = bool(_core._FAST_LAYOUT)
    why = None
    expected = False
    if not on:
        v = sys.version_info
        if not (v.major == 3 and 10 <= v.minor <= 14):
            why = f"CPython {v.major}.{v.minor} is outside the proven 3.10-3.14 (the C API is used)"
        elif not _gil_enabled():
            why = "free-threaded interpreter (the C API is used)"
            expected = True
        elif hasattr(sys, "getobjects"):
            why = "a Py_TRACE_REFS build (the C API is used)"
            expected = True
        else:
            why = "the import-time probe of the tuple/str layout did not match (the C API is used)"
    return {"on": on, "why": why, "chosen": expected, "what": _DESCRIPTIONS["cpython_layout"]}


def tensor_fields(*, decide: bool = True) -> FastPath:
    """The direct tensor-field reads. ``decide``: compile a tensor rule if none was yet, so the answer is
    what a ``Signature`` in this process gets (imports torch)."""
    from jitkey import _tensor_fields

    what = _DESCRIPTIONS["tensor_fields"]
    st = _tensor_fields.status()
    if st is None:
        if importlib.util.find_spec("torch") is None:
            return {"on": False, "why": "torch is not installed", "chosen": False, "what": what}
        if not decide:
            return {
                "on": None,
                "why": "not decided yet (no tensor rule compiled)",
                "chosen": False,
                "what": what,
            }
        from jitkey import Signature, rules

        Signature([("x", rules.tensor())])  # the first tensor rule runs _tensor_fields.install()
        st = _tensor_fields.status()
    if st is None:  # install() did not run or failed before deciding
        on = bool(_core._tensor_layout_installed())
        return {"on": on, "why": None if on else "calibration did not run", "chosen": False, "what": what}
    return {"on": bool(st["on"]), "why": st["why"], "chosen": bool(st["chosen"]), "what": what}


def triton_paths() -> dict[str, FastPath]:
    """The Triton binding's fast paths, from ``jitkey.triton.fast_paths()`` when it exists."""
    unknown = {"on": None, "chosen": False}
    if importlib.util.find_spec("triton") is None:
        why: str | None = "triton is not installed"
        facts: dict[str, Any] = {}
    else:
        try:
            import jitkey.triton as jt

            facts = dict(jt.fast_paths())
            why = None
        except (ImportError, AttributeError) as e:
            facts, why = {}, f"unknown ({type(e).__name__}: {e})"
        except Exception as e:  # the report must not fail because the binding did
            facts, why = {}, f"unknown (jitkey.triton.fast_paths() raised {type(e).__name__}: {e})"
    out: dict[str, FastPath] = {}
    known = (
        "binding",
        "native_launcher",
        "driver_launch",
        "watched_state",
        "native_current",
        "l2",
    )
    for name in (*known, *sorted(set(facts) - set(known))):
        if name == "binding" and name not in facts and why is None:
            continue  # an older binding without the switch
        if name in facts and isinstance(facts[name], dict):
            f = facts[name]
            on = f.get("on")
            out[name] = {
                "on": None if on is None else bool(on),
                "why": f.get("why"),
                "chosen": bool(f.get("chosen", name == "binding" and os.environ.get("JITKEY_TRITON"))),
                "what": _DESCRIPTIONS.get(name, name.replace("_", " ")),
            }
        else:
            out[name] = {**unknown, "why": why or "unknown", "what": _DESCRIPTIONS.get(name, name)}
    return out


def native_alloc() -> FastPath:
    """Whether replayed DSL plans allocate natively (``jitkey._torch_alloc``; decided at the first recorded CUDA
    allocation of the process, unknown before)."""
    from jitkey import _torch_alloc

    return _torch_alloc.PATH.fast_path(_DESCRIPTIONS["native_alloc"])


def native_modes() -> FastPath:
    """Whether DSL sites read torch's modes natively (``jitkey._torch_modes``; decided when the first site of the
    process is made, unknown before)."""
    from jitkey import _torch_modes

    return _torch_modes.PATH.fast_path(_DESCRIPTIONS["native_modes"])


def fast_paths(*, decide: bool = True, triton: bool = True) -> dict[str, FastPath]:
    """Every fast path: name -> ``{"on": bool | None (unknown), "why": str | None, "chosen": bool, "what"}``."""
    out = {"cpython_layout": cpython_layout(), "tensor_fields": tensor_fields(decide=decide)}
    if triton:
        out.update(triton_paths())
    out["native_alloc"] = native_alloc()
    out["native_modes"] = native_modes()
    return out


def report_import_time() -> None:
    """At ``import jitkey``: say once if the CPython layout reads are off (a warning when unexpected)."""
    st = cpython_layout()
    if st["on"]:
        return
    log = logger.getChild("fastpath")
    if st["chosen"]:
        log.info("CPython layout reads are off: %s", st["why"])
    else:
        log.warning("CPython layout reads are off: %s; key lookups are somewhat slower", st["why"])
