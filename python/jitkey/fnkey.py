"""Content-sensitive keys for Python functions, and detection of drift in the globals they read.

:func:`function_key` turns a kernel-building function (a ninetoothed arrangement, a Helion kernel, a
``triton.jit`` function, a ``functools.partial`` of one, ...) into a 32-byte digest that is stable across
processes and changes whenever anything the function's code depends on changes. :class:`GlobalsGuard`
watches the globals, closure cells and code of the same functions cheaply enough to check on every launch.

What a function key includes (for the function and, transitively, every function it reaches):

* **Code**: the source text of the function (``inspect.getsource`` of its code object, dedented;
  decorator lines included). Where there is no source (``exec``'d or ``compile``'d code, a stale
  ``linecache``), the bytecode instead: ``co_code``, constants (nested code objects recursively),
  names, variable names, argument counts, flags and the exception table, together with the
  interpreter's ``sys.implementation.cache_tag`` because bytecode differs between Python versions.
  A ``lambda`` that shares its source line with another lambda gets its bytecode added as well.
  For ``triton.jit`` functions, Triton's own ``.src`` (it can be replaced with ``_unsafe_update_src``).
* **Identity**: ``__module__`` and ``__qualname__``, so two functions with identical source but
  different names never share a key (the ninetoothed collision).
* **Defaults and keyword-only defaults**, **closure cell values** (by variable name; an empty cell
  is marked as such).
* **Globals the code reads**: every ``LOAD_GLOBAL`` name of the code object and of the code objects
  nested in it (inner functions, lambdas, comprehensions), resolved in the function's
  ``__globals__`` and then in its builtins; unresolved names are recorded as unbound. Attribute
  chains on a global module (``cfg.BLOCK``, ``tl.float16``, ``pkg.sub.CONST``) are followed through
  modules to the first non-module value, which is keyed like a global.
* **Triton**: ``triton.jit`` / ``triton.constexpr_function`` functions are followed like functions
  (their ``.src``, plus ``noinline``, ``debug``, ``version``, ``do_not_specialize`` and
  ``do_not_specialize_on_alignment``); ``triton.heuristics`` wrappers with their value functions;
  ``tl.constexpr`` by value; Triton dtypes by name, pointer types by element type, address space
  and constness.

How values (globals, cells, defaults, partial arguments) are keyed:

* Anything :func:`jitkey.encode` accepts (None, bool, int, float, str, bytes, tuples of them,
  ``torch.dtype``, ``torch.device``, ``torch.layout``, ``torch.memory_format``, objects with ``__jitkey__``) by
  value. Tuples holding other
  supported things (functions, modules, ...) element by element.
* Python functions written by the user (code outside ``site-packages``/``dist-packages`` and the
  standard library, or local functions anywhere) by content, as above; cycles terminate (each
  function is one node of a graph, referenced by its discovery index).
* Library functions, classes, builtins and other objects reachable by their import path
  (``module.qualname`` resolves to the very object) by that path plus the top-level package's
  version; their code is **not** hashed (fold :func:`jitkey.env_key` in for the versions that matter).
  Pass ``follow=`` to choose differently.
* Modules by name; enum members by class and member name.
* ``functools.partial`` layers by function, positional and keyword arguments; bound methods by
  function and instance, which must be keyable (``__jitkey__``); ``staticmethod``/``classmethod``
  by their function; wrapper objects with ``__wrapped__`` (``functools.lru_cache``, ``cache``) by
  the wrapper's type path and the wrapped function's content.
* Values of attributes read from library modules that cannot be keyed (``os.environ``, a lock
  in a library module) by their dotted path: library state is part of the library version.

Everything else raises :class:`jitkey.errors.FunctionKeyError` (an ``UnsupportedKeyError``, so a
``TypeError``) naming the function and what it captured: lists, dicts, sets, arbitrary instances,
classes defined inside functions. Nothing is ever keyed through ``repr()``. To leave a global out
on purpose, name it in ``ignore=`` (it is then recorded as ignored, by name).

Not included: the bodies of classes the code uses (a class is keyed by its import path), the code
of library functions, mutable state reached through objects (an instance's ``__jitkey__`` decides
what of it counts), ``co_filename`` and line numbers (so moving a function keeps its key), and
global *writes*.
"""

from __future__ import annotations

import builtins
import collections
import dis
import enum
import functools
import importlib.metadata
import inspect
import keyword
import linecache
import os
import re
import sys
import sysconfig
import textwrap
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, TypeVar

from jitkey._core import MAX_DEPTH, digest, encode
from jitkey.errors import FunctionKeyError, GlobalsChangedError, KeyDepthError, UnsupportedKeyError

__all__ = ["GlobalsGuard", "function_key", "function_key_tree", "is_library_code"]

KEY_VERSION: Final[int] = 2
"""Version of the function-key tree layout; part of every key. 2: functions are numbered in the
order a work list (no recursion) builds them, and source text counts only when it compiles to the
code that runs."""

_MISSING: Final = object()
_CACHE_TAG: Final[str] = str(sys.implementation.cache_tag)


# --------------------------------------------------------------------------------------------------
# What counts as library code


def _library_prefixes() -> tuple[str, ...]:
    paths: set[str] = set()
    for name in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            paths.add(os.path.realpath(path))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths))


_LIB_PREFIXES: Final[tuple[str, ...]] = _library_prefixes()
_LIB_DIRS: Final[frozenset[str]] = frozenset({"site-packages", "dist-packages"})


@functools.lru_cache(maxsize=4096)
def _is_library_file(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True  # the stdlib modules CPython freezes into the interpreter (os, posixpath, ...)
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if any(part in _LIB_DIRS for part in real.split(os.sep)):
        return True
    return real.startswith(_LIB_PREFIXES)


def is_library_code(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s code lives in an installed package or the standard library.

    The default ``follow`` rule of :func:`function_key` hashes the content of functions for which this
    is false (the user's code) and keys library functions by import path and package version.
    """
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return True
    return _is_library_file(code.co_filename)


def _module_is_library(module: types.ModuleType) -> bool:
    filename = getattr(module, "__file__", None)
    if filename is None:
        return True  # builtin or frozen module, or a namespace package
    return _is_library_file(str(filename))


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@functools.lru_cache(maxsize=1024)
def _package_version(module_name: str) -> str | None:
    """The version of the top-level package ``module_name`` belongs to, or None for the stdlib/unknown."""
    top = module_name.partition(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None) if mod is not None else None
    if type(version) is str:
        return version
    for dist in sorted(_distributions().get(top, ())):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _import_path(obj: object) -> tuple[str, str] | None:
    """``(module, qualname)`` if importing that path gives back ``obj`` itself, else None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if type(module) is not str or type(qualname) is not str or "<" in qualname:
        return None
    target: object = sys.modules.get(module)
    if target is None:
        return None
    for part in qualname.split("."):
        target = getattr(target, part, _MISSING)
        if target is _MISSING:
            return None
    return (module, qualname) if target is obj else None


# --------------------------------------------------------------------------------------------------
# Code objects


_V = TypeVar("_V")


class _PerCode:
    """Memo of values derived from a code object, keyed by identity, dropped with the code object.

    Code objects compare by content (not filename), so a plain dict would conflate equal code from two
    files; an id() key is safe because the weak reference's callback removes it before the id is reused.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[types.CodeType], Any]] = {}

    def get(self, code: types.CodeType, compute: Callable[[types.CodeType], _V]) -> _V:
        entry = self._entries.get(id(code))
        if entry is not None and entry[0]() is code:
            value: _V = entry[1]
            return value
        value = compute(code)
        ident = id(code)
        entries = self._entries
        ref = weakref.ref(code, lambda _r: entries.pop(ident, None))
        entries[ident] = (ref, value)
        return value


_SOURCES = _PerCode()
_READS = _PerCode()


def _global_reads(code: types.CodeType) -> tuple[frozenset[str], frozenset[tuple[str, ...]]]:
    """Names the code (and nested code) loads as globals, and the attribute chains read from them."""
    return _READS.get(code, _compute_global_reads)


def _compute_global_reads(code: types.CodeType) -> tuple[frozenset[str], frozenset[tuple[str, ...]]]:
    names: set[str] = set()
    chains: set[tuple[str, ...]] = set()
    stack = [code]
    while stack:
        co = stack.pop()
        current: list[str] | None = None
        for ins in dis.get_instructions(co):
            op = ins.opname
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                if current is not None and len(current) > 1:
                    chains.add(tuple(current))
                current = [str(ins.argval)]
                names.add(current[0])
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and current is not None:
                current.append(str(ins.argval))
            else:
                if current is not None and len(current) > 1:
                    chains.add(tuple(current))
                current = None
        if current is not None and len(current) > 1:
            chains.add(tuple(current))
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
    return frozenset(names), frozenset(chains)


def _const_tree(value: object, depth: int = 0) -> object:
    if depth > MAX_DEPTH:
        raise KeyDepthError(f"code constants are nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, types.CodeType):
        return _bytecode_tree(value, depth + 1)
    tp = type(value)
    if value is None or tp in (bool, int, float, str, bytes):
        return ("=", value)
    if tp is tuple:
        return ("tuple", tuple(_const_tree(v, depth + 1) for v in value))  # type: ignore[attr-defined]
    if tp is frozenset:
        items = [_const_tree(v, depth + 1) for v in value]  # type: ignore[attr-defined]
        return ("frozenset", tuple(sorted(items, key=encode)))
    if tp is complex:
        return ("complex", value.real, value.imag)  # type: ignore[attr-defined]
    if value is Ellipsis:
        return ("ellipsis",)
    raise FunctionKeyError(f"cannot key a code constant of type {tp.__qualname__!r}")


def _bytecode_tree(code: types.CodeType, depth: int = 0) -> tuple[object, ...]:
    return (
        "code",
        code.co_name,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_code,
        tuple(_const_tree(c, depth) for c in code.co_consts),
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        bytes(getattr(code, "co_exceptiontable", b"")),
    )


def _source_of(code: types.CodeType) -> str | None:
    """The dedented source of ``code``, or None when it cannot be found or does not match the code.

    Memoized per code object: the text first found for a running code object stays its source even
    if the file is edited afterwards (the code did not change).
    """
    return _SOURCES.get(code, _find_source)


def _find_source(code: types.CodeType) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(code))
    except (OSError, TypeError, IndentationError, SyntaxError, UnicodeDecodeError):
        return None
    name = code.co_name
    if name == "<lambda>":
        if "lambda" not in src:
            return None
    # A source file edited after import makes linecache return text of another function.
    elif re.search(rf"\b(?:def|class)\s+{re.escape(name)}\b", src) is None:
        return None
    # ... or of another version of this function: the text counts only if it is the code that runs.
    if not _source_compiles_to(code):
        return None
    return src


def _source_compiles_to(code: types.CodeType) -> bool:
    """Whether compiling the file text that ``inspect`` read for ``code`` (``linecache``) yields a code
    object equal to ``code`` at the same first line: same instructions, constants, names and line
    table. A file edited after import (a notebook, a long-running server) fails this, and the key
    then uses the bytecode that runs rather than text that does not."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return False
    module_code = _compile_text(code.co_filename, "".join(lines))
    if module_code is None:
        return False
    stack = [module_code]
    while stack:
        co = stack.pop()
        if co.co_firstlineno == code.co_firstlineno and co.co_name == code.co_name and co == code:
            return True
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
    return False


@functools.lru_cache(maxsize=64)
def _compile_text(filename: str, text: str) -> types.CodeType | None:
    try:
        return compile(text, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return None


def _code_key(code: types.CodeType, src: str | None) -> tuple[object, ...]:
    if src is None:
        src = _source_of(code)
    if src is None:
        return ("bytecode", _CACHE_TAG, _bytecode_tree(code))
    if code.co_name == "<lambda>" and src.count("lambda") > 1:
        return ("source+bytecode", src, _CACHE_TAG, _bytecode_tree(code))
    return ("source", src)


# --------------------------------------------------------------------------------------------------
# Triton (optional: only looked at when triton is already imported)


def _triton_types() -> dict[str, type] | None:
    """The Triton types of ``jitkey._triton_table.FNKEY_TYPES`` (``None``: Triton is not imported, or lacks one)."""
    if "triton" not in sys.modules:
        return None
    from jitkey import _triton_table

    out = {name: _triton_table.resolve(places) for name, places in _triton_table.FNKEY_TYPES.items()}
    if any(t is None for t in out.values()):  # pragma: no cover - a partial or very old triton
        return None
    return out


# --------------------------------------------------------------------------------------------------
# The walk shared by function_key and GlobalsGuard


class _Walk:
    """One traversal of the graph of functions reachable from a root.

    In ``strict`` mode (function_key) anything unkeyable raises; otherwise (GlobalsGuard) it is
    recorded as opaque, since the guard only compares identities.
    """

    def __init__(
        self, *, strict: bool, follow: Callable[[types.FunctionType], bool], ignore: frozenset[str]
    ) -> None:
        self.strict = strict
        self.follow = follow
        self.ignore = ignore
        self.nodes: list[object] = []
        self.index: dict[int, int] = {}
        # Nodes discovered but not built yet: built by drain() from a work list, not by recursion,
        # so a call chain of any length is walked without touching the recursion limit.
        self.pending: collections.deque[tuple[int, Callable[[], object]]] = collections.deque()
        self.alive: list[object] = []  # keeps walked objects alive so their ids stay unique
        self.triton = _triton_types()
        # Guard entries: (namespace dict, name, value), (cell, value), (object, attribute, value).
        self.dict_entries: list[tuple[dict[str, Any], str, object, str]] = []
        self.cell_entries: list[tuple[types.CellType, object, str]] = []
        self.attr_entries: list[tuple[object, str, object, str]] = []

    # -- nodes -------------------------------------------------------------------------------------

    def node(self, obj: object, build: Callable[[], object]) -> tuple[str, int]:
        idx = self.index.get(id(obj))
        if idx is None:
            idx = len(self.nodes)
            self.index[id(obj)] = idx
            self.alive.append(obj)
            self.nodes.append(None)
            self.pending.append((idx, build))
        return ("node", idx)

    def drain(self) -> None:
        """Builds every pending node, in discovery order (each build may discover more)."""
        while self.pending:
            idx, build = self.pending.popleft()
            self.nodes[idx] = build()

    def function(
        self, fn: types.FunctionType, src: str | None = None, extra: object = None
    ) -> tuple[str, int]:
        return self.node(fn, lambda: self._function_tree(fn, src, extra))

    def _function_tree(self, fn: types.FunctionType, src: str | None, extra: object) -> tuple[object, ...]:
        name = f"{fn.__module__}.{fn.__qualname__}"
        code = fn.__code__
        for attr in ("__code__", "__defaults__", "__kwdefaults__"):
            self.attr_entries.append((fn, attr, getattr(fn, attr), f"{name}.{attr}"))
        # The guard (non-strict walk) compares identities only: it needs no source.
        code_key = _code_key(code, src) if self.strict else None

        params = code.co_varnames[: code.co_argcount]
        defaults = fn.__defaults__ or ()
        default_names: tuple[str, ...] = params[len(params) - len(defaults) :]
        if len(default_names) != len(defaults):  # __defaults__ reassigned with more values than parameters
            default_names = tuple(f"#{i}" for i in range(len(defaults)))
        defaults_key = tuple(
            self.value(v, f"default of parameter {p!r} of {name}", 0)
            for p, v in zip(default_names, defaults, strict=True)
        )
        kwdefaults_key = tuple(
            (k, self.value(v, f"default of keyword-only parameter {k!r} of {name}", 0))
            for k, v in sorted((fn.__kwdefaults__ or {}).items())
        )

        closure_key: list[object] = []
        for var, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            try:
                contents = cell.cell_contents
            except ValueError:
                self.cell_entries.append((cell, _MISSING, f"{name}.<closure>.{var}"))
                closure_key.append((var, ("empty-cell",)))
                continue
            self.cell_entries.append((cell, contents, f"{name}.<closure>.{var}"))
            closure_key.append((var, self.value(contents, f"closure variable {var!r} of {name}", 0)))

        globals_key = self._globals(fn, name)
        return (
            "function",
            fn.__module__,
            fn.__qualname__,
            code_key,
            defaults_key,
            kwdefaults_key,
            tuple(closure_key),
            globals_key,
            extra,
        )

    def _globals(self, fn: types.FunctionType, name: str) -> tuple[object, ...]:
        g = fn.__globals__
        module_name = g.get("__name__")
        prefix = module_name if type(module_name) is str else name
        fn_builtins = getattr(fn, "__builtins__", None)  # 3.10+: the builtins the code resolves names in
        bdict = fn_builtins if isinstance(fn_builtins, dict) else vars(builtins)
        names, chains = _global_reads(fn.__code__)
        out: list[object] = []
        for gname in sorted(names):
            value = g.get(gname, _MISSING)
            self.dict_entries.append((g, gname, value, f"{prefix}.{gname}"))
            if gname in self.ignore:
                out.append((gname, ("ignored",)))
            elif value is not _MISSING:
                out.append((gname, self.value(value, f"global {gname!r} read by {name}", 0)))
            elif gname in bdict:
                out.append((gname, ("builtin",)))
            else:
                out.append((gname, ("unbound",)))
        for chain in sorted(chains):
            if chain[0] in self.ignore:
                continue
            entry = self._chain(g, chain, prefix, name)
            if entry is not None:
                out.append(entry)
        return tuple(out)

    def _chain(
        self, g: dict[str, Any], chain: tuple[str, ...], prefix: str, name: str
    ) -> tuple[object, ...] | None:
        value = g.get(chain[0], _MISSING)
        if not isinstance(value, types.ModuleType):
            return None  # the root global itself is keyed; attributes of non-modules are its business
        dotted = chain[0]
        for attr in chain[1:]:
            module = value
            assert isinstance(module, types.ModuleType)
            dotted = f"{dotted}.{attr}"
            value = vars(module).get(attr, _MISSING)
            self.dict_entries.append((vars(module), attr, value, f"{prefix}.{dotted}"))
            if dotted in self.ignore:
                return (dotted, ("ignored",))
            if value is _MISSING:
                return (dotted, ("missing",))
            if not isinstance(value, types.ModuleType):
                where = f"attribute {dotted!r} read by {name}"
                if not _module_is_library(module):
                    return (dotted, self.value(value, where, 0))
                try:
                    return (dotted, self.value(value, where, 0))
                except (UnsupportedKeyError, KeyDepthError):
                    # Library state (os.environ, a registry dict) belongs to the library version.
                    path = f"{module.__name__}.{attr}"
                    return (dotted, ("library-attr", path, _package_version(path)))
        return None  # a chain of modules only: modules are keyed by name

    # -- values ------------------------------------------------------------------------------------

    def value(self, v: object, where: str, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise KeyDepthError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        tp = type(v)
        if v is None or tp in (bool, int, float, str, bytes):
            return ("=", v)
        if tp is tuple and isinstance(v, tuple):
            try:
                encode(v)
            except (UnsupportedKeyError, KeyDepthError):
                return ("tuple", tuple(self.value(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)))
            return ("=", v)
        if isinstance(v, types.ModuleType):
            return ("module", v.__name__)
        if tp is types.FunctionType:
            assert isinstance(v, types.FunctionType)
            return self._function_value(v)
        if tp is functools.partial:
            assert isinstance(v, functools.partial)
            return (
                "partial",
                self.value(v.func, f"{where}.func", depth + 1),
                tuple(self.value(a, f"{where}.args[{i}]", depth + 1) for i, a in enumerate(v.args)),
                tuple(
                    (k, self.value(a, f"{where}.keywords[{k!r}]", depth + 1))
                    for k, a in sorted(v.keywords.items())
                ),
            )
        if tp is types.MethodType:
            assert isinstance(v, types.MethodType)
            return (
                "method",
                self.value(v.__func__, f"{where}.__func__", depth + 1),
                self._instance(v.__self__, f"{where}.__self__ (the instance of a bound method)", depth),
            )
        if tp in (staticmethod, classmethod):
            return (tp.__name__, self.value(v.__func__, f"{where}.__func__", depth + 1))  # type: ignore[attr-defined]
        if isinstance(v, enum.Enum):
            cls = _import_path(tp)
            if cls is not None:
                return ("enum", cls[0], cls[1], v.name)
        if self.triton is not None:
            tri = self._triton_value(v, where, depth)
            if tri is not None:
                return tri
        if tp is types.BuiltinFunctionType:
            owner = getattr(v, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                return (
                    "builtin-method",
                    self._instance(owner, f"{where}.__self__ (the object of a bound builtin method)", depth),
                    getattr(v, "__name__", ""),
                )
        try:
            encode(v)
        except (UnsupportedKeyError, KeyDepthError):
            pass
        else:
            return ("=", v)
        wrapped = getattr(v, "__wrapped__", _MISSING) if not isinstance(v, type) else _MISSING
        if wrapped is not _MISSING:
            # functools.lru_cache/cache and other wrapper objects: the wrapper's type by path, the
            # wrapped function by content (the wrapper itself is importable, its target's code counts).
            wrapper = _import_path(tp)
            if wrapper is not None:
                return (
                    "wrapped",
                    wrapper[0],
                    wrapper[1],
                    self.value(wrapped, f"{where}.__wrapped__", depth + 1),
                )
        path = _import_path(v)
        if path is not None:
            return ("ref", path[0], path[1], _package_version(path[0]))
        return self._unkeyable(v, where)

    def _unkeyable(self, v: object, where: str) -> object:
        if not self.strict:
            return ("opaque",)
        tp = type(v)
        what = f"{tp.__module__}.{tp.__qualname__}" if tp.__module__ != "builtins" else tp.__qualname__
        if isinstance(v, type):
            hint = "a class defined inside a function cannot be keyed by its import path"
        else:
            hint = "give its type a __jitkey__() method, make it a constant, or name it in ignore="
        raise FunctionKeyError(f"cannot key {where}: a value of type {what!r} ({hint})")

    def _instance(self, obj: object, where: str, depth: int) -> object:
        if isinstance(obj, type):
            return self.value(obj, where, depth + 1)
        try:
            encode(obj)
        except (UnsupportedKeyError, KeyDepthError):
            return self._unkeyable(obj, where)
        return ("=", obj)

    def _function_value(self, fn: types.FunctionType) -> object:
        if self.follow(fn) or _import_path(fn) is None:
            return self.function(fn)
        module, qualname = fn.__module__, fn.__qualname__
        return ("ref", module, qualname, _package_version(module))

    def _triton_value(self, v: object, where: str, depth: int) -> object | None:
        t = self.triton
        assert t is not None
        if isinstance(v, t["JITCallable"]):
            inner = v.fn  # type: ignore[attr-defined]
            extra = (
                "triton",
                type(v).__name__,
                tuple(
                    (attr, self.value(getattr(v, attr, None), f"{where}.{attr}", depth + 1))
                    for attr in ("noinline", "debug", "version")
                ),
                tuple(
                    (attr, self.value(tuple(getattr(v, attr, None) or ()), f"{where}.{attr}", depth + 1))
                    for attr in ("do_not_specialize", "do_not_specialize_on_alignment")
                ),
            )
            # One node for the JIT wrapper holding its function's tree (not a node of ``.fn``, which a
            # plain reference to ``.fn`` elsewhere could have created without the JIT options).
            src = getattr(v, "src", None)
            return self.node(v, lambda: ("jit", self._function_tree(inner, src, extra)))
        if isinstance(v, t["Heuristics"]):
            values = getattr(v, "values", {})
            return (
                "triton.heuristics",
                tuple(
                    (k, self.value(f, f"{where}.values[{k!r}]", depth + 1)) for k, f in sorted(values.items())
                ),
                self.value(v.fn, f"{where}.fn", depth + 1),  # type: ignore[attr-defined]
            )
        if isinstance(v, t["Autotuner"]):
            if self.strict:
                raise FunctionKeyError(
                    f"cannot key {where}: a triton Autotuner "
                    "(key its .fn; configs belong in the autotune key)"
                )
            return ("opaque",)
        if isinstance(v, t["constexpr"]):
            return ("tl.constexpr", self.value(v.value, f"{where}.value", depth + 1))  # type: ignore[attr-defined]
        if type(v) is t["dtype"]:
            return ("tl.dtype", v.name)  # type: ignore[attr-defined]
        if type(v) is t["pointer_type"]:
            return (
                "tl.pointer",
                self.value(v.element_ty, f"{where}.element_ty", depth + 1),  # type: ignore[attr-defined]
                self.value(v.address_space, f"{where}.address_space", depth + 1),  # type: ignore[attr-defined]
                self.value(v.const, f"{where}.const", depth + 1),  # type: ignore[attr-defined]
            )
        return None

    # -- roots -------------------------------------------------------------------------------------

    def root(self, fn: object) -> object:
        if isinstance(fn, types.FunctionType):
            return self.function(fn)  # the root is always keyed by content, library code or not
        if not isinstance(fn, type):
            tree = self.value(fn, "the function", 0)
            # triton.jit and heuristics wrappers are not callable themselves (they are launched with [grid])
            if callable(fn) or (type(tree) is tuple and tree[0] in ("node", "triton.heuristics")):
                return tree
        raise FunctionKeyError(
            f"function_key needs a function, got a value of type {type(fn).__qualname__!r}"
        )


def _default_follow(fn: types.FunctionType) -> bool:
    return not is_library_code(fn)


def _walk(
    fn: object,
    *,
    strict: bool,
    follow: Callable[[types.FunctionType], bool] | None,
    ignore: Iterable[str],
) -> tuple[_Walk, object]:
    if isinstance(ignore, str):
        raise TypeError("ignore= takes an iterable of names, not a single str")
    walk = _Walk(strict=strict, follow=follow or _default_follow, ignore=frozenset(ignore))
    root = walk.root(fn)
    walk.drain()
    return walk, root


def function_key_tree(
    fn: Callable[..., Any],
    *,
    follow: Callable[[types.FunctionType], bool] | None = None,
    ignore: Iterable[str] = (),
) -> tuple[object, ...]:
    """The keyable tree :func:`function_key` digests (for debugging: print it, diff two of them).

    ``("jitkey.function_key", version, root, nodes)``: ``root`` refers to functions as
    ``("node", i)``, and ``nodes[i]`` is the tree of the i-th function reached (depth first, in the
    deterministic order of defaults, closure variables and sorted global names).
    """
    walk, root = _walk(fn, strict=True, follow=follow, ignore=ignore)
    return ("jitkey.function_key", KEY_VERSION, root, tuple(walk.nodes))


def function_key(
    fn: Callable[..., Any],
    *,
    follow: Callable[[types.FunctionType], bool] | None = None,
    ignore: Iterable[str] = (),
) -> bytes:
    """Return a 32-byte, cross-process-stable, content-sensitive key of a function.

    ``fn`` may be a Python function, a ``functools.partial`` (of partials), a bound method whose
    instance is keyable, a ``triton.jit`` function or ``triton.heuristics`` wrapper. The key covers
    the code, qualified name, defaults, closure values, the globals the code reads and, transitively,
    the functions it reaches; the module docstring of :mod:`jitkey.fnkey` lists exactly what is and
    is not included.

    Args:
        follow: decides which Python functions reached from ``fn`` are keyed by content (True) or by
            import path and package version (False). Default: content for code outside installed
            packages and the standard library (:func:`is_library_code`). Functions that cannot be
            imported by their path are always keyed by content; ``fn`` itself always is.
        ignore: global names (``"NAME"``, or ``"mod.attr"`` for an attribute chain on a global
            module) to leave out of the key; they are recorded by name as ignored.

    Raises:
        jitkey.errors.FunctionKeyError: the function captures a value that cannot be keyed (the
            message names the function and the variable); also when ``fn`` is not a function.
        jitkey.errors.KeyDepthError: values nested deeper than :data:`jitkey.MAX_DEPTH`.

    Computing a key reads source files and disassembles code (tens to hundreds of microseconds per
    function): compute it once per kernel definition and watch for drift with :class:`GlobalsGuard`.
    """
    return digest(function_key_tree(fn, follow=follow, ignore=ignore))


def _cell_is_empty(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return True
    return False


def _plain_name(name: str) -> bool:
    """Whether ``name`` can be written in source as a global read (an identifier, not a keyword)."""
    return name.isidentifier() and not keyword.iskeyword(name)


def _fresh_names(count: int, avoid: set[str]) -> list[str]:
    """``count`` parameter names that do not shadow any of the globals a checker reads."""
    prefix = "_jk"
    while any(name.startswith(prefix) for name in avoid):
        prefix += "_"
    return [f"{prefix}{i}" for i in range(count)]


def _make_checker(
    params: list[str], terms: list[str], namespace: dict[str, Any], values: list[object]
) -> Callable[[], bool]:
    """A no-argument function ``return t0 and t1 and ...`` whose globals are ``namespace``.

    The parameters (all defaulted to ``values``) start with a prefix no watched global starts with.
    A deleted global or attribute, or an emptied cell, makes it return False.
    """
    errors = f"{params[0]}e" if params else "_jke"
    body = " and ".join(terms) if terms else "True"
    src = (
        f"def _jitkey_guard({', '.join([*params, errors])}):\n"
        f"    try:\n        return {body}\n"
        f"    except {errors}:\n"
        "        return False\n"
    )
    module_code = compile(src, "<GlobalsGuard>", "exec")
    fn_code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    defaults = (*values, (NameError, AttributeError, ValueError))
    checker: Callable[[], bool] = types.FunctionType(fn_code, namespace, "_jitkey_guard", defaults)
    return checker


class GlobalsGuard:
    """Detects that a global, closure cell or code object a function depends on was rebound.

    Watches what :func:`function_key` reads for ``fn``, transitively: each global name the code loads
    (in its module's namespace, including names resolved to builtins, so that shadowing them later is
    seen), the module attributes read through ``mod.attr`` chains, closure cells, and the
    ``__code__``/``__defaults__``/``__kwdefaults__`` of every function reached. The comparison is by
    identity: rebinding a global (even to an equal value) is a change; mutating an object in place is
    not seen (key such objects through ``__jitkey__`` and recompute the key instead).

    Unlike :func:`function_key`, the guard accepts values it cannot key (it only compares identities).
    """

    __slots__ = (
        "_absent",
        "_attr_names",
        "_attr_objs",
        "_attr_values",
        "_cell_values",
        "_cells",
        "_dict_names",
        "_dict_values",
        "_dicts",
        "_fn",
        "_follow",
        "_ignore",
        "_labels",
        "unchanged",
    )

    unchanged: Callable[[], bool]
    """``guard.unchanged()`` is True when nothing watched was rebound: the per-launch fast path.

    A generated function (no Python method frame in between) that reads each watched global with a
    ``LOAD_GLOBAL`` in the global's own namespace, which CPython specializes and caches, and compares
    identities: ``NAME0 is v0 and NAME1 is v1 and "ABSENT" not in ns and fn.__code__ is c and ...``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        follow: Callable[[types.FunctionType], bool] | None = None,
        ignore: Iterable[str] = (),
    ) -> None:
        self._fn = fn
        self._follow = follow
        self._ignore = frozenset(ignore)
        self.refresh()

    @property
    def fn(self) -> Callable[..., Any]:
        """The function this guard watches."""
        return self._fn

    @property
    def names(self) -> list[str]:
        """Labels of everything watched (``module.NAME``, ``module.mod.attr``, ``qualname.<closure>.var``)."""
        return list(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def refresh(self) -> None:
        """Take a new snapshot (after re-keying the function)."""
        walk, _ = _walk(self._fn, strict=False, follow=self._follow, ignore=self._ignore)
        seen: set[tuple[int, str]] = set()
        dicts: list[dict[str, Any]] = []
        names: list[str] = []
        values: list[object] = []
        labels: list[str] = []
        for d, name, value, label in walk.dict_entries:
            if (id(d), name) in seen:
                continue
            seen.add((id(d), name))
            dicts.append(d)
            names.append(name)
            values.append(value)
            labels.append(label)
        self._dicts, self._dict_names, self._dict_values = dicts, names, values
        self._cells = [c for c, _, _ in walk.cell_entries]
        self._cell_values = [v for _, v, _ in walk.cell_entries]
        labels.extend(label for _, _, label in walk.cell_entries)
        self._attr_objs = [o for o, _, _, _ in walk.attr_entries]
        self._attr_names = [a for _, a, _, _ in walk.attr_entries]
        self._attr_values = [v for _, _, v, _ in walk.attr_entries]
        labels.extend(label for _, _, _, label in walk.attr_entries)
        self._labels = labels
        self._build_probes()

    def _build_probes(self) -> None:
        """Compile the per-launch check: one generated function per watched namespace.

        For a namespace (a module's globals) the check is ``def f(v0, v1, ..., d): return NAME0 is v0
        and NAME1 is v1 and "ABSENT" not in d``, created with that namespace as its globals, so every
        read is a ``LOAD_GLOBAL`` that CPython specializes and caches; function attributes and cells
        get one more such function. This runs several times faster than a loop over the entries.
        """
        present: dict[int, tuple[dict[str, Any], list[str], list[object]]] = {}
        absent: dict[int, tuple[dict[str, Any], list[str]]] = {}
        for d, name, value in zip(self._dicts, self._dict_names, self._dict_values, strict=True):
            if value is _MISSING:
                absent.setdefault(id(d), (d, []))[1].append(name)
            else:
                group = present.setdefault(id(d), (d, [], []))
                group[1].append(name)
                group[2].append(value)
        # Function attributes and cells: terms on parameters only, valid in any namespace.
        objs: list[object] = []
        obj_terms: list[str] = []
        for obj, attr, value in zip(self._attr_objs, self._attr_names, self._attr_values, strict=True):
            objs += [obj, value]
            obj_terms.append(f"{{o{len(objs) - 2}}}.{attr} is {{o{len(objs) - 1}}}")
        for cell, value in zip(self._cells, self._cell_values, strict=True):
            if value is _MISSING:
                objs += [cell, _cell_is_empty]
                obj_terms.append(f"{{o{len(objs) - 1}}}({{o{len(objs) - 2}}})")
            else:
                objs += [cell, value]
                obj_terms.append(f"{{o{len(objs) - 2}}}.cell_contents is {{o{len(objs) - 1}}}")
        # One function per namespace; the first also carries the object terms and calls the others.
        namespaces = list(dict.fromkeys([*present, *absent]))
        checker: Callable[[], bool] | None = None
        for pos, key in enumerate(reversed(namespaces)):
            d, names, values = present.get(key) or (absent[key][0], [], [])
            gone = absent[key][1] if key in absent else []
            first = pos == len(namespaces) - 1
            n_own = len(values) + 1 + (len(objs) if first else 0) + (checker is not None)
            params = _fresh_names(n_own + 1, avoid=set(names))
            missing_param = params.pop()
            dict_param = params[len(values)]
            # A name that is not an identifier (AST-built code can load any string as a global) is
            # read from the namespace dict instead of pasted into the source.
            terms = [
                f"{n} is {p}" if _plain_name(n) else f"{dict_param}.get({n!r}, {missing_param}) is {p}"
                for n, p in zip(names, params, strict=False)
            ]
            terms += [f"{n!r} not in {params[len(values)]}" for n in gone]
            args: list[object] = [*values, d]
            if first:
                base = len(args)
                terms += [
                    t.format(**{f"o{i}": params[base + i] for i in range(len(objs))}) for t in obj_terms
                ]
                args += objs
            if checker is not None:
                terms.append(f"{params[len(args)]}()")
                args.append(checker)
            checker = _make_checker([*params, missing_param], terms, d, [*args, _MISSING])
        if checker is None:  # nothing read from any namespace
            params = [f"_jk{i}" for i in range(len(objs))]
            terms = [t.format(**{f"o{i}": params[i] for i in range(len(objs))}) for t in obj_terms]
            checker = _make_checker(params, terms, {"__builtins__": builtins}, objs)
        self.unchanged = checker

    def _current_cells(self) -> Iterator[object]:
        for cell in self._cells:
            try:
                yield cell.cell_contents
            except ValueError:
                yield _MISSING

    def changed(self) -> list[str]:
        """Labels of the watched globals, cells and code attributes rebound since the snapshot."""
        out: list[str] = []
        n_dicts = len(self._dicts)
        for i in range(n_dicts):
            if self._dicts[i].get(self._dict_names[i], _MISSING) is not self._dict_values[i]:
                out.append(self._labels[i])
        for j, current in enumerate(self._current_cells()):
            if current is not self._cell_values[j]:
                out.append(self._labels[n_dicts + j])
        base = n_dicts + len(self._cells)
        for k in range(len(self._attr_objs)):
            if getattr(self._attr_objs[k], self._attr_names[k]) is not self._attr_values[k]:
                out.append(self._labels[base + k])
        return out

    def check(self) -> None:
        """Raise :class:`jitkey.errors.GlobalsChangedError` naming what changed, if anything did."""
        if self.unchanged():
            return
        changed = self.changed()
        name = getattr(self._fn, "__qualname__", type(self._fn).__qualname__)
        raise GlobalsChangedError(f"{name}: changed since the snapshot: {', '.join(changed)}")

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", type(self._fn).__qualname__)
        return f"<GlobalsGuard of {name}: {len(self._labels)} watched>"
