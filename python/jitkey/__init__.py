"""jitkey: Rust-accelerated cache keys and kernel lookup for GPU-kernel JIT frameworks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jitkey import _core, _log, errors
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
from jitkey.errors import JitKeyError, UnsupportedKeyError

if TYPE_CHECKING:
    from jitkey import rules
    from jitkey.env import DEFAULT_ENV_VARS, env_key
    from jitkey.fnkey import GlobalsGuard, function_key, function_key_tree
    from jitkey.remote import RemoteIndex, TieredIndex

logger = _log.logger
"""The ``jitkey`` logger (see :mod:`jitkey._log`: fast paths that switch off, fallbacks at DEBUG)."""

# Imported at first use (PEP 562), so ``import jitkey`` (and ``import jitkey.triton``, which a kernel library
# pays before its first decoration) loads only the native core: each of these modules costs milliseconds.
_LAZY = {
    "rules": ("jitkey.rules", None),
    "DEFAULT_ENV_VARS": ("jitkey.env", "DEFAULT_ENV_VARS"),
    "env_key": ("jitkey.env", "env_key"),
    "GlobalsGuard": ("jitkey.fnkey", "GlobalsGuard"),
    "function_key": ("jitkey.fnkey", "function_key"),
    "function_key_tree": ("jitkey.fnkey", "function_key_tree"),
    "RemoteIndex": ("jitkey.remote", "RemoteIndex"),
    "TieredIndex": ("jitkey.remote", "TieredIndex"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'jitkey' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if not _core._FAST_LAYOUT:  # say once why the CPython layout reads are off (jitkey._fastpaths)
    from jitkey import _fastpaths

    _fastpaths.report_import_time()


def install() -> dict[str, str | None]:
    """The one switch: route ``triton.jit`` through jitkey (:func:`jitkey.triton.install`) and install every DSL
    integration whose library is installed in a supported version (:func:`jitkey.integrations.install_available`).
    Returns what is on: ``{"triton": None, "helion": None, "flag_gems": "flag_gems is not installed", ...}``
    (None: installed; else why not). Never raises for a missing or unsupported library."""
    from jitkey import _deps, integrations

    out: dict[str, str | None] = {}
    try:
        _deps.require("triton", "jitkey.install")
        import jitkey.triton

        jitkey.triton.install()
        out["triton"] = None
    except ImportError as exc:
        out["triton"] = str(exc)
    out.update(integrations.install_available())
    return out


def uninstall() -> None:
    """Undo :func:`install`: the integrations, then the ``triton.jit`` routing."""
    import sys

    from jitkey import integrations

    integrations.uninstall_all()
    if "jitkey.triton" in sys.modules:
        sys.modules["jitkey.triton"].uninstall()


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
    "install",
    "logger",
    "rules",
    "uninstall",
]
