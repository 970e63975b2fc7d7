"""jitkey.encode / digest / fast_hash: the canonical key encoding (format v2)."""

from __future__ import annotations

import hashlib
import json
import math
import struct
import subprocess
import sys
from collections import namedtuple
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jitkey
from jitkey import _reference
from jitkey.errors import JitKeyError, KeyDepthError, UnsupportedKeyError

sys.path.insert(0, str(Path(__file__).parent / "vectors"))
import vectors  # tests/vectors/vectors.py: the committed vectors and their decoder

VECTORS = vectors.load()


# ---- test vectors ------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: json.dumps(v["value"])[:60])
def test_committed_vectors(vector: dict[str, Any]) -> None:
    assert vectors.mismatches(jitkey, vector) == []


def test_vector_file_header_matches_the_build() -> None:
    assert VECTORS["format_version"] == jitkey.FORMAT_VERSION
    assert bytes.fromhex(VECTORS["domain"]) == jitkey.DIGEST_DOMAIN


def test_digest_is_blake2b_256_over_domain_and_encoding() -> None:
    value = (torch.float16, 16, True, "D", None, 2.5, b"x")
    expected = hashlib.blake2b(jitkey.DIGEST_DOMAIN + jitkey.encode(value), digest_size=32).digest()
    assert jitkey.digest(value) == expected
    assert len(expected) == 32


# ---- distinctness ------------------------------------------------------------------------------


def test_lookalikes_all_encode_differently() -> None:
    values = [True, 1, 1.0, "1", b"1", (1,), torch.float32, "float32", None, False, 0, 0.0, -0.0, (), ""]
    encodings = [jitkey.encode(v) for v in values]
    assert len(set(encodings)) == len(values)
    digests = {jitkey.digest(v) for v in values}
    assert len(digests) == len(values)


def test_nan_is_canonical() -> None:
    quiet = float("nan")
    other = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]
    assert math.isnan(other)
    assert jitkey.encode(quiet) == jitkey.encode(other) == jitkey.encode(-quiet)


def test_bigints_round_the_i64_boundary() -> None:
    for n in [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -(2**71), -(2**72), 7**200, -(7**200)]:
        assert jitkey.encode(n) == _reference.encode(n)
    assert jitkey.encode(2**63) != jitkey.encode(2**63 - 1)


def test_torch_devices_and_dtypes() -> None:
    assert jitkey.encode(torch.device("cuda", 0)) != jitkey.encode(torch.device("cuda", 1))
    assert jitkey.encode(torch.device("cuda")) != jitkey.encode(torch.device("cuda", 0))
    assert jitkey.encode(torch.device("cpu")) == _reference.encode(torch.device("cpu"))
    for dt in [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int64, torch.bool]:
        assert jitkey.encode(dt) == _reference.encode(dt)
    assert len({jitkey.encode(dt) for dt in [torch.float16, torch.bfloat16, torch.half]}) == 2


def test_torch_layouts_and_memory_formats() -> None:
    """``torch.layout`` / ``torch.memory_format`` (a DSL's ``layout=`` / ``memory_format=`` arguments) have their own
    leaves: every value apart, apart from strings and dtypes of the same spelling, and from a class that only calls
    itself ``torch.layout`` (its ``__jitkey__`` names the same layout); as the reference encodes them."""
    values = [
        *(getattr(torch, n) for n in ("strided", "sparse_coo", "sparse_csr", "_mkldnn")),
        *(
            getattr(torch, n)
            for n in ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
        ),
    ]
    encodings = [jitkey.encode(v) for v in values]
    assert len(set(encodings)) == len(values)
    for v, e in zip(values, encodings, strict=True):
        assert e == _reference.encode(v)
        assert e != jitkey.encode(str(v).removeprefix("torch.")) and e != jitkey.encode(str(v))
    assert jitkey.encode(torch.legacy_contiguous_format) == jitkey.encode(
        torch.contiguous_format
    )  # one object

    impostor = type("layout", (), {"__module__": "torch", "__jitkey__": lambda self: "strided"})
    assert jitkey.encode(impostor()) != jitkey.encode(torch.strided)
    assert jitkey.encode((torch.strided, torch.float32)) == _reference.encode((torch.strided, torch.float32))


class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __jitkey__(self) -> tuple[int, int]:
        return (self.x, self.y)


class Other:
    def __jitkey__(self) -> tuple[int, int]:
        return (1, 2)


def test_jitkey_protocol() -> None:
    assert jitkey.encode(Point(1, 2)) == jitkey.encode(Point(1, 2))
    assert jitkey.encode(Point(1, 2)) != jitkey.encode(Point(2, 1))
    # Same __jitkey__ value, different type: different keys.
    assert jitkey.encode(Point(1, 2)) != jitkey.encode(Other())
    assert jitkey.encode(Point(1, 2)) != jitkey.encode((1, 2))
    assert jitkey.encode(Point(1, 2)) == _reference.encode(Point(1, 2))


# ---- errors ------------------------------------------------------------------------------------


class Plain:
    pass


class MyInt(int):
    pass


class Color(IntEnum):
    RED = 1


class MyStr(str):
    pass


NT = namedtuple("NT", "a b")


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ([1, 2], "list"),
        ({"a": 1}, "dict"),
        ({1}, "set"),
        (frozenset({1}), "frozenset"),
        (bytearray(b"x"), "bytearray"),
        (Plain(), "Plain"),
        (MyInt(1), "MyInt"),
        (Color.RED, "Color"),
        (MyStr("x"), "MyStr"),
        (NT(1, 2), "NT"),
        (1j, "complex"),
        (object(), "object"),
        (torch.zeros(2), "Tensor"),
        (print, "builtin_function_or_method"),
    ],
)
def test_unsupported_types_raise_naming_type_and_position(value: object, type_name: str) -> None:
    for fn in (jitkey.encode, jitkey.digest, jitkey.fast_hash):
        with pytest.raises(UnsupportedKeyError, match=type_name) as info:
            fn(value)
        assert "at value" in str(info.value)
        with pytest.raises(UnsupportedKeyError, match=r"at value\[1\]\[0\]"):
            fn((1, (value,)))
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, JitKeyError)


def test_lone_surrogate_is_refused_not_mangled() -> None:
    with pytest.raises(UnsupportedKeyError, match="surrogate"):
        jitkey.encode(("ok", "\ud800"))


def test_jitkey_method_errors_propagate_as_cause() -> None:
    class Boom:
        def __jitkey__(self) -> object:
            raise RuntimeError("no key for you")

    with pytest.raises(UnsupportedKeyError, match=r"value\[0\]\.__jitkey__\(\)") as info:
        jitkey.encode((Boom(),))
    assert isinstance(info.value.__cause__, RuntimeError)

    class ReturnsList:
        def __jitkey__(self) -> object:
            return [1]

    with pytest.raises(UnsupportedKeyError, match=r"'list' at value\.__jitkey__\(\)"):
        jitkey.encode(ReturnsList())


def test_depth_limit() -> None:
    value: Any = 1
    for _ in range(jitkey.MAX_DEPTH):
        value = (value,)
    assert jitkey.encode(value) == _reference.encode(value)
    with pytest.raises(KeyDepthError):
        jitkey.encode((value,))
    with pytest.raises(ValueError):  # KeyDepthError is a ValueError
        jitkey.digest((value,))


def test_self_referential_jitkey_is_stopped_by_the_depth_limit() -> None:
    class Loop:
        def __jitkey__(self) -> object:
            return self

    with pytest.raises(KeyDepthError):
        jitkey.encode(Loop())


def test_reentrant_encode_from_jitkey() -> None:
    class Nested:
        def __jitkey__(self) -> object:
            return jitkey.encode((1, "inner"))

    assert jitkey.encode(Nested()) == _reference.encode(Nested())


# ---- properties --------------------------------------------------------------------------------

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 15, 16, 2**31, 2**63, -(2**63)]),
    st.floats(allow_nan=True),
    st.sampled_from([0.0, -0.0, 1.0]),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([torch.float16, torch.float32, torch.bfloat16, torch.int32]),
)
trees = st.recursive(
    leaves, lambda inner: st.tuples(inner) | st.lists(inner, max_size=4).map(tuple), max_leaves=12
)


def same_tree(a: Any, b: Any) -> bool:
    """Type-aware equality: what 'the same key' means."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


@settings(max_examples=1500, deadline=None)
@given(trees, trees)
def test_equal_encodings_iff_same_tree(a: Any, b: Any) -> None:
    assert (jitkey.encode(a) == jitkey.encode(b)) == same_tree(a, b)


@settings(max_examples=800, deadline=None)
@given(trees)
def test_matches_reference_and_hashes_are_consistent(a: Any) -> None:
    enc = jitkey.encode(a)
    assert enc == _reference.encode(a)
    assert jitkey.digest(a) == _reference.digest(a)
    assert jitkey.fast_hash(a) == jitkey.fast_hash(a)


def test_fast_hash_is_process_seeded_but_digest_is_stable() -> None:
    code = (
        "import jitkey, torch, sys; v = (torch.float16, 16, True, 'D', (1, 2.5, None), b'x', 2**70); "
        "sys.stdout.write(jitkey.digest(v).hex() + ' ' + str(jitkey.fast_hash(v)))"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    value = (torch.float16, 16, True, "D", (1, 2.5, None), b"x", 2**70)
    assert outs[0][0] == outs[1][0] == jitkey.digest(value).hex()
    # 64-bit seeded hashes of two processes agree with probability 2**-64.
    assert outs[0][1] != outs[1][1]
