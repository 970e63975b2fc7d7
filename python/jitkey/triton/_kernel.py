"""The jitkey Triton kernel: a ``triton.runtime.JITFunction`` whose warm launches skip Triton's per-call
Python dispatch. See the package docstring (``jitkey.triton``) for the contract."""

from __future__ import annotations

import contextlib
import copyreg
import functools
import inspect
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from triton import knobs as _knobs
from triton.runtime.jit import JITFunction
from triton.runtime.jit import jit as _TRITON_JIT

from jitkey._core import MISS, LruCache, Signature, _KernelBase, _TritonEntry, _TritonLauncher, _watch_bump
from jitkey.errors import GlobalsChangedError, JitKeyError, Unkeyable

if TYPE_CHECKING:
    from jitkey.triton._installed import Runtime

# jitkey.triton._installed (what the installed Triton is, its runtime, the launch plans) is imported at a kernel's
# first launch or inspection, never at import: a library that only decorates kernels does not load it.

_log = logging.getLogger("jitkey.triton")
_MISSING = object()
_CAPACITY = 4096  # compiled variants kept per kernel (an LRU: the least recently used is dropped)


def plain() -> bool:
    """Whether ``JITKEY_TRITON=plain`` asks for plain Triton kernels (read at each decoration)."""
    return os.environ.get("JITKEY_TRITON", "").strip().lower() == "plain"


# ---------------------------------------------------------------------------------------------------------
# Per-kernel statistics, kept past the kernel's lifetime for the fast-path report
# ---------------------------------------------------------------------------------------------------------


class KernelStats:
    """What one kernel's launches did: ``hits``, ``misses`` (Triton ran the call) and fallbacks by reason;
    and of the hits and the misses the L2 served, how many jitkey launched itself (``driver_launches``), why
    the others went through Triton's launcher (``launcher_reasons``: calls a launch plan declined, by reason)
    and why compiled variants have no launch plan at all (``unplanned_variants``: variants, by reason; their
    hits all go through Triton's launcher)."""

    __slots__ = (
        "_cache",
        "_plans",
        "fallbacks",
        "final",
        "l2_hits",
        "l2_misses",
        "l2_recorded",
        "l2_skipped",
        "name",
        "unplanned",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.fallbacks: Counter[str] = Counter()
        #: The L2 (jitkey._l2): misses it served from jitkey's disk index, misses it did not have (Triton's path
        #: ran, and what it gave was recorded: ``l2_recorded``), and misses it left to Triton, by reason.
        self.l2_hits = 0
        self.l2_misses = 0
        self.l2_recorded = 0
        self.l2_skipped: Counter[str] = Counter()
        #: Compiled variants of this kernel that hits cannot launch themselves, by reason.
        self.unplanned: Counter[str] = Counter()
        self._plans: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._cache: LruCache | None = None
        self.final: dict[str, Any] | None = None

    def plan_for(self, ck: Any, nparams: int) -> Any:
        """The launch plan of ``ck`` (made once per compiled kernel), or ``None`` (counted, with why)."""
        try:
            return self._plans[ck]
        except (KeyError, TypeError):
            pass
        from jitkey.triton._installed import launch_plan

        plan, why = launch_plan(ck, ck.run, nparams)
        if plan is None:
            self.unplanned[str(why)] += 1
        with contextlib.suppress(TypeError):  # not weak-referenceable: made again next time
            self._plans[ck] = plan
        return plan

    def _launch_counts(self) -> dict[str, Any]:
        launched = 0
        reasons: Counter[str] = Counter()
        for plan in list(self._plans.values()):
            if plan is not None:
                c = plan.counts()
                launched += c["launched"]
                reasons.update(c["declined"])
        return {
            "driver_launches": launched,
            "launcher_reasons": dict(reasons),
            "unplanned_variants": dict(self.unplanned),
        }

    def snapshot(self) -> dict[str, Any]:
        if self.final is not None:
            cs = self.final
        else:
            if self._cache is not None:
                s = self._cache.stats()
                cs = {"hits": int(s["hits"]), "misses": int(s["misses"]), "entries": int(s["size"])}
            else:
                cs = {"hits": 0, "misses": 0, "entries": 0}
            cs.update(self._launch_counts())
        return {
            **cs,
            "fallbacks": sum(self.fallbacks.values()),
            "fallback_reasons": dict(self.fallbacks),
            "l2_hits": self.l2_hits,
            "l2_misses": self.l2_misses,
            "l2_recorded": self.l2_recorded,
            "l2_skipped": dict(self.l2_skipped),
        }

    def _freeze(self) -> None:  # the kernel is gone: keep the numbers, not its cache
        if self._cache is not None:
            snap = self.snapshot()
            keep = ("hits", "misses", "entries", "driver_launches", "launcher_reasons", "unplanned_variants")
            self.final = {k: snap[k] for k in keep}
            self._cache = None
            self._plans = weakref.WeakKeyDictionary()


_registry_lock = threading.RLock()
_registry: list[KernelStats] = []
_made = [0]  # jitkey kernels made in this process (decorated, copied, unpickled)


def registry() -> list[KernelStats]:
    """Every jitkey kernel of this process that was launched or inspected (its statistics; the kernels may be
    gone). A kernel gets its statistics at its first use, not at decoration."""
    with _registry_lock:
        return list(_registry)


def kernels_made() -> int:
    """How many jitkey kernels this process made (decorated, copied or unpickled), used or not."""
    return _made[0]


def _count_made() -> None:
    with _registry_lock:
        _made[0] += 1


# ---------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------


class TritonKernel(_KernelBase, JITFunction):  # type: ignore[misc]
    """A ``triton.runtime.JITFunction`` whose warm ``kernel[grid](...)`` runs in one native call.

    Everything but the warm launch is Triton's: it is constructed like ``JITFunction`` (``jit`` passes
    ``triton.jit``'s options through), and ``fn``, ``src``, ``cache_key``, ``params``, ``device_caches``,
    ``warmup``, ``preload``, ``repr``, ``noinline``, hooks, use as a helper from other kernels, and
    torch.compile all behave as they do on a plain ``JITFunction``. ``kernel[grid]`` is implemented in C
    (``jitkey._core._KernelBase``) once the native launcher is built. The jitkey-specific API is
    :meth:`cache_stats`, :meth:`key_of` and :attr:`fast_path_problem`.
    """

    # jitkey's own part of a kernel before its first use: class attributes, so that decoration (and a copy, an
    # unpickling) costs what a JITFunction costs; the first launch or inspection makes the rest (_jk_prepare).
    _jk_ready = False
    _jk_launch: Callable[..., Any] | None = None
    _jk_launcher: _TritonLauncher | None = None
    _jk_key_launcher: Any = None
    _jk_problem: str | None = None
    _jk_sig: Signature | None = None
    _jk_cache: LruCache | None = None
    _jk_stats: KernelStats = None  # type: ignore[assignment]  # made by _jk_prepare

    def __init__(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        if type(self) is TritonKernel:
            # JITFunction.__init__ sets about 30 attributes: through _Building's plain object.__setattr__ (no
            # kernel has a launcher yet, nothing to watch), then the class is TritonKernel again and one bump
            # stands for them all. A subclass of TritonKernel keeps its own __setattr__ throughout.
            self.__class__ = _Building
            try:
                JITFunction.__init__(self, fn, *args, **kwargs)
            finally:
                object.__setattr__(self, "__class__", TritonKernel)
                _watch_bump()
        else:
            JITFunction.__init__(self, fn, *args, **kwargs)
        _count_made()

    @classmethod
    def _of(cls, jit_fn: Any) -> TritonKernel:
        """A jitkey kernel of ``jit_fn``'s function with ``jit_fn``'s options, source and hooks (a copy of the
        hook list). It has its own compiled kernels, like any other ``JITFunction`` (Triton's disk cache makes
        its first compile cheap), so its ``cache_key``/globals state and ``jit_fn``'s never mix."""
        k = cls(
            jit_fn.fn,
            version=jit_fn.version,
            do_not_specialize=jit_fn.do_not_specialize,
            do_not_specialize_on_alignment=jit_fn.do_not_specialize_on_alignment,
            debug=jit_fn.debug,
            noinline=jit_fn.noinline,
            repr=jit_fn._repr,
            launch_metadata=jit_fn.launch_metadata,
        )
        if jit_fn.src != k.src:  # an _unsafe_update_src on jit_fn
            k._unsafe_update_src(jit_fn.src)
        k.pre_run_hooks.extend(jit_fn.pre_run_hooks)
        return k

    # -- copy and pickle: a JITFunction's state, a fresh jitkey part ---------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The state a ``JITFunction`` has (its ``__dict__``), without jitkey's own attributes: the native
        launcher, cache, locks and statistics are never copied or pickled."""
        return {n: v for n, v in self.__dict__.items() if not n.startswith("_jk_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a ``JITFunction``'s state and start jitkey's part afresh (an empty cache, made at the first
        launch). Works on the stripped state Inductor's ``prepare_for_pickle`` leaves (``fn`` set to None)."""
        self.__dict__.update(state)
        _count_made()
        _watch_bump()  # the state was written around __setattr__

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """``copy.deepcopy`` and ``pickle`` (any protocol): rebuilt from :meth:`__getstate__`, so they copy
        and fail exactly where a ``JITFunction``'s own state does (a lock, a local function, globals)."""
        return (copyreg.__newobj__, (type(self),), self.__getstate__())  # type: ignore[attr-defined]

    # -- attribute writes are watched: what a hit reads from the kernel is kept while none happens ------
    # Python, not a native slot: a C-level __setattr__ in a base class makes CPython refuse
    # object.__setattr__(kernel, ...), which works on a JITFunction. The defaults bind what each call needs
    # (JITFunction.__init__ sets about 30 attributes: this is most of what decoration adds to Triton's).
    def __setattr__(
        self, name: str, value: Any, _set: Any = object.__setattr__, _bump: Any = _watch_bump
    ) -> None:
        """Set an attribute, as on a ``JITFunction``; a launch after it reads the kernel's state again (see
        ``jitkey/triton/_watch.py``). jitkey's own ``_jk_*`` attributes are not part of that state."""
        _set(self, name, value)
        if name[:4] != "_jk_":
            _bump()

    def __delattr__(self, name: str, _del: Any = object.__delattr__, _bump: Any = _watch_bump) -> None:
        """Delete an attribute, as on a ``JITFunction`` (watched like :meth:`__setattr__`)."""
        _del(self, name)
        if name[:4] != "_jk_":
            _bump()

    def __copy__(self) -> TritonKernel:
        """``copy.copy``: like a ``JITFunction``'s (a shallow copy sharing Triton's state), with its own jitkey
        launcher, cache and statistics."""
        k = type(self).__new__(type(self))
        k.__setstate__(self.__getstate__())
        return k

    def _jk_prepare(self) -> None:
        """Once per kernel, at the first launch (or :attr:`fast_path_problem`, :meth:`key_of`,
        :meth:`cache_stats`): jitkey's own state and statistics, the static checks, the ``Signature`` of its
        parameters and its cache."""
        if self._jk_ready:
            return
        with _registry_lock:
            if self._jk_ready:
                return
            self._jk_lock = threading.Lock()
            self._jk_logged: set[str] = set()
            # JITFunction keeps the function's names in __dict__ (fn itself may be None: see __setstate__)
            d = self.__dict__
            stats = KernelStats(f"{d.get('__module__')}:{d.get('__qualname__')}")
            _registry.append(stats)
            weakref.finalize(self, stats._freeze)
            self._jk_stats = stats
            problem = self._check_static()
            if problem is None:
                try:
                    self._jk_sig = Signature(_params(self))
                except JitKeyError as exc:  # a rule jitkey cannot build: Triton's path, never an error here
                    problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                self._jk_cache = LruCache(_CAPACITY)
                stats._cache = self._jk_cache
            self._jk_problem = problem
            self._jk_ready = True

    @property
    def fast_path_problem(self) -> str | None:
        """Why this kernel always takes Triton's own path (``None``: it has the fast path)."""
        self._jk_prepare()
        return self._jk_problem

    def _check_static(self) -> str | None:
        from jitkey.triton._installed import triton_info

        info = triton_info()
        if info.problem is not None:
            return info.problem
        for p in self.signature.parameters.values():
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                return f"parameter {p.name!r} is variadic"
        if len(self.signature.parameters) != len(self.params):
            return "JITFunction.params does not match its signature"
        return None

    # -- Triton's entry points -------------------------------------------------------------------------
    def _jk_triton_run(self, *args: Any, **kwargs: Any) -> Any:
        """Triton's own ``JITFunction.run`` (looked up per call, so a patch of it is honoured)."""
        return JITFunction.run(self, *args, **kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        """``JITFunction.run``: ``warmup=False`` is a (fast-path) launch; ``warmup=True`` is Triton's."""
        if warmup:
            return self._jk_triton_run(*args, grid=grid, warmup=True, **kwargs)
        return self[grid](*args, **kwargs)

    # -- jitkey's API ----------------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, Any]:
        """``hits``, ``misses``, ``entries``, ``fallbacks`` (total) and ``fallback_reasons`` ({reason: n});
        ``remote_compile``: the process's remote compile cache counters (``jitkey.triton.remote_cache.stats``:
        compiled files served from the Redis tier, absent, refused, stored); ``watched_state``: how the launches
        read Triton's state (``watched``: calls that reused the kept state, ``reads``: times it was read from the
        objects, ``unwatched``: why the last read was not kept; ``None`` before the first launch)."""
        from jitkey.triton import remote_cache

        problem = self.fast_path_problem
        launcher = self._jk_launcher
        state = None if launcher is None else dict(launcher.state_counts())
        return {
            **self._jk_stats.snapshot(),
            "fast_path_problem": problem,
            "remote_compile": remote_cache.stats(),
            "watched_state": state,
        }

    def key_of(self, args: Iterable[Any], kwargs: dict[str, Any] | None = None, *, device: int) -> bytes:
        """The key bytes a call with ``args``/``kwargs`` on ``device`` would use (raises :class:`Unkeyable`
        or :class:`jitkey.errors.ArgumentError` where a launch would fall back). No lookup, no launch, no
        GPU needed."""
        if self.fast_path_problem is not None:
            raise Unkeyable(self.fast_path_problem)
        from jitkey.triton._installed import triton_info

        info = triton_info()
        if (
            info.checks_stages_hook
            and getattr(info.knobs.runtime, "add_stages_inspection_hook", None) is not None
        ):
            raise Unkeyable("knobs.runtime.add_stages_inspection_hook is set")
        if self._jk_key_launcher is None:  # built once: key_of is for tests and debugging, not a hot path
            self._jk_key_launcher = self._jk_native_launcher(None)
        return bytes(self._jk_key_launcher.key(tuple(args), dict(kwargs or {}), device))

    # -- the launch ------------------------------------------------------------------------------------
    def _subscript(self, grid: Any) -> Callable[..., Any]:
        """``self[grid]`` until the native launcher is set (then ``_KernelBase.__getitem__`` is C)."""
        launch = self._jk_launch
        if launch is None:
            launch = self._jk_make_launch()
        if self.pre_run_hooks:
            # Triton's own path, with the caller's exact args/kwargs for the hooks.
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._jk_fallback("pre_run_hooks", grid, args, kwargs)

            return call
        return functools.partial(launch, grid)

    def _jk_make_launch(self) -> Callable[..., Any]:
        from jitkey.triton import _installed

        self._jk_prepare()
        with self._jk_lock:
            if self._jk_launch is not None:
                return self._jk_launch
            problem = self._jk_problem
            if problem is None and _installed.triton_info().run is not JITFunction.run:
                problem = "JITFunction.run is patched"
            if problem is not None:
                reason = problem

                def slow(grid: Any, *args: Any, **kwargs: Any) -> Any:
                    return self._jk_fallback(reason, grid, args, kwargs)

                self._jk_launch = slow
                return slow
            rt = _installed.get_runtime()
            if rt is None:
                why = _installed.runtime_problem or "no CUDA runtime"

                def no_rt(grid: Any, *args: Any, **kwargs: Any) -> Any:
                    # Resolved again next time (the driver may come up later); Triton raises the real error.
                    return self._jk_fallback(why, grid, args, kwargs)

                if _installed.runtime_problem is not None:
                    self._jk_launch = no_rt
                return no_rt
            launcher = self._jk_native_launcher(rt)
            self._set_launcher(launcher)  # from now on, self[grid] is C
            self._jk_launcher = launcher
            self._jk_launch = launcher.launch
            return self._jk_launch

    def _jk_native_launcher(self, rt: Runtime | None) -> Any:
        """A ``_TritonLauncher`` over this kernel's signature and cache (``rt=None``: for :meth:`key_of`)."""
        from jitkey.triton._installed import triton_info

        info = triton_info()
        assert self._jk_sig is not None and self._jk_cache is not None
        npos = sum(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values()
        )
        from jitkey.triton import _watch  # at the first launch, not at import (decoration does not use it)

        watch = _watch.for_kernel(self, info.knob_reads)
        return _TritonLauncher(self, self._jk_sig, self._jk_cache, info, rt or _NO_RUNTIME, npos, watch)

    def _jk_fallback(self, reason: str, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._jk_stats.fallbacks[reason] += 1
        if reason not in self._jk_logged:
            self._jk_logged.add(reason)
            _log.debug("%s: launch goes through Triton's own path: %s", self._jk_stats.name, reason)
        return self._jk_triton_run(*args, grid=grid, warmup=False, **kwargs)

    def _jk_native_fallback(
        self, reason: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if isinstance(reason, BaseException):
            reason = reason.reason if isinstance(reason, Unkeyable) else f"{type(reason).__name__}: {reason}"
        return self._jk_fallback(str(reason), grid, args, kwargs)

    def _jk_miss(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """A miss: returns ``(what Triton returned, the entry to store or None)``, or ``(MISS, entry)`` for a
        kernel jitkey's disk index gave (:mod:`jitkey.triton._l2`), which the launcher launches as a hit.
        Otherwise Triton runs the call (compiling if needed), and what it compiled is recorded for the L2."""
        from jitkey.triton import _installed, _l2  # at the first miss: not an import-time cost

        rt, launcher = _installed.runtime, self._jk_launcher
        l2 = None
        if type(rt) is _installed.Runtime and launcher is not None:
            l2 = _l2.lookup(self, launcher, rt.get_device(), args, kwargs)
        if isinstance(l2, _l2.Loaded):
            entry = self._jk_entry(l2.ck, (l2.kcache, l2.tkey))
            if entry is not None:
                return MISS, entry
            l2 = None  # Triton's path launches the kernel it now holds
        ck = self._jk_triton_run(*args, grid=grid, warmup=False, **kwargs)
        if ck is None:  # a knobs.runtime.jit_cache_hook vetoed the compile (Triton launched nothing)
            self._jk_stats.fallbacks["jit_cache_hook vetoed the compile"] += 1
            return None, None
        if hasattr(ck, "result"):  # async compile future
            ck = ck.result()
        where = self._jk_where(ck)
        if l2 is not None:
            _l2.record(self, l2, ck, None if where is None else where[1])
        if where is None:  # not provably Triton's cached kernel: no entry (the next call asks Triton again)
            return ck, None
        return ck, self._jk_entry(ck, where)

    def _jk_entry(self, ck: Any, where: tuple[dict[Any, Any], Any]) -> Any:
        """The ``_TritonEntry`` of a compiled kernel Triton keeps at ``where`` (``None``, counted, if it lacks
        what a hit needs)."""
        try:
            if hasattr(ck, "_init_handles"):
                ck._init_handles()
            run, function, pm = ck.run, ck.function, ck.packed_metadata
            ck.launch_metadata  # noqa: B018 - must exist for the hook path
        except AttributeError as exc:
            self._jk_stats.fallbacks[f"CompiledKernel lacks {exc.name or exc}"] += 1
            return None
        if function is None:
            self._jk_stats.fallbacks["CompiledKernel.function is None after _init_handles"] += 1
            return None
        plan = self._jk_stats.plan_for(ck, len(self.params))
        # Without a plan (or when it declines) a hit calls ck.run as Triton does: run(gx, gy, gz, stream, function,
        # packed_metadata, launch_metadata, enter, exit, *args).
        return _TritonEntry(ck, run, function, pm, *where, plan)

    def _jk_where(self, ck: Any) -> tuple[dict[Any, Any], Any] | None:
        """``(kernel_cache, key)``: where Triton keeps ``ck`` for the current device (see ``_TritonEntry``)."""
        from jitkey.triton import _installed

        rt = _installed.runtime
        if rt is None:
            return None
        try:
            per_device = dict.get(self.device_caches, rt.get_device())
            kcache = per_device[0] if per_device else None
            if type(kcache) is not dict:
                return None
            for k, v in list(kcache.items()):
                if v is ck:
                    return kcache, k
        except Exception:  # a patched device_caches: Triton's own path decides every call
            return None
        return None

    def _jk_check_globals(self) -> None:
        """Triton's ``used_global_vals`` check, as ``JITFunction.run`` makes it (the launcher skips it while
        its snapshot of the globals holds: ``rust/py/src/launch/globals.rs``)."""
        missing = _MISSING
        for (name, _), (val, gdict) in self.used_global_vals.items():
            if (cur := gdict.get(name, missing)) != val:
                raise GlobalsChangedError(
                    f"Global variable {name} has changed since we compiled this kernel, from {val} to {cur}"
                )


class _Building(TritonKernel):
    """A :class:`TritonKernel` while ``JITFunction.__init__`` runs on it (see ``TritonKernel.__init__``)."""

    __setattr__ = object.__setattr__  # type: ignore[assignment]  # (no bound defaults: the plain slot)
    __delattr__ = object.__delattr__  # type: ignore[assignment]


class _NoRuntime:
    """The getters of a launcher that only builds keys (``key_of``)."""

    @staticmethod
    def get_device() -> int:
        raise RuntimeError("jitkey.triton: this launcher only builds keys")

    @staticmethod
    def get_stream(_device: int) -> int:
        raise RuntimeError("jitkey.triton: this launcher only builds keys")


_NO_RUNTIME = _NoRuntime()


def _params(kernel: Any) -> list[Any]:
    """``rules.triton(kernel)`` with every default the rules cannot key dropped (with the defaults before it,
    which must stay trailing): a call that leaves such a parameter out does not bind natively and goes to
    Triton's own path, counted, instead of the decoration failing."""
    from jitkey import rules

    params = list(rules.triton(kernel))
    last_bad = -1
    for i, p in enumerate(params):
        if len(p) == 3:
            try:
                Signature([p])
            except JitKeyError:
                last_bad = i
    return [p[:2] if i <= last_bad else p for i, p in enumerate(params)]


# ---------------------------------------------------------------------------------------------------------
# Decoration
# ---------------------------------------------------------------------------------------------------------


def bind(fn: Any) -> TritonKernel:
    """A jitkey kernel for an existing ``triton.jit`` kernel.

    The result is a new ``JITFunction`` (a :class:`TritonKernel`) of ``fn``'s function with its options,
    source and pre-run hooks (as they are at the call); ``fn`` itself is unchanged, and the two keep their
    compiled kernels apart, as two ``triton.jit`` kernels of one function do. A :class:`TritonKernel` is returned as it is. Anything
    else (``@triton.autotune``/``@triton.heuristics`` objects: put ``jitkey.triton.jit`` under them;
    plain functions; Triton's interpreter objects) raises ``TypeError``.
    """
    if isinstance(fn, TritonKernel):
        return fn
    if type(fn) is JITFunction:
        return TritonKernel._of(fn)
    if isinstance(fn, JITFunction):
        raise TypeError(
            f"jitkey.triton.bind: {type(fn).__module__}.{type(fn).__qualname__} is a JITFunction subclass "
            "jitkey does not know; use it as it is"
        )
    what = f"{type(fn).__module__}.{type(fn).__qualname__}"
    hint = ""
    if hasattr(fn, "fn") and hasattr(fn, "run"):
        hint = " (for @triton.autotune / @triton.heuristics, put @jitkey.triton.jit under the decorator)"
    raise TypeError(f"jitkey.triton.bind takes a triton.jit kernel, not {what}{hint}")


def jit(
    fn: Any = None,
    *,
    version: Any = None,
    repr: Callable[..., Any] | None = None,
    launch_metadata: Callable[..., Any] | None = None,
    do_not_specialize: Iterable[int | str] | None = None,
    do_not_specialize_on_alignment: Iterable[int | str] | None = None,
    debug: bool | None = None,
    noinline: bool | None = None,
) -> Any:
    """``triton.jit`` with the same arguments, returning a :class:`TritonKernel`.

    Under ``TRITON_INTERPRET=1`` (Triton's interpreter) and with ``JITKEY_TRITON=plain`` it returns what
    ``triton.jit`` returns.
    """
    opts = {
        "version": version,
        "repr": repr,
        "launch_metadata": launch_metadata,
        "do_not_specialize": do_not_specialize,
        "do_not_specialize_on_alignment": do_not_specialize_on_alignment,
        "debug": debug,
        "noinline": noinline,
    }

    def decorator(f: Any) -> Any:
        if _knobs.runtime.interpret or plain():
            return _TRITON_JIT(f, **opts)
        assert callable(f)
        return TritonKernel(f, **opts)

    return decorator if fn is None else decorator(fn)


# ---------------------------------------------------------------------------------------------------------
# install(): route triton.jit through jitkey
# ---------------------------------------------------------------------------------------------------------

_install_lock = threading.Lock()
_saved: list[tuple[Any, str, Any]] | None = None


_INDUCTOR_HEURISTICS = "torch._inductor.runtime.triton_heuristics"
#: Kernels decorated under :func:`install` that stayed Triton's, by reason (see :func:`_kept_by`).
kept: Counter[str] = Counter()


def _kept_by(f: Any) -> str | None:
    """Why a kernel decorated under :func:`install` stays Triton's, or ``None`` (it becomes jitkey's).

    * Triton's own library kernels (modules ``triton``, ``triton.*``).
    * Kernels torch's Inductor generates or copies (its generated kernel code, user-defined kernels inside
      a compiled graph, its templates) and its own helpers: their module is ``torch._inductor.*`` and, for
      the generated modules Inductor loads under ``torch._inductor.runtime.compile_tasks``, the code imports
      ``triton_heuristics``, which every Inductor kernel module does (``gen_common_triton_imports``) and
      other code loaded the same way (Helion's generated kernels) does not. Inductor launches these
      itself (``CachingAutotuner``, its static launcher) and never through ``kernel[grid]`` or ``run``,
      so routing them would gain nothing; it deep-copies and pickles them.
    """
    module = str(getattr(f, "__module__", "") or "")
    if module == "triton" or module.startswith("triton."):
        return "Triton's own kernel"
    if module.startswith("torch._inductor."):
        if not module.startswith("torch._inductor.runtime.compile_tasks."):
            return "torch Inductor's own kernel"
        heuristics = getattr(f, "__globals__", {}).get("triton_heuristics")
        if getattr(heuristics, "__name__", None) == _INDUCTOR_HEURISTICS:
            return "generated by torch Inductor"
    return None


def _routed_jit(fn: Any = None, **kwargs: Any) -> Any:
    """``triton.jit`` while :func:`install` is in effect: user kernels become jitkey kernels, Triton's and
    Inductor's stay Triton's (counted in :data:`kept`)."""

    def decorator(f: Any) -> Any:
        why = _kept_by(f)
        if why is not None:
            kept[why] += 1
            return _TRITON_JIT(f, **kwargs)
        return jit(f, **kwargs)

    return decorator if fn is None else decorator(fn)


functools.update_wrapper(_routed_jit, _TRITON_JIT, assigned=("__doc__",))


def install() -> None:
    """Route every kernel decorated from now on with ``triton.jit`` (``triton.jit``,
    ``triton.runtime.jit.jit``) through jitkey. Kernels defined in Triton's own modules, and the kernels torch's
    Inductor generates, stay Triton's (counted by reason in ``report()["kept"]``); kernels decorated before
    the call are unchanged. With ``JITKEY_REMOTE_CACHE`` set and no cache manager configured, Triton's compile
    cache becomes :class:`jitkey.triton.remote_cache.TieredCacheManager` (local files first, then the Redis
    tier; see that module for what it trusts). Idempotent; undone by :func:`uninstall`."""
    global _saved
    import triton
    from triton.runtime import jit as jit_module

    from jitkey.triton import remote_cache

    with _install_lock:
        if _saved is not None:
            return
        targets = [(triton, "jit"), (jit_module, "jit")]
        _saved = [(obj, name, getattr(obj, name)) for obj, name in targets]
        for obj, name in targets:
            setattr(obj, name, _routed_jit)
        remote_cache._wire()


def uninstall() -> None:
    """Undo :func:`install` (kernels already made stay jitkey kernels)."""
    global _saved
    from jitkey.triton import remote_cache

    with _install_lock:
        if _saved is None:
            return
        for obj, name, value in _saved:
            if getattr(obj, name, None) is _routed_jit:
                setattr(obj, name, value)
        _saved = None
        remote_cache._unwire()


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _saved is not None
