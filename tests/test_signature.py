"""jitkey.Signature: encoding, lookup/insert/get_or_insert, flatten/explain, and every wrong input."""

from __future__ import annotations

import hashlib
import threading
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jitkey  # noqa: E402
from jitkey import MISS, LruCache, Signature, rules  # noqa: E402
from jitkey.errors import ArgumentError, JitKeyError, SignatureError  # noqa: E402

T16 = torch.zeros(32, dtype=torch.float16)
T32 = torch.zeros(4, 8, dtype=torch.float32)


def triton_like() -> Signature:
    return Signature(
        [("x", rules.tensor()), ("n", rules.int_("triton")), ("BLOCK", rules.constexpr(), 128)],
        extra=("kernel", 7),
    )


# ---- lookup / insert ---------------------------------------------------------------------------


def test_lookup_miss_then_hit() -> None:
    sig, cache = triton_like(), LruCache(16)
    assert sig.lookup(cache, (T16, 16)) is MISS
    assert not MISS
    sig.insert(cache, (T16, 16), "kernel-A")
    assert sig.lookup(cache, (T16, 16)) == "kernel-A"
    assert sig.lookup(cache, (T16, 32)) == "kernel-A"  # same %16 bucket
    assert sig.lookup(cache, (T16, 16, 128)) == "kernel-A"  # default applied
    assert sig.lookup(cache, (T16, 17)) is MISS
    assert sig.lookup(cache, (T16, 1)) is MISS
    assert sig.lookup(cache, (T16[1:], 16)) is MISS  # misaligned data pointer
    assert sig.lookup(cache, (T16, 16, 64)) is MISS
    assert sig.lookup(cache, (T16.float(), 16)) is MISS


def test_get_or_insert_runs_factory_once_per_key() -> None:
    sig, cache = triton_like(), LruCache(16)
    calls = []

    def factory() -> str:
        calls.append(1)
        return f"k{len(calls)}"

    assert sig.get_or_insert(cache, (T16, 16), factory) == "k1"
    assert sig.get_or_insert(cache, (T16, 48), factory) == "k1"
    assert sig.get_or_insert(cache, (T16, 17), factory) == "k2"
    assert len(calls) == 2
    with pytest.raises(ZeroDivisionError):
        sig.get_or_insert(cache, (T16, 2**40 + 3), lambda: 1 / 0)
    assert sig.lookup(cache, (T16, 2**40 + 3)) is MISS


def test_signatures_sharing_a_cache_do_not_collide() -> None:
    cache = LruCache(16)
    a = Signature([("n", rules.int_())], extra="a")
    b = Signature([("n", rules.int_())], extra="b")
    c = Signature([("n", rules.int_("type"))], extra="a")
    a.insert(cache, (1,), "A")
    assert b.lookup(cache, (1,)) is MISS
    assert c.lookup(cache, (1,)) is MISS
    assert len({a.encode((1,)), b.encode((1,)), c.encode((1,))}) == 3


def test_encode_digest_and_header() -> None:
    sig = triton_like()
    enc = sig.encode((T16, 16))
    assert enc.startswith(sig.header)
    assert enc[0] == 0x10
    assert sig.header.endswith(jitkey.encode(("kernel", 7)))
    assert sig.digest((T16, 16)) == hashlib.blake2b(jitkey.DIGEST_DOMAIN + enc, digest_size=32).digest()
    assert sig.fast_hash((T16, 16)) == sig.fast_hash((T16, 32))
    assert sig.encode((T16, 16)) == sig.encode((T16.clone(), 16))


def test_flatten_and_explain() -> None:
    sig = triton_like()
    flat = sig.flatten((T16, 16))
    assert flat == (("kernel", 7), ("tensor", "float16", True, "cpu"), ("int", "i32", False, True), (128,))
    assert sig.explain((T16, 16), (T16, 32)) == []
    why = sig.explain((T16, 16), (T16[1:], 1, 64))
    assert why == [
        "x.aligned: True != False",
        "n.equals_1: False != True",
        "n.divisible_by_16: True != False",
        "BLOCK.value: 128 != 64",
    ]
    dyn = Signature([("v", rules.triton_value())])
    assert dyn.explain((T16,), (3,)) != []
    assert dyn.explain((T16,), (3,))[0].startswith("v: ")


def test_tensor_metadata_matches_attribute_path() -> None:
    sig = Signature(
        [
            ("x", rules.tensor(shape="exact", strides="exact", needs_int64=True)),
            ("y", rules.tensor(strides="contiguous")),
        ]
    )
    for t in (T32, T32.t(), T32[1:, ::2], T32[:0], torch.zeros(()), torch.zeros(3, 1, 2).expand(3, 5, 2)):
        flat = sig.flatten((t, t))
        assert flat[1] == (
            "tensor",
            str(t.dtype).removeprefix("torch."),
            t.data_ptr() % 16 == 0,
            tuple(t.shape),
            tuple(t.stride()),
            "cpu",
            t.numel() > 2**31 - 1,
        )
        assert flat[2][-2] == t.is_contiguous()
    bucket = Signature([("x", rules.tensor(shape="bucket", align=None, device=False))])
    assert bucket.flatten((torch.zeros(0, 1, 2, 9),))[1] == ("tensor", "float32", (0, 1, 2, 2))
    assert bucket.encode((torch.zeros(5, 3),)) == bucket.encode((torch.zeros(2, 9),))


def test_parameter_subclass_and_views() -> None:
    sig = Signature([("x", rules.tensor())])
    p = torch.nn.Parameter(torch.zeros(4))
    assert sig.encode((p,)) == sig.encode((torch.zeros(4),))


def test_every_dtype_keys_distinctly() -> None:
    sig = Signature([("x", rules.tensor(align=None, device=False))])
    dts = [getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)]
    keys = {}
    for dt in set(dts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = torch.empty(1, dtype=dt)
        except (RuntimeError, TypeError):
            continue
        keys.setdefault(sig.encode((t,)), set()).add(dt)
    assert all(len(v) == 1 for v in keys.values())


def test_concurrent_lookups_from_threads() -> None:
    sig, cache = Signature([("x", rules.tensor()), ("n", rules.int_())]), LruCache(64)
    for n in range(16):
        sig.insert(cache, (T16, n), n)
    errors = []

    def work() -> None:
        for _ in range(300):
            for n in (1, 2, 3):
                got = sig.lookup(cache, (T16, n))
                if got != n:
                    errors.append((n, got))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


# ---- injectivity (hypothesis) ------------------------------------------------------------------

RULES = [
    rules.int_(),
    rules.int_("triton"),
    rules.int_("type"),
    rules.float_(),
    rules.float_(value=True),
    rules.bool_(),
    rules.bool_(value=False),
    rules.constexpr(),
    rules.any_(),
    rules.triton_value(),
    rules.helion_value(static_shapes=False),
]


def _fits(rule: Any, v: Any) -> bool:
    return True


leaf = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 16, 17, -16, 2**31, 2**63]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.none(),
    st.text(max_size=3),
    st.sampled_from([T16, T16[1:], T32, T32.t()]),
)
value = st.recursive(leaf, lambda c: st.tuples(c, c), max_leaves=4)


def strict(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, x.data_ptr() % 16 == 0, tuple(x.shape), tuple(x.stride()))
    if isinstance(x, float) and x != x:
        return ("float", "nan")
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(strict(i) for i in x))
    return (type(x).__name__, x)


@settings(max_examples=300, deadline=None)
@given(rule=st.sampled_from(RULES), a=value, b=value)
def test_equal_flatten_iff_equal_encoding(rule: Any, a: Any, b: Any) -> None:
    sig = Signature([("p", rule)])
    try:
        ea, fa = sig.encode((a,)), sig.flatten((a,))
        eb, fb = sig.encode((b,)), sig.flatten((b,))
    except ArgumentError:
        return
    assert (ea == eb) == (strict(fa) == strict(fb))
    if strict(a) == strict(b):
        assert ea == eb


@settings(max_examples=200, deadline=None)
@given(a=value, b=value)
def test_constexpr_is_exactly_the_value_encoding(a: Any, b: Any) -> None:
    sig = Signature([("c", rules.constexpr())])
    try:
        ka = jitkey.encode(a)
    except jitkey.UnsupportedKeyError:
        with pytest.raises(ArgumentError, match="'c'"):
            sig.encode((a,))
        return
    assert sig.encode((a,)) == sig.header + ka


# ---- wrong input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((), "got 0; missing 'x'"),
        ((T16,), "got 1; missing 'n'"),
        ((T16, 1, 2, 3), "takes 2 to 3 arguments, got 4"),
        ((3, 16), "'x': expected a torch.Tensor, got int"),
        ((None, 16), "'x': expected a torch.Tensor, got NoneType"),
        ((T16, T16), "'n': expected an int"),
        ((T16, True), "'n': expected an int .bool is not accepted"),
        ((T16, 1.0), "'n': expected an int"),
        ((T16, "16"), "'n': expected an int"),
        ((T16, 2**64), r"'n': int outside \[-2\*\*63, 2\*\*64\)"),
        ((T16, -(2**63) - 1), r"'n': int outside \[-2\*\*63, 2\*\*64\)"),
        ((T16, 16, [128]), "'BLOCK': cannot key a value of type 'list'"),
        ((T16, 16, object()), "'BLOCK': cannot key"),
    ],
)
def test_wrong_arguments_raise_argument_error(args: tuple[Any, ...], match: str) -> None:
    sig, cache = triton_like(), LruCache(4)
    for call in (
        lambda: sig.encode(args),
        lambda: sig.digest(args),
        lambda: sig.lookup(cache, args),
        lambda: sig.insert(cache, args, 1),
        lambda: sig.get_or_insert(cache, args, lambda: 1),
        lambda: sig.flatten(args),
    ):
        with pytest.raises(ArgumentError, match=match) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, JitKeyError)
    assert len(cache) == 0


@pytest.mark.parametrize(
    ("rule", "bad", "match"),
    [
        (rules.bool_(), 1, "expected a bool"),
        (rules.bool_(value=False), 0, "expected a bool"),
        (rules.float_(), 1, "expected a float"),
        (rules.float_(value=True), True, "expected a float"),
        (rules.none(), 0, "expected None"),
        (rules.int_("value"), 1.5, "expected an int"),
        (rules.int_("type"), False, "expected an int"),
        (rules.tensor(), [1], "expected a torch.Tensor"),
        (rules.triton_value(), "s", "expected torch.Tensor, int, float, bool, None, tuple of these"),
        (rules.triton_value(), [1], "expected torch.Tensor"),
        (rules.triton_value(), (1, (2, "s")), r"'p'\[1\]\[1\]: expected"),
        (rules.by_type(int_=rules.int_()), 1.0, "expected int"),
        (rules.by_type(), 1, "accepts no type"),
        (rules.any_(), {1: 2}, "cannot key a value of type 'dict'"),
        (rules.tensor(shape="exact"), torch.zeros(2).expand(2), None),
    ],
)
def test_rule_type_errors(rule: Any, bad: Any, match: str | None) -> None:
    sig = Signature([("p", rule)])
    if match is None:
        sig.encode((bad,))  # accepted
        return
    with pytest.raises(ArgumentError, match=match):
        sig.encode((bad,))


def test_args_must_be_a_tuple() -> None:
    sig = triton_like()
    with pytest.raises(TypeError):
        sig.encode([T16, 16])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sig.lookup({}, (T16, 16))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "extra", "match"),
    [
        ([("x", object())], (), "is not a jitkey rule"),
        ([("x", ("nope",))], (), "unknown rule kind"),
        ([("x", ("tensor", True))], (), "needs 7 items"),
        ([("x", rules.tensor(align=3))], (), "power of two"),
        ([("x", rules.TensorRule(shape="exactly"))], (), "shape must be"),  # type: ignore[arg-type]
        ([("x", rules.int_("bucket"))], (), "int mode must be"),  # type: ignore[arg-type]
        ([("x", rules.int_()), ("x", rules.int_())], (), "duplicate parameter name"),
        ([("x", rules.int_(), 1), ("y", rules.int_())], (), "without a default follows"),
        ([("x", rules.int_(), "s")], (), "default of parameter 'x'"),
        ([("x",)], (), "must be a .name, rule"),
        ([["x", rules.int_()]], (), "must be a .name, rule"),
        ([(1, rules.int_())], (), "name must be a str"),
        ([("x", rules.int_())], [1], "extra is not keyable"),
        (5, (), "params must be a sequence"),
        ([("x", rules.ByTypeRule(lists=True))], (), "lists need tuples"),
    ],
)
def test_bad_signatures_raise_signature_error(params: Any, extra: Any, match: str) -> None:
    with pytest.raises(SignatureError, match=match) as info:
        Signature(params, extra=extra)
    assert isinstance(info.value, TypeError)


def test_repr_len_names() -> None:
    sig = triton_like()
    assert repr(sig) == "Signature(x, n, BLOCK)"
    assert len(sig) == 3
    assert sig.names == ("x", "n", "BLOCK")
    assert sig.extra == ("kernel", 7)
    assert Signature([]).encode(()) == Signature([]).header


def test_device_cache_distinguishes_devices() -> None:
    """Devices are resolved through a table of canonical torch.device objects; check it stays exact."""
    sig = Signature([("x", rules.tensor(align=None))])
    cpu, meta = torch.zeros(2), torch.zeros(2, device="meta")
    for _ in range(3):  # first call fills the table, later calls hit it
        assert sig.flatten((cpu,))[1] == ("tensor", "float32", "cpu")
        assert sig.flatten((meta,))[1] == ("tensor", "float32", "meta")
    assert sig.encode((cpu,)) != sig.encode((meta,))
    typed = Signature([("x", rules.tensor(align=None, device="type"))])
    assert typed.flatten((meta,))[1] == ("tensor", "float32", "meta")
    assert typed.encode((cpu,)) != typed.encode((meta,))
