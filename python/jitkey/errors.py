"""Exceptions raised by jitkey.

Every error jitkey raises derives from :class:`JitKeyError` and from the builtin exception a caller
would catch for that kind of mistake, so ``except TypeError`` keeps working for code that does not
know about jitkey.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "DiskIndexWarning",
    "FunctionKeyError",
    "GlobalsChangedError",
    "IndexClosedError",
    "JitKeyError",
    "JitKeyWarning",
    "KeyDepthError",
    "KeyLengthError",
    "MissingDependencyError",
    "RemoteCacheWarning",
    "RemoteConfigError",
    "SignatureError",
    "Unkeyable",
    "UnsupportedKeyError",
    "UnsupportedVersionError",
    "ValueTooLargeError",
]


class JitKeyError(Exception):
    """Base class for every error jitkey raises."""


class UnsupportedKeyError(JitKeyError, TypeError):
    """A value has a type jitkey cannot put in a key (it is never keyed through ``repr()``).

    The message names the type and its position in the key tree, e.g. ``value[2][0]``.
    """


class FunctionKeyError(UnsupportedKeyError):
    """:func:`jitkey.function_key` met captured state it cannot key (a closure value, default, global,
    partial argument or bound-method instance); the message names the function and the variable.
    """


class KeyDepthError(JitKeyError, ValueError):
    """A key tree is nested deeper than :data:`jitkey.MAX_DEPTH` (tuples or ``__jitkey__`` chains)."""


class KeyLengthError(JitKeyError, ValueError):
    """A str, bytes or tuple in a key is longer than the encoding's 32-bit length prefix."""


class SignatureError(JitKeyError, TypeError):
    """A :class:`jitkey.Signature` was described with invalid rules."""


class ArgumentError(JitKeyError, TypeError):
    """Call arguments do not fit a signature (wrong count, or a type its rule cannot key).

    The message names the parameter.
    """


class Unkeyable(ArgumentError):
    """A kernel launch jitkey's fast path cannot key (``jitkey.triton``; also reachable as
    ``jitkey.triton.Unkeyable``).

    Inside a launch it never reaches the caller: the call goes through Triton's own path instead and is
    counted as a fallback with :attr:`reason`. :meth:`jitkey.triton.TritonKernel.key_of` raises it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IndexClosedError(JitKeyError, ValueError):
    """A :class:`jitkey.DiskIndex` was used after ``close()``."""


class ValueTooLargeError(JitKeyError, ValueError):
    """A value is larger than the store accepts."""


class MissingDependencyError(JitKeyError, ModuleNotFoundError):
    """An optional dependency a feature needs is not installed (``name`` is its module); the message names the
    package and the extra that installs it (e.g. ``pip install 'jitkey[redis]'`` for :class:`jitkey.RemoteIndex`).
    Every missing optional dependency is reported this way (``jitkey._deps``)."""


class RemoteConfigError(JitKeyError, ValueError):
    """A remote tier was configured with an invalid URL, namespace, secret, timeout or size bound."""


class UnsupportedVersionError(JitKeyError, RuntimeError):
    """An integration (``jitkey.integrations``) was asked to install over a version of its library it does not
    know; the message names the versions it supports. The library itself is left untouched."""


class GlobalsChangedError(JitKeyError, RuntimeError):
    """A global a kernel reads changed since it was compiled (the cached kernel would be stale)."""


class JitKeyWarning(Warning):
    """Base class for every warning jitkey emits."""


class DiskIndexWarning(JitKeyWarning, RuntimeWarning):
    """The environment kept a :class:`jitkey.DiskIndex` from using its file as asked.

    Emitted once per index and kind (unusable or unsafe directory, foreign or damaged file, disk
    full, lock timeout); the index then serves misses or runs read-only / memory-only and never
    returns a wrong value. ``DiskIndex.mode`` and ``DiskIndex.mode_reason`` say what it chose.
    """


class RemoteCacheWarning(JitKeyWarning, RuntimeWarning):
    """The remote tier (:class:`jitkey.RemoteIndex`) failed or returned data it rejected.

    Emitted once per remote index and cause (connection refused or lost, operation timed out, server
    error, rejected value, or a ``JITKEY_REMOTE_CACHE`` that could not be used); the call that met it
    goes on from the local tier or recomputes, so a JIT call never fails or hangs because of the remote.
    ``stats()`` counts every occurrence.
    """
