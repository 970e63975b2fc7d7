"""Persistent autotuning for Triton kernels: the winning config is stored in a :class:`jitkey.DiskIndex`.

``jitkey.triton.autotune(configs, key=[...])`` is ``triton.autotune`` whose results outlive the process: a
second process (or a second pytest-xdist worker) that calls the kernel with the same autotune key finds the
winning config on disk and launches it without benchmarking. Use it over ``@jitkey.triton.jit`` (or a plain
``triton.jit`` / ``triton.heuristics`` kernel, which is bound with :func:`jitkey.triton.bind`)::

    @jitkey.triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})],
                            key=["n"], index=jitkey.DiskIndex("/path/to/cache"))
    @jitkey.triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr): ...

    add[grid](x, y, out, n)

**Selection** is Triton's: every config (after ``prune_configs_by``) is timed with ``do_bench(kernel_call,
quantiles=(0.5, 0.2, 0.8))`` and the smallest result wins (lists compare element-wise: median first);
configs that fail with ``OutOfResources``, ``CompileTimeAssertionFailure`` or ``PTXASError`` time as
infinite; a single config is launched without tuning or storage, and so is the one config left when pruning
leaves one (as Triton 3.9 does; a ``top_k`` fraction keeps at least one config). Where the installed
Triton has ``knobs.autotuning.listener`` (3.9 does), it is called like Triton's autotuner calls it after each
tuning or disk hit (``key`` is jitkey's in-memory key, ``fn`` the ``JITFunction``).

**In-memory key** (per autotuner, an :class:`jitkey.LruCache`): the current device index, the autotune key
arguments' exact values (defaults applied; each must be keyable by :func:`jitkey.encode`, else
:class:`jitkey.errors.ArgumentError`), the dtype of every argument that has one (by parameter position),
and the sorted extra keyword arguments (launch options). A warm call costs this key, one cache probe and
the launch.

**Disk key**: :func:`jitkey.digest` of the in-memory key without the device index, plus

* the kernel's content key (:func:`jitkey.function_key` of the ``JITFunction``: its source, the globals and
  helpers it reads, ...; ``triton.heuristics`` layers with their value functions),
* the config-set digest: every ``Config`` in order (sorted ``kwargs``, ``num_warps``, ``num_stages``,
  ``num_ctas``, ``maxnreg``, ``pre_hook`` by function key) and the ``prune_configs_by`` functions (by
  function key) and ``top_k``,
* :func:`jitkey.env_key` for the device the call runs on (Triton version, ``triton_key``, torch and jitkey
  versions, device name and full capability, the compile-affecting environment variables), read once per
  device per autotuner.

**Stored value**: JSON ``{"schema": "jitkey.triton.autotune", "v": 1, "index": i, "config": <digest of
configs[i]>, "timings": [...]}``. A value that does not parse, has another schema or version, or names a
config that is not ``configs[i]`` is a miss (counted as ``disk_rejects``) and the kernel is retuned.

**Not supported** (rejected with a clear error at decoration): ``cache_results`` (this *is* the cache),
``Config.ir_override`` (its file's content would have to be keyed), ``Config`` attributes this module does
not know, ``do_bench`` together with ``warmup``/``rep``/``use_cuda_graph``, unkeyable ``Config.kwargs``
values, and hooks or prune functions :func:`jitkey.function_key` cannot key. The autotuner-level
``pre_hook``/``post_hook``/``reset_to_zero``/``restore_value`` only run while benchmarking (as in Triton;
``None`` arguments are skipped, as Triton 3.9 does) and are not part of the key.

**Testing without a GPU**: ``do_bench=`` (the timer) and ``launcher=`` (``launcher(fn, grid, args,
kwargs)``; default ``fn.run(*args, grid=grid, warmup=False, **kwargs)``) are injectable, so the selection,
keying and persistence logic runs on a CPU with a simulated timer.
"""

from __future__ import annotations

import builtins
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import triton
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction

from jitkey._core import DiskIndex, LruCache, digest, encode
from jitkey.env import env_key
from jitkey.errors import ArgumentError, JitKeyError
from jitkey.fnkey import function_key
from jitkey.remote import Index, default_index
from jitkey.triton._kernel import bind

# This module is imported at the first use of ``jitkey.triton.autotune`` (see ``jitkey.triton``), so what it
# imports (jitkey.env, jitkey.fnkey, jitkey.remote) is not paid by ``import jitkey.triton``, every kernel
# library's import. torch is imported where it is used, and what differs between Triton versions (knobs, the
# compile errors) where it is read, so that a Triton without it still tunes.

__all__ = ["SCHEMA", "SCHEMA_VERSION", "PersistentAutotuner", "autotune"]

SCHEMA: Final[str] = "jitkey.triton.autotune"
SCHEMA_VERSION: Final[int] = 1
_KNOWN_CONFIG_FIELDS: Final[frozenset[str]] = frozenset(
    {"kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg", "pre_hook", "ir_override"}
)
_MISS: Final = object()
_NO_DTYPE: Final = frozenset({int, float, bool, str, bytes, type(None)})
_QUANTILES: Final = (0.5, 0.2, 0.8)


# ---------------------------------------------------------------------------------------------------------
# Static keys: the kernel, the config set
# ---------------------------------------------------------------------------------------------------------


def _kernel_key(fn: Any) -> tuple[Any, ...]:
    """The content key tree of a kernel interface (TritonKernel / JITFunction / Heuristics chain)."""
    if isinstance(fn, JITFunction):  # a jitkey.triton.TritonKernel is one too
        return ("jit", function_key(fn))
    if isinstance(fn, Heuristics):
        values = tuple(sorted((str(name), function_key(f)) for name, f in fn.values.items()))
        return ("heuristics", values, _kernel_key(fn.fn))
    if isinstance(fn, (Autotuner, PersistentAutotuner)):
        raise TypeError("jitkey.triton.autotune cannot wrap another autotuner")
    raise TypeError(
        f"jitkey.triton.autotune wraps a triton.jit / jitkey.triton.jit kernel (optionally under "
        f"triton.heuristics), not {type(fn).__qualname__}"
    )


def _base_name(fn: Any) -> str:
    while not callable(getattr(fn, "__code__", None)) and hasattr(fn, "fn") and fn.fn is not fn:
        fn = fn.fn
    return str(getattr(fn, "__qualname__", getattr(fn, "__name__", "?")))


def _hook_key(hook: Any, what: str) -> Any:
    if hook is None:
        return None
    try:
        return function_key(hook)
    except JitKeyError as exc:
        raise TypeError(f"jitkey.triton.autotune: cannot key {what} ({exc})") from exc


def _config_tree(cfg: Any, i: int) -> tuple[Any, ...]:
    """The key tree of one ``triton.Config`` (every field); raises for what cannot be keyed safely."""
    fields = set(vars(cfg))
    unknown = fields - _KNOWN_CONFIG_FIELDS
    unknown_set = sorted(f for f in unknown if getattr(cfg, f) is not None)
    if unknown_set:
        raise TypeError(
            f"configs[{i}] has attribute(s) {unknown_set} jitkey.triton.autotune does not know how to key"
        )
    if getattr(cfg, "ir_override", None) is not None:
        raise ValueError(
            f"configs[{i}]: Config.ir_override is not supported by jitkey.triton.autotune "
            "(the IR file's content would have to be part of the key)"
        )
    kwargs = cfg.kwargs
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"configs[{i}].kwargs must be a dict, got {type(kwargs).__qualname__}")
    items = []
    for k in sorted(kwargs):
        if type(k) is not str:
            raise TypeError(f"configs[{i}].kwargs keys must be str, got {k!r}")
        items.append((k, kwargs[k]))
    tree = (
        "config",
        tuple(items),
        cfg.num_warps,
        cfg.num_stages,
        cfg.num_ctas,
        getattr(cfg, "maxnreg", None),
        _hook_key(cfg.pre_hook, f"configs[{i}].pre_hook"),
    )
    try:
        encode(tree)
    except JitKeyError as exc:
        raise TypeError(f"configs[{i}] has a value jitkey cannot key: {exc}") from exc
    return tree


def _config_digest(tree: tuple[Any, ...]) -> str:
    return digest(tree).hex()


# ---------------------------------------------------------------------------------------------------------
# The autotuner
# ---------------------------------------------------------------------------------------------------------


def _default_launcher(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn.run(*args, grid=grid, warmup=False, **kwargs)


def _autotune_listener() -> Callable[..., Any] | None:
    """``triton.knobs.autotuning.listener`` where the installed Triton has it (3.9 does), else ``None``."""
    from triton import knobs

    return getattr(getattr(knobs, "autotuning", None), "listener", None)


def _print_autotuning() -> bool:
    """``knobs.autotuning.print`` (``TRITON_PRINT_AUTOTUNING``), read per tuning as Triton's autotuner does."""
    try:
        from triton import knobs

        return bool(knobs.autotuning.print)
    except (ImportError, AttributeError):
        return False


def _timing_order(t: Any) -> tuple[float, ...]:
    if isinstance(t, (list, tuple)):
        return tuple(float(x) for x in t)
    return (float(t),)


def _bench_errors() -> tuple[type[BaseException], ...]:
    out: list[type[BaseException]] = []
    try:
        from triton.runtime.errors import OutOfResources, PTXASError

        out += [OutOfResources, PTXASError]
    except ImportError:  # pragma: no cover - older/newer Triton layouts
        pass
    try:
        from triton.compiler.errors import CompileTimeAssertionFailure

        out.append(CompileTimeAssertionFailure)
    except ImportError:  # pragma: no cover
        pass
    return tuple(out)


_Launcher = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class _Options:
    """The arguments of one :func:`autotune` call, as given (their defaults and meaning are stated there).

    :class:`PersistentAutotuner` checks them against each kernel the call decorates, so every error is raised
    at decoration, as before.
    """

    configs: Sequence[Any]
    key: Iterable[str]
    prune_configs_by: Mapping[str, Any] | None
    reset_to_zero: Iterable[str] | None
    restore_value: Iterable[str] | None
    pre_hook: Callable[..., Any] | None
    post_hook: Callable[..., Any] | None
    warmup: int | None
    rep: int | None
    use_cuda_graph: bool
    do_bench: Callable[..., Any] | None
    index: Index | str | os.PathLike[str] | bool | None
    launcher: _Launcher | None
    capacity: int


class PersistentAutotuner:
    """``triton.autotune``'s Autotuner with an in-memory and an on-disk cache of the winning config.

    Made by :func:`autotune` (one per decorated kernel, from that call's :class:`_Options`); see the module
    docstring for keys and stored values.
    """

    def __init__(self, fn: Any, options: _Options) -> None:
        if isinstance(fn, JITFunction):
            fn = bind(fn)
        self._kernel_tree = _kernel_key(fn)  # validates the kind of fn, keys its content
        self.fn = fn
        self.base_name = _base_name(fn)
        self.arg_names: list[str] = list(fn.arg_names)
        params = list(fn.signature.parameters.values()) if hasattr(fn, "signature") else []
        self._defaults: dict[str, Any] = {
            p.name: p.default for p in params if p.default is not p.empty and p.name in self.arg_names
        }
        self._pos: dict[str, int] = {n: i for i, n in enumerate(self.arg_names)}
        import torch

        self._tensor_t: type = torch.Tensor
        self._dtype_t: type = torch.dtype

        if isinstance(options.key, str):
            raise TypeError("key= takes a list of argument names, not a single str")
        self.keys: list[str] = list(options.key)
        for k in self.keys:
            if k not in self._pos:
                raise ValueError(
                    f"autotune key {k!r} is not a parameter of {self.base_name} {self.arg_names}"
                )
        self._key_pos = [(k, self._pos[k]) for k in self.keys]

        configs = (
            list(options.configs)
            if options.configs
            else [triton.Config({}, num_warps=4, num_stages=3, num_ctas=1)]
        )
        self.configs: list[Any] = configs
        self._config_trees = [_config_tree(c, i) for i, c in enumerate(configs)]
        self._config_digests = [_config_digest(t) for t in self._config_trees]
        for i, c in enumerate(configs):
            bad = set(c.kwargs) - set(self.arg_names)
            if bad:
                raise ValueError(
                    f"configs[{i}] sets {sorted(bad)}, which are not parameters of {self.base_name}"
                )

        prune = dict(options.prune_configs_by or {})
        unknown = set(prune) - {"perf_model", "top_k", "early_config_prune"}
        if unknown:
            raise ValueError(f"unknown prune_configs_by field(s): {sorted(unknown)}")
        self.perf_model = prune.get("perf_model")
        self.configs_top_k = prune.get("top_k", 1.0)
        self.early_config_prune = prune.get("early_config_prune")
        top_k = self.configs_top_k
        if type(top_k) not in (int, float):
            raise TypeError("prune_configs_by['top_k'] must be an int or a float <= 1.0")
        prune_tree = (
            _hook_key(self.perf_model, "prune_configs_by['perf_model']"),
            top_k,
            _hook_key(self.early_config_prune, "prune_configs_by['early_config_prune']"),
        )
        self._static_digest = digest(
            (
                SCHEMA,
                SCHEMA_VERSION,
                self._kernel_tree,
                tuple(self._config_trees),
                prune_tree,
                tuple(self.keys),
            )
        )

        # Benchmark-time hooks (Triton's semantics).
        self.reset_to_zero = list(options.reset_to_zero or [])
        self.restore_value = list(options.restore_value or [])
        for name in self.reset_to_zero + self.restore_value:
            if name not in self._pos:
                raise ValueError(f"reset_to_zero/restore_value name {name!r} is not a parameter")
        self._restore_copies: dict[str, Any] = {}
        self.pre_hook: Callable[..., Any] = options.pre_hook or self._default_pre_hook
        self.post_hook: Callable[..., Any] = options.post_hook or self._default_post_hook

        if options.do_bench is not None and (
            options.warmup is not None or options.rep is not None or options.use_cuda_graph
        ):
            raise ValueError("pass either do_bench= or warmup=/rep=/use_cuda_graph=, not both")
        self._do_bench_arg = options.do_bench
        self._warmup, self._rep, self._use_cuda_graph = options.warmup, options.rep, options.use_cuda_graph
        self._bench_fn: Callable[..., Any] | None = None
        self._launcher = options.launcher or _default_launcher

        index = options.index
        if index is None or index is True:
            self._index: Index | None = (
                default_index()
            )  # DiskIndex(), tiered over $JITKEY_REMOTE_CACHE if set
        elif index is False:
            self._index = None
        elif isinstance(index, Index):  # DiskIndex, TieredIndex, RemoteIndex, another store like them
            self._index = index
        elif isinstance(index, (str, os.PathLike)):
            self._index = DiskIndex(index)
        else:
            raise TypeError(
                "index= takes a DiskIndex, TieredIndex, RemoteIndex (a jitkey.remote.Index), a directory path, "
                f"True/None or False, not {index!r}"
            )

        self._mem = LruCache(options.capacity)
        self._env: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._key = self._make_fast_key()
        self._stats = {"memory_hits": 0, "disk_hits": 0, "tunings": 0, "benchmarks": 0, "disk_rejects": 0}
        self._get_device = self._device_getter()
        self.best_config: Any = None
        self.configs_timings: dict[Any, Any] = {}
        self.bench_time = 0.0

    # -- Triton's hooks ------------------------------------------------------------------------------------
    def _default_pre_hook(self, kwargs: dict[str, Any], reset_only: bool = False) -> None:
        for name in self.reset_to_zero:
            if kwargs[name] is not None:
                kwargs[name].zero_()
        if not reset_only:
            self._restore_copies = {
                name: kwargs[name].clone() for name in self.restore_value if kwargs[name] is not None
            }

    def _default_post_hook(self, kwargs: dict[str, Any], exception: BaseException | None) -> None:
        for name, value in self._restore_copies.items():
            kwargs[name].copy_(value)
        self._restore_copies = {}

    # -- environment ---------------------------------------------------------------------------------------
    @staticmethod
    def _device_getter() -> Callable[[], int]:
        try:
            import torch
        except ImportError:  # pragma: no cover
            return lambda: -1
        if not torch.cuda.is_available():
            return lambda: -1
        get = torch.cuda.current_device
        if getattr(get, "__module__", "") == "torch.cuda" and hasattr(torch._C, "_cuda_getDevice"):
            return torch._C._cuda_getDevice
        return get  # a replaced getter (tests, simulations) is used as it is

    def _env_digest(self, device: int) -> bytes:
        d = self._env.get(device)
        if d is None:
            d = digest(env_key(device=True if device < 0 else device))
            self._env[device] = d
        return d

    @property
    def do_bench(self) -> Callable[..., Any]:
        if self._bench_fn is None:
            if self._do_bench_arg is not None:
                self._bench_fn = self._do_bench_arg
            elif self._use_cuda_graph:
                from triton.testing import do_bench_cudagraph

                rep = self._rep if self._rep is not None else 100
                self._bench_fn = lambda f, quantiles: do_bench_cudagraph(f, rep=rep, quantiles=quantiles)
            else:
                from triton.testing import do_bench

                w = self._warmup if self._warmup is not None else 25
                r = self._rep if self._rep is not None else 100
                self._bench_fn = lambda f, quantiles: do_bench(f, warmup=w, rep=r, quantiles=quantiles)
        return self._bench_fn

    # -- keys ----------------------------------------------------------------------------------------------
    def _dtype_of(self, a: Any) -> Any:
        """The dtype an argument contributes to the key (``None`` for none): ``torch.dtype``, else ``str``."""
        t = type(a)
        if t is self._tensor_t:
            return a.dtype
        if t in _NO_DTYPE:
            return None
        dt = getattr(a, "dtype", None)
        if dt is None or type(dt) is self._dtype_t:
            return dt
        return str(dt)

    def _call_key(self, device: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``(device, key values, dtype per parameter, sorted extra kwargs)`` (the general path)."""
        n = len(args)
        if n > len(self.arg_names):
            raise ArgumentError(f"{self.base_name} takes {len(self.arg_names)} arguments, got {n}")
        vals: list[Any] = []
        for name, i in self._key_pos:
            if i < n:
                vals.append(args[i])
            elif name in kwargs:
                vals.append(kwargs[name])
            elif name in self._defaults:
                vals.append(self._defaults[name])
            else:
                raise ArgumentError(f"{self.base_name}: missing autotune key argument {name!r}")
        dtypes: list[Any] = [None] * len(self.arg_names)
        for i, a in enumerate(args):
            dtypes[i] = self._dtype_of(a)
        extra: list[Any] = []
        pos = self._pos
        for name in sorted(kwargs):
            v = kwargs[name]
            j = pos.get(name)
            if j is None:
                extra.append((name, v))
            elif j < n:
                raise ArgumentError(f"{self.base_name}: got multiple values for argument {name!r}")
            else:
                dtypes[j] = self._dtype_of(v)
        return (device, tuple(vals), tuple(dtypes), tuple(extra))

    def _make_fast_key(self) -> Callable[[int, tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]:
        """``_call_key`` generated for this kernel's parameter list, for all-positional calls.

        Builds the identical tuple (``tests/test_autotune.py`` checks both paths agree); other calls take
        the general path.
        """
        # The usual call passes every parameter positionally except the trailing ones the configs set
        # (or that have defaults); generate for that length.
        tuned = {k for c in self.configs for k in c.kwargs}
        n = len(self.arg_names)
        while n > 0 and (self.arg_names[n - 1] in tuned or self.arg_names[n - 1] in self._defaults):
            n -= 1
        if n == 0 or any(i >= n for _, i in self._key_pos):
            return self._call_key
        names = [f"a{i}" for i in range(n)]
        vals = "".join(f"{names[i]}, " for _, i in self._key_pos)
        dts = "".join(f"{a}.dtype if type({a}) is _T else _dt({a}), " for a in names)
        dts += "None, " * (len(self.arg_names) - n)
        src = (
            "def fast_key(device, args, kwargs):\n"
            f"    if kwargs or len(args) != {n}:\n"
            "        return _slow(device, args, kwargs)\n"
            f"    {', '.join(names)}, = args\n"
            f"    return (device, ({vals}), ({dts}), ())\n"
        )
        ns: dict[str, Any] = {"_T": self._tensor_t, "_dt": self._dtype_of, "_slow": self._call_key}
        exec(src, ns)
        fast_key: Callable[[int, tuple[Any, ...], dict[str, Any]], tuple[Any, ...]] = ns["fast_key"]
        return fast_key

    def disk_key(self, *args: Any, **kwargs: Any) -> bytes:
        """The 32-byte DiskIndex key a call with these arguments uses on the current device."""
        device = self._get_device()
        return self._disk_key(device, self._key(device, args, kwargs))

    def _disk_key(self, device: int, mkey: tuple[Any, ...]) -> bytes:
        return digest((self._static_digest, self._env_digest(device), mkey[1:]))

    # -- calls ---------------------------------------------------------------------------------------------
    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(*args, grid=grid, warmup=False, **kwargs)

        return call

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        """Launch with the best config for this call (tuning or loading it first if needed)."""
        if warmup:
            return self.warmup(*args, grid=grid, **kwargs)
        if len(self.configs) == 1:
            cfg = self.configs[0]
            cfg_kwargs = cfg.all_kwargs()
        else:
            device = self._get_device()
            try:
                mkey = self._key(device, args, kwargs)
                entry: Any = self._mem.get(mkey, _MISS)
            except JitKeyError as exc:
                raise ArgumentError(f"{self.base_name}: cannot key the autotune arguments: {exc}") from exc
            if entry is _MISS:
                entry = self._mem.get_or_insert(mkey, lambda: self._resolve(device, mkey, grid, args, kwargs))
            else:
                self._stats["memory_hits"] += 1
            cfg, cfg_kwargs = entry
        self.best_config = cfg
        if cfg.pre_hook is not None:
            cfg.pre_hook({**dict(zip(self.arg_names, args, strict=False)), **kwargs, **cfg_kwargs})
        return self._launcher(self.fn, grid, args, {**kwargs, **cfg_kwargs})

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> list[Any]:
        """Compile every (pruned) config without launching, as Triton's ``Autotuner.warmup``."""
        nargs = dict(zip(self.arg_names, args, strict=False))
        return [
            self.fn.warmup(*args, grid=grid, **kwargs, **c.all_kwargs()) for c in self._prune(nargs, kwargs)
        ]

    def _resolve(
        self, device: int, mkey: tuple[Any, ...], grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        dkey = self._disk_key(device, mkey) if self._index is not None else None
        if dkey is not None and self._index is not None:
            raw = self._index.get(dkey)
            if raw is not None:
                decoded = self._decode(raw)
                if decoded is not None:
                    i, stored_timings = decoded
                    with self._lock:
                        self._stats["disk_hits"] += 1
                    cfg = self.configs[i]
                    listener = _autotune_listener()
                    if listener is not None:
                        self._notify(listener, mkey, cfg, stored_timings, None, cache_hit=True)
                    return cfg, cfg.all_kwargs()
                with self._lock:
                    self._stats["disk_rejects"] += 1
        best, timings = self._tune(grid, args, kwargs)
        cfg = self.configs[best]
        if not timings:  # one config left after pruning: nothing was benchmarked, nothing to store
            return cfg, cfg.all_kwargs()
        if dkey is not None and self._index is not None:
            self._index.put(dkey, self._encode(best, timings))
        listener = _autotune_listener()
        if listener is not None:
            self._notify(listener, mkey, cfg, self.configs_timings, self.bench_time, cache_hit=False)
        return cfg, cfg.all_kwargs()

    def _notify(
        self,
        listener: Callable[..., Any],
        mkey: tuple[Any, ...],
        cfg: Any,
        timings: dict[Any, Any],
        duration: float | None,
        *,
        cache_hit: bool,
    ) -> None:
        """Call ``knobs.autotuning.listener`` with the arguments Triton's autotuner passes it."""
        jit_fn = self.fn
        while not isinstance(jit_fn, JITFunction):
            jit_fn = jit_fn.fn
        listener(
            fn=jit_fn,
            key=mkey,
            best_config=cfg,
            configs_timings=timings,
            duration=duration,
            cache_hit=cache_hit,
        )

    def _encode(self, best: int, timings: dict[int, Any]) -> bytes:
        value = {
            "schema": SCHEMA,
            "v": SCHEMA_VERSION,
            "index": best,
            "config": self._config_digests[best],
            "kernel": self.base_name,
            "timings": [[i, list(_timing_order(t))] for i, t in sorted(timings.items())],
        }
        return json.dumps(value, sort_keys=True, allow_nan=True).encode()

    def _decode(self, raw: bytes) -> tuple[int, dict[Any, Any]] | None:
        """The config index a stored value names and its ``{config: timing}``, or ``None`` (a counted
        reject) for anything not exactly our schema: damaged values never raise."""
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
            return None
        if not isinstance(value, dict) or value.get("schema") != SCHEMA or value.get("v") != SCHEMA_VERSION:
            return None
        i = value.get("index")
        if type(i) is not int or not 0 <= i < len(self.configs):
            return None
        if value.get("config") != self._config_digests[i]:
            return None
        items = value.get("timings")
        if not isinstance(items, list):
            return None
        timings: dict[Any, Any] = {}
        for item in items:
            if not (
                isinstance(item, list)
                and len(item) == 2
                and type(item[0]) is int
                and 0 <= item[0] < len(self.configs)
                and isinstance(item[1], list)
                and all(type(t) in (int, float) for t in item[1])
            ):
                return None
            timings[self.configs[item[0]]] = item[1]
        return i, timings

    def _prune(self, nargs: dict[str, Any], kwargs: dict[str, Any]) -> list[Any]:
        pruned = self.configs
        if self.early_config_prune:
            pruned = self.early_config_prune(self.configs, nargs, **kwargs)
            if not pruned:
                raise ValueError("early_config_prune returned no configs; it must return at least one")
        if self.perf_model:
            top_k = self.configs_top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = max(1, int(len(self.configs) * top_k))  # as Triton 3.9: at least one
            elif not isinstance(top_k, int):
                raise TypeError("prune_configs_by['top_k'] must be an int or a float <= 1.0")
            if len(pruned) > top_k:
                est = {id(c): self.perf_model(**nargs, **kwargs, **c.all_kwargs()) for c in pruned}
                pruned = sorted(pruned, key=lambda c: est[id(c)])[:top_k]
        return list(pruned)

    def _tune(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, dict[int, Any]]:
        nargs = dict(zip(self.arg_names, args, strict=False))
        pruned = self._prune(nargs, kwargs)
        index_of = {id(c): i for i, c in enumerate(self.configs)}
        for c in pruned:
            if id(c) not in index_of:
                raise ValueError("early_config_prune / perf_model must return configs from the configs list")
        if len(pruned) == 1:
            # Triton 3.9 launches a lone pruned config without benchmarking it (3.6 times it alone:
            # the same choice, one wasted benchmark).
            return index_of[id(pruned[0])], {}
        errors = _bench_errors()
        bench = self.do_bench
        timings: dict[int, Any] = {}
        t0 = time.perf_counter()
        verbose = _print_autotuning()
        for cfg in pruned:
            if verbose:
                print(f"Autotuning kernel {self.base_name} with config {cfg}")
            conflicts = kwargs.keys() & cfg.kwargs.keys()
            if conflicts:
                raise ValueError(
                    f"Conflicting meta-parameters: {', '.join(sorted(conflicts))}. "
                    "Make sure that you don't re-define auto-tuned symbols."
                )
            current = {**kwargs, **cfg.all_kwargs()}
            full = {**nargs, **current}

            def kernel_call(
                cfg: Any = cfg, current: dict[str, Any] = current, full: dict[str, Any] = full
            ) -> None:
                if cfg.pre_hook:
                    cfg.pre_hook(full)
                self.pre_hook(full)
                try:
                    self._launcher(self.fn, grid, args, current)
                except Exception as e:
                    try:
                        self.post_hook(full, exception=e)
                    finally:
                        raise
                self.post_hook(full, exception=None)

            with self._lock:
                self._stats["benchmarks"] += 1
            try:
                t = bench(kernel_call, quantiles=_QUANTILES)
            except errors:
                t = [float("inf")] * 3
            timings[index_of[id(cfg)]] = t
        best = builtins.min(timings, key=lambda i: _timing_order(timings[i]))
        self.bench_time = time.perf_counter() - t0
        self.configs_timings = {self.configs[i]: t for i, t in timings.items()}
        if verbose:  # the lines triton.autotune prints under TRITON_PRINT_AUTOTUNING
            key = tuple(nargs.get(k) for k in self.keys)
            print(
                f"Triton autotuning for function {self.base_name},\nwith key as {key},\n"
                f"finished after {self.bench_time:.2f}s,\nbest config selected: {self.configs[best]};"
            )
        self.pre_hook({**nargs, **kwargs, **self.configs[best].all_kwargs()}, reset_only=True)
        with self._lock:
            self._stats["tunings"] += 1
        return best, timings

    # -- introspection -------------------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, int]:
        """``memory_hits``, ``disk_hits``, ``tunings``, ``benchmarks`` (configs timed), ``disk_rejects``
        (stored values that were not valid for this autotuner) and ``entries`` (in memory)."""
        with self._lock:
            out = dict(self._stats)
        out["entries"] = len(self._mem)
        return out

    def cache_clear(self) -> None:
        """Forget the in-memory choices (the disk entries stay)."""
        self._mem.clear()

    def __repr__(self) -> str:
        return f"jitkey.triton.PersistentAutotuner({self.base_name}, {len(self.configs)} configs, key={self.keys})"


def autotune(
    configs: Sequence[Any],
    key: Iterable[str],
    prune_configs_by: Mapping[str, Any] | None = None,
    reset_to_zero: Iterable[str] | None = None,
    restore_value: Iterable[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool | None = None,
    *,
    index: Index | str | os.PathLike[str] | bool | None = None,
    launcher: _Launcher | None = None,
    capacity: int = 1024,
) -> Callable[[Any], PersistentAutotuner]:
    """``triton.autotune`` whose winning configs persist in a :class:`jitkey.DiskIndex` (module docstring).

    Triton's arguments keep their meaning. ``index``: a ``DiskIndex``, a :class:`jitkey.TieredIndex` or
    :class:`jitkey.RemoteIndex` (shared across hosts on Redis), a directory for a ``DiskIndex``,
    ``None``/``True`` for the default (:func:`jitkey.remote.default_index`: ``DiskIndex()``, tiered over
    ``$JITKEY_REMOTE_CACHE`` when set; shared by every autotuner in the process), or ``False`` for
    in-memory only. ``launcher(fn, grid, args, kwargs)`` replaces the launch (tests, simulations);
    ``capacity`` bounds the in-memory cache.

    Raises:
        ValueError: ``cache_results`` given, ``do_bench`` with ``warmup``/``rep``/``use_cuda_graph``,
            a key name that is not a parameter, ``Config.ir_override``.
        TypeError: a kernel of an unsupported kind, or something in the configs or hooks that cannot be keyed.
    """
    if cache_results is not None:
        raise ValueError(
            "jitkey.triton.autotune always persists its results in a DiskIndex; cache_results= is not "
            "supported (use index= to pick the directory, or index=False for in-memory only)"
        )

    options = _Options(
        configs=configs,
        key=key,
        prune_configs_by=prune_configs_by,
        reset_to_zero=reset_to_zero,
        restore_value=restore_value,
        pre_hook=pre_hook,
        post_hook=post_hook,
        warmup=warmup,
        rep=rep,
        use_cuda_graph=use_cuda_graph,
        do_bench=do_bench,
        index=index,
        launcher=launcher,
        capacity=capacity,
    )

    def decorator(fn: Any) -> PersistentAutotuner:
        return PersistentAutotuner(fn, options)

    return decorator
