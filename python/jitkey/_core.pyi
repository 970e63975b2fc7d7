"""Type stubs for the native extension ``jitkey._core`` (the docstrings of the public API live here)."""

import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, final, overload

from typing_extensions import Self, disjoint_base

_T = TypeVar("_T")

__version__: Final[str]
FORMAT_VERSION: Final[int]
"""Version of the canonical key encoding."""
MAX_DEPTH: Final[int]
"""Deepest nesting of tuples / ``__jitkey__`` values a key may have."""
_FAST_LAYOUT: Final[bool]
"""Private: whether tuple items and cached str hashes are read directly (proven at import)."""
_LRU_FAST_SUBSCRIPT: Final[bool]
"""Private: whether ``LruCache``'s ``cache[key]`` slot answers structural hits natively (GIL builds)."""
DIGEST_DOMAIN: Final[bytes]
"""Prefix hashed before every encoding by :func:`digest` (carries the format version)."""

def encode(value: object, /) -> bytes:
    """Return the canonical encoding of a key tree.

    Leaves: ``None``, ``bool``, ``int`` (any size), ``float`` (bit-exact, one canonical NaN), ``str``,
    ``bytes``, ``tuple`` (nested up to :data:`MAX_DEPTH`), ``torch.dtype``, ``torch.device``, ``torch.layout``,
    ``torch.memory_format`` and objects
    whose type defines ``__jitkey__()`` (returning a key tree). Exact types only: subclasses of builtins
    need ``__jitkey__`` too. Equal encodings mean equal key trees; ``True``, ``1``, ``1.0`` and ``"1"``
    all differ.

    Raises:
        jitkey.errors.UnsupportedKeyError: a value of another type (a ``TypeError``); the message
            names the type and its position, e.g. ``value[1][0]``.
        jitkey.errors.KeyDepthError: nesting deeper than :data:`MAX_DEPTH`.
    """

def _key_digest(key: object, /) -> bytes:
    """Private (:mod:`jitkey.remote`): the 32-byte digest a :class:`DiskIndex` files ``key`` under (a 32-byte
    ``bytes`` is the digest itself; another ``bytes`` raises :class:`jitkey.errors.KeyLengthError`; any other
    keyable value is digested)."""

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

def _register_key_adapter(
    tp: type, adapter: Callable[[Any], object] | None, /, *, subclasses: bool = False
) -> None:
    """Private (:mod:`jitkey.triton`): key objects of ``tp`` (and its subclasses, if asked) as
    ``adapter(obj)``, like a ``__jitkey__`` method, under the type's qualified name; ``None`` removes it."""

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

@final
class DiskIndex:
    """A persistent key → bytes index in one directory, shared by many processes (unix only).

    One append-only log, ``index.v1.jki``, with 8-byte aligned, xxh3-64 checksummed records.
    Writers append under an advisory ``flock`` on ``index.lock`` (one write per batch, identical
    values are not written twice); readers take no lock: they index only records that validate and
    re-check a record's checksum and key before returning its value, so a torn, damaged or foreign
    file gives a miss, never a wrong value. A get that misses looks for new appends (or a file
    compacted by another process) at once; a hit notices another process's update of the same key
    within 200 ms, or at once after :meth:`refresh`. When the file passes ``max_bytes`` (or is more
    than half dead above 8 MiB), the writer rewrites the live entries to a temp file, fsyncs it and
    renames it over the log, evicting the oldest entries down to 3/4 of ``max_bytes``.

    ``path`` is a directory, created with mode 0700 if missing. Default: ``$JITKEY_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/jitkey``, else ``~/.cache/jitkey``. ``durability="none"`` (default):
    a killed process loses at most the batch it was writing, power loss may lose recent appends;
    ``"full"``: ``fdatasync`` after every batch and an fsync of the directory after renames.

    Keys: a 32-byte ``bytes`` is used as the digest itself (e.g. from :func:`digest`); any other
    keyable value (as for :func:`encode`) is digested. Values: ``bytes`` of at most
    :attr:`MAX_VALUE` bytes.

    The environment never raises: an unusable, foreign-owned or group/world-writable directory (a
    sticky one such as ``/tmp`` only when named explicitly, by ``path`` or ``$JITKEY_CACHE_DIR``), a
    file that is not an index, a symlink, FIFO or file of another user under the index's names, a
    network filesystem, a full disk or a lock held longer than 10 s make the index read-only (hits
    from the file, puts kept in this process's memory) or memory-only, with one
    :class:`jitkey.errors.DiskIndexWarning` per kind; see :attr:`mode` and :attr:`mode_reason`.
    After ENOSPC/EDQUOT/EFBIG, writes stay in memory for 60 s, then retry. A file that shrinks
    or is copied over while mapped gives misses (never a signal) and is rewritten from what is
    left by the next writer. ``JITKEY_DISK_CACHE=ro`` or ``0`` forces read-only or memory-only mode.

    Raises:
        ValueError: ``durability`` not ``"none"``/``"full"``, ``max_bytes`` below 65536, or a bad
            ``JITKEY_DISK_CACHE``.
    """

    MAX_VALUE: Final[int]
    """The largest value in bytes (65472: a record is at most 64 KiB)."""

    def __new__(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int = 67108864,
        durability: str = "none",
    ) -> Self: ...
    def get(self, key: object) -> bytes | None:
        """Return the value stored under ``key``, or ``None``.

        Raises:
            jitkey.errors.KeyLengthError: a ``bytes`` key that is not 32 bytes long.
            jitkey.errors.UnsupportedKeyError: a key jitkey cannot encode.
            jitkey.errors.IndexClosedError: the index was closed.
        """
    def __contains__(self, key: object, /) -> bool: ...
    def put(self, key: object, value: bytes) -> bool:
        """Store ``value`` under ``key`` (the latest put wins, across processes).

        Returns ``True`` when the value is in the file, ``False`` when the environment kept it in
        this process's memory only (it is served here but does not outlive the process).

        Raises:
            jitkey.errors.ValueTooLargeError: ``value`` is longer than :attr:`MAX_VALUE`.
            TypeError: ``value`` is not ``bytes``; key errors as for :meth:`get`.
        """
    def put_many(self, items: Iterable[tuple[object, bytes]] | Mapping[object, bytes]) -> bool:
        """Store many entries with one lock acquisition and one write; the return value is as
        for :meth:`put` (``True``: every entry is in the file).

        Nothing is written if any value is too large (:class:`jitkey.errors.ValueTooLargeError`).
        """
    def delete(self, key: object) -> bool:
        """Remove ``key`` (a tombstone record); return whether it was present."""
    def __len__(self) -> int:
        """The number of live keys (after looking for other processes' appends)."""
    def refresh(self) -> None:
        """Pick up other processes' appends and compactions now."""
    def compact(self) -> bool:
        """Rewrite the live entries to a new file now (evicting past the cap); ``False`` if the
        index is not writable or the rewrite failed (then with a warning)."""
    def clear(self) -> bool:
        """Remove every entry, for every process (a compaction to an empty file)."""
    def stats(self) -> dict[str, Any]:
        """Counters and state: ``mode``, ``mode_reason``, ``path``, ``hits``, ``misses``, ``appends``,
        ``dedup_skips``, ``torn_tails_padded``, ``invalid_bytes_padded``, ``corrupt_records_skipped``,
        ``compactions``, ``evictions``, ``lock_acquisitions``, ``lock_timeouts``, ``lock_wait_us_p50``
        and ``lock_wait_us_p99`` (power-of-two bucket bounds), ``write_errors``, ``memory_only_puts``,
        ``refreshes``, ``reopens``, ``shrinks_seen``, ``entries``, ``file_bytes``, ``live_bytes``, ``generation``,
        ``max_bytes``. Counters are per process."""
    @property
    def mode(self) -> str:
        """``"rw"``, ``"ro"`` (hits from the file, puts in memory) or ``"memory"``."""
    @property
    def mode_reason(self) -> str:
        """Why the mode is not ``"rw"`` (empty when it is)."""
    @property
    def path(self) -> pathlib.Path:
        """The log file (``<directory>/index.v1.jki``)."""
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Unmap and close the files; later calls raise :class:`jitkey.errors.IndexClosedError`."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_exc: object) -> bool: ...
    @classmethod
    def default_directory(cls) -> pathlib.Path | None:
        """The directory used when ``path`` is ``None`` (from the environment)."""

def _verify_index(path: str | os.PathLike[str], lock_wait: float = 10.0) -> dict[str, Any]:
    """``jitkey cache verify``'s check: every record of the log in ``path`` as committed when the call
    starts (its length read under the writers' lock, shared, waiting at most ``lock_wait`` seconds; the
    bytes below it from the same descriptor), so appends and compactions by other processes meanwhile are
    not seen. Creates and writes nothing.

    Returns ``path``, ``locked``, ``snapshot_bytes``, ``valid_bytes``, ``unvalidated_bytes``, ``records``,
    ``entries``, ``live_bytes``, ``generation``; or ``path`` and ``problem`` when the file is not a usable
    index. Raises ``FileNotFoundError`` when there is none, ``OSError`` when it cannot be read."""

def _after_fork_in_child() -> None:
    """Registered with ``os.register_at_fork(after_in_child=...)`` at import: frees a forked child
    from the locks of every live :class:`DiskIndex` that another thread of the parent held at the
    fork (an in-flight put or refresh). Not for direct use."""

@disjoint_base
class _TierBase:
    """Private: base of :class:`jitkey.TieredIndex`; ``get`` looks in the local ``DiskIndex`` natively and
    calls the subclass's ``_on_miss(key)`` only on a local miss."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self: ...
    def _tier_init(self, local: DiskIndex, /) -> None:
        """Set the local index (once)."""
    def get(self, key: object) -> bytes | None:
        """The local value, else ``self._on_miss(key)``."""

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
        Single-flight: concurrent misses on one call key run ``factory`` once and share its result
        (or its exception).
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

@final
class _TritonEntry:
    """Private (:mod:`jitkey.triton`): what a launcher hit launches.

    ``plan`` packs and launches the call itself when it takes it; otherwise ``target(gx, gy, gz, stream,
    function, packed_metadata, launch_metadata, enter_hook, exit_hook, *params)`` (``target`` is ``ck.run``,
    called as ``JITFunction.run`` calls it); then the hit returns ``ck``.
    """

    def __new__(
        cls,
        ck: object,
        target: Callable[..., Any],
        function: object,
        packed_metadata: object,
        kcache: dict[Any, Any] | None = None,
        tkey: object = None,
        plan: _LaunchPlan | None = None,
        /,
    ) -> _TritonEntry: ...
    @property
    def ck(self) -> Any: ...
    @property
    def target(self) -> Callable[..., Any]: ...
    @property
    def function(self) -> Any: ...
    @property
    def packed_metadata(self) -> Any: ...
    @property
    def plan(self) -> _LaunchPlan | None: ...

@final
class _LaunchPlan:
    """Private (:mod:`jitkey.triton`): one compiled kernel's launch, packed and sent to the CUDA driver by
    jitkey (``cuLaunchKernelEx``), as Triton's launcher packs and configures it.

    ``dialect``: the Triton launcher code mirrored, ``"3.6"`` (the C launcher generated per signature) or
    ``"3.9"`` (the generic ``launch`` of the backend's ``driver.c``); ``signature``: the kernel's Triton
    types in parameter order (tuples nested); a scratch is ``(size, align, allocator)`` or ``None``. Raises
    ``ValueError`` for a dialect or type it does not know and for a launch whose attributes overflow
    Triton's own array, and ``RuntimeError`` when ``libcuda.so.1`` cannot be loaded. A call it does not
    fully understand is declined (counted by reason, nothing launched) and goes to Triton's launcher.
    """

    def __new__(
        cls,
        dialect: str,
        function: int,
        packed_metadata: tuple[int, int, int],
        signature: tuple[Any, ...],
        cooperative: bool,
        pdl: bool,
        num_ctas: int,
        global_scratch: tuple[int, int, Any] | None,
        profile_scratch: tuple[int, int, Any] | None,
        /,
    ) -> _LaunchPlan: ...
    def launch(self, gx: int, gy: int, gz: int, stream: int, device: int | None, *params: Any) -> bool:
        """Launch as a hit would (no hooks); False when declined (nothing launched)."""
    def _floor(
        self, n: int, gx: int, gy: int, gz: int, stream: int, device: int | None, *params: Any, steps: int = 0
    ) -> float:
        """The driver floor for benchmarks: ``n`` launches of pre-packed parameters in a native loop; seconds.

        ``steps`` adds per launch what a hit does around the driver call: 1 the context check, 2 releasing
        and taking back the GIL, 4 packing the parameters again."""
    def _packed(
        self, gx: int, gy: int, gz: int, stream: int, device: int | None, *params: Any
    ) -> _PackedLaunch:
        """For benchmarks: the launch packed once, as :meth:`_floor` packs it; its ``launch()`` makes that
        launch from Python. The arguments are kept alive with it (a tensor changed in place afterwards is still
        launched with the values packed). Raises ``ValueError`` as :meth:`_floor` does."""
    def counts(self) -> dict[str, Any]:
        """``{"launched": n, "declined": {reason: n}}``."""
    @property
    def nslots(self) -> int:
        """Parameter slots a launch passes (the two scratch pointers not included)."""

@final
class _PackedLaunch:
    """Private (benchmarks): one launch packed once by :meth:`_LaunchPlan._packed`. ``launch()`` makes it
    (the context check, ``cuLaunchKernelEx`` with the GIL released) and nothing else: a Python loop calling it
    is the least a launch called from Python costs. Usable only on the thread that made it."""

    def launch(self) -> None:
        """The launch (a driver error raises ``RuntimeError`` as Triton's launcher words it)."""

@final
class _TritonLauncher:
    """Private (:mod:`jitkey.triton`): the warm-launch path of one Triton kernel in one native call.

    Binds the call, reads the current device and the knobs, keys the call (``sig``'s rules, after the
    device, knob values and sorted launch options), probes ``cache``; a hit checks the globals, resolves
    the grid, reads the stream and the launch hooks and launches. A miss calls the kernel's
    ``_jk_miss(grid, args, kwargs) -> (result, _TritonEntry | None)`` and stores the entry (``(MISS, entry)``:
    the kernel was found without a launch, from jitkey's disk index, and is launched as a hit); anything else
    calls its ``_jk_native_fallback(reason, grid, args, kwargs)``; its ``_jk_check_globals()`` checks the
    globals as Triton does (and is skipped while every global is still bound to the immutable value, or the
    ``tl.constexpr`` holding it, that its last pass saw). ``info`` is the ``TritonInfo`` (``knobs``,
    ``knob_reads``, ``checks_stages_hook``, ``HookChain``, ``run_keywords``: a keyword argument named like one
    of ``JITFunction.run``'s own goes to Triton's path, which raises or consumes it); ``runtime`` has ``get_device()`` and ``get_stream(device)``,
    and optionally ``native``: a :class:`_TorchCurrent` proven equal to them (or None); ``npos`` parameters
    may be passed positionally. ``watch`` has ``problem`` (why what the launch reads from Triton's objects is
    read on every call, or None) and ``kinds`` (``{(knob class, attribute): "plain" | "env"}``: the knob reads
    the watch covers); watched, that state is read once and kept while :func:`_watch_bump` is not called, the
    knob objects are still the ``triton.knobs`` module's and (for an env knob) the C environment is unchanged.
    """

    def __new__(
        cls,
        kernel: Any,
        sig: Signature,
        cache: LruCache,
        info: Any,
        runtime: Any,
        npos: int,
        watch: Any,
        /,
    ) -> _TritonLauncher: ...
    @property
    def launch(self) -> Callable[..., Any]:
        """``launch(grid, /, *args, **kwargs)``: a builtin bound to this launcher (vectorcall)."""
    def key(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        device: int,
        /,
        *,
        persistent: bool = False,
    ) -> bytes:
        """The key ``launch`` would use for this call on ``device`` (no lookup, no launch); ``persistent``: the
        same key with every leaf as :func:`encode` writes it (stable across processes, for a disk index)."""
    @property
    def cache(self) -> LruCache:
        """The cache the launcher stores its entries in."""
    def state_counts(self) -> dict[str, Any]:
        """``watched`` (calls served by the kept state of Triton's objects), ``reads`` (times that state was
        read from the objects: on every call when it cannot be watched), ``unwatched`` (why the last read
        was not kept, or None), ``globals_native`` (globals checks passed by the snapshot of what Triton's
        check compares, with no Python run) and ``globals_full`` (``_jk_check_globals()`` run)."""
    @property
    def native_current(self) -> bool:
        """Whether the device and stream are read through torch's C shim."""

def _watch_bump() -> None:
    """Private: something a warm launch reads from Triton's Python objects may have changed (every watched
    write path calls it; see ``jitkey/triton/_watch.py``)."""

def _watch_version() -> int:
    """Private: the current watch version (tests)."""

def _environ_fingerprint() -> list[int] | None:
    """Private: the C environment as the watch compares it (``environ``'s pointers), or None where it cannot
    (not glibc)."""

@final
class _TorchCurrent:
    """Private (:mod:`jitkey.triton`): the current CUDA device and stream through torch's stable C shim
    (``aoti_torch_get_current_device_index`` from ``device_lib``, ``aoti_torch_get_current_cuda_stream`` from
    ``stream_lib``), resolved with ``dlopen``/``dlsym`` (``loaded_only``: only from libraries already loaded).
    Raises ``OSError`` when a library or symbol is missing. After the first error the shim reports, it is not
    called again (``failed``)."""

    def __new__(cls, device_lib: str, stream_lib: str, /, *, loaded_only: bool = True) -> _TorchCurrent: ...
    def device(self) -> int | None:
        """The current device index (None: the shim reported an error, now or before)."""
    def stream(self, device: int, /) -> int | None:
        """The current stream of ``device`` (None: as :meth:`device`)."""
    @property
    def failed(self) -> bool:
        """Whether the shim reported an error (it is not called again)."""

@final
class _TorchAlloc:
    """Private (:mod:`jitkey.dsl`, via ``jitkey._torch_alloc``): fresh CUDA tensors through torch's stable C shim
    (``aoti_torch_empty_strided`` from ``cpu_lib``) and torch's tensor wrapper (``THPVariable_Wrap`` from
    ``python_lib``), resolved with ``dlopen``/``dlsym``. Raises ``OSError`` when a library or symbol is missing.
    After the first error the shim reports, it is not called again (``failed``) and both methods return None."""

    def __new__(cls, cpu_lib: str, python_lib: str, /, *, loaded_only: bool = True) -> _TorchAlloc: ...
    def empty_strided(self, sizes: list[int], strides: list[int], dtype: str, index: int, /) -> Any | None:
        """A new CUDA tensor on device ``index`` (``dtype`` a short name such as ``"float32"``), or None."""
    def empty_like(self, x: Any, dtype: str | None = None, /) -> Any | None:
        """As ``torch.empty_like(x, dtype=dtype)`` (``dtype`` a short name such as ``"float16"``; None: ``x``'s)
        for a plain, non-overlapping and dense CUDA tensor, else None. Raises ValueError for a dtype the shim
        does not name."""
    @property
    def failed(self) -> bool:
        """Whether the shim reported an error (it is not called again)."""

@disjoint_base
class _KernelBase:
    """Private: base of :class:`jitkey.triton.TritonKernel`; ``self[grid]`` in C once a launcher is set."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self: ...
    def _set_launcher(self, launcher: _TritonLauncher | None, /) -> None:
        """Route ``self[grid]`` to ``launcher`` (``None``: back to the subclass's ``_subscript``)."""
    def __getitem__(self, grid: Any, /) -> Callable[..., Any]: ...

@final
class _CompiledLaunch:
    """Private (:mod:`jitkey.integrations.flag_gems`): one compiled kernel launched as a library launches it
    from its own cache (``ck[grid](*params)``), natively; declined (``None``) when a pointer's 16-byte alignment
    differs from ``aligned``'s. ``knobs`` is ``triton.knobs`` (``knobs.runtime``'s launch hooks are read per
    launch, or kept while the watch version holds when ``watch`` is ``knobs.runtime``'s class)."""

    def __new__(
        cls,
        entry: _TritonEntry,
        runtime: Any,
        knobs: Any,
        hook_chain: Any,
        watch: type | None,
        device: int,
        aligned: list[tuple[int, bool]],
        /,
    ) -> _CompiledLaunch: ...
    def __call__(self, grid: tuple[int, int, int], *params: Any) -> Any | None:
        """Launch as a plan's step does (``None``: declined)."""

@final
class _Plan:
    """Private (:mod:`jitkey.dsl`): a recorded DSL call's steps, replayed.

    ``steps`` is a sequence of ``(kind, target, args, kwnames)``: ``"call"`` (``target(*args, **kw)``),
    ``"launch"`` (``target`` a ``_TritonLauncher``, ``args[0]`` the grid) or ``"compiled"`` (``target`` is
    ``(launch, nfast, fallback)``: a ``_CompiledLaunch`` with ``args[0]`` the grid and ``args[1:nfast]`` the
    parameters, or ``fallback(*args[nfast:], **kw)`` when it declines), ``"empty"`` (``target`` is ``(alloc,
    fallback, sizes, strides, dtype, index)``: a new CUDA tensor made by the :class:`_TorchAlloc`, or
    ``fallback(*args, **kw)`` when it is not used) or ``"empty_like"`` (``target`` is ``(alloc, fallback[,
    dtype])``, ``args`` one tensor and keyword arguments that change nothing but the dtype, ``dtype`` if given:
    ``alloc.empty_like(tensor, dtype)`` or ``fallback(tensor, **kw)``). Sources: ``("a", i)``, ``("a", i,
    path)``, ``("s", j)``, ``("s", j, k)``, ``("c", value)``, ``("t", srcs)``, ``("l", srcs)``. ``guard`` is
    ``(owner, name, value)``: the plan holds while ``getattr(owner, name) is value``. ``keep`` is ``(current,
    deterministic)``, a proven :class:`_TorchCurrent` and ``torch._C._get_deterministic_algorithms``: with it the
    plan keeps small intermediates between replays (an ``"empty"`` step whose tensor only the plan's compiled
    launches on its device see), on the conditions ``rust/py/src/dsl/plan.rs`` states.
    """

    def __new__(
        cls,
        nargs: int,
        steps: Any,
        ret: Any,
        guard: tuple[Any, str, Any] | None = None,
        bound: bool = False,
        keep: tuple[_TorchCurrent, Callable[[], bool]] | None = None,
    ) -> _Plan: ...
    def __call__(self, *args: Any) -> Any:
        """Run the plan over ``args`` as the recorded call would."""
    def __len__(self) -> int: ...
    @property
    def steps(self) -> list[tuple[str, Any]]:
        """``(kind, target)`` per step."""
    @property
    def kept(self) -> list[Any]:
        """Per step: the intermediate tensor it keeps now, ``None`` where none is kept yet, ``False`` where the
        step keeps nothing."""
    @property
    def bound(self) -> bool:
        """Whether the plan is one call of the DSL's bound call."""
    @property
    def valid(self) -> bool:
        """Whether the guard holds."""

@final
class _TorchModes:
    """Private (:mod:`jitkey.dsl`): torch's grad, inference, torch function and torch dispatch mode state read
    through torch's C++ functions (``aoti_torch_grad_mode_is_enabled`` from ``cpu_lib``,
    ``c10::InferenceMode::is_enabled`` and ``c10::impl::TorchDispatchModeTLS::stack_len`` from ``c10_lib``,
    ``at::impl::torch_function_mode_enabled`` from ``cpu_lib``), standing for ``functions`` (``torch.is_grad_enabled``,
    ``torch.is_inference_mode_enabled``, ``torch._C._is_torch_function_mode_enabled``,
    ``torch._C._len_torch_dispatch_stack``). Raises ``OSError`` when a library or symbol is missing; used only once
    proven (``jitkey._torch_modes``)."""

    def __new__(
        cls,
        cpu_lib: str,
        c10_lib: str,
        functions: Sequence[Callable[[], Any]],
        /,
        *,
        loaded_only: bool = True,
    ) -> _TorchModes: ...
    def values(self) -> tuple[bool, bool, bool, int]:
        """The four reads now, as the Python functions return them."""
    @property
    def functions(self) -> tuple[Callable[[], Any], ...]:
        """The Python functions the reads stand for."""

@final
class _Site:
    """Private (:mod:`jitkey.dsl`): one DSL entry point keyed natively (see :class:`jitkey.dsl.Site`)."""

    def __new__(
        cls,
        sig: Signature,
        cache: LruCache,
        miss: Callable[[tuple[Any, ...]], tuple[Any, Any]],
        fallback: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
        checks: Any,
        state: Any,
        npos: int,
        modes: _TorchModes | None = None,
        device: Callable[[], int] | None = None,
        /,
    ) -> _Site: ...
    @property
    def call(self) -> Callable[..., Any]:
        """``call(*args, **kwargs)``: a builtin bound to this site (vectorcall)."""
    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], /) -> Any:
        """One call, without telling a recording in progress."""
    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, /) -> bytes:
        """The key of such a call (raises where it falls back)."""
    def lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, /) -> Any | None:
        """The plan cached for such a call (None: none)."""
    def use_current(self, shim: _TorchCurrent, /) -> None:
        """Read the current device through ``shim`` (proven) from now on; the first one given is kept."""
    @property
    def reads_device(self) -> bool:
        """Whether a check or state read is the current device (the ``device`` function given)."""
    @property
    def native_reads(self) -> int:
        """How many of the checks and state reads go through torch's C++ functions (or its C shim)."""
    @property
    def cache(self) -> LruCache:
        """The cache of plans."""
    def counts(self) -> dict[str, int]:
        """``replays``, ``bound_calls``, ``stale``."""

@final
class _SiteMethod:
    """Private (:mod:`jitkey.integrations.helion`): a class's ``__call__`` that resolves ``instance.__call__`` to
    ``getattr(instance, attr).call`` (a site's native call) where that is not None, else to ``slow`` bound to the
    instance; read from the class, it is ``slow``."""

    def __new__(cls, attr: str, slow: Callable[..., Any], /) -> _SiteMethod: ...
    def __get__(self, instance: object, owner: type | None = None, /) -> Callable[..., Any]: ...
    @property
    def slow(self) -> Callable[..., Any]:
        """The Python function the method stands for where there is no native call."""

def _recording(delta: int, on_launch: Any = None, on_site: Any = None, /) -> int:
    """Private (:mod:`jitkey.dsl`): a recording starts (+1) or ends (-1); the first call sets the callbacks."""
