"""Per-parameter rules for :class:`jitkey.Signature`, and ready-made rule sets for Triton and Helion.

A rule says what of one argument goes into the key. Rules are frozen, hashable value objects; a
:class:`jitkey.Signature` compiles them (in Rust) into a plan once per kernel::

    from jitkey import LruCache, MISS, Signature, rules

    sig = Signature(
        [("x", rules.tensor()), ("n", rules.int_(mode="triton")), ("BLOCK", rules.constexpr())],
        extra=("my_kernel", 0),
    )
    cache = LruCache(1024)
    kernel = sig.lookup(cache, (x, n, 128))
    if kernel is MISS:
        kernel = compile_it(...)
        sig.insert(cache, (x, n, 128), kernel)

A parameter is ``(name, rule)`` or ``(name, rule, default)``; parameters with defaults come last and
may be left out of a call. Every rule object answers ``__jitkey_rule__()`` with a plain spec tuple,
which is what the Rust side reads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from jitkey import _deps

__all__ = [
    "HELION_INT32_INDEX_LIMIT",
    "AnyRule",
    "BoolRule",
    "ByTypeRule",
    "ConstexprRule",
    "FloatRule",
    "IgnoreRule",
    "IntRule",
    "NoneRule",
    "Param",
    "Rule",
    "TensorRule",
    "TritonParams",
    "any_",
    "bool_",
    "by_type",
    "constexpr",
    "float_",
    "helion",
    "helion_value",
    "ignore",
    "int_",
    "none",
    "tensor",
    "triton",
    "triton_value",
]

Spec = tuple[Any, ...]

#: Helion's ``_INT32_INDEX_LIMIT``: tensors with more elements need int64 indexing.
HELION_INT32_INDEX_LIMIT = 2**31 - 1


class _RuleBase:
    """Base of every rule: ``__jitkey_rule__()`` returns the spec tuple the Rust plan reads."""

    __slots__ = ()

    def __jitkey_rule__(self) -> Spec:
        raise NotImplementedError


@dataclass(frozen=True)
class TensorRule(_RuleBase):
    """A ``torch.Tensor`` (or subclass, e.g. ``nn.Parameter``); anything else raises ``ArgumentError``."""

    dtype: bool = True
    align: int | None = 16
    shape: Literal["exact", "bucket"] | None = None
    strides: Literal["exact", "contiguous"] | None = None
    device: Literal["type", "type_index"] | None = "type_index"
    needs_int64: bool = False

    def __jitkey_rule__(self) -> Spec:
        return (
            "tensor",
            self.dtype,
            self.align or 0,
            self.shape or "ignore",
            self.strides or "ignore",
            self.device or "ignore",
            self.needs_int64,
        )


@dataclass(frozen=True)
class IntRule(_RuleBase):
    """An ``int`` (or int subclass such as an ``IntEnum``), never a ``bool``."""

    mode: Literal["value", "triton", "type"] = "value"
    specialize: bool = True
    align: bool = True

    def __jitkey_rule__(self) -> Spec:
        return ("int", self.mode, self.specialize, self.align)


@dataclass(frozen=True)
class FloatRule(_RuleBase):
    """A ``float``: by type only (``value=False``), or bit-exactly by value."""

    value: bool = False

    def __jitkey_rule__(self) -> Spec:
        return ("float", self.value)


@dataclass(frozen=True)
class BoolRule(_RuleBase):
    """A ``bool`` (``1`` is not accepted): by value, or (``value=False``) by type only."""

    value: bool = True

    def __jitkey_rule__(self) -> Spec:
        return ("bool", self.value)


@dataclass(frozen=True)
class NoneRule(_RuleBase):
    """The argument must be ``None``."""

    def __jitkey_rule__(self) -> Spec:
        return ("none",)


@dataclass(frozen=True)
class ConstexprRule(_RuleBase):
    """A compile-time constant: any keyable value (as :func:`jitkey.encode`), tagged with its type."""

    def __jitkey_rule__(self) -> Spec:
        return ("constexpr",)


@dataclass(frozen=True)
class AnyRule(_RuleBase):
    """Any keyable value (as :func:`jitkey.encode` keys it)."""

    def __jitkey_rule__(self) -> Spec:
        return ("any",)


@dataclass(frozen=True)
class IgnoreRule(_RuleBase):
    """Not part of the key (the argument is not even looked at)."""

    def __jitkey_rule__(self) -> Spec:
        return ("ignore",)


@dataclass(frozen=True)
class ByTypeRule(_RuleBase):
    """Dispatch on the argument's type (for dynamically typed parameters, as Triton's and Helion's).

    ``bool`` is checked before ``int``. ``tuples`` (and ``lists``) recurse with ``items`` (default:
    this same rule); with ``tuples``, named tuples recurse too, keyed with their type and field names.
    ``any_`` keys every other keyable type by value; ``objects`` keys only objects of non-builtin types
    that :func:`jitkey.encode` keys (``__jitkey__``, torch dtypes/devices, registered adapters such as
    Triton's ``constexpr``/``dtype``). A type with no alternative raises ``ArgumentError``.
    """

    tensor: TensorRule | None = None
    int_: IntRule | None = None
    float_: FloatRule | None = None
    bool_: BoolRule | None = None
    none: bool = False
    tuples: bool = False
    lists: bool = False
    any_: bool = False
    items: ByTypeRule | None = None
    objects: bool = False

    def __jitkey_rule__(self) -> Spec:
        spec: Spec = (
            "by_type",
            None if self.tensor is None else self.tensor.__jitkey_rule__(),
            None if self.int_ is None else self.int_.__jitkey_rule__(),
            None if self.float_ is None else self.float_.__jitkey_rule__(),
            None if self.bool_ is None else self.bool_.__jitkey_rule__(),
            self.none,
            self.tuples,
            self.lists,
            self.any_,
            None if self.items is None else self.items.__jitkey_rule__(),
        )
        return (*spec, True) if self.objects else spec


Rule = (
    TensorRule | IntRule | FloatRule | BoolRule | NoneRule | ConstexprRule | AnyRule | IgnoreRule | ByTypeRule
)
#: A signature parameter: ``(name, rule)`` or ``(name, rule, default)``.
Param = tuple[str, Rule] | tuple[str, Rule, Any]


def tensor(
    *,
    dtype: bool = True,
    align: int | None = 16,
    shape: Literal["exact", "bucket"] | None = None,
    strides: Literal["exact", "contiguous"] | None = None,
    device: bool | Literal["type", "type_index"] = True,
    needs_int64: bool = False,
) -> TensorRule:
    """A tensor parameter.

    Args:
        dtype: key the dtype.
        align: key whether ``data_ptr() % align == 0`` (a power of two); ``None`` to skip.
        shape: ``"exact"`` sizes, ``"bucket"`` (each size as ``min(size, 2)``: 0, 1, many), or ``None``.
        strides: ``"exact"`` strides, ``"contiguous"`` (only ``is_contiguous()``), or ``None``.
        device: ``True``/``"type_index"`` (type and index), ``"type"``, or ``False``.
        needs_int64: key whether ``numel() > 2**31 - 1`` (Helion's int64-indexing flag).
    """
    _deps.require("torch", "jitkey.rules.tensor (a tensor parameter)")
    dev: Literal["type", "type_index"] | None
    if device is True:
        dev = "type_index"
    elif device is False:
        dev = None
    else:
        dev = device
    return TensorRule(dtype, align, shape, strides, dev, needs_int64)


def int_(
    mode: Literal["value", "triton", "type"] = "value", *, specialize: bool = True, align: bool = True
) -> IntRule:
    """An int parameter.

    ``mode="value"`` keys the exact value; ``"type"`` only that it is an int; ``"triton"`` keys
    Triton's buckets: the range class (i32 / i64 / u64), ``== 1`` and ``% 16 == 0``.
    ``specialize=False`` (Triton's ``do_not_specialize``) keeps only the range class;
    ``align=False`` (``do_not_specialize_on_alignment``) drops the ``% 16`` bucket.
    """
    return IntRule(mode, specialize, align)


def float_(*, value: bool = False) -> FloatRule:
    """A float parameter, by type only, or (``value=True``) bit-exactly by value."""
    return FloatRule(value)


def bool_(*, value: bool = True) -> BoolRule:
    """A bool parameter, by value or (``value=False``) by type only; ints are refused."""
    return BoolRule(value)


def none() -> NoneRule:
    """A parameter that must be ``None``."""
    return NoneRule()


def constexpr() -> ConstexprRule:
    """A compile-time constant, keyed by value with its type (``1``, ``True``, ``1.0`` all differ)."""
    return ConstexprRule()


def any_() -> AnyRule:
    """Any keyable value, by value."""
    return AnyRule()


def ignore() -> IgnoreRule:
    """A parameter that is not part of the key."""
    return IgnoreRule()


def by_type(
    *,
    tensor: TensorRule | None = None,
    int_: IntRule | None = None,
    float_: FloatRule | None = None,
    bool_: BoolRule | None = None,
    none: bool = False,
    tuples: bool = False,
    lists: bool = False,
    any_: bool = False,
    items: ByTypeRule | None = None,
    objects: bool = False,
) -> ByTypeRule:
    """A parameter whose rule depends on the argument's type (see :class:`ByTypeRule`)."""
    return ByTypeRule(tensor, int_, float_, bool_, none, tuples, lists, any_, items, objects)


# ---- Triton ------------------------------------------------------------------------------------


def triton_value(*, specialize: bool = True, align: bool = True) -> ByTypeRule:
    """Triton 3.6's specialization of one non-constexpr parameter (``native_specialize_impl``).

    tensor → dtype (+ 16-byte alignment of ``data_ptr()`` when ``specialize and align``);
    int → range class i32/i64/u64, ``== 1`` and ``% 16 == 0`` (per ``specialize``/``align``);
    bool → u1 and float → fp32 (type only: Triton never specializes their values); None; tuples and
    named tuples recursively, their members always fully specialized (as Triton's binder does, even under
    ``do_not_specialize``); objects :func:`jitkey.encode` keys (``jitkey.triton`` registers Triton's
    ``constexpr``, ``dtype``, jit functions, ``triton.reinterpret`` tensors and host
    ``TensorDescriptor`` objects, each keyed as finely as Triton specializes it). The device is not keyed here:
    Triton keys on the *current* device, which the caller folds in (see :func:`triton`).
    """
    full = specialize and align
    return ByTypeRule(
        tensor=TensorRule(dtype=True, align=16 if (specialize and align) else None, device=None),
        int_=IntRule("triton", specialize, align),
        float_=FloatRule(False),
        bool_=BoolRule(False),
        none=True,
        tuples=True,
        items=None if full else triton_value(),
        objects=True,
    )


_UNSPECIALIZED_ANNOTATIONS = ("fp", "bf")


@dataclass(frozen=True)
class TritonParams(Sequence[Param]):
    """The parameters of a Triton kernel as :class:`jitkey.Signature` takes them.

    A sequence of ``(name, rule[, default])``; also carries which parameters are constexprs.
    """

    params: tuple[Param, ...]
    constexprs: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.params)

    @overload
    def __getitem__(self, i: int) -> Param: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Param, ...]: ...
    def __getitem__(self, i: int | slice) -> Param | tuple[Param, ...]:
        return self.params[i]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p[0] for p in self.params)


@functools.cache  # rules are frozen: one object per kind of parameter, shared by every kernel
def _triton_rule(
    is_constexpr: bool, do_not_specialize: bool, do_not_specialize_on_alignment: bool, annotation_type: str
) -> Rule:
    if is_constexpr:
        return ConstexprRule()
    specialize = not do_not_specialize
    if annotation_type and (annotation_type == "u1" or annotation_type[:2] in _UNSPECIALIZED_ANNOTATIONS):
        # Triton never specializes bool/float-annotated parameters: its key is the annotation alone, whatever
        # the argument (an int of any size included, which its launcher converts). Ints are keyed by type
        # here, so no int is outside a range the key could hold.
        rule = triton_value(specialize=False, align=not do_not_specialize_on_alignment)
        return dataclasses.replace(rule, int_=IntRule("type"))
    return triton_value(specialize=specialize, align=not do_not_specialize_on_alignment)


def triton(
    fn: Any = None,
    *,
    params: Iterable[str | tuple[str, dict[str, Any]]] | None = None,
    do_not_specialize: Iterable[int | str] = (),
    do_not_specialize_on_alignment: Iterable[int | str] = (),
) -> TritonParams:
    """Triton's specialization as signature parameters, exactly or finer (checked against the binders of
    Triton 3.6 and 3.9 by the CPU test matrix).

    From a ``triton.JITFunction`` (reads its ``params``: ``is_constexpr``, ``do_not_specialize``,
    ``do_not_specialize_on_alignment``, ``annotation_type``, defaults), or from explicit
    descriptions: ``params=["x", "n", ("BLOCK", {"constexpr": True, "default": 128}),
    ("m", {"annotation": "i32"})]`` plus ``do_not_specialize`` / ``do_not_specialize_on_alignment``
    (indices or names, as ``triton.jit`` takes them).

    Constexprs are keyed by value *and type* (finer than Triton's own key, where ``1``, ``True``
    and ``1.0`` collide). Defaults are applied when a call leaves trailing parameters out.

    What the key does NOT contain, and a binding must fold into ``extra``: the function's identity
    (``id(fn)`` in memory, ``fn.cache_key`` for persistent keys), the current device index
    (``torch._C._cuda_getDevice()``, not the tensors' device), the launch options passed as keyword
    arguments (``tuple(sorted(kwargs.items()))``: num_warps, num_stages, ...), and the knob state
    Triton folds in per call (``fn.debug or knobs.runtime.debug``,
    ``knobs.compilation.instrumentation_mode``, on 3.9 ``knobs.compilation.fpsan_homomorphic_casts``:
    every ``kwargs[...] = knobs.<section>.<attr>`` the installed ``JITFunction.run`` makes, as
    ``jitkey.triton`` detects them; on Triton >= 3.7 whether ``knobs.runtime.add_stages_inspection_hook``
    is set). A ``*args`` parameter (Triton 3.9) is one tuple-valued parameter here. ``extra`` is fixed per signature, so a
    binding keeps one ``Signature`` per distinct (device, options, knobs) tuple (a small dict), and
    passes every parameter positionally or leaves trailing defaulted ones out.
    """
    dns_set = set(do_not_specialize)
    dnsa_set = set(do_not_specialize_on_alignment)
    out: list[Param] = []
    constexprs: list[str] = []
    if fn is not None:
        if params is not None:
            raise TypeError("pass either a JITFunction or params=, not both")
        for kp in fn.params:
            name = kp.name
            is_c = bool(kp.is_constexpr)
            rule = _triton_rule(
                is_c,
                bool(kp.do_not_specialize) or kp.num in dns_set or name in dns_set,
                bool(kp.do_not_specialize_on_alignment) or kp.num in dnsa_set or name in dnsa_set,
                kp.annotation_type if isinstance(kp.annotation_type, str) else "",
            )
            if is_c:
                constexprs.append(name)
            if kp.has_default:
                out.append((name, rule, kp.default))
            else:
                out.append((name, rule))
        return TritonParams(tuple(out), tuple(constexprs))
    if params is None:
        raise TypeError("triton() needs a JITFunction or params=")
    for i, p in enumerate(params):
        if isinstance(p, str):
            name, opts = p, dict[str, Any]()
        else:
            name, opts = p
        unknown = set(opts) - {"constexpr", "annotation", "default"}
        if unknown:
            raise TypeError(f"unknown option(s) for parameter {name!r}: {sorted(unknown)}")
        is_c = bool(opts.get("constexpr", False))
        rule = _triton_rule(
            is_c,
            i in dns_set or name in dns_set,
            i in dnsa_set or name in dnsa_set,
            opts.get("annotation", ""),
        )
        if is_c:
            constexprs.append(name)
        if "default" in opts:
            out.append((name, rule, opts["default"]))
        else:
            out.append((name, rule))
    return TritonParams(tuple(out), tuple(constexprs))


# ---- Helion ------------------------------------------------------------------------------------


def helion_value(*, static_shapes: bool = True) -> ByTypeRule:
    """Helion's bound-kernel key for one argument (``Kernel._specialization_key``).

    tensor → dtype and device type, plus exact sizes and strides (``static_shapes=True``) or every
    size bucketed to ``min(size, 2)`` with the ``numel() > 2**31 - 1`` flag (dynamic shapes);
    int / float / bool → type only; None; str, dtype, device and other keyable values by value;
    tuples and lists recursively (with their type).
    """
    t = (
        TensorRule(dtype=True, align=None, shape="exact", strides="exact", device="type")
        if static_shapes
        else TensorRule(dtype=True, align=None, shape="bucket", device="type", needs_int64=True)
    )
    return ByTypeRule(
        tensor=t,
        int_=IntRule("type"),
        float_=FloatRule(False),
        bool_=BoolRule(False),
        none=True,
        tuples=True,
        lists=True,
        any_=True,
    )


def helion(
    names: Sequence[str] | Any,
    *,
    static_shapes: bool = True,
    constexprs: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
) -> tuple[Param, ...]:
    """Helion's bound-kernel key as signature parameters.

    ``names`` is the kernel's parameter names (or a Python function, whose signature is read;
    ``helion.kernel`` objects expose it as ``.fn``). ``constexprs`` names parameters annotated
    ``hl.constexpr`` (keyed by value). The device *type* is part of each
    tensor's key; the device capability, ``static_shapes`` and any ``key=`` result belong in
    ``extra``.
    """
    if callable(names) and not isinstance(names, (list, tuple)):
        sig = inspect.signature(names)
        defaults = {
            **{n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty},
            **(defaults or {}),
        }
        names = list(sig.parameters)
    defaults = defaults or {}
    cset = set(constexprs)
    value = helion_value(static_shapes=static_shapes)
    out: list[Param] = []
    for n in names:
        rule: Rule = ConstexprRule() if n in cset else value
        out.append((n, rule, defaults[n]) if n in defaults else (n, rule))
    return tuple(out)
