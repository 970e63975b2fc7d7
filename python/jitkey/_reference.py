"""A pure-Python reference of the canonical key encoding (format v2).

It is the oracle the tests compare the Rust encoder against, and a readable statement of the
format (the table is in ``rust/core/src/key.rs``). Not used on any hot path.
"""

from __future__ import annotations

import hashlib
import math
import struct
import sys
from typing import Any

from jitkey.errors import KeyDepthError, UnsupportedKeyError

FORMAT_VERSION = 2
DIGEST_DOMAIN = b"jitkey/key/v2\x00"
MAX_DEPTH = 64

T_NONE, T_FALSE, T_TRUE, T_INT, T_BIGINT, T_FLOAT = 0, 1, 2, 3, 4, 5
T_STR, T_BYTES, T_TUPLE, T_DTYPE, T_DEVICE, T_OBJECT, T_LAYOUT, T_MEMORY_FORMAT = 6, 7, 8, 9, 10, 11, 12, 13
CANONICAL_NAN = 0x7FF8000000000000


def _type_name(tp: type) -> str:
    """How an error message names a type (never part of a key)."""
    module = tp.__module__
    if module in ("builtins", "__builtin__"):
        return tp.__qualname__
    return f"{module}.{tp.__qualname__}"


def type_identity(tp: type) -> tuple[str, str]:
    """A type's identity in keys: ``(__module__, __qualname__)``, two fields (format v2), both exact str."""
    module, qualname = getattr(tp, "__module__", None), getattr(tp, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str:
        raise UnsupportedKeyError("a type's __module__ and __qualname__ must be str to key it")
    return module, qualname


def object_header(module: str, qualname: str) -> bytes:
    """The ``0x0B`` header of a ``__jitkey__`` object: module and qualname, each u16 length-prefixed."""
    m, q = module.encode("utf-8"), qualname.encode("utf-8")
    return bytes([T_OBJECT]) + struct.pack("<H", len(m)) + m + struct.pack("<H", len(q)) + q


def _is_torch(value: Any, name: str) -> bool:
    """Whether ``value``'s type is the real ``torch.<name>`` type object (a C type): a class that
    only calls itself ``torch.dtype`` is an ordinary object."""
    torch = sys.modules.get("torch")
    tp = type(value)
    return (
        torch is not None
        and tp is getattr(torch, name, None)
        and not tp.__flags__ & (1 << 9)  # Py_TPFLAGS_HEAPTYPE: not a Python class
    )


def encode(value: Any, _depth: int = 0) -> bytes:
    """Canonical encoding of ``value`` (same contract as :func:`jitkey.encode`)."""
    tp = type(value)
    if value is None:
        return bytes([T_NONE])
    if tp is bool:
        return bytes([T_TRUE if value else T_FALSE])
    if tp is int:
        if -(2**63) <= value < 2**63:
            return bytes([T_INT]) + struct.pack("<q", value)
        raw: bytes = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        while len(raw) > 9 and (
            (raw[-1] == 0 and raw[-2] & 0x80 == 0) or (raw[-1] == 0xFF and raw[-2] & 0x80)
        ):
            raw = raw[:-1]
        return bytes([T_BIGINT]) + struct.pack("<I", len(raw)) + raw
    if tp is float:
        bits = CANONICAL_NAN if math.isnan(value) else struct.unpack("<Q", struct.pack("<d", value))[0]
        return bytes([T_FLOAT]) + struct.pack("<Q", bits)
    if tp is str:
        try:
            b: bytes = value.encode("utf-8")
        except UnicodeEncodeError:
            raise UnsupportedKeyError("str contains lone surrogates (not UTF-8)") from None
        return bytes([T_STR]) + struct.pack("<I", len(b)) + b
    if tp is bytes:
        data: bytes = value
        return bytes([T_BYTES]) + struct.pack("<I", len(data)) + data
    if tp is tuple:
        if _depth >= MAX_DEPTH:
            raise KeyDepthError(f"key is nested deeper than the limit of {MAX_DEPTH} levels")
        return (
            bytes([T_TUPLE]) + struct.pack("<I", len(value)) + b"".join(encode(v, _depth + 1) for v in value)
        )
    if _is_torch(value, "dtype"):
        name = str(value).removeprefix("torch.").encode("ascii")
        return bytes([T_DTYPE, len(name)]) + name
    if _is_torch(value, "device"):
        t: bytes = value.type.encode("ascii")
        idx = -1 if value.index is None else value.index
        return bytes([T_DEVICE, len(t)]) + t + struct.pack("<q", idx)
    for kind, tag in (("layout", T_LAYOUT), ("memory_format", T_MEMORY_FORMAT)):
        if _is_torch(value, kind):
            short = str(value).removeprefix("torch.").encode("ascii")
            return bytes([tag, len(short)]) + short
    if hasattr(tp, "__jitkey__"):
        if _depth >= MAX_DEPTH:
            raise KeyDepthError(f"key is nested deeper than the limit of {MAX_DEPTH} levels")
        return object_header(*type_identity(tp)) + encode(value.__jitkey__(), _depth + 1)
    raise UnsupportedKeyError(f"cannot key a value of type {_type_name(tp)!r}")


def digest(value: Any) -> bytes:
    """Persistent digest of ``value`` (same contract as :func:`jitkey.digest`)."""
    return hashlib.blake2b(DIGEST_DOMAIN + encode(value), digest_size=32).digest()
