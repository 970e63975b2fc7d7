"""Watching what a warm launch reads from Triton's Python objects, so a hit reuses what it read.

Triton's ``JITFunction.run`` reads on every call the kernel's ``debug``, ``pre_run_hooks``, ``device_caches`` and
``used_global_vals``, ``knobs.runtime.debug``, the knobs it folds into the launch options
(``TritonInfo.knob_reads``: ``knobs.compilation.instrumentation_mode``; under 3.9 also
``knobs.compilation.fpsan_homomorphic_casts``, an env knob that reads ``getenv`` on every access),
``knobs.runtime.add_stages_inspection_hook`` (3.7+) and the launch hook chains. jitkey's launcher reads them once
and keeps them (rust/py/src/launch/state.rs) while nothing that could rebind them has run. Each Python path that
can rebind them calls ``jitkey._core._watch_bump()``, which moves a version counter a hit compares:

* attribute assignment and deletion on a :class:`~jitkey.triton.TritonKernel` (its own ``__setattr__`` and
  ``__delattr__``; jitkey's ``_jk_*`` attributes excepted);
* attribute assignment and deletion on Triton's knob objects: ``base_knobs.__setattr__``/``__delattr__``,
  installed here (they are ``object``'s in Triton), so every knob setter, the env knobs' descriptors and
  ``reset()`` included;
* the knobs' ``scope()``, which restores a knob object's ``__dict__`` directly: wrapped to bump when it ends;
* attribute assignment and deletion on a ``HookChain`` (its ``calls`` rebound).

Two reads are compared on every call instead: ``knobs.<section>`` is still the object read (a module attribute
assignment, as Triton's own ``fresh_knobs`` test fixture makes: one dict lookup per section), and, when an env knob
was read, the C environment is still the one read (``environ``'s pointer array; ``os.environ``, ``os.putenv``, the
knobs' setters and C code all change it). What a kept state holds is still looked at per call: ``pre_run_hooks``
and each chain's ``calls`` for emptiness, ``device_caches`` for Triton's kernel, the globals check.

Not watched, so read on every call as before (counted, with the reason, in ``cache_stats()["watched_state"]``):
a kernel whose class replaces ``TritonKernel.__setattr__``; a knob object of a class that is not one of Triton's
(a subclass, a stand-in) or that defines its own ``__setattr__``; a knob attribute that is neither a plain value
nor one of Triton's own env descriptors (``env_bool``, ``env_str``, ``env_int``, ``env_opt_str``,
``env_opt_bool``); an env knob where the C environment cannot be compared (not glibc); a Triton whose knob or
``HookChain`` classes are not the ones this module patches; ``JITKEY_WATCH=0``. Writes that bypass Python's
attribute assignment are not seen: ``kernel.__dict__[...] = ...``, assignments to the knob *classes*
(``runtime_knobs.debug = ...``), a C caller rewriting a ``putenv`` buffer in place.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from jitkey._core import _watch_bump

#: The knob attributes every launcher reads from ``knobs.runtime`` (besides ``TritonInfo.knob_reads``).
RUNTIME_READS = ("debug", "add_stages_inspection_hook", "launch_enter_hook", "launch_exit_hook")
#: The kernel attributes a launcher reads (instance attributes a ``JITFunction`` sets in ``__init__``).
KERNEL_READS = ("debug", "pre_run_hooks", "device_caches", "used_global_vals")
#: Triton's env descriptors whose value is the knob object's ``__dict__`` entry, else ``getenv``/``getenv_bool``.
ENV_KNOBS = ("env_bool", "env_str", "env_int", "env_opt_str", "env_opt_bool")


class Watch(NamedTuple):
    """What ``_TritonLauncher`` takes: ``problem`` (why the state is read on every call, or None) and ``kinds``
    (``{(knob class, attribute): "plain" | "env"}``: the knob reads the watch covers)."""

    problem: str | None
    kinds: dict[tuple[type, str], str]


def _bump_after(write: Any) -> Any:
    """``write`` (``object.__setattr__``/``__delattr__``), then a bump, even when the write raised."""

    @functools.wraps(write)
    def watched(self: Any, *args: Any) -> None:
        try:
            write(self, *args)
        finally:
            _watch_bump()

    watched._jitkey_watch = True  # type: ignore[attr-defined]
    return watched


_setattr = _bump_after(object.__setattr__)
_delattr = _bump_after(object.__delattr__)

_lock = threading.Lock()
_installed: str | None = None  # "ok" or why the patches could not be installed
_kinds: dict[tuple[tuple[str, str, str], ...], dict[tuple[type, str], str]] = {}  # by the knob reads


def _is_ours(f: Any) -> bool:
    return getattr(f, "_jitkey_watch", False) is True


def _patchable(cls: type) -> str | None:
    """Why ``cls``'s attribute writes cannot be watched by installing ``_setattr``/``_delattr`` on it."""
    for name, original in (("__setattr__", object.__setattr__), ("__delattr__", object.__delattr__)):
        f = getattr(cls, name)
        if f is not original and not _is_ours(f):
            return f"{cls.__module__}.{cls.__qualname__} defines its own {name}"
    return None


def _triton_problem() -> str | None:
    """Why this Triton's knobs cannot be watched (without changing anything)."""
    from triton import knobs

    base = getattr(knobs, "base_knobs", None)
    chain = getattr(knobs, "HookChain", None)
    if not isinstance(base, type) or not isinstance(chain, type):
        return "triton.knobs has no base_knobs or HookChain class"
    for cls in (base, chain):
        if (why := _patchable(cls)) is not None:
            return why
    scope = base.__dict__.get("scope")
    if not callable(scope):
        return "triton.knobs.base_knobs has no scope()"
    return None


def problem() -> str | None:
    """Why launches read Triton's state on every call in this process (``None``: it is watched). Changes
    nothing (:func:`install` patches at the first launch)."""
    if os.environ.get("JITKEY_WATCH", "").strip() == "0":
        return "JITKEY_WATCH=0"
    if _installed is not None:
        return None if _installed == "ok" else _installed
    return _triton_problem()


def install() -> str | None:
    """Install the write watches (once per process); returns why they are not installed (``None``: they are)."""
    global _installed
    if _installed is None:
        with _lock:
            if _installed is None:
                _installed = _install() or "ok"
    return None if _installed == "ok" else _installed


def _install() -> str | None:
    from triton import knobs

    if (why := _triton_problem()) is not None:
        return why
    base, chain = knobs.base_knobs, knobs.HookChain
    for cls in (base, chain):
        cls.__setattr__ = _setattr
        cls.__delattr__ = _delattr
    scope = base.__dict__["scope"]
    if not _is_ours(scope):

        @functools.wraps(scope)
        @contextlib.contextmanager
        def watched_scope(self: Any) -> Iterator[None]:
            # scope() restores the knob object's __dict__ (and the environment) directly when it ends.
            try:
                with scope(self):
                    yield
            finally:
                _watch_bump()

        watched_scope._jitkey_watch = True  # type: ignore[attr-defined]
        base.scope = watched_scope
    _watch_bump()
    return None


def _env_types() -> tuple[type, ...]:
    """Triton's own env descriptor classes, as written in triton/knobs.py and reading libtriton's getenv."""
    from triton import knobs

    try:
        from triton._C.libtriton import getenv, getenv_bool
    except ImportError:
        return ()
    if knobs.getenv is not getenv or knobs.getenv_bool is not getenv_bool:
        return ()
    base = knobs.env_base
    out = []
    for name in ENV_KNOBS:
        t = getattr(knobs, name, None)
        if not isinstance(t, type) or not issubclass(t, base):
            continue
        if any(
            getattr(t, m) is not getattr(base, m) for m in ("__get__", "__set__", "__delete__", "transform")
        ):
            continue
        get = t.__dict__.get("get")
        code = getattr(get, "__code__", None)
        if code is None or os.path.realpath(code.co_filename) != os.path.realpath(inspect.getfile(knobs)):
            continue
        out.append(t)
    return tuple(out)


def _kind(cls: type, attr: str, env_types: tuple[type, ...]) -> str | None:
    """How ``getattr(<a cls object>, attr)`` is made: "plain" (the object's ``__dict__``, else a class value that
    is not a descriptor), "env" (one of Triton's env descriptors), or None (anything else)."""
    for k in cls.__mro__:
        if attr in k.__dict__:
            v = k.__dict__[attr]
            break
    else:
        return "plain"
    t = type(v)
    if t in env_types:
        return "env"
    if any(hasattr(t, m) for m in ("__get__", "__set__", "__delete__")):
        return None
    return "plain"


def kinds(reads: list[tuple[str, str, str]]) -> dict[tuple[type, str], str]:
    """``{(knob class, attribute): kind}`` for every watched knob class of ``triton.knobs`` and every attribute a
    launcher reads (``RUNTIME_READS`` and ``reads``, ``TritonInfo.knob_reads``)."""
    from triton import knobs

    env_types = _env_types()
    attrs = {*RUNTIME_READS, *(attr for _, _, attr in reads)}
    out: dict[tuple[type, str], str] = {}
    for cls in vars(knobs).values():
        if (
            not (isinstance(cls, type) and issubclass(cls, knobs.base_knobs))
            or cls.__module__ != knobs.__name__
        ):
            continue
        if not (_is_ours(cls.__setattr__) and _is_ours(cls.__delattr__)):
            continue
        if cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__"):
            continue
        for attr in attrs:
            if (kind := _kind(cls, attr, env_types)) is not None:
                out[(cls, attr)] = kind
    return out


def hook_watch(runtime: Any) -> type | None:
    """The class of ``runtime`` (``triton.knobs.runtime``) when the watch covers its ``launch_enter_hook`` and
    ``launch_exit_hook`` reads (installing the write watches), else None: what a DSL plan's compiled launch
    (``jitkey._core._CompiledLaunch``) keeps its hook reads under."""
    if problem() or install():
        return None
    cls = type(runtime)
    k = _cached_kinds([])
    if all(k.get((cls, attr)) == "plain" for attr in ("launch_enter_hook", "launch_exit_hook")):
        return cls
    return None


def kernel_problem(cls: type) -> str | None:
    """Why attribute writes on kernels of class ``cls`` are not all seen (``None``: they are)."""
    from jitkey.triton._kernel import TritonKernel

    if cls.__setattr__ is not TritonKernel.__setattr__ or cls.__delattr__ is not TritonKernel.__delattr__:
        return f"{cls.__module__}.{cls.__qualname__} replaces TritonKernel's __setattr__/__delattr__"
    if cls.__getattribute__ is not object.__getattribute__:
        return f"{cls.__module__}.{cls.__qualname__} defines __getattribute__"
    for attr in KERNEL_READS:  # instance attributes: only a data descriptor could take their place
        # What the instance lookup finds on the class: the first of its MRO's dicts holding the name (as
        # inspect.getattr_static finds it, without its metaclass handling, which these names never reach).
        v = next((vars(k)[attr] for k in cls.__mro__ if attr in vars(k)), None)
        if hasattr(type(v), "__set__") or hasattr(type(v), "__delete__"):
            return f"{cls.__module__}.{cls.__qualname__}.{attr} is a data descriptor"
    return None


def for_kernel(kernel: Any, reads: list[tuple[str, str, str]]) -> Watch:
    """The watch a launcher of ``kernel`` gets (installing the write watches at the first launch)."""
    why = problem() or install() or kernel_problem(type(kernel))
    if why is not None:
        return Watch(why, {})
    return Watch(None, _cached_kinds(reads))


def _cached_kinds(reads: list[tuple[str, str, str]]) -> dict[tuple[type, str], str]:
    """:func:`kinds`, computed once per list of reads (the knob classes are patched once per process)."""
    key = tuple(reads)
    k = _kinds.get(key)
    if k is None:
        k = _kinds[key] = kinds(reads)
    return k
