"""Per-launch drift check (GlobalsGuard) and function keys, against what frameworks do today.

Peers measured in the same run:
* ``triton-used-global-vals``: the loop Triton's ``JITFunction.run`` executes on every launch over
  ``used_global_vals`` (``globals_dict.get(name, not_present) != val`` per global);
* ``sha256-of-source``: the naive function key (``inspect.getsource`` + sha256): source only, no
  globals, closures or helpers, which is how ninetoothed's two kernel names collided.
Time with ``--benchmark-enable``; in the default run these are correctness tests.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import jitkey
from jitkey.errors import GlobalsChangedError


def make_kernel(n_globals: int) -> tuple[Callable[..., Any], dict[str, Any]]:
    names = [f"G{i}" for i in range(n_globals)]
    src = "def kernel(x):\n    return x + " + " + ".join(names) + "\n"
    ns: dict[str, Any] = {"__name__": "bench_kernels", **{n: i for i, n in enumerate(names)}}
    exec(compile(src, "<bench>", "exec"), ns)
    return ns["kernel"], ns


def triton_style_check(used: dict[tuple[str, int], tuple[object, dict[str, Any]]]) -> None:
    not_present = object()
    for (name, _), (val, globals_dict) in used.items():
        if (new_val := globals_dict.get(name, not_present)) != val:
            raise RuntimeError(
                f"Global variable {name} has changed since we compiled this kernel, to {new_val}"
            )


@pytest.mark.parametrize("n_globals", [4, 16])
@pytest.mark.parametrize("impl", ["jitkey-GlobalsGuard.check", "triton-used-global-vals"])
def test_guard_check(benchmark: Any, impl: str, n_globals: int) -> None:
    kernel, ns = make_kernel(n_globals)
    benchmark.group = f"globals-check/{n_globals}-globals"
    guard = jitkey.GlobalsGuard(kernel)
    used = {(f"G{i}", id(ns)): (ns[f"G{i}"], ns) for i in range(n_globals)}
    check: Callable[[], None] = (
        guard.check if impl.startswith("jitkey") else functools.partial(triton_style_check, used)
    )
    # Correct first: both pass now, both catch a rebinding, and pass again once restored.
    check()
    old = ns["G1"]
    ns["G1"] = old + 1000
    with pytest.raises(GlobalsChangedError if impl.startswith("jitkey") else RuntimeError):
        check()
    ns["G1"] = old
    check()
    benchmark(check)


def helper(x: int) -> int:
    return x * 2


def kernel_with_helper(x: int, scale: int = 3) -> int:
    return helper(x) * scale


@pytest.mark.parametrize("impl", ["jitkey-function_key", "sha256-of-source"])
def test_function_key(benchmark: Any, impl: str) -> None:
    benchmark.group = "function-key"
    if impl == "jitkey-function_key":
        fn: Callable[[], bytes] = functools.partial(jitkey.function_key, kernel_with_helper)
    else:
        fn = lambda: hashlib.sha256(inspect.getsource(kernel_with_helper).encode()).digest()  # noqa: E731
    assert fn() == fn() and len(fn()) == 32
    benchmark(fn)
