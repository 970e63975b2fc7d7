"""A jitkey kernel copies and pickles as a ``JITFunction`` does (issue: torch.compile deep-copies and pickles
kernels), and ``install()`` leaves the kernels torch's Inductor generates to Triton.

Every check compares against a plain ``triton.jit`` kernel of the same function made the same way: the same
state, the same successes and the same failures; on top of that, a copy of a jitkey kernel starts with an empty
jitkey cache of its own and keys calls as the original does.
"""

from __future__ import annotations

import copy
import pickle
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

import jitkey.triton as jt  # noqa: E402
from jitkey.triton import _kernel  # noqa: E402
from test_triton_cpu import fake_runtime, fake_triton  # noqa: E402, F401 - fixtures


def body(x_ptr, n, m, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(x_ptr + pid, n + m)


def hook(*args, **kwargs):
    pass


def _variants():
    """name → (make plain, make jitkey): the same function with the same options each time."""

    def with_hook(dec):
        k = dec(body)
        k.add_pre_run_hook(hook)
        return k

    return {
        "plain": (lambda: triton.jit(body), lambda: jt.jit(body)),
        "dns": (
            lambda: triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=[0])(body),
            lambda: jt.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=[0])(body),
        ),
        "debug_noinline": (
            lambda: triton.jit(debug=True, noinline=True)(body),
            lambda: jt.jit(debug=True, noinline=True)(body),
        ),
        "pre_run_hook": (lambda: with_hook(triton.jit), lambda: with_hook(jt.jit)),
    }


VARIANTS = _variants()
ARGS = (torch.empty(64), 16, 3, 32)


def _outcome(f):
    try:
        return ("ok", f())
    except Exception as exc:
        return ("raises", type(exc), str(exc))


def _strip(k):
    """What Inductor's ``CachingAutotuner.prepare_for_pickle`` does to its kernel before copying it."""
    k.fn = None
    k.__globals__ = None
    k.used_global_vals = None
    k._hash_lock = None


def _restore(k):
    """What ``restore_after_unpickle`` puts back."""
    k.fn, k.__globals__, k.used_global_vals, k._hash_lock = body, body.__globals__, {}, threading.RLock()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_state_is_a_jitfunctions_state(name):
    make_plain, make_jk = VARIANTS[name]
    p, k = make_plain(), make_jk()
    k.key_of(ARGS, device=0)  # jitkey's part is made (signature, key launcher, cache): still not state
    assert set(k.__getstate__()) == set(p.__dict__)
    assert not any(n.startswith("_jk_") for n in k.__getstate__())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_deepcopy_fails_where_a_jitfunction_fails(name):
    make_plain, make_jk = VARIANTS[name]
    p, k = make_plain(), make_jk()
    got_p, got_k = _outcome(lambda: copy.deepcopy(p)), _outcome(lambda: copy.deepcopy(k))
    assert got_p[0] == got_k[0] == "raises"  # Triton's _hash_lock (an RLock) cannot be copied
    assert got_k[1:] == got_p[1:]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_pickle_fails_where_a_jitfunction_fails(name):
    make_plain, make_jk = VARIANTS[name]
    p, k = make_plain(), make_jk()
    got_p, got_k = _outcome(lambda: pickle.dumps(p)), _outcome(lambda: pickle.dumps(k))
    assert got_p[0] == got_k[0] == "raises"
    assert got_k[1] is got_p[1]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_stripped_kernel_round_trips_with_a_fresh_cache(name, protocol):
    make_plain, make_jk = VARIANTS[name]
    p, k = make_plain(), make_jk()
    key = k.key_of(ARGS, device=0)
    _strip(p)
    _strip(k)
    for what, f in (
        ("deepcopy", copy.deepcopy),
        ("pickle", lambda o: pickle.loads(pickle.dumps(o, protocol))),
    ):
        cp, ck = f(p), f(k)
        assert type(cp) is triton.runtime.JITFunction, what
        assert type(ck) is type(k), what
        assert set(ck.__getstate__()) == set(cp.__dict__), what
        assert ck.fn is None and ck._hash_lock is None
        assert ck.pre_run_hooks == cp.pre_run_hooks
        assert not any(n.startswith("_jk_") for n in vars(ck))  # a fresh jitkey part, made at first use
        assert ck._jk_cache is None and not ck._jk_ready
        _restore(ck)
        assert ck.fast_path_problem is None
        assert ck.key_of(ARGS, device=0) == key
        assert ck.cache_stats()["hits"] == 0 and ck._jk_cache is not k._jk_cache


def test_copy_of_a_launched_kernel_starts_empty_and_launches(fake_runtime, fake_triton):  # noqa: F811
    k = jt.jit(body)
    fake_triton(k)
    x = torch.empty(64)
    ck0 = k[(1,)](x, 16, 3, 32)
    k[(1,)](x, 16, 3, 32)
    assert k.cache_stats()["hits"] == 1
    _strip(k)
    c = copy.deepcopy(k)
    _restore(c)
    state = fake_triton(c)
    calls = len(state["calls"])
    assert c.cache_stats()["hits"] == 0 and c.cache_stats()["entries"] == 0
    ck1 = c[(1,)](x, 16, 3, 32)  # a miss: Triton's path
    c[(1,)](x, 16, 3, 32)
    assert len(state["calls"]) == calls + 1 and c.cache_stats()["hits"] == 1
    assert ck1.launches and ck0.launches[0][3:] == ck1.launches[0][3:]
    assert k.cache_stats()["hits"] == 1  # the original's numbers are its own


def test_shallow_copy_shares_tritons_state():
    p, k = triton.jit(body), jt.jit(body)
    cp, ck = copy.copy(p), copy.copy(k)
    for orig, cpy in ((p, cp), (k, ck)):
        assert cpy.device_caches is orig.device_caches and cpy.fn is orig.fn
    assert not any(n.startswith("_jk_") for n in vars(ck))  # made at first use, not shared
    assert ck.fast_path_problem == k.fast_path_problem
    assert ck._jk_lock is not k._jk_lock and ck._jk_stats is not k._jk_stats


@pytest.mark.parametrize("wrap", ["autotune", "heuristics"])
def test_autotune_and_heuristics_wrappers_copy_like_triton(wrap):
    def wrapper(k):
        if wrap == "autotune":
            return triton.autotune(
                configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"]
            )(k)
        return triton.heuristics({"BLOCK": lambda a: 16})(k)

    p, k = wrapper(triton.jit(body)), wrapper(jt.jit(body))
    for f in (copy.deepcopy, pickle.dumps):
        got_p, got_k = _outcome(lambda f=f: f(p)), _outcome(lambda f=f: f(k))
        assert got_p[0] == got_k[0]
        if got_p[0] == "raises":
            assert got_k[1] is got_p[1]
    _strip(p.fn)
    _strip(k.fn)
    cp, ck = copy.deepcopy(p), copy.deepcopy(k)
    assert type(cp) is type(p) and type(ck) is type(k)
    assert type(ck.fn) is jt.TritonKernel and ck.fn is not k.fn


def test_inductor_caching_autotuner_prepare_copy_pickle_restore():
    """The sequence of ``TritonBundler.put_static_autotuner``: ``prepare_for_pickle``, ``copy.deepcopy``, pickle
    (FX graph cache), ``restore_after_unpickle``, on a ``CachingAutotuner`` that holds a jitkey kernel."""
    th = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    from torch._inductor.runtime.hints import DeviceProperties, HeuristicType

    k = jt.jit(body)
    key = k.key_of(ARGS, device=0)
    at = th.CachingAutotuner(
        k,
        triton_meta={
            "signature": {"x_ptr": "*fp32", "n": "i32", "m": "i32"},
            "device": DeviceProperties.create(torch.device("cpu")),
            "constants": {},
        },
        configs=[th.Config({"BLOCK": 16}, num_warps=4)],
        save_cache_hook=None,
        mutated_arg_names=[],
        optimize_mem=False,
        heuristic_type=HeuristicType.POINTWISE,
        inductor_meta={"kernel_name": "body"},
    )
    old = at.prepare_for_pickle()
    new = copy.deepcopy(at)
    back = pickle.loads(pickle.dumps(new))
    at.restore_after_unpickle(old)
    assert at.fn is k and k.fn is body and k.key_of(ARGS, device=0) == key
    for other in (new, back):
        assert type(other.fn) is jt.TritonKernel and other.fn is not k and other.fn.fn is None
        other.restore_after_unpickle(None)  # what Inductor does with a cached autotuner it loads
        _restore(other.fn)
        assert other.fn.key_of(ARGS, device=0) == key


# --- install(): Inductor's kernels stay Triton's ----------------------------------------------------------

_INDUCTOR_HEADER = """
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
"""

_HELION_HEADER = """
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import math as tl_math
"""

_KERNEL = """
@triton.jit
def {name}(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xindex < xnumel), xindex < xnumel)
"""


@pytest.fixture
def routed():
    was = jt.installed()
    jt.install()
    yield
    if not was:
        jt.uninstall()


def _load(header, name):
    """Code loaded the way Inductor (and Helion) load generated kernel modules: ``PyCodeCache.load``."""
    from torch._inductor.codecache import PyCodeCache

    mod = PyCodeCache.load(textwrap.dedent(header) + textwrap.dedent(_KERNEL.format(name=name)))
    assert mod.__name__.startswith("torch._inductor.runtime.compile_tasks.")
    return getattr(mod, name)


def test_install_keeps_inductor_generated_kernels_tritons(routed):
    before = jt.report()["kept"].get("generated by torch Inductor", 0)
    k = _load(_INDUCTOR_HEADER, "triton_poi_fused_add_0")
    assert type(k) is triton.runtime.JITFunction
    assert jt.report()["kept"]["generated by torch Inductor"] == before + 1


def test_install_routes_other_generated_kernels(routed):
    """Helion loads its generated kernels the same way; they do not import triton_heuristics and are routed."""
    k = _load(_HELION_HEADER, "_helion_add")
    assert type(k) is jt.TritonKernel


def test_kept_by_names_each_reason():
    assert _kernel._kept_by(triton.language.standard.sum) == "Triton's own kernel"
    from torch._inductor.runtime import triton_helpers

    helper = next(
        getattr(triton_helpers, n)
        for n in dir(triton_helpers)
        if isinstance(getattr(triton_helpers, n), triton.runtime.JITFunction)
    )
    assert _kernel._kept_by(helper.fn) == "torch Inductor's own kernel"
    assert _kernel._kept_by(body) is None
