"""A minimal kernel DSL whose per-call bound-kernel lookup is a ``jitkey.Signature`` + ``LruCache`` (Helion's pattern).

``@dsl.kernel`` turns a Python function whose body is ``return <elementwise expression>`` over tensor and
scalar parameters into a kernel. ``kernel(*args)`` is the hot path Helion has: key the call's arguments
(tensor dtype, device type, exact sizes and strides; scalars by type), find the *bound kernel* compiled for
that specialization, run it. On a miss the DSL "compiles": it traces the expression on ``meta`` tensors
(shape + dtype inference, broadcasting checked once), then generates and ``compile()``s Python source
specialized on the inferred shapes/dtypes, writing every intermediate into a preallocated buffer with
``out=`` torch ops (CPU tensors here; the same structure drives a GPU code generator).

The key is ``jitkey.Signature(rules.helion(fn), extra=(function_key(fn),))``: one native call per launch
encodes the arguments with a compiled plan and probes the ``LruCache``; the function's content key makes
an edited kernel a different kernel. The baseline is what a pure-Python DSL writes: a tuple key built per
call (``(dtype, device.type, shape, stride)`` per tensor, ``type`` per scalar) and a ``dict`` lookup.

Run: ``python examples/minimal_dsl.py``. The last line is ``RESULT {json}`` (asserted by
``tests/test_examples.py``).
"""

from __future__ import annotations

import ast
import inspect
import json
import statistics
import textwrap
import time
from collections.abc import Callable
from typing import Any

import torch

import jitkey
from jitkey import MISS, LruCache, Signature, rules  # type: ignore[attr-defined,unused-ignore]

_TORCH_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_FUNCS = {"exp": "exp", "sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "abs": "abs"}


class Kernel:
    """A DSL kernel: ``kernel(*args)`` looks up (or compiles) the bound kernel for the arguments and runs it."""

    def __init__(self, fn: Callable[..., Any], capacity: int = 256) -> None:
        self.fn = fn
        self.names = list(inspect.signature(fn).parameters)
        src = textwrap.dedent(inspect.getsource(fn))
        fdef = ast.parse(src).body[0]
        if (
            not isinstance(fdef, ast.FunctionDef)
            or len(fdef.body) != 1
            or not isinstance(fdef.body[0], ast.Return)
        ):
            raise TypeError(f"{fn.__qualname__}: a DSL kernel body is a single `return <expression>`")
        ret = fdef.body[0].value
        assert ret is not None
        self.expr = ret
        self.sig = Signature(rules.helion(fn), extra=("minimal_dsl", jitkey.function_key(fn)))
        self.cache = LruCache(capacity)
        self.compiles = 0

    def __call__(self, *args: Any) -> torch.Tensor:
        bound = self.sig.lookup(self.cache, args)
        if bound is MISS:
            bound = self.compile(args)
            self.sig.insert(self.cache, args, bound)
        return bound(*args)

    def bind(self, args: tuple[Any, ...]) -> Callable[..., torch.Tensor]:
        """The bound kernel for ``args`` (what ``__call__`` runs), compiling it on a miss."""
        bound = self.sig.lookup(self.cache, args)
        if bound is MISS:
            bound = self.compile(args)
            self.sig.insert(self.cache, args, bound)
        return bound  # type: ignore[no-any-return]

    # -- the compiler ------------------------------------------------------------------------------------
    def compile(self, args: tuple[Any, ...]) -> Callable[..., torch.Tensor]:
        """Trace on meta tensors, then generate + compile source specialized on shapes and dtypes."""
        self.compiles += 1
        if len(args) != len(self.names):
            raise TypeError(f"{self.fn.__qualname__} takes {len(self.names)} arguments, got {len(args)}")
        env: dict[str, Any] = {}
        specs = []
        for name, a in zip(self.names, args, strict=True):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise TypeError("this miniature DSL compiles for CPU tensors")
                env[name] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                specs.append(
                    f"{name}: {str(a.dtype).removeprefix('torch.')}{list(a.shape)} strides {a.stride()}"
                )
            elif type(a) in (int, float, bool):
                env[name] = a
                specs.append(f"{name}: {type(a).__name__}")
            else:
                raise TypeError(f"argument {name!r}: unsupported type {type(a).__qualname__}")

        lines: list[str] = []
        buffers: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        counter = iter(range(1_000_000))

        def emit(node: ast.expr) -> tuple[str, Any]:
            """Generate code for ``node``; return (the name or literal holding it, its meta value)."""
            if isinstance(node, ast.Name):
                if node.id not in env:
                    raise NameError(f"{self.fn.__qualname__}: unknown name {node.id!r}")
                return node.id, env[node.id]
            if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                return repr(node.value), node.value
            if isinstance(node, ast.BinOp) and type(node.op) in _TORCH_OPS:
                (lhs, lv), (rhs, rv) = emit(node.left), emit(node.right)
                op = _TORCH_OPS[type(node.op)]
                if not isinstance(lv, torch.Tensor):
                    if not isinstance(rv, torch.Tensor):
                        raise SyntaxError(f"{ast.unparse(node)!r}: fold scalar-only arithmetic by hand")
                    if op in ("add", "mul"):  # torch.<op>(input=Tensor, other=Number): commute
                        (lhs, lv), (rhs, rv) = (rhs, rv), (lhs, lv)
                    else:  # scalar - tensor, scalar / tensor: a 0-dim tensor of the scalar's torch type
                        lhs = f"torch.tensor({lhs})"
                        lv = torch.tensor(lv, device="meta")
                meta = getattr(torch, op)(lv, rv)
                return out_of(f"torch.{op}({lhs}, {rhs}, out={{buf}})", meta)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                src, v = emit(node.operand)
                return out_of(f"torch.neg({src}, out={{buf}})", torch.neg(torch.as_tensor(v, device="meta")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
                (src, v), fname = emit(node.args[0]), _FUNCS[node.func.id]
                return out_of(f"torch.{fname}({src}, out={{buf}})", getattr(torch, fname)(v))
            raise SyntaxError(f"{self.fn.__qualname__}: unsupported expression {ast.unparse(node)!r}")

        def out_of(template: str, meta: torch.Tensor) -> tuple[str, torch.Tensor]:
            buf = f"_t{next(counter)}"
            buffers.append((buf, tuple(meta.shape), meta.dtype))
            lines.append("    " + template.format(buf=buf))
            return buf, meta

        result, meta = emit(self.expr)
        if not isinstance(meta, torch.Tensor):
            raise TypeError(f"{self.fn.__qualname__} must return a tensor expression")
        # Intermediates get fresh buffers per call (the result is returned to the caller); shapes and dtypes
        # are constants of the generated code.
        allocs = [
            f"    {b} = torch.empty({shape}, dtype=torch.{str(dt).removeprefix('torch.')})"
            for b, shape, dt in buffers
        ]
        kname = f"{self.fn.__name__}__{next(_ids)}"
        src = (
            f"def {kname}({', '.join(self.names)}):\n"
            + "".join(f"    # {s}\n" for s in specs)
            + "\n".join(allocs + lines)
            + f"\n    return {result}\n"
        )
        ns: dict[str, Any] = {"torch": torch}
        exec(compile(src, f"<minimal_dsl {kname}>", "exec"), ns)
        bound: Callable[..., torch.Tensor] = ns[kname]
        bound.__doc__ = src
        return bound


_ids = iter(range(1_000_000_000))


def kernel(fn: Callable[..., Any]) -> Kernel:
    return Kernel(fn)


# --------------------------------------------------------------------------------------------------
# The baseline: a pure-Python tuple key + dict, as a DSL written without jitkey does it


def python_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        (a.dtype, a.device.type, tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else type(a)
        for a in args
    )


# --------------------------------------------------------------------------------------------------


@kernel
def scaled_gelu_ish(x, y, alpha):
    return alpha * x * sigmoid(1.702 * x) + y  # noqa: F821 - a DSL builtin


def _median_ns(fn: Callable[[], object], *, repeat: int, number: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        times.append((time.perf_counter_ns() - t0) / number)
    return statistics.median(times)


def main() -> None:
    k = scaled_gelu_ish
    torch.manual_seed(0)
    calls = [
        (torch.randn(1024), torch.randn(1024), 0.5),
        (torch.randn(1024), torch.randn(1024), 2.0),  # same specialization: hit
        (torch.randn(1024, dtype=torch.float64), torch.randn(1024, dtype=torch.float64), 0.5),  # dtype
        (torch.randn(32, 64), torch.randn(64), 1.5),  # shape + broadcasting
        (torch.randn(64, 32).t(), torch.randn(64), 1.5),  # same shape, other strides
        (torch.randn(1024), torch.randn(1024), 3),  # int scalar: another specialization
    ]
    ok = True
    for x, y, alpha in calls:
        got = k(x, y, alpha)
        want = alpha * x * torch.sigmoid(1.702 * x) + y
        ok = ok and got.dtype == want.dtype and got.shape == want.shape and torch.allclose(got, want)
    misses = k.compiles
    print(f"{len(calls)} calls -> {misses} compiles (specializations); results correct: {ok}")
    print("generated for call 0:\n" + textwrap.indent(k.bind(calls[0]).__doc__ or "", "    "))

    # Both dispatchers find the same bound kernels; the Python table is filled from the jitkey one.
    table: dict[tuple[Any, ...], Any] = {}
    for c in calls:
        table.setdefault(python_key(c), k.bind(c))
    same = all(table[python_key(c)] is k.bind(c) for c in calls)
    distinct_sig = len({k.sig.encode(c) for c in calls})
    print(f"distinct signature keys: {distinct_sig}; python keys: {len(table)}; same bound kernels: {same}")

    args = calls[0]
    lookup, cache = k.sig.lookup, k.cache

    def jitkey_dispatch() -> object:
        return lookup(cache, args)

    def python_dispatch() -> object:
        return table.get(python_key(args))

    if jitkey_dispatch() is not python_dispatch() or jitkey_dispatch() is MISS:
        raise AssertionError("the two dispatchers disagree")
    rounds, number = 9, 20_000
    jk_ns = _median_ns(jitkey_dispatch, repeat=rounds, number=number)
    py_ns = _median_ns(python_dispatch, repeat=rounds, number=number)
    call_ns = _median_ns(lambda: k(*args), repeat=rounds, number=2_000)
    print(
        f"warm dispatch (key + lookup, median of {rounds} rounds x {number}): jitkey Signature+LruCache "
        f"{jk_ns:.0f} ns, Python tuple key + dict {py_ns:.0f} ns -> {py_ns / jk_ns:.2f}x; "
        f"a whole warm kernel call (incl. the torch ops) {call_ns / 1000:.1f} us"
    )
    result = {
        "calls": len(calls),
        "compiles": misses,
        "correct": ok,
        "distinct_signature_keys": distinct_sig,
        "python_keys": len(table),
        "same_bound_kernels": same,
        "jitkey_dispatch_ns": jk_ns,
        "python_dispatch_ns": py_ns,
        "dispatch_speedup": py_ns / jk_ns,
        "warm_call_us": call_ns / 1000,
        "stats": {k2: v for k2, v in k.cache.stats().items() if k2 in ("hits", "misses")},
    }
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
