"""The DSL layer: a kernel DSL's per-call work keyed and replayed natively.

A DSL call (a Helion kernel, a FlagGems op, a ninetoothed kernel) does three things in Python on every
call: it *binds* (arguments → the DSL's specialization key → a compiled kernel or plan), does *host work*
(output allocation, grid, argument order) and *launches*. A :class:`Site` takes all three off the warm path:

* **Key.** The site keys the call natively with a :class:`jitkey.Signature` at least as fine as everything the
  DSL's decisions read (by default :func:`exact`: tensor dtype, shape, strides, device and 16-byte alignment;
  scalar values and types; tuples and lists recursively), plus which arguments are the same object, plus the
  DSL's ``state`` (its settings and environment) and torch's grad and inference modes.
* **Miss.** The DSL's own path runs the call, recorded: ``bind(args)`` names the DSL's bound call (e.g. Helion's
  generated host function); while it runs, every top-level torch function it calls (a ``TorchFunctionMode``)
  and every Triton launch it makes through a jitkey kernel is a step of the recording, and everything it
  computes in Python from keyed metadata is folded into the steps as constants.
* **Hit.** The recorded plan (:class:`jitkey._core._Plan`) replays the steps natively: the same torch calls
  (fresh outputs every call), the same launches through jitkey's native launcher (Triton's key and kernel
  choice per launch), the same result. A plan is replayed only for the exact key it was recorded under and
  while the DSL's bound object is still the one it was recorded from (``Bound.guard``).

**What a recording refuses** (the call then caches the DSL's bound call, still skipping its bind, and the
reason is counted): reading an argument's metadata the key does not hold (``requires_grad``,
``storage_offset``, ``data_ptr``, ...), reading tensor data into Python (``item``, ``tolist``, ``bool``),
operations whose output shape depends on data (``nonzero``, ``unique``, boolean masks), a tensor the call did
not receive or make (a global buffer), an argument object it cannot replay, a launch grid function that captures
anything but constants (one that captures only constants is replayed as it is and called by each launch), a launch
on another device or stream than the call's, a tensor passed twice inside tuples or lists (one passed as two
arguments is replayed: the key holds which arguments are one object), and any Triton launch it could not
capture (every launch during a recording is also watched through Triton's ``launch_enter_hook``; one made
outside a jitkey kernel refuses the plan). The contract for the DSL's bound call: its GPU work goes through
torch functions and Triton launches, and its Python reads only what the key holds; a DSL whose per-call path
does other work (a C extension launching kernels, I/O, counters that must tick) declares it with ``record=False``
or a ``check``.

**Fallback.** Anything a site does not handle (keyword arguments, an argument the key cannot hold, an active
torch function or dispatch mode, a site ``check``) runs the DSL's own path (``fallback``), counted by reason.

An adapter for a DSL (see ``jitkey.integrations``) is a few dozen lines: build a :class:`Site` per DSL entry
point with its parameters and ``bind``, and route the DSL's call to ``site.call``; an entry point it leaves to the
DSL (one it does not understand, or whose site cannot be made) is counted with :func:`decline` and shows in
:func:`report` under ``declined``.
"""

from __future__ import annotations

import inspect
import threading
import types
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from jitkey import _deps, _torch_current, _torch_modes, rules
from jitkey._core import LruCache, Signature, _Plan, _recording, _Site
from jitkey.errors import SignatureError

__all__ = ["Bound", "Site", "decline", "exact", "merge_reports", "record", "report", "sites"]

_CAPACITY = 256  # plans kept per site (an LRU)
#: The refusal of a recording during which the DSL compiled or tuned (an adapter reports it): the next call with
#: the same key is recorded again.
TRANSIENT_COMPILE = "the DSL compiled or tuned during the call"
_TRANSIENT = frozenset({TRANSIENT_COMPILE})


def exact() -> rules.ByTypeRule:
    """The rule that keys an argument exactly, for any DSL: a tensor by dtype, shape, strides, device (type and
    index) and 16-byte alignment (tensor subclasses other than ``nn.Parameter`` fall back); an int, float or
    bool by value and type; None; str, dtype, device and other keyable values by value; tuples and lists
    recursively (named tuples with their type)."""
    t = rules.TensorRule(dtype=True, align=16, shape="exact", strides="exact", device="type_index")
    return rules.ByTypeRule(
        tensor=t,
        int_=rules.IntRule("value"),
        float_=rules.FloatRule(True),
        bool_=rules.BoolRule(True),
        none=True,
        tuples=True,
        lists=True,
        any_=True,
    )


def _constant(src: Any) -> bool:
    """Whether a recorder source is fixed by the key: a constant, or a tuple or list built of constants."""
    return src[0] == "c" or (src[0] in ("t", "l") and all(_constant(s) for s in src[1]))


class Bound(NamedTuple):
    """What a DSL does for one call's arguments, as ``bind`` names it.

    ``call(*args)`` is the DSL's per-call work for arguments with this key (e.g. Helion's generated host
    function). ``guard = (owner, name)``: a plan recorded from ``call`` holds while ``getattr(owner, name) is
    call`` (the DSL would still use it); ``None``: always.
    """

    call: Callable[..., Any]
    guard: tuple[Any, str] | None = None


# ---------------------------------------------------------------------------------------------------------
# The recorder
# ---------------------------------------------------------------------------------------------------------

_tls = threading.local()


def _current() -> _Recorder | None:
    return getattr(_tls, "rec", None)


#: Tensor metadata a call may read from its arguments: all of it is in the :func:`exact` key.
_COVERED = frozenset(
    {
        "shape", "size", "stride", "dim", "ndim", "ndimension", "numel", "nelement", "dtype", "device",
        "is_cuda", "is_cpu", "is_meta", "is_xpu", "is_mps", "get_device", "is_contiguous",
        "is_floating_point", "is_complex", "is_signed", "element_size", "itemsize", "nbytes", "layout",
        "is_sparse", "is_quantized", "__len__", "result_type", "is_tensor", "can_cast", "promote_types",
        "is_non_overlapping_and_dense", "is_same_size", "dim_order",
    }
)  # fmt: skip
#: Metadata of tensors the call made itself, fixed by the key too.
_DERIVED = _COVERED | {"storage_offset", "is_set_to"}
#: Reads of tensor data or state into Python: never folded.
_DATA = frozenset(
    {
        "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__array__",
        "numpy", "equal", "allclose", "is_nonzero", "data_ptr", "untyped_storage", "storage",
        "_typed_storage", "requires_grad", "grad", "grad_fn", "is_leaf", "_version", "_base", "is_inference",
        "__repr__", "__str__", "__format__", "__hash__", "__eq__", "__ne__", "__contains__", "__iter__",
    }
)  # fmt: skip
#: Operations whose output shape depends on the data.
_DATA_SHAPED = frozenset(
    {
        "nonzero",
        "argwhere",
        "unique",
        "unique_consecutive",
        "_unique",
        "_unique2",
        "masked_select",
        "bincount",
    }
)


def _func_name(func: Any) -> str:
    kind = type(func).__name__
    if kind == "method-wrapper":  # a property getter: the descriptor names it
        return str(getattr(getattr(func, "__self__", None), "__name__", "?"))
    name = str(getattr(func, "__name__", "?"))
    if kind in ("OpOverload", "OpOverloadPacket"):  # torch.ops.aten.<name>[.<overload>]
        return name.split(".", 1)[0]
    return name


def _has_tensor(obj: Any) -> bool:
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if type(obj) in (tuple, list):
        return any(_has_tensor(x) for x in obj)
    return False


def _constant_types() -> tuple[type, ...]:
    import torch

    return (
        int, float, bool, complex, str, bytes, type(None), slice, type(Ellipsis), range,
        torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size,
    )  # fmt: skip


class _Recorder:
    """One recording (see the module docs). Steps use ``_Plan``'s source specs."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        import torch

        self.torch = torch
        self.thread = threading.get_ident()
        self.steps: list[tuple[str, Any, list[Any], tuple[str, ...] | None]] = []
        self.refs: dict[int, tuple[Any, Any]] = {}
        self.inputs: set[int] = set()
        self.problem: str | None = None
        self.depth = 0
        self.device: Any = None
        self.stream: Any = None
        self.consts = _constant_types()
        for i, a in enumerate(args):
            self._input(a, i, ())

    # -- sources ---------------------------------------------------------------------------------
    def _input(self, a: Any, i: int, path: tuple[int, ...]) -> None:
        if isinstance(a, self.torch.Tensor):
            seen = self.refs.get(id(a))
            if seen is not None:
                # The key holds which top-level arguments are one object, so every call replayed under it passes
                # this tensor in both places (the first is its source); a repeat inside a tuple or list it does
                # not hold.
                if path or len(seen[0]) != 2:
                    self.refuse("a tensor is passed twice in one call, inside a tuple or list")
                return
            src = ("a", i, path) if path else ("a", i)
            self.refs[id(a)] = (src, a)
            self.inputs.add(id(a))
        elif type(a) in (tuple, list):
            for k, x in enumerate(a):
                self._input(x, i, (*path, k))

    def refuse(self, why: str) -> None:
        if self.problem is None:
            self.problem = why

    def src(self, obj: Any) -> Any:
        ref = self.refs.get(id(obj))
        if ref is not None and ref[1] is obj:
            return ref[0]
        t = type(obj)
        if t in (tuple, list):
            items = [self.src(x) for x in obj]
            if t is tuple and all(s[0] == "c" for s in items):
                return ("c", obj)
            return ("t" if t is tuple else "l", tuple(items))
        if isinstance(obj, self.consts):
            return ("c", obj)
        if isinstance(obj, self.torch.Tensor):
            self.refuse("a tensor the call neither received nor made (a global or cached tensor)")
        else:
            self.refuse(f"an argument of type {t.__module__}.{t.__qualname__}, which a replay cannot rebuild")
        return ("c", None)

    def grid_function(self, grid: Any) -> bool:
        """Whether a launch's callable grid can be a step's constant (else the recording is refused): a plain
        function whose closure and defaults hold only constants (values the key fixed when the DSL computed
        them). The replay passes the function itself, and the launch calls it with the launch's arguments, as
        Triton does on every launch (so what it reads from them, or from globals, is read again)."""
        if type(grid) is not types.FunctionType:
            self.refuse(f"a launch grid of type {type(grid).__qualname__} (not a plain function)")
            return False
        captured: list[Any] = [*(grid.__defaults__ or ()), *(grid.__kwdefaults__ or {}).values()]
        for cell in grid.__closure__ or ():
            try:
                captured.append(cell.cell_contents)
            except ValueError:  # an empty cell: bound later
                self.refuse("a launch grid function with an unbound closure variable")
                return False
        if not all(self._constant_value(v) for v in captured):
            self.refuse("a launch grid function that captures values other than constants")
            return False
        self.refs[id(grid)] = (("c", grid), grid)  # a constant of the plan
        return True

    def _constant_value(self, v: Any) -> bool:
        """Whether the value ``v`` may be a plan's constant: of a constant type, or a tuple of such values (a
        source spec's counterpart is the module's ``_constant``)."""
        if type(v) is tuple:
            return all(self._constant_value(x) for x in v)
        return isinstance(v, self.consts)

    def result(self, obj: Any, j: int) -> None:
        if isinstance(obj, self.torch.Tensor):
            self.refs.setdefault(id(obj), (("s", j), obj))
        elif type(obj) in (tuple, list):
            for k, x in enumerate(obj):
                if isinstance(x, self.torch.Tensor):
                    self.refs.setdefault(id(x), (("s", j, k), x))

    def step(self, kind: str, target: Any, args: Sequence[Any], kwargs: dict[str, Any], result: Any) -> None:
        srcs = [self.src(a) for a in args] + [self.src(v) for v in kwargs.values()]
        if self.problem is not None:
            return
        self.steps.append((kind, target, srcs, tuple(kwargs) or None))
        self.result(result, len(self.steps) - 1)

    # -- where the call is -----------------------------------------------------------------------
    def _place(self) -> tuple[Any, Any]:
        """The current CUDA device and stream (None without CUDA), read where torch reads them."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return None, None
        dev = self.torch._C._cuda_getDevice()
        return dev, self.torch._C._cuda_getCurrentRawStream(dev)

    def start(self) -> None:
        self.device, self.stream = self._place()
        self.rng = self._rng()

    def _rng(self) -> Any:
        """What a draw from torch's generators changes: the CUDA generator's seed and offset on the current
        device, the CPU generator's state."""
        torch = self.torch
        cuda = None
        self.depth += 1  # the recorder's own reads are not the call's
        try:
            if self.device is not None:
                g = torch.cuda.default_generators[self.device]
                cuda = (g.initial_seed(), g.get_offset())
            return cuda, bytes(torch.default_generator.get_state().numpy())
        finally:
            self.depth -= 1

    def check_rng(self) -> None:
        """A call that draws from torch's generators outside a replayed step (e.g. to compute a seed and an
        offset in Python) would replay its draw as a constant (a step's own draws are made again)."""
        if self._rng() != self.rng:
            self.refuse("draws from torch's random number generators in Python")

    def sync_rng(self) -> None:
        self.rng = self._rng()

    def check_place(self) -> None:
        """A launch must run where the call started (a plan does not switch devices or streams)."""
        if self._place() != (self.device, self.stream):
            self.refuse("a launch on another device or stream than the call's")

    # -- torch functions -------------------------------------------------------------------------
    def torch_function(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.depth or self.problem is not None or threading.get_ident() != self.thread:
            return func(*args, **kwargs)
        name = _func_name(func)
        self.check_rng()
        self.depth += 1
        try:
            result = func(*args, **kwargs)
        finally:
            self.depth -= 1
            self.sync_rng()
        if name in _DATA:
            self.refuse(f"reads `{name}` of a tensor into Python")
        elif name in _DATA_SHAPED or (name == "__getitem__" and self._bool_index(args)):
            self.refuse(f"`{name}`: its output shape depends on the data")
        elif not _has_tensor(result) and name in _DERIVED:
            for t in args:
                if not isinstance(t, self.torch.Tensor):
                    continue
                ref = self.refs.get(id(t))
                if ref is None or ref[1] is not t:
                    self.refuse(f"reads `{name}` of a tensor the call neither received nor made")
                elif id(t) in self.inputs and name not in _COVERED:
                    self.refuse(f"reads `{name}` of an argument, which the key does not hold")
            # else: folded (the value is fixed by the key)
        elif name == "contiguous" and self._returns_own_argument(args, kwargs, result):
            pass  # folded: whether ``contiguous`` returns its tensor is fixed by the keyed shape and strides
        elif result is not None and not _has_tensor(result):
            if not all(self.src(a)[0] == "c" for a in (*args, *kwargs.values())):
                self.refuse(f"`{name}` returned a {type(result).__name__}, which a replay cannot fold")
            # else: a function of constants only (torch.promote_types, ...): folded
        else:
            kind, target = self._alloc_step(func, args, kwargs, result)
            self.step(kind, target, args, kwargs, result)
        return result

    def _returns_own_argument(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> bool:
        """Whether ``result`` is the call's tensor ``args[0]`` itself, a tensor the recording knows (an argument
        or one the call made), with every other argument a constant: then a replay passes that tensor on
        without a step (``x.contiguous()`` of a contiguous ``x``)."""
        if not args or result is not args[0] or not isinstance(result, self.torch.Tensor):
            return False
        ref = self.refs.get(id(result))
        if ref is None or ref[1] is not result:
            return False
        return all(_constant(self.src(a)) for a in (*args[1:], *kwargs.values()))

    def _alloc_step(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> tuple[str, Any]:
        """The step for ``func(*args, **kwargs)``: a native allocation (``"empty"``, ``"empty_like"``) for the
        fresh CUDA tensors torch's ``empty``, ``empty_strided`` and ``empty_like`` make where everything the
        result depends on is fixed by the key (see ``jitkey._torch_alloc``), else a call of ``func``."""
        torch = self.torch
        plain = (
            type(result) is torch.Tensor
            and result.is_cuda
            and result.layout == torch.strided
            and not result.requires_grad
        )
        if not plain or func not in (torch.empty_like, torch.empty, torch.empty_strided):
            return "call", func
        from jitkey import _torch_alloc

        self.depth += 1  # proving the native allocation (once per process) is not the call's work
        try:
            alloc = _torch_alloc.get()
        finally:
            self.depth -= 1
        if alloc is None:
            return "call", func
        if func is torch.empty_like:
            return self._empty_like_step(alloc, func, args, kwargs, result)
        # torch.empty / empty_strided: only with every argument a constant (a list of constants counts: the
        # native step does not pass it on), the dtype and the device named.
        if not all(_constant(self.src(a)) for a in (*args, *kwargs.values())):
            return "call", func
        dev, dtype = kwargs.get("device"), kwargs.get("dtype")
        named = isinstance(dev, torch.device) and dev.index is not None
        if (
            not named
            or not isinstance(dtype, torch.dtype)
            or set(kwargs) - {"dtype", "device", "memory_format"}
        ):
            return "call", func
        spec = (
            alloc,
            func,
            list(result.shape),
            list(result.stride()),
            str(result.dtype).removeprefix("torch."),
        )
        return "empty", (*spec, result.device.index)

    def _empty_like_step(
        self, alloc: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> tuple[str, Any]:
        """``torch.empty_like(x, **kwargs)`` as the native ``"empty_like"`` step: keyword arguments that are
        constants and change nothing but the dtype (the device, if named, is ``x``'s own, with its index; the
        memory format, if named, is ``torch.preserve_format``; the layout, if named, strided; no gradient, no
        pinned memory), else a call of ``func``. The native step keeps ``x``'s sizes, strides (dense ones, as
        torch's ``preserve_format`` does) and device, and takes the dtype named here, if any."""
        torch = self.torch
        x = args[0] if len(args) == 1 else None
        if not isinstance(x, torch.Tensor) or not all(_constant(self.src(v)) for v in kwargs.values()):
            return "call", func
        dtype = kwargs.get("dtype")
        dev = kwargs.get("device")
        fixed = {
            "memory_format": (None, torch.preserve_format),
            "layout": (None, torch.strided),
            "requires_grad": (False,),
            "pin_memory": (False,),
        }
        if set(kwargs) - {"dtype", "device", *fixed}:
            return "call", func
        if any(kwargs.get(k) is not None and kwargs[k] not in ok for k, ok in fixed.items()):
            return "call", func
        if dev is not None and not (
            isinstance(dev, torch.device) and dev.index is not None and dev == x.device
        ):
            return "call", func
        if dtype is not None and not isinstance(dtype, torch.dtype):
            return "call", func
        if dtype is None:
            return "empty_like", (alloc, func)
        return "empty_like", (alloc, func, str(dtype).removeprefix("torch."))

    def _bool_index(self, args: tuple[Any, ...]) -> bool:
        idx: Any = args[1] if len(args) > 1 else None
        items = idx if type(idx) in (tuple, list) else (idx,)
        torch = self.torch
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _mode_class() -> type:
    from torch.overrides import TorchFunctionMode

    class _RecordingMode(TorchFunctionMode):
        def __init__(self, rec: _Recorder) -> None:
            super().__init__()
            self.rec = rec

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self.rec.torch_function(func, args, kwargs or {})

    return _RecordingMode


_MODE: type | None = None


# -- callbacks from the native side -------------------------------------------------------------------
def _on_launch(launcher: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A jitkey Triton launch is about to run (only while some recording is in progress)."""
    rec = _current()
    if rec is None or rec.depth or rec.problem is not None or threading.get_ident() != rec.thread:
        return None
    if callable(grid) and not isinstance(grid, tuple) and not rec.grid_function(grid):
        return None
    rec.check_place()
    rec.check_rng()
    rec.step("launch", launcher, (grid, *args), kwargs, None)
    rec.depth += 1

    def end() -> None:
        rec.depth -= 1
        rec.sync_rng()

    return end


def _on_site(site: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A site is called while some recording is in progress: a step of the recording if it is top-level."""
    rec = _current()
    if rec is None or rec.depth or rec.problem is not None or threading.get_ident() != rec.thread:
        return site._run(args, kwargs)
    rec.check_rng()
    rec.depth += 1
    try:
        result = site._run(args, kwargs)
    finally:
        rec.depth -= 1
        rec.sync_rng()
    rec.step("call", site.call, args, kwargs, result)
    return result


def _on_enter(_metadata: Any) -> None:
    """Triton's launch_enter_hook during a recording: a launch that no step accounts for refuses the plan."""
    rec = _current()
    if rec is not None and rec.depth == 0 and threading.get_ident() == rec.thread:
        rec.refuse("a Triton launch the recording could not capture (not made through a jitkey kernel)")


_interp_lock = threading.Lock()
_interp_patched = False


def _patch_interpreter() -> None:
    """Under Triton's interpreter (``TRITON_INTERPRET=1``) every launch is ``InterpretedFunction.run``; it
    becomes a step of a recording in progress on its thread (otherwise it runs as before)."""
    global _interp_patched
    with _interp_lock:
        if _interp_patched:
            return
        from triton.runtime.interpreter import InterpretedFunction

        orig = InterpretedFunction.run

        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            rec = _current()
            if warmup or rec is None or rec.depth or rec.problem is not None:
                return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            if threading.get_ident() != rec.thread:
                return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            if callable(grid) and not isinstance(grid, tuple):
                rec.grid_function(grid)
            rec.depth += 1
            try:
                result = orig(self, *args, grid=grid, warmup=False, **kwargs)
            finally:
                rec.depth -= 1
            rec.step(
                "call", types.MethodType(orig, self), args, {"grid": grid, "warmup": False, **kwargs}, None
            )
            return result

        run.__wrapped__ = orig  # type: ignore[attr-defined]
        InterpretedFunction.run = run
        _interp_patched = True


def _launch_hooks() -> tuple[Any, str | None]:
    """Triton's ``launch_enter_hook`` chain, or why it cannot watch launches."""
    try:
        from triton import knobs
    except ImportError:
        return None, None  # no Triton: every launch is a torch function
    if knobs.runtime.interpret:
        _patch_interpreter()
        return None, None
    chain = knobs.runtime.launch_enter_hook
    if not (hasattr(chain, "add") and hasattr(chain, "remove") and hasattr(chain, "calls")):
        return None, "Triton's launch_enter_hook is not a HookChain (launches cannot be watched)"
    return chain, None


def record(
    call: Callable[..., Any],
    args: tuple[Any, ...],
    guard: tuple[Any, str] | None = None,
    npos: int | None = None,
    kwonly: tuple[str, ...] = (),
) -> tuple[Any, Any, str | None]:
    """Run ``call(*args)`` once, recorded: ``(result, plan or None, why not)``. The result is the call's own.
    With ``kwonly``, the last ``len(kwonly)`` arguments are passed by those names."""
    global _MODE
    if _MODE is None:
        _MODE = _mode_class()
    rec = _Recorder(args)
    rec.start()
    chain, why = _launch_hooks()
    if why is not None:
        rec.refuse(why)
    prev = _current()
    _tls.rec = rec
    _recording(1, _on_launch, _on_site)
    if chain is not None:
        chain.add(_on_enter)
    npos = len(args) if npos is None else npos
    try:
        with _MODE(rec):
            result = call(*args[:npos], **dict(zip(kwonly, args[npos:], strict=True)))
    finally:
        if chain is not None:
            chain.remove(_on_enter)
        _recording(-1)
        _tls.rec = prev
    if rec.problem is None:
        rec.check_rng()
    if rec.problem is None:
        ret = rec.src(result)
    if rec.problem is not None:
        return result, None, rec.problem
    g = None if guard is None else (guard[0], guard[1], call)
    return result, _Plan(len(args), rec.steps, ret, g, keep=_keep(rec)), None


def _keep(rec: _Recorder) -> tuple[Any, Any] | None:
    """What a plan needs to keep its small intermediates between replays (``rust/py/src/dsl/plan.rs``): the
    proven native current-stream read and torch's deterministic-algorithms getter; None (keep nothing) for a
    recording that allocated nothing natively, or where the stream cannot be read natively."""
    if not any(kind == "empty" for kind, *_ in rec.steps):
        return None
    shim = _torch_current.PATH.get()
    return None if shim is None else (shim, rec.torch._C._get_deterministic_algorithms)


# ---------------------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------------------


def _default_checks() -> list[tuple[Callable[[], Any], str]]:
    import torch

    return [
        (torch._C._is_torch_function_mode_enabled, "a torch function mode is active"),
        (torch._C._len_torch_dispatch_stack, "a torch dispatch mode is active"),
    ]


def _default_state(device: bool) -> tuple[Callable[[], Any], ...]:
    """torch's grad and inference modes, and (``device``, with CUDA) the current device: a DSL may decide on
    them in Python (a device it switches to is where its launches went)."""
    import torch

    fns: tuple[Callable[[], Any], ...] = (torch.is_grad_enabled, torch.is_inference_mode_enabled)
    if device and torch.cuda.is_available():
        fns += (torch._C._cuda_getDevice,)
    return fns


_registry_lock = threading.Lock()
_registry: weakref.WeakSet[Site] = weakref.WeakSet()
#: DSL entry points an adapter left to its DSL (no site), by ``"<dsl>: <reason>"``.
declined: Counter[str] = Counter()


def decline(dsl: str, why: str | BaseException) -> None:
    """Count an entry point of ``dsl`` that an adapter leaves to the DSL (no site), with why: a text, or the
    exception that making its site raised (counted as ``"<type>: <message>"``)."""
    if isinstance(why, BaseException):
        why = f"{type(why).__name__}: {why}"
    declined[f"{dsl}: {why}"] += 1


class Site:
    """One DSL entry point through jitkey (see the module docs).

    Args:
        name: shown in reports.
        params: the entry point's parameters: the DSL function itself or its ``inspect.Signature`` (every
            parameter keyed by :func:`exact`, defaults and keyword-only parameters as declared), names, ``(name,
            rule[, default])`` tuples, or a ready :class:`jitkey.Signature`. A call's positional and keyword
            arguments are bound to the parameters natively (defaults applied) before it is keyed.
        bind: ``bind(args) -> Bound | None``: the DSL's bound call for these arguments (all parameters, in
            order; keyword-only ones are passed to the bound call by name), or ``None`` when the DSL is not
            ready to name one (e.g. the first call compiles or autotunes: ``fallback`` runs it).
        fallback: ``fallback(*args, **kwargs)``: the DSL's whole own path, for calls the site does not handle.
        state: callables whose results (keyable values) are folded into every key: the DSL's settings and
            environment that its decisions read. torch's grad and inference modes are always added.
        checks: ``(callable, reason)`` pairs: a call for which ``callable()`` is truthy runs ``fallback``
            (counted with ``reason``). Default: no torch function or dispatch mode is active.
        record: ``False``: never record, cache the bound call only (for a DSL whose per-call work cannot be
            replayed).
        device: key the current CUDA device (default). A DSL whose per-call Python never looks at the current
            device (it allocates and launches by its arguments' devices; jitkey's launches key the device
            themselves) passes ``False`` and saves the read.
        capacity: plans kept (least recently used dropped).

    ``site.call`` (a native builtin) is the per-call entry: ``site.call(*args)`` is the DSL call.
    """

    def __init__(
        self,
        name: str,
        params: Sequence[str | rules.Param] | Signature | inspect.Signature | Callable[..., Any],
        bind: Callable[[tuple[Any, ...]], Bound | None],
        *,
        fallback: Callable[..., Any],
        state: Sequence[Callable[[], Any]] = (),
        checks: Sequence[tuple[Callable[[], Any], str]] | None = None,
        record: bool = True,
        device: bool = True,
        capacity: int = _CAPACITY,
    ) -> None:
        _deps.require("torch", "jitkey.dsl.Site")
        sig, self.kwonly = _signature(params)
        self.name = name
        self.signature = sig
        self.npos = len(sig) - len(self.kwonly)
        self._bind = bind
        self._dsl = fallback
        self._record = record
        self.fallbacks: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.warmups = 0
        self._stats_lock = threading.Lock()
        all_state = (*_default_state(device), *state)
        import torch

        self._native = _Site(
            sig,
            LruCache(capacity),
            self._miss,
            self._fallback,
            _default_checks() if checks is None else list(checks),
            all_state,
            self.npos,
            _torch_modes.get(),
            getattr(torch._C, "_cuda_getDevice", None),
        )
        #: Whether the site reads the current device and has not yet been given torch's C shim for it (done at
        #: a miss once CUDA is initialized and the shim is proven: ``jitkey._torch_current``).
        self._current_pending: bool = self._native.reads_device
        #: The per-call entry point (a native builtin).
        self.call: Callable[..., Any] = self._native.call
        with _registry_lock:
            _registry.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<jitkey.dsl.Site {self.name}>"

    def key(self, *args: Any, **kwargs: Any) -> bytes:
        """The key a call with these arguments uses (raises where such a call falls back)."""
        return bytes(self._native.key(args, kwargs))

    def plan(self, *args: Any, **kwargs: Any) -> Any:
        """The plan cached for a call with these arguments (``None``: none yet), without running it."""
        return self._native.lookup(args, kwargs)

    def clear(self) -> None:
        """Forget every plan (the DSL dropped its caches)."""
        self._native.cache.clear()

    # -- the Python side of a call ---------------------------------------------------------------
    def _miss(self, args: tuple[Any, ...]) -> tuple[Any, Any]:
        """A miss: ``args`` are bound to every parameter (defaults applied), in order."""
        if self._current_pending:
            self._use_current()
        b = self._bind(args)
        if b is None:
            with self._stats_lock:
                self.warmups += 1
            return self._invoke(self._dsl, args), None
        if not self._record:
            return self._invoke(b.call, args), _bound_plan(b, args, self.kwonly)
        result, plan, why = record(b.call, args, b.guard, self.npos, self.kwonly)
        if plan is not None:
            return result, plan
        with self._stats_lock:
            self.refused[str(why)] += 1
        if why in _TRANSIENT:  # the DSL compiled or tuned during the call: record the next one
            return result, None
        return result, _bound_plan(b, args, self.kwonly)

    def _use_current(self) -> None:
        """From now on, read the current device through torch's C shim, if it is proven (once per process, when
        CUDA is initialized; until then the site asks again at its next miss)."""
        shim = _torch_current.PATH.get()
        if _torch_current.PATH.state is None:
            return  # CUDA not initialized yet: undecided
        self._current_pending = False
        if shim is not None:
            self._native.use_current(shim)

    def _invoke(self, f: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self.kwonly:
            return f(*args[: self.npos], **dict(zip(self.kwonly, args[self.npos :], strict=True)))
        return f(*args)

    def _fallback(self, reason: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        why = str(reason) if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
        with self._stats_lock:
            self.fallbacks[why] += 1
        return self._dsl(*args, **kwargs)

    def stats(self) -> dict[str, Any]:
        """``calls``, ``replays`` (recorded plans replayed), ``bound_calls`` (hits that called the DSL's
        bound call), ``misses`` (the DSL's own path ran, recorded), ``warmups`` (misses the DSL compiled or
        tuned), ``fallbacks`` and ``fallback_reasons``, ``refused`` (recordings refused, by reason),
        ``stale`` (plans whose bound object changed), ``plans`` (entries cached)."""
        c = self._native.counts()
        cs = self._native.cache.stats()
        with self._stats_lock:
            fallbacks = dict(self.fallbacks)
            refused = dict(self.refused)
            warmups = self.warmups
        nfb = sum(fallbacks.values())
        misses = int(cs["misses"])
        return {
            "calls": c["replays"] + c["bound_calls"] + misses + nfb,
            "replays": c["replays"],
            "bound_calls": c["bound_calls"],
            "misses": misses,
            "warmups": warmups,
            "fallbacks": nfb,
            "fallback_reasons": fallbacks,
            "refused": refused,
            "stale": c["stale"],
            "plans": int(cs["size"]),
        }


def _bound_plan(b: Bound, args: tuple[Any, ...], kwonly: tuple[str, ...]) -> Any:
    """A one-step plan: the DSL's bound call with the call's arguments, under the bound object's guard."""
    g = None if b.guard is None else (b.guard[0], b.guard[1], b.call)
    step = ("call", b.call, [("a", i) for i in range(len(args))], kwonly or None)
    return _Plan(len(args), [step], ("s", 0), g, bound=True)


def _signature(
    params: Sequence[str | rules.Param] | Signature | inspect.Signature | Callable[..., Any],
) -> tuple[Signature, tuple[str, ...]]:
    """The site's :class:`jitkey.Signature` and its keyword-only parameter names (which come last)."""
    if isinstance(params, Signature):
        return params, ()
    if isinstance(params, inspect.Signature) or callable(params):
        psig = params if isinstance(params, inspect.Signature) else inspect.signature(params)
        rule = exact()
        plist: list[Any] = []
        kwonly: list[str] = []
        for p in psig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise SignatureError(f"jitkey.dsl.Site: parameter {p.name!r} is variadic")
            if p.kind is p.KEYWORD_ONLY:
                kwonly.append(p.name)
            elif kwonly:
                raise SignatureError("jitkey.dsl.Site: keyword-only parameters must come last")
            plist.append((p.name, rule) if p.default is p.empty else (p.name, rule, p.default))
        return Signature(plist), tuple(kwonly)
    rule = exact()
    return Signature([(p, rule) if isinstance(p, str) else p for p in params]), ()


def sites() -> list[Site]:
    """Every live site of this process."""
    with _registry_lock:
        return list(_registry)


#: The counters of :meth:`Site.stats` a report sums.
_COUNTERS = ("calls", "replays", "bound_calls", "misses", "warmups", "fallbacks", "stale", "plans")


def report(top: int = 10, *, where: Callable[[Site], bool] | None = None) -> dict[str, Any]:
    """What every site of this process (those ``where`` selects) did: totals (as :meth:`Site.stats`),
    ``fast_path`` (replays + bound calls over the warm calls: replays + bound calls + fallbacks),
    ``replay_share`` (replays over the warm calls), and the ``busiest`` sites."""
    per = [(s.name, s.stats()) for s in sites() if where is None or where(s)]
    out: dict[str, Any] = {k: sum(st[k] for _, st in per) for k in _COUNTERS}
    out["sites"] = len(per)
    reasons: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for _, st in per:
        reasons.update(st["fallback_reasons"])
        refused.update(st["refused"])
    busiest = [(n, {k: st[k] for k in _COUNTERS}) for n, st in per]
    return _completed(out, reasons, refused, declined, busiest, top)


def merge_reports(reports: Sequence[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    """Sum :func:`report` results (of several processes) into one."""
    out: dict[str, Any] = {k: sum(r.get(k, 0) for r in reports) for k in (*_COUNTERS, "sites")}
    reasons: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    declines: Counter[str] = Counter()
    busiest: dict[str, Counter[str]] = {}
    for r in reports:
        reasons.update(r.get("fallback_reasons", {}))
        refused.update(r.get("refused", {}))
        declines.update(r.get("declined", {}))
        for b in r.get("busiest", []):
            busiest.setdefault(b["site"], Counter()).update({k: v for k, v in b.items() if k != "site"})
    return _completed(out, reasons, refused, declines, list(busiest.items()), top)


def _completed(
    out: dict[str, Any],
    reasons: Counter[str],
    refused: Counter[str],
    declines: Counter[str],
    busiest: Sequence[tuple[str, Mapping[str, int]]],
    top: int,
) -> dict[str, Any]:
    """A report from its summed counters (``out``): the reasons, most common first, the shares of the warm
    calls, and the ``top`` sites of ``busiest`` (site name, counters) by calls."""
    out["fallback_reasons"] = dict(reasons.most_common())
    out["refused"] = dict(refused.most_common())
    out["declined"] = dict(declines.most_common())
    warm = out["replays"] + out["bound_calls"] + out["fallbacks"]
    out["fast_path"] = (out["replays"] + out["bound_calls"]) / warm if warm else None
    out["replay_share"] = out["replays"] / warm if warm else None
    ranked = sorted(busiest, key=lambda kv: -kv[1]["calls"])[:top]
    out["busiest"] = [{"site": n, **counts} for n, counts in ranked]
    return out
