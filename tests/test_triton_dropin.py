"""CPU tests of jitkey.triton as a drop-in for triton.jit: a jitkey kernel is a JITFunction for everything but
the warm launch (inspection, helpers and Triton's dependency walk, decoration), the key covers what real
kernels pass (checked against Triton's own binder), install()/uninstall() and the pytest plugin."""

from __future__ import annotations

import collections
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

import jitkey  # noqa: E402
import jitkey.triton as jt  # noqa: E402
from jitkey.errors import JitKeyError  # noqa: E402

MODE = tl.constexpr(1)


@jt.jit
def helper(x):
    return x + 1


@triton.jit
def plain_caller(out, n):
    tl.store(out, helper(n))


@jt.jit
def jk_caller(out, n):
    tl.store(out, helper(n))


@jt.jit(noinline=True)
def helper_noinline(x):
    return x * 2


@jt.jit
def jk_caller_noinline(out, n, FLAG: tl.constexpr):
    if FLAG:
        tl.store(out, helper_noinline(n))
    else:
        tl.store(out, (helper, helper_noinline)[0](n))


@jt.jit
def defaults(
    a,
    reduction: tl.constexpr = MODE,
    out_dtype: tl.constexpr = tl.float32,
    name: tl.constexpr = "sum",
    nothing: tl.constexpr = None,
    act: tl.constexpr = helper,
    scale=1.0,
):
    pass


@jt.jit
def k_obj(a, b, c, D: tl.constexpr, E: tl.constexpr):
    pass


_BACKEND = make_backend(GPUTarget("cuda", 90, 32))
NT = collections.namedtuple("NT", ["p", "q"])
NT2 = collections.namedtuple("NT2", ["p", "q"])


# --- a jitkey kernel is a JITFunction -----------------------------------------------------------------------


def test_is_a_jitfunction_with_tritons_meaning():
    assert isinstance(jk_caller, JITFunction) and isinstance(jk_caller, jt.TritonKernel)
    plain = triton.jit(jk_caller.fn)
    for attr in ("arg_names", "constexprs", "src", "starting_line_number", "__name__", "__qualname__"):
        assert getattr(jk_caller, attr) == getattr(plain, attr), attr
    assert inspect.isfunction(jk_caller.fn) and inspect.getsource(jk_caller.fn).lstrip().startswith("@jt.jit")
    assert jk_caller.cache_key == plain.cache_key
    assert [p.name for p in jk_caller.params] == ["out", "n"]
    assert helper_noinline.noinline is True and repr(jk_caller) == f"JITFunction({__name__}:jk_caller)"
    assert jk_caller.device_caches is not None and jk_caller.pre_run_hooks == []
    assert hash(jk_caller) == hash(plain) == hash(plain.cache_key)  # JITCallable's hash: the cache key


@pytest.mark.parametrize("caller", [plain_caller, jk_caller, jk_caller_noinline])
def test_helpers_take_part_in_the_callers_cache_key(caller):
    """Triton's dependency walk treats a jitkey helper like its own: editing it changes the caller's key."""
    base = caller.cache_key
    target = helper if caller is not jk_caller_noinline else helper_noinline
    orig = target.src
    try:
        target._unsafe_update_src(orig.replace("x + 1", "x + 2").replace("x * 2", "x * 3"))
        caller.hash = None
        assert caller.cache_key != base
    finally:
        target._unsafe_update_src(orig)
        caller.hash = None
    assert caller.cache_key == base
    assert "helper" not in {name for name, _ in caller.used_global_vals}  # a function, not a value


def test_bind_copies_the_kernels_options_source_and_hooks():
    @triton.jit
    def k(a):
        pass

    hook = lambda *a, **kw: None  # noqa: E731
    k.add_pre_run_hook(hook)
    bound = jt.bind(k)
    assert bound is not k and bound.fn is k.fn and bound.device_caches is not k.device_caches
    assert bound.pre_run_hooks == [hook] and bound.pre_run_hooks is not k.pre_run_hooks
    assert bound.cache_key == k.cache_key and jt.bind(bound) is bound
    k2 = triton.jit(do_not_specialize=["a"], noinline=True)(k.fn)
    k2._unsafe_update_src(k2.src.replace("pass", "return"))
    b2 = jt.bind(k2)
    assert b2.params[0].do_not_specialize and b2.noinline and b2.src == k2.src


def test_copy_like_a_jitfunction():
    import copy

    c = copy.copy(jk_caller)
    assert type(c) is jt.TritonKernel and c.fn is jk_caller.fn and c.device_caches is jk_caller.device_caches
    assert c.fast_path_problem is None and c.key_of((torch.empty(4), 3), {}, device=0)
    assert c.cache_stats()["hits"] == 0 and c._jk_cache is not jk_caller._jk_cache


# --- decoration accepts what Triton accepts ---------------------------------------------------------------


def test_constexpr_defaults_of_every_kind():
    assert defaults.fast_path_problem is None
    x = torch.empty(4)
    k0 = defaults.key_of((x,), {}, device=0)
    assert k0 == defaults.key_of((x, MODE, tl.float32, "sum", None, helper, 1.0), {}, device=0)
    for change in ({"reduction": tl.constexpr(2)}, {"out_dtype": tl.float16}, {"act": helper_noinline}):
        assert defaults.key_of((x,), change, device=0) != k0


def test_unkeyable_default_falls_back_at_call_not_decoration():
    def act(v):  # a plain Python function: Triton keys it by repr; jitkey cannot key it
        return v

    def fn(a, F: tl.constexpr = act, G: tl.constexpr = 2):
        pass

    k = jt.jit(fn)
    assert k.fast_path_problem is None
    x = torch.empty(4)
    with pytest.raises(JitKeyError):
        k.key_of((x,), {}, device=0)  # the default would be used: not keyable, Triton's path
    assert k.key_of((x, 4), {}, device=0) != k.key_of((x, 4, 3), {}, device=0)


# --- the key covers what real kernels pass, at least as finely as Triton ----------------------------------


def _triton_key(fn, args, kwargs):
    binder = create_function_from_signature(fn.signature, fn.params, _BACKEND)
    _, spec, options = binder(*args, **kwargs)
    return compute_cache_key({}, spec, options)


def _objects():
    x = torch.empty(64, 64)
    y = torch.empty(64, 64, dtype=torch.float16)
    return [
        TensorDescriptor.from_tensor(x, [16, 16]),
        TensorDescriptor.from_tensor(x, [16, 32]),
        TensorDescriptor.from_tensor(y, [16, 16]),
        TensorDescriptor.from_tensor(x, [16, 16], padding="nan"),
        triton.reinterpret(x, tl.float8e5),
        triton.reinterpret(x.view(-1)[1:], tl.float8e5),
        triton.reinterpret(y, tl.float8e4nv),
        NT(x, 3),
        NT(x, 16),
        NT(x.view(-1)[1:], 3),
        NT2(x, 3),
        (x, (1, 2)),
        (x, (1, 16)),
        ((x, 3), (y, 16)),
        x,
        7,
    ]


def _constexprs():
    return [
        1,
        True,
        tl.constexpr(1),
        tl.constexpr(2),
        tl.float32,
        tl.float16,
        tl.bfloat16,
        helper,
        helper_noinline,
    ]


def test_key_finer_than_triton_on_objects():
    objs, cs = _objects(), _constexprs()
    seen: dict[bytes, str] = {}
    n = 0
    for a in objs:
        for b in objs[::3]:
            for d in cs:
                for e in cs[::4]:
                    args = (a, b, 5, d, e)
                    tk = _triton_key(k_obj, args, {})
                    jk = k_obj.key_of(args, {}, device=0)  # every one of these must be keyable natively
                    assert seen.setdefault(jk, tk) == tk, (args, seen[jk], tk)
                    n += 1
    assert n > 500 and len(seen) > 100


def test_objects_split_where_triton_does():
    x = torch.empty(64, 64)
    key = lambda *a: k_obj.key_of((*a, 5, 1, 1), {}, device=0)  # noqa: E731
    assert key(triton.reinterpret(x, tl.float8e5), x) != key(triton.reinterpret(x, tl.float8e4nv), x)
    td = TensorDescriptor.from_tensor
    assert key(td(x, [16, 16]), x) == key(td(torch.empty(128, 64), [16, 16]), x)  # shapes are runtime args
    assert key(td(x, [16, 16]), x) != key(td(x, [16, 32]), x)
    assert key(NT(x, 3), x) != key(NT(x, 16), x) != key((x, 16), x)
    with pytest.raises(JitKeyError):
        key(object(), x)


# --- install() and the pytest plugin ---------------------------------------------------------------------


def test_install_routes_user_kernels_only(tmp_path, monkeypatch):
    mod = tmp_path / "user_kernels.py"
    mod.write_text(
        textwrap.dedent(
            """
            import triton, triton.language as tl
            from triton.runtime.jit import jit as rjit

            @triton.jit
            def a(x, B: tl.constexpr):
                pass

            @rjit(do_not_specialize=["x"])
            def b(x):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    jt.install()
    try:
        assert jt.installed()
        import user_kernels

        assert isinstance(user_kernels.a, jt.TritonKernel) and isinstance(user_kernels.b, jt.TritonKernel)
        assert user_kernels.b.params[0].do_not_specialize

        def own(x):
            pass

        own.__module__ = "triton.language.extra.something"
        assert type(triton.jit(own)) is JITFunction  # Triton's own library kernels stay Triton's
    finally:
        jt.uninstall()
        sys.modules.pop("user_kernels", None)
    assert not jt.installed()

    @triton.jit
    def after(x):
        pass

    assert type(after) is JITFunction


def test_plain_switch_returns_triton_kernels(monkeypatch):
    monkeypatch.setenv("JITKEY_TRITON", "plain")

    def fn(x):
        pass

    assert type(jt.jit(fn)) is JITFunction
    assert jt.fast_paths()["binding"] == {"on": False, "why": "JITKEY_TRITON=plain"}


def test_pytest_plugin_installs_and_reports(tmp_path):
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import triton, triton.language as tl
            import jitkey.triton as jt

            @triton.jit
            def k(x, n):
                pass

            def test_kernel_is_routed():
                assert isinstance(k, jt.TritonKernel)
            """
        )
    )
    report = tmp_path / "report.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "jitkey.pytest_plugin",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--jitkey-report-json={report}",
            str(tmp_path / "test_user.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "jitkey fast-path report" in out.stdout and "kernels 1" in out.stdout
    assert "misses served by the L2" in out.stdout
    import json

    rep = json.loads(report.read_text())
    assert rep["kernels"] == 1 and rep["launches"] == 0 and rep["warm_fast_path"] is None


def test_report_merges_processes():
    merge = jt.merge_reports

    a = {
        "kernels": 1,
        "launches": 10,
        "hits": 8,
        "misses": 1,
        "fallbacks": 1,
        "fallback_reasons": {"pre_run_hooks": 1},
        "driver_launches": 7,
        "launcher_reasons": {"the stream is not an int": 1},
        "unplanned_variants": {},
        "l2_hits": 1,
        "l2_misses": 0,
        "l2_recorded": 0,
        "l2_skipped": {"a jit_cache_hook or jit_post_compile_hook is set": 2},
        "busiest": [{"kernel": "m:k", "launches": 10, "hits": 8, "misses": 1, "fallbacks": 1}],
    }
    b = {
        "kernels": 2,
        "launches": 5,
        "hits": 4,
        "misses": 1,
        "fallbacks": 0,
        "fallback_reasons": {},
        "driver_launches": 4,
        "launcher_reasons": {},
        "unplanned_variants": {"no launch plan": 1},
        "l2_hits": 0,
        "l2_misses": 1,
        "l2_recorded": 1,
        "l2_skipped": {},
        "kept": {"torch Inductor's own kernel": 3},
        "l2_walks": {"replayed": 6, "walked": 2},
        "busiest": [{"kernel": "m:k", "launches": 5, "hits": 4, "misses": 1, "fallbacks": 0}],
    }
    m = merge([a, b], top=5)
    assert (m["kernels"], m["launches"], m["hits"], m["fallbacks"]) == (3, 15, 12, 1)
    assert m["warm_fast_path"] == 12 / 13 and m["busiest"][0]["launches"] == 15
    assert m["driver_launches"] == 11 and m["launcher_reasons"] == {"the stream is not an int": 1}
    assert m["unplanned_variants"] == {"no launch plan": 1}
    assert (m["l2_hits"], m["l2_misses"], m["l2_recorded"]) == (1, 1, 1)
    assert m["l2_skipped"] == {"a jit_cache_hook or jit_post_compile_hook is set": 2}
    assert m["kept"] == {"torch Inductor's own kernel": 3}  # a process's report has it, a kernel's does not
    assert m["l2_walks"] == {"replayed": 6, "walked": 2}  # (so has this)
    assert merge([a, b, b], top=5)["l2_walks"] == {"replayed": 12, "walked": 4}
    assert jitkey.triton.report()["kernels"] >= 1


def test_torch_size_binds_like_a_tuple():
    x = torch.empty(64, 64)
    args = (x, x.shape, 5, 1, 1)
    k = k_obj.key_of(args, {}, device=0)
    assert k == k_obj.key_of((x, torch.Size([64, 64]), 5, 1, 1), {}, device=0)
    assert k != k_obj.key_of((x, torch.Size([64, 17]), 5, 1, 1), {}, device=0)
    assert k != k_obj.key_of((x, (64, 64), 5, 1, 1), {}, device=0)
    _triton_key(k_obj, args, {})  # Triton binds it too


def test_decoration_imports_only_what_decoration_uses(tmp_path):
    """``import jitkey.triton`` and decorating a kernel load neither the device/stream shim nor the state watch (the
    first launch does); ``jitkey.triton.fast_paths()`` (what ``jitkey info`` shows) loads them when asked."""
    (tmp_path / "cold_kernel.py").write_text(
        "import triton\nimport triton.language as tl\nimport jitkey.triton\n\n\n"
        "@jitkey.triton.jit\ndef k(x, BLOCK: tl.constexpr):\n    pass\n"
    )
    code = textwrap.dedent(
        """
        import sys
        import torch, triton
        import cold_kernel
        assert type(cold_kernel.k).__name__ == "TritonKernel"
        lazy = ("jitkey._torch_current", "jitkey._proven", "jitkey.triton._watch")
        assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]
        import jitkey.triton
        jitkey.triton.fast_paths()
        assert "jitkey.triton._watch" in sys.modules and "jitkey._torch_current" in sys.modules
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_tensor_descriptors_keyable_once_imported_but_not_imported_by_jitkey():
    """``import jitkey.triton`` does not import ``triton.tools.tensor_descriptor`` (a decoration-only process does
    not pay for it); a program that imports it later can key descriptors at once, as Triton specializes them,
    and the module keeps its own loader."""
    code = textwrap.dedent(
        """
        import importlib.machinery, sys
        import torch
        import jitkey, jitkey.triton
        assert "triton.tools.tensor_descriptor" not in sys.modules
        import triton.tools.tensor_descriptor as m
        from triton.tools.tensor_descriptor import TensorDescriptor
        x = torch.empty(64, 64)
        a, b = TensorDescriptor.from_tensor(x, [16, 16]), TensorDescriptor.from_tensor(x, [16, 32])
        assert jitkey.encode(a) == jitkey.encode(TensorDescriptor.from_tensor(x, [16, 16]))
        assert jitkey.encode(a) != jitkey.encode(b)
        assert isinstance(m.__loader__, importlib.machinery.SourceFileLoader), m.__loader__
        assert m.__spec__.loader is m.__loader__
        assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
