"""Regenerate ``keys.json``, the committed test vectors of the key encoding (format v2).

Run only for a deliberate format change (which also bumps FORMAT_VERSION and DIGEST_DOMAIN), or to pin a leaf added
to the format that no earlier key could contain (every earlier vector must come out unchanged):
``python tests/vectors/make_vectors.py > tests/vectors/keys.json``. The encodings come from the
pure-Python reference (``jitkey._reference``), not from the Rust code under test.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/python")

import vectors  # tests/vectors/vectors.py (this script's folder is first on sys.path)
from jitkey import _reference as ref


class _Obj:
    """Stand-in for a user type with ``__jitkey__``: built from a JSON description."""


def spec(kind: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"t": kind}
    if v is not None or kind in ("bool",):
        d["v"] = v
    d.update(kw)
    return d


def to_python(s: dict[str, Any]) -> Any:
    """The Python value of a spec without torch types (``vectors.value``, the decoder the tests use)."""
    if s["t"] in ("dtype", "device", "layout", "memory_format", "object"):
        raise ValueError(s["t"])
    return vectors.value(s)


def I(n: int) -> dict[str, Any]:  # noqa: E743
    d = spec("int", str(n))
    if not -(2**63) <= n < 2**63:
        # Two's complement little-endian, so Rust can build the value without a bignum library.
        d["le"] = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True).hex()
    return d


F = lambda x: spec("float", bits=f"{struct.unpack('<Q', struct.pack('<d', x))[0]:016x}")  # noqa: E731
S = lambda x: spec("str", x)  # noqa: E731
T = lambda *xs: spec("tuple", list(xs))  # noqa: E731

CASES: list[dict[str, Any]] = [
    spec("none"),
    spec("bool", True),
    spec("bool", False),
    I(0),
    I(1),
    I(-1),
    I(16),
    I(2**31),
    I(2**63 - 1),
    I(-(2**63)),
    I(2**63),
    I(-(2**63) - 1),
    I(2**64),
    I(-(2**71)),
    I(-(2**72)),
    I(3**100),
    F(1.0),
    F(0.0),
    F(-0.0),
    F(float("inf")),
    F(float("nan")),
    spec("float", bits="7ff0000000000001"),  # a signalling NaN: canonicalised
    S(""),
    S("1"),
    S("float32"),
    S("héllo ✓ 𝄞"),
    spec("bytes", hex=""),
    spec("bytes", hex="31"),
    T(),
    T(I(1)),
    T(T()),
    T(S("*fp16"), S("D")),
    T(T(S("*fp16"), S("D")), T(S("*fp32"), S("")), T(S("i32"), S("D")), T(S("constexpr"), I(1024)), I(4)),
    T(spec("none"), spec("bool", True), I(1), F(1.0), S("1"), spec("bytes", hex="31")),
]

# Leaves that need torch or a user type are pinned by their reference encoding only (the JSON
# spec names how the test builds them).
EXTRA: list[dict[str, Any]] = [
    {"t": "dtype", "v": "float32"},
    {"t": "dtype", "v": "bfloat16"},
    {"t": "device", "type": "cuda", "index": 0},
    {"t": "device", "type": "cpu", "index": None},
    # Added to format v2 later (0x0C, 0x0D): values that had no encoding before.
    {"t": "layout", "v": "strided"},
    {"t": "layout", "v": "sparse_coo"},
    {"t": "memory_format", "v": "channels_last"},
    {"t": "memory_format", "v": "contiguous_format"},
    {"t": "object", "module": "examples", "qualname": "Point", "v": T(I(1), I(2))},
    # One dotted name, two types (v1 keyed both as "pkg.sub.K"): format v2 keeps them apart.
    {"t": "object", "module": "pkg.sub", "qualname": "K", "v": I(1)},
    {"t": "object", "module": "pkg", "qualname": "sub.K", "v": I(1)},
    {"t": "object", "module": "__main__", "qualname": "P", "v": spec("none")},
    {"t": "object", "module": "builtins", "qualname": "P", "v": spec("none")},
]


def encode_spec(s: dict[str, Any]) -> bytes:
    t = s["t"]
    named = {"dtype": ref.T_DTYPE, "layout": ref.T_LAYOUT, "memory_format": ref.T_MEMORY_FORMAT}
    if t in named:  # a short-name leaf: tag, u8 length, ASCII name
        name = s["v"].encode()
        return bytes([named[t], len(name)]) + name
    if t == "device":
        ty = s["type"].encode()
        idx = -1 if s["index"] is None else s["index"]
        return bytes([ref.T_DEVICE, len(ty)]) + ty + struct.pack("<q", idx)
    if t == "object":
        return ref.object_header(s["module"], s["qualname"]) + encode_spec(s["v"])
    return ref.encode(to_python(s))


def main() -> None:
    import hashlib

    out = []
    for s in CASES + EXTRA:
        enc = encode_spec(s)
        out.append(
            {
                "value": s,
                "encoding": enc.hex(),
                "digest": hashlib.blake2b(ref.DIGEST_DOMAIN + enc, digest_size=32).hexdigest(),
            }
        )
    doc = {"format_version": ref.FORMAT_VERSION, "domain": ref.DIGEST_DOMAIN.hex(), "vectors": out}
    json.dump(doc, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
