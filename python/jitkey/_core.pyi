"""Type stubs for the native extension ``jitkey._core`` (the docstrings of the public API live here)."""

from collections.abc import Callable
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
    """A bounded, thread-safe cache from key trees (as for :func:`encode`) to any Python objects.

    Keys are compared by their canonical encoding (``1``, ``True``, ``1.0`` and ``"1"`` are four
    different keys; a hash collision can never return another key's value). A hit takes no lock
    and writes no shared memory, so lookups scale across threads, free-threaded CPython included.

    Eviction is SIEVE, an LRU approximation: a hit marks the entry visited; when a shard is full,
    a hand sweeps from the oldest entry, clearing marks, and evicts the first unmarked one. It is
    scan-resistant (a burst of one-off keys evicts itself, not the hot set). The capacity is
    split evenly among ``shards``, each evicting on its own, so a cache may start evicting a
    little before it holds ``capacity`` entries.

    Values that are replaced, evicted, popped or cleared are released outside the cache's locks,
    once no concurrent lookup can still be reading them (with concurrent readers, possibly at a
    later write): a value's ``__del__`` may use the cache.
    """

    def __new__(cls, capacity: int, *, shards: int | None = None) -> LruCache:
        """Create a cache holding at most ``capacity`` (>= 1) entries.

        ``shards`` (>= 1) is rounded up to a power of two, then down to at most
        ``min(64, capacity)``; by default it is the CPU count rounded down to a power of two,
        keeping at least 256 entries per shard. Hits never lock, so shards only spread
        concurrent inserts.

        Raises:
            ValueError: ``capacity`` or ``shards`` is 0.
            OverflowError: a negative ``capacity`` or ``shards``.
        """
    @overload
    def get(self, key: object, default: None = None) -> Any | None: ...
    @overload
    def get(self, key: object, default: _T) -> Any | _T:
        """Return the value stored under ``key`` (marking it recently used), else ``default``.

        Raises:
            jitkey.errors.UnsupportedKeyError: ``key`` is not a key tree, or its ``__jitkey__``
                raised (chained as ``__cause__``).
            jitkey.errors.KeyDepthError: ``key`` nests deeper than :data:`MAX_DEPTH`.
        """
    def __getitem__(self, key: object, /) -> Any:
        """Return the value stored under ``key`` (marking it recently used); ``KeyError`` if absent."""
    def __setitem__(self, key: object, value: object, /) -> None:
        """Store ``value`` under ``key``, replacing any previous value; may evict one entry."""
    def __delitem__(self, key: object, /) -> None:
        """Remove ``key``; ``KeyError`` if absent."""
    def __contains__(self, key: object, /) -> bool:
        """Whether ``key`` is present. Does not mark it used and does not count as a hit or miss."""
    @overload
    def pop(self, key: object) -> Any: ...
    @overload
    def pop(self, key: object, default: _T) -> Any | _T:
        """Remove ``key`` and return its value; else return ``default``, or raise ``KeyError``."""
    def get_or_insert(self, key: object, factory: Callable[[], _T]) -> Any | _T:
        """Return the value under ``key``; on a miss, call ``factory()``, store and return its result.

        Single-flight: when several threads miss on the same key at once, ``factory`` runs once
        (in the first of them) and all of them get its result. The others wait with the
        interpreter released (no deadlock with the GIL or with a free-threaded stop-the-world).
        If ``factory`` raises, nothing is stored and every waiting caller gets the same
        exception. The factory runs with no cache lock held and may use the cache, but calling
        ``get_or_insert`` for the *same* key from inside its own factory raises ``RuntimeError``
        (it would wait for itself); two factories waiting on each other's keys from two threads
        deadlock, as in any single-flight scheme.
        """
    def clear(self) -> None:
        """Remove every entry (counters are kept)."""
    def __len__(self) -> int:
        """Number of entries held now."""
    @property
    def capacity(self) -> int:
        """Most entries the cache holds."""
    @property
    def shards(self) -> int:
        """Number of shards (see the constructor)."""
    def stats(self) -> dict[str, int]:
        """Counters: ``hits``, ``misses`` (lookups by ``get``/``[]``/``get_or_insert``),
        ``inserts`` (stores, replacements included), ``evictions`` (entries dropped to stay
        within capacity), ``size`` and ``capacity``."""
