"""jitkey: Rust-accelerated cache keys and kernel lookup for GPU-kernel JIT frameworks."""

from __future__ import annotations

from jitkey import _log, errors, rules
from jitkey._core import (
    DIGEST_DOMAIN,
    FORMAT_VERSION,
    MAX_DEPTH,
    MISS,
    DiskIndex,
    LruCache,
    Signature,
    __version__,
    digest,
    digest_encoding,
    encode,
    fast_hash,
)
from jitkey.env import DEFAULT_ENV_VARS, env_key
from jitkey.errors import JitKeyError, UnsupportedKeyError
from jitkey.fnkey import GlobalsGuard, function_key, function_key_tree
from jitkey.remote import RemoteIndex, TieredIndex

logger = _log.logger
"""The ``jitkey`` logger (see :mod:`jitkey._log`: fast paths that switch off, fallbacks at DEBUG)."""

from jitkey import _fastpaths  # noqa: E402

_fastpaths.report_import_time()

__all__ = [
    "DEFAULT_ENV_VARS",
    "DIGEST_DOMAIN",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "MISS",
    "DiskIndex",
    "GlobalsGuard",
    "JitKeyError",
    "LruCache",
    "RemoteIndex",
    "Signature",
    "TieredIndex",
    "UnsupportedKeyError",
    "__version__",
    "digest",
    "digest_encoding",
    "encode",
    "env_key",
    "errors",
    "fast_hash",
    "function_key",
    "function_key_tree",
    "logger",
    "rules",
]
