"""The sections of ``python -m jitkey bench``: each builds its cases (checked before timing)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jitkey
from jitkey import _reference
from jitkey.bench._harness import Case, Result, SelfTimed, Skipped, set_ratios

SectionResult = list[Case] | Skipped | SelfTimed


def triton_style_key(n: int) -> tuple[Any, ...]:
    """A Triton-style flat key of ``n`` entries: per-arg (type, attr) pairs, a constexpr, num_warps."""
    kinds = ["*fp16", "*fp32", "*bf16", "i32"]
    items: list[Any] = [(kinds[i % 4], "D" if i % 3 else "") for i in range(n - 2)]
    items += [("constexpr", 1024), 4]
    return tuple(items)


def _expect(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")


def key_section(quick: bool) -> SectionResult:
    """encode / digest / fast_hash of key tuples vs hash(tuple) and blake2b(pickle)."""
    cases: list[Case] = []
    for n in (4, 16):
        key = triton_style_key(n)
        group = f"key/{n}-entry tuple"
        ref_enc, ref_digest = _reference.encode(key), _reference.digest(key)

        def check(key: Any = key, ref_enc: bytes = ref_enc, ref_digest: bytes = ref_digest) -> None:
            _expect(jitkey.encode(key), ref_enc, "jitkey.encode vs the reference encoder")
            _expect(jitkey.digest(key), ref_digest, "jitkey.digest vs hashlib.blake2b of the reference")
            _expect(jitkey.fast_hash(key), jitkey.fast_hash(key), "fast_hash determinism")

        env = {"k": key, "hash": hash, "pickle": pickle, "blake2b": hashlib.blake2b, "jk": jitkey}
        cases += [
            Case(group, "python hash(tuple)", "hash(k)", env, check, baseline=True),
            Case(
                group,
                "python blake2b(pickle)",
                "blake2b(pickle.dumps(k), digest_size=32).digest()",
                env,
                check,
            ),
            Case(group, "jitkey.fast_hash", "jk.fast_hash(k)", env, check),
            Case(group, "jitkey.encode", "jk.encode(k)", env, check),
            Case(group, "jitkey.digest", "jk.digest(k)", env, check),
        ]
    return cases


def usual_keys() -> dict[str, tuple[Any, ...]]:
    """Flat cache keys of the usual shapes (4-16 entries of str, int, bool and, with torch, dtypes), by label."""
    keys: dict[str, tuple[Any, ...]] = {
        "4 str·int·bool": ("*fp16", True, 1024, "D"),
        "6 str·int·bool": ("*fp16", "*fp32", True, False, 1024, "D"),
        "16 str·int·bool": tuple(
            ["*fp16", "*fp32", "D", "", True, False, 16, 1024][i % 8] for i in range(16)
        ),
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        f16, f32 = torch.float16, torch.float32
        keys["4 dtype·str·int·bool"] = (f16, "D", 1024, True)
        keys["6 dtype·str·int·bool"] = (f16, f32, True, 1024, "D", 4)
        keys["16 dtype·str·int·bool"] = tuple(
            [f16, "D", 16, True, f32, "", 1024, False][i % 8] for i in range(16)
        )
    return keys


def _probe(stmt: str, env: dict[str, Any]) -> Callable[[], object]:
    """A case's statement as a function returning the value of its last expression (``a; b``: runs ``a``,
    returns ``b``), with ``env`` as its globals."""
    *before, last = stmt.split("; ")
    scope = dict(env)
    exec("def _p():\n" + "".join(f"    {s}\n" for s in before) + f"    return {last}\n", scope)
    return scope["_p"]  # type: ignore[no-any-return]


def _stmt_cases(
    group: str,
    env: dict[str, Any],
    rows: list[tuple[str, str, bool]],
    expect: object,
    miss: dict[str, Any] | None = None,
) -> list[Case]:
    """A case per ``(impl, stmt, baseline)`` row of a cache-hit group. Each checks that its statement returns
    ``expect`` (that very object) and, given ``miss`` (names rebound in ``env`` to arguments that must not hit),
    that it then returns ``None`` or ``jitkey.MISS`` instead."""
    cases: list[Case] = []
    for impl, stmt, baseline in rows:

        def check(impl: str = impl, stmt: str = stmt) -> None:
            if _probe(stmt, env)() is not expect:
                raise AssertionError(f"{impl} ({stmt}) did not return the cached value")
            if miss is not None and _probe(stmt, {**env, **miss})() not in (None, jitkey.MISS):
                raise AssertionError(f"{impl} ({stmt}) hit with arguments that must miss")

        cases.append(Case(group, impl, stmt, env, check, baseline=baseline))
    return cases


#: Other keys (of the same shape) in every cache of the ``cache hit`` groups, so no probe is into an empty table.
FILL = 512


def cache_section(quick: bool) -> SectionResult:
    """Warm hits: LruCache vs dict, functools.lru_cache and cachetools.LRUCache, same key tuple."""
    has_cachetools = importlib.util.find_spec("cachetools") is not None
    cachetools: Any = importlib.import_module("cachetools") if has_cachetools else None
    cases: list[Case] = []
    for n in (4, 16):
        key = triton_style_key(n)
        others = [(*key[:-1], 1000 + i) for i in range(FILL)]
        value = object()
        table = {o: object() for o in others}
        table[key] = value
        lru = jitkey.LruCache(1024)
        tc: Any = cachetools.LRUCache(maxsize=1024) if cachetools is not None else None
        cached = functools.lru_cache(maxsize=1024)(lambda *args, t=table: t.get(args))
        for k, v in table.items():  # the probed key last (the most recently used)
            lru[k] = v
            cached(*k)
            if tc is not None:
                tc[k] = v
        env: dict[str, Any] = {
            "k": key,
            "d": dict(table),
            "lru": lru,
            "cached": cached,
            "tc": tc,
            "mk": object,
        }
        env.update({f"k{i}": item for i, item in enumerate(key)})
        rows = [("dict[tuple]", "d[k]", True), ("jitkey LruCache[tuple]", "lru[k]", False)]
        rows += [
            ("jitkey LruCache.get(tuple)", "lru.get(k)", False),
            ("jitkey LruCache.get_or_insert", "lru.get_or_insert(k, mk)", False),  # a hit: mk is not called
            ("functools.lru_cache(*args)", "cached(*k)", False),
        ]
        if tc is not None:
            rows.append(("cachetools.LRUCache[tuple]", "tc[k]", False))
        cases += _stmt_cases(f"cache hit/{n}-entry", env, rows, value)
        # The same lookups with a freshly built key tuple per call (what a launcher really does).
        fresh = "k = (" + ", ".join(f"k{i}" for i in range(n)) + ",); "
        rows = [
            ("dict[fresh tuple]", fresh + "d[k]", True),
            ("jitkey LruCache[fresh tuple]", fresh + "lru[k]", False),
        ]
        cases += _stmt_cases(f"cache hit, fresh key/{n}-entry", env, rows, value)
    # Flat keys of the usual shapes: LruCache[key] against dict[key], same tuple, in caches that also
    # hold 100 other keys.
    for shape, key in usual_keys().items():
        value = object()
        d: dict[Any, object] = {("other", i): i for i in range(100)}
        lru = jitkey.LruCache(1024)
        for other in d:
            lru[other] = d[other]
        d[key] = value
        lru[key] = value
        rows = [("dict[tuple]", "d[k]", True), ("jitkey LruCache[tuple]", "lru[k]", False)]
        cases += _stmt_cases(f"cache hit, usual key/{shape}", {"k": key, "d": d, "lru": lru}, rows, value)
    return cases


def lookup_section(quick: bool) -> SectionResult:
    """Call arguments → key → cached kernel: Signature.lookup vs the Python, Helion and Triton ways."""
    try:
        from triton.runtime.jit import compute_cache_key, create_function_from_signature

        from jitkey.bench import _lookup_peers as peers
    except ImportError as e:
        return Skipped("lookup", f"needs torch and triton ({e}): pip install 'jitkey[torch,triton]'")
    cases: list[Case] = []
    sentinel = object()

    for n in (2, 4, 8, 16):
        group = f"lookup/triton-style {n} args"
        args = peers.triton_args(n)
        sig = jitkey.Signature(jitkey.rules.triton(peers.KERNELS[n]), extra=("kernel", n, 0))
        cache = jitkey.LruCache(256)
        sig.insert(cache, args, sentinel)
        pykey = peers.python_triton_key(n)
        d = {pykey(args): sentinel}
        hd = {peers.helion_style_key(args): sentinel}
        lru = functools.lru_cache(maxsize=256)(lambda *k, d=d: d.get(k))  # the "compile" of a miss: None
        fn = peers.KERNELS[n]
        binder = create_function_from_signature(fn.signature, fn.params, peers.BACKEND)
        kkc: dict[Any, Any] = {}
        _, spec, options = binder(*args)
        kc = {compute_cache_key(kkc, spec, options): sentinel}

        def via_binder(a: tuple[Any, ...], binder: Any = binder, kkc: Any = kkc, kc: Any = kc) -> object:
            _, spec, options = binder(*a)
            return kc.get(compute_cache_key(kkc, spec, options))

        env = {
            "a": args, "sig": sig, "c": cache, "d": d, "k": pykey, "hd": hd, "hk": peers.helion_style_key,
            "lru": lru, "vb": via_binder,
        }  # fmt: skip
        impls = [
            ("python tuple key + dict", "d.get(k(a))", True),
            ("jitkey Signature.lookup", "sig.lookup(c, a)", False),
            ("helion-style dataclass + dict", "hd.get(hk(a))", False),
            ("python tuple key + lru_cache", "lru(*k(a))", False),
            ("triton binder + key + dict", "vb(a)", False),
        ]
        # a misaligned first tensor (2 bytes in) must miss the aligned entry, in every implementation
        cases += _stmt_cases(group, env, impls, sentinel, miss={"a": (peers.TENSOR[1:], *args[1:])})
    # Helion-style: four tensors, exact sizes and strides.
    group = "lookup/helion-style 4 tensors"
    args = peers.HELION_ARGS
    sig = jitkey.Signature(
        jitkey.rules.helion(["a", "b", "c", "d"], static_shapes=True), extra=("helion", (9, 0))
    )
    cache = jitkey.LruCache(256)
    sig.insert(cache, args, sentinel)
    d = {peers.helion_python_key(args): sentinel}
    hd = {peers.helion_style_key(args): sentinel}
    env = {
        "a": args,
        "sig": sig,
        "c": cache,
        "d": d,
        "k": peers.helion_python_key,
        "hd": hd,
        "hk": peers.helion_style_key,
    }
    impls = [
        ("python tuple key + dict", "d.get(k(a))", True),
        ("jitkey Signature.lookup", "sig.lookup(c, a)", False),
        ("helion-style dataclass + dict", "hd.get(hk(a))", False),
    ]
    # the last tensor with other sizes and strides must miss
    return cases + _stmt_cases(group, env, impls, sentinel, miss={"a": (*args[:3], peers.OTHER.view(4, 256))})


def disk_section(quick: bool) -> SectionResult:
    """Persistent index hits and puts: DiskIndex vs sqlite3 (WAL) vs a file-per-entry store."""
    import itertools
    import sys
    import tempfile

    from jitkey.bench._peers import FileStore, SqliteStore

    if sys.platform == "win32":
        return Skipped("disk", "DiskIndex is unix-only")
    n = 2_000 if quick else 10_000
    value = bytes(range(64))
    keys = [jitkey.digest(("bench", i)) for i in range(n)]
    probe = keys[n // 2]
    tmp = tempfile.TemporaryDirectory(prefix="jitkey-bench-")
    root = Path(tmp.name)
    kinds: dict[str, Any] = {
        "DiskIndex": jitkey.DiskIndex,
        "sqlite3 WAL": SqliteStore,
        "file per entry": FileStore,
    }
    counter = itertools.count()
    gets: list[Case] = []
    opens: list[Case] = []
    puts: list[Case] = []
    for name, kind in kinds.items():
        d = root / name.replace(" ", "_")
        d.mkdir(mode=0o700)
        store = kind(d)
        store.put_many([(k, value) for k in keys])
        env = {
            "s": store,
            "S": kind,
            "p": d,
            "k": probe,
            "v": value,
            "dg": jitkey.digest,
            "c": counter,
            "_tmp": tmp,
        }

        def check_get(store: Any = store, name: str = name) -> None:
            _expect(store.get(probe), value, f"{name}.get of a stored key")
            _expect(store.get(jitkey.digest(("absent", 0))), None, f"{name}.get of an absent key")

        def check_open(kind: Any = kind, d: Path = d, name: str = name) -> None:
            check_get(kind(d), name + " opened again")

        def check_put(store: Any = store, name: str = name) -> None:
            k = jitkey.digest(("put-check", name))
            store.put(k, b"x" * 64)
            _expect(store.get(k), b"x" * 64, f"{name}.get after put")

        impl, base = ("jitkey " + name if kind is jitkey.DiskIndex else name), kind is SqliteStore
        gets.append(Case(f"disk get hit/{n} entries", impl, "s.get(k)", env, check_get, baseline=base))
        # what a fresh process pays for its first entry (DiskIndex validates every record when it opens)
        opens.append(
            Case(f"disk open + first get/{n} entries", impl, "S(p).get(k)", env, check_open, baseline=base)
        )
        put = "s.put(dg(('new', next(c))), v)"
        puts.append(Case("disk put new key (incl. digest)", impl, put, env, check_put, baseline=base))
    return gets + opens + puts  # the puts last: they add entries to the stores


def fnkey_section(quick: bool) -> SectionResult:
    """Per-launch drift check: GlobalsGuard.check vs Triton's used_global_vals loop; function keys:
    jitkey.function_key vs sha256 of the source."""
    from jitkey.bench import _peers as peers
    from jitkey.errors import GlobalsChangedError

    cases: list[Case] = []
    for n in (4, 16):
        kernel, ns = peers.kernel_with_globals(n)
        used = {(f"G{i}", id(ns)): (ns[f"G{i}"], ns) for i in range(n)}
        g_env = {"g": jitkey.GlobalsGuard(kernel), "tc": peers.triton_globals_check, "u": used, "_ns": ns}
        checks = [
            ("triton used_global_vals loop", "tc(u)", True, RuntimeError),
            ("jitkey GlobalsGuard.check", "g.check()", False, GlobalsChangedError),
        ]
        for impl, stmt, baseline, error in checks:

            def check(
                impl: str = impl, stmt: str = stmt, error: type[Exception] = error, env: Any = g_env
            ) -> None:
                ns, run = env["_ns"], _probe(stmt, env)
                run()  # passes now, raises once a global is rebound, passes again once it is restored
                old = ns["G1"]
                ns["G1"] = old + 1000
                try:
                    run()
                except error:
                    pass
                else:
                    raise AssertionError(f"{impl} missed a rebound global")
                finally:
                    ns["G1"] = old
                run()

            cases.append(Case(f"globals check/{n} globals", impl, stmt, g_env, check, baseline=baseline))

    def check_key() -> None:
        for fn in (jitkey.function_key, peers.source_sha256):
            key = fn(peers.kernel_with_helper)
            _expect(
                (len(key), key == fn(peers.kernel_with_helper)),
                (32, True),
                f"{fn.__name__}: 32 bytes, stable",
            )

    env = {"fk": jitkey.function_key, "sha": peers.source_sha256, "f": peers.kernel_with_helper}
    rows = [("sha256 of the source", "sha(f)", True), ("jitkey.function_key", "fk(f)", False)]
    return cases + [
        Case("function key (fn + helper)", i, st, env, check_key, baseline=b) for i, st, b in rows
    ]


def autotune_section(quick: bool) -> SectionResult:
    """A warm autotuned call (no-op launch): jitkey.triton.autotune vs triton.autotune's Autotuner."""
    try:
        from jitkey.bench import _autotune_peers as ap
    except ImportError as e:
        return Skipped("autotune", f"needs torch and triton ({e}): pip install 'jitkey[torch,triton]'")
    tt, t_rec = ap.triton_tuner()
    jt, j_rec = ap.jitkey_tuner()

    def check() -> None:
        for tuner, rec in ((tt, t_rec), (jt, j_rec)):
            rec.last = {}
            tuner.run(*ap.ARGS, grid=(1,), warmup=False)
            _expect(
                (tuner.best_config, rec.last.get("BLOCK")), (ap.WINNER, 256), f"{type(tuner).__name__} config"
            )
        _expect(jt.cache_stats()["tunings"], 1, "jitkey autotune: tuned once")

    env = {"tt": tt, "jt": jt, "a": ap.ARGS}
    group = "autotuned warm call (no-op launch)"
    call = "{}.run(*a, grid=(1,), warmup=False)"
    rows = [("triton Autotuner.run", "tt", True), ("jitkey autotune.run", "jt", False)]
    return [Case(group, impl, call.format(v), env, check, baseline=base, unit="us") for impl, v, base in rows]


def gpu_unavailable_reason() -> str | None:
    """Why the launch section cannot run here (``None`` when it can)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "needs torch, which is not installed: pip install torch  (or: pip install 'jitkey[torch]')"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False); the launch and dsl sections run on an NVIDIA GPU"
    if importlib.util.find_spec("triton") is None:
        return "needs triton, which is not installed: pip install 'jitkey[triton]'"
    return None


def remote_section(quick: bool) -> SectionResult:
    """Redis tier: RemoteIndex get hit / put vs a bare redis-py GET / SET of the same bytes and Triton's
    RedisRemoteCacheBackend; TieredIndex local hit vs DiskIndex alone. Needs redis-server and redis-py."""
    from jitkey.bench import _remote_peers as rp

    s = rp.setup()
    if isinstance(s, str):
        return Skipped("remote", s)
    env = {"ri": s.remote, "r": s.plain, "tb": s.triton, "k": s.key, "rk": s.redis_key, "v": rp.VALUE}
    env.update(raw=s.envelope, fn=[rp.TRITON_FILE], f=rp.TRITON_FILE, dx=s.disk, tx=s.tier, _setup=s)

    def check_remote() -> None:
        _expect(s.remote.get(s.key), rp.VALUE, "RemoteIndex.get of the stored key")
        _expect(s.plain.get(s.redis_key), s.envelope, "redis-py GET of the same Redis key")
        _expect(rp.VALUE in s.envelope, True, "the envelope carries the value")
        if s.triton is not None:
            _expect(s.triton.get([rp.TRITON_FILE]), {rp.TRITON_FILE: rp.VALUE}, "Triton backend get")
        _expect(s.remote.stats()["errors"] + s.remote.stats()["rejects"], 0, "remote errors/rejects")

    def check_tier() -> None:
        before = s.remote.stats()["hits"] + s.remote.stats()["misses"]
        _expect(s.tier.get(s.key), rp.VALUE, "TieredIndex.get (local hit)")
        _expect(s.disk.get(s.key), rp.VALUE, "DiskIndex.get")
        _expect(
            s.remote.stats()["hits"] + s.remote.stats()["misses"], before, "remote untouched by a local hit"
        )

    size = f"{len(rp.VALUE)} B"
    rows = [
        (f"remote get hit ({size})", "redis-py GET (same bytes)", "r.get(rk)", True),
        (f"remote get hit ({size})", "jitkey RemoteIndex.get", "ri.get(k)", False),
        (f"remote get hit ({size})", "triton RedisRemoteCacheBackend.get", "tb.get(fn)", False),
        (f"remote put ({size})", "redis-py SET (same bytes)", "r.set(rk, raw)", True),
        (f"remote put ({size})", "jitkey RemoteIndex.put", "ri.put(k, v)", False),
        (f"remote put ({size})", "triton RedisRemoteCacheBackend.put", "tb.put(f, v)", False),
    ]
    cases = [
        Case(g, impl, stmt, env, check_remote, baseline=base, unit="us")
        for g, impl, stmt, base in rows
        if s.triton is not None or "triton" not in impl
    ]
    cases += [
        Case("tiered local hit", "jitkey DiskIndex.get", "dx.get(k)", env, check_tier, baseline=True),
        Case("tiered local hit", "jitkey TieredIndex.get", "tx.get(k)", env, check_tier),
    ]
    return cases


def launch_section(quick: bool) -> SectionResult:
    """GPU launch overhead: Triton fn[grid] vs the jitkey binding vs CompiledKernel.run vs torch.add."""
    why = gpu_unavailable_reason()
    if why is not None:
        return Skipped("launch", why)
    from jitkey import triton_bench

    batches, launches = (20, 100) if quick else (100, 200)
    return LaunchRun(lambda: triton_bench.run_bench(batches, launches), batches, launches)


@dataclasses.dataclass
class LaunchRun(SelfTimed):
    """A section that times itself (GPU launches need syncs between batches, not timeit)."""

    run: Callable[[], dict[str, Any]]
    batches: int
    launches: int
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        return (
            f"6 kernels (4 to 58 args), {self.batches} batches of {self.launches} launches per implementation,"
            " interleaved"
        )

    def results(self) -> list[Result]:
        res = self.run()  # each implementation's output is checked against torch before timing
        out: list[Result] = []
        for row in res["results"]:
            group = f"launch/{row['case']}"
            floor = row.get("driver floor")
            for impl, (lo, hi) in row["spread"].items():
                out.append(
                    Result(
                        section="launch",
                        group=group,
                        impl=impl if impl != "jitkey" else "jitkey kernel[grid]",
                        median_ns=row[impl] * 1000,
                        min_ns=lo * 1000,
                        max_ns=hi * 1000,
                        repeats=self.batches,
                        number=self.launches,
                        baseline=impl == "triton fn[grid]",
                        unit="us",
                        floor_ratio=row[impl] / floor if floor else None,
                    )
                )
        set_ratios(out)
        return out


def dsl_section(quick: bool) -> SectionResult:
    """Kernel DSL calls (GPU): the torch op vs the DSL plain, with ``triton.jit`` routed, and through jitkey's
    DSL layer, per Helion kernel and FlagGems op (:mod:`jitkey.dsl_bench`: fresh processes per mode)."""
    why = gpu_unavailable_reason()
    if why is not None:
        return Skipped("dsl", why)
    from jitkey import dsl_bench

    reasons = {s: dsl_bench.unavailable(s) for s in dsl_bench.SUITES}
    if all(reasons.values()):
        return Skipped("dsl", "; ".join(f"{s}: {r}" for s, r in reasons.items()))
    rounds, batches, calls = (1, 10, 100) if quick else (2, 40, 200)
    return DslRun(lambda: dsl_bench.run_bench(rounds, batches, calls), rounds, batches, calls)


@dataclasses.dataclass
class DslRun(SelfTimed):
    """The dsl section: it times itself in fresh processes (a DSL's kernels are made once per process)."""

    run: Callable[[], dict[str, Any]]
    rounds: int
    batches: int
    launches: int
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        return f"{self.rounds} processes per mode, {self.batches} batches of {self.launches} calls"

    def results(self) -> list[Result]:
        res = self.run()  # every call's output is checked against the torch op (and the DSL's own path)
        self.skipped = [Skipped("dsl", f"{suite}: {why}") for suite, why in res["skipped"].items()]
        out: list[Result] = []
        names = {
            "torch op": "torch op",
            "plain": "DSL plain",
            "triton": "DSL + jitkey.triton",
            "dsl": "DSL + jitkey.dsl",
        }
        for suite in res["suites"]:
            for row in suite["results"]:
                if "error" in row:
                    continue
                group = f"dsl/{suite['suite']}: {row['case']}"
                for key, impl in names.items():
                    v = row[key] * 1000
                    out.append(
                        Result(
                            section="dsl",
                            group=group,
                            impl=impl,
                            median_ns=v,
                            min_ns=v,
                            max_ns=v,
                            repeats=self.batches,
                            number=self.launches,
                            baseline=key == "torch op",
                            unit="us",
                        )
                    )
        set_ratios(out)
        return out


def cold_section(quick: bool) -> SectionResult:
    """A fresh process's cold path (fresh subprocesses): decoration on any machine, first launches on a GPU."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return Skipped("cold", "needs torch and triton: pip install 'jitkey[torch,triton]'")
    from jitkey.bench._cold import ColdRun

    return ColdRun(quick, gpu_unavailable_reason())


SECTIONS: dict[str, Callable[[bool], SectionResult]] = {
    "key": key_section,
    "cache": cache_section,
    "lookup": lookup_section,
    "disk": disk_section,
    "fnkey": fnkey_section,
    "autotune": autotune_section,
    "remote": remote_section,
    "launch": launch_section,
    "dsl": dsl_section,
    "cold": cold_section,
}
#: What ``jitkey bench`` runs without ``--only``: every section but ``cold`` (fresh processes, about a minute on
#: a CPU, several on a GPU; ``--only cold`` runs it).
DEFAULT_SECTIONS = [name for name in SECTIONS if name != "cold"]
