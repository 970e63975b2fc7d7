"""Type stubs for the native extension ``jitkey._core`` (the docstrings of the public API live here)."""

from collections.abc import Callable, Sequence
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

class LruCache:
    """A bounded, thread-safe cache from key trees (as for :func:`encode`) to any Python objects."""

    def __init__(self, capacity: int, *, shards: int | None = None) -> None: ...
    @overload
    def get(self, key: object, default: None = None) -> Any | None: ...
    @overload
    def get(self, key: object, default: _T) -> Any | _T: ...
    def __getitem__(self, key: object) -> Any: ...
    def __setitem__(self, key: object, value: object) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def stats(self) -> dict[str, int]: ...

@final
class _Miss:
    """The type of :data:`MISS` (falsy; ``repr`` is ``jitkey.MISS``)."""

    def __bool__(self) -> bool: ...

MISS: Final[_Miss]
"""What :meth:`Signature.lookup` returns when the cache holds no entry for the call (compare with ``is``)."""

@final
class Signature:
    """Call arguments → key, compiled once per kernel from per-parameter rules (see :mod:`jitkey.rules`).

    ``params`` is a sequence of ``(name, rule)`` or ``(name, rule, default)`` tuples (parameters with
    defaults come last and may be left out of a call). ``extra`` is any keyable value folded into
    every key: the function's identity, device, options, knob state.

    A call's key is a header (tag ``0x10``, the plan's description, then ``extra``'s encoding)
    followed by one leaf per parameter; the encoding is injective, so equal keys mean equal
    signatures, extras and per-parameter leaves.

    Raises:
        jitkey.errors.SignatureError: a malformed parameter or rule, a duplicate name, a required
            parameter after a defaulted one, or an ``extra`` / default that cannot be keyed.
    """

    def __new__(cls, params: Sequence[tuple[Any, ...]], *, extra: object = None) -> Signature: ...
    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in order."""
    @property
    def extra(self) -> Any:
        """The value folded into every key (``()`` when ``extra`` was omitted or ``None``)."""
    @property
    def header(self) -> bytes:
        """The bytes every key of this signature starts with."""
    def __len__(self) -> int: ...
    def encode(self, args: tuple[Any, ...], /) -> bytes:
        """Return the key of a call (positional arguments as a tuple).

        Raises:
            jitkey.errors.ArgumentError: wrong argument count, or an argument its rule cannot key
                (the message names the parameter, e.g. ``parameter 'n': expected an int``).
        """
    def digest(self, args: tuple[Any, ...], /) -> bytes:
        """Return the 32-byte persistent key of a call: blake2b-256 over ``DIGEST_DOMAIN + encode(args)``."""
    def fast_hash(self, args: tuple[Any, ...], /) -> int:
        """Return the in-memory 64-bit hash of a call's key (seeded per process)."""
    def lookup(self, cache: LruCache, args: tuple[Any, ...], /) -> Any:
        """The hot path: key the call and probe ``cache`` in one native call.

        Returns the cached value, or :data:`MISS`. Builds no Python object on a hit.
        Raises like :meth:`encode`.
        """
    def insert(self, cache: LruCache, args: tuple[Any, ...], value: object, /) -> None:
        """Store ``value`` in ``cache`` under the call's key."""
    def get_or_insert(self, cache: LruCache, args: tuple[Any, ...], factory: Callable[[], _T], /) -> Any:
        """Return the cached value for the call, or call ``factory()``, store and return its result.

        The factory runs with no lock held; an exception from it propagates and stores nothing.
        Not single-flight yet: two threads missing on one key may both run the factory.
        """
    def flatten(self, args: tuple[Any, ...], /) -> tuple[Any, ...]:
        """The key as a tuple: ``(extra, leaf_0, leaf_1, ...)``, one tuple of components per parameter.

        Holds the same information as :meth:`encode` (tensor dtypes and devices shown as strings).
        """
    def explain(self, args_a: tuple[Any, ...], args_b: tuple[Any, ...], /) -> list[str]:
        """Name the parameters and buckets that make two calls key differently.

        E.g. ``["x.aligned: True != False", "n.equals_1: False != True"]``; ``[]`` when the keys are equal.
        """

def _install_tensor_layout(layout: dict[str, Any], /) -> bool:
    """Private: install the tensor layout verified by :mod:`jitkey._tensor_fields` (once per process)."""

def _tensor_layout_installed() -> bool:
    """Private: whether tensor metadata is read directly from torch's ``TensorImpl``."""
