"""jitkey.rules.helion against a pure-Python reference of Helion's bound-kernel key.

The reference follows Helion's ``Kernel._base_specialization_key`` / ``_specialization_extractors``
(pytorch/helion ``helion/runtime/kernel.py``): tensors → ``(dtype, size, stride)`` with static
shapes, else ``(dtype, sizes bucketed to min(size, 2), numel > 2**31 - 1)``; int/float/bool → their
type; str/dtype/device/None → the value; list/tuple → ``(type, items)``; constexpr parameters → the
value; plus the device type of the first tensor. Two calls with equal jitkey keys must have equal
reference keys (jitkey may be finer: it keys the device type per tensor).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jitkey import Signature, rules  # noqa: E402
from jitkey.errors import ArgumentError  # noqa: E402


def strict(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(strict(i) for i in x))
    return (type(x).__name__, x)


def _value_key(v: Any, static_shapes: bool) -> Any:
    if isinstance(v, torch.Tensor):
        if static_shapes:
            return (v.dtype, tuple(v.size()), tuple(v.stride()))
        return (v.dtype, tuple(min(s, 2) for s in v.size()), v.numel() > rules.HELION_INT32_INDEX_LIMIT)
    if type(v) in (int, float, bool):
        return type(v)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_value_key(i, static_shapes) for i in v))
    if v is None or isinstance(v, (str, torch.dtype, torch.device)):
        return v
    raise TypeError(f"unsupported argument type: {type(v).__name__}")


def helion_reference_key(args: tuple[Any, ...], static_shapes: bool, constexpr_idx: set[int]) -> Any:
    result: list[Any] = []
    device_type = None
    for i, v in enumerate(args):
        if i in constexpr_idx:
            result.append(v)
            continue
        if device_type is None and isinstance(v, torch.Tensor):
            device_type = v.device.type
        result.append(_value_key(v, static_shapes))
    return strict((*result, device_type))


BASE = {dt: torch.zeros(4, 6, 8, dtype=dt) for dt in (torch.float16, torch.float32, torch.bfloat16)}


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    t = BASE[draw(st.sampled_from(list(BASE)))]
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return t
    if kind == 1:
        return t[draw(st.integers(0, 4)) :]
    if kind == 2:
        return t.transpose(0, 2)
    if kind == 3:
        return t[:, draw(st.integers(0, 6)) :, :1]
    if kind == 4:
        return t.reshape(-1)[: draw(st.integers(0, 3))]
    return t[0, 0, draw(st.integers(0, 8)) :]


scalars = st.one_of(
    tensors(),
    st.integers(-3, 3),
    st.booleans(),
    st.floats(-2, 2),
    st.none(),
    st.sampled_from(["a", "b"]),
    st.sampled_from([torch.float16, torch.float32]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.tuples(scalars, scalars))


@pytest.mark.parametrize("static_shapes", [True, False])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_never_coarser_than_helion(static_shapes: bool, data: st.DataObject) -> None:
    n = 4
    constexpr_idx = {3}
    sig = Signature(
        rules.helion(["a", "b", "c", "K"], static_shapes=static_shapes, constexprs=["K"]),
        extra=("helion", static_shapes),
    )
    pool = data.draw(
        st.lists(
            st.tuples(values, values, values, st.sampled_from([1, 2, True, 1.0])), min_size=2, max_size=6
        )
    )
    choices = data.draw(
        st.lists(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n), max_size=25)
    )
    calls = pool + [tuple(pool[j][i] for i, j in enumerate(c)) for c in choices]
    groups: dict[bytes, Any] = {}
    for args in calls:
        ref = helion_reference_key(args, static_shapes, constexpr_idx)
        key = sig.encode(args)
        if key in groups:
            assert groups[key][0] == ref, f"{groups[key][1]!r} vs {args!r}"
        else:
            groups[key] = (ref, args)


def test_exact_on_cpu_tensors_and_scalars() -> None:
    """On one device type jitkey's partition equals Helion's (no needless misses)."""
    sig = Signature(rules.helion(["a", "b"], static_shapes=False))
    vals: list[Any] = [
        BASE[torch.float16],
        BASE[torch.float16][:1],
        BASE[torch.float16][:0],
        BASE[torch.float32],
    ]
    vals += [1, 2, True, 0.5, None, "a"]
    by_ref: dict[Any, set[bytes]] = defaultdict(set)
    for a in vals:
        for b in vals:
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                by_ref[helion_reference_key((a, b), False, set())].add(sig.encode((a, b)))
    assert all(len(v) == 1 for v in by_ref.values())


def test_static_shapes_key_sizes_and_strides_exactly() -> None:
    sig = Signature(rules.helion(["x"], static_shapes=True))
    t = BASE[torch.float32]
    # Same sizes, different strides: different keys.
    u = t.transpose(0, 2).contiguous().transpose(0, 2)
    assert u.shape == t.shape and u.stride() != t.stride()
    assert sig.encode((t,)) != sig.encode((u,))
    assert sig.encode((t[:, :5],)) != sig.encode((t[:, :4],))
    assert sig.flatten((t,))[1] == ("tensor", "float32", (4, 6, 8), (48, 8, 1), "cpu")
    dyn = Signature(rules.helion(["x"], static_shapes=False))
    assert dyn.encode((t[:, :5],)) == dyn.encode((t[:, :4],))
    assert dyn.encode((t[:, :1],)) != dyn.encode((t[:, :2],))
    assert dyn.flatten((t[:, :1],))[1] == ("tensor", "float32", (2, 1, 2), "cpu", False)


def test_helion_from_function_reads_defaults() -> None:
    def kern(x: Any, y: Any, block: int = 64) -> None:
        pass

    sig = Signature(rules.helion(kern, constexprs=["block"]))
    t = BASE[torch.float16]
    assert sig.names == ("x", "y", "block")
    assert sig.encode((t, t)) == sig.encode((t, t, 64))
    assert sig.encode((t, t)) != sig.encode((t, t, 128))


def test_helion_unsupported_argument_raises() -> None:
    sig = Signature(rules.helion(["x"]))
    with pytest.raises(ArgumentError, match="'x'"):
        sig.encode(({"a": 1},))
    with pytest.raises(ArgumentError, match=r"'x'\[1\]"):
        sig.encode(([1, object()],))
