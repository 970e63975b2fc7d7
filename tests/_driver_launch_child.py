"""Run by tests/test_driver_launch.py in a child process whose ``libcuda.so.1`` is the stand-in of
``tests/data/standin_cuda.c``: the same calls through Triton's own generated launcher and through
``jitkey._core._LaunchPlan``, recorded by the stand-in and compared byte for byte. Prints a JSON summary."""

from __future__ import annotations

import ctypes
import functools
import json
import math
import random
import struct
import sys
from typing import Any

from triton.backends.nvidia import driver as nv
from triton.runtime.build import compile_module_from_src

from jitkey._core import _LaunchPlan

lib = ctypes.CDLL("libcuda.so.1")  # the stand-in (LD_LIBRARY_PATH): the one both launchers load

SIZES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u1": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8}
SIZES |= {"fp16": 2, "bf16": 2, "fp32": 4, "f32": 4, "fp64": 8}

FUNCTION = 0xF00D
STREAM = 0x5EED


def flat(types: Any) -> list[str]:
    out: list[str] = []
    for t in types:
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


def triton_launcher(sig: dict[str, Any]) -> Any:
    src = nv.make_launcher({}, sig, None)
    mod = compile_module_from_src(
        src=src,
        name="__triton_launcher",
        library_dirs=nv.library_dirs(),
        include_dirs=nv.include_dirs,
        libraries=nv.libraries,
    )
    return mod.launch


def outcome(fn: Any) -> tuple[str, Any]:
    before = lib.standin_launches()
    try:
        fn()
    except Exception as exc:  # what Triton raised: compared where jitkey claims the call
        return "raised", f"{type(exc).__name__}: {exc}"
    if lib.standin_launches() == before:
        return "nothing", None
    return "launched", record()


def compare(
    sig: dict[str, Any], calls: list[tuple[Any, ...]], meta: tuple[int, int, int, bool, bool]
) -> dict[str, Any]:
    nw, nctas, smem, coop, pdl = meta
    launch = triton_launcher(sig)
    plan = _LaunchPlan("3.6", FUNCTION, (nw, nctas, smem), tuple(sig.values()), coop, pdl, nctas, None, None)
    expect(sig)
    stats = {"same": 0, "declined": 0, "mismatch": []}
    for grid, args in calls:
        head = (*grid, STREAM, FUNCTION, coop, pdl, None, None, (nw, nctas, smem), None, None, None)
        t = outcome(functools.partial(launch, *head, *args))
        claimed: list[bool] = []
        j = outcome(
            lambda grid=grid, args=args, claimed=claimed: claimed.append(
                plan.launch(*grid, STREAM, None, *args)
            )
        )
        if claimed == [False]:
            stats["declined"] += 1
            continue
        if t != j:
            stats["mismatch"].append({"grid": grid, "args": repr(args), "triton": repr(t), "jitkey": repr(j)})
        else:
            stats["same"] += 1
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
    calls = []
    for _ in range(120):
        vals = [rng.choice(ptrs), rng.choice(ptrs)]
        vals += [
            rng.choice(edges[t]) for t in ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64")
        ]
        vals.append(rng.choice([128, "anything", None]))  # the constexpr: never passed
        grid = rng.choice([(1, 1, 1), (7, 3, 2), (65535, 1, 1), (0, 1, 1), (2, 0, 5)])
        calls.append((grid, tuple(vals)))
    # declined values: out of range (Triton raises or masks; jitkey does not guess)
    calls.append(((1, 1, 1), (None, None, 256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls.append(((1, 1, 1), (None, None, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls.append(((1, 1, 1), (None, None, 0, 0, 0, 2**31, 0, 0, 0, 0, 0, 0, 1)))
    calls.append(((1, 1, 1), (-5, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls.append(((1, 1, 1), (1.5, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    calls.append(((2**31, 1, 1), (None, None, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)))
    return sig, calls


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
    calls = []
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
        calls.append(((1, 1, 1), tuple(vals)))
    for bad in (float("nan"), float("inf"), 1e6):
        calls.append(((1, 1, 1), (bad, 1.0, 1.0, 1.0, 1.0, None)))
    calls.append(((1, 1, 1), (1.0, float("nan"), 1.0, 1.0, float("nan"), None)))
    return sig, calls


def tuples_case(rng: random.Random) -> tuple[dict[str, Any], list[Any]]:
    sig = {"t": ("*fp32", "i32", ("fp32", "constexpr")), "n": "i64", "C": "constexpr"}
    calls = []
    for _ in range(40):
        t = (rng.choice([None, 0x20000]), rng.randrange(-1000, 1000), (rng.uniform(-3, 3), "k"))
        calls.append(((3, 1, 1), (t, rng.randrange(2**40), 16)))
    calls.append(((3, 1, 1), ((None, 1), 5, 16)))  # wrong length: declined
    calls.append(((3, 1, 1), ([None, 1, (1.0, 2)], 5, 16)))  # a list: declined
    return sig, calls


def main() -> None:
    rng = random.Random(20261122)
    out: dict[str, Any] = {}
    metas = {
        "ints": (4, 1, 0, False, False),
        "floats": (8, 1, 1024, False, True),
        "tuples": (1, 2, 98304, True, False),
    }
    for name, case in (("ints", ints_case), ("floats", floats_case), ("tuples", tuples_case)):
        sig, calls = case(rng)
        out[name] = compare(sig, calls, metas[name])
    # cluster of 16 (cuFuncSetAttribute first), PDL + cooperative + cluster attributes together
    sig = {"p": "*fp32", "n": "i32"}
    out["cluster16"] = compare(sig, [((2, 3, 1), (0x30000, 9))], (4, 16, 0, True, True))
    # a failing launch raises what Triton raises
    launch = triton_launcher(sig)
    plan = _LaunchPlan("3.6", FUNCTION, (4, 1, 0), ("*fp32", "i32"), False, False, 1, None, None)
    lib.standin_fail(700)
    errors = []
    for f in (
        lambda: launch(
            1, 1, 1, STREAM, FUNCTION, False, False, None, None, (4, 1, 0), None, None, None, None, 3
        ),
        lambda: plan.launch(1, 1, 1, STREAM, None, None, 3),
    ):
        try:
            f()
            errors.append("no error")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    lib.standin_fail(0)
    out["errors"] = errors
    # no current context: both retain device 0's primary context first
    lib.standin_no_context()
    plan.launch(1, 1, 1, STREAM, None, None, 3)
    out["ctx_retains"] = lib.standin_ctx_retains()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
