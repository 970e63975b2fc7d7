"""jitkey.rules.triton against Triton 3.6's own binder, on the CPU.

The oracle is Triton itself: ``create_function_from_signature`` builds the exact binder
``JITFunction.run`` uses (it calls the C++ ``native_specialize_impl``) with a real
``CUDABackend`` object; no GPU is needed for specialization. The property: two argument lists get
the same jitkey key only if Triton's binder gives them the same specialization (jitkey may be
finer, never coarser). For unannotated dynamic parameters jitkey is also checked to be no finer
than Triton (beyond dtype and 1/True/1.0 tagging), so the cache does not miss needlessly.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import jitkey  # noqa: E402
from jitkey import Signature, rules  # noqa: E402
from jitkey.errors import ArgumentError  # noqa: E402

BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))


@triton.jit
def k_plain(a, b, c, d):
    pass


@triton.jit(do_not_specialize=["n", 4], do_not_specialize_on_alignment=["y", "m"])
def k_flags(x, y, n, m, q, C: tl.constexpr, D: tl.constexpr = 3):
    pass


@triton.jit
def k_ann(p: "*fp16", i: tl.int32, f: tl.float32, b: tl.int1, kp: "*kfp32", q):  # noqa: F722
    pass


KERNELS = [k_plain, k_flags, k_ann]


def binder_of(fn: Any) -> Any:
    return create_function_from_signature(fn.signature, fn.params, BACKEND)


def strict(x: Any) -> Any:
    """Type-tagged form of a specialization, so 1, True and 1.0 never compare equal."""
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(strict(i) for i in x))
    return (type(x).__name__, x)


def triton_spec(binder: Any, args: tuple[Any, ...]) -> Any:
    _, spec, _ = binder(*args)
    return strict(spec)


# ---- argument strategies -----------------------------------------------------------------------

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
BASES = {dt: torch.zeros(64, dtype=dt) for dt in DTYPES}

INT_ANCHORS = [0, 1, 15, 16, 2**31, 2**63, 2**64 - 1]


def _ints() -> st.SearchStrategy[int]:
    near = st.builds(
        lambda a, d, s: s * a + d, st.sampled_from(INT_ANCHORS), st.integers(-2, 2), st.sampled_from([1, -1])
    )
    return st.one_of(near, st.integers(-(2**63), 2**64 - 1), st.integers(-40, 40))


def _in_triton_range(v: int) -> bool:
    return -(2**63) <= v < 2**64


tensors = st.builds(lambda dt, off: BASES[dt][off:], st.sampled_from(DTYPES), st.integers(0, 17))
ints = _ints().filter(_in_triton_range)
scalars = st.one_of(
    tensors, ints, st.booleans(), st.floats(allow_nan=True), st.sampled_from([0.0, 1.0, -0.0]), st.none()
)
dyn_values = st.one_of(scalars, st.tuples(scalars, scalars), st.tuples(scalars, st.tuples(scalars)))
constexpr_values = st.one_of(
    st.integers(-3, 20),
    st.booleans(),
    st.sampled_from([1.0, 0.5, 16.0]),
    st.none(),
    st.sampled_from(["a", "b", "1"]),
)


def args_for(fn: Any) -> st.SearchStrategy[tuple[Any, ...]]:
    parts = []
    for kp in fn.params:
        if kp.is_constexpr:
            if kp.has_default:
                parts.append(st.one_of(st.just(kp.default), constexpr_values))
            else:
                parts.append(constexpr_values)
        else:
            parts.append(dyn_values)
    return st.tuples(*parts)


def check_not_coarser(
    fn: Any, arglists: list[tuple[Any, ...]], sig: Signature | None = None
) -> dict[bytes, Any]:
    sig = sig or Signature(rules.triton(fn), extra=("k", id(fn)))
    binder = binder_of(fn)
    groups: dict[bytes, Any] = {}
    for args in arglists:
        try:
            spec = triton_spec(binder, args)
        except (KeyError, TypeError, OverflowError):
            # Triton cannot take these arguments; jitkey must refuse them too, or key them on its own.
            continue
        key = sig.encode(args)
        if key in groups:
            assert groups[key][0] == spec, (
                f"jitkey gave one key to two calls Triton specializes differently:\n"
                f"  {groups[key][1]!r}\n  {args!r}\n  {groups[key][0]}\n  {spec}"
            )
        else:
            groups[key] = (spec, args)
    return groups


@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_never_coarser_than_triton(fn: Any, data: st.DataObject) -> None:
    # Many calls per example, from a small pool of values, so that equal keys actually happen.
    pool = data.draw(st.lists(args_for(fn), min_size=2, max_size=6))
    arglists = data.draw(
        st.lists(
            st.lists(st.integers(0, len(pool) - 1), min_size=len(fn.params), max_size=len(fn.params)),
            min_size=5,
            max_size=25,
        )
    )
    calls = [tuple(pool[j][i] for i, j in enumerate(choice)) for choice in arglists]
    check_not_coarser(fn, calls + pool)


def test_exhaustive_anchor_grid() -> None:
    """Every int anchor, bool, float, None and aligned/unaligned tensor in every position."""
    values: list[Any] = []
    for a in INT_ANCHORS:
        values += [a - 1, a, a + 1, -a]
    values += [True, False, 1.0, 0.0, None, BASES[torch.float16], BASES[torch.float16][1:]]
    values += [BASES[torch.float16][8:], BASES[torch.float32][4:], BASES[torch.bool]]
    values = [v for v in values if not isinstance(v, int) or _in_triton_range(v)]
    calls = [(v, w, v, w) for v in values for w in values]
    groups = check_not_coarser(k_plain, calls)
    # Exactness on unannotated parameters: Triton-equal calls get jitkey-equal keys.
    by_spec: dict[Any, set[bytes]] = defaultdict(set)
    for key, (spec, _) in groups.items():
        by_spec[spec].add(key)
    assert all(len(keys) == 1 for keys in by_spec.values()), "jitkey is finer than Triton here"


@pytest.mark.parametrize(
    "coarse",
    [
        rules.by_type(
            tensor=rules.tensor(align=None, device=False),
            int_=rules.int_("triton"),
            float_=rules.float_(),
            bool_=rules.bool_(value=False),
            none=True,
        ),
        rules.by_type(
            tensor=rules.tensor(device=False),
            int_=rules.int_("triton", align=False),
            float_=rules.float_(),
            bool_=rules.bool_(value=False),
            none=True,
        ),
        rules.by_type(
            tensor=rules.tensor(device=False),
            int_=rules.int_("type"),
            float_=rules.float_(),
            bool_=rules.bool_(value=False),
            none=True,
        ),
    ],
    ids=["no-tensor-alignment", "no-int-%16", "int-type-only"],
)
def test_oracle_catches_a_coarser_rule(coarse: Any) -> None:
    """The differential check above can fail: a deliberately coarser rule set is caught."""
    sig = Signature([(n, coarse) for n in ("a", "b", "c", "d")])
    t = BASES[torch.float16]
    calls = [(v, t, t, t) for v in (t, t[1:], 16, 17, 1, 2**31 + 16, 2**31 + 1)]
    with pytest.raises(AssertionError, match="Triton specializes differently"):
        check_not_coarser(k_plain, calls, sig)


def test_bool_int_float_are_distinct() -> None:
    sig = Signature(rules.triton(k_plain))
    t = BASES[torch.float16]
    keys = {sig.encode((v, t, t, t)) for v in (1, True, 1.0)}
    assert len(keys) == 3
    # Constexprs are tagged with their type too (Triton's own key aliases these).
    sig2 = Signature(rules.triton(k_flags))
    k1 = {sig2.encode((t, t, 1, 1, 1, c)) for c in (1, True, 1.0)}
    assert len(k1) == 3


def test_params_from_descriptions_match_jit_function() -> None:
    from_fn = Signature(rules.triton(k_flags))
    described = Signature(
        rules.triton(
            params=[
                "x",
                "y",
                "n",
                "m",
                "q",
                ("C", {"constexpr": True}),
                ("D", {"constexpr": True, "default": 3}),
            ],
            do_not_specialize=["n", 4],
            do_not_specialize_on_alignment=["y", "m"],
        )
    )
    assert from_fn.header == described.header
    ann = Signature(
        rules.triton(
            params=["p", ("i", {"annotation": "i32"}), ("f", {"annotation": "fp32"}), "b", "kp", "q"]
        )
    )
    # b is annotated u1 in k_ann, so it is not specialized there: the headers differ.
    assert ann.header != Signature(rules.triton(k_ann)).header
    assert rules.triton(k_flags).constexprs == ("C", "D")
    assert rules.triton(k_flags).names == ("x", "y", "n", "m", "q", "C", "D")


def test_defaults_applied_like_triton() -> None:
    sig = Signature(rules.triton(k_flags))
    t = BASES[torch.float32]
    assert sig.encode((t, t, 5, 5, 5, 1)) == sig.encode((t, t, 5, 5, 5, 1, 3))
    assert sig.encode((t, t, 5, 5, 5, 1)) != sig.encode((t, t, 5, 5, 5, 1, 4))


def test_values_triton_cannot_take_raise() -> None:
    sig = Signature(rules.triton(k_plain))
    t = BASES[torch.float16]
    binder = binder_of(k_plain)
    for bad in (2**64, -(2**63) - 1, [1], "s", torch.zeros(2, dtype=torch.complex64)):
        with pytest.raises((KeyError, TypeError, OverflowError)):
            binder(bad, t, t, t)
        if isinstance(bad, torch.Tensor):
            # Triton fails on the dtype name; jitkey keys the dtype faithfully (finer, not wrong).
            sig.encode((bad, t, t, t))
            continue
        with pytest.raises(ArgumentError, match="'a'"):
            sig.encode((bad, t, t, t))


def test_triton_rules_type_errors() -> None:
    with pytest.raises(TypeError):
        rules.triton()
    with pytest.raises(TypeError):
        rules.triton(k_plain, params=["a"])
    with pytest.raises(TypeError, match="unknown option"):
        rules.triton(params=[("a", {"constexp": True})])


def test_jitkey_package_exports() -> None:
    assert jitkey.rules is rules
    assert repr(jitkey.MISS) == "jitkey.MISS"


def test_triton_types_are_keyable_once_jitkey_triton_is_imported() -> None:
    """The key adapters of Triton's types are registered at import, not at the first decoration."""
    import subprocess
    import sys

    code = (
        "import jitkey, jitkey.triton, triton.language as tl\n"
        "assert jitkey.triton.kernels_made() == 0\n"
        "a, b = jitkey.digest(tl.constexpr(3)), jitkey.digest(tl.constexpr(4))\n"
        "assert a != b and jitkey.digest(tl.float16) != jitkey.digest(tl.bfloat16)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
