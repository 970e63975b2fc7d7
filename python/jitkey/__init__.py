"""jitkey: Rust-accelerated cache keys and kernel lookup for GPU-kernel JIT frameworks."""

from __future__ import annotations

from jitkey import errors, rules
from jitkey._core import (
    DIGEST_DOMAIN,
    FORMAT_VERSION,
    MAX_DEPTH,
    MISS,
    LruCache,
    Signature,
    __version__,
    digest,
    digest_encoding,
    encode,
    fast_hash,
)
from jitkey.errors import JitKeyError, UnsupportedKeyError

__all__ = [
    "DIGEST_DOMAIN",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "MISS",
    "JitKeyError",
    "LruCache",
    "Signature",
    "UnsupportedKeyError",
    "__version__",
    "digest",
    "digest_encoding",
    "encode",
    "errors",
    "fast_hash",
    "rules",
]
