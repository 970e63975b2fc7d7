"""A kernel's ``cache_key`` in a fresh process without Triton's walk over its source.

Triton's ``JITCallable.cache_key`` parses the function's source and walks it (``DependenciesFinder``): it reads
each global name the source uses and each attribute of what those names hold, hashes the source with the
``cache_key`` of every jit function it reaches, and keeps the values of the other globals it read
(``used_global_vals``), the constexpr ones in the hash too. Parsing and walking cost about 0.2-0.3 ms per
function, paid again by every process before its first launch of a kernel.

What the walk does with a given source is fixed by the source and by what each read returns; only the reads
touch the process. So the L2 keeps, per source, the walk's reads in order (a *trace*: which global name, which
attribute of which earlier read, whether inside a parameter's default value, and what kind of value came back),
and a later process replays them on its own globals: the same reads, and for each value what Triton's
``record_reference`` does with it (a jit function's ``cache_key`` into the hash, a global value into
``used_global_vals``, modules and builtins ignored), mirrored from the installed Triton's code, which the L2's
code digest pins. Every value is the live one, so the result is what Triton's walk would compute in that
process. A read that comes back as another kind of value than recorded, an exception, or anything the replay does
not mirror (a Triton aggregate, an attribute assigned to in the source) stops the replay, and Triton's own
walk runs, as without the L2.

A trace is recorded after Triton computed the function's ``cache_key`` in the process, and only if replaying it
there gives exactly that ``cache_key`` and ``used_global_vals``.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import inspect
import json
from collections import Counter
from types import ModuleType
from typing import Any

from jitkey._core import digest
from jitkey._triton_table import cache_key as _cache_key
from jitkey.triton import _installation

SCHEMA = "jitkey.triton.walk"
VERSION = 1

_LIBDEVICE = "triton.language.extra.libdevice"  # record_reference ignores its stubs


class _Stop(Exception):
    """The replay cannot stand for Triton's walk: Triton's own walk runs."""


@functools.cache
def _triton() -> tuple[Any, Any, Any, frozenset[str], frozenset[str]]:
    """``(JITCallable, constexpr, DependenciesFinder, supported builtins, supported modules)`` of this Triton."""
    from triton.language.core import constexpr
    from triton.runtime.jit import DependenciesFinder, JITCallable

    probe = DependenciesFinder(name="", globals={}, nonlocals={}, src="")
    return (
        JITCallable,
        constexpr,
        DependenciesFinder,
        frozenset(probe.supported_python_builtins),
        frozenset(probe.supported_modules),
    )


def _kind(val: Any, jitc: Any, constexpr: Any) -> str | None:
    """What ``record_reference`` does with ``val``, in its order of checks: ``"none"`` (``None`` or a module:
    nothing), ``"builtin"``, ``"libdevice"`` (nothing), ``"jit"`` (its ``cache_key`` into the hash), ``"data"``
    (kept in ``used_global_vals`` when read as a global), or ``None``: not replayed (an aggregate, a function
    Triton refuses, an AST node, which ``visit_Attribute`` would unwrap)."""
    if val is None or type(val) is ModuleType:
        return "none"
    if isinstance(val, ast.AST):
        return None
    if getattr(val, "__triton_aggregate__", False):
        return None
    if getattr(val, "__triton_builtin__", False):
        return "builtin"
    if getattr(val, "__module__", "") == _LIBDEVICE:
        return "libdevice"
    if isinstance(val, jitc):
        return "jit"
    if callable(val) and not isinstance(val, type) and not isinstance(val, constexpr):
        return None  # Triton raises "Unsupported function referenced"
    return "data"


def _replayable(fn: Any) -> bool:
    """Whether ``fn.cache_key`` is ``JITCallable``'s own (a subclass may compute it otherwise)."""
    jitc = _triton()[0]
    return isinstance(fn, jitc) and getattr(type(fn), "cache_key", None) is jitc.__dict__.get("cache_key")


def _trace_key(fn: Any, dialect: str) -> bytes:
    return digest((SCHEMA, VERSION, _installation.fingerprint(), dialect, fn.src))


# ---------------------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------------------


def _replay(fn: Any, ops: list[Any], dialect: str) -> tuple[str, dict[Any, Any]]:
    """``(cache_key, used_global_vals)`` as Triton's ``cache_key`` computes them, from the trace ``ops``, or
    ``_Stop``. Mirrors ``JITCallable.cache_key`` and ``DependenciesFinder`` (3.6.0 / 3.9.0)."""
    jitc, constexpr, _, builtins, modules = _triton()
    d36 = dialect == "3.6"
    f = fn.fn
    if not inspect.isfunction(f):
        raise _Stop
    nonlocals = inspect.getclosurevars(f).nonlocals if f.__closure__ else {}
    globals_ = fn.__globals__
    hasher = hashlib.sha256(fn.src.encode("utf-8"))
    used: dict[Any, Any] = {}

    def merge(other: dict[Any, Any]) -> None:
        for k in used.keys() & other.keys():
            if used[k][0] != other[k][0]:
                raise _Stop  # Triton raises its conflicting-value error
        used.update(other)

    def jit_key(func: Any) -> str:
        # Replayed in turn if recorded (a callee's walk that raises leaves the callee as it was).
        return str(_cache_key(func))

    # First every read, checked against the trace, with no effect outside: a replay that stops here leaves the
    # process as it found it (hashing a callee early would change what a 3.6 walk merges from it later).
    vals: list[Any] = []
    effects: list[tuple[str, Any, Any, Any]] = []  # record_reference's, in the walk's order
    for op in ops:
        if op[0] == "n":  # visit_Name: a global (or nonlocal) name the source reads
            _, name, default, kind = op
            if d36:
                val = globals_.get(name, None)
                var_dict: Any = globals_
                if val is None:
                    val = nonlocals.get(name, None)
                    var_dict = nonlocals
                if val is None:
                    var_dict = None
            elif name in nonlocals:
                val, var_dict = nonlocals[name], nonlocals
            elif name in globals_:
                val, var_dict = globals_[name], globals_
            else:
                val = var_dict = None
            if _kind(val, jitc, constexpr) != kind:
                raise _Stop
            vals.append(val)
            if name in builtins:
                continue
        else:  # visit_Attribute: an attribute of an earlier read's value (or of None)
            _, at, attr, default, kind = op
            lhs = vals[at] if at >= 0 else None
            if lhs is None or getattr(lhs, "__name__", "") in modules:
                val = None
            else:
                val = getattr(lhs, attr) if d36 else getattr(lhs, attr, None)
            if _kind(val, jitc, constexpr) != kind:
                raise _Stop
            vals.append(val)
            name = var_dict = None
        if kind == "jit" or (kind == "data" and not default and var_dict is not None):
            effects.append((kind, val, name, var_dict))
    # Then record_reference's effects, in order.
    for kind, val, name, var_dict in effects:
        if kind == "jit":
            if d36:  # 3.6 reads the callee's globals before its cache_key computes them
                merge(val.used_global_vals)
                key = jit_key(val)
            else:
                key = jit_key(val)
                merge(val.used_global_vals)
            key += str(getattr(val, "noinline", False))
            hasher.update(key.encode("utf-8"))
        else:
            used[(name, id(var_dict))] = (copy.deepcopy(val), var_dict)
    return _finish(fn, hasher.hexdigest(), used, dialect)


def _finish(fn: Any, ret: str, used: dict[Any, Any], dialect: str) -> tuple[str, dict[Any, Any]]:
    """The end of ``JITCallable.cache_key``: ``(cache_key, used_global_vals)`` from the walk's ``ret`` and
    ``used_global_vals``."""
    constexpr = _triton()[1]
    h = ret + str(fn.starting_line_number)
    used_global_vals = dict(sorted(used.items()))
    consts = [(name, val) for (name, _), (val, _) in used_global_vals.items() if isinstance(val, constexpr)]
    if dialect != "3.6":
        consts.sort(key=lambda item: (item[0], repr(item[1])))
    h += str(consts)
    return hashlib.sha256(h.encode("utf-8")).hexdigest(), used_global_vals


_walked: list[Any] = []  # functions whose restore failed (Triton walks them next): recorded by flush()
#: This process's first ``cache_key``s of jit functions that jitkey asked for: ``replayed`` from a trace, or
#: ``walked`` by Triton (no trace, or the replay stopped; a helper Triton's walk reaches by itself is not
#: counted). ``jitkey.triton.report()["l2_walks"]``.
counts: Counter[str] = Counter()


def restore(fn: Any, dialect: str) -> bool:
    """Set ``fn``'s ``cache_key`` (and ``used_global_vals``) from its recorded trace, as Triton's walk would;
    ``False`` (``fn`` untouched) when it is hashed already, has no trace or the replay stops (then Triton's walk
    hashes it, and :func:`flush` records its trace)."""
    if not _replayable(fn) or fn.__dict__.get("hash") is not None:
        return False
    ops = _load(fn, dialect)
    done = False
    if ops is not None:
        with fn._hash_lock:
            if fn.hash is not None:
                return False
            fn.hash = f"recursion:{fn._fn_name}"  # what Triton's walk sets first: a recursive call reads it
            try:
                fn.hash, fn.used_global_vals = _replay(fn, ops, dialect)
                done = True
            except Exception:
                pass
            finally:
                if not done:
                    fn.hash = None
    counts["replayed" if done else "walked"] += 1
    if not done and len(_walked) < 4096:
        _walked.append(fn)
    return done


def restore_if_on(fn: Any) -> None:
    """:func:`restore` where this process uses the L2 (jitkey's reads of ``cache_key`` call it first)."""
    from jitkey.triton import _l2

    dialect = _l2.process_status()[0]
    if dialect is not None:
        restore(fn, dialect)


def _load(fn: Any, dialect: str) -> list[Any] | None:
    """The trace recorded for ``fn``'s source, if any (a damaged record reads as none)."""
    ix = _installation.index()
    if ix is None:
        return None
    try:
        raw = ix.get(_trace_key(fn, dialect))
        if raw is None:
            return None
        rec = json.loads(raw)
        ops = rec["ops"]
        return ops if rec.get("v") == VERSION and isinstance(ops, list) else None
    except Exception:
        return None


def flush(dialect: str) -> list[str]:
    """Record the traces of the functions Triton walked since the last flush (see :func:`restore`); why some
    were not recorded."""
    todo = _walked[:]
    del _walked[: len(todo)]
    seen: set[int] = set()
    problems = []
    for fn in todo:
        why = record(fn, dialect, seen)
        if why is not None:
            problems.append(why)
    return problems


# ---------------------------------------------------------------------------------------------------------
# Record
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def _recorder_class() -> type:
    """The installed ``DependenciesFinder``, noting each read its walk makes (the visitor itself is Triton's)."""
    jitc, constexpr, finder, _, _ = _triton()

    class Recorder(finder):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.jk_ops: list[list[Any]] = []
            self.jk_vals: list[Any] = []
            self.jk_at: dict[int, int] = {}  # id(node) -> the op that read it
            self.jk_problem: str | None = None

        def _note(self, node: Any, op: list[Any], val: Any) -> None:
            kind = _kind(val, jitc, constexpr)
            if kind is None:
                self.jk_problem = f"a {type(val).__qualname__} the replay does not follow"
            op.append(kind)
            self.jk_at[id(node)] = len(self.jk_ops)
            self.jk_ops.append(op)
            self.jk_vals.append(val)

        def visit_Name(self, node: Any) -> Any:
            if type(node.ctx) is ast.Store or node.id in self.local_names:
                return super().visit_Name(node)  # no read
            op = ["n", node.id, self.visiting_arg_default_value]
            val = super().visit_Name(node)
            self._note(node, op, val)
            return val

        def visit_Attribute(self, node: Any) -> Any:
            if type(node.ctx) is not ast.Load:
                # The attribute's value would join the names the walk treats as local.
                self.jk_problem = "an attribute assigned to in the source"
            if isinstance(node.value, ast.Tuple):
                self.jk_problem = "an attribute of a tuple"
            val = super().visit_Attribute(node)
            at = (
                self.jk_at.get(id(node.value), -1)
                if isinstance(node.value, (ast.Name, ast.Attribute))
                else -1
            )
            self._note(node, ["a", at, node.attr, self.visiting_arg_default_value], val)
            return val

    return Recorder


def _trace(fn: Any, dialect: str) -> tuple[list[list[Any]], list[Any], str | None, Any]:
    """Triton's walk over ``fn``'s source, now, noting its reads: ``(ops, values, why not replayable, what
    cache_key would make of the walk: (cache_key, used_global_vals))``."""
    rec = _recorder_class()(
        name=fn._fn_name,
        globals=fn.__globals__,
        nonlocals=inspect.getclosurevars(fn.fn).nonlocals,
        src=fn.src,
    )
    rec.visit(fn.parse())
    why = rec.jk_problem
    if why is None and not all(isinstance(n, str) or n is None for n in rec.local_names):
        why = "a name the walk treats as local is not a name"
    return rec.jk_ops, rec.jk_vals, why, _finish(fn, rec.ret, rec.used_global_vals, dialect)


def _same(fn: Any, a: tuple[str, dict[Any, Any]], b: tuple[str, dict[Any, Any]]) -> bool:
    """Whether two ``(cache_key, used_global_vals)`` of ``fn`` agree: the key, each global's name and value, and
    the dict it was read from (the same one, or both ``fn``'s closure: a walk makes that dict afresh)."""
    if a[0] != b[0] or len(a[1]) != len(b[1]):
        return False
    for ((n1, _), (v1, d1)), ((n2, _), (v2, d2)) in zip(a[1].items(), b[1].items(), strict=True):
        if n1 != n2 or type(v1) is not type(v2) or not bool(v1 == v2):
            return False
        if d1 is not d2 and (d1 is fn.__globals__ or d2 is fn.__globals__ or d1.keys() != d2.keys()):
            return False
    return True


def record(fn: Any, dialect: str, seen: set[int] | None = None) -> str | None:
    """Record the trace of ``fn`` and of the jit functions its walk reached, once ``fn.cache_key`` is known in
    this process; why ``fn``'s was not recorded (``None``: recorded or already there)."""
    if seen is None:
        seen = set()
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    if not _replayable(fn):
        return f"a {type(fn).__qualname__} computes its cache_key otherwise"
    h = fn.__dict__.get("hash")
    if not isinstance(h, str) or h.startswith("recursion:"):
        return "its cache_key is not known in this process"
    ix = _installation.index()
    if ix is None:
        return "no disk index"
    key = _trace_key(fn, dialect)
    try:
        if ix.get(key) is not None:
            return None
        ops, vals, why, walked = _trace(fn, dialect)
    except Exception as exc:
        return f"its walk raised {type(exc).__name__}"
    for val in vals:  # the callees too: their own walks are what a replay of this one asks for first
        if _replayable(val):
            record(val, dialect, seen)
    if why is not None:
        return why
    # Replayed here and now, the trace must give what Triton's walk gave here and now. (Not fn's own cache_key:
    # under Triton 3.6 what a walk takes from a callee depends on what the process had hashed before it.)
    try:
        if not _same(fn, _replay(fn, ops, dialect), walked):
            return "its trace replays to another cache_key"
    except Exception:
        return "its trace does not replay"
    try:
        ix.put(key, json.dumps({"v": VERSION, "ops": ops}).encode())
    except Exception as exc:
        return f"not stored ({type(exc).__name__})"
    return None
