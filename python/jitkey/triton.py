"""Launch warm Triton kernels without Triton's per-call Python dispatch.

``jitkey.triton.jit`` (a drop-in for ``triton.jit``) and ``jitkey.triton.bind(jit_fn)`` wrap a
``triton.JITFunction``. ``kernel[grid](*args, **kwargs)`` behaves like Triton's ``fn[grid](...)``:

* **Key.** Every call builds a key that is at least as fine as Triton's own specialization: the current
  device index, per parameter Triton's buckets (tensor dtype + 16-byte alignment; int range class,
  ``== 1`` and ``% 16``; bool before int; float; None; tuples recursively; constexpr values tagged with
  their type; ``do_not_specialize`` / ``do_not_specialize_on_alignment`` honoured), constexpr defaults,
  the sorted launch options and the knob state Triton folds in per call (``fn.debug``,
  ``knobs.runtime.debug``, ``knobs.compilation.instrumentation_mode`` and the ``kwargs[...] = knobs.x.y``
  assignments the installed Triton's ``JITFunction.run`` makes). Each bound kernel has its own table, so
  function identity is part of the key by construction.
* **Miss.** Triton itself runs the call (``jit_fn.run(..., warmup=False)``: it binds, compiles if needed,
  launches and returns the ``CompiledKernel`` it chose). jitkey keeps a strong reference to that kernel
  and stores ``(ck, ck.run, ck.function, ck.packed_metadata)``. A hit can therefore never pick a kernel
  Triton would not pick for the same call.
* **Hit.** The current stream is read on every call (``torch.cuda.stream()`` contexts and CUDA-graph
  capture work); launch hooks and ``launch_metadata`` are passed only when a hook chain is non-empty
  (checked on every call); globals the kernel reads are checked like Triton does; then ``ck.run(...)``, or
  the CUDA launcher's C ``launch`` with the same arguments when ``CudaLauncher.__call__`` is code known to
  only forward to it (see ``_FORWARDING_CALLS``) and the kernel needs no scratch buffer. With the native
  keyer the whole hit runs in one native call (``jitkey._core._TritonLauncher``) and ``kernel[grid]`` is C.
* **Fallback.** Anything not proven safe goes through Triton's own path and is counted in
  :meth:`TritonKernel.cache_stats` with its reason: ``pre_run_hooks``, argument types outside the rules,
  unkeyable launch options, wrappers other than a plain ``JITFunction`` (``@triton.autotune`` /
  ``@triton.heuristics`` objects passed to :func:`bind`), a Triton whose internals do not look like the
  ones this module was written against, a non-CUDA driver, and a ``jit_cache_hook`` veto.

``@triton.autotune`` / ``@triton.heuristics`` *over* ``@jitkey.triton.jit`` are safe and use the fast path
for the inner launch: the autotuner keeps its own logic (keys, pre-hooks, config kwargs) and calls
``kernel.run(..., warmup=False)``, which is the jitkey launch.

The per-call key comes from a *keyer* (see :class:`Keyer`): :class:`NativeKeyer` (the default where the build
has it) compiles ``jitkey.rules.triton(fn)`` into a ``jitkey.Signature`` and launches through the native
launcher; :class:`PythonKeyer` is the pure-Python implementation over :class:`jitkey.LruCache`, launched by a
Python function generated per kernel (``bind(fn, keyer=...)`` or :func:`set_default_keyer` choose).
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from jitkey._core import LruCache, _KernelBase, encode
from jitkey.errors import ArgumentError, GlobalsChangedError, JitKeyError

__all__ = [
    "Keyer",
    "NativeKeyer",
    "PersistentAutotuner",
    "PythonKeyer",
    "TritonKernel",
    "Unkeyable",
    "auto_keyer",
    "autotune",
    "bind",
    "jit",
    "native_available",
    "native_keyer",
    "python_keyer",
    "set_default_keyer",
]

_MISSING = object()
_PREFIX = "_jk_"  # prefix of every name the generated launcher defines; kernel params must not use it


class Unkeyable(ArgumentError):
    """A call the keyer's rules cannot key (a :class:`jitkey.errors.ArgumentError`, so a ``TypeError``).

    Inside a launch it never reaches the caller: the call goes through Triton's own path instead and is
    counted as a fallback with :attr:`reason`. :meth:`TritonKernel.key_of` raises it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------------------
# Feature detection of the installed Triton (runs without a GPU)
# ---------------------------------------------------------------------------------------------------------


class _TritonInfo:
    """What this module needs from the installed Triton, or why it cannot have it (``problem``)."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.version = "?"
        self.knob_reads: list[tuple[str, str, str]] = []  # (kwarg name, knobs section, attribute)
        self.checks_stages_hook = False
        # CudaLauncher.__call__ when its code is exactly one this module knows (see _FORWARDING_CALLS),
        # else None: then a hit calls ck.run, never the launcher's C function directly.
        self.launcher_call: Callable[..., Any] | None = None
        try:
            import triton
            from triton import knobs
            from triton.runtime.jit import JITFunction

            self.version = str(getattr(triton, "__version__", "?"))
            self.JITFunction = JITFunction
            self.knobs = knobs
            self.HookChain: type | None = getattr(knobs, "HookChain", None)
            src = inspect.getsource(JITFunction.run)
        except Exception as exc:  # an import or source problem means: never fast-path
            self.problem = f"cannot inspect triton internals ({type(exc).__name__}: {exc})"
            return
        self.problem = self._scan_run(src)
        self.launcher_call = _known_launcher_call()

    def _scan_run(self, src: str) -> str | None:
        """Read ``JITFunction.run``'s per-call knob reads; anything unexpected disables the fast path."""
        for name, rhs in re.findall(r"kwargs\[\s*[\"'](\w+)[\"']\s*\]\s*=\s*(.+)", src):
            rhs = rhs.strip()
            if name == "debug":
                if rhs != 'kwargs.get("debug", self.debug) or knobs.runtime.debug':
                    return f"triton {self.version}: unexpected debug rule in JITFunction.run: {rhs}"
                continue
            m = re.fullmatch(r"knobs\.(\w+)\.(\w+)", rhs)
            if m is None:
                return f"triton {self.version}: JITFunction.run sets kwargs[{name!r}] = {rhs} (unknown rule)"
            self.knob_reads.append((name, m.group(1), m.group(2)))
        known = {("runtime", a) for a in ("debug", "launch_enter_hook", "launch_exit_hook")}
        known |= {("runtime", "add_stages_inspection_hook")} | {(s, a) for _, s, a in self.knob_reads}
        for ref in sorted(set(re.findall(r"knobs\.(\w+)\.(\w+)", src)) - known):
            return f"triton {self.version}: JITFunction.run reads knobs.{ref[0]}.{ref[1]} (unknown to jitkey)"
        self.checks_stages_hook = "add_stages_inspection_hook" in src
        for needed in ("self.pre_run_hooks", "self.used_global_vals", "kernel.run(", "launch_metadata"):
            if needed not in src:
                return f"triton {self.version}: JITFunction.run no longer uses {needed}"
        if "grid(bound_args)" not in src:
            return f"triton {self.version}: JITFunction.run calls a callable grid differently"
        return None


# The code of CudaLauncher.__call__ (whitespace-normalized, comments dropped) in the Triton versions jitkey knows.
# Each one only allocates scratch buffers when a size is > 0 and otherwise forwards its arguments to
# ``self.launch`` (the compiled C launcher) with ``launch_cooperative_grid, launch_pdl, None, None``
# inserted after ``function``. For a kernel whose scratch sizes are both <= 0, a hit may therefore call
# ``self.launch`` itself with exactly the arguments ``ck.run`` would pass, skipping one Python frame
# (and its closure allocation) per launch. Any other code (a new Triton, a patch) keeps ``ck.run``.
_FORWARDING_CALLS = (
    """def __call__(self, gridX, gridY, gridZ, stream, function, *args):
def allocate_scratch(size, align, allocator):
if size > 0:
grid_size = gridX * gridY * gridZ
alloc_size = grid_size * self.num_ctas * size
alloc_fn = allocator.get()
return alloc_fn(alloc_size, align, stream)
return None
global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align, _allocation._allocator)
profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align,
_allocation._profile_allocator)
self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
global_scratch, profile_scratch, *args)""",
)


def _normalized_source(f: Any) -> str:
    lines = (ln.strip() for ln in inspect.getsource(f).splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("#"))


def _known_launcher_call() -> Callable[..., Any] | None:
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        call = CudaLauncher.__call__
        return call if _normalized_source(call) in _FORWARDING_CALLS else None
    except Exception:  # no nvidia backend, no source: keep ck.run
        return None


@functools.cache
def _triton_info() -> _TritonInfo:
    return _TritonInfo()


class _Runtime:
    """Device/stream getters, resolved once the first launch shows a working CUDA driver."""

    def __init__(self) -> None:
        from triton.runtime.driver import driver

        drv = driver.active
        target = drv.get_current_target()
        if getattr(target, "backend", None) != "cuda":
            raise Unkeyable(f"driver backend {getattr(target, 'backend', None)!r} is not 'cuda'")
        import torch

        get_device = drv.get_current_device
        get_stream = drv.get_current_stream
        # The driver's getters are torch.cuda.current_device (a Python wrapper around _cuda_getDevice)
        # and _cuda_getCurrentRawStream. Use the C functions only when the driver still uses those.
        if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
            get_device = torch._C._cuda_getDevice
        self.get_device: Callable[[], int] = get_device
        self.get_stream: Callable[[int], int] = get_stream


_runtime_lock = threading.Lock()
_runtime: _Runtime | None = None
_runtime_problem: str | None = None


def _get_runtime() -> _Runtime | None:
    """The CUDA runtime getters, or ``None`` (then ``_runtime_problem`` says why, if it is permanent).

    A driver error (no GPU, no CUDA) is not cached: Triton's own path raises the real error to the caller,
    and a later call tries again.
    """
    global _runtime, _runtime_problem
    if _runtime is None and _runtime_problem is None:
        with _runtime_lock:
            if _runtime is None and _runtime_problem is None:
                try:
                    _runtime = _Runtime()
                except Unkeyable as exc:
                    _runtime_problem = exc.reason
                except Exception:
                    return None
    return _runtime


# ---------------------------------------------------------------------------------------------------------
# Keyers
# ---------------------------------------------------------------------------------------------------------


class Keyer(Protocol):
    """The per-call key builder + table a :class:`TritonKernel` uses (swap it with ``bind(fn, keyer=...)``).

    ``args`` is ``(ctx, *params)``: ``ctx`` a tuple of keyable leaves the launcher computes per call
    (current device index, knob state, sorted launch options), then every kernel parameter in signature
    order with defaults applied. ``lookup(args)`` returns the stored entry, or ``MISS``; it raises
    :class:`Unkeyable` or a :class:`jitkey.errors.JitKeyError` (e.g. ``ArgumentError``) for arguments
    outside its rules, which sends the call to Triton's own path. ``key(args)`` returns the key's
    canonical bytes (for tests). The key must be a function of ``ctx`` and the parameters' buckets only,
    and at least as fine as Triton's specialization: ``tests/test_triton_cpu.py`` checks every available
    keyer against Triton's own binder.
    """

    name: str

    @property
    def MISS(self) -> object:  # the sentinel ``lookup`` returns on a miss
        ...

    @property
    def lookup(self) -> Callable[[tuple[Any, ...]], Any]: ...

    def insert(self, args: tuple[Any, ...], entry: Any) -> None: ...
    def key(self, args: tuple[Any, ...]) -> bytes: ...
    def stats(self) -> dict[str, int]: ...
    def __len__(self) -> int: ...


# Per-parameter modes (from Triton's KernelParam flags).
_FULL, _NO_ALIGN, _NO_SPEC, _CONSTEXPR = 0, 1, 2, 3

_I32_LO, _I32_HI = -(2**31), 2**31 - 1
_I64_LO, _I64_HI = -(2**63), 2**63 - 1
_U64_HI = 2**64 - 1


def _int_bucket(x: int, mode: int) -> int:
    """Triton's int specialization as a small code: range class, then ``== 1`` / ``% 16`` per the mode."""
    if _I32_LO <= x <= _I32_HI:
        base = 0
    elif _I64_LO <= x <= _I64_HI:
        base = 10
    elif 0 < x <= _U64_HI:
        base = 20
    else:
        # Triton raises OverflowError at binding; the launcher's "K" format would silently truncate.
        raise Unkeyable("int outside the i64/u64 range")
    if mode == _NO_SPEC:
        return base
    if x == 1:
        return base + 1
    if mode == _FULL and x & 15 == 0:
        return base + 2
    return base + 3


def _constexpr_key(v: Any) -> Any:
    """A keyable, type-tagged form of a constexpr value (jitkey's encoding already tags builtin leaves).

    Every tuple produced here starts with a wrapper tag, so wrapped and plain values cannot collide.
    """
    t = type(v)
    if t is int or t is bool or t is float or t is str or v is None or t is bytes:
        return v
    if t is tuple:
        return ("tuple", *(_constexpr_key(e) for e in v))
    return _object_key(v)


@functools.cache
def _triton_types() -> dict[str, Any]:
    import torch
    import triton.language as tl
    from triton.runtime.jit import JITCallable

    return {
        "Tensor": torch.Tensor,
        "dtype": torch.dtype,
        "tl_constexpr": tl.constexpr,
        "tl_dtype": tl.dtype,
        "JITCallable": JITCallable,
    }


def _object_key(v: Any) -> Any:
    ty = _triton_types()
    t = type(v)
    if t is ty["dtype"]:
        return v
    if t is ty["tl_constexpr"]:
        return ("tl.constexpr", _constexpr_key(v.value))
    if t is ty["tl_dtype"]:
        return ("tl.dtype", v.name)
    if isinstance(v, ty["JITCallable"]):
        # Triton keys a JITCallable by its cache_key (source + dependencies), so an edited source misses.
        return ("jit", type(v).__qualname__, v.cache_key)
    if hasattr(t, "_fields") and isinstance(v, tuple):  # namedtuple: Triton rebuilds it with its type
        return ("namedtuple", t.__module__, t.__qualname__, *(_constexpr_key(e) for e in v))
    raise Unkeyable(f"constexpr value of type {t.__module__}.{t.__qualname__}")


def _arg_key(x: Any, mode: int) -> tuple[Any, Any]:
    """(kind, attr) for a non-constexpr argument of any supported type; mirrors ``native_specialize_impl``."""
    t = type(x)
    ty = _triton_types()
    if isinstance(x, ty["Tensor"]):
        return x.dtype, (None if mode != _FULL else x.data_ptr() & 15 == 0)
    if t is bool:
        return "u1", None
    if t is int:
        return "int", _int_bucket(x, mode)
    if t is float:
        return "fp", None
    if x is None:
        return "none", None
    if t is tuple or (isinstance(x, tuple) and hasattr(t, "_fields")):
        # Triton specializes tuple members fully (value and alignment) whatever the parameter's flags.
        tag = "tuple" if t is tuple else ("namedtuple", t.__module__, t.__qualname__)
        return tag, tuple(_arg_key(e, _FULL) for e in x)
    if t is ty["tl_constexpr"] or t is ty["tl_dtype"] or isinstance(x, ty["JITCallable"]):
        return "constexpr", _object_key(x)
    raise Unkeyable(f"argument of type {t.__module__}.{t.__qualname__}")


class PythonKeyer:
    """Pure-Python keyer over :class:`jitkey.LruCache` (generated, unrolled per kernel like Triton's binder).

    Key layout: ``(ctx, k0, a0, k1, a1, ...)`` with two slots per non-constexpr parameter (``kind``,
    ``attr``) and one per constexpr parameter. Tensors give ``(dtype, aligned)`` (``aligned`` is ``None``
    when the parameter is not specialized on alignment); ints ``("int", code)``; floats ``("fp", None)``;
    bools ``("u1", None)``; ``None`` ``("none", None)``. Kinds are distinct leaf types or strings, so
    positions never shift and the key is injective over the buckets.
    """

    name = "python"
    MISS = None

    def __init__(self, modes: list[int], capacity: int = 4096) -> None:
        self.modes = list(modes)
        self.cache = LruCache(capacity)
        self.build, self.lookup = self._generate(self.modes, self.cache)

    @staticmethod
    def _generate(modes: list[int], cache: LruCache) -> tuple[Callable[..., Any], Callable[..., Any]]:
        import torch

        lines = []
        out = ["p[0]"]
        for i, mode in enumerate(modes):
            x = f"x{i}"
            lines.append(f"    {x} = p[{i + 1}]")
            if mode == _CONSTEXPR:
                lines.append(f"    t = type({x})")
                lines.append(
                    f"    k{i} = {x} if (t is int or t is bool or t is float or t is str or {x} is None) "
                    f"else _constexpr_key({x})"
                )
                out.append(f"k{i}")
                continue
            lines.append(f"    t = type({x})")
            if mode == _FULL:
                lines.append(f"    if t is _Tensor: k{i} = {x}.dtype; a{i} = {x}.data_ptr() & 15 == 0")
            else:
                lines.append(f"    if t is _Tensor: k{i} = {x}.dtype; a{i} = None")
            if mode == _FULL:  # the common i32 case inline, the rest in _int_bucket
                lines.append(
                    f"    elif t is int: k{i} = 'int'; a{i} = (1 if {x} == 1 else 2 if not {x} & 15 else 3) "
                    f"if -2147483648 <= {x} <= 2147483647 else _int_bucket({x}, {mode})"
                )
            else:
                lines.append(f"    elif t is int: k{i} = 'int'; a{i} = _int_bucket({x}, {mode})")
            lines.append(f"    elif t is float: k{i} = 'fp'; a{i} = None")
            lines.append(f"    elif t is bool: k{i} = 'u1'; a{i} = None")
            lines.append(f"    elif {x} is None: k{i} = 'none'; a{i} = None")
            lines.append(f"    else: k{i}, a{i} = _arg_key({x}, {mode})")
            out += [f"k{i}", f"a{i}"]
        body = "\n".join(lines)
        src = f"def build(p):\n{body}\n    return ({', '.join(out)},)\n"
        src += f"def lookup(p):\n{body}\n    return _get(({', '.join(out)},))\n"
        ns: dict[str, Any] = {
            "_Tensor": torch.Tensor,
            "_int_bucket": _int_bucket,
            "_arg_key": _arg_key,
            "_constexpr_key": _constexpr_key,
            "_get": cache.get,
        }
        exec(src, ns)
        return ns["build"], ns["lookup"]

    def key(self, args: tuple[Any, ...]) -> bytes:
        return encode(self.build(args))

    def insert(self, args: tuple[Any, ...], entry: Any) -> None:
        self.cache[self.build(args)] = entry

    def stats(self) -> dict[str, int]:
        return self.cache.stats()

    def __len__(self) -> int:
        return len(self.cache)


class NativeKeyer:
    """Keyer over the native ``jitkey.Signature`` with ``jitkey.rules.triton(jit_fn)``.

    The signature is ``[("ctx", rules.any_()), *rules.triton(jit_fn)]``; one native call per launch encodes
    the arguments with the compiled plan, hashes and probes the :class:`jitkey.LruCache`.
    """

    name = "native"
    #: :class:`TritonKernel` launches through ``jitkey._core._TritonLauncher`` (the whole hit path in one
    #: native call) with this keyer, rather than through the generated Python launcher.
    native_launch = True

    def __init__(self, jit_fn: Any, capacity: int = 4096) -> None:
        import jitkey
        from jitkey import rules

        self.MISS = jitkey.MISS
        self.sig = jitkey.Signature([("_jk_ctx", rules.any_()), *rules.triton(jit_fn)])
        # The parameters alone, for the native launcher (it encodes the call context itself). Its
        # header differs from ``sig``'s, so both kinds of entries can share one cache without colliding.
        self.params_sig = jitkey.Signature(rules.triton(jit_fn))
        self.cache = LruCache(capacity)
        self.lookup = functools.partial(self.sig.lookup, self.cache)

    def key(self, args: tuple[Any, ...]) -> bytes:
        return bytes(self.sig.encode(args))

    def insert(self, args: tuple[Any, ...], entry: Any) -> None:
        self.sig.insert(self.cache, args, entry)

    def stats(self) -> dict[str, int]:
        return self.cache.stats()

    def __len__(self) -> int:
        return len(self.cache)


def native_available() -> bool:
    """Whether this jitkey build has the native ``Signature`` + ``rules.triton``."""
    try:
        import jitkey
        from jitkey import rules
    except ImportError:
        return False
    return all(hasattr(jitkey, n) for n in ("Signature", "MISS")) and hasattr(rules, "triton")


KeyerFactory = Callable[[Any, list[int]], Keyer]
"""``factory(jit_fn, modes) -> Keyer``; ``modes[i]`` is one of the ``_FULL/_NO_ALIGN/_NO_SPEC/_CONSTEXPR``."""


def python_keyer(jit_fn: Any, modes: list[int]) -> Keyer:
    """Factory of :class:`PythonKeyer` (pass as ``bind(fn, keyer=python_keyer)``)."""
    return PythonKeyer(modes)


def native_keyer(jit_fn: Any, modes: list[int]) -> Keyer:
    """Factory of :class:`NativeKeyer` (needs :func:`native_available`)."""
    return NativeKeyer(jit_fn)


def auto_keyer(jit_fn: Any, modes: list[int]) -> Keyer:
    """The native keyer where this build has it, else the Python one."""
    if native_available():
        return native_keyer(jit_fn, modes)
    return python_keyer(jit_fn, modes)


_default_keyer: KeyerFactory = auto_keyer


def set_default_keyer(factory: KeyerFactory | None) -> None:
    """Set the keyer factory :func:`bind` uses when none is given (``None`` restores :func:`auto_keyer`)."""
    global _default_keyer
    _default_keyer = factory or auto_keyer


def _param_modes(jit_fn: Any) -> list[int]:
    modes = []
    for p in jit_fn.params:
        if p.is_constexpr:
            modes.append(_CONSTEXPR)
        elif p.do_not_specialize:
            modes.append(_NO_SPEC)
        elif p.do_not_specialize_on_alignment:
            modes.append(_NO_ALIGN)
        else:
            modes.append(_FULL)
    return modes


# ---------------------------------------------------------------------------------------------------------
# The bound kernel
# ---------------------------------------------------------------------------------------------------------


class TritonKernel(_KernelBase):
    """A Triton kernel whose warm launches skip Triton's Python dispatch (see the module docstring).

    ``kernel[grid]`` is implemented in C (``jitkey._core._KernelBase``) once the native launcher is
    built: it returns a builtin function bound to ``(launcher, grid)``, so the subscript and the call
    run no Python frame of jitkey's. Until then, and with other keyers, it is :meth:`_subscript`.
    """

    def __init__(self, fn: Any, *, keyer: KeyerFactory | None = None) -> None:
        self.fn = fn  # like triton's Autotuner/Heuristics wrappers: .fn is the wrapped kernel interface
        self._fallbacks: Counter[str] = Counter()
        self._ugv_src: object = None
        self._ugv_snap: list[list[Any]] = []
        self._lock = threading.Lock()
        self._launch: Callable[..., Any] | None = None
        self._key_launcher: Any = None  # the native keyer's key-only launcher (key_of)
        self.keyer: Keyer | None = None
        # The list add_pre_run_hook appends to; checked per call (the launcher re-checks the attribute too).
        self._pre_run_hooks: list[Any] | None = getattr(fn, "pre_run_hooks", None)
        self.fast_path_problem: str | None = self._check_static(fn)
        if self.fast_path_problem is None:
            self.keyer = (keyer or _default_keyer)(fn, _param_modes(fn))

    # -- static checks ---------------------------------------------------------------------------------
    @staticmethod
    def _check_static(fn: Any) -> str | None:
        info = _triton_info()
        if info.problem is not None:
            return info.problem
        if type(fn) is not info.JITFunction:
            return f"{type(fn).__name__} is not a plain triton JITFunction"
        if type(fn).run is not info.JITFunction.run:
            return "JITFunction.run is patched"
        try:
            params = list(fn.signature.parameters.values())
        except AttributeError:
            return "JITFunction has no signature"
        if len(params) != len(fn.params):
            return "JITFunction.params does not match its signature"
        for p in params:
            if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
                return f"parameter {p.name!r} is not positional-or-keyword"
            if p.name.startswith(_PREFIX):
                return f"parameter {p.name!r} uses jitkey's reserved prefix {_PREFIX!r}"
        return None

    # -- public API ------------------------------------------------------------------------------------
    def _subscript(self, grid: Any) -> Callable[..., Any]:
        """``self[grid]`` while no native launcher is set (see the class docstring)."""
        launch = self._launch
        if launch is None:
            launch = self._make_launch()
        if self._pre_run_hooks:
            # Triton's own path, with the caller's exact args/kwargs for the hooks.
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._slow_entry(grid, args, kwargs, "pre_run_hooks")

            return call
        # A C-level partial, not a Python closure: calling it costs no extra Python frame and no
        # repacking of *args/**kwargs (measured: -0.35 us per launch on the CPU host path). Hooks
        # added after this point are still seen: the launcher re-checks `pre_run_hooks` per call.
        return functools.partial(launch, grid)

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        """``JITFunction.run``: ``warmup=False`` is a (fast-path) launch; ``warmup=True`` goes to Triton."""
        if warmup:
            return self.fn.run(*args, grid=grid, warmup=True, **kwargs)
        return self[grid](*args, **kwargs)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        """Triton's ``warmup`` (compiles without launching; accepts ``torch.dtype`` for tensors)."""
        return self.fn.warmup(*args, grid=grid, **kwargs)

    def cache_stats(self) -> dict[str, Any]:
        """``hits``, ``misses``, ``entries``, ``fallbacks`` (total) and ``fallback_reasons`` ({reason: n})."""
        ks = self.keyer.stats() if self.keyer is not None else {}
        reasons = dict(self._fallbacks)
        return {
            "hits": int(ks.get("hits", 0)),
            "misses": int(ks.get("misses", 0)),
            "entries": len(self.keyer) if self.keyer is not None else 0,
            "fallbacks": sum(reasons.values()),
            "fallback_reasons": reasons,
            "keyer": self.keyer.name if self.keyer is not None else None,
            "fast_path_problem": self.fast_path_problem,
        }

    def key_of(self, args: Iterable[Any], kwargs: dict[str, Any] | None = None, *, device: int) -> bytes:
        """The key bytes a call with ``args``/``kwargs`` on ``device`` would use (raises like a lookup).

        For tests and debugging: no lookup, no launch, no GPU needed.
        """
        if self.keyer is None:
            raise Unkeyable(self.fast_path_problem or "no keyer")
        if getattr(self.keyer, "native_launch", False):
            self._ctx(device, {})  # the same refusals as a launch (stages inspection hook)
            if self._key_launcher is None:  # built once: key_of is for tests and debugging, not a hot path
                self._key_launcher = self._native_launcher(None)
            return bytes(self._key_launcher.key(tuple(args), dict(kwargs or {}), device))
        params, opts = self._bind_args(tuple(args), dict(kwargs or {}))
        return self.keyer.key((self._ctx(device, opts), *params))

    def __getattr__(self, name: str) -> Any:
        # Everything else (arg_names, params, signature, device_caches, add_pre_run_hook, ...) is the
        # wrapped JITFunction's.
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return f"jitkey.triton.TritonKernel({self.fn!r})"

    # -- internals -------------------------------------------------------------------------------------
    def _bind_args(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        sig = self.fn.signature
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        bound.apply_defaults()
        missing = [n for n in sig.parameters if n not in bound.arguments]
        if missing:
            raise TypeError(f"missing required argument(s): {', '.join(missing)}")
        opts = {k: v for k, v in kwargs.items() if k not in sig.parameters}
        return tuple(bound.arguments[n] for n in sig.parameters), opts

    def _knob_state(self) -> tuple[Any, ...]:
        info = _triton_info()
        knobs = info.knobs
        state: list[Any] = [self.fn.debug, knobs.runtime.debug]
        for _name, section, attr in info.knob_reads:
            state.append(getattr(getattr(knobs, section), attr))
        return tuple(state)

    def _ctx(self, device: int, opts: dict[str, Any]) -> tuple[Any, ...]:
        if (
            _triton_info().checks_stages_hook
            and getattr(_triton_info().knobs.runtime, "add_stages_inspection_hook", None) is not None
        ):
            raise Unkeyable("knobs.runtime.add_stages_inspection_hook is set")
        return (device, self._knob_state(), tuple(sorted(opts.items())) if opts else ())

    def _fallback(self, reason: str, grid: Any, params: tuple[Any, ...], opts: dict[str, Any]) -> Any:
        self._fallbacks[reason] += 1
        return self.fn.run(*params, grid=grid, warmup=False, **opts)

    def _slow_entry(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str) -> Any:
        self._fallbacks[reason] += 1
        return self.fn.run(*args, grid=grid, warmup=False, **kwargs)

    def _miss(self, args: tuple[Any, ...], grid: Any, opts: dict[str, Any]) -> Any:
        # Triton binds, compiles if needed and launches exactly as fn[grid](...) would, and returns the
        # CompiledKernel it chose for this specialization.
        params = args[1:]
        ck, entry = self._compile_and_launch(grid, params, opts)
        if entry is not None:
            assert self.keyer is not None
            self.keyer.insert(args, entry)
        return ck

    def _compile_and_launch(
        self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], native: bool = False
    ) -> tuple[Any, Any]:
        """A miss: Triton runs the call; returns (what Triton returned, the entry to store or None)."""
        ck = self.fn.run(*args, grid=grid, warmup=False, **kwargs)
        if ck is None:  # a knobs.runtime.jit_cache_hook vetoed the compile (Triton launched nothing)
            self._fallbacks["jit_cache_hook vetoed the compile"] += 1
            return None, None
        if hasattr(ck, "result"):  # async compile future
            ck = ck.result()
        try:
            if hasattr(ck, "_init_handles"):
                ck._init_handles()
            run, function, pm = ck.run, ck.function, ck.packed_metadata
            ck.launch_metadata  # noqa: B018 - must exist for the hook path
        except AttributeError as exc:
            self._fallbacks[f"CompiledKernel lacks {exc.name or exc}"] += 1
            return ck, None
        if function is None:
            self._fallbacks["CompiledKernel.function is None after _init_handles"] += 1
            return ck, None
        if not native:
            return ck, (ck, run, function, pm)
        from jitkey._core import _TritonEntry

        target, mid = _launch_target(run, pm)
        return ck, _TritonEntry(ck, target, function, mid)

    def _native_miss(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return self._compile_and_launch(grid, args, kwargs, native=True)

    def _native_fallback(self, reason: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(reason, BaseException):
            reason = reason.reason if isinstance(reason, Unkeyable) else f"{type(reason).__name__}: {reason}"
        return self._slow_entry(grid, args, kwargs, str(reason))

    def _native_launcher(self, rt: _Runtime | None) -> Any:
        """A ``jitkey._core._TritonLauncher`` over the native keyer's signature and cache (``rt=None``:
        for :meth:`key_of` only, it cannot launch)."""
        from jitkey._core import _TritonLauncher

        info = _triton_info()
        keyer = self.keyer
        assert isinstance(keyer, NativeKeyer) and keyer.native_launch
        return _TritonLauncher(
            keyer.params_sig,
            keyer.cache,
            self.fn,
            info.knobs.runtime,
            [(getattr(info.knobs, section), attr) for _name, section, attr in info.knob_reads],
            info.checks_stages_hook,
            rt.get_device if rt is not None else _no_runtime,
            rt.get_stream if rt is not None else _no_runtime,
            info.HookChain,
            self._native_miss,
            self._native_fallback,
            self._check_globals,
        )

    def _check_globals(self) -> None:
        """Triton's ``used_global_vals`` check; identity short-cut only for immutable builtin values."""
        ugv = self.fn.used_global_vals
        if ugv is not self._ugv_src:
            with self._lock:
                snap = []
                for (name, _), (val, gdict) in ugv.items():
                    cur = gdict.get(name, _MISSING)
                    imm = type(val) in (int, float, bool, str, bytes, type(None))
                    snap.append([gdict, name, val, cur, imm])
                self._ugv_snap, self._ugv_src = snap, ugv
        for item in self._ugv_snap:
            gdict, name, val, seen, imm = item
            cur = gdict.get(name, _MISSING)
            if imm and cur is seen:
                continue
            if cur != val:
                raise GlobalsChangedError(
                    f"Global variable {name} has changed since we compiled this kernel, from {val} to {cur}"
                )
            item[3] = cur

    def _make_launch(self) -> Callable[..., Any]:
        with self._lock:
            if self._launch is not None:
                return self._launch
            launch = self._generate_launch()
            self._launch = launch
            return launch

    def _generate_launch(self) -> Callable[..., Any]:
        fn = self.fn
        problem = self.fast_path_problem
        if problem is not None:
            reason = problem

            def slow(grid: Any, *args: Any, **kwargs: Any) -> Any:
                return self._slow_entry(grid, args, kwargs, reason)

            return slow
        rt = _get_runtime()
        if rt is None:
            reason = _runtime_problem or "no CUDA runtime"

            def no_rt(grid: Any, *args: Any, **kwargs: Any) -> Any:
                # Re-resolve next time (the driver may come up later); Triton raises the real error.
                self._launch = None
                return self._slow_entry(grid, args, kwargs, reason)

            return no_rt
        if getattr(self.keyer, "native_launch", False):
            launcher = self._native_launcher(rt)
            self._set_launcher(launcher)  # from now on, self[grid] is C
            launch_native: Callable[..., Any] = launcher.launch
            return launch_native
        info = _triton_info()
        assert self.keyer is not None
        names = list(fn.signature.parameters)
        sig_params = list(fn.signature.parameters.values())
        ns: dict[str, Any] = {
            "_jk_self": self,
            "_jk_fn": fn,
            "_jk_lookup": self.keyer.lookup,
            "_jk_MISS": self.keyer.MISS,
            "_jk_miss": self._miss,
            "_jk_fallback": self._fallback,
            "_jk_check_globals": self._check_globals,
            "_jk_get_device": rt.get_device,
            "_jk_get_stream": rt.get_stream,
            "_jk_rt": info.knobs.runtime,
            "_jk_HookChain": info.HookChain,
            "_jk_Unkeyable": Unkeyable,
            "_jk_JitKeyError": JitKeyError,
            "_jk_sorted": sorted,
        }
        arglist = []
        for p in sig_params:
            if p.default is inspect.Parameter.empty:
                arglist.append(p.name)
            else:
                ns[f"_jk_default_{p.name}"] = p.default
                arglist.append(f"{p.name}=_jk_default_{p.name}")
        params_tuple = "(" + "".join(f"{n}, " for n in names) + ")"
        knob_exprs = ["_jk_fn.debug", "_jk_rt.debug"]
        for i, (_name, section, attr) in enumerate(info.knob_reads):
            ns[f"_jk_knobs_{i}"] = getattr(info.knobs, section)
            knob_exprs.append(f"_jk_knobs_{i}.{attr}")
        knob_tuple = "(" + ", ".join(knob_exprs) + ",)"
        stages = (
            "    if _jk_rt.add_stages_inspection_hook is not None:\n"
            "        return _jk_fallback('knobs.runtime.add_stages_inspection_hook is set',\n"
            f"                            _jk_grid, {params_tuple}, _jk_opts)\n"
            if info.checks_stages_hook
            else ""
        )
        grid_dict = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
        call_args = ", ".join(names)
        src = f"""
def _jk_launch(_jk_grid, {", ".join([*arglist, "**_jk_opts"])}):
    if _jk_fn.pre_run_hooks:
        return _jk_fallback('pre_run_hooks', _jk_grid, {params_tuple}, _jk_opts)
{stages}    _jk_dev = _jk_get_device()
    _jk_a = ((_jk_dev, {knob_tuple}, tuple(_jk_sorted(_jk_opts.items())) if _jk_opts else ()), {call_args})
    try:
        _jk_e = _jk_lookup(_jk_a)
    except _jk_Unkeyable as _jk_exc:
        return _jk_fallback(_jk_exc.reason, _jk_grid, _jk_a[1:], _jk_opts)
    except _jk_JitKeyError as _jk_exc:
        return _jk_fallback(f"{{type(_jk_exc).__name__}}: {{_jk_exc}}", _jk_grid, _jk_a[1:], _jk_opts)
    if _jk_e is _jk_MISS:
        return _jk_miss(_jk_a, _jk_grid, _jk_opts)
    _jk_ck, _jk_run, _jk_function, _jk_pm = _jk_e
    if _jk_fn.used_global_vals:
        _jk_check_globals()
    if type(_jk_grid) is not tuple and callable(_jk_grid):
        _jk_grid = _jk_grid({grid_dict})
    _jk_n = len(_jk_grid)
    _jk_s = _jk_get_stream(_jk_dev)
    _jk_enter = _jk_rt.launch_enter_hook
    _jk_exit = _jk_rt.launch_exit_hook
    if (_jk_enter is None or (type(_jk_enter) is _jk_HookChain and not _jk_enter.calls)) and (
        _jk_exit is None or (type(_jk_exit) is _jk_HookChain and not _jk_exit.calls)
    ):
        _jk_run(_jk_grid[0], _jk_grid[1] if _jk_n > 1 else 1, _jk_grid[2] if _jk_n > 2 else 1, _jk_s,
                _jk_function, _jk_pm, None, None, None, {call_args})
    else:
        _jk_run(_jk_grid[0], _jk_grid[1] if _jk_n > 1 else 1, _jk_grid[2] if _jk_n > 2 else 1, _jk_s,
                _jk_function, _jk_pm, _jk_ck.launch_metadata(_jk_grid, _jk_s, {call_args}),
                _jk_enter, _jk_exit, {call_args})
    return _jk_ck
"""
        exec(src, ns)
        launch: Callable[..., Any] = ns["_jk_launch"]
        return launch


def _no_runtime(*_args: Any) -> Any:
    raise RuntimeError("jitkey.triton: this launcher only builds keys")


def _launch_target(run: Any, packed_metadata: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(target, mid)`` for a hit: ``target(gx, gy, gz, stream, function, *mid, md, enter, exit, *args)``.

    ``ck.run`` with ``mid = (packed_metadata,)``; or, when ``ck.run`` is a ``CudaLauncher`` whose
    ``__call__`` is code jitkey knows to only forward (see ``_FORWARDING_CALLS``) and the kernel needs no
    scratch buffer, the launcher's own ``launch`` with the arguments that ``__call__`` would insert.
    """
    call = _triton_info().launcher_call
    if call is not None and type(run).__call__ is call:
        try:
            sizes = (run.global_scratch_size, run.profile_scratch_size)
            if all(type(x) is int and x <= 0 for x in sizes):
                return run.launch, (run.launch_cooperative_grid, run.launch_pdl, None, None, packed_metadata)
        except AttributeError:
            pass
    return run, (packed_metadata,)


def bind(fn: Any, *, keyer: KeyerFactory | None = None) -> TritonKernel:
    """Wrap a ``triton.jit`` kernel (or any Triton kernel interface) in a :class:`TritonKernel`.

    A plain ``JITFunction`` gets the fast path; anything else (``Autotuner``, ``Heuristics``, an
    ``InterpretedFunction`` under ``TRITON_INTERPRET=1``) is launched through Triton's own path and counted
    as a fallback. ``keyer`` is a ``factory(jit_fn, modes) -> Keyer`` (default: :func:`set_default_keyer`).
    """
    if isinstance(fn, TritonKernel):
        return fn
    return TritonKernel(fn, keyer=keyer)


def jit(fn: Any = None, **kwargs: Any) -> Any:
    """``triton.jit`` with the same arguments, returning a :class:`TritonKernel`."""
    import triton

    if fn is None:
        return lambda f: bind(triton.jit(f, **kwargs))
    return bind(triton.jit(fn, **kwargs))


# Persistent autotuning (issue #8) lives in its own module; re-exported here as jitkey.triton.autotune.
from jitkey.triton_autotune import PersistentAutotuner, autotune  # noqa: E402
