"""jitkey.LruCache: API, key semantics, a model-based test, threads, single-flight, lifetimes."""

from __future__ import annotations

import functools
import gc
import sys
import threading
import time
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import jitkey
from jitkey import LruCache
from jitkey.errors import KeyDepthError, UnsupportedKeyError


class Obj:
    """A weak-referenceable value."""

    def __init__(self, tag: object = None) -> None:
        self.tag = tag


def join_all(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads hung (deadlock?)"


# ---- API ----------------------------------------------------------------------------------------


def test_basic_mapping_api() -> None:
    c = LruCache(8)
    assert len(c) == 0 and c.capacity == 8
    assert c.get("a") is None
    assert c.get("a", 5) == 5
    with pytest.raises(KeyError) as ei:
        c["a"]
    assert ei.value.args == ("a",)
    with pytest.raises(KeyError) as ei:  # a tuple key is the one argument, as dict raises it
        c[("b",)]
    assert ei.value.args == (("b",),)
    v = Obj()
    c["a"] = v
    assert c["a"] is v and c.get("a") is v and c.get("a", 5) is v
    assert "a" in c and "b" not in c
    c["a"] = 2
    assert c["a"] == 2 and len(c) == 1
    assert c.pop("a") == 2
    assert c.pop("a", None) is None
    assert c.pop("a", "d") == "d"
    with pytest.raises(KeyError):
        c.pop("a")
    with pytest.raises(TypeError):
        c.pop("a", 1, 2)  # type: ignore[call-overload]
    c["b"] = 1
    del c["b"]
    with pytest.raises(KeyError):
        del c["b"]
    c[1] = 1
    c[2] = 2
    c.clear()
    assert len(c) == 0 and 1 not in c
    assert "capacity=8" in repr(c)


def test_stats() -> None:
    c = LruCache(2, shards=1)
    c["a"] = 1
    c["b"] = 2
    assert c["a"] == 1
    assert c.get("zz") is None
    assert "b" in c  # no hit, no miss
    c["c"] = 3  # evicts b (a was visited)
    assert "b" not in c
    assert c.get_or_insert("a", lambda: 0) == 1
    assert c.get_or_insert("d", lambda: 4) == 4
    assert c.stats() == {"hits": 2, "misses": 2, "inserts": 4, "evictions": 2, "size": 2, "capacity": 2}


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="capacity"):
        LruCache(0)
    with pytest.raises(ValueError, match="shards"):
        LruCache(4, shards=0)
    with pytest.raises(OverflowError):
        LruCache(-1)
    with pytest.raises(TypeError):
        LruCache("4")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LruCache(4, 2)  # type: ignore[misc]
    assert LruCache(5, shards=8).shards == 4
    assert LruCache(100).shards == 1
    with pytest.raises(TypeError):

        class Sub(LruCache):  # type: ignore[misc]
            pass


def test_keys_compare_by_encoding() -> None:
    c = LruCache(64)
    keys: list[object] = [1, True, 1.0, "1", b"1", (1,), ((1,),), None, 0, False, -0.0, 0.0, ("a", 1)]
    for i, k in enumerate(keys):
        c[k] = i
    for i, k in enumerate(keys):
        assert c[k] == i
    assert len(c) == len(keys)
    # Equal trees built separately are the same key.
    c[("*fp16", "D", 16)] = "x"
    assert c[("*fp16", "D", 8 * 2)] == "x"


class Raises:
    def __jitkey__(self) -> object:
        raise ZeroDivisionError("boom")


def test_bad_keys_raise_and_leave_cache_unchanged() -> None:
    c = LruCache(4)
    c["ok"] = 1
    before = c.stats()
    deep: object = 0
    for _ in range(jitkey.MAX_DEPTH + 2):
        deep = (deep,)
    for bad in ([1], {"a": 1}, object(), (1, [2]), Raises()):
        for op in (
            lambda k: c.get(k),
            lambda k: c[k],
            lambda k: c.__setitem__(k, 1),
            lambda k: k in c,
            lambda k: c.pop(k, None),
            lambda k: c.get_or_insert(k, lambda: 1),
        ):
            with pytest.raises(UnsupportedKeyError) as ei:
                op(bad)
            if isinstance(bad, Raises):
                assert isinstance(ei.value.__cause__, ZeroDivisionError)
    with pytest.raises(KeyDepthError):
        c[deep] = 1
    assert c.stats() == before and len(c) == 1 and c["ok"] == 1


def test_get_or_insert_basic_and_error() -> None:
    c = LruCache(4)
    assert c.get_or_insert("k", lambda: "v") == "v"
    assert c.get_or_insert("k", lambda: pytest.fail("factory ran on a hit")) == "v"

    def boom() -> object:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        c.get_or_insert("e", boom)
    assert "e" not in c
    with pytest.raises(TypeError):
        c.get_or_insert("f", 3)  # type: ignore[arg-type]
    assert "f" not in c
    # The factory may use the cache for other keys.
    assert c.get_or_insert("outer", lambda: ("o", c.get_or_insert("inner", lambda: "i"))) == ("o", "i")
    assert c["inner"] == "i"


def test_get_or_insert_same_key_reentry_raises() -> None:
    c = LruCache(4)

    def recurse() -> object:
        return c.get_or_insert("k", recurse)

    with pytest.raises(RuntimeError, match="re-entered"):
        c.get_or_insert("k", recurse)
    assert "k" not in c
    assert c.get_or_insert("k", lambda: 1) == 1


# ---- model-based ---------------------------------------------------------------------------------

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.0, -0.0, 1.0, float("nan")]),
    st.sampled_from(["", "a", "1", "*fp16", "D"]),
    st.sampled_from([b"", b"1"]),
)
keys = st.recursive(leaves, lambda kids: st.tuples(kids, kids) | st.tuples(kids), max_leaves=4)


class LruModel(RuleBasedStateMachine):
    """Against the documented invariants of an LRU approximation: size <= capacity; a just-inserted
    entry is retrievable; a hit returns exactly the value last stored under that key (never another
    key's); ``in``/``pop`` agree with it; with room for every key, it behaves exactly like a dict."""

    @initialize(capacity=st.integers(1, 12), shards=st.none() | st.integers(1, 4))
    def setup(self, capacity: int, shards: int | None) -> None:
        self.cache = LruCache(capacity, shards=shards)
        self.capacity = capacity
        self.last: dict[bytes, object] = {}  # encoding -> last value stored (it may be evicted)
        self.evictions_possible = False
        # Each shard evicts on its own once it holds its share of the capacity.
        self.room = capacity // self.cache.shards

    def _check_hit(self, key: object, got: object, sentinel: object) -> None:
        enc = jitkey.encode(key)
        if got is sentinel:
            assert self.evictions_possible or enc not in self.last
        else:
            assert enc in self.last and got is self.last[enc]

    @rule(key=keys)
    def insert(self, key: object) -> None:
        v = Obj(key)
        self.cache[key] = v
        self.last[jitkey.encode(key)] = v
        if len(self.last) > self.room:
            self.evictions_possible = True
        assert self.cache[key] is v

    @rule(key=keys)
    def get(self, key: object) -> None:
        sentinel = object()
        self._check_hit(key, self.cache.get(key, sentinel), sentinel)

    @rule(key=keys)
    def contains(self, key: object) -> None:
        present = key in self.cache
        enc = jitkey.encode(key)
        assert not present or enc in self.last
        assert present or self.evictions_possible or enc not in self.last

    @rule(key=keys)
    def pop(self, key: object) -> None:
        sentinel = object()
        got = self.cache.pop(key, sentinel)
        self._check_hit(key, got, sentinel)
        self.last.pop(jitkey.encode(key), None)
        assert key not in self.cache

    @rule(key=keys)
    def get_or_insert(self, key: object) -> None:
        v = Obj(key)
        got = self.cache.get_or_insert(key, lambda: v)
        enc = jitkey.encode(key)
        if got is v:
            assert self.evictions_possible or enc not in self.last
            self.last[enc] = v
            if len(self.last) > self.room:
                self.evictions_possible = True
        else:
            assert enc in self.last and got is self.last[enc]

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.last.clear()
        self.evictions_possible = False

    @invariant()
    def bounded_and_consistent(self) -> None:
        n = len(self.cache)
        assert n <= self.capacity
        assert self.cache.stats()["size"] == n
        if not self.evictions_possible:
            assert n == len(self.last)


TestLruModel = LruModel.TestCase
TestLruModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(keys, st.integers()), max_size=40))
@settings(max_examples=100, deadline=None)
def test_unbounded_behaves_like_dict(items: list[tuple[object, int]]) -> None:
    c = LruCache(1000)
    d: dict[bytes, int] = {}
    for k, v in items:
        c[k] = v
        d[jitkey.encode(k)] = v
    assert len(c) == len(d)
    for k, _ in items:
        assert c[k] == d[jitkey.encode(k)]


# ---- threads ------------------------------------------------------------------------------------


def _stress(n_threads: int, ops: int, capacity: int, key_space: int) -> None:
    c = LruCache(capacity, shards=4)
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def worker(tid: int) -> None:
        try:
            start.wait()
            for i in range(ops):
                k = ("k", (i * 7919 + tid * 104729) % key_space)
                r = i % 10
                if r < 3:
                    c[k] = (k, tid, i)
                elif r == 3:
                    c.pop(k, None)
                elif r == 4:
                    got = c.get_or_insert(k, functools.partial(tuple, (k, tid, -1)))
                    assert got[0] == k
                else:
                    got = c.get(k)
                    assert got is None or got[0] == k, f"{k} returned another key's value {got}"
                if i % 2000 == 0 and tid == 0:
                    c.clear()
                assert len(c) <= capacity
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    join_all(threads, timeout=600)
    assert not errors, errors[0]
    assert len(c) <= capacity
    for i in range(key_space):
        k = ("k", i)
        v = c.get(k)
        assert v is None or v[0] == k


def test_thread_stress_no_wrong_values() -> None:
    _stress(n_threads=8, ops=4000, capacity=64, key_space=300)


@pytest.mark.slow
def test_thread_stress_long() -> None:
    _stress(n_threads=16, ops=100_000, capacity=32, key_space=1000)


def test_threads_no_lost_inserts_without_eviction() -> None:
    c = LruCache(100_000)
    n, per = 8, 500
    start = threading.Barrier(n)

    def writer(tid: int) -> None:
        start.wait()
        for i in range(per):
            c[(tid, i)] = (tid, i)
            c.get((tid - 1) % n)  # interleave reads of other keys

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    join_all(threads)
    assert len(c) == n * per
    for tid in range(n):
        for i in range(per):
            assert c[(tid, i)] == (tid, i)
    s = c.stats()
    assert s["evictions"] == 0 and s["inserts"] == n * per


def test_single_flight_slow_factory_8_threads() -> None:
    c = LruCache(16)
    calls = 0
    lock = threading.Lock()
    start = threading.Barrier(8)
    results: list[object] = []

    def factory() -> object:
        nonlocal calls
        with lock:
            calls += 1
        # Pure-Python work needs the interpreter: waiters that did not detach would hang it.
        deadline = time.monotonic() + 0.3
        x = 0
        while time.monotonic() < deadline:
            x += 1
        return Obj("compiled")

    def caller() -> None:
        start.wait()
        results.append(c.get_or_insert(("kernel", 1), factory))

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    join_all(threads)
    assert calls == 1
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert c[("kernel", 1)] is results[0]
    assert c.stats()["inserts"] == 1


def test_single_flight_factory_raises_reaches_every_caller() -> None:
    c = LruCache(16)
    calls = 0
    start = threading.Barrier(8)
    outcomes: list[object] = []

    def factory() -> object:
        nonlocal calls
        calls += 1
        time.sleep(0.3)
        raise ValueError("compile failed")

    def caller() -> None:
        start.wait()
        try:
            outcomes.append(c.get_or_insert("k", factory))
        except ValueError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    join_all(threads)
    assert calls == 1
    assert len(outcomes) == 8 and all(isinstance(o, ValueError) for o in outcomes)
    assert "k" not in c and len(c) == 0
    assert c.get_or_insert("k", lambda: 7) == 7


# ---- lifetimes ----------------------------------------------------------------------------------


def test_values_freed_on_eviction_replacement_pop_clear_and_del() -> None:
    c = LruCache(2, shards=1)
    a, b, x = Obj(), Obj(), Obj()
    wa, wb, wx = weakref.ref(a), weakref.ref(b), weakref.ref(x)
    c["a"], c["b"] = a, b
    c["x"] = x
    del a, b, x
    # One of a/b was evicted and is already gone (no gc.collect needed: plain refcounting).
    assert (wa() is None) + (wb() is None) == 1
    live = "a" if wa() is not None else "b"
    y = Obj()
    wy = weakref.ref(y)
    c[live] = y  # replacement frees the old value
    del y
    assert wa() is None and wb() is None
    assert isinstance(c.pop("x"), Obj)
    assert wx() is None
    c.clear()
    assert wy() is None
    z = Obj()
    wz = weakref.ref(z)
    c["z"] = z
    del z
    del c
    assert wz() is None


def test_no_reference_leaks_on_hits_misses_and_errors() -> None:
    c = LruCache(4)
    v = Obj()
    key = ("*fp16", "D", 16, ("constexpr", 1024))
    c[key] = v

    def fails() -> object:
        raise ValueError

    base = sys.getrefcount(v)
    for _ in range(1000):
        assert c[key] is v
        assert c.get(key) is v
        assert c.get_or_insert(key, Obj) is v
        assert key in c
        c.get("missing")
        with pytest.raises(ValueError):
            c.get_or_insert("bad", fails)
    assert sys.getrefcount(v) == base
    k0 = sys.getrefcount(key)
    for _ in range(100):
        with pytest.raises(KeyError):
            c["nope"]
    c[key] = 1
    assert sys.getrefcount(key) == k0  # keys are encoded, never retained


def test_del_during_eviction_may_use_the_cache() -> None:
    c = LruCache(2, shards=1)
    seen: list[object] = []

    class Touchy:
        def __init__(self, n: int) -> None:
            self.n = n

        def __del__(self) -> None:
            # Reads, writes and removals from inside eviction: no deadlock, no corruption.
            seen.append((self.n, len(c), c.get("hot")))
            c.pop(("gone", self.n), None)
            if self.n < 5:
                c[("from-del", self.n)] = self.n

    c["hot"] = "h"
    for i in range(10):
        c[("t", i)] = Touchy(i)
    c.clear()
    gc.collect()
    assert len(seen) == 10
    assert len(c) <= 2


def test_cycles_through_the_cache_are_collected() -> None:
    c = LruCache(4)
    v = Obj()
    v.tag = c  # value -> cache -> value
    c["self"] = v
    wv = weakref.ref(v)
    del v, c
    gc.collect()
    assert wv() is None  # __traverse__/__clear__ let the collector break the cycle


def test_gc_traverse_sees_values() -> None:
    c = LruCache(4)
    v = Obj()
    c["a"] = v
    assert c in gc.get_referrers(v)


def test_get_or_insert_value_evicted_immediately_still_returned() -> None:
    c = LruCache(1)
    c["hot"] = 1
    assert c["hot"] == 1  # visited, but capacity 1: the new entry evicts it
    assert c.get_or_insert("new", lambda: "n") == "n"
    assert len(c) == 1


def test_many_entries_grow_and_stay_correct() -> None:
    c = LruCache(50_000)
    for i in range(20_000):
        c[i] = i
    assert len(c) == 20_000
    assert all(c[i] == i for i in range(0, 20_000, 7))
    assert c.stats()["evictions"] == 0


# ---- the structural route ----------------------------------------------------------------------
# Keys of exact builtins and dtypes are looked up by a structural hash and compare against the stored
# key object; every other key by its encoding. Both routes must give exactly encode-equality.

_torch = pytest.importorskip("torch")

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 16, 2**31, 2**63 - 1, -(2**63)]),
    st.integers(min_value=2**63, max_value=2**66),  # big ints: encoded route
    st.sampled_from([0.0, -0.0, 1.0, float("nan"), float("inf")]),
    st.sampled_from(["", "1", "D", "*fp16", "é"]),
    st.sampled_from([b"", b"1"]),
    st.sampled_from([_torch.float16, _torch.float32, _torch.bfloat16]),
    st.sampled_from([_torch.device("cpu"), _torch.device("cuda", 0)]),  # encoded route
)
_trees = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=8)


def _rebuilt(v: object) -> object:
    """An equal key tree made of new objects where Python allows (fresh tuples and strs)."""
    if type(v) is tuple:
        return tuple(_rebuilt(x) for x in v)
    if type(v) is str:
        return "".join([v, ""]) if not v else str(v[:1]) + v[1:]
    return v


@settings(max_examples=1500, deadline=None)
@given(_trees, _trees)
def test_lookup_hits_exactly_when_encodings_are_equal(a: object, b: object) -> None:
    cache = LruCache(64)
    cache[a] = "A"
    same = jitkey.encode(a) == jitkey.encode(b)
    assert (cache.get(b, "miss") == "A") == same
    assert (b in cache) == same
    assert cache.get(_rebuilt(a)) == "A"
    # get_or_insert agrees with get, on both routes.
    assert cache.get_or_insert(b, lambda: "B") == ("A" if same else "B")
    assert cache[b] == ("A" if same else "B")


def test_structural_lookalikes_do_not_collide() -> None:
    cache = LruCache(64)
    lookalikes = [True, 1, 1.0, "1", b"1", (1,), 0.0, -0.0, False, 0, None, (), _torch.float32, "float32"]
    for i, k in enumerate(lookalikes):
        cache[k] = i
    for i, k in enumerate(lookalikes):
        assert cache[k] == i
    assert len(cache) == len(lookalikes)


def test_unkeyable_probe_raises_on_the_structural_route_too() -> None:
    cache = LruCache(8)
    cache[("a", 1)] = 1
    with pytest.raises(UnsupportedKeyError, match="surrogate"):
        cache.get(("a", "\ud800"))
    with pytest.raises(UnsupportedKeyError):
        cache.get(("a", [1]))


def test_layout_fast_path_is_proven_on_this_interpreter() -> None:
    # On CPython 3.10-3.14 GIL builds the direct tuple/str reads are enabled only after the import-time
    # proof; either way results must not change (the property tests above run on whichever path).
    assert isinstance(jitkey._core._FAST_LAYOUT, bool)
    if sys.version_info < (3, 15) and getattr(sys, "_is_gil_enabled", lambda: True)():
        assert jitkey._core._FAST_LAYOUT


@settings(max_examples=1000, deadline=None)
@given(_trees, _trees)
def test_subscript_slot_hits_exactly_when_encodings_are_equal(a: object, b: object) -> None:
    # `cache[key]` takes the native slot (structural hits answered without PyO3's wrapper); the type's
    # `__getitem__` descriptor and `.get` stay PyO3's: all three agree, hit or miss.
    cache = LruCache(64)
    cache[a] = "A"
    same = jitkey.encode(a) == jitkey.encode(b)
    for probe in (b, _rebuilt(b)):
        if same:
            assert cache[probe] == "A"
            assert LruCache.__getitem__(cache, probe) == "A"
        else:
            with pytest.raises(KeyError):
                cache[probe]
            with pytest.raises(KeyError):
                LruCache.__getitem__(cache, probe)
    assert cache[_rebuilt(a)] == "A"


def test_subscript_slot_counts_hits_and_misses_and_raises_like_get() -> None:
    cache = LruCache(8)
    key = ("*fp16", True, 1024, "D")
    cache[key] = "v"
    before = cache.stats()
    for _ in range(5):
        assert cache[key] == "v"
    assert cache[("*fp16", True, 1024, "D")] == "v"  # an equal, new tuple
    with pytest.raises(KeyError):
        cache[("*fp16", 1, 1024, "D")]  # 1 is not True
    with pytest.raises(UnsupportedKeyError):
        cache[("a", [1])]
    with pytest.raises(KeyDepthError):
        deep: object = ()
        for _ in range(jitkey.MAX_DEPTH + 2):
            deep = (deep,)
        cache[deep]
    after = cache.stats()
    assert after["hits"] - before["hits"] == 6
    assert after["misses"] - before["misses"] == 1


def test_subscript_slot_is_installed_with_a_gil() -> None:
    assert isinstance(jitkey._core._LRU_FAST_SUBSCRIPT, bool)
    if jitkey._core._FAST_LAYOUT and getattr(sys, "_is_gil_enabled", lambda: True)():
        assert jitkey._core._LRU_FAST_SUBSCRIPT


def test_subscript_slot_releases_displaced_values() -> None:
    # A hit with displaced values pending leaves them to PyO3's path, which releases them.
    class Tracked:
        pass

    cache = LruCache(1, shards=1)
    cache[("a",)] = 1
    old = Tracked()
    ref = weakref.ref(old)
    cache[("b",)] = old
    del old
    cache[("c",)] = 2  # evicts ("b",)
    assert cache[("c",)] == 2
    gc.collect()
    assert ref() is None


def test_int_keys_around_the_digit_boundaries_hit_only_themselves() -> None:
    # Small ints are hashed from their digit read directly (where proven at import), others via the C API.
    edges = [0, 1, -1, 255, 256, 257, 2**30 - 1, 2**30, 2**31, 2**60, 2**63 - 1, -(2**63)]
    ints = sorted(
        {s * e + d for e in edges for s in (1, -1) for d in (-1, 0, 1) if -(2**63) <= s * e + d < 2**63}
    )
    cache = LruCache(4096)
    for i in ints:
        cache[("n", i)] = i
    for i in ints:
        assert cache[("n", int(str(i)))] == i  # an equal int object built anew
        assert cache.get(("n", i)) == i
    assert len(cache) == len(ints)
