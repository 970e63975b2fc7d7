"""The ninetoothed scenario: one arrangement, built under two kernel names and several block sizes.

A miniature of ninetoothed's ``make(arrangement, application, tensors, kernel_name=...)`` flow. The
*arrangement* is a Python function that tiles symbolic tensors; the *application* is a Python function
whose body is the per-tile computation. ``make`` runs the arrangement on symbolic tensors, parses the
application's source, generates the source of a kernel named ``kernel_name`` that loops over tiles (a
masked, padded load per tile, like Triton's ``tl.load(..., mask=, other=)``), and compiles it. Building
is real work (inspect + ast + codegen + compile); the cache makes repeated builds nearly free.

The cache key is ``(function_key(arrangement), function_key(application), kernel_name, block_size)``:

* ninetoothed once keyed generated kernels by a digest of the source alone, so two kernel names built
  from one arrangement collided; here the kernel name is part of the key (and the naive key's
  collisions are counted, to show the bug);
* ``function_key`` is computed once per function and reused while a ``GlobalsGuard`` says the globals
  it read are unchanged (the guard's check is what runs per ``make``); editing such a global re-keys.

Run: ``python examples/ninetoothed_scenario.py``. The last line is ``RESULT {json}`` (asserted by
``tests/test_examples.py``).
"""

from __future__ import annotations

import ast
import inspect
import json
import linecache
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import jitkey

# --------------------------------------------------------------------------------------------------
# The DSL: symbolic tensors and tiles


@dataclass(frozen=True)
class Tile:
    """One tensor's tiling: a 1-D block size and the value that pads the last, partial block."""

    name: str
    block: int
    other: float


@dataclass(frozen=True)
class Tensor:
    """A symbolic 1-D tensor the arrangement tiles."""

    name: str

    def tile(self, block: int, *, other: float = 0.0) -> Tile:
        if type(block) is not int or block <= 0:
            raise ValueError(f"block size must be a positive int, got {block!r}")
        return Tile(self.name, block, other)


# A global the arrangement reads: the padding value of out-of-bounds lanes (Triton's `other=`).
PAD = 0.0


def arrangement(x: Tensor, y: Tensor, out: Tensor, block_size: int) -> tuple[Tile, ...]:
    return x.tile(block_size, other=PAD), y.tile(block_size, other=PAD), out.tile(block_size)


def application(x: Any, y: Any, out: Any) -> None:
    out = x * 2 + y  # noqa: F841 (the DSL reads this assignment as a store)


# --------------------------------------------------------------------------------------------------
# Code generation (the expensive part of make)


_generated = iter(range(1_000_000_000))


def _build(
    arrangement: Callable[..., tuple[Tile, ...]],
    application: Callable[..., None],
    kernel_name: str,
    block_size: int,
) -> Callable[..., None]:
    params = list(inspect.signature(application).parameters)
    tiles = arrangement(*(Tensor(p) for p in params), block_size)
    if len(tiles) != len(params):
        raise ValueError("the arrangement must return one tile per application parameter")
    by_name = {t.name: t for t in tiles}

    fn_def = ast.parse(textwrap.dedent(inspect.getsource(application))).body[0]
    assert isinstance(fn_def, ast.FunctionDef)
    stores = [s for s in fn_def.body if isinstance(s, ast.Assign)]
    if len(stores) != 1 or not isinstance(stores[0].targets[0], ast.Name):
        raise ValueError("the application must be a single `out = <expression>`")
    target = stores[0].targets[0].id
    inputs = [p for p in params if p != target]

    class ToTiles(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in inputs:
                return ast.copy_location(ast.Name(id=f"{node.id}_tile", ctx=ast.Load()), node)
            return node

    expr = ast.unparse(ToTiles().visit(stores[0].value))
    block = by_name[target].block
    loads = "\n".join(
        f"        {p}_tile = np.full({by_name[p].block}, {by_name[p].other!r}, dtype={p}.dtype)\n"
        f"        {p}_tile[: stop - start] = {p}[start:stop]"
        for p in inputs
    )
    src = (
        f"def {kernel_name}({', '.join(params)}):\n"
        f"    n = {target}.shape[0]\n"
        f"    for start in range(0, n, {block}):\n"
        f"        stop = min(start + {block}, n)\n"
        f"{loads}\n"
        f"        {target}[start:stop] = ({expr})[: stop - start]\n"
    )
    filename = f"<ninetoothed-mini:{kernel_name}:{next(_generated)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # for inspect/tracebacks
    namespace: dict[str, Any] = {"np": np, "__name__": f"generated.{kernel_name}"}
    exec(compile(src, filename, "exec"), namespace)
    kernel: Callable[..., None] = namespace[kernel_name]
    return kernel


# --------------------------------------------------------------------------------------------------
# The cache layer a framework builds on jitkey


class Maker:
    def __init__(self, capacity: int = 256) -> None:
        self.cache = jitkey.LruCache(capacity)
        self._fn_keys: dict[Callable[..., Any], tuple[bytes, jitkey.GlobalsGuard]] = {}
        self.rekeys = 0

    def fn_key(self, fn: Callable[..., Any]) -> bytes:
        entry = self._fn_keys.get(fn)
        if entry is not None and entry[1].unchanged():
            return entry[0]
        if entry is not None:
            self.rekeys += 1
        key, guard = jitkey.function_key(fn), jitkey.GlobalsGuard(fn)
        self._fn_keys[fn] = (key, guard)
        return key

    def key(
        self,
        arrangement: Callable[..., Any],
        application: Callable[..., Any],
        kernel_name: str,
        block_size: int,
    ) -> tuple[bytes, bytes, str, int]:
        return (self.fn_key(arrangement), self.fn_key(application), kernel_name, block_size)

    def make(
        self,
        arrangement: Callable[..., Any],
        application: Callable[..., Any],
        kernel_name: str,
        block_size: int,
    ) -> Callable[..., None]:
        key = self.key(arrangement, application, kernel_name, block_size)
        kernel: Callable[..., None] | None = self.cache.get(key)
        if kernel is None:
            kernel = _build(arrangement, application, kernel_name, block_size)
            self.cache[key] = kernel
        return kernel


def naive_key(arrangement: Callable[..., Any], application: Callable[..., Any], block_size: int) -> bytes:
    """The pre-fix ninetoothed key: a digest of the sources and the block size, without the kernel name."""
    return jitkey.digest((inspect.getsource(arrangement), inspect.getsource(application), block_size))


def _median_us(fn: Callable[[], object], repeat: int, number: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter_ns() - t0) / number / 1e3)
    return statistics.median(samples)


def main() -> dict[str, Any]:
    global PAD
    names = ("add_scaled", "fused_axpy")
    blocks = (64, 128, 256)
    maker = Maker()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(1000), rng.standard_normal(1000)
    expected = x * 2 + y

    kernels = {}
    for name in names:
        for block in blocks:
            kernel = maker.make(arrangement, application, name, block)
            out = np.empty_like(x)
            kernel(x, y, out)
            if not np.array_equal(out, expected):
                raise AssertionError(f"{name}/{block} computed a wrong result")
            if kernel.__name__ != name or f"range(0, n, {block})" not in inspect.getsource(kernel):
                raise AssertionError(f"{name}/{block}: the cache returned another kernel")
            kernels[(name, block)] = kernel
    after_first = maker.cache.stats()
    keys = {jitkey.digest(maker.key(arrangement, application, n, b)) for n in names for b in blocks}
    naive = {naive_key(arrangement, application, b) for _ in names for b in blocks}
    print(f"built {len(kernels)} kernels ({len(names)} names x {len(blocks)} block sizes)")
    for (name, block), _ in kernels.items():
        k = jitkey.digest(maker.key(arrangement, application, name, block))
        print(f"  {name:<11} block={block:<4} key={k.hex()[:16]}")
    print(f"distinct jitkey keys: {len(keys)}; distinct naive source-digest keys: {len(naive)} (collide)")

    same = all(maker.make(arrangement, application, n, b) is kernels[(n, b)] for n in names for b in blocks)
    stats = maker.cache.stats()
    hits = stats["hits"] - after_first["hits"]
    misses = stats["misses"] - after_first["misses"]
    print(f"repeated builds: {hits} hits, {misses} misses, same objects: {same}")

    # Timing: the cached make() (guard check + LRU lookup) against rebuilding (codegen + compile).
    builds: tuple[Callable[[], object], ...] = (
        lambda: _build(arrangement, application, "add_scaled", 128),
        lambda: maker.make(arrangement, application, "add_scaled", 128),
    )
    for build in builds:
        if build() is None:
            raise AssertionError("a build returned nothing")
    rebuild_us = _median_us(lambda: _build(arrangement, application, "add_scaled", 128), repeat=7, number=20)
    cached_us = _median_us(
        lambda: maker.make(arrangement, application, "add_scaled", 128), repeat=7, number=2000
    )
    uncached_key_us = _median_us(
        lambda: (jitkey.function_key(arrangement), jitkey.function_key(application)), repeat=7, number=20
    )
    speedup = rebuild_us / cached_us
    print(
        f"make(): rebuild {rebuild_us:.1f} us, cached {cached_us:.2f} us -> {speedup:.0f}x faster "
        f"(function_key of both functions without the guard memo: {uncached_key_us:.1f} us)"
    )

    # Drift: editing a global the arrangement reads re-keys it, so the next make() is a miss.
    before = maker.cache.stats()["misses"]
    PAD = -1.0
    drift_kernel = maker.make(arrangement, application, "add_scaled", 128)
    drift_miss = maker.cache.stats()["misses"] - before
    drift_src = inspect.getsource(drift_kernel)
    PAD = 0.0
    pads = "-1.0" in drift_src
    print(f"after PAD changed: {drift_miss} miss, re-keyed {maker.rekeys}x, kernel pads with -1.0: {pads}")

    result = {
        "builds": len(kernels),
        "distinct_keys": len(keys),
        "naive_distinct_keys": len(naive),
        "first_pass_misses": after_first["misses"],
        "repeat_hits": hits,
        "repeat_same_objects": same,
        "rebuild_us": rebuild_us,
        "cached_us": cached_us,
        "speedup": speedup,
        "drift_misses": drift_miss,
        "drift_rekeys": maker.rekeys,
        "drift_pads_with_new_value": pads,
    }
    print("RESULT " + json.dumps(result, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
