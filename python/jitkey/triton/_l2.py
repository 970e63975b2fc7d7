"""The L2 of compiled kernels: a fresh process loads a kernel that any earlier process compiled from jitkey's
disk index, without Triton's compile path.

Triton's own cache is keyed by ``get_cache_key(src, backend, options, env_vars)``: ``triton_key()`` (a hash of
the whole installation, about a second per process), ``src.hash()`` (the kernel's ``cache_key``: its source,
its callees and the constexpr globals it reads, plus the call's signature, constants and attributes),
``backend.hash()`` (``ptxas --version`` and the arch), ``options.hash()`` (every ``CUDAOptions`` field, the
extern libraries' contents) and the cache-invalidating environment. The L2 keeps, in jitkey's ``DiskIndex``,
the artifact Triton compiled (its hash, the files of its cache entry and their identities) under a key of the
same inputs, where the expensive ones are replaced by what determines them:

* ``triton_key()`` by the installation's :func:`~jitkey.triton._installation.fingerprint` (the identity of
  every file it hashes);
* ``ptxas --version`` by its value, kept per installation under the identity of the ``ptxas`` it runs;
* the extern libraries' contents by their files' identities.

The rest is Triton's own, computed as ``JITFunction.run`` computes it on a miss: its binder, ``_pack_args``
(``CUDAOptions`` from the launch options and the knobs), ``ASTSource(...).hash()``, the environment, the target,
plus ``TRITON_CACHE_DIR``. A hit builds the ``CompiledKernel`` exactly as ``triton.compile`` does on a cache
hit, inserts it into the kernel's ``device_caches`` where ``_do_compile`` would, and jitkey launches it.

Nothing here is trusted beyond what it checked: the Triton code the L2 mirrors must be code it knows (3.6.0,
3.9.0; anything else keeps every miss on Triton's path), every file of the entry must have the identity
recorded (a deleted, truncated or replaced file is a miss), the entry's metadata must name the hash, target,
options and environment of the call, and a record is written only after Triton itself compiled or loaded the
kernel in this process with the ``ptxas`` and ``triton_key()`` the key stands for. Hooks that watch Triton's
compiles (``jit_cache_hook``, ``jit_post_compile_hook``, ``compilation.listener``), a non-default cache
manager, ``TRITON_ALWAYS_COMPILE``, IR dumps and overrides, async compiles and pipeline hooks keep the call on
Triton's path, counted by reason. The L2 is opt-in (``JITKEY_TRITON_L2=1``) until the kernel libraries' suites have run with it;
``JITKEY_TRITON_L2=0`` keeps it off.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import io
import json
import os
import re
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from jitkey._core import digest
from jitkey.triton import _installation, _walk

SCHEMA = "jitkey.triton.l2"
VERSION = 2  # 2: the parameters' annotations and specialization opt-outs are in the key

# The code of the Triton functions the L2 mirrors or stands in for (whitespace-normalized, comments dropped,
# hashed by ``_l2_code_digest``): the compile path's cache-hit branch and its key, the CompiledKernel it
# builds, the cache manager that finds the files, ``_do_compile``'s bookkeeping, what ``backend.hash()`` and
# ``options.hash()`` read, and the walk behind a kernel's ``cache_key`` (replayed by ``_walk``). Known code maps
# to the dialect ``_build`` and ``_walk`` mirror it in; anything else keeps the L2 off.
_KNOWN_L2_CODE = {
    "b933f604ece62c1a6c389377d5c77c64cb0e73ac6e376b1bdaf9b6defe15ba2c": "3.6",  # triton 3.6.0
    "d4629099eccd49cc692a98f07228b71a5acafecbba3d953aad83374bf58976a4": "3.9",  # triton 3.9.0
}
# Which ptxas ``get_ptxas(arch)`` picks, per dialect: the ``ptxas-blackwell`` build from this arch on.
_BLACKWELL_PTXAS_FROM = {"3.6": 100, "3.9": 90}


def _l2_code_objects() -> list[Any]:
    from triton import knobs
    from triton.backends.nvidia import compiler as nvc
    from triton.compiler import compiler as cc
    from triton.runtime import cache, jit

    return [
        cc.compile,
        cc.CompiledKernel,
        cc.ASTSource,
        cache.get_cache_key,
        cache.triton_key,
        cache.get_cache_manager,
        cache._base32,
        cache.FileCacheManager,
        jit.JITFunction._do_compile,
        jit.JITFunction._pack_args,
        jit.JITFunction.create_binder,
        jit.compute_cache_key,
        jit.DependenciesFinder,  # the walk jitkey.triton._walk replays
        jit.JITCallable.cache_key.fget,
        nvc.CUDABackend.hash,
        nvc.get_ptxas_version,
        nvc.get_ptxas,
        nvc.CUDAOptions.hash,
        nvc.file_hash,
        knobs.env_nvidia_tool,
    ]


def _l2_code_digest() -> str:
    from jitkey.triton._installed import _normalized_source

    parts = [_normalized_source(obj) for obj in _l2_code_objects()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def _code_status() -> tuple[str | None, str | None]:
    """``(dialect, None)`` when the installed Triton's code is code the L2 mirrors, else ``(None, why not)``
    (once per process; the code digest once per installation)."""
    setting = os.environ.get("JITKEY_TRITON_L2", "").strip()
    if setting == "0":
        return None, "JITKEY_TRITON_L2=0"
    if setting != "1":
        # Opt-in: Triton's own suite passes with it on a GPU; of the kernel libraries' suites only parts have run.
        return (
            None,
            "off by default (the kernel libraries' whole suites have not run with it); JITKEY_TRITON_L2=1 turns it on",
        )
    from jitkey.triton._installed import triton_info

    info = triton_info()
    if info.problem is not None:
        return None, info.problem
    try:
        code = _l2_code_objects()
        dig = _installation.memo(
            "l2_code", _installation.code_identity([info.version, *code]), _l2_code_digest
        )
    except Exception as exc:  # no nvidia backend, no source
        return None, f"no readable Triton compile code ({type(exc).__name__}: {exc})"
    dialect = _KNOWN_L2_CODE.get(dig)
    if dialect is None:
        return None, (
            f"triton {info.version}: its compile and cache code is not code jitkey's L2 knows "
            "(every first launch goes through Triton's compile path)"
        )
    return dialect, None


def process_status() -> tuple[str | None, str | None]:
    """``(dialect, None)`` when this process may use the L2, else ``(None, why not)``."""
    dialect, why = _code_status()
    if dialect is None:
        return None, why
    ix = _installation.index()
    if ix is None:
        why = _installation.index_problem()
        return (dialect, None) if why is None else (None, why)  # None alone: not created yet (jitkey info)
    if ix.mode == "memory":
        return None, f"the disk index is memory-only: {ix.mode_reason}"
    return dialect, None


def _call_problem(knobs: Any) -> str | None:
    """Why this call's compile must stay Triton's (a watched or altered compile path), else ``None``."""
    if knobs.cache.manager_class is not None:
        return "a cache manager other than Triton's default (TRITON_CACHE_MANAGER)"
    c = knobs.compilation
    if c.always_compile:
        return "TRITON_ALWAYS_COMPILE is set"
    if c.listener is not None:
        return "knobs.compilation.listener is set"
    if c.dump_ir or c.override:
        return "IR dump or override is on (TRITON_KERNEL_DUMP / TRITON_KERNEL_OVERRIDE)"
    r = knobs.runtime
    if r.jit_cache_hook is not None or r.jit_post_compile_hook is not None:
        return "a jit_cache_hook or jit_post_compile_hook is set"
    if getattr(r, "add_stages_inspection_hook", None) is not None:
        return "knobs.runtime.add_stages_inspection_hook is set"
    from triton.runtime import _async_compile

    if _async_compile.active_mode.get() is not None:
        return "an async compile mode is active"
    return None


# ---------------------------------------------------------------------------------------------------------
# The key
# ---------------------------------------------------------------------------------------------------------


_ptxas_seen: dict[Any, str] = {}  # this process's ptxas versions, by what selects the ptxas


def _ptxas_version(knobs: Any, arch: int, dialect: str) -> str:
    """What ``get_ptxas_version(arch)`` returns for the current knobs, kept per installation under the identity
    of the ``ptxas`` it would run (the mock version, the path knob, the candidate files); raises ``ValueError``
    for a knob value that cannot be keyed."""
    from triton.backends.nvidia.compiler import get_ptxas_version

    mock = knobs.nvidia.mock_ptx_version
    if mock is not None:
        return str(mock)
    name = "ptxas_blackwell" if arch >= _BLACKWELL_PTXAS_FROM[dialect] else "ptxas"
    tool = type(knobs.nvidia).__dict__[name]
    override = knobs.nvidia.__dict__.get(name)
    if override is not None and not isinstance(override, str):
        raise ValueError(f"knobs.nvidia.{name} is set to a {type(override).__name__}")
    env = os.environ.get(tool.key)
    # Once per process and selection, as Triton's own ``get_ptxas_version`` (an ``lru_cache``) runs it once per
    # process: the files are looked at (stat'ed) only the first time.
    chosen = (name, override, env)
    version = _ptxas_seen.get(chosen)
    if version is None:
        paths = [p for p in (override if override is not None else env, tool.default_path) if p is not None]
        selector = (*chosen, tuple(_installation.file_identity(p) for p in paths))
        version = str(
            _installation.memo("ptxas_version", selector, lambda: get_ptxas_version.__wrapped__(arch))
        )
        _ptxas_seen[chosen] = version
    return version


_lib_seen: dict[str, tuple[Any, ...]] = {}  # this process's extern library identities, by path


def _lib_identity(path: str) -> tuple[Any, ...]:
    """The file's identity, stat'ed once per process and path: Triton hashes an extern library's contents once
    per process and path (``file_hash`` is an ``lru_cache``), so a file changed later is not seen by it either."""
    ident = _lib_seen.get(path)
    if ident is None:
        ident = _lib_seen[path] = _installation.file_identity(path)
    return ident


def _options_key(options: Any) -> tuple[Any, ...]:
    items = []
    for name, value in sorted(vars(options).items()):
        if name == "extern_libs":  # Triton hashes the files' contents: their identities stand for them
            value = tuple((lib, path, _lib_identity(path)) for lib, path in value)
        items.append((name, value))
    return tuple(items)


class Pending:
    """A call's L2 key and what it was computed from, until Triton's own path gives the kernel to record."""

    __slots__ = (
        "arch",
        "args",
        "cache_dir",
        "env_vars",
        "key",
        "kwargs",
        "options",
        "options_str",
        "ptxas",
        "target",
    )

    def __init__(
        self,
        key: bytes,
        target: tuple[str, int, int],
        ptxas: str,
        options: Any,
        options_str: str,
        env_vars: dict[str, str],
        cache_dir: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.key = key
        self.target = target
        self.arch = target[1]
        self.ptxas = ptxas
        self.options = options  # the call's CUDAOptions
        self.options_str = options_str  # str() of the options JITFunction.run's key ends with
        self.env_vars = env_vars
        self.cache_dir = cache_dir
        # the call itself: a jit function passed as a constexpr is taken from it (see _decode_value)
        self.args = args
        self.kwargs = kwargs


class Loaded:
    """A kernel loaded from the L2 and inserted where Triton keeps it (``kernel_cache[key]``)."""

    __slots__ = ("ck", "kcache", "tkey")

    def __init__(self, ck: Any, kcache: dict[Any, Any], tkey: Any) -> None:
        self.ck, self.kcache, self.tkey = ck, kcache, tkey


def lookup(kernel: Any, launcher: Any, device: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The L2 for a jitkey miss: ``Loaded`` (a hit), ``Pending`` (a miss: record what Triton's path gives) or
    ``None`` (not for the L2: Triton's path, counted in the kernel's statistics when there is a reason).

    The call's key is jitkey's own (``launcher.key(..., persistent=True)``: at least as fine as Triton's
    specialization, so it determines the signature, constants and attributes Triton compiles for), never
    Triton's binder (whose first use in a process imports Gluon)."""
    stats = kernel._jk_stats
    dialect, why = process_status()
    if dialect is None:
        return None
    from jitkey._triton_table import cache_key
    from jitkey.triton._installed import triton_info

    info = triton_info()
    knobs = info.knobs
    why = _call_problem(knobs)
    if why is not None:
        stats.l2_skipped[why] += 1
        return None
    try:
        try:
            # Replayed from its recorded walk if this process has not hashed it yet (so are the jit functions the
            # call passes, in launcher.key); a walk Triton made instead is recorded below (_record_walks).
            content = cache_key(kernel)  # leaves the kernel as it was if it raises
        except Exception as exc:  # Triton's own path computes it again and raises its error
            stats.l2_skipped[f"not keyable for the L2 ({type(exc).__name__} from cache_key)"] += 1
            return None
        call_key = launcher.key(args, kwargs, device, persistent=True)
        # What JITFunction.run hands its binder and _pack_args: its knob reads added to the call's kwargs.
        kw = dict(kwargs)
        kw["debug"] = kw.get("debug", kernel.debug) or knobs.runtime.debug
        for name, section, attr in info.knob_reads:
            kw[name] = getattr(getattr(knobs, section), attr)
        names = kernel.arg_names
        run_options = {k: v for k, v in kw.items() if k not in names}  # the binder's **options
        if {"device_type", "device", "stream"} & kw.keys():
            return None  # Triton's own path raises its error
        _, _, target, backend, _ = _device_caches_entry(kernel, device)
        if getattr(target, "backend", None) != "cuda":
            stats.l2_skipped[f"the target is {getattr(target, 'backend', None)!r}, not 'cuda'"] += 1
            return None
        options = backend.parse_options(kw)  # as _pack_args makes them
        if any(k not in options.__dict__ and k not in names for k in kw):
            return None  # _pack_args raises for an unknown keyword argument
        from triton._C.libtriton import get_cache_invalidating_env_vars

        env_vars = dict(get_cache_invalidating_env_vars())
        ptxas = _ptxas_version(knobs, target.arch, dialect)
        cache_dir = knobs.cache.dir
        tgt = (target.backend, target.arch, target.warp_size)
        from jitkey import __version__

        key = digest(
            (
                SCHEMA,
                VERSION,
                __version__,
                _installation.fingerprint(),
                content,
                _params_key(kernel),
                call_key,
                tgt,
                ptxas,
                _options_key(options),
                tuple(sorted(env_vars.items())),
                cache_dir,
            )
        )
    except Exception as exc:  # an argument Triton rejects, an unkeyable option: Triton's path decides
        stats.l2_skipped[f"not keyable for the L2 ({type(exc).__name__})"] += 1
        return None
    finally:
        _record_walks(kernel, dialect)
    pending = Pending(key, tgt, ptxas, options, str(run_options), env_vars, cache_dir, args, kwargs)
    ix = _installation.index()
    try:
        raw = ix.get(key) if ix is not None else None
    except Exception:
        raw = None
    if raw is None:
        stats.l2_misses += 1
        return pending
    built = _build(kernel, raw, pending, backend, dialect)
    if isinstance(built, str):
        stats.l2_misses += 1
        stats.l2_skipped[built] += 1
        return pending
    ck, tkey = built
    kernel_cache = kernel.device_caches[device][0]
    ck = kernel_cache.setdefault(tkey, ck)  # where _do_compile puts it (another thread may have been first)
    _init_handles(ck, dialect, info)
    stats.l2_hits += 1
    return Loaded(ck, kernel_cache, tkey)


class LazyBinder:
    """The binder ``JITFunction.create_binder`` makes, ``create_function_from_signature(signature, params,
    backend)``, generated at its first call. A kernel the L2 loads is launched by jitkey, which never binds
    through it, so a process whose first launches hit the L2 does not generate one per kernel (``exec`` of its
    source: about 0.1-0.2 ms each); Triton's own path (a fallback, a warmup, Helion's precompiled launcher)
    calls it as it calls Triton's."""

    __slots__ = ("_fn", "_of")

    def __init__(self, signature: Any, params: Any, backend: Any) -> None:
        self._of = (signature, params, backend)
        self._fn: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            from triton.runtime.jit import create_function_from_signature

            fn = self._fn = create_function_from_signature(*self._of)
        return fn(*args, **kwargs)


def _device_caches_entry(kernel: Any, device: int) -> Any:
    """``kernel.device_caches[device]``. Where that would call Triton's own ``create_binder`` (the dict's
    default factory; the L2's code digest pins its code), the same entry is made here, its binder a
    :class:`LazyBinder`: ``create_binder`` line for line but for the binder."""
    from collections import defaultdict

    from triton.runtime.jit import JITFunction

    caches = kernel.device_caches
    have = dict.get(caches, device) if isinstance(caches, dict) else None
    if have is not None:
        return have
    if (
        type(caches) is not defaultdict
        or caches.default_factory != kernel.create_binder
        or type(kernel).create_binder is not JITFunction.create_binder
    ):
        return caches[device]
    from triton.compiler import ASTSource, CompiledKernel, compile, make_backend
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    backend = make_backend(target)
    kernel.CompiledKernel = CompiledKernel
    kernel.compile = compile
    kernel.ASTSource = ASTSource
    binder = LazyBinder(kernel.signature, kernel.params, backend)
    return caches.setdefault(device, ({}, {}, target, backend, binder))


def _params_key(kernel: Any) -> tuple[Any, ...]:
    """What Triton's binder reads of each parameter besides the argument: its annotation (``v: tl.uint8``
    compiles another kernel for the same int), const-ness and the specialization opt-outs. The kernel's
    ``cache_key`` does not cover them (it hashes the source, and annotations may be set apart from it)."""
    return tuple(
        (
            p.name,
            p.annotation_type,
            p.is_const,
            p.is_constexpr,
            p.do_not_specialize,
            p.do_not_specialize_on_alignment,
        )
        for p in kernel.params
    )


def _init_handles(ck: Any, dialect: str, info: Any) -> None:
    """``ck._init_handles()``: Triton's own (its launcher, resource checks, load hooks, module load); under
    Triton 3.6, for a kernel jitkey launches itself, the same with the C launcher made at its first use."""
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.runtime.driver import driver

    from jitkey.triton._installed import LazyLauncher36

    if (
        dialect != "3.6"
        or info.launch_dialect != "3.6"
        or driver.active.launcher_cls is not CudaLauncher
        or LazyLauncher36.wraps(ck.src.signature)
    ):
        ck._init_handles()
        return
    _init_handles_36(ck)


def _init_handles_36(ck: Any) -> None:
    """``CompiledKernel._init_handles`` of Triton 3.6.0 (the L2's code digest pins it), line for line, but for
    ``self._run``: a ``LazyLauncher36`` instead of ``driver.active.launcher_cls(self.src, self.metadata)``."""
    import copy

    from triton import knobs
    from triton.compiler.compiler import _raise_error, max_shared_mem
    from triton.runtime.autotuner import OutOfResources
    from triton.runtime.driver import driver

    from jitkey.triton._installed import LazyLauncher36

    if ck.module is not None:
        return

    def raise_(err: BaseException) -> None:
        cloned_err = copy.deepcopy(err)
        ck._run = functools.partial(_raise_error, cloned_err)
        raise err

    device = driver.active.get_current_device()
    ck._run = LazyLauncher36(ck)
    max_shared = max_shared_mem(device)
    if ck.metadata.shared > max_shared:
        raise_(OutOfResources(ck.metadata.shared, max_shared, "shared memory"))
    if hasattr(ck.metadata, "tmem_size") and ck.metadata.tmem_size is not None:
        max_tmem_size = 512
        if ck.metadata.tmem_size > max_tmem_size:
            raise_(OutOfResources(ck.metadata.tmem_size, max_tmem_size, "tensor memory"))
    if knobs.runtime.kernel_load_start_hook is not None:
        knobs.runtime.kernel_load_start_hook(ck.module, ck.function, ck.name, ck.metadata_group, ck.hash)
    ck.module, ck.function, ck.n_regs, ck.n_spills, ck.n_max_threads = driver.active.utils.load_binary(
        ck.name, ck.kernel, ck.metadata.shared, device
    )
    warp_size = driver.active.get_current_target().warp_size
    if ck.metadata.num_warps * warp_size > ck.n_max_threads:
        raise_(OutOfResources(ck.metadata.num_warps * warp_size, ck.n_max_threads, "threads"))
    if knobs.runtime.kernel_load_end_hook is not None:
        knobs.runtime.kernel_load_end_hook(ck.module, ck.function, ck.name, ck.metadata_group, ck.hash)


# ---------------------------------------------------------------------------------------------------------
# What the record keeps of Triton's specialization: signature, constants and attributes, exactly
# ---------------------------------------------------------------------------------------------------------


def _encode_value(v: Any) -> Any:
    """A constant as tagged JSON (raises ``TypeError`` for what it cannot rebuild exactly). A jit function (a
    ``JITFunction`` passed as a constexpr) is kept as its ``cache_key``: a later process takes the function from its
    own call and checks that key (see :func:`_decode_value`)."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    t = type(v)
    if v is None or t in (bool, int, str):
        return {"v": v}
    if t is float:
        return {"f": v.hex()}
    if t is tuple:
        return {"tuple": [_encode_value(x) for x in v]}
    if t is tl.constexpr:
        return {"constexpr": _encode_value(v.value)}
    if t is tl.dtype:
        return {"dtype": v.name}
    if isinstance(v, JITFunction):
        return {"jit": v.cache_key}
    raise TypeError(f"a constant of type {t.__qualname__}")


def _decode_value(d: Any, at: Callable[[], Any] | None) -> Any:
    """The constant ``d`` stands for. ``at()``: the call's own value at the constant's path (``None`` inside a
    tuple: a jit function is rebuilt only where Triton found it, a parameter's own value)."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    (tag, x), *rest = d.items()
    if rest:
        raise ValueError("a damaged constant")
    if tag == "v":
        return x
    if tag == "f":
        return float.fromhex(x)
    if tag == "tuple":
        return tuple(_decode_value(y, None) for y in x)
    if tag == "constexpr":
        return tl.constexpr(_decode_value(x, at))
    if tag == "dtype":
        return tl.dtype(x)
    if tag == "jit":
        fn: Any = at() if at is not None else None
        if type(fn) is tl.constexpr:
            fn = fn.value
        if not isinstance(fn, JITFunction) or not isinstance(x, str) or fn.cache_key != x:
            raise ValueError("a jit function the call does not pass")
        return fn
    raise ValueError(f"an unknown constant tag {tag!r}")


def _call_value(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], path: tuple[int, ...]) -> Any:
    """The call's value at a constant's path, as Triton's binder binds it (``bound_args``: positional, keyword,
    then the default) and ``_pack_args`` reads it (``get_iterable_path``). Raises ``LookupError`` without one."""
    i, *inner = path
    if i < len(args):
        value = args[i]
    else:
        name = kernel.params[i].name
        if name in kwargs:
            value = kwargs[name]
        else:
            value = kernel.signature.parameters[name].default
            if value is inspect.Parameter.empty:
                raise LookupError(name)
    for j in inner:
        value = value[j]
    return value


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _encode_spec(src: Any) -> dict[str, Any]:
    return {
        "signature": [[k, v] for k, v in src.signature.items()],
        "constants": [[list(k), _encode_value(v)] for k, v in src.constants.items()],
        "attrs": [[list(k), v] for k, v in src.attrs.items()],
    }


def _decode_spec(kernel: Any, spec: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``ASTSource`` Triton compiled the kernel from (``ASTSource(fn, signature, constexprs, attrs)``), for the
    call ``args``/``kwargs``."""
    from triton.compiler.compiler import ASTSource

    signature = {str(k): _tuples(v) for k, v in spec["signature"]}
    constexprs: dict[tuple[int, ...], Any] = {}
    for k, v in spec["constants"]:
        path = tuple(k)
        constexprs[path] = _decode_value(v, functools.partial(_call_value, kernel, args, kwargs, path))
    attrs = {tuple(k): v for k, v in spec["attrs"]}
    return ASTSource(kernel, signature, constexprs, attrs)


# ---------------------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------------------


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return v


def _options_match(get: Callable[[str], Any], options: Any) -> bool:
    """Whether a kernel's metadata (``get(name)``: a field, ``None`` if absent) holds every option as the call's
    options hold it, the metadata's lists standing for the options' tuples (Triton reads it from JSON)."""
    for k, v in vars(options).items():
        got = get(k)
        # A scalar compares as it is; a tuple is a list in JSON (a list never equals a tuple).
        if got != v and (not isinstance(v, (tuple, list)) or got != _jsonable(v)):
            return False
    return True


@functools.lru_cache(maxsize=64)
def _metadata_type(fields: tuple[str, ...]) -> type:
    """``namedtuple('KernelMetadata', fields)``, made once per field set (Triton makes one per kernel)."""
    return namedtuple("KernelMetadata", fields)


@functools.cache
def _text_encoding() -> str:
    """The encoding ``open(path)`` (``Path.read_text()``, how CompiledKernel reads its IR) decodes with."""
    return io.TextIOWrapper(io.BytesIO()).encoding


def _read_checked(path: str, ident: list[Any], binary: bool) -> Any:
    """The file's contents (bytes, or text as ``Path.read_text()`` gives it: the locale's encoding, universal
    newlines), if the open file is the one recorded (size, mtime, inode, device), else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if [size, st.st_mtime_ns, st.st_ino, st.st_dev] != ident:
            return None
        # One byte more than recorded: a file that grew since its fstat is not the recorded one. A read that
        # returns the whole recorded size is the file (one read call); a short one is continued.
        data = os.read(fd, size + 1)
        if 0 < len(data) < size:
            chunks = [data]
            left = size + 1 - len(data)
            while left > 0:
                b = os.read(fd, left)
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
            data = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != size:
        return None
    if binary:
        return data
    try:
        text = data.decode(_text_encoding())
    except (UnicodeDecodeError, LookupError):
        return None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _build(kernel: Any, raw: bytes, p: Pending, backend: Any, dialect: str) -> Any:
    """``(CompiledKernel, Triton's key)`` of a record, the kernel built as ``CompiledKernel(src, metadata_group,
    hash)`` builds it on a cache hit, or why not (a str)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import AsmDict, CompiledKernel
    from triton.runtime.cache import _base32

    try:
        rec = json.loads(raw)
        if rec.get("v") != VERSION:
            return "an L2 record of another format"
        h, files, group = rec["hash"], rec["files"], rec["group"]
        # The rebuilt specialization must be exactly the one Triton compiled. A constant the call does not hold
        # as recorded (a jit function's cache_key raising, say) is a miss.
        try:
            src = _decode_spec(kernel, rec["spec"], p.args, p.kwargs)
            rebuilt = src.hash() == rec["src_hash"]
        except Exception:
            rebuilt = False
        if not rebuilt:
            return "an L2 record whose specialization does not rebuild"
        tkey = rec["tkey_spec"] + p.options_str  # JITFunction.run's key: str(specialization) + str(options)
        entry_dir = os.path.normpath(os.path.join(p.cache_dir, _base32(h)))
        metadata_filename = f"{src.name[:150]}.json"
        if [f[0] for f in files if f[0].endswith(".json")] != [metadata_filename]:
            return "an L2 record of another kernel"
        for _, path, *_ in files:
            folder = os.path.dirname(path)
            if folder != entry_dir and os.path.normpath(folder) != entry_dir:
                return "an L2 record outside TRITON_CACHE_DIR"
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "a damaged L2 record"
    if list(_installation.file_identity(group[0])[1:]) != group[1:]:
        return "Triton's cache entry changed or is gone"
    binary_ext = backend.binary_ext
    meta_text: Any = None
    metadata_group: dict[str, str] = {}
    asm: dict[str, Any] = {}  # CompiledKernel's {suffix: contents} of the files but the metadata
    for child, path, *ident in files:
        ext = os.path.splitext(path)[1][1:]
        is_json = child.endswith(".json")
        data = _read_checked(path, ident, binary=ext == binary_ext and not is_json)
        if data is None:
            return "Triton's cache entry changed or is gone"
        metadata_group[child] = path
        if is_json:
            meta_text = data  # the one metadata file (checked above)
        else:
            asm[ext] = data
    try:
        md = json.loads(meta_text)
        target = md["target"]
        ok = (
            md["hash"] == h
            and md.get("triton_version") == _triton_version()
            and (target["backend"], target["arch"], target["warp_size"]) == p.target
            and _options_match(md.get, p.options)
            and all(md.get(k) == v for k, v in p.env_vars.items())
        )
        if not ok:
            return "Triton's cache entry is not this call's kernel"
        md["target"] = GPUTarget(target["backend"], target["arch"], target["warp_size"])
        metadata = _metadata_type(tuple(sorted(md)))(**md)
    except (ValueError, KeyError, TypeError):
        return "Triton's cache entry is not this call's kernel"
    # CompiledKernel.__init__ (3.6.0 / 3.9.0), attribute by attribute, in its order.
    ck = CompiledKernel.__new__(CompiledKernel)
    ck.metadata = metadata
    ck.packed_metadata = backend.pack_metadata(metadata)
    ck.src = src
    ck.hash = h
    ck.name = metadata.name
    ck.asm = AsmDict(asm)
    ck.metadata_group = metadata_group
    ck.kernel = ck.asm[binary_ext]
    ck.module = None
    if dialect == "3.9":
        ck._module_pid = None
    ck.function = None
    ck._run = None
    return ck, tkey


@functools.cache
def _triton_version() -> str:
    import triton

    return str(triton.__version__)


# ---------------------------------------------------------------------------------------------------------
# Record
# ---------------------------------------------------------------------------------------------------------


def record(kernel: Any, pending: Pending, ck: Any, tkey: Any) -> None:
    """Store what Triton's own path gave for a call the L2 missed (``ck``, kept by Triton under ``tkey``), when
    it is provably the kernel the key stands for (else nothing, counted)."""
    stats = kernel._jk_stats
    why = _record_problem(kernel, pending, ck, tkey)
    if why is None:
        try:
            spec = _encode_spec(ck.src)
            again = _decode_spec(kernel, json.loads(json.dumps(spec)), pending.args, pending.kwargs)
            if again.hash() != ck.src.hash():
                why = "its specialization does not round-trip"
        except (TypeError, ValueError, LookupError) as exc:
            why = (
                f"{exc} (jitkey stores ints, floats, bools, str, None, tuples, tl.constexpr, tl.dtype and jit"
                " functions passed as parameters)"
            )
    if why is not None:
        stats.l2_skipped[f"not recorded: {why}"] += 1
        return
    files = []
    for child, path in ck.metadata_group.items():
        ident = _installation.file_identity(path)
        if len(ident) == 1:
            stats.l2_skipped["not recorded: a file of Triton's cache entry is gone"] += 1
            return
        files.append([child, path, *ident[1:]])
    meta = next(path for child, path in ck.metadata_group.items() if child.endswith(".json"))
    grp = _installation.file_identity(os.path.join(os.path.dirname(meta), "__grp__" + os.path.basename(meta)))
    if len(grp) == 1:
        stats.l2_skipped["not recorded: Triton's cache entry has no group file"] += 1
        return
    value = {
        "v": VERSION,
        "hash": ck.hash,
        "files": files,
        "group": list(grp),
        "spec": spec,
        "src_hash": ck.src.hash(),
        "tkey_spec": tkey[: len(tkey) - len(pending.options_str)],
    }
    ix = _installation.index()
    try:
        if ix is not None:
            ix.put(pending.key, json.dumps(value).encode())
            stats.l2_recorded += 1
    except Exception as exc:  # a value too large, a warning turned into an error: not recorded
        stats.l2_skipped[f"not recorded: {type(exc).__name__}"] += 1


def _record_walks(kernel: Any, dialect: str) -> None:
    """Record the ``cache_key`` walks Triton made since the last time (:func:`jitkey.triton._walk.flush`); why
    not, counted in the kernel's statistics."""
    try:
        problems = _walk.flush(dialect)
    except Exception as exc:
        problems = [type(exc).__name__]
    for why in problems:
        kernel._jk_stats.l2_skipped[f"cache_key walk not recorded: {why}"] += 1


_HASH = re.compile(r"[0-9a-f]{64}")


def _record_problem(kernel: Any, p: Pending, ck: Any, tkey: Any) -> str | None:
    from triton.compiler.compiler import ASTSource, CompiledKernel

    if type(ck) is not CompiledKernel:
        return f"Triton returned a {type(ck).__name__}, not a CompiledKernel"
    src: Any = getattr(ck, "src", None)
    if type(src) is not ASTSource or src.fn is not kernel:
        return "the CompiledKernel is not of this kernel's source"
    if not isinstance(ck.hash, str) or _HASH.fullmatch(ck.hash) is None:
        return "the CompiledKernel has no hash"
    if not isinstance(tkey, str) or not tkey.endswith(p.options_str):
        return "Triton keeps the kernel under a key jitkey cannot rebuild"
    md = ck.metadata
    if (getattr(md, "hash", None), md.target.backend, md.target.arch, md.target.warp_size) != (
        ck.hash,
        *p.target,
    ):
        return "the compiled kernel's target differs"
    if not _options_match(lambda k: getattr(md, k, None), p.options):
        return "the compiled kernel's options differ from the key's"
    if not all(getattr(md, k, None) == v for k, v in p.env_vars.items()):
        return "the compiled kernel's environment differs from the key's"
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas_version

    if _call_problem(knobs) is not None:
        return "Triton's compile path was watched or altered during the call"
    # Triton computed both in this process for this compile (cached per process): the key's stand-ins must agree.
    if str(get_ptxas_version(p.arch)) != p.ptxas:
        return "Triton used another ptxas version than the key's (a ptxas knob changed in this process)"
    from jitkey.env import compute_triton_key

    if _installation.triton_key_digest() != compute_triton_key():
        return "Triton's installation changed since this process fingerprinted it"
    for _, path in ck.metadata_group.items():
        if os.path.normpath(os.path.dirname(os.path.dirname(path))) != os.path.normpath(p.cache_dir):
            return "the kernel's files are outside TRITON_CACHE_DIR"
    return None


def status() -> dict[str, Any]:
    """``{"on": bool, "why": str | None}`` for ``jitkey info`` (per process; a call may still be refused)."""
    dialect, why = process_status()
    return {"on": dialect is not None, "why": why}
