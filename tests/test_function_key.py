"""jitkey.function_key / function_key_tree / GlobalsGuard: content sensitivity, stability, errors."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jitkey
from jitkey.errors import FunctionKeyError, GlobalsChangedError, UnsupportedKeyError

_counter = iter(range(1_000_000))


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Write ``src`` as module ``name`` in a fresh directory and import it (registered in sys.modules)."""

    def _load(src: str, name: str = "fkmod") -> Any:
        directory = tmp_path / f"v{next(_counter)}"
        directory.mkdir()
        path = directory / f"{name}.py"
        path.write_text(textwrap.dedent(src))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    yield _load


def key(fn: Callable[..., Any], **kw: Any) -> bytes:
    k = jitkey.function_key(fn, **kw)
    assert type(k) is bytes and len(k) == 32
    assert k == jitkey.digest(jitkey.function_key_tree(fn, **kw))
    return k


BASE = """
BLOCK = 64
NAME = "add"
UNUSED = 1

def helper(x):
    return x * 2

def kernel(x, y=3, *, z=4):
    return helper(x) + y + z + BLOCK
"""


# ------------------------------------------------------------------------------------------------
# sensitivity


def test_same_content_same_key_even_from_another_file(load: Callable[..., Any]) -> None:
    a = load(BASE)
    b = load(BASE)
    assert a.kernel is not b.kernel
    assert key(a.kernel) == key(a.kernel) == key(b.kernel)


def test_source_change_changes_key(load: Callable[..., Any]) -> None:
    a = load(BASE)
    b = load(BASE.replace("+ y + z", "+ y - z"))
    assert key(a.kernel) != key(b.kernel)


def test_whitespace_only_edit_outside_the_function_keeps_key(load: Callable[..., Any]) -> None:
    # Line numbers are not part of the key: moving the function keeps it.
    a = load(BASE)
    b = load("\n\n# a comment\n" + BASE)
    assert key(a.kernel) == key(b.kernel)


def test_transitive_helper_change_changes_key(load: Callable[..., Any]) -> None:
    src = BASE.replace("return x * 2", "return inner(x)") + "\ndef inner(x):\n    return x + 1\n"
    a = load(src)
    b = load(src.replace("return x + 1", "return x + 2"))
    c = load(src)
    assert key(a.kernel) != key(b.kernel)
    assert key(a.kernel) == key(c.kernel)


def test_defaults_and_kwdefaults(load: Callable[..., Any]) -> None:
    m = load(BASE)
    k0 = key(m.kernel)
    m.kernel.__defaults__ = (5,)
    k1 = key(m.kernel)
    m.kernel.__kwdefaults__ = {"z": 5}
    k2 = key(m.kernel)
    m.kernel.__defaults__, m.kernel.__kwdefaults__ = (3,), {"z": 4}
    assert len({k0, k1, k2}) == 3
    assert key(m.kernel) == k0


def test_constexpr_global_change_changes_key_unread_global_does_not(
    load: Callable[..., Any],
) -> None:
    m = load(BASE)
    k0 = key(m.kernel)
    m.UNUSED = 2
    assert key(m.kernel) == k0
    m.BLOCK = 128
    k1 = key(m.kernel)
    assert k1 != k0
    m.BLOCK = 64
    assert key(m.kernel) == k0
    m.BLOCK = 64.0  # same number, other type
    assert key(m.kernel) not in (k0, k1)


def test_global_read_only_by_a_helper_counts(load: Callable[..., Any]) -> None:
    m = load(BASE.replace("return x * 2", "return x * NAME"))
    k0 = key(m.kernel)
    m.NAME = "sub"
    assert key(m.kernel) != k0


def test_global_read_in_nested_code_counts(load: Callable[..., Any]) -> None:
    m = load(
        """
        SCALE = 2
        def kernel(xs):
            return [x * SCALE for x in xs], (lambda: SCALE)
        """
    )
    k0 = key(m.kernel)
    m.SCALE = 3
    assert key(m.kernel) != k0


def test_closure_values(load: Callable[..., Any]) -> None:
    m = load(
        """
        def make(block, dtype):
            def kernel(x):
                return x + block, dtype
            return kernel
        """
    )
    import torch

    k = {key(m.make(b, d)) for b in (16, 32) for d in (torch.float16, torch.float32)}
    assert len(k) == 4
    assert key(m.make(16, torch.float16)) == key(m.make(16, torch.float16))


def test_partial_layers(load: Callable[..., Any]) -> None:
    m = load(BASE)
    p = functools.partial(m.kernel, 1, z=7)
    assert key(p) == key(functools.partial(m.kernel, 1, z=7))
    assert key(p) != key(functools.partial(m.kernel, 2, z=7))
    assert key(p) != key(functools.partial(m.kernel, 1, z=8))
    assert key(p) != key(functools.partial(m.kernel, 1, y=7))
    assert key(p) != key(m.kernel)
    nested = functools.partial(functools.partial(m.helper), 3)
    assert key(nested) != key(functools.partial(m.helper, 4))


def test_module_attribute_chain(load: Callable[..., Any]) -> None:
    cfg = load("BLOCK = 16\nOTHER = 1\n", name="fkcfg")
    m = load("import fkcfg\n\ndef kernel(x):\n    return x + fkcfg.BLOCK\n")
    k0 = key(m.kernel)
    cfg.OTHER = 2
    assert key(m.kernel) == k0
    cfg.BLOCK = 32
    assert key(m.kernel) != k0


def test_library_references_are_keyed_by_path_not_content(load: Callable[..., Any]) -> None:
    m = load(
        """
        import os
        import math
        import torch
        from json import dumps
        def kernel(x):
            return os.path.join("a", dumps(x)), math.sqrt(2), torch.empty, os.environ
        """
    )
    tree: Any = jitkey.function_key_tree(m.kernel)
    globals_read = dict(tree[3][0][7])
    torch_version = f"torch=={importlib.metadata.version('torch')}"
    assert globals_read["dumps"] == ("ref", "json", "dumps", "2.0.9")  # json.__version__
    assert globals_read["os.path.join"][:3] == ("ref", "posixpath", "join")
    assert globals_read["math.sqrt"] == ("ref", "math", "sqrt", None)
    assert globals_read["os.environ"] == ("library-attr", "os.environ", None)
    assert globals_read["torch.empty"] == ("library-attr", "torch.empty", torch_version)
    assert globals_read["os"] == ("module", "os")
    assert key(m.kernel) == key(m.kernel)


def test_identical_source_different_names_differ() -> None:
    src = "def kernel(x):\n    return x + 1\n"
    ns1: dict[str, Any] = {"__name__": "pkg.add_kernel"}
    ns2: dict[str, Any] = {"__name__": "pkg.sub_kernel"}
    exec(compile(src, "<generated>", "exec"), ns1)
    exec(compile(src, "<generated>", "exec"), ns2)
    assert key(ns1["kernel"]) != key(ns2["kernel"])
    f1, f2 = ns1["kernel"], types.FunctionType(ns1["kernel"].__code__, ns1, "kernel")
    f2.__qualname__ = "kernel_b"
    assert key(f1) != key(f2)


def test_bytecode_fallback_without_source() -> None:
    def make(src: str) -> Callable[..., Any]:
        ns: dict[str, Any] = {"__name__": "gen"}
        exec(compile(src, "<no-source>", "exec"), ns)
        fn: Callable[..., Any] = ns["f"]
        return fn

    a, b = make("def f(x):\n    return x + 1\n"), make("def f(x):\n    return x + 2\n")
    tree: Any = jitkey.function_key_tree(a)
    assert tree[3][0][3][0] == "bytecode" and tree[3][0][3][1] == sys.implementation.cache_tag
    assert key(a) != key(b)
    assert key(a) == key(make("def f(x):\n    return x + 1\n"))
    # nested code objects, frozensets and complex constants are keyed too
    c = make("def f(x):\n    return [y in {1, 2, 'a'} for y in x], 1j, ...\n")
    d = make("def f(x):\n    return [y in {1, 3, 'a'} for y in x], 1j, ...\n")
    assert key(c) != key(d)


def test_lambdas_sharing_a_line_differ(load: Callable[..., Any]) -> None:
    m = load("PAIR = (lambda x: x + 1, lambda x: x + 2)\n")
    assert key(m.PAIR[0]) != key(m.PAIR[1])


def test_recursion_and_cycles_terminate(load: Callable[..., Any]) -> None:
    src = """
    def even(n):
        return True if n == 0 else odd(n - 1)
    def odd(n):
        return False if n == 0 else even(n - 1)
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    def outer():
        def rec(n):
            return 0 if n == 0 else rec(n - 1)
        return rec
    """
    a = load(src)
    b = load(src.replace("odd(n - 1)", "odd(n - 1 + 0)"))
    assert key(a.even) == key(load(src).even)
    assert key(a.even) != key(b.even)
    assert key(a.odd) != key(b.odd)  # the cycle reaches the changed function from either side
    assert key(a.fact) == key(a.fact)
    assert key(a.outer()) == key(a.outer())
    tree: Any = jitkey.function_key_tree(a.even)
    assert len(tree[3]) == 2  # even and odd, each once


def test_bound_methods_need_a_keyable_instance(load: Callable[..., Any]) -> None:
    m = load(
        """
        class Tiler:
            def __init__(self, block):
                self.block = block
            def __jitkey__(self):
                return (self.block,)
            def tile(self, x):
                return x // self.block

        class Opaque:
            def tile(self, x):
                return x
        """
    )
    assert key(m.Tiler(16).tile) == key(m.Tiler(16).tile)
    assert key(m.Tiler(16).tile) != key(m.Tiler(32).tile)
    with pytest.raises(FunctionKeyError, match=r"__self__.*Opaque"):
        jitkey.function_key(m.Opaque().tile)


def test_unkeyable_captured_state_raises_typed_error(load: Callable[..., Any]) -> None:
    m = load(
        """
        TABLE = {"a": 1}
        def make():
            cfg = [1, 2]
            def kernel(x):
                return x + cfg[0]
            return kernel
        def reads_table(x):
            return TABLE[x]
        def default_list(x, opts=[]):
            return x
        def make_local_class():
            class Local:
                pass
            def kernel():
                return Local
            return kernel
        """
    )
    with pytest.raises(
        FunctionKeyError, match=r"closure variable 'cfg' of fkmod\.make\.<locals>\.kernel.*'list'"
    ):
        jitkey.function_key(m.make())
    with pytest.raises(FunctionKeyError, match=r"global 'TABLE' read by fkmod\.reads_table.*'dict'"):
        jitkey.function_key(m.reads_table)
    with pytest.raises(FunctionKeyError, match=r"default of parameter 'opts'"):
        jitkey.function_key(m.default_list)
    with pytest.raises(FunctionKeyError, match=r"class defined inside a function"):
        jitkey.function_key(m.make_local_class())
    with pytest.raises(FunctionKeyError, match="cfg"):
        jitkey.function_key(functools.partial(m.make()))
    with pytest.raises(UnsupportedKeyError):  # the builtin-derived base classes keep working
        jitkey.function_key(m.reads_table)
    with pytest.raises(TypeError):
        jitkey.function_key(m.reads_table)
    # ignore= leaves a global out on purpose, visibly
    tree: Any = jitkey.function_key_tree(m.reads_table, ignore=["TABLE"])
    assert ("TABLE", ("ignored",)) in tree[3][0][7]
    with pytest.raises(FunctionKeyError, match="needs a function"):
        jitkey.function_key(42)  # type: ignore[arg-type]
    with pytest.raises(FunctionKeyError, match="needs a function"):
        jitkey.function_key(int)


def test_half_built_nodes_are_rolled_back(load: Callable[..., Any]) -> None:
    # A failing library-module attribute falls back to its path; the walk must not keep partial nodes.
    m = load(BASE)
    assert key(m.kernel) == key(m.kernel)


def test_wrapped_helpers_are_followed_into(load: Callable[..., Any]) -> None:
    src = """
    import functools
    @functools.lru_cache(maxsize=None)
    def table(n):
        return tuple(range(n))
    def kernel(n):
        return table(n)
    """
    a = load(src)
    ka = key(a.kernel)
    b = load(src.replace("range(n)", "range(n + 1)"))
    assert key(b.kernel) != ka


def test_enum_and_class_references(load: Callable[..., Any]) -> None:
    src = """
    import enum
    class Mode(enum.Enum):
        A = 1
        B = 2
    class Base:
        def f(self):
            return 1
    class Child(Base):
        def __jitkey__(self):
            return ()
        def f(self):
            return super().f() + 1
    M = Mode.A
    def kernel(x):
        return x if M is Mode.A else -x
    """
    m = load(src)
    tree: Any = jitkey.function_key_tree(m.kernel)
    assert dict(tree[3][0][7]) == {
        "M": ("enum", "fkmod", "Mode", "A"),
        "Mode": ("ref", "fkmod", "Mode", None),
    }
    k0 = key(m.kernel)
    m.M = m.Mode.B
    assert key(m.kernel) != k0
    # super() makes a __class__ cell: the class is keyed by its import path
    child_tree: Any = jitkey.function_key_tree(m.Child().f)
    assert child_tree[3][0][6] == (("__class__", ("ref", "fkmod", "Child", None)),)


def test_follow_predicate_switches_content_and_reference(load: Callable[..., Any]) -> None:
    never = lambda fn: False  # noqa: E731
    a = load(BASE)
    ka_ref, ka = key(a.kernel, follow=never), key(a.kernel)
    b = load(BASE.replace("return x * 2", "return x * 3"))  # replaces sys.modules["fkmod"]
    # with follow=False the helper is keyed by its import path, so its content no longer counts
    assert key(b.kernel, follow=never) == ka_ref
    assert key(b.kernel) != ka
    # a.helper is no longer importable by its path: it is keyed by content whatever follow says
    assert key(a.kernel, follow=never) == ka


@settings(max_examples=60, deadline=None)
@given(
    a=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.tuples(st.integers())),
    b=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.tuples(st.integers())),
)
def test_global_value_keys_iff_encoding_equal(a: object, b: object) -> None:
    ns: dict[str, Any] = {"__name__": "hyp"}
    exec(compile("def f():\n    return G\n", "<hyp>", "exec"), ns)
    ns["G"] = a
    ka = jitkey.function_key(ns["f"])
    ns["G"] = b
    kb = jitkey.function_key(ns["f"])
    assert (ka == kb) == (jitkey.encode(a) == jitkey.encode(b))


# ------------------------------------------------------------------------------------------------
# cross-process stability


def test_stable_across_processes(load: Callable[..., Any]) -> None:
    src = (
        BASE + "\nimport torch\nDT = torch.float16\ndef k2(x, s={1, 2}):\n    return kernel(x), DT, {3, 4}\n"
    )
    m = load(src)
    path = Path(m.__file__ or "")
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        import jitkey
        spec = importlib.util.spec_from_file_location("fkmod", {str(path)!r})
        m = importlib.util.module_from_spec(spec)
        sys.modules["fkmod"] = m
        spec.loader.exec_module(m)
        import functools
        print(jitkey.function_key(m.kernel).hex(), jitkey.function_key(functools.partial(m.kernel, 2)).hex())
        """
    )
    outs = []
    for seed in ("1", "2"):
        env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True, timeout=120
        )
        outs.append(proc.stdout.split())
    assert outs[0] == outs[1]
    assert outs[0] == [key(m.kernel).hex(), key(functools.partial(m.kernel, 2)).hex()]


# ------------------------------------------------------------------------------------------------
# triton


TRITON_SRC = """
import triton
import triton.language as tl

BLOCK = tl.constexpr(128)
DTYPE = tl.float16

@triton.jit
def helper(x):
    return x * 2

@triton.jit
def kernel(X, Y, n, B: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, helper(x).to(DTYPE), mask=offs < n)
"""


def test_triton_jit_functions(load: Callable[..., Any]) -> None:
    pytest.importorskip("triton")
    a = load(TRITON_SRC)
    assert key(a.kernel) == key(load(TRITON_SRC).kernel)
    variants = [
        TRITON_SRC.replace("return x * 2", "return x * 3"),  # helper
        TRITON_SRC.replace("tl.constexpr(128)", "tl.constexpr(256)"),  # constexpr global
        TRITON_SRC.replace("tl.float16", "tl.bfloat16"),  # dtype global
        TRITON_SRC.replace("@triton.jit\ndef kernel", "@triton.jit(do_not_specialize=['n'])\ndef kernel"),
    ]
    keys = {key(a.kernel)} | {key(load(v).kernel) for v in variants}
    assert len(keys) == len(variants) + 1


def test_triton_heuristics_and_autotune(load: Callable[..., Any]) -> None:
    pytest.importorskip("triton")
    src = """
    import triton
    import triton.language as tl

    @triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
    @triton.jit
    def hk(X, n, EVEN: tl.constexpr):
        pass

    @triton.autotune(configs=[triton.Config({"B": 16})], key=["n"])
    @triton.jit
    def ak(X, n, B: tl.constexpr):
        pass
    """
    a = load(src)
    assert key(a.hk) == key(load(src).hk)
    assert key(a.hk) != key(load(src.replace("% 2 == 0", "% 4 == 0")).hk)  # the heuristic's code counts
    with pytest.raises(FunctionKeyError, match="Autotuner"):
        jitkey.function_key(a.ak)
    assert key(a.ak.fn) == key(load(src).ak.fn)


# ------------------------------------------------------------------------------------------------
# GlobalsGuard


def test_globals_guard_detects_rebinding(load: Callable[..., Any]) -> None:
    cfg = load("BLOCK = 16\n", name="fkcfg")
    m = load(
        """
        import fkcfg
        SCALE = 2
        TABLE = {"unkeyable": "fine for a guard"}
        def helper(x):
            return x * SCALE
        def make(v):
            def kernel(x):
                return helper(x) + v + fkcfg.BLOCK + len(TABLE)
            def set_v(n):
                nonlocal v
                v = n
            return kernel, set_v
        """
    )
    kernel, set_v = m.make(1)
    guard = jitkey.GlobalsGuard(kernel)
    assert guard.unchanged() and guard.changed() == []
    guard.check()
    assert "fkmod.SCALE" in guard.names and "fkmod.fkcfg.BLOCK" in guard.names
    assert len(guard) == len(guard.names)

    m.SCALE = 3
    assert guard.changed() == ["fkmod.SCALE"]
    assert not guard.unchanged()
    with pytest.raises(GlobalsChangedError, match=r"fkmod\.SCALE"):
        guard.check()
    with pytest.raises(RuntimeError):
        guard.check()
    guard.refresh()
    guard.check()

    cfg.BLOCK = 32
    set_v(5)
    m.len = lambda t: 0  # shadows a builtin the code reads
    assert sorted(guard.changed()) == sorted(
        ["fkmod.fkcfg.BLOCK", "fkmod.make.<locals>.kernel.<closure>.v", "fkmod.len"]
    )
    guard.refresh()
    m.helper.__code__ = (lambda x: x).__code__
    assert guard.changed() == ["fkmod.helper.__code__"]
    guard.refresh()
    m.SCALE = 3  # rebinding to an equal small int is the same object: no change
    assert guard.unchanged()


def test_globals_guard_over_partial_and_cycle(load: Callable[..., Any]) -> None:
    m = load(
        """
        N = 1
        def a(x):
            return b(x) + N
        def b(x):
            return a(x)
        """
    )
    guard = jitkey.GlobalsGuard(functools.partial(m.a, 1))
    m.N = 2
    assert guard.changed() == ["fkmod.N"]
    m.b = None
    assert guard.changed() == ["fkmod.N", "fkmod.b"]


def test_globals_guard_edge_cases(load: Callable[..., Any]) -> None:
    other = load("K = 1\ndef helper2():\n    return K\n", name="fkother")
    m = load(
        """
        import fkother
        from fkother import helper2
        _jk0 = 5          # named like the checker's parameters: must not be shadowed by them
        _jk = 6
        GONE = 1
        def kernel():
            return _jk0 + _jk + GONE + helper2() + undefined_yet
        def make():
            def inner():
                return x
            x = 1
            return inner
        """
    )
    guard = jitkey.GlobalsGuard(m.kernel)
    assert guard.unchanged()
    m._jk0 = 7
    assert guard.changed() == ["fkmod._jk0"] and not guard.unchanged()
    guard.refresh()
    other.K = 2  # read by a helper in another module: a second namespace, chained
    assert guard.changed() == ["fkother.K"] and not guard.unchanged()
    guard.refresh()
    del m.GONE
    assert guard.changed() == ["fkmod.GONE"] and not guard.unchanged()
    guard.refresh()
    m.undefined_yet = 0
    assert guard.changed() == ["fkmod.undefined_yet"] and not guard.unchanged()
    guard.refresh()
    assert guard.unchanged()

    inner = m.make()
    cell_guard = jitkey.GlobalsGuard(inner)
    assert cell_guard.unchanged()
    assert inner.__closure__ is not None
    del inner.__closure__[0].cell_contents  # an emptied cell
    assert not cell_guard.unchanged()
    assert cell_guard.changed() == ["fkmod.make.<locals>.inner.<closure>.x"]
    cell_guard.refresh()
    assert cell_guard.unchanged()
    inner.__closure__[0].cell_contents = 3
    assert cell_guard.changed() == ["fkmod.make.<locals>.inner.<closure>.x"]

    nothing = jitkey.GlobalsGuard(functools.partial(len))  # nothing to watch
    assert len(nothing) == 0 and nothing.unchanged() and nothing.changed() == []
    nothing.check()
