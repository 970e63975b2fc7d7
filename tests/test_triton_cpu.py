"""CPU tests of jitkey.triton: the key against Triton's own binder, the knob/device/option parts of the key,
the fallbacks, and the hit path against a recording stand-in for ``CompiledKernel`` (no GPU needed)."""

from __future__ import annotations

import inspect
import re

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

import jitkey  # noqa: E402
import jitkey.triton as jt  # noqa: E402
from jitkey.errors import GlobalsChangedError, JitKeyError  # noqa: E402
from jitkey.triton import _installed  # noqa: E402

SCALE = 2  # read by k_global
CSCALE = tl.constexpr(4)  # read by k_cglobal (Helion writes its block sizes so)


@triton.jit
def k_full(a, b, n, m, f, flag, BLOCK: tl.constexpr, OPT: tl.constexpr = 7):
    pass


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["b", 3])
def k_dns(a, b, n, m, BLOCK: tl.constexpr):
    pass


@triton.jit
def k_ann(a, n: tl.int32, f: tl.float32, g: tl.int64, BLOCK: tl.constexpr):
    pass


@triton.jit
def k_launch_names(x, grid, warmup, BLOCK: tl.constexpr):
    pass


@triton.jit
def k_global(a, n, BLOCK: tl.constexpr):
    tl.store(a + n, SCALE)


@triton.jit
def k_cglobal(a, n, BLOCK: tl.constexpr):
    tl.store(a + n, CSCALE)


KERNELS = {"full": k_full, "dns": k_dns, "ann": k_ann}

# One CUDA backend object, built from a GPUTarget without a driver: Triton's binder uses it only to call
# native_specialize_impl (alignment / int rules).
_BACKEND = make_backend(GPUTarget("cuda", 90, 32))
_BINDERS = {n: create_function_from_signature(fn.signature, fn.params, _BACKEND) for n, fn in KERNELS.items()}

_BASES = {dt: torch.empty(256, dtype=dt) for dt in (torch.float16, torch.float32, torch.int8, torch.int64)}
_INTS = [
    0,
    1,
    2,
    15,
    16,
    17,
    32,
    -1,
    -16,
    2**31 - 1,
    2**31,
    2**31 + 16,
    -(2**31),
    -(2**31) - 1,
    2**63 - 16,
    2**63,
    2**63 + 16,
    2**64 - 1,
    2**64 - 16,
]


def _tensor():
    return st.builds(lambda dt, off: _BASES[dt][off:], st.sampled_from(list(_BASES)), st.integers(0, 17))


def _scalar():
    return st.one_of(
        st.sampled_from(_INTS),
        st.integers(-(2**40), 2**40),
        st.booleans(),
        st.floats(allow_nan=True),
        st.none(),
    )


def _arg():
    return st.one_of(_tensor(), _scalar(), st.tuples(_scalar(), _tensor()))


def _constexpr():
    return st.one_of(
        st.sampled_from(
            [
                1,
                True,
                1.0,
                16,
                0,
                -0.0,
                0.0,
                "x",
                None,
                torch.float16,
                tl.float16,
                tl.constexpr(4),
                (1, 2),
                (True, 2),
            ]
        ),
        st.integers(-5, 5),
    )


def _call(name, draw_args):
    fn = KERNELS[name]
    return tuple(draw_args(p) for p in fn.params)


def _triton_key(name, args, kwargs):
    _, spec, options = _BINDERS[name](*args, **kwargs)
    return compute_cache_key({}, spec, options)


def _jitkey_key(kernel, args, kwargs, device=0, persistent=False):
    key = kernel.key_of(args, kwargs, device=device)
    if persistent:  # the call's key as the disk index (the L2) stores it: every leaf stable across processes
        return kernel._jk_key_launcher.key(tuple(args), dict(kwargs), device, persistent=True)
    return key


def assert_finer(kernel, name, calls, persistent=False):
    """Equal jitkey keys must mean equal Triton keys (jitkey is never coarser than Triton), in memory and, with
    ``persistent``, on disk."""
    seen: dict[bytes, tuple[str, tuple]] = {}
    for args, kwargs in calls:
        tk = _triton_key(name, args, kwargs)
        try:
            jk = _jitkey_key(kernel, args, kwargs, persistent=persistent)
        except (jt.Unkeyable, JitKeyError):
            continue  # jitkey refuses: the call goes through Triton's own path (a counted fallback)
        if jk in seen:
            assert seen[jk][0] == tk, f"jitkey key collides where Triton's differ: {seen[jk][0]} vs {tk}"
        else:
            seen[jk] = (tk, (args, kwargs))
    return seen


@st.composite
def _calls(draw, name):
    fn = KERNELS[name]
    out = []
    for _ in range(draw(st.integers(2, 12))):
        args = []
        for p in fn.params:
            if p.is_constexpr:
                if p.has_default and draw(st.booleans()):
                    break  # leave the defaulted constexpr out
                args.append(draw(_constexpr()))
            else:
                args.append(draw(_arg()))
        out.append((tuple(args), {}))
    return out


def _keyable(kernel, name, calls):
    """Drop calls Triton itself cannot bind (e.g. ints >= 2**64) after checking jitkey refuses them too."""
    ok = []
    for args, kwargs in calls:
        try:
            _triton_key(name, args, kwargs)
        except (TypeError, OverflowError):
            with pytest.raises((jt.Unkeyable, JitKeyError)):
                kernel.key_of(args, kwargs, device=0)
            continue
        ok.append((args, kwargs))
    return ok


@pytest.mark.parametrize("name", list(KERNELS))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: a failure prints its raw example
)
@given(data=st.data())
def test_key_finer_than_triton_binder(name, data):
    kernel = jt.bind(KERNELS[name])
    calls = _keyable(kernel, name, data.draw(_calls(name)))
    assert_finer(kernel, name, calls)
    assert_finer(kernel, name, calls, persistent=True)


@pytest.mark.parametrize("persistent", [False, True], ids=["in memory", "persistent"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_key_finer_exhaustive_pairs(name, persistent):
    """Every pair of a fixed grid of values in the first two non-constexpr slots (no sampling luck)."""
    kernel = jt.bind(KERNELS[name])
    values = [_BASES[torch.float32][o:] for o in (0, 1, 4)] + [_BASES[torch.float16][o:] for o in (0, 8)]
    values += [*_INTS, True, False, 1.0, None, (1, 16), (16, 1), (17, 1)]
    # tuple members are specialized fully by Triton, whatever the parameter's do_not_specialize flags
    values += [(_BASES[torch.float32][o:], 16) for o in (0, 1)] + [(2, 32), (2, 33)]
    fill = {"full": (0, 0, 1.0, True, 64), "dns": (0, 0, 64), "ann": (1.0, 3, 64)}[name]
    calls = []
    for a in values:
        for b in values:
            calls.append(((a, b, *fill), {}))
    calls = _keyable(kernel, name, calls)
    seen = assert_finer(kernel, name, calls, persistent=persistent)
    assert len(seen) > 20  # the grid gives many distinct keys


def test_checker_catches_a_coarse_keyer():
    """The differential check can fail: a key that forgets the alignment bit is caught."""
    kernel = jt.bind(k_full)

    class Coarse:
        def key_of(self, args, kwargs, device):
            # the real key of the call with the first parameter's alignment forgotten
            return kernel.key_of((_BASES[torch.float32], *args[1:]), kwargs, device=device)

    base = _BASES[torch.float32]
    calls = [((base, base, 0, 0, 1.0, True, 64), {}), ((base[1:], base, 0, 0, 1.0, True, 64), {})]
    assert_finer(kernel, "full", calls)
    with pytest.raises(AssertionError, match="collides"):
        assert_finer(Coarse(), "full", calls)


def test_int_buckets_match_triton():
    kernel = jt.bind(k_full)
    base = _BASES[torch.float32]
    for group in ([1], [16, 32, 0], [17, 15, 2], [2**31, 2**31 + 16], [True, False]):
        keys = {_jitkey_key(kernel, (base, base, v, 0, 1.0, True, 64), {}) for v in group}
        tkeys = {_triton_key("full", (base, base, v, 0, 1.0, True, 64), {}) for v in group}
        assert len(tkeys) == 1, group
        # ints are keyed exactly by Triton's buckets; a keyer may key bools by value (finer, one more miss)
        assert len(keys) == 1 or group == [True, False], group
    distinct = {_jitkey_key(kernel, (base, base, v, 0, 1.0, True, 64), {}) for v in (1, 16, 17, 2**31, True)}
    assert len(distinct) == 5


def test_misaligned_view_differs():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    assert x.data_ptr() % 16 == 0
    args = (x, x, 0, 0, 1.0, True, 64)
    assert _jitkey_key(kernel, args, {}) != _jitkey_key(kernel, (x[1:], *args[1:]), {})
    # but not for a parameter Triton does not specialize on alignment
    kd = jt.bind(k_dns)
    assert _jitkey_key(kd, (x, x, 0, 0, 64), {}) == _jitkey_key(kd, (x, x[1:], 0, 0, 64), {})
    assert _jitkey_key(kd, (x, x, 0, 0, 64), {}) != _jitkey_key(kd, (x[1:], x, 0, 0, 64), {})


def test_bool_int_float_constexpr_do_not_alias():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    values = (1, True, 1.0, "1", tl.constexpr(1), tl.constexpr(True), tl.float16, torch.float16)
    keys = {_jitkey_key(kernel, (x, x, 0, 0, 1.0, True, v), {}) for v in values}
    assert len(keys) == len(values)


def test_constexpr_default_is_in_the_key():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    base = (x, x, 0, 0, 1.0, True, 64)
    assert _jitkey_key(kernel, base, {}) == _jitkey_key(kernel, base, {"OPT": 7})
    assert _jitkey_key(kernel, base, {}) == _jitkey_key(kernel, (*base, 7), {})
    assert _jitkey_key(kernel, base, {}) != _jitkey_key(kernel, base, {"OPT": 8})


def test_kwargs_bind_like_positional():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    pos = _jitkey_key(kernel, (x, x, 16, 3, 1.0, False, 64), {})
    kw = _jitkey_key(kernel, (x,), {"b": x, "n": 16, "m": 3, "f": 1.0, "flag": False, "BLOCK": 64})
    assert pos == kw


def test_device_index_in_key():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    args = (x, x, 0, 0, 1.0, True, 64)
    assert _jitkey_key(kernel, args, {}, device=0) != _jitkey_key(kernel, args, {}, device=1)
    assert _jitkey_key(kernel, args, {}, device=1) == _jitkey_key(kernel, args, {}, device=1)


def test_launch_options_sorted_and_in_key():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    args = (x, x, 0, 0, 1.0, True, 64)
    a = _jitkey_key(kernel, args, {"num_warps": 4, "num_stages": 2})
    b = _jitkey_key(kernel, args, {"num_stages": 2, "num_warps": 4})
    c = _jitkey_key(kernel, args, {"num_stages": 3, "num_warps": 4})
    assert a == b != c
    assert a != _jitkey_key(kernel, args, {})


def test_launch_options_in_any_order_give_one_key():
    """The options are sorted by name (UTF-8 bytes) whatever their order and count (more than the 8 kept
    inline too), interleaved with parameters passed by keyword."""
    import itertools
    import random

    kernel = jt.bind(k_full)
    x = torch.empty(64)
    args = (x, x, 0, 0, 1.0, True)
    opts = {f"opt{i:02d}": i for i in range(11)} | {"é": 1, "z": 2, "Z": 3, "ñ_b": 4, "aa": 5}
    want = kernel.key_of(args, {"BLOCK": 64, **dict(sorted(opts.items()))}, device=0)
    rng = random.Random(0)
    for n in (1, 2, 3, 8, 9, len(opts)):
        names = list(opts)[:n]
        base = kernel.key_of(args, {"BLOCK": 64, **{k: opts[k] for k in sorted(names)}}, device=0)
        orders = list(itertools.permutations(names)) if n <= 3 else [rng.sample(names, n) for _ in range(20)]
        for order in orders:
            kw = {k: opts[k] for k in order}
            at = rng.randrange(len(kw) + 1)  # BLOCK (a parameter) somewhere among the options
            items = list(kw.items())
            kw = dict([*items[:at], ("BLOCK", 64), *items[at:]])
            assert kernel.key_of(args, kw, device=0) == base, order
    assert base == want
    changed = dict(opts, opt05=-5)
    assert kernel.key_of(args, {"BLOCK": 64, **changed}, device=0) != want


def test_launch_options_in_another_order_hit(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[(1,)](x, x, 16, 5, 1.0, True, 64, num_warps=4, num_stages=2, maxnreg=128)
    kernel[(1,)](x, x, 16, 5, 1.0, True, maxnreg=128, BLOCK=64, num_stages=2, num_warps=4)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64, num_stages=2, maxnreg=128, num_warps=4)
    assert len(state["calls"]) == 1 and len(ck.launches) == 2
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64, num_stages=3, maxnreg=128, num_warps=4)
    assert len(state["calls"]) == 2


def test_one_call_site_binds_its_keywords_per_call(fake_runtime, fake_triton):
    """A call site's keyword names are worked out once (its kwnames tuple): what depends on the call is still
    checked per call (a positional argument that now covers a keyword's parameter), sites beyond the few kept
    and fresh **kwargs tuples bind the same."""
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)

    def site(*args):  # one call site: one kwnames tuple ("OPT", "num_warps") whatever the positional count
        return kernel[(1,)](*args, OPT=7, num_warps=4)

    args = (x, x, 16, 5, 1.0, True, 64)
    ck = site(*args)
    site(*args)
    assert len(state["calls"]) == 1 and len(ck.launches) == 1
    calls = []
    kernel._jk_triton_run = lambda *a, **k: calls.append((a, k)) or "triton"
    assert site(*args, 7) == "triton"  # OPT passed twice: Triton's path raises it, as always
    reasons = kernel.cache_stats()["fallback_reasons"]
    assert list(reasons) == ["arguments do not bind: got multiple values for argument 'OPT'"]
    fake_triton(kernel)
    sites = [
        lambda: kernel[(1,)](x, x, m=5, f=1.0, flag=True, n=16, BLOCK=64, num_warps=4),
        lambda: kernel[(1,)](x, x, 16, 5, 1.0, True, BLOCK=64, num_warps=4),
        lambda: kernel[(1,)](x, x, 16, 5, 1.0, flag=True, num_warps=4, BLOCK=64),
        lambda: kernel[(1,)](x, x, 16, 5, f=1.0, flag=True, num_warps=4, BLOCK=64),
        lambda: kernel[(1,)](x, b=x, n=16, m=5, f=1.0, flag=True, num_warps=4, BLOCK=64),
        lambda: kernel[(1,)](x, x, 16, 5, 1.0, True, **{"num_warps": 4, "BLOCK": 64}),
    ]
    before = len(state["calls"])
    for _ in range(3):  # more sites than plans are kept, in turn: each binds as the first call did
        for s in sites:
            assert s() is ck
    assert len(state["calls"]) == before and len(ck.launches) == 1 + 3 * len(sites)


def test_a_kept_keyword_plan_still_checks_each_call(fake_runtime, fake_triton):
    """Call sites whose keyword names are one constant tuple bind through a kept plan after the second
    call: the same kernels as without one, and a positional argument covering a keyword's parameter is
    still refused per call (two calls of one function share a constant tuple ("OPT", "num_warps"))."""
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)

    def both(extra):
        ok = kernel[(1,)](x, x, 16, 5, 1.0, True, 64, OPT=7, num_warps=4)
        if extra:
            kernel[(1,)](x, x, 16, 5, 1.0, True, 64, 7, OPT=7, num_warps=4)
        return ok

    ck = both(False)
    for _ in range(3):
        assert both(False) is ck  # the plan is made at the second call, then used
    assert len(state["calls"]) == 1 and len(ck.launches) == 3
    plain = kernel[(1,)](x, x, 16, 5, 1.0, True, 64, **{"num_warps": 4, "OPT": 7})  # a fresh tuple: no plan
    assert plain is ck and len(state["calls"]) == 1
    kernel._jk_triton_run = lambda *a, **k: "triton"
    assert both(True) is ck  # its second call goes to Triton's path, which raises there
    reasons = kernel.cache_stats()["fallback_reasons"]
    assert list(reasons) == ["arguments do not bind: got multiple values for argument 'OPT'"]


def test_keyword_parameters_found_by_name_not_by_hash():
    """A keyword name matches a parameter only by its text (the hash compare only skips non-matches)."""

    class Same(str):  # a str subclass naming a parameter: matched by text, like an exact str
        pass

    kernel = jt.bind(k_full)
    x = torch.empty(64)
    pos = kernel.key_of((x, x, 16, 3, 1.0, False, 64), {}, device=0)
    assert kernel.key_of((x, x, 16, 3, 1.0, False), {Same("BLOCK"): 64}, device=0) == pos
    assert kernel.key_of((x, x, 16, 3, 1.0, False), {"BLOCK": 64}, device=0) == pos
    with pytest.raises(jitkey.errors.ArgumentError, match="missing a required argument: 'BLOCK'"):
        kernel.key_of((x, x, 16, 3, 1.0, False), {"BLOCKS": 64}, device=0)


def test_knob_changes_change_the_key():
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    args = (x, x, 0, 0, 1.0, True, 64)
    k0 = _jitkey_key(kernel, args, {})
    old = knobs.runtime.debug
    try:
        knobs.runtime.debug = not old
        assert _jitkey_key(kernel, args, {}) != k0
    finally:
        knobs.runtime.debug = old
    old_mode = knobs.compilation.instrumentation_mode
    try:
        knobs.compilation.instrumentation_mode = "consan"
        assert _jitkey_key(kernel, args, {}) != k0
    finally:
        knobs.compilation.instrumentation_mode = old_mode
    old_dbg = kernel.debug
    try:
        kernel.debug = True
        assert _jitkey_key(kernel, args, {}) != k0
    finally:
        kernel.debug = old_dbg
    assert _jitkey_key(kernel, args, {}) == k0


def test_every_detected_knob_read_is_in_the_key():
    """Each ``kwargs[...] = knobs.<section>.<attr>`` the installed JITFunction.run makes (3.9 adds
    fpsan_homomorphic_casts) changes the key when its value changes."""
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    args = (x, x, 0, 0, 1.0, True, 64)
    k0 = _jitkey_key(kernel, args, {})
    reads = jt.triton_info().knob_reads
    assert reads
    for _name, section, attr in reads:
        sec = getattr(knobs, section)
        old = getattr(sec, attr)
        new = (not old) if isinstance(old, bool) else f"{old}x"
        try:
            setattr(sec, attr, new)
            assert _jitkey_key(kernel, args, {}) != k0, (section, attr)
        finally:
            setattr(sec, attr, old)
        assert _jitkey_key(kernel, args, {}) == k0


def test_stages_inspection_hook_falls_back(fake_runtime, fake_triton):
    """Triton >= 3.7 adds a custom-pipeline hash to its key when this hook is set: jitkey steps aside."""
    if not jt.triton_info().checks_stages_hook:
        pytest.skip("this Triton has no add_stages_inspection_hook")
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    args = (x, x, 16, 5, 1.0, True, 64)
    kernel[(1,)](*args)
    old = knobs.runtime.add_stages_inspection_hook
    try:
        knobs.runtime.add_stages_inspection_hook = lambda: ("key", "hash")
        with pytest.raises(jt.Unkeyable):
            kernel.key_of(args, {}, device=0)
        kernel[(1,)](*args)
    finally:
        knobs.runtime.add_stages_inspection_hook = old
    assert len(state["calls"]) == 2
    assert kernel.cache_stats()["fallback_reasons"] == {"knobs.runtime.add_stages_inspection_hook is set": 1}


def test_unsupported_args_are_unkeyable():
    np = pytest.importorskip("numpy")
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    for bad in (np.int32(3), "str", [1, 2], object(), 2**64):
        with pytest.raises((jt.Unkeyable, JitKeyError)):
            kernel.key_of((x, x, bad, 0, 1.0, True, 64), {}, device=0)
    with pytest.raises((jt.Unkeyable, JitKeyError)):
        kernel.key_of((x, x, 0, 0, 1.0, True, lambda: 0), {}, device=0)


def test_triton_internals_detected():
    info = jt.triton_info()
    assert info.problem is None, info.problem
    assert ("instrumentation_mode", "compilation", "instrumentation_mode") in info.knob_reads
    # Independently of the scanner: every knob JITFunction.run assigns into the launch kwargs (3.9 adds
    # fpsan_homomorphic_casts) is one the key reads.
    src = inspect.getsource(info.JITFunction.run)
    assigned = set(re.findall(r"^\s*kwargs\[.*\]\s*=\s*knobs\.(\w+)\.(\w+)\s*$", src, re.M))
    assert assigned and assigned <= {(s, a) for _, s, a in info.knob_reads}


def test_unknown_triton_rule_disables_fast_path():
    src = 'kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug\nkwargs["new"] = f(x)\n'
    problem, reads, _ = _installed._scan_run(src, "x")
    assert problem is not None and "unknown rule" in problem and reads == []
    src = 'kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug\nknobs.runtime.fancy\n'
    problem, _, _ = _installed._scan_run(src, "x")
    assert problem is not None and "knobs.runtime.fancy" in problem


# --- fallbacks -------------------------------------------------------------------------------------------


def _autotuned():
    @triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])
    @triton.jit
    def k_auto(a, n, BLOCK: tl.constexpr):
        pass

    return k_auto


def _heuristic():
    @triton.heuristics({"BLOCK": lambda args: 16})
    @triton.jit
    def k_heur(a, n, BLOCK: tl.constexpr):
        pass

    return k_heur


@pytest.mark.parametrize("make", [_autotuned, _heuristic])
def test_bind_refuses_wrappers_with_a_hint(make):
    with pytest.raises(TypeError, match=r"put @jitkey\.triton\.jit under"):
        jt.bind(make())
    for bad in (lambda: 0, object(), None):
        with pytest.raises(TypeError, match=r"takes a triton\.jit kernel"):
            jt.bind(bad)


def _kw_only(a, n, *, BLOCK: tl.constexpr, W: tl.constexpr = 2):
    pass


def _var_positional(a, *rest):
    pass


def test_keyword_only_params_have_the_fast_path():
    kernel = jt.jit(_kw_only)
    x = torch.empty(4)
    assert kernel.fast_path_problem is None
    k = kernel.key_of((x, 16), {"BLOCK": 4}, device=0)
    assert k == kernel.key_of((x,), {"n": 16, "BLOCK": 4, "W": 2}, device=0)
    assert k != kernel.key_of((x, 16), {"BLOCK": 8}, device=0)
    with pytest.raises(jitkey.errors.ArgumentError, match="positional"):
        kernel.key_of((x, 16, 4), {}, device=0)  # BLOCK is keyword-only


def test_var_positional_params_fall_back_with_reason(fake_runtime):
    """Triton 3.9 binds ``*args`` as a tuple parameter; jitkey sends such kernels to Triton's path, counted."""
    kernel = jt.jit(_var_positional)
    assert "is variadic" in kernel.fast_path_problem
    args = (torch.empty(4), 16, 3)
    with pytest.raises(jt.Unkeyable):
        kernel.key_of(args, {}, device=0)
    calls = []
    kernel._jk_triton_run = lambda *a, **k: calls.append((a, k)) or "ran"  # stand-in for Triton's own path
    assert kernel[(1,)](*args) == "ran"
    assert len(calls) == 1 and calls[0][0] == args and calls[0][1] == {"grid": (1,), "warmup": False}
    assert kernel.cache_stats()["fallback_reasons"] == {kernel.fast_path_problem: 1}


# --- hit path against a recording CompiledKernel stand-in -------------------------------------------------


class FakeRuntime:
    def __init__(self):
        self.device = 0
        self.stream = 1000

    def get_device(self):
        return self.device

    def get_stream(self, dev):
        return self.stream + dev


@pytest.fixture
def fake_runtime(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(_installed, "runtime", rt)
    return rt


class FakeCK:
    """Records ``run`` calls like CompiledKernel.run(gx, gy, gz, stream, fn, pm, md, enter, exit, *args)."""

    def __init__(self, tag):
        self.tag = tag
        self.function = 1234
        self.packed_metadata = (4, 1, 0)
        self.launches = []
        self.md_calls = []
        self.run = lambda *a: self.launches.append(a)

    def _init_handles(self):
        pass

    def launch_metadata(self, grid, stream, *args):
        self.md_calls.append((grid, stream, args))
        return {"md": True}


@pytest.fixture
def fake_triton(fake_runtime):
    """Replace the kernel's Triton path (``JITFunction.run``) with one that records and returns a FakeCK per
    Triton key, computed by Triton's real binder with the knob values Triton folds into the options, and keeps
    it where Triton would (``device_caches``)."""
    state = {"calls": [], "cks": {}}

    def install(fn):
        binder = create_function_from_signature(fn.signature, fn.params, _BACKEND)

        def run(*args, grid, warmup, **kwargs):
            for hook in fn.pre_run_hooks:
                hook(*args, **kwargs)
            state["calls"].append((args, kwargs, grid, warmup))
            # the knob state Triton's run folds into the options: a kernel is Triton's for that state
            folded = {"debug": kwargs.get("debug", fn.debug) or knobs.runtime.debug}
            folded |= {name: getattr(getattr(knobs, s), a) for name, s, a in jt.triton_info().knob_reads}
            _, spec, options = binder(*args, **{**kwargs, **folded})
            tk = compute_cache_key({}, spec, options)
            ck = state["cks"].setdefault(tk, FakeCK(tk))
            per_device = dict.setdefault(fn.device_caches, fake_runtime.device, ({}, {}, None, None, None))
            per_device[0][tk] = ck
            for (gname, _), (val, gdict) in fn.used_global_vals.items():
                if gdict.get(gname) != val:
                    raise RuntimeError(f"Global variable {gname} has changed")
            return ck

        fn._jk_triton_run = run  # on the (per-test) kernel itself: nothing else keeps it alive
        return state

    return install


def test_hit_path_launches_directly(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[(3,)](x, x, 16, 5, 1.0, True, 64)
    assert len(state["calls"]) == 1 and ck.launches == []  # the miss went through "Triton"
    ck2 = kernel[(3, 2)](x, x, 32, 7, 2.0, True, BLOCK=64)
    assert ck2 is ck and len(state["calls"]) == 1
    assert ck.launches == [(3, 2, 1, 1000, 1234, (4, 1, 0), None, None, None, x, x, 32, 7, 2.0, True, 64, 7)]
    # a misaligned view misses and gets its own Triton kernel
    ck3 = kernel[(1,)](x[1:], x, 16, 5, 1.0, True, 64)
    assert ck3 is not ck and len(state["calls"]) == 2
    stats = kernel.cache_stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["fallbacks"]) == (1, 2, 2, 0)


def test_stream_and_device_read_per_call(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    args = (x, x, 16, 5, 1.0, True, 64)
    ck = kernel[(1,)](*args)
    kernel[(1,)](*args)
    fake_runtime.stream = 2000
    kernel[(1,)](*args)
    assert [launch[3] for launch in ck.launches] == [1000, 2000]
    fake_runtime.device = 1  # another device: a miss, then hits on device 1's entry
    kernel[(1,)](*args)
    kernel[(1,)](*args)
    assert len(state["calls"]) == 2 and ck.launches[-1][3] == 2001


def test_callable_grid_gets_bound_args(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    seen = []

    def grid(meta):
        seen.append(dict(meta))
        return (meta["n"] // 8,)

    ck = kernel[grid](x, x, 16, 5, 1.0, True, 64)
    kernel[grid](x, x, 32, 5, 1.0, True, BLOCK=64)
    assert seen[-1] == {"a": x, "b": x, "n": 32, "m": 5, "f": 1.0, "flag": True, "BLOCK": 64, "OPT": 7}
    assert ck.launches[-1][:3] == (4, 1, 1)


def test_hooks_passed_only_when_chain_non_empty(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    args = (x, x, 16, 5, 1.0, True, 64)
    ck = kernel[(1,)](*args)
    kernel[(1,)](*args)
    assert ck.launches[-1][6:9] == (None, None, None)
    hook = lambda *a: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernel[(2,)](*args)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert ck.launches[-1][6] == {"md": True}
    assert ck.launches[-1][7] is knobs.runtime.launch_enter_hook
    assert ck.launches[-1][8] is knobs.runtime.launch_exit_hook
    assert ck.md_calls[-1] == ((2,), 1000, (x, x, 16, 5, 1.0, True, 64, 7))
    kernel[(1,)](*args)
    assert ck.launches[-1][6:9] == (None, None, None)


def test_pre_run_hook_falls_back(fake_runtime, fake_triton):
    kernel = jt.bind(k_dns)
    state = fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[(1,)](x, x, 3, 4, 16)
    kernel[(1,)](x, x, 3, 4, 16)
    seen = []
    kernel.add_pre_run_hook(lambda *a, **k: seen.append(a))
    try:
        kernel[(1,)](x, x, 3, 4, 16)
    finally:
        kernel.pre_run_hooks.clear()
    assert len(seen) == 1 and len(ck.launches) == 1 and len(state["calls"]) == 2
    assert kernel.cache_stats()["fallback_reasons"] == {"pre_run_hooks": 1}


def test_unkeyable_arg_falls_back(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64, OPT=lambda: 0)
    assert len(state["calls"]) == 1
    (reason,) = kernel.cache_stats()["fallback_reasons"]
    assert "function" in reason or "constexpr value of type" in reason


def _reading_globals(fake_triton, fn):
    """A jitkey kernel of ``fn`` on the stand-in Triton, its ``used_global_vals`` computed as a compile would."""
    kernel = jt.bind(fn)
    fake_triton(kernel)
    kernel.cache_key  # noqa: B018
    assert kernel.used_global_vals
    return kernel


def test_constexpr_global_checked_natively_until_it_changes(fake_runtime, fake_triton):
    """A module-level ``tl.constexpr`` still bound to the same object holding the same value passes with no
    Python check; rebinding the name, reassigning its ``value`` or rebinding it to an equal object all run
    Triton's own check again (which raises exactly where Triton's would)."""
    global CSCALE
    kernel = _reading_globals(fake_triton, k_cglobal)
    x = torch.empty(64)

    def counts():
        w = kernel.cache_stats()["watched_state"]
        return w["globals_native"], w["globals_full"]

    ck = kernel[(1,)](x, 0, 16)
    for _ in range(5):
        kernel[(1,)](x, 0, 16)
    assert counts() == (4, 1)  # the first hit ran the full check and took the snapshot
    old = CSCALE
    try:
        CSCALE = tl.constexpr(4)  # an equal constexpr, another object: Triton's check passes
        kernel[(1,)](x, 0, 16)
        kernel[(1,)](x, 0, 16)
        assert counts() == (5, 2)
        CSCALE.value = 5  # the value reassigned in place: Triton's check raises
        with pytest.raises(RuntimeError, match="CSCALE"):
            kernel[(1,)](x, 0, 16)
        CSCALE.value = 4
        kernel[(1,)](x, 0, 16)
        CSCALE = tl.constexpr(6)
        with pytest.raises(GlobalsChangedError, match="CSCALE"):
            kernel[(1,)](x, 0, 16)
        del globals()["CSCALE"]
        with pytest.raises(GlobalsChangedError, match="CSCALE"):
            kernel[(1,)](x, 0, 16)
    finally:
        CSCALE = old
    kernel[(1,)](x, 0, 16)
    assert len(ck.launches) == 5 + 2 + 1 + 1


def test_globals_changed_raise(fake_runtime, fake_triton):
    global SCALE
    kernel = _reading_globals(fake_triton, k_global)
    x = torch.empty(64)
    ck = kernel[(1,)](x, 0, 16)
    kernel[(1,)](x, 0, 16)
    old = SCALE
    try:
        SCALE = 3
        with pytest.raises(GlobalsChangedError, match="SCALE"):
            kernel[(1,)](x, 0, 16)
        with pytest.raises(RuntimeError):
            kernel[(1,)](x, 0, 16)
    finally:
        SCALE = old
    kernel[(1,)](x, 0, 16)
    assert len(ck.launches) == 2


def test_jit_decorator_and_passthrough():
    @jt.jit(do_not_specialize=["n"])
    def k(a, n, BLOCK: tl.constexpr):
        pass

    assert isinstance(k, jt.TritonKernel) and k.fast_path_problem is None
    assert isinstance(k, triton.runtime.JITFunction)
    assert k.arg_names == ["a", "n", "BLOCK"] and k.params[1].do_not_specialize
    assert inspect.isfunction(k.fn) and k.fn.__name__ == "k" and k.__name__ == "k"
    assert k.src.startswith("def k(a, n, BLOCK") and inspect.signature(k.fn) == k.signature
    assert repr(k) == f"JITFunction({__name__}:{k.fn.__qualname__})"

    @jt.jit
    def k2(a):
        pass

    assert isinstance(k2, jt.TritonKernel) and jt.bind(k2) is k2


def test_cpu_without_driver_goes_to_triton():
    """Without a GPU, the call reaches Triton's own path, which raises its own error."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    kernel = jt.bind(k_full)
    x = torch.empty(64)
    with pytest.raises(Exception):  # noqa: B017 - whatever Triton raises without a driver
        kernel[(1,)](x, x, 16, 5, 1.0, True, 64)
    assert kernel.cache_stats()["fallbacks"] == 1


# --- the native launcher (jitkey._core._TritonLauncher) and the direct C launch ------------------------------


def test_native_subscript_is_c_once_launched(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    # the first subscript goes through Python's _subscript, which builds the launcher and routes later
    # subscripts to C
    assert type(kernel[(1,)]).__name__ == "partial"
    ck = kernel[(1,)](x, x, 16, 5, 1.0, True, 64)
    bound = kernel[(2,)]
    assert type(bound).__name__ == "builtin_function_or_method"
    assert bound(x, x, 16, 5, 1.0, True, 64) is ck
    assert ck.launches[-1][:3] == (2, 1, 1)


def test_native_subscript_reuses_the_function_for_an_equal_int_grid(fake_runtime, fake_triton):
    """``kernel[grid]`` for an equal tuple of ints returns the function it made last (no allocation per
    launch); any other grid gets its own, a callable grid is never kept, and a new launcher drops it."""
    import gc
    import weakref

    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    args = (x, x, 16, 5, 1.0, True, 64)
    kernel[(1,)](*args)  # builds the native launcher
    n = 3
    first = kernel[(2, n)]
    assert kernel[(2, 3)] is first and kernel[(1 + 1, 3)] is first
    assert kernel[(2, 3, 1)] is not first and kernel[[2, 3]] is not kernel[[2, 3]]
    assert kernel[(2.0, 3)] is not kernel[(2.0, 3)] and kernel[(True,)] is not kernel[(True,)]
    ck = kernel[(2, 3)](*args)
    assert ck.launches[-1][:3] == (2, 3, 1)
    assert kernel[(5,)](*args).launches[-1][:3] == (5, 1, 1)  # another grid replaces the kept one

    def grid(meta):
        return (4,)

    ref = weakref.ref(grid)
    assert kernel[grid] is not kernel[grid]
    assert kernel[grid](*args).launches[-1][:3] == (4, 1, 1)
    del grid
    gc.collect()
    assert ref() is None  # a callable grid (and what it closes over) is not kept alive

    kept = kernel[(7,)]
    kernel._set_launcher(kernel._jk_launch.__self__)  # a (re)set launcher drops the kept function
    assert kernel[(7,)] is not kept


def test_native_grid_as_list_and_launch_options(fake_runtime, fake_triton):
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[[2, 3]](x, x, 16, 5, 1.0, True, 64, num_warps=4)
    assert state["calls"][-1][1] == {"num_warps": 4}  # options reach Triton on the miss
    assert kernel[[2, 3]](x, x, 16, 5, 1.0, True, 64, num_warps=4) is ck
    assert ck.launches[-1][:3] == (2, 3, 1) and ck.launches[-1][9:] == (x, x, 16, 5, 1.0, True, 64, 7)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64, num_warps=8)  # other options: another key, a miss
    assert len(state["calls"]) == 2 and state["calls"][-1][1] == {"num_warps": 8}


@pytest.mark.parametrize(
    "args, kwargs, why",
    [
        ((1, 2, 3, 4, 5, 6, 7, 8, 9), {}, "positional arguments"),
        ((1, 2, 3), {}, "missing a required argument: 'm'"),
        ((1, 2, 3, 4, 5, 6, 7), {"n": 1}, "multiple values for argument 'n'"),
    ],
)
def test_native_binding_errors_go_to_triton_unchanged(fake_runtime, fake_triton, args, kwargs, why):
    """A call that does not bind reaches Triton's own path with its exact arguments (Triton raises)."""
    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64)  # the launcher exists
    calls = []
    kernel._jk_triton_run = lambda *a, **k: calls.append((a, k)) or "triton"
    assert kernel[(1,)](*args, **kwargs) == "triton"
    assert calls == [(args, {"grid": (1,), "warmup": False, **kwargs})]
    (reason,) = kernel.cache_stats()["fallback_reasons"]
    assert reason.startswith("arguments do not bind") and why in reason


def test_native_key_of_matches_the_launch_key(fake_runtime, fake_triton):
    """key_of is the key the launcher stores under: two calls share an entry iff their key_of agree."""
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    calls = [
        ((x, x, 16, 5, 1.0, True, 64), {}),
        ((x, x, 17, 7, 2.0, True), {"BLOCK": 64}),
        ((x,), {"b": x, "n": 16, "m": 5, "f": 1.0, "flag": True, "BLOCK": 64, "OPT": 7}),
        ((x[1:], x, 16, 5, 1.0, True, 64), {}),
        ((x, x, 16, 5, 1.0, True, 64), {"num_warps": 2}),
    ]
    keys = []
    for i, (args, kwargs) in enumerate(calls):
        before = len(state["calls"])
        kernel[(1,)](*args, **kwargs)
        key = kernel.key_of(args, kwargs, device=0)
        assert (len(state["calls"]) == before) == (key in keys), i  # a hit iff an earlier call had this key
        keys.append(key)
    assert keys[0] == keys[2] != keys[1] and len(set(keys)) == 4


def test_native_sees_reassigned_kernel_attributes(fake_runtime, fake_triton):
    """The launcher reads the kernel's attributes per call, so replacing (not mutating) them is seen."""
    kernel = jt.bind(k_dns)
    state = fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[(1,)](x, x, 3, 4, 16)
    kernel[(1,)](x, x, 3, 4, 16)
    old_hooks, old_debug = kernel.pre_run_hooks, kernel.debug
    seen = []
    try:
        kernel.pre_run_hooks = [lambda *a, **k: seen.append(a)]
        kernel[(1,)](x, x, 3, 4, 16)
        kernel.pre_run_hooks = old_hooks
        kernel.debug = not old_debug  # another key: a miss through Triton
        kernel[(1,)](x, x, 3, 4, 16)
    finally:
        kernel.pre_run_hooks, kernel.debug = old_hooks, old_debug
    assert len(seen) == 1 and len(ck.launches) == 1 and len(state["calls"]) == 3
    assert kernel.cache_stats()["fallback_reasons"] == {"pre_run_hooks": 1}


def test_native_kernel_is_garbage_collected(fake_runtime, fake_triton):
    """kernel -> launcher -> bound miss/fallback methods -> kernel is a cycle the GC must be able to break."""
    import gc
    import weakref

    kernel = jt.bind(k_full)
    fake_triton(kernel)
    x = torch.empty(64)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64)
    kernel[(1,)](x, x, 16, 5, 1.0, True, 64)
    kernel.key_of((x, x, 16, 5, 1.0, True, 64), {}, device=0)
    ref = weakref.ref(kernel)
    # Triton >= 3.9 keeps every JITFunction in a module-level registry (by name): that reference is Triton's
    # own, not jitkey's cycle; drop it so the test sees only what jitkey holds.
    registry = getattr(triton.runtime.jit, "_triton_jit_function_registry", {})
    for name in [n for n, f in registry.items() if f is kernel]:
        del registry[name]
    del kernel
    gc.collect()
    assert ref() is None


def test_hit_needs_tritons_own_entry(fake_runtime, fake_triton):
    """Whatever drops Triton's cached kernel (``device_caches.clear()``, a cleared per-device cache, another
    kernel under the key) makes the next call a miss that Triton answers again, as plain Triton would."""
    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    x = torch.empty(64)
    args = (x, x, 16, 5, 1.0, True, 64)
    ck = kernel[(1,)](*args)
    kernel[(1,)](*args)
    assert len(state["calls"]) == 1 and len(ck.launches) == 1
    kernel.device_caches.clear()
    kernel[(1,)](*args)  # Triton is asked again (it would recompile or load from its disk cache)
    kernel[(1,)](*args)
    assert len(state["calls"]) == 2 and len(ck.launches) == 2
    dict.get(kernel.device_caches, 0)[0].clear()
    kernel[(1,)](*args)
    assert len(state["calls"]) == 3
    (tk,) = dict.get(kernel.device_caches, 0)[0]
    other = FakeCK("other")
    dict.get(kernel.device_caches, 0)[0][tk] = other  # Triton now holds another kernel for this key
    kernel[(1,)](*args)
    assert len(state["calls"]) == 4
    assert kernel.cache_stats()["fallbacks"] == 0


# --- issue 24: whatever Triton raises for a call, jitkey raises; reasons say what happened ----------------


def _raised(call):
    try:
        call()
    except Exception as exc:
        return type(exc)
    return None


def test_kernel_params_named_like_launch_arguments_raise_what_triton_raises(fake_runtime, fake_triton):
    """``grid``/``warmup`` passed by keyword are JITFunction.run's own: Triton raises TypeError, also when an
    equal positional call made an entry (a hit must not launch it), and for a name built at run time."""
    x = torch.empty(64)
    for kw in ({"grid": 3}, {"warmup": 4}, {"grid": 3, "warmup": 4}, {"".join(["gr", "id"]): 3}):
        args = {"grid": 3, "warmup": 4, **kw}
        positional = [a for n, a in args.items() if n not in kw]
        expected = _raised(
            lambda kw=kw, positional=positional: k_launch_names[(1,)](x, *positional, **kw, BLOCK=8)
        )
        assert expected is TypeError  # plain Triton, no GPU needed: it fails binding the call
        kernel = jt.bind(k_launch_names)
        fake_triton(kernel)
        ck = kernel[(1,)](x, 3, 4, BLOCK=8)  # positional: fine, and now an entry exists
        launched = len(ck.launches)
        assert kernel[(1,)](x, 3, 4, BLOCK=8) is ck and len(ck.launches) == launched + 1
        got = _raised(lambda k=kernel, kw=kw, positional=positional: k[(1,)](x, *positional, **kw, BLOCK=8))
        assert got is expected, (kw, got)
        assert len(ck.launches) == launched + 1  # nothing more was launched
        (reason,) = kernel.cache_stats()["fallback_reasons"]
        assert "keyword argument of JITFunction.run" in reason


def test_a_float_parameter_takes_an_int_beyond_64_bits_as_triton_does(fake_runtime, fake_triton):
    """``f: tl.float32`` given 2**70: Triton's binder keys the annotation alone and its launcher converts the
    int; jitkey keys and launches it too (no fallback with a reason that says Triton cannot pass it)."""
    x = torch.empty(64)
    triton_spec = _BINDERS["ann"](x, 5, 2**70, 7, 16)[1]
    assert triton_spec[2] == ("fp32", None)
    kernel = jt.bind(k_ann)
    state = fake_triton(kernel)
    assert kernel.key_of((x, 5, 2**70, 7, 16), device=0) == kernel.key_of((x, 5, 3**60, 7, 16), device=0)
    ck = kernel[(1,)](x, 5, 2**70, 7, 16)
    assert kernel[(1,)](x, 5, -(2**90), 7, 16) is ck and len(state["calls"]) == 1
    assert ck.launches[-1][9:13] == (x, 5, -(2**90), 7)  # ck.run gets the int as given, as from Triton
    assert kernel.cache_stats()["fallbacks"] == 0


def test_an_int_triton_cannot_specialize_raises_what_triton_raises(fake_runtime, fake_triton):
    """An unannotated int beyond [-2**63, 2**64): Triton's specialization raises OverflowError; jitkey's
    fallback reason says so, and the call raises the same."""
    x = torch.empty(64)
    assert _raised(lambda: _BINDERS["full"](x, x, 2**64, 5, 1.0, True, 64)) is OverflowError
    kernel = jt.bind(k_full)
    fake_triton(kernel)
    assert _raised(lambda: kernel[(1,)](x, x, 2**64, 5, 1.0, True, 64)) is OverflowError
    (reason,) = kernel.cache_stats()["fallback_reasons"]
    assert "OverflowError" in reason and "cannot pass" not in reason


# -- a DSL plan over launches with a grid function ---------------------------------------------------------------


_GRID_SEEN: list[int] = []


def test_a_dsl_plan_replays_a_launch_whose_grid_is_a_function_of_constants(fake_runtime, fake_triton):
    """``kernel[lambda meta: ...]`` inside a DSL call (FlagGems' ``zero_``, ``zeros``): a grid function that
    captures only constants is a constant of the plan, and each replayed launch calls it with that launch's
    arguments, as Triton calls it on every launch. One that captures anything else is refused, counted."""
    from jitkey import dsl

    kernel = jt.bind(k_full)
    state = fake_triton(kernel)
    seen = _GRID_SEEN  # a global the grid function reads when called (captured, it would be refused)

    def host(x, block):
        n = x.numel()

        def grid(meta):
            _GRID_SEEN.append(meta["BLOCK"])
            return (-(-n // meta["BLOCK"]),)

        kernel[grid](x, x, 16, 5, 1.0, True, block)
        return x

    x, y = torch.empty(64), torch.empty(256)
    for t in (x, y):
        host(t, 16)  # the kernel compiles (here: Triton's path, faked) for each
    site = dsl.Site("test:grid-function", host, lambda args: dsl.Bound(host), fallback=host)
    (ck,) = state["cks"].values()
    for t, want in ((x, 4), (y, 16), (x, 4), (y, 16), (x, 4)):
        seen.clear()
        assert site.call(t, 16) is t
        assert ck.launches[-1][:3] == (want, 1, 1) and seen == [16]  # the function ran for this launch
    st_ = site.stats()
    assert st_["replays"] == 3 and st_["refused"] == {} and st_["fallbacks"] == 0, st_["refused"]
    assert [kind for kind, _ in site.plan(x, 16).steps] == ["launch"]

    def host_capturing(x, block):
        def grid(meta):  # captures a tensor: the plan would keep it, and what it reads is not keyed
            return (x.numel() // meta["BLOCK"],)

        kernel[grid](x, x, 16, 5, 1.0, True, block)
        return x

    other = dsl.Site("test:grid-capturing", host_capturing, lambda a: dsl.Bound(host_capturing),
                     fallback=host_capturing)  # fmt: skip
    for _ in range(3):
        assert other.call(x, 16) is x and ck.launches[-1][:3] == (4, 1, 1)
    assert other.stats()["refused"] == {"a launch grid function that captures values other than constants": 1}
    assert other.stats()["replays"] == 0
