"""Launch warm Triton kernels without Triton's per-call Python dispatch.

``jitkey.triton.jit`` (a drop-in for ``triton.jit``) returns a :class:`TritonKernel`, which *is* a
``triton.runtime.JITFunction``: inspection (``fn``, ``src``, ``params``, ``cache_key``, ...), use as a
helper from other kernels (inline or ``noinline``; editing a helper recompiles its callers), ``warmup``,
``preload``, hooks and torch.compile all behave as Triton's. Only the warm launch differs:

* **Key.** Every call builds a key at least as fine as Triton's own specialization: the current device
  index, per parameter Triton's buckets (tensor dtype + 16-byte alignment; int range class, ``== 1`` and
  ``% 16``; bool before int; float; None; tuples and named tuples recursively; constexpr values tagged
  with their type, including ``tl.constexpr``, ``tl.dtype`` and jit functions by their ``cache_key``;
  ``triton.reinterpret`` tensors; host ``TensorDescriptor`` objects; ``do_not_specialize`` /
  ``do_not_specialize_on_alignment`` honoured), defaults, the sorted launch options and the knob state
  Triton folds in per call (every ``kwargs[...] = knobs.x.y`` the installed ``JITFunction.run`` makes).
* **Miss.** Triton itself runs the call (``JITFunction.run``: it binds, compiles if needed, launches and
  returns the ``CompiledKernel`` it chose). jitkey stores that kernel with where Triton keeps it
  (``device_caches[device][0][key]``), so a hit can never pick a kernel Triton would not pick, and
  whatever drops Triton's entry (``device_caches.clear()``, a source change) drops jitkey's. A kernel an
  earlier process compiled comes from jitkey's L2 instead (:mod:`jitkey.triton._l2`): built from Triton's cache
  entry as ``triton.compile`` builds it on a cache hit, put where Triton keeps it, launched as a hit, without
  Triton's installation hash, binder or compile path.
* **Hit.** The current stream is read on every call (``torch.cuda.stream()`` and CUDA-graph capture
  work); launch hooks and ``launch_metadata`` are passed only when a hook chain is non-empty (checked per
  call); globals the kernel reads are checked like Triton does; then ``ck.run(...)``, or the CUDA
  launcher's C ``launch`` with the same arguments when ``CudaLauncher.__call__`` is code known to only
  forward to it and the kernel needs no scratch buffer. The whole hit is one native call.
* **Fallback.** Anything not proven safe goes through Triton's own path, counted per reason in
  :meth:`TritonKernel.cache_stats` and logged once per kernel and reason on the ``jitkey.triton`` logger
  (DEBUG): ``pre_run_hooks``, arguments outside the rules, unkeyable launch options, a Triton whose
  internals do not look like the ones this package was written against, a non-CUDA driver, a
  ``jit_cache_hook`` veto.

``@triton.autotune`` / ``@triton.heuristics`` over ``@jitkey.triton.jit`` keep Triton's logic and launch
through the fast path. :func:`jitkey.triton.autotune` is a persistent autotuner. :func:`install` routes
every kernel decorated afterwards with ``triton.jit`` through jitkey (``pytest -p jitkey.pytest_plugin``
does it for a test suite and reports the fast path's coverage); ``JITKEY_TRITON=plain`` makes
:func:`jit` return plain Triton kernels.
"""

from __future__ import annotations

try:
    import triton as _triton  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised by the packaging tests
    from jitkey import _deps

    raise _deps.missing("triton", "jitkey.triton") from _exc

import contextlib
import importlib.abc
import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jitkey import _triton_table
from jitkey._core import _register_key_adapter
from jitkey.errors import Unkeyable
from jitkey.triton._kernel import (
    TritonKernel,
    bind,
    install,
    installed,
    jit,
    kept,
    kernels_made,
    plain,
    registry,
    uninstall,
)

if TYPE_CHECKING:
    from jitkey.triton._installed import triton_info  # noqa: F401 - for type checkers (see _LAZY)
    from jitkey.triton.autotune import PersistentAutotuner, autotune

# Imported at first use (see _Package): the autotuner, and what jitkey reads from the installed Triton (its
# launcher, knob reads and runtime: a kernel's first launch needs it, decoration does not).
_LAZY = {
    "PersistentAutotuner": "jitkey.triton.autotune",
    "autotune": "jitkey.triton.autotune",
    "triton_info": "jitkey.triton._installed",
}


class _Package(types.ModuleType):
    """This package's module type: the names of ``_LAZY`` are imported at first use (a kernel library that only
    decorates kernels does not pay for the autotuner or the Triton checks at import), and the name
    ``autotune`` stays the function even after the submodule of that name is imported (which binds the
    submodule to its package's attribute)."""

    def __getattr__(self, name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "autotune" and isinstance(value, types.ModuleType):
            value = value.autotune
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _register_key_adapters() -> None:
    """Key Triton's argument types like Triton's own specialization does (``jitkey._triton_table.KEY_ADAPTERS``,
    see ``_core._register_key_adapter``); called once, when this package is imported.

    An adapter whose module Triton has not imported yet (``triton.tools.tensor_descriptor``: only a program that
    makes descriptors imports it) is registered right after that module is first imported (:class:`_AfterImport`),
    so importing jitkey does not import it: no object of its types can exist before then."""
    pending: dict[str, list[tuple[str, Callable[[Any], Any], bool]]] = {}
    for module, name, adapter, subclasses in _triton_table.KEY_ADAPTERS:
        if module in sys.modules:
            _register(getattr(sys.modules[module], name, None), adapter, subclasses)
        else:
            pending.setdefault(module, []).append((name, adapter, subclasses))
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


def _register(cls: Any, adapter: Callable[[Any], Any], subclasses: bool) -> None:
    if isinstance(cls, type):
        _register_key_adapter(cls, adapter, subclasses=subclasses)


class _AfterImport:
    """A ``sys.meta_path`` finder that answers for the modules in ``pending`` only: it finds them with the other
    finders and wraps their loader so that, once the module has run, its key adapters are registered (then it
    steps out of ``sys.meta_path``). A module it cannot wrap (no ``exec_module``) is left as found: its types
    are then unkeyable, and a launch with them falls back to Triton, counted."""

    def __init__(self, pending: dict[str, list[tuple[str, Callable[[Any], Any], bool]]]) -> None:
        self.pending = pending
        self.lock = threading.Lock()
        self.busy = threading.local()  # another finder that asks all of sys.meta_path asks this one again

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.pending or getattr(self.busy, "on", False):
            return None
        self.busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy.on = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Then(spec.loader, self.ran)
        return spec

    def ran(self, module: types.ModuleType) -> None:
        with self.lock:
            todo = self.pending.pop(module.__name__, [])
            if not self.pending:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
        for name, adapter, subclasses in todo:
            _register(getattr(module, name, None), adapter, subclasses)


class _Then(importlib.abc.Loader):
    """A module loader that runs ``after(module)`` once ``loader`` has run the module, then puts ``loader`` back as
    the module's loader; everything else is ``loader``'s."""

    def __init__(self, loader: Any, after: Callable[[types.ModuleType], None]) -> None:
        self.loader = loader
        self.after = after

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        # the module keeps no trace of the wrapper: its loader is the one that found it
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        try:
            self.after(module)
        except Exception:  # not the importer's problem: its types stay unkeyable, launches fall back
            logging.getLogger("jitkey.triton").debug(
                "jitkey.triton: registering the key adapters of %s failed", module.__name__, exc_info=True
            )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


# Triton's argument types (dtypes, constexprs, JIT functions, tensor wrappers and descriptors) are keyable from
# here on, decorated kernel or not.
_register_key_adapters()

__all__ = [
    "PersistentAutotuner",
    "TritonKernel",
    "Unkeyable",
    "autotune",
    "bind",
    "fast_paths",
    "install",
    "installed",
    "jit",
    "merge_reports",
    "report",
    "uninstall",
]


def fast_paths() -> dict[str, dict[str, Any]]:
    """Which of this package's fast paths are on: name → ``{"on": bool, "why": str | None}``.

    ``binding``: ``jit`` returns jitkey kernels (off under ``JITKEY_TRITON=plain``); ``native_launcher``:
    warm launches run natively (off when the installed Triton's internals are not the ones jitkey knows);
    ``driver_launch``: hits pack the kernel's parameters and call ``cuLaunchKernelEx`` themselves (off when
    the installed Triton's launcher code is not one jitkey mirrors, Triton 3.6.0's or 3.9.0's, or under
    ``JITKEY_DRIVER_LAUNCH=0``); ``watched_state``: hits reuse what they read from Triton's objects (the
    kernel's attributes, the knobs, the hook chains) while watched write paths show it unchanged, instead of
    reading it on every call (off under ``JITKEY_WATCH=0`` or when this Triton's knobs cannot be watched;
    per kernel, ``cache_stats()["watched_state"]``); ``native_current``: hits read the current device and
    stream through torch's C shim, proven equal to torch's Python getters at the first launch (``on`` is
    ``None`` until then; off under ``JITKEY_NATIVE_CURRENT=0``, without the shim's symbols, or when the proof
    failed); ``l2``: a launch that misses in memory loads a kernel an earlier process compiled from jitkey's
    disk index instead of Triton's compile path (opt-in: on under ``JITKEY_TRITON_L2=1``; off for a Triton
    whose compile and cache code jitkey does not know, or without a usable disk index; see
    :mod:`jitkey.triton._l2`).
    """
    from jitkey.triton import _l2
    from jitkey.triton._installed import triton_info

    info = triton_info()
    return {
        "binding": {"on": not plain(), "why": "JITKEY_TRITON=plain" if plain() else None},
        "native_launcher": {"on": info.problem is None, "why": info.problem},
        "driver_launch": {"on": info.driver_launch_problem is None, "why": info.driver_launch_problem},
        "watched_state": _watched_state(info),
        "native_current": _native_current(),
        "l2": _l2.status(),
    }


def _watched_state(info: Any) -> dict[str, Any]:
    from jitkey.triton import _watch  # not at import: the first launch installs and uses it

    why = info.problem or _watch.problem()
    return {"on": why is None, "why": why, "chosen": why == "JITKEY_WATCH=0"}


def _native_current() -> dict[str, Any]:
    from jitkey import _torch_current  # not at import: decoration does not need it (the first launch does)
    from jitkey.triton import _installed

    rt = _installed.runtime
    if rt is not None:
        why = getattr(rt, "native_problem", "the runtime has no native getters")
        on = getattr(rt, "native", None) is not None
        return {"on": on, "why": why, "chosen": why == "JITKEY_NATIVE_CURRENT=0"}
    if _installed.runtime_problem is not None:
        return {"on": False, "why": _installed.runtime_problem}
    if _torch_current.PATH.state is not None:  # decided by a DSL site before any launch
        st = _torch_current.PATH.status()
        return {**st, "chosen": st["why"] == "JITKEY_NATIVE_CURRENT=0"}
    try:
        import torch
    except ImportError:
        return {"on": False, "why": "torch is not installed"}
    shim, why = _torch_current.resolve(torch)
    if shim is None:
        return {"on": False, "why": why, "chosen": why == "JITKEY_NATIVE_CURRENT=0"}
    return {
        "on": None,
        "why": "torch's C shim is present; it is proven against torch's getters at the first launch",
    }


def report(top: int = 10) -> dict[str, Any]:
    """What every jitkey kernel of this process did (the fast-path report of ``jitkey.pytest_plugin``).

    ``kernels``, ``launches`` (hits + misses + fallbacks), ``hits``, ``misses`` (Triton ran the call, compiling if
    needed), ``fallbacks`` and ``fallback_reasons``, ``warm_fast_path`` (hits / (hits + fallbacks): the share of
    launches that did not compile and took the fast path), ``driver_launches`` (hits, and misses the L2 served, that
    jitkey packed and launched itself), ``launcher_reasons`` (hits a launch plan declined and handed to Triton's
    launcher, by reason), ``unplanned_variants`` (compiled variants without a launch plan, by reason: all their hits
    use Triton's launcher), ``l2_hits`` (misses served from jitkey's disk index: a kernel an earlier process
    compiled, loaded without Triton's compile path), ``l2_misses`` (misses the index did not have: Triton compiled
    or loaded them), ``l2_recorded`` (kernels Triton gave that were recorded for later processes), ``l2_skipped``
    (misses left to Triton's path, by reason), ``l2_walks`` (the first ``cache_key`` of each jit function, kernel or
    helper, jitkey asked for in this process: ``replayed`` from the walk an earlier process recorded, or ``walked``
    by Triton; a helper that Triton's walk of its caller reaches is not counted), ``kept`` (kernels :func:`install`
    left to Triton, by reason: Triton's own, Inductor's) and the ``busiest`` kernels by launches.
    """
    per_kernel = []
    for ks in registry():
        s = ks.snapshot()
        counts = {k: s[k] for k in ("hits", "misses", "fallbacks")}
        launches = sum(counts.values())
        per_kernel.append(
            {
                "kernels": 1,
                "launches": launches,
                **counts,
                "fallback_reasons": s["fallback_reasons"],
                "driver_launches": s["driver_launches"],
                "launcher_reasons": s["launcher_reasons"],
                "unplanned_variants": s["unplanned_variants"],
                "l2_hits": s["l2_hits"],
                "l2_misses": s["l2_misses"],
                "l2_recorded": s["l2_recorded"],
                "l2_skipped": s["l2_skipped"],
                "busiest": [{"kernel": ks.name, "launches": launches, **counts}],
            }
        )
    out = merge_reports(per_kernel, top)
    out["kernels"] = kernels_made()  # every kernel made, used or not (only used ones have statistics)
    out["kept"] = dict(kept)
    walk = sys.modules.get("jitkey.triton._walk")  # imported by the L2's first lookup
    out["l2_walks"] = {k: int(walk.counts[k]) if walk else 0 for k in ("replayed", "walked")}
    return out


def merge_reports(reports: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Sum fast-path reports (of several kernels, or of several processes' :func:`report`) into one."""
    out: dict[str, Any] = {"kernels": 0, "launches": 0, "hits": 0, "misses": 0, "fallbacks": 0}
    driver = 0
    l2 = {"l2_hits": 0, "l2_misses": 0, "l2_recorded": 0}
    l2_skipped: dict[str, int] = {}
    reasons: dict[str, int] = {}
    launcher: dict[str, int] = {}
    unplanned: dict[str, int] = {}
    kept_: dict[str, int] = {}
    walks = {"replayed": 0, "walked": 0}
    busiest: dict[str, dict[str, int]] = {}
    for r in reports:
        for k in out:
            out[k] += r[k]
        for why, n in r["fallback_reasons"].items():
            reasons[why] = reasons.get(why, 0) + n
        driver += r["driver_launches"]
        for why, n in r["launcher_reasons"].items():
            launcher[why] = launcher.get(why, 0) + n
        for why, n in r["unplanned_variants"].items():
            unplanned[why] = unplanned.get(why, 0) + n
        for k in l2:
            l2[k] += r[k]
        for why, n in r["l2_skipped"].items():
            l2_skipped[why] = l2_skipped.get(why, 0) + n
        for why, n in r.get("kept", {}).items():  # a process's report has it, a kernel's does not
            kept_[why] = kept_.get(why, 0) + n
        for k, n in r.get("l2_walks", {}).items():  # so has this
            if k in walks:
                walks[k] += n
        for b in r["busiest"]:
            d = busiest.setdefault(b["kernel"], {"launches": 0, "hits": 0, "misses": 0, "fallbacks": 0})
            for k in d:
                d[k] += b[k]
    warm = out["hits"] + out["fallbacks"]
    out["warm_fast_path"] = out["hits"] / warm if warm else None
    out["fallback_reasons"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
    out["driver_launches"] = driver
    out["launcher_reasons"] = dict(sorted(launcher.items(), key=lambda kv: -kv[1]))
    out["unplanned_variants"] = dict(sorted(unplanned.items(), key=lambda kv: -kv[1]))
    out.update(l2)
    out["l2_skipped"] = dict(sorted(l2_skipped.items(), key=lambda kv: -kv[1]))
    out["kept"] = dict(sorted(kept_.items(), key=lambda kv: -kv[1]))
    out["l2_walks"] = walks
    ranked = sorted(busiest.items(), key=lambda kv: -kv[1]["launches"])[:top]
    out["busiest"] = [{"kernel": name, **d} for name, d in ranked]
    return out
