"""Type stubs for the native extension ``jitkey._core`` (the docstrings of the public API live here)."""

from typing import Any, Final, TypeVar, final, overload

_T = TypeVar("_T")

__version__: Final[str]
FORMAT_VERSION: Final[int]
"""Version of the canonical key encoding."""
MAX_DEPTH: Final[int]
"""Deepest nesting of tuples / ``__jitkey__`` values a key may have."""
DIGEST_DOMAIN: Final[bytes]
"""Prefix hashed before every encoding by :func:`digest` (carries the format version)."""

def encode(value: object, /) -> bytes:
    """Return the canonical encoding of a key tree.

    Leaves: ``None``, ``bool``, ``int`` (any size), ``float`` (bit-exact, one canonical NaN), ``str``,
    ``bytes``, ``tuple`` (nested up to :data:`MAX_DEPTH`), ``torch.dtype``, ``torch.device`` and objects
    whose type defines ``__jitkey__()`` (returning a key tree). Exact types only: subclasses of builtins
    need ``__jitkey__`` too. Equal encodings mean equal key trees; ``True``, ``1``, ``1.0`` and ``"1"``
    all differ.

    Raises:
        jitkey.errors.UnsupportedKeyError: a value of another type (a ``TypeError``); the message
            names the type and its position, e.g. ``value[1][0]``.
        jitkey.errors.KeyDepthError: nesting deeper than :data:`MAX_DEPTH`.
    """

def digest(value: object, /) -> bytes:
    """Return the 32-byte persistent key of a key tree.

    ``hashlib.blake2b(DIGEST_DOMAIN + encode(value), digest_size=32).digest()``, computed in Rust;
    stable across processes, machines and Python versions. Raises like :func:`encode`.
    """

def fast_hash(value: object, /) -> int:
    """Return the in-memory 64-bit hash of a key tree (seeded per process; not stable across processes).

    Raises like :func:`encode`.
    """

def digest_encoding(encoding: bytes, /) -> bytes:
    """Return the 32-byte digest of an encoding obtained from :func:`encode`."""

@final
class LruCache:
    """A bounded, thread-safe cache from key trees (as for :func:`encode`) to any Python objects."""

    def __new__(cls, capacity: int, *, shards: int | None = None) -> LruCache: ...
    @overload
    def get(self, key: object, default: None = None) -> Any | None: ...
    @overload
    def get(self, key: object, default: _T) -> Any | _T: ...
    def __getitem__(self, key: object, /) -> Any: ...
    def __setitem__(self, key: object, value: object, /) -> None: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
