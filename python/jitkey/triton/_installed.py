"""What ``jitkey.triton`` reads from the installed Triton: its per-call knob reads, its launcher (and the launch plan
built from it) and the CUDA runtime getters. Imported at a kernel's first launch or inspection, not at decoration.

Everything here is feature detection, done once per process (the source reads once per installation), against
the release table ``jitkey._triton_table``: anything that does not look exactly like the Triton code this package
was written against turns the fast path off (every launch then goes through Triton's own ``JITFunction.run``,
counted with the reason) rather than guessing.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import re
import threading
import types
from collections.abc import Callable
from typing import Any

from jitkey import _triton_table
from jitkey._core import _LaunchPlan
from jitkey.errors import Unkeyable
from jitkey.triton import _installation


class TritonInfo:
    """What this package needs from the installed Triton, or why it cannot have it (``problem``).

    What is read from Triton's source (``inspect``: the knob reads of ``JITFunction.run``, the launcher's code)
    is computed once per installation: :func:`jitkey.triton._installation.memo` keeps it under the identity of
    the code it read, so a fresh process reads it back, and code patched at run time is inspected again.
    """

    def __init__(self) -> None:
        import triton
        from triton import knobs
        from triton.runtime.jit import JITFunction

        self.version = str(getattr(triton, "__version__", "?"))
        self.JITFunction = JITFunction
        #: ``JITFunction.run`` as it was when it was inspected; a later patch of it turns the fast path off.
        self.run = JITFunction.run
        self.knobs = knobs
        self.HookChain: type | None = getattr(knobs, "HookChain", None)
        #: The names ``JITFunction.run`` takes for itself (``grid``, ``warmup``): a keyword argument of a launch
        #: with one of these names is never bound to a kernel parameter (Triton raises or consumes it), so such
        #: a call always takes Triton's own path.
        self.run_keywords: tuple[str, ...] = tuple(
            p.name
            for p in inspect.signature(JITFunction.run).parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and p.name != "self"
        )
        facts = _installation.memo(
            FACTS_MEMO, _inspected_identity(self.version), lambda: _inspect(self.version)
        )
        self.problem: str | None = facts["problem"]
        self.knob_reads: list[tuple[str, str, str]] = [(n, s, a) for n, s, a in facts["knob_reads"]]
        self.checks_stages_hook: bool = facts["checks_stages_hook"]
        #: Why hits never pack and launch a kernel themselves (``None``: they do, see ``launch_plan``).
        self.driver_launch_problem: str | None = facts["driver_launch_problem"]
        #: The launcher code jitkey's launch plans mirror (``jitkey._triton_table.LAUNCHER_CODE``: "3.6" or "3.9"), and
        #: ``CudaLauncher.__call__`` as inspected with it (a launcher whose ``__call__`` is another gets no plan).
        self.launch_dialect: str | None = facts["launch_dialect"]
        self.plan_call: Callable[..., Any] | None = None
        if self.launch_dialect is not None:
            from triton.backends.nvidia.driver import CudaLauncher

            self.plan_call = CudaLauncher.__dict__["__call__"]
        if self.problem is None and os.environ.get("JITKEY_DRIVER_LAUNCH", "").strip() == "0":
            self.launch_dialect, self.plan_call, self.driver_launch_problem = (
                None,
                None,
                "JITKEY_DRIVER_LAUNCH=0",
            )


#: The per-installation memo of :func:`_inspect`'s facts; "/2": they no longer hold the fields of the removed direct
#: launch (another jitkey sharing the index reads and writes its own record).
FACTS_MEMO = "triton_info/2"


def _inspect(version: str) -> dict[str, Any]:
    """Everything :class:`TritonInfo` reads from Triton's source (JSON-able, for the per-installation memo)."""
    from triton.runtime.jit import JITFunction

    facts: dict[str, Any] = {
        "problem": None,
        "knob_reads": [],
        "checks_stages_hook": False,
        "launch_dialect": None,
        "driver_launch_problem": "not inspected",
    }
    try:
        src = inspect.getsource(JITFunction.run)
    except Exception as exc:  # no source: never fast-path
        facts["problem"] = f"cannot read JITFunction.run ({type(exc).__name__}: {exc})"
        return facts
    facts["problem"], facts["knob_reads"], facts["checks_stages_hook"] = _scan_run(src, version)
    facts["launch_dialect"], facts["driver_launch_problem"] = _launcher_code(version)
    return facts


def _inspected_identity(version: str) -> bytes:
    """The identity of everything :func:`_inspect` reads (see ``_installation.code_identity``)."""
    from triton.runtime.jit import JITFunction

    objs: list[Any] = [version, JITFunction.run]
    files: list[str] = []
    try:
        from triton.backends.nvidia import driver as nv

        objs += [nv.CudaLauncher, *_launcher_code_parts(nv)]
        if not hasattr(nv, "make_launcher"):
            files.append(os.path.join(nv.dirname, "driver.c"))
    except Exception as exc:  # no nvidia backend: the inspection records why
        objs.append(f"{type(exc).__name__}: {exc}")
    return _installation.code_identity(objs, files)


def _scan_run(src: str, version: str) -> tuple[str | None, list[tuple[str, str, str]], bool]:
    """Read ``JITFunction.run``'s per-call knob reads: ``(problem, knob_reads, checks_stages_hook)``; anything
    unexpected is a problem (the fast path is off)."""
    knob_reads: list[tuple[str, str, str]] = []  # (kwarg name, knobs section, attribute)

    def fail(why: str) -> tuple[str | None, list[tuple[str, str, str]], bool]:
        return f"triton {version}: {why}", [], False

    for name, rhs in re.findall(r"kwargs\[\s*[\"'](\w+)[\"']\s*\]\s*=\s*(.+)", src):
        rhs = rhs.strip()
        if name == "debug":
            if rhs != _triton_table.RUN_DEBUG_RULE:
                return fail(f"unexpected debug rule in JITFunction.run: {rhs}")
            continue
        m = re.fullmatch(r"knobs\.(\w+)\.(\w+)", rhs)
        if m is None:
            return fail(f"JITFunction.run sets kwargs[{name!r}] = {rhs} (unknown rule)")
        knob_reads.append((name, m.group(1), m.group(2)))
    known = _triton_table.RUN_KNOBS | {(s, a) for _, s, a in knob_reads}
    for ref in sorted(set(re.findall(r"knobs\.(\w+)\.(\w+)", src)) - known):
        return fail(f"JITFunction.run reads knobs.{ref[0]}.{ref[1]} (unknown to jitkey)")
    for fragments, why in _triton_table.RUN_NEEDS:
        if not all(f in src for f in fragments):
            return fail(why)
    return None, knob_reads, "add_stages_inspection_hook" in src


def _normalized_source(f: Any) -> str:
    lines = (ln.strip() for ln in inspect.getsource(f).splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("#"))


def launcher_code_digest() -> str:
    """The digest of the installed nvidia backend's launcher code (see ``jitkey._triton_table.LAUNCHER_CODE``).

    Triton 3.6 generates a C launcher per signature: ``ty_to_cpp``, ``make_launcher`` and its tables, the
    ``CudaLauncher`` class. Triton 3.9 calls one generic ``launch`` of the backend's ``driver.c``: the Python
    that builds its arguments (``CudaLauncher``, ``expand_signature``, ``annotate_arguments``,
    ``make_kernel_signature``, the tensor-descriptor wrapper) and the bytes of ``driver.c`` itself (what
    ``CudaUtils`` compiles: the extractors and ``_launch``).
    """
    from triton.backends.nvidia import driver as nv

    parts = [x if isinstance(x, str) else _normalized_source(x) for x in _launcher_code_parts(nv)]
    parts.insert(-1 if hasattr(nv, "make_launcher") else len(parts), _normalized_source(nv.CudaLauncher))
    if not hasattr(nv, "make_launcher"):
        with open(os.path.join(nv.dirname, "driver.c"), "rb") as f:
            parts += [hashlib.sha256(f.read()).hexdigest()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _launcher_code_parts(nv: Any) -> list[Any]:
    """The functions (and, under 3.6, the tables as one ``repr`` string) :func:`launcher_code_digest` reads
    besides ``CudaLauncher``."""
    if hasattr(nv, "make_launcher"):
        tables = "\n".join(
            repr(x) for x in (nv.FLOAT_STORAGE_TYPE, nv.FLOAT_PACK_FUNCTION, nv._BASE_ARGS_FORMAT)
        )
        return [nv.ty_to_cpp, nv.make_launcher, nv.wrap_handle_tensordesc, tables]
    from triton.backends import driver as base

    helpers = (nv.make_kernel_signature, nv.annotate_arguments, nv.wrap_handle_tensordesc)
    return [*helpers, base.expand_signature, base.wrap_handle_tensordesc_impl]


def _own_method(cls: type, name: str) -> Any:
    """``cls.<name>`` when it is the function written in ``cls``'s own source (not patched or wrapped since)."""
    f = cls.__dict__.get(name)
    code = getattr(f, "__code__", None)
    if code is None:
        return None
    lines, first = inspect.getsourcelines(cls)
    src = inspect.getsourcefile(cls)
    if src is None or os.path.realpath(code.co_filename) != os.path.realpath(src):
        return None
    return f if first <= code.co_firstlineno < first + len(lines) else None


def _launcher_code(version: str) -> tuple[str | None, str | None]:
    """``(dialect, None)`` when the installed launcher is code jitkey's plans mirror and ``CudaLauncher.__call__``
    is its own, else ``(None, why not)`` (from the source: see :class:`TritonInfo`)."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        digest = launcher_code_digest()
        call = _own_method(CudaLauncher, "__call__")
    except Exception as exc:  # no nvidia backend, no source
        return None, f"no readable CUDA launcher code ({type(exc).__name__}: {exc})"
    dialect = _triton_table.LAUNCHER_CODE.get(digest)
    if dialect is None:
        return (
            None,
            f"triton {version}: the CUDA launcher's code is not one jitkey mirrors (hits use Triton's launcher)",
        )
    if call is None:
        return None, f"triton {version}: CudaLauncher.__call__ is not its own code (patched or wrapped)"
    return dialect, None


@functools.cache
def triton_info() -> TritonInfo:
    return TritonInfo()


def launch_plan(ck: Any, run: Any, nparams: int) -> tuple[_LaunchPlan | None, str | None]:
    """``(plan, None)`` when hits may pack and launch ``ck`` themselves, else ``(None, why not)``.

    Only for a ``CudaLauncher`` built from launcher code jitkey mirrors (see ``jitkey._triton_table.LAUNCHER_CODE``),
    whose launch is Triton's own C function, unwrapped (tensor descriptors wrap it), and whose signature has
    one type per kernel parameter, each a type the plan packs. Under Triton 3.9 also not for a kernel
    instrumented by GSan (its launcher adds arguments of its own).
    """
    info = triton_info()
    dialect = info.launch_dialect
    if info.driver_launch_problem is not None or dialect is None:
        return None, info.driver_launch_problem
    lazy = type(run) is LazyLauncher36 and dialect == "3.6"
    if type(run).__call__ is not info.plan_call and not lazy:
        return None, "ck.run is not the CUDA launcher jitkey knows"
    try:
        sig = ck.src.signature
        if type(sig) is not dict or len(sig) != nparams:
            return None, "the compiled kernel's signature does not match the kernel's parameters"
        from triton.runtime import _allocation

        profile_allocator: Any = _allocation._profile_allocator
        if dialect == "3.9":
            from triton.backends.nvidia import driver as nv

            if run.gsan_enabled:
                return None, "GSan instruments this kernel (Triton's launcher adds its own arguments)"
            utils = getattr(nv.CudaUtils, "instance", None)
            if utils is None or run.launch is not utils.launch:
                return None, "Triton's launcher wraps this kernel's launch (tensor descriptors)"
            if run.kernel_signature != nv.make_kernel_signature(list(sig.values())):
                return None, "Triton's launcher packs another signature than the compiled kernel's"
            profile_allocator = _ProfileScratch39()
        elif lazy:
            if LazyLauncher36.wraps(sig):
                return None, "Triton's launcher wraps this kernel's launch (tensor descriptors)"
        elif type(run.launch) is not types.BuiltinFunctionType:
            return None, "Triton's launcher wraps this kernel's launch (tensor descriptors)"

        def scratch(size: Any, align: Any, allocator: Any) -> tuple[int, int, Any] | None:
            return (size, align, allocator) if size > 0 else None

        plan = _LaunchPlan(
            dialect,
            ck.function,
            tuple(ck.packed_metadata),
            tuple(sig.values()),
            bool(run.launch_cooperative_grid),
            bool(run.launch_pdl),
            run.num_ctas,
            scratch(run.global_scratch_size, run.global_scratch_align, _allocation._allocator),
            scratch(run.profile_scratch_size, run.profile_scratch_align, profile_allocator),
        )
    except (AttributeError, TypeError, ValueError, OverflowError, RuntimeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return plan, None


class LazyLauncher36:
    """Triton 3.6's ``CudaLauncher`` of a compiled kernel that jitkey launches itself (a kernel its disk index
    gave, see ``jitkey.triton._l2``): the fields ``CudaLauncher.__init__`` sets from the metadata, for the
    launch plan, and the C launcher (generated, compiled or loaded from Triton's cache, imported) built only
    at the first call that needs it: a launch the plan declines, Triton's own path, ``ck[grid]``."""

    __slots__ = (
        "_ck",
        "_real",
        "global_scratch_align",
        "global_scratch_size",
        "launch_cooperative_grid",
        "launch_pdl",
        "num_ctas",
        "profile_scratch_align",
        "profile_scratch_size",
    )

    def __init__(self, ck: Any) -> None:
        md = ck.metadata  # as CudaLauncher.__init__ (3.6.0) reads it
        self._ck = ck
        self._real: Any = None
        self.num_ctas = getattr(md, "num_ctas", 1)
        self.global_scratch_size = md.global_scratch_size
        self.global_scratch_align = md.global_scratch_align
        self.profile_scratch_size = md.profile_scratch_size
        self.profile_scratch_align = md.profile_scratch_align
        self.launch_cooperative_grid = md.launch_cooperative_grid
        self.launch_pdl = md.launch_pdl

    @staticmethod
    def wraps(signature: dict[str, Any]) -> bool:
        """Whether 3.6's ``wrap_handle_tensordesc`` wraps the launch of a kernel of this signature."""
        return any(isinstance(t, str) and t.startswith("tensordesc") for t in signature.values())

    def __call__(self, *args: Any) -> Any:
        real = self._real
        if real is None:
            from triton.runtime.driver import driver

            ck = self._ck
            real = self._real = driver.active.launcher_cls(ck.src, ck.metadata)
            ck._run = real
        return real(*args)


class _ProfileScratch39:
    """The profile-scratch allocator of Triton 3.9's ``CudaLauncher.__call__``, chosen per call as it chooses:
    the profile allocator when one is set (``triton.set_profile_allocator``), else the active driver's
    ``allocate_default_profile_scratch``. ``get()`` is what a plan calls, as it calls an allocator's."""

    __slots__ = ("_allocation", "_drivers")

    def __init__(self) -> None:
        from triton.runtime import _allocation
        from triton.runtime.driver import driver

        self._allocation = _allocation
        self._drivers = driver

    def get(self) -> Any:
        if self._allocation.has_profile_allocator():
            return self._allocation._profile_allocator.get()
        return self._drivers.active.allocate_default_profile_scratch


# ---------------------------------------------------------------------------------------------------------
# The CUDA runtime getters
# ---------------------------------------------------------------------------------------------------------


class Runtime:
    """Device/stream getters, resolved once the first launch shows a working CUDA driver (``native``: the
    same reads through torch's C shim, see ``jitkey._torch_current``)."""

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
        # The same reads through torch's C shim, once proven equal to these getters (else None, and why).
        from jitkey._torch_current import native_getters

        self.native, self.native_problem = native_getters(torch, get_device, get_stream)


_runtime_lock = threading.Lock()
runtime: Runtime | None = None
runtime_problem: str | None = None


def get_runtime() -> Runtime | None:
    """The CUDA runtime getters, or ``None`` (then ``runtime_problem`` says why, if it is permanent).

    A driver error (no GPU, no CUDA) is not cached: Triton's own path raises the real error to the caller,
    and a later call tries again.
    """
    global runtime, runtime_problem
    if runtime is None and runtime_problem is None:
        with _runtime_lock:
            if runtime is None and runtime_problem is None:
                try:
                    runtime = Runtime()
                except Unkeyable as exc:
                    runtime_problem = exc.reason
                except Exception:
                    return None
    return runtime
