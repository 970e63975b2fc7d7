"""Run by tests/test_driver_launch.py in a child process whose ``libcuda.so.1`` is the stand-in of
``tests/data/standin_cuda.c``: the same calls through Triton's own launcher (a real ``CudaLauncher`` of the
installed Triton: 3.6's generated C launcher, or 3.9's generic ``launch`` of ``driver.c``) and through the
``jitkey._core._LaunchPlan`` that ``jitkey.triton`` makes for it, recorded by the stand-in and compared byte for
byte. Prints a JSON summary."""

from __future__ import annotations

import collections
import ctypes
import json
import math
import random
import struct
import sys
import types
from typing import Any

import triton
from triton.backends.nvidia import driver as nv
from triton.runtime import _allocation

from jitkey._triton_table import LAUNCHER_CODE
from jitkey.triton._installed import LazyLauncher36, launch_plan, launcher_code_digest

lib = ctypes.CDLL("libcuda.so.1")  # the stand-in (LD_LIBRARY_PATH): the one both launchers load

DIALECT = LAUNCHER_CODE[launcher_code_digest()]
from triton.runtime.driver import driver  # noqa: E402

if DIALECT == "3.9":  # CudaLauncher reads triton.runtime.driver.active (no GPU here: made active by hand)
    driver.set_active(nv.CudaDriver())
else:  # LazyLauncher36 builds its launcher with driver.active.launcher_cls (no GPU here: no driver to find)
    driver.set_active(types.SimpleNamespace(launcher_cls=nv.CudaLauncher))  # type: ignore[arg-type]

SIZES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u1": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8}
SIZES |= {"fp16": 2, "bf16": 2, "fp32": 4, "f32": 4, "fp64": 8}
if DIALECT == "3.9":
    SIZES |= {"i1": 4, "u1": 4}  # driver.c extracts i1 as int32_t, u1 as uint32_t

FUNCTION = 0xF00D
STREAM = 0x5EED


def flat(types_: Any) -> list[str]:
    out: list[str] = []
    for t in types_:
        out += flat(t) if isinstance(t, tuple) else [t]
    return out


def expect(sig: dict[str, Any]) -> None:
    sizes = [8 if t.startswith("*") else SIZES[t] for t in flat(sig.values()) if t != "constexpr"] + [8, 8]
    arr = (ctypes.c_int * len(sizes))(*sizes)
    lib.standin_expect(len(sizes), arr)


def record() -> bytes:
    buf = ctypes.create_string_buffer(65536)
    n = lib.standin_record(buf, len(buf))
    return buf.raw[:n]


def calls() -> str:
    buf = ctypes.create_string_buffer(4096)
    lib.standin_calls(buf, len(buf))
    return buf.value.decode()


class Meta(types.SimpleNamespace):
    """What a CudaLauncher is built from besides the signature (``CompiledKernel.metadata``)."""


def launcher(
    sig: dict[str, Any], meta: tuple[int, int, int, bool, bool], mode: str = "", **scratch: int
) -> tuple[Any, Any, Any]:
    """``(run, plan, why)``: Triton's ``CudaLauncher`` for ``sig`` and the plan jitkey makes for it
    (``mode``: the kernel's instrumentation mode)."""
    run = runner(sig, meta, mode, **scratch)
    return (run, *plan_for(run, sig, meta))


def plan_for(run: Any, sig: dict[str, Any], meta: tuple[int, int, int, bool, bool]) -> tuple[Any, Any]:
    nw, nctas, smem, _, _ = meta
    ck = types.SimpleNamespace(function=FUNCTION, packed_metadata=(nw, nctas, smem), src=run.jk_src)
    return launch_plan(ck, run, len(sig))


def lazy_for(run: Any, sig: dict[str, Any], meta: tuple[int, int, int, bool, bool]) -> tuple[Any, Any]:
    """Under 3.6: the ``LazyLauncher36`` jitkey's L2 puts in place of ``run`` (same source and metadata), and the
    plan made from it."""
    nw, nctas, smem, _, _ = meta
    ck = types.SimpleNamespace(function=FUNCTION, packed_metadata=(nw, nctas, smem), src=run.jk_src)
    ck.metadata = run.jk_md
    lazy = LazyLauncher36(ck)
    return lazy, launch_plan(ck, lazy, len(sig))[0]


def runner(sig: dict[str, Any], meta: tuple[int, int, int, bool, bool], mode: str, **scratch: int) -> Any:
    _, nctas, _, coop, pdl = meta
    src = types.SimpleNamespace(
        signature=dict(sig), constants={}, fn=types.SimpleNamespace(arg_names=list(sig))
    )
    md = Meta(
        num_ctas=nctas,
        global_scratch_size=scratch.get("global_size", 0),
        global_scratch_align=scratch.get("global_align", 1),
        profile_scratch_size=scratch.get("profile_size", 0),
        profile_scratch_align=scratch.get("profile_align", 1),
        launch_cooperative_grid=coop,
        launch_pdl=pdl,
        instrumentation_mode=mode,
    )
    run = nv.CudaLauncher(src, md)
    run.jk_src, run.jk_md = src, md
    return run


def attribute_ids(rec: bytes) -> list[int]:
    """The launch attribute ids of a record (after the config, stream and function: numAttrs, then
    72-byte CUlaunchAttributes whose id comes first)."""
    (n,) = struct.unpack_from("<I", rec, 44)
    return [struct.unpack_from("<i", rec, 48 + 72 * i)[0] for i in range(n)]


def outcome(fn: Any) -> tuple[str, Any, str]:
    """What ``fn`` did: launched (the record), raised (the error) or nothing; and the driver calls it made."""
    calls()
    before = lib.standin_launches()
    try:
        fn()
    except Exception as exc:  # what Triton raised: compared where jitkey claims the call
        return "raised", f"{type(exc).__name__}: {exc}", calls()
    if lib.standin_launches() == before:
        return "nothing", None, calls()
    return "launched", record(), calls()


def triton_call(run: Any, meta: tuple[int, int, int, bool, bool], grid: Any, args: Any) -> Any:
    """What JITFunction.run calls: ``ck.run(*grid, stream, function, packed_metadata, md, enter, exit, *args)``."""
    nw, nctas, smem, _, _ = meta
    return lambda: run(*grid, STREAM, FUNCTION, (nw, nctas, smem), None, None, None, *args)


def jitkey_call(plan: Any, grid: Any, args: Any, claimed: list[bool]) -> Any:
    return lambda: claimed.append(plan.launch(*grid, STREAM, None, *args))


def compare(
    sig: dict[str, Any], cases: list[Any], meta: tuple[int, int, int, bool, bool], **scratch: int
) -> dict:
    """Each call through jitkey's plan, then through Triton's launcher: a claimed call must do exactly what
    Triton's does (the same record, the same error, the same driver calls). A call jitkey declines goes to
    Triton only where Triton's behaviour is defined (``(grid, args, False)``: it would read past a tuple)."""
    run, plan, why = launcher(sig, meta, **scratch)
    if plan is None:
        return {"plan": None, "why": why}
    expect(sig)
    stats: dict[str, Any] = {
        "same": 0,
        "declined": 0,
        "mismatch": [],
        "declined_triton": collections.Counter(),
    }
    # what the claimed calls did in both (outcome, driver calls) and the attribute ids they launched with
    stats["did"], stats["attrs"] = collections.Counter(), []
    # Under 3.6, the lazy launcher of the L2: its plan claims exactly what the real launcher's plan claims, and
    # calling it (what a declined hit does) launches as Triton's launcher does.
    lazy, lazy_plan = lazy_for(run, sig, meta) if DIALECT == "3.6" else (None, None)
    stats["lazy_same"], stats["lazy_mismatch"] = 0, []
    for case in cases:
        grid, args = case[0], case[1]
        claimed: list[bool] = []
        j = outcome(jitkey_call(plan, grid, args, claimed))
        if lazy is not None:
            lazy_claimed: list[bool] = []
            lj = outcome(jitkey_call(lazy_plan, grid, args, lazy_claimed))
            lt = outcome(triton_call(lazy, meta, grid, args)) if len(case) < 3 or case[2] else None
            rt = outcome(triton_call(run, meta, grid, args)) if lt is not None else None
            if (lj, lazy_claimed, lt) == (j, claimed, rt):
                stats["lazy_same"] += 1
            else:
                stats["lazy_mismatch"].append({"grid": grid, "args": repr(args), "lazy": repr((lj, lt))})
        if claimed == [False]:
            stats["declined"] += 1
            if len(case) < 3 or case[2]:
                stats["declined_triton"][outcome(triton_call(run, meta, grid, args))[0]] += 1
            continue
        t = outcome(triton_call(run, meta, grid, args))
        if t != j:
            stats["mismatch"].append({"grid": grid, "args": repr(args), "triton": repr(t), "jitkey": repr(j)})
        else:
            stats["same"] += 1
            stats["did"][f"{t[0]} {t[2]}"] += 1
            if t[0] == "launched" and attribute_ids(t[1]) not in stats["attrs"]:
                stats["attrs"].append(attribute_ids(t[1]))
    stats["counts"] = plan.counts()
    return stats


def ints_case(rng: random.Random) -> tuple[dict[str, Any], list[Any]]:
    sig = {"p": "*fp32", "q": "*i8", "b": "i1", "c": "i8", "d": "i16", "e": "i32", "f": "i64"}
    sig |= {"g": "u1", "h": "u8", "i": "u16", "j": "u32", "k": "u64", "BLOCK": "constexpr"}
    edges = {
        "i1": [True, False, 0, 1, 255],
        "i8": [0, 1, 127, 255],
        "i16": [-(2**15), -1, 0, 2**15 - 1],
        "i32": [-(2**31), -7, 0, 2**31 - 1, True],
        "i64": [-(2**63), -1, 2**63 - 1, 12345678901],
        "u1": [0, 1, True],
        "u8": [0, 200, 255],
        "u16": [0, 65535],
        "u32": [0, 2**32 - 1],
        "u64": [0, 2**64 - 1, 2**63],
    }
    ptrs = [None, 0, 0x7F0000001000, 2**64 - 1, 0x10000]
    calls_ = []
    for _ in range(120):
        vals = [rng.choice(ptrs), rng.choice(ptrs)]
        vals += [
            rng.choice(edges[t]) for t in ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64")
        ]
        vals.append(rng.choice([128, "anything", None]))  # the constexpr: never passed
        grid = rng.choice([(1, 1, 1), (7, 3, 2), (65535, 1, 1), (0, 1, 1), (2, 0, 5)])
        calls_.append((grid, tuple(vals)))
    # out of the type's range: 3.6 raises or masks (jitkey declines); 3.9 reads them as long and truncates
    calls_.append(((1, 1, 1), (None, None, 256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls_.append(((1, 1, 1), (None, None, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls_.append(((1, 1, 1), (None, None, 0, 0, 0, 2**31, 0, 0, 0, 0, 0, 0, 1)))
    # declined in both: not a pointer jitkey understands, a grid that is not int32
    calls_.append(((1, 1, 1), (-5, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls_.append(((1, 1, 1), (1.5, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls_.append(((2**31, 1, 1), (None, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    return sig, calls_


# One value per call outside its type's range in 3.9 (i1 and u1 are 32-bit there): (type, value, whether
# Triton 3.9 reads it without an error). 3.9's extractors read i8/i16/i32/i1 with PyLong_AsLong, u8/u16/u32/u1
# with PyLong_AsUnsignedLong (64 bits here), i64/u64 with PyLong_As(Unsigned)LongLong, then narrow as C does;
# what they cannot read raises, and jitkey declines exactly those. Under 3.6 jitkey declines every value
# outside the type's own range (3.6 raises for some and masks others), so it takes only i1=2 and u1=2 (one
# byte there).
WIDE_INTS = [
    ("i1", 2, True),
    ("i1", -1, True),
    ("i1", 2**62 + 3, True),
    ("i8", 300, True),
    ("i8", -129, True),
    ("i8", 2**63 - 1, True),
    ("i8", -(2**63), True),
    ("i8", 2**63, False),
    ("i8", -(2**63) - 1, False),
    ("i16", 70000, True),
    ("i16", -40000, True),
    ("i32", 2**31, True),
    ("i32", -(2**31) - 1, True),
    ("i32", 2**40 + 5, True),
    ("i32", 2**64, False),
    ("i64", 2**63, False),
    ("i64", -(2**63) - 1, False),
    ("u1", 2, True),
    ("u1", 2**33 + 1, True),
    ("u1", -5, False),
    ("u8", 256, True),
    ("u8", 2**64 - 1, True),
    ("u8", -1, False),
    ("u16", 65536 + 7, True),
    ("u32", 2**32, True),
    ("u32", 2**64 - 1, True),
    ("u32", -1, False),
    ("u32", 2**64, False),
    ("u64", -1, False),
    ("u64", 2**64, False),
    ("i32", 3.0, False),  # not an int: PyLong_AsLong raises TypeError
]


def wide_ints_case() -> tuple[dict[str, Any], list[Any]]:
    names = ["i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"]
    sig = {f"a_{t}": t for t in names}
    calls_ = []
    for ty, value, _ in WIDE_INTS:
        vals = [value if t == ty else 0 for t in names]
        calls_.append(((1, 1, 1), tuple(vals)))
    return sig, calls_


def wide_case(rng: random.Random, n: int) -> tuple[dict[str, Any], list[Any]]:
    """``n`` parameters (pointers, i32, fp32 and constexpr in turn): past the inline packing (64 values) for
    the larger ``n``, where the values go to the heap."""
    kinds = ["*fp32", "i32", "fp32", "*i8", "constexpr"]
    sig = {f"a{i}": kinds[i % len(kinds)] for i in range(n)}
    gen = {
        "*fp32": lambda: rng.choice([None, rng.randrange(1, 2**48) * 16]),
        "*i8": lambda: rng.randrange(0, 2**64),
        "i32": lambda: rng.randrange(-(2**31), 2**31),
        "fp32": lambda: rng.uniform(-1e3, 1e3),
        "constexpr": lambda: 16,
    }
    calls_ = [((rng.randrange(1, 9), 1, 1), tuple(gen[t]() for t in sig.values())) for _ in range(30)]
    return sig, calls_


def floats_case(rng: random.Random) -> tuple[dict[str, Any], list[Any]]:
    sig = {"a": "fp16", "b": "bf16", "c": "fp32", "d": "f32", "e": "fp64", "p": "*fp16"}
    specials = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        65519.99,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        1e-30,
        3.4e38,
        1e300,
        7,
        -3,
        True,
    ]
    specials += [2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-14 * 1.0009765625, 1.00048828125, 1.00146484375]
    calls_ = []
    for _ in range(400):
        vals = []
        for _ in range(5):
            r = rng.random()
            if r < 0.3:
                vals.append(rng.choice(specials))
            elif r < 0.6:
                vals.append(
                    struct.unpack("<e", struct.pack("<H", rng.randrange(0x7C00)))[0]
                    * rng.choice([1, -1])
                    * (1 + rng.choice([0, 2**-11, 2**-12, 3 * 2**-12]))
                )
            else:
                vals.append(math.ldexp(rng.uniform(-1, 1), rng.randint(-30, 20)))
        vals.append(None)
        calls_.append(((1, 1, 1), tuple(vals)))
    for bad in (float("nan"), float("inf"), 1e6):
        calls_.append(((1, 1, 1), (bad, 1.0, 1.0, 1.0, 1.0, None)))
    calls_.append(((1, 1, 1), (1.0, float("nan"), 1.0, 1.0, float("nan"), None)))
    return sig, calls_


class _FloatyInt(int):
    """An int subclass with its own __float__: Triton's launcher calls it, so jitkey must not convert."""

    def __float__(self) -> float:
        return 0.5


def big_int_floats_case() -> tuple[dict[str, Any], list[Any]]:
    """Ints beyond 64 bits for float parameters: Triton's launcher converts them as float(x) does (and raises
    past a double), so jitkey packs the same bytes or declines exactly where Triton raises (issue 24)."""
    sig = {"b": "bf16", "c": "fp32", "d": "f32", "e": "fp64", "p": "*fp16"}
    calls_ = []
    for v in (2**64, 2**64 + 1, 2**70 + 12345, -(2**80) - 7, 3**100, 2**128, 2**1023, 2**1024 - 2**971):
        calls_.append(((1, 1, 1), (1.0, v, v, v, None)))
        calls_.append(((1, 1, 1), (v, 1.0, 1.0, 1.0, None)))
    calls_.append(((1, 1, 1), (1.0, 2**1024, 1.0, 1.0, None)))  # too large for a double: Triton raises
    calls_.append(((1, 1, 1), (1.0, 1.0, 1.0, -(2**2000), None)))
    calls_.append(((1, 1, 1), (1.0, _FloatyInt(3), 1.0, 1.0, None)))  # an int subclass: Triton's to convert
    return sig, calls_


def tuples_case(rng: random.Random) -> tuple[dict[str, Any], list[Any]]:
    sig = {"t": ("*fp32", "i32", ("fp32", "constexpr")), "n": "i64", "C": "constexpr"}
    calls_: list[Any] = []
    for _ in range(40):
        t = (rng.choice([None, 0x20000]), rng.randrange(-1000, 1000), (rng.uniform(-3, 3), "k"))
        calls_.append(((3, 1, 1), (t, rng.randrange(2**40), 16)))
    # wrong length: declined (3.6 raises; 3.9 does not check the length and reads past the tuple)
    calls_.append(((3, 1, 1), ((None, 1), 5, 16), DIALECT != "3.9"))
    calls_.append(((3, 1, 1), ([None, 1, (1.0, 2)], 5, 16)))  # a list: declined
    return sig, calls_


class Allocator:
    """A scratch allocator that records its calls and returns an address (or an object with ``data_ptr``)."""

    def __init__(self, base: int, as_object: bool = False) -> None:
        self.base, self.as_object, self.log = base, as_object, []

    def __call__(self, size: int, align: int, stream: Any) -> Any:
        self.log.append((size, align, stream))
        if self.as_object:
            return types.SimpleNamespace(data_ptr=lambda: self.base)
        return self.base + size


def scratch_case() -> dict[str, Any]:
    """Global and profile scratch: the allocators each launcher calls and the pointers it passes."""
    sig = {"p": "*fp32", "n": "i32"}
    meta = (4, 2, 0, False, False)
    grid_calls = [((3, 2, 1), (None, 5)), ((1, 1, 7), (0x30000, -2))]
    out: dict[str, Any] = {}

    def both(name: str, allocs: list[Allocator], **sizes: int) -> None:
        logs = []
        for who in ("triton", "jitkey"):
            for a in allocs:
                a.log.clear()
            run, plan, why = launcher(sig, meta, **sizes)
            if plan is None:
                out[name] = {"plan": None, "why": why}
                return
            expect(sig)
            res = []
            for grid, args in grid_calls:
                fn = (
                    triton_call(run, meta, grid, args)
                    if who == "triton"
                    else jitkey_call(plan, grid, args, [])
                )
                res.append(outcome(fn))
            logs.append(
                (repr(res), [list(a.log) for a in allocs], [r[1] if r[0] == "raised" else r[2] for r in res])
            )
        out[name] = {"same": logs[0] == logs[1], "allocs": logs[0][1], "did": logs[0][2]}
        if logs[0] != logs[1]:
            out[name] |= {"triton": logs[0], "jitkey": logs[1]}

    glob = Allocator(0x100000)
    triton.set_allocator(glob)
    both("global", [glob], global_size=96, global_align=128)
    prof = Allocator(0x200000)
    _allocation.set_profile_allocator(prof)
    both("global+profile", [glob, prof], global_size=96, global_align=128, profile_size=40, profile_align=16)
    for name, base in (("device object scratch", 0x400000), ("host object scratch", 0x100)):
        obj = Allocator(base, as_object=True)  # a buffer whose data_ptr() is checked with the driver
        triton.set_allocator(obj)
        both(name, [obj], global_size=8)  # host memory (below 0x10000 in the stand-in) raises
    triton.set_allocator(glob)
    _allocation.set_profile_allocator(None)
    if DIALECT == "3.9":  # no profile allocator: the driver's default profile scratch
        default = Allocator(0x300000)
        driver.active.allocate_default_profile_scratch = default
        both("default profile", [default], profile_size=24, profile_align=8)
    else:  # no profile allocator: NullAllocator raises, in both
        both("null profile", [], profile_size=24, profile_align=8)
    return out


def refusals() -> dict[str, Any]:
    """Why jitkey makes no plan for launchers it does not mirror (each then launches through Triton's)."""
    sig = {"p": "*fp32", "n": "i32"}
    meta = (4, 1, 0, False, False)
    out: dict[str, Any] = {}
    run = runner(sig, meta, "")
    run.launch = lambda *args: None  # e.g. the tensor-descriptor wrapper
    out["wrapped launch"] = plan_for(run, sig, meta)[1]

    class Patched(nv.CudaLauncher):
        def __call__(self, *args: Any) -> Any:
            return super().__call__(*args)

    run = runner(sig, meta, "")
    run.__class__ = Patched
    out["another __call__"] = plan_for(run, sig, meta)[1]
    if DIALECT == "3.9":
        out["gsan"] = plan_for(runner(sig, meta, "gsan"), sig, meta)[1]
        run = runner(sig, meta, "")
        run.kernel_signature = b"\x01\x05"  # i32 read as i64
        out["kernel signature"] = plan_for(run, sig, meta)[1]
    return out


def main() -> None:
    rng = random.Random(20261122)
    out: dict[str, Any] = {"dialect": DIALECT}
    metas = {
        "ints": (4, 1, 0, False, False),
        "floats": (8, 1, 1024, False, True),
        "tuples": (1, 2, 98304, True, False),
    }
    for name, case in (("ints", ints_case), ("floats", floats_case), ("tuples", tuples_case)):
        sig, calls_ = case(rng)
        out[name] = compare(sig, calls_, metas[name])
    for n in (40, 90):
        sig, calls_ = wide_case(rng, n)
        out[f"wide{n}"] = compare(sig, calls_, (4, 1, 0, False, False))
    sig, calls_ = wide_ints_case()
    out["wide_ints"] = compare(sig, calls_, (4, 1, 0, False, False))
    sig, calls_ = big_int_floats_case()
    out["big_int_floats"] = compare(sig, calls_, (4, 1, 0, False, False))
    # cluster of 16 (cuFuncSetAttribute first), PDL + cooperative + cluster attributes together
    sig = {"p": "*fp32", "n": "i32"}
    out["cluster16"] = compare(sig, [((2, 3, 1), (0x30000, 9))], (4, 16, 0, True, True))
    # more than 228 KiB of shared memory (3.9: a shared-memory-mode attribute first), at the boundary and
    # with the other attributes; five attributes overflow Triton 3.9's array: no plan
    for name, meta in {
        "smem228": (4, 1, 228 * 1024, False, True),
        "smem_big": (4, 1, 228 * 1024 + 1, False, True),
        "smem_big_coop_cluster": (8, 2, 229 * 1024, True, False),
        "smem_big_all": (8, 2, 229 * 1024, True, True),
    }.items():
        out[name] = compare(sig, [((2, 3, 1), (0x30000, 9)), ((1, 1, 1), (None, -1))], meta)
    # cuFuncSetAttribute fails (a cluster of 16): 3.6 launches and raises, 3.9 raises without launching
    lib.standin_func_attr_fail(701)
    out["func_attr_error"] = compare(sig, [((2, 3, 1), (0x30000, 9))], (4, 16, 0, False, False))
    lib.standin_func_attr_fail(0)
    out["scratch"] = scratch_case()
    out["refusals"] = refusals()
    # a failing launch raises what Triton raises
    meta = (4, 1, 0, False, False)
    run, plan, _ = launcher(sig, meta)
    expect(sig)
    lib.standin_fail(700)
    errors = []
    for f in (triton_call(run, meta, (1, 1, 1), (None, 3)), jitkey_call(plan, (1, 1, 1), (None, 3), [])):
        try:
            f()
            errors.append("no error")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    lib.standin_fail(0)
    out["errors"] = errors
    # no current context: both retain device 0's primary context first (the same driver calls)
    ctx = []
    for f in (triton_call(run, meta, (1, 1, 1), (None, 3)), jitkey_call(plan, (1, 1, 1), (None, 3), [])):
        lib.standin_no_context()
        before = lib.standin_ctx_retains()
        ctx.append(outcome(f))
    out["ctx_retains"] = lib.standin_ctx_retains() - before  # jitkey's
    out["no_context"] = [repr(o) for o in ctx]
    # cuCtxGetCurrent fails: 3.6 goes on (retains, launches) and raises; 3.9 stops there, and its int
    # extractor fails on the pending error (no launch). The same in jitkey's plan.
    lib.standin_ctx_fail(201)
    out["ctx_error"] = [
        repr(outcome(f))
        for f in (triton_call(run, meta, (1, 1, 1), (None, 3)), jitkey_call(plan, (1, 1, 1), (None, 3), []))
    ]
    lib.standin_ctx_fail(0)
    # the driver floor of a bench: the same packed launch as plan.launch, n times; a declined call raises
    lib.standin_launches.restype = ctypes.c_long
    launched = lib.standin_launches()
    plan.launch(1, 1, 1, STREAM, None, 0x30000, 9)
    one = record()
    seconds = plan._floor(3, 1, 1, 1, STREAM, None, 0x30000, 9)
    floor: dict[str, Any] = {"same": record() == one, "launches": lib.standin_launches() - launched}
    floor["seconds"] = isinstance(seconds, float) and seconds >= 0
    for bad in ((3, 1, 1, 1, STREAM, None, 0x30000), (3, 1, 1, 1, STREAM)):  # one parameter short; no device
        try:
            plan._floor(*bad)
            floor.setdefault("errors", []).append("no error")
        except Exception as exc:
            floor.setdefault("errors", []).append(type(exc).__name__)
    out["floor"] = floor
    # the floor from Python: packed once, one launch per call, the same record as plan.launch
    launched = lib.standin_launches()
    packed = plan._packed(1, 1, 1, STREAM, None, 0x30000, 9)
    packed_out: dict[str, Any] = {"made": lib.standin_launches() - launched}
    packed.launch(), packed.launch()
    packed_out["same"] = record() == one
    packed_out["launches"] = lib.standin_launches() - launched
    ptr = int("30000", 16)  # a fresh int object: the packed launch holds a reference to it while it lives
    before_refs = sys.getrefcount(ptr)
    kept = plan._packed(1, 1, 1, STREAM, None, ptr, 9)
    packed_out["keeps_args"] = sys.getrefcount(ptr) - before_refs
    del kept
    packed_out["releases_args"] = sys.getrefcount(ptr) == before_refs
    try:
        plan._packed(1, 1, 1, STREAM, None, 0x30000)  # one parameter short: declined
        packed_out["error"] = "no error"
    except Exception as exc:
        packed_out["error"] = type(exc).__name__
    out["packed"] = packed_out
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
