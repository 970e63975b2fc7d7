"""The DSL layer (jitkey.dsl) on CPU: recording, replay, keys, guards, refusals and fallbacks.

The "DSL" here is plain Python host code over real torch tensors (and, for launches, a jitkey Triton kernel
against the recording CompiledKernel stand-in of test_triton_cpu): every replay is compared with the host code
run directly on the same inputs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import jitkey.dsl as dsl  # noqa: E402
from jitkey import _core  # noqa: E402


def make_site(host, names, **kw):
    return dsl.Site(f"test:{host.__name__}", names, lambda args: dsl.Bound(host), fallback=host, **kw)


def host_add(x, y, alpha):
    n = x.numel()
    out = torch.empty_like(x)
    torch.add(x, y, alpha=alpha, out=out)
    half = out.reshape(-1)[: n // 2]
    return out, half.sum(), x.shape[0] * 2


def test_replay_equals_the_host_code_with_fresh_outputs():
    site = make_site(host_add, ["x", "y", "alpha"])
    x, y = torch.randn(8), torch.randn(8)
    outs = [site.call(x, y, 2.0) for _ in range(4)]
    ref = host_add(x, y, 2.0)
    for o in outs:
        assert torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]) and o[2] == 16
    assert outs[2][0] is not outs[3][0]  # every replay allocates its own output
    x.add_(1)  # new data, same key: the replay reads the inputs of this call
    assert torch.equal(site.call(x, y, 2.0)[0], host_add(x, y, 2.0)[0])
    st = site.stats()
    assert (st["misses"], st["replays"], st["bound_calls"], st["fallbacks"]) == (1, 4, 0, 0)


@pytest.mark.parametrize(
    "a, b",
    [
        ((torch.randn(8), torch.randn(8), 2.0), (torch.randn(9), torch.randn(9), 2.0)),  # shape
        ((torch.randn(8), torch.randn(8), 2.0), (torch.randn(8), torch.randn(8), 3.0)),  # scalar value
        ((torch.randn(8), torch.randn(8), 2.0), (torch.randn(8), torch.randn(8), 2)),  # scalar type
        ((torch.randn(8), torch.randn(8), 2.0), (torch.randn(8).half(), torch.randn(8), 2.0)),  # dtype
        (
            (torch.randn(4, 4), torch.randn(4, 4), 1.0),
            (torch.randn(4, 4).t(), torch.randn(4, 4), 1.0),
        ),  # strides
        ((torch.randn(9)[1:], torch.randn(8), 1.0), (torch.randn(9)[:8], torch.randn(8), 1.0)),  # alignment
    ],
    ids=["shape", "scalar", "scalar-type", "dtype", "strides", "alignment"],
)
def test_key_tells_apart_what_a_dsl_may_decide_on(a, b):
    site = make_site(host_add, ["x", "y", "alpha"])
    assert site.key(*a) != site.key(*b)
    for args in (a, b, a, b):
        got, ref = site.call(*args), host_add(*args)
        assert torch.equal(got[0], ref[0]) and got[2] == ref[2]
    assert site.stats()["misses"] == 2 and site.stats()["replays"] == 2


def test_key_holds_torch_modes_and_which_arguments_are_one_object():
    site = make_site(host_add, ["x", "y", "alpha"])
    x, y = torch.randn(8), torch.randn(8)
    k = site.key(x, y, 1.0)
    with torch.no_grad():
        assert site.key(x, y, 1.0) != k
    with torch.inference_mode():
        assert site.key(x, y, 1.0) != k
    assert site.key(x, x, 1.0) != site.key(x, x.clone(), 1.0)


def test_defaults_and_argument_count():
    def host(x, scale=2.0):
        return x * scale

    site = make_site(host, ["x", ("scale", dsl.exact(), 2.0)])
    x = torch.randn(4)
    # A call binds its arguments to the parameters, defaults applied, before it is keyed.
    assert site.key(x) == site.key(x, 2.0) == site.key(x, scale=2.0) == site.key(scale=2.0, x=x)
    for _ in range(3):
        assert torch.equal(site.call(x), x * 2.0) and torch.equal(site.call(x, scale=3.0), x * 3.0)
    assert site.stats()["stale"] == 0 and site.stats()["misses"] == 2 and site.stats()["replays"] == 4


def test_keyword_only_parameters_reach_the_dsl_by_name():
    def host(x, *, alpha=1.0, out=None):
        if out is None:
            out = torch.empty_like(x)
        torch.mul(x, alpha, out=out)
        return out

    site = make_site(host, host)
    x = torch.randn(4)
    o = torch.empty(4)
    for _ in range(3):
        assert torch.equal(site.call(x, alpha=3.0), x * 3.0)
        assert site.call(x, alpha=2.0, out=o) is o and torch.equal(o, x * 2.0)
    st = site.stats()
    assert st["replays"] == 4 and st["fallbacks"] == 0
    with pytest.raises(TypeError):
        site.call(x, 2.0)  # keyword-only: the DSL's own path raises its TypeError
    assert "positional" in next(iter(site.stats()["fallback_reasons"]))


def _refused(host, *args, names=None):
    site = make_site(host, names or [f"a{i}" for i in range(len(args))])
    first = site.call(*args)
    site.call(*args)
    st = site.stats()
    assert st["replays"] == 0 and st["bound_calls"] == 1, st  # the DSL's bound call, not a replay
    return next(iter(st["refused"])), first


GLOBAL_BUF = torch.zeros(4)


@pytest.mark.parametrize(
    "host, args, why",
    [
        (lambda x: x * x.data_ptr() % 7, (torch.randn(4),), "data_ptr"),
        (lambda x: x * float(x.sum().item()), (torch.randn(4),), "item"),
        (lambda x: x + GLOBAL_BUF, (torch.randn(4),), "neither received nor made"),
        (lambda x: x * 2 if x.requires_grad else x, (torch.randn(4),), "requires_grad"),
        (lambda x: x[x > 0], (torch.randn(4),), "depends on the data"),
        (lambda x: torch.nonzero(x), (torch.randn(4),), "depends on the data"),
        (lambda x, ys: x + ys[0], (GLOBAL_BUF, (GLOBAL_BUF,)), "passed twice in one call, inside a tuple"),
        (lambda x: x * x.storage_offset(), (torch.randn(4),), "storage_offset"),
        (
            lambda x: x + torch.randn(4, generator=torch.Generator().manual_seed(0)),
            (torch.randn(4),),
            "Generator",
        ),
    ],
    ids=["data_ptr", "item", "global", "requires_grad", "bool-mask", "nonzero", "twice", "offset", "object"],
)
def test_recording_refuses_what_a_replay_cannot_reproduce(host, args, why):
    reason, first = _refused(host, *args)
    assert why in reason
    ref = host(*args)
    assert torch.equal(first, ref) if isinstance(ref, torch.Tensor) else first == ref


def test_a_tensor_passed_as_two_arguments_replays_and_is_keyed_apart_from_two_tensors():
    """``op(x, x)``: the key holds which arguments are one object, so the recording takes the first place as the
    tensor's source; a call with two distinct tensors is keyed apart (its own recording), and a DSL that branches
    on ``a is b`` gets its own answer in both."""

    def host(a, b):
        if a is b:
            return torch.mul(a, 2.0)
        return torch.add(a, b)

    site = make_site(host, ["a", "b"])
    x, y = torch.randn(8), torch.randn(8)
    for _ in range(3):
        assert torch.equal(site.call(x, x), x * 2.0)
        assert torch.equal(site.call(x, y), x + y)
        assert torch.equal(site.call(y, y), y * 2.0)
    st = site.stats()
    assert st["replays"] == 7 and st["bound_calls"] == 0 and st["plans"] == 2, st


def test_derived_metadata_of_made_tensors_is_folded():
    def host(x):
        y = x.t().contiguous()
        return y * y.storage_offset() + y.stride(0)

    site = make_site(host, ["x"])
    x = torch.randn(3, 5)
    for _ in range(3):
        assert torch.equal(site.call(x), host(x))
    assert site.stats()["replays"] == 2


def test_fallbacks_are_counted_by_reason():
    site = make_site(host_add, ["x", "y", "alpha"])
    x, y = torch.randn(8), torch.randn(8)
    with pytest.raises(TypeError):
        site.call(x, y, 2.0, beta=1)  # an unexpected keyword: the DSL's own path raises
    assert torch.equal(site.call(x, y, object())[0] if False else x, x)
    with pytest.raises(TypeError):
        site.call(x, y, object())  # unkeyable: the DSL's own path runs (and raises as it would)

    class Sub(torch.Tensor):
        pass

    s = x.as_subclass(Sub)
    site.call(s, y, 2.0)

    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        site.call(x, y, 2.0)
    reasons = site.stats()["fallback_reasons"]
    assert reasons["arguments do not bind: an unexpected keyword argument"] == 1
    assert reasons["a tensor subclass argument"] == 1
    assert reasons["a torch function mode is active"] == 1
    assert any("alpha" in r for r in reasons)  # the unkeyable argument, named
    assert site.stats()["replays"] == 0


def test_state_is_folded_into_the_key():
    setting = {"v": 1}

    def host(x):
        return x * setting["v"]

    site = make_site(host, ["x"], state=[lambda: setting["v"]])
    x = torch.randn(4)
    assert torch.equal(site.call(x), x)
    setting["v"] = 3
    assert torch.equal(site.call(x), x * 3) and torch.equal(site.call(x), x * 3)
    assert site.stats()["misses"] == 2


def test_guard_drops_a_plan_whose_bound_call_changed():
    class Bound:
        def __init__(self):
            self.run = lambda x: x + 1

    b = Bound()
    site = dsl.Site(
        "test:guard", ["x"], lambda args: dsl.Bound(b.run, (b, "run")), fallback=lambda x: b.run(x)
    )
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(site.call(x), x + 1)
    b.run = lambda x: x * 5  # the DSL rebinds (a new config): the old plan must not run
    assert torch.equal(site.call(x), x * 5)
    assert torch.equal(site.call(x), x * 5)
    st = site.stats()
    assert st["stale"] == 1 and st["replays"] == 3


def test_bind_none_runs_the_dsl_path_without_caching():
    calls = []

    def fallback(x):
        calls.append(1)
        return x + 2

    site = dsl.Site("test:warm", ["x"], lambda args: None, fallback=fallback)
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(site.call(x), x + 2)
    assert len(calls) == 3 and site.stats()["warmups"] == 3 and site.stats()["plans"] == 0


def test_an_exception_in_the_dsl_path_propagates_and_caches_nothing():
    def host(x):
        if x.shape[0] > 3:
            raise ValueError("too long")
        return x + 1

    site = make_site(host, ["x"])
    with pytest.raises(ValueError, match="too long"):
        site.call(torch.randn(5))
    assert site.stats()["plans"] == 0
    assert torch.equal(site.call(torch.ones(2)), torch.full((2,), 2.0))


def test_nested_site_is_one_step_of_the_outer_recording():
    inner = make_site(lambda x: x * 2, ["x"])
    inner_call = inner.call

    def outer_host(x):
        y = inner_call(x + 1)
        return y - 1

    outer = make_site(outer_host, ["x"])
    x = torch.randn(4)
    for _ in range(4):
        assert torch.equal(outer.call(x), (x + 1) * 2 - 1)
    assert outer.stats()["replays"] == 3
    assert inner.stats()["replays"] >= 2  # the outer replay calls the inner site, which replays


def test_tuple_and_list_arguments_and_results():
    def host(xs, pair):
        a, b = pair
        return (torch.cat(list(xs)) * a, [b, len(xs)])

    site = make_site(host, ["xs", "pair"])
    xs = [torch.randn(2), torch.randn(3)]
    for _ in range(3):
        got, ref = site.call(xs, (2.0, "s")), host(xs, (2.0, "s"))
        assert torch.equal(got[0], ref[0]) and got[1] == ref[1]
    assert site.stats()["replays"] == 2


def test_plan_spec_is_validated():
    with pytest.raises(ValueError):
        _core._Plan(1, [("call", len, [("a", 3)], None)], ("s", 0))
    with pytest.raises(ValueError):
        _core._Plan(1, [("call", len, [("s", 0)], None)], ("s", 0))  # a step reads only earlier steps
    with pytest.raises(ValueError):
        _core._Plan(1, [("jump", len, [], None)], ("c", 1))
    p = _core._Plan(2, [("call", max, [("a", 0), ("a", 1)], None)], ("t", (("s", 0), ("c", "k"))))
    assert p(3, 5) == (5, "k") and len(p) == 1 and p.valid


def test_report_sums_sites():
    site = make_site(host_add, ["x", "y", "alpha"])
    x, y = torch.randn(8), torch.randn(8)
    for _ in range(3):
        site.call(x, y, 1.0)
    rep = dsl.report(where=lambda s: s is site)
    assert rep["sites"] == 1 and rep["replays"] == 2 and rep["fast_path"] == 1.0
    merged = dsl.merge_reports([rep, rep])
    assert merged["replays"] == 4 and merged["busiest"][0]["calls"] == 6


def test_draws_from_torch_generators_in_python_are_refused_and_steps_replay_theirs():
    def seeded(x):
        seed = torch.randint(0, 2**30, (1,)).item()  # a Python value drawn from the generator: not a step
        return x + seed

    reason, _ = _refused(seeded, torch.randn(4))
    assert "item" in reason or "random" in reason

    def noisy(x):
        return x + torch.rand(4)  # a step: replayed, it draws again

    site = make_site(noisy, ["x"])
    x = torch.zeros(4)
    outs = [site.call(x) for _ in range(3)]
    assert site.stats()["replays"] == 2
    assert not torch.equal(outs[1], outs[2])
    torch.manual_seed(7)
    a = site.call(x)
    torch.manual_seed(7)
    assert torch.equal(a, noisy(x))  # the replay draws exactly what the DSL would


def test_functions_of_constants_and_metadata_queries_are_folded():
    def host(x, y):
        dt = torch.promote_types(x.dtype, y.dtype)
        rt = torch.result_type(x, y)
        out = torch.empty(x.shape, dtype=dt)
        torch.add(x, y, out=out)
        return out, rt

    site = make_site(host, ["x", "y"])
    x, y = torch.randn(4).half(), torch.randn(4)
    for _ in range(3):
        got, ref = site.call(x, y), host(x, y)
        assert torch.equal(got[0], ref[0]) and got[1] == ref[1] and got[0].dtype == torch.float32
    assert site.stats()["replays"] == 2


def test_contiguous_that_returns_its_own_tensor_is_folded_and_a_copy_is_a_step():
    """``x.contiguous()`` returns ``x`` itself exactly when the keyed shape and strides say so: no step then (the
    replay passes the argument on, as the call does); otherwise it copies, and the copy is a step."""

    def host(x, scale):
        y = x.contiguous()
        z = y.contiguous()  # a tensor the call made, already contiguous
        return z, z * scale

    site = make_site(host, ["x", "scale"])
    dense, strided = torch.randn(4, 6), torch.randn(6, 4).t()
    for x in (dense, strided):
        for _ in range(3):
            got, ref = site.call(x, 2.0), host(x, 2.0)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            assert (got[0] is x) == (ref[0] is x)  # the same object where torch gives the same object
            assert got[0].is_contiguous()
    assert site.stats()["replays"] == 4
    steps = lambda x: [_core_name(t) for _k, t in site.plan(x, 2.0).steps]  # noqa: E731
    assert "contiguous" not in steps(dense)
    assert steps(strided).count("contiguous") == 1
    x = dense.clone()
    out = site.call(x, 2.0)[0]
    x.add_(1)  # the replay handed back the argument itself: it sees the change, as the call's result does
    assert torch.equal(out, x)


def test_layout_and_memory_format_arguments_are_keyed_not_fallbacks():
    """An op taking ``memory_format=`` / ``layout=`` (as torch passes them to a DSL's registered op) is keyed by them:
    one plan per value, each replaying what the call does for it."""

    def host(x, memory_format=torch.contiguous_format, layout=torch.strided):
        assert layout is torch.strided
        return x.contiguous(memory_format=memory_format) * 2

    site = make_site(host, ["x", "memory_format", "layout"])
    x = torch.randn(2, 3, 4, 5)
    for fmt in (torch.contiguous_format, torch.channels_last, torch.contiguous_format, torch.channels_last):
        for _ in range(2):
            got, want = site.call(x, fmt, torch.strided), host(x, fmt, torch.strided)
            assert torch.equal(got, want) and got.stride() == want.stride()
    st = site.stats()
    assert (st["misses"], st["replays"], st["fallbacks"], st["plans"]) == (2, 6, 0, 2), st
    assert site.key(x, torch.channels_last, torch.strided) != site.key(
        x, torch.contiguous_format, torch.strided
    )


def _core_name(target):
    return getattr(target, "__name__", type(target).__name__)


def test_aten_metadata_queries_are_folded_by_name():
    def host(x):
        dense = torch.ops.aten.is_non_overlapping_and_dense.default(x)
        return x * 2 if dense else x * 3

    site = make_site(host, ["x"])
    for x in (torch.randn(4, 4), torch.randn(4, 8)[:, ::2]):
        for _ in range(3):
            assert torch.equal(site.call(x), host(x))
    assert site.stats()["replays"] == 4 and site.stats()["refused"] == {}


def test_a_launch_grid_function_of_constants_replays_under_tritons_interpreter(tmp_path):
    """A real Triton kernel launched with ``kernel[lambda meta: ...]`` (as FlagGems' ``zero_`` launches), run by
    Triton's interpreter on CPU: the grid function is a constant of the plan and every replay matches the op's own
    result, for several keys; a grid function capturing a tensor refuses the recording (tests/_dsl_grid_interp.py).
    The recorder's rule itself is tested with the fake runtime in tests/test_triton_cpu.py."""
    pytest.importorskip("triton")
    import _interp_child

    out = _interp_child.run("_dsl_grid_interp.py", 300, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    assert out["bad"] == []
    assert out["fill"] == {"replays": 18, "refused": {}, "fallbacks": {}}  # 3 keys: one recording each
    assert out["steps"] == ["call"]  # the interpreter's run, with the grid function as it was recorded
    assert out["capturing"]["replays"] == 0
    assert out["capturing"]["refused"] == {
        "a launch grid function that captures values other than constants": 3
    }
