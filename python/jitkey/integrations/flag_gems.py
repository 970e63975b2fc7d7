"""jitkey under FlagGems: a FlagGems op call through :mod:`jitkey.dsl`.

:func:`install` puts one :class:`jitkey.dsl.Site` in front of every op FlagGems registers (``_FULL_CONFIG``:
what ``flag_gems.enable()`` / ``use_gems()`` register with torch, and the same functions under ``flag_gems``
and ``flag_gems.ops``), so a warm op call is keyed natively and replays what the op did for that key:

* **Key**: every argument exactly (:func:`jitkey.dsl.exact`), keyword-only arguments and defaults bound as
  the op declares them, the current device, torch's grad and inference modes.
* **Plan**: the op's own Python (type promotion, broadcasting, output allocation, tiling, the grid, the
  argument order of ``pointwise_dynamic``'s generated wrappers and of hand-written ops) recorded once per key;
  its allocations and other torch calls replayed; each launch replayed as ``LibEntry`` makes it on a hit
  (``CompiledKernel[grid](*all_args)``), natively: the compiled kernel ``LibEntry`` chose for that call is
  launched by jitkey's own launch, as long as every pointer argument has the 16-byte alignment it was chosen
  for (otherwise that launch asks ``LibEntry.run`` again, with the same arguments). ``StridedBuffer`` views
  with no offset are launched as their base tensors (a launch reads only their data pointer).
* **Not replayed** (counted): calls ``LibEntry`` compiles or tunes (the next call records), ops whose Python
  reads tensor data or pointers for its own decisions, draws from torch's random number generators
  (FlagGems' philox offsets), makes a launch jitkey cannot capture, or captures tensors in a grid function;
  ops with ``*args``. While FlagGems' logger would record a call (DEBUG with a handler that takes the
  record: ``use_gems(record=True)``), ops run FlagGems' own path, so every call is logged as FlagGems logs it;
  a logger left at DEBUG with no handler (as ``use_gems(record=True)`` leaves it on exit) records nothing, and
  replays go on.

Call :func:`install` (or :func:`jitkey.install`) before ``flag_gems.enable()`` / ``use_gems()`` register the
ops with torch: registrations made earlier keep FlagGems' own functions. Supported: FlagGems 5.0.0.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from jitkey import dsl
from jitkey.integrations import adapter_report, install_once

LIBRARY = "flag_gems"
SUPPORTED = ("5.0.0",)

__all__ = ["LIBRARY", "SUPPORTED", "install", "installed", "report", "uninstall"]

_lock = threading.Lock()
_saved: dict[str, Any] | None = None
_tls = threading.local()
_launches: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------------------------------------------------
# Capturing what LibEntry launches (only while a recording is in progress on this thread)
# ---------------------------------------------------------------------------------------------------------


class _Capture:
    __slots__ = ("launches",)

    def __init__(self) -> None:
        self.launches: list[tuple[Any, Any, tuple[Any, ...]]] = []


def _ck_getitem(self: Any, grid: Any) -> Any:
    """``CompiledKernel.__getitem__`` under :func:`install`: inside a captured ``LibEntry.run``, the launch
    is noted (kernel, grid, arguments) before it runs."""
    runner = _saved["ck_getitem"](self, grid)  # type: ignore[index]
    cap = getattr(_tls, "cap", None)
    if cap is None:
        return runner

    def noted(*args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            cap.launches.append((self, grid, args))
        else:  # an explicit stream: not a launch a plan replays
            cap.launches.append((None, None, ()))
        return runner(*args, **kwargs)

    return noted


def _libentry_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``LibEntry.run`` under :func:`install`: FlagGems' own, and inside a recording a step of the plan."""
    run = _saved["libentry_run"]  # type: ignore[index]
    rec = dsl._current()
    if rec is None or rec.depth or rec.problem is not None or threading.get_ident() != rec.thread:
        return run(self, *args, **kwargs)
    cap, prev = _Capture(), getattr(_tls, "cap", None)
    _tls.cap = cap
    rec.check_rng()
    rec.depth += 1
    try:
        result = run(self, *args, **kwargs)
        if len(cap.launches) == 1 and cap.launches[0][0] is not None:
            _compiled_step(rec, self, cap.launches[0], args, kwargs, result)
        elif not cap.launches:
            rec.refuse(dsl.TRANSIENT_COMPILE)  # LibEntry compiled (or tuned): the next call records
        else:
            rec.refuse("a LibEntry call made a launch jitkey does not replay")
    finally:
        rec.depth -= 1
        rec.sync_rng()
        _tls.cap = prev
    return result


def _compiled_launch(ck: Any, device: int) -> Any:
    """The ``_CompiledLaunch`` of ``ck`` on ``device`` (made once; None: the kernel cannot be launched so)."""
    per = _launches.get(ck)
    if per is not None and device in per:
        return per[device]
    from jitkey._core import _TritonEntry
    from jitkey.triton import _installed, _watch

    rt = _installed.get_runtime()
    out = None
    if rt is not None:
        try:
            ck._init_handles()
            nparams = len(ck.src.signature)
            plan, _why = _installed.launch_plan(ck, ck.run, nparams)
            entry = _TritonEntry(ck, ck.run, ck.function, ck.packed_metadata, None, None, plan)
            info = _installed.triton_info()
            out = (entry, rt, info.knobs, info.HookChain, _watch.hook_watch(info.knobs.runtime))
        except Exception:  # a kernel jitkey does not understand: LibEntry launches it
            out = None
    _launches.setdefault(ck, {})[device] = out
    return out


def _strided_types() -> tuple[type, ...]:
    from flag_gems.utils.tensor_wrapper import StridedBuffer

    return (StridedBuffer,)


def _compiled_step(rec: Any, le: Any, launch: Any, args: Any, kwargs: Any, result: Any) -> None:
    """Adds the launch ``LibEntry`` made to the recording: ``ck[grid](*all_args)`` natively, with
    ``LibEntry.run(*args, **kwargs)`` when a pointer's alignment differs."""
    import torch

    from jitkey._core import _CompiledLaunch

    ck, grid, all_args = launch
    sb_type: tuple[type, ...] = _strided_types()
    if not (isinstance(grid, tuple) and len(grid) == 3 and all(type(g) is int for g in grid)):
        rec.refuse("a LibEntry launch with a grid that is not three ints")
        return
    device = rec.device if rec.device is not None else 0
    made = _compiled_launch(ck, device)
    if made is None:
        rec.refuse("a compiled kernel jitkey cannot launch itself")
        return
    params = le.jit_function.params
    constexpr = {p.name for p in params if p.is_constexpr}
    fast: list[Any] = [("c", grid)]
    aligned: list[tuple[int, bool]] = []
    a: Any
    for i, a in enumerate(all_args):
        if i < len(params) and params[i].is_constexpr:
            fast.append(("c", a))  # a compile-time value (an int, a tl.dtype, ...): fixed by the key
        elif _is_strided(a, sb_type):
            if a.offset != 0:
                rec.refuse("a StridedBuffer with an offset")
                return
            fast.append(rec.src(a._base))
        else:
            fast.append(rec.src(a))
        if isinstance(a, torch.Tensor) or _is_strided(a, sb_type):
            aligned.append((i, a.data_ptr() % 16 == 0))  # rec.depth > 0: not a read of the call's
    # LibEntry.run's own arguments, for the launch it is asked again: StridedBuffers rebuilt from their bases.
    flat: list[Any] = []
    template: list[Any] = []
    names = [*(p.name for p in params[: len(args)]), *kwargs]
    for name, a in zip(names, (*args, *kwargs.values()), strict=True):
        if name in constexpr:
            flat.append(("c", a))
            template.append(None)
        elif _is_strided(a, sb_type):
            flat.append(rec.src(a._base))
            template.append((a.shape, a._strides, a.dtype, a.offset))
        else:
            if callable(a) and not isinstance(a, type) and _captures_tensor(a):
                rec.refuse("a grid function that captures a tensor")
                return
            flat.append(rec.src(a) if not callable(a) else ("c", a))
            template.append(None)
    if rec.problem is not None:
        return
    entry, rt, knobs, hook_chain, watch = made
    cl = _CompiledLaunch(entry, rt, knobs, hook_chain, watch, device, aligned)
    fallback = functools.partial(_ask_libentry, le, tuple(template), len(args), tuple(kwargs))
    rec.steps.append(("compiled", (cl, len(fast), fallback), fast + flat, None))


def _is_strided(a: Any, sb_type: tuple[type, ...]) -> bool:
    return isinstance(a, sb_type)


def _captures_tensor(f: Any) -> bool:
    import torch

    cells = getattr(f, "__closure__", None) or ()
    values = [c.cell_contents for c in cells if c.cell_contents is not None] + list(
        getattr(f, "__defaults__", None) or ()
    )
    return any(
        isinstance(v, torch.Tensor)
        or (type(v) in (tuple, list) and any(isinstance(x, torch.Tensor) for x in v))
        for v in values
    )


def _ask_libentry(
    le: Any, template: tuple[Any, ...], nargs: int, kwnames: tuple[str, ...], *flat: Any
) -> Any:
    """A replayed launch whose pointers are aligned otherwise than recorded: ``LibEntry.run`` decides."""
    from flag_gems.utils.tensor_wrapper import StridedBuffer

    vals = [
        a if t is None else StridedBuffer(a, t[0], t[1], t[2], t[3])
        for a, t in zip(flat, template, strict=True)
    ]
    return _saved["libentry_run"](le, *vals[:nargs], **dict(zip(kwnames, vals[nargs:], strict=True)))  # type: ignore[index]


def _sb_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """``StridedBuffer.__init__`` under :func:`install`: it reads its base's ``data_ptr()``, which a recording
    would refuse as the op's own read; the plan rebuilds or substitutes the buffer instead."""
    rec = dsl._current()
    if rec is None:
        return _saved["sb_init"](self, *args, **kwargs)  # type: ignore[no-any-return, index]
    rec.depth += 1
    try:
        return _saved["sb_init"](self, *args, **kwargs)  # type: ignore[no-any-return, index]
    finally:
        rec.depth -= 1


# ---------------------------------------------------------------------------------------------------------
# Sites: one per op function
# ---------------------------------------------------------------------------------------------------------


def _logs_debug(logger: logging.Logger) -> bool:
    """Whether ``logger.debug(...)`` would do anything: a handler would take the record, a filter or a custom
    logger or record class would see it, or logging would warn once that no handler exists. A replay skips the
    op's own ``logger.debug`` call, so it may run only where that call does nothing. (``use_gems(record=True)``
    removes its file handler on exit but leaves FlagGems' logger at DEBUG with ``propagate`` off: its records
    then go nowhere, and replays go on.) Mirrors ``logging.Logger.handle``/``callHandlers``."""
    if not logger.isEnabledFor(logging.DEBUG):  # the common case: one cached lookup
        return False
    if (
        type(logger) is not logging.Logger
        or logger.filters
        or logging.getLogRecordFactory() is not logging.LogRecord
    ):
        return True
    found = False
    c: logging.Logger | None = logger
    while c is not None:
        for h in c.handlers:
            found = True
            if h.level <= logging.DEBUG:
                return True
        c = c.parent if c.propagate else None
    if found:
        return False
    last = logging.lastResort
    if last is not None:
        return last.level <= logging.DEBUG
    return bool(logging.raiseExceptions) and not logger.manager.emittedNoHandlerWarning


def _make_site(fn: Any) -> Any:
    name = getattr(fn, "__name__", "op")
    try:
        logger = logging.getLogger(fn.__module__)
        checks: list[tuple[Any, str]] = [
            *dsl._default_checks(),
            (functools.partial(_logs_debug, logger), "FlagGems' logger would record the call (DEBUG)"),
        ]
        site = dsl.Site(f"flag_gems:{name}", fn, lambda args: dsl.Bound(fn), fallback=fn, checks=checks)
    except Exception as exc:  # e.g. *args: FlagGems' own function, counted
        dsl.decline("flag_gems", exc)
        return fn
    return site.call


def _wrap(fn: Any) -> Any:
    """The function that stands for ``fn`` (same name and docs): its site's call, made at the first call."""
    call: Any = None

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        nonlocal call
        if call is None:
            call = _make_site(fn)
        return call(*args, **kwargs)

    op._jitkey_wraps = fn  # type: ignore[attr-defined]
    return op


def install() -> None:
    """Route FlagGems' ops through jitkey (see the module docs). Raises
    :class:`jitkey.errors.UnsupportedVersionError` for a FlagGems other than ``SUPPORTED``. Idempotent."""
    install_once("FlagGems", LIBRARY, SUPPORTED, _lock, installed, _patch)


def _patch() -> None:
    """What :func:`install` changes in FlagGems (under the adapter's lock, once)."""
    global _saved
    import importlib

    import flag_gems
    import flag_gems.ops
    from triton.compiler.compiler import CompiledKernel

    # (``flag_gems.utils`` re-exports a function named ``libentry``: import the modules by name.)
    libentry = importlib.import_module("flag_gems.utils.libentry")
    tensor_wrapper = importlib.import_module("flag_gems.utils.tensor_wrapper")
    saved: dict[str, Any] = {
        "libentry_run": libentry.LibEntry.run,
        "ck_getitem": CompiledKernel.__getitem__,
        "sb_init": tensor_wrapper.StridedBuffer.__init__,
        "full_config": flag_gems._FULL_CONFIG,
        "by_func": flag_gems.FULL_CONFIG_BY_FUNC,
        "attrs": [],
    }
    wrapped: dict[int, Any] = {}
    config = []
    for item in flag_gems._FULL_CONFIG:
        fn = item[1]
        w = wrapped.get(id(fn))
        if w is None:
            w = wrapped[id(fn)] = _wrap(fn)
        config.append((item[0], w, *item[2:]))
    by_func: dict[str, list[Any]] = {}
    for item in config:
        by_func.setdefault(item[1].__name__, []).append(item)
    originals = {id(item[1]): item[1] for item in flag_gems._FULL_CONFIG}
    for mod in (flag_gems, flag_gems.ops):
        for attr, value in list(vars(mod).items()):
            if id(value) in wrapped and originals.get(id(value)) is value:
                saved["attrs"].append((mod, attr, value))
                setattr(mod, attr, wrapped[id(value)])
    flag_gems._FULL_CONFIG = tuple(config)
    flag_gems.FULL_CONFIG_BY_FUNC = by_func
    libentry.LibEntry.run = _libentry_run
    CompiledKernel.__getitem__ = _ck_getitem
    tensor_wrapper.StridedBuffer.__init__ = _sb_init
    _saved = saved


def uninstall() -> None:
    """Undo :func:`install` (ops registered with torch meanwhile keep the wrappers until unregistered)."""
    global _saved
    with _lock:
        if _saved is None:
            return
        import importlib

        import flag_gems
        from triton.compiler.compiler import CompiledKernel

        libentry = importlib.import_module("flag_gems.utils.libentry")
        tensor_wrapper = importlib.import_module("flag_gems.utils.tensor_wrapper")
        libentry.LibEntry.run = _saved["libentry_run"]
        CompiledKernel.__getitem__ = _saved["ck_getitem"]
        tensor_wrapper.StridedBuffer.__init__ = _saved["sb_init"]
        flag_gems._FULL_CONFIG = _saved["full_config"]
        flag_gems.FULL_CONFIG_BY_FUNC = _saved["by_func"]
        for mod, attr, value in _saved["attrs"]:
            setattr(mod, attr, value)
        _saved = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _saved is not None


def report() -> dict[str, Any]:
    """The DSL report (:func:`jitkey.dsl.report`) of FlagGems' sites (``declined``: ops left to FlagGems)."""
    return adapter_report("flag_gems")
