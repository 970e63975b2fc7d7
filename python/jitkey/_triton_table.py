"""Everything jitkey knows about particular Triton releases, in one table (adding a release: a row here, and a
dialect in ``rust/py/src/launch``).

Data and small pure functions only: importing this module never imports Triton (``jitkey.fnkey`` reads it
without Triton; ``jitkey.triton`` applies it). What each part is for:

- :data:`LAUNCHER_CODE`: the nvidia backend's launcher code, by digest (``jitkey.triton._installed.
  launcher_code_digest``), mapped to the dialect whose packing ``jitkey._core._LaunchPlan`` mirrors byte for byte
  (``tests/test_driver_launch.py`` compares them on a stand-in driver). Other code keeps every launch in
  Triton's launcher.
- :data:`RUN_DEBUG_RULE`, :data:`RUN_KNOBS`, :data:`RUN_NEEDS`: what ``JITFunction.run``'s source must say for
  jitkey's hit to do what it does (``jitkey.triton._installed._scan_run``); anything else turns the fast
  path off.
- :data:`KEY_ADAPTERS`: how Triton specializes on its own argument types, registered with
  ``jitkey._core._register_key_adapter`` when ``jitkey.triton`` is imported (a module Triton has not imported
  by then, right after it is: ``jitkey.triton._register_key_adapters``).
- :data:`FNKEY_TYPES`: the Triton types ``jitkey.fnkey`` follows or keys by value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Digest of the launcher code (see module doc) -> the launch plan's dialect.
LAUNCHER_CODE: dict[str, str] = {
    "9ded4ac450b4cb48db357007f0d753b43c80dc04ae0b9fc5eee5a22d6ced5588": "3.6",  # triton 3.6.0
    "3e55fccea0e72e3c9f3033ed028197fd7f9da6defaf0cc4b33bfad9281e7fbe3": "3.9",  # triton 3.9.0
}

#: ``JITFunction.run``'s rule for ``kwargs["debug"]``, the one rule that is not a plain knob read.
RUN_DEBUG_RULE = 'kwargs.get("debug", self.debug) or knobs.runtime.debug'

#: The knobs ``JITFunction.run`` may read besides the ``kwargs[name] = knobs.section.attr`` reads it is scanned
#: for (those are read per call by jitkey too): the debug rule's and the hooks' that jitkey watches.
RUN_KNOBS: frozenset[tuple[str, str]] = frozenset(
    ("runtime", a) for a in ("debug", "launch_enter_hook", "launch_exit_hook", "add_stages_inspection_hook")
)

#: Fragments ``JITFunction.run``'s source must contain, each with what its absence means.
RUN_NEEDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("self.pre_run_hooks",), "JITFunction.run no longer uses self.pre_run_hooks"),
    (("self.used_global_vals",), "JITFunction.run no longer uses self.used_global_vals"),
    (("kernel.run(",), "JITFunction.run no longer uses kernel.run("),
    (("launch_metadata",), "JITFunction.run no longer uses launch_metadata"),
    (("grid(bound_args)",), "JITFunction.run calls a callable grid differently"),
    (("self.device_caches[device]", "kernel_cache.get(key"), "JITFunction.run keeps its kernels differently"),
)


def cache_key(f: Any) -> Any:
    """``f.cache_key`` (a ``JITCallable``'s: its source, its dependencies and the constexpr globals it reads),
    leaving ``f`` as it was when it raises: Triton's property stores a placeholder hash before it visits the
    source, and one that raises (an inner kernel's conflicting global) leaves the placeholder behind, so a
    later read by Triton's own path would return it instead of raising Triton's error. The first one in a
    process is replayed from the L2 where it holds a recording of Triton's walk (``jitkey.triton._walk``)."""
    had = "hash" in f.__dict__
    before = f.__dict__.get("hash")
    if before is None:
        from jitkey.triton._walk import restore_if_on

        restore_if_on(f)
    try:
        return f.cache_key
    except BaseException:
        if had:
            f.hash = before
        raise


def _constexpr_key(c: Any) -> Any:
    return c.value


def _dtype_key(d: Any) -> Any:
    return d.name


def _wrapper_key(w: Any) -> Any:
    # triton.reinterpret(tensor, dtype): Triton specializes it as a pointer to ``dtype`` and on the 16-byte
    # alignment of its data pointer (the alignment bit is always kept: finer is safe).
    return (w.dtype, w.data_ptr() & 15 == 0)


def _descriptor_key(d: Any) -> Any:
    # A host TensorDescriptor: Triton's type is ``tensordesc<dtype[block_shape]>``; shape and strides are runtime
    # arguments. The padding mode is kept too (finer than Triton's key).
    return (d.base.dtype, tuple(d.block_shape), d.padding)


#: (module, type name, adapter, subclasses too). Triton keys a ``JITCallable`` (a jit function passed as an
#: argument, a constexpr function) by its ``cache_key``. Exact types only where a subclass could carry more than
#: the adapter reads (``tl.dtype``'s subclasses: pointer and block types). A type this Triton lacks is simply
#: not keyable (a call that passes one takes Triton's own path), so an unknown Triton still imports.
KEY_ADAPTERS: tuple[tuple[str, str, Callable[[Any], Any], bool], ...] = (
    ("triton.language", "constexpr", _constexpr_key, False),
    ("triton.language", "dtype", _dtype_key, False),
    ("triton.runtime.jit", "JITCallable", cache_key, True),
    ("triton.runtime.jit", "TensorWrapper", _wrapper_key, False),
    ("triton.tools.tensor_descriptor", "TensorDescriptor", _descriptor_key, False),
)

#: fnkey's name for a Triton type -> where it lives, first found wins (``JITCallable`` is Triton >= 3.5's base
#: of jit functions; before it, ``JITFunction`` stands for it).
FNKEY_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "JITFunction": (("triton.runtime.jit", "JITFunction"),),
    "JITCallable": (("triton.runtime.jit", "JITCallable"), ("triton.runtime.jit", "JITFunction")),
    "Heuristics": (("triton.runtime.autotuner", "Heuristics"),),
    "Autotuner": (("triton.runtime.autotuner", "Autotuner"),),
    "constexpr": (("triton.language.core", "constexpr"),),
    "dtype": (("triton.language.core", "dtype"),),
    "pointer_type": (("triton.language.core", "pointer_type"),),
    "base_type": (("triton.language.core", "base_type"),),
}


def resolve(places: tuple[tuple[str, str], ...]) -> Any:
    """The first of ``places`` (module, name) that this Python's Triton has, else ``None`` (imports the module)."""
    import importlib

    for module, name in places:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None
