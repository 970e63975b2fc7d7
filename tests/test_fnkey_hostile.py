"""function_key / GlobalsGuard / env_key / encode under hostile or unusual input (issue 13, classes 6
and 9): a module edited while the process runs, call chains longer than the recursion limit, global
names that are not identifiers, non-UTF-8 environment values, and BaseExceptions raised inside
`__jitkey__`, which must pass through unchanged."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import jitkey
from jitkey import GlobalsGuard, env_key, function_key
from jitkey.errors import UnsupportedKeyError

# ----- class 6: the key is the key of the code that runs -----


def _import_fresh(tmp_path: Path, name: str, src: str) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def _fresh_process_key(tmp_path: Path, name: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import jitkey, {name}; "
    code += f"print(jitkey.function_key({name}.f).hex())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_module_edited_after_import_is_keyed_by_the_running_code(tmp_path: Path) -> None:
    old = "def helper(x):\n    return x + 1\n\n\ndef f(x):\n    return helper(x) * 3\n"
    new = "def helper(x):\n    return x - 1\n\n\ndef f(x):\n    return helper(x) * 5\n"
    mod = _import_fresh(tmp_path, "jk_edited_mod", old)
    path = tmp_path / "jk_edited_mod.py"
    path.write_text(new)  # same length: only the content (and mtime) differ
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    running = function_key(mod.f)  # first key in this process, after the edit
    assert mod.f(1) == 6  # the old code runs
    assert running != bytes.fromhex(_fresh_process_key(tmp_path, "jk_edited_mod"))
    # Unedited files keep source keys that agree across processes.
    _import_fresh(tmp_path, "jk_plain_mod", old)
    plain = importlib.import_module("jk_plain_mod")
    assert function_key(plain.f).hex() == _fresh_process_key(tmp_path, "jk_plain_mod")


# ----- class 9: walks without a recursion limit -----


def test_long_call_chains_key_and_guard(tmp_path: Path) -> None:
    n = sys.getrecursionlimit() + 200
    lines = [f"def f{i}(x):\n    return f{i + 1}(x) + {i}\n" for i in range(n)]
    lines.append(f"def f{n}(x):\n    return x\n")
    mod = _import_fresh(tmp_path, "jk_chain_mod", "\n".join(lines))
    k1 = function_key(mod.f0)
    guard = GlobalsGuard(mod.f0)
    assert guard.unchanged() and len(guard) > n
    setattr(mod, f"f{n}", lambda x: x + 1)
    assert not guard.unchanged()
    assert function_key(mod.f0) != k1


# ----- class 9: GlobalsGuard with global names that are not identifiers -----


def _function_reading(names: list[str], ns: dict[str, object]) -> types.FunctionType:
    """A function built from an AST that loads each of `names` as a global (any string can be)."""
    body = ast.Return(ast.Tuple([ast.Name(id=n, ctx=ast.Load()) for n in names], ctx=ast.Load()))
    fn = ast.FunctionDef(
        name="g",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[body],
        decorator_list=[],
        type_params=[],
    )
    tree = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(tree, "<ast>", "exec"), ns)
    out = ns["g"]
    assert isinstance(out, types.FunctionType)
    return out


@pytest.mark.parametrize("weird", ["a-b", "1st", "class", "x y", "é-name", "_jk0 or True"])
def test_guard_with_non_identifier_global_names(weird: str) -> None:
    ns: dict[str, object] = {weird: 1, "plain": 2}
    fn = _function_reading([weird, "plain"], ns)
    guard = GlobalsGuard(fn)
    assert guard.unchanged() is True
    guard.check()
    ns[weird] = 3
    assert guard.unchanged() is False and any(weird in n for n in guard.changed())
    guard.refresh()
    assert guard.unchanged() is True
    del ns[weird]
    assert guard.unchanged() is False
    function_key(fn)  # keyed (bytecode: no source) without error


# ----- class 9: env_key with a value that is not UTF-8 -----


def test_env_key_with_non_utf8_values() -> None:
    old = dict(os.environb)
    try:
        os.environb[b"JITKEY_T13_RAW"] = b"\xff\xfeabc"
        os.environb[b"JITKEY_T13_\xff"] = b"1"
        k = env_key(
            ["JITKEY_T13_RAW"], prefixes=["JITKEY_T13_"], versions=False, device=False, compiler=False
        )
        jitkey.digest(k)
        os.environb[b"JITKEY_T13_RAW"] = b"\xfe\xffabc"
        k2 = env_key(
            ["JITKEY_T13_RAW"], prefixes=["JITKEY_T13_"], versions=False, device=False, compiler=False
        )
        assert jitkey.digest(k2) != jitkey.digest(k)
        os.environ["JITKEY_T13_RAW"] = "plain"
        k3 = env_key(["JITKEY_T13_RAW"], versions=False, device=False, compiler=False)
        assert k3 == (("env", (("JITKEY_T13_RAW", "plain"),)),)
    finally:
        for key in list(os.environb):
            if key not in old:
                del os.environb[key]
        os.environb.update(old)


# ----- class 9: BaseException inside __jitkey__ passes through unchanged -----


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_inside_jitkey_pass_through(exc: type[BaseException], tmp_path: Path) -> None:
    class Boom:
        def __jitkey__(self) -> object:
            raise exc("from __jitkey__")

    for call in (
        lambda: jitkey.encode(Boom()),
        lambda: jitkey.digest(("x", Boom())),
        lambda: jitkey.fast_hash(Boom()),
        lambda: jitkey.DiskIndex(tmp_path / "ix").get(Boom()),
        lambda: jitkey.LruCache(4).get(Boom()),
    ):
        with pytest.raises(exc, match="from __jitkey__"):
            call()

    CONST = Boom()

    def uses() -> object:
        return CONST

    with pytest.raises(exc, match="from __jitkey__"):
        function_key(uses)


def test_ordinary_exceptions_inside_jitkey_are_typed() -> None:
    class Bad:
        def __jitkey__(self) -> object:
            raise ValueError("nope")

    with pytest.raises(UnsupportedKeyError) as info:
        jitkey.encode(Bad())
    assert isinstance(info.value.__cause__, ValueError)


def test_keyboard_interrupt_in_a_signature_argument_passes_through() -> None:
    torch = pytest.importorskip("torch")

    class T(torch.Tensor):
        @property
        def dtype(self) -> object:  # type: ignore[override]
            raise KeyboardInterrupt("from dtype")

    sig = jitkey.Signature([("x", jitkey.rules.tensor(align=None, device=False))])
    with pytest.raises(KeyboardInterrupt, match="from dtype"):
        sig.encode((torch.zeros(2).as_subclass(T),))


def test_source_fallback_is_still_process_stable(tmp_path: Path) -> None:
    """exec'd code (no source) keys by bytecode identically in two processes."""
    src = textwrap.dedent(
        """
        import jitkey
        ns = {}
        exec("def f(x):\\n    return x + 41\\n", ns)
        print(jitkey.function_key(ns["f"]).hex())
        """
    )
    keys = {
        subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120).stdout
        for _ in range(2)
    }
    assert len(keys) == 1 and len(keys.pop().strip()) == 64
