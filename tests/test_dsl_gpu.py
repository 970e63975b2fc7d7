"""The DSL layer on the GPU, against the DSLs' own paths (every test is marked ``cuda``).

Each call through the integration is compared bit for bit with the DSL's own path on the same inputs (Helion's
own ``Kernel.__call__``, FlagGems' own op function), over random shapes, strides, broadcasts, non-contiguous and
zero-size tensors, scalar operands, dtype promotion, in-place and ``out=`` forms; the calls that may replay
must replay (the fast path is taken), and what changes Helion's or FlagGems' decision changes the key.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


# ---------------------------------------------------------------------------------------------------------
# Helion
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helion_on():
    if importlib.util.find_spec("helion") is None:
        pytest.skip("helion is not installed")
    import jitkey.integrations.helion as jh

    if jh.SUPPORTED[0] != __import__("importlib.metadata").metadata.version("helion"):
        pytest.skip("another Helion")
    jh.install()
    import _dsl_helion_kernels  # noqa: F401 (imported after install: its kernels are routed)

    return jh


def _helion_cases(k, rng):
    f32, f16 = torch.float32, torch.float16
    cases = []
    for _ in range(6):
        m, n = rng.choice([1, 3, 16, 37, 128]), rng.choice([1, 8, 33, 256])
        x = torch.randn(m, n, device=DEV, dtype=rng.choice([f32, f16]))
        b = torch.randn(n, device=DEV, dtype=rng.choice([f32, f16]))
        cases.append((k.add_bcast, (x, b)))
        xt = torch.randn(n, m, device=DEV).t()  # non-contiguous
        cases.append((k.add_bcast, (xt, torch.randn(n, device=DEV))))
        cases.append((k.col_sum, (x,)))
        n1 = rng.choice([0, 1, 100, 4096])  # zero-size too
        v, w = torch.randn(n1, device=DEV), torch.randn(n1, device=DEV)
        cases.append((k.scale_shift, (v, rng.choice([0.5, -2.0, 3.25]), rng.choice([0, 7, -3]))))
        cases.append((k.add_out, (v, w, torch.empty(n1, device=DEV))))
        cases.append((k.add_inplace, (v.clone(), w)))
    return cases


def test_helion_calls_match_helions_own_path(helion_on):
    import _dsl_helion_kernels as k

    own = helion_on._saved[0]
    rng = random.Random(1234)
    for kernel, args in _helion_cases(k, rng):
        for _ in range(3):  # Helion compiles, jitkey records, jitkey replays
            a1, a2 = _clone(args), _clone(args)
            got = kernel(*a1)
            want = own(kernel, *a2)
            assert _same(got, want), (kernel.name, [getattr(a, "shape", a) for a in args])
            assert all(_same(x, y) for x, y in zip(a1, a2, strict=True))  # in-place / out= effects equal
    rep = helion_on.report()
    assert rep["fallbacks"] == 0, rep["fallback_reasons"]
    assert rep["replays"] > 0 and not rep["refused"], rep["refused"]


def test_helion_bench_kernels_replay_bit_for_bit(helion_on):
    from jitkey import _helion_kernels as hk

    own = helion_on._saved[0]
    x, y = torch.randn(4096, device=DEV), torch.randn(4096, device=DEV)
    a2 = torch.randn(64, 256, device=DEV)
    h = (torch.randn(64, 64, device=DEV, dtype=torch.float16) for _ in range(3))
    q, kt, v = h
    for kernel, args in [
        (hk.add, (x, y)),
        (hk.axpby, (x, y, 0.5, 2.0)),
        (hk.row_sum, (a2,)),
        (hk.softmax, (a2,)),
        (hk.matmul, (q, kt)),
        (hk.attention, (q, kt, v)),
    ]:
        for _ in range(4):
            assert _same(kernel(*args), own(kernel, *args)), kernel.name
        plan = kernel._jk_call.site.plan(*args)
        assert plan is not None and not plan.bound, kernel.name  # a recorded plan, not the bound call
        assert [kind for kind, _ in plan.steps].count("launch") >= 1


def test_helion_reset_and_new_config_drop_plans(helion_on):
    from jitkey import _helion_kernels as hk

    x, y = torch.randn(1000, device=DEV), torch.randn(1000, device=DEV)
    for _ in range(3):
        hk.add(x, y)
    site = hk.add._jk_call.site
    assert site.plan(x, y) is not None
    hk.add.reset()
    assert site.plan(x, y) is None
    for _ in range(3):
        hk.add(x, y)
    bound = hk.add.bind((x, y))
    import helion

    bound.set_config(helion.Config(block_sizes=[64], num_warps=2))  # Helion's bound call changes
    stale = site.stats()["stale"]
    assert torch.equal(hk.add(x, y), x + y)
    assert site.stats()["stale"] == stale + 1


# ---------------------------------------------------------------------------------------------------------
# FlagGems
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gems_on():
    if importlib.util.find_spec("flag_gems") is None:
        pytest.skip("flag_gems is not installed")
    import os

    os.environ.setdefault("GEMS_VENDOR", "nvidia")
    import jitkey.integrations.flag_gems as jf

    jf.install()
    return jf


def _own(op):
    return getattr(op, "_jitkey_wraps", op)


def _gems_cases(fg, rng):
    f32, f16 = torch.float32, torch.float16
    cases = []
    for _ in range(5):
        m, n = rng.choice([1, 7, 64, 300]), rng.choice([1, 16, 255, 1024])
        x = torch.randn(m, n, device=DEV, dtype=rng.choice([f32, f16]))
        y = torch.randn(n, device=DEV, dtype=rng.choice([f32, f16]))  # broadcast, promotion
        cases += [
            (fg.add, (x, y), {}),
            (fg.add, (x, y), {"alpha": 2}),
            (fg.add, (x, 3.5), {}),  # scalar operand
            (fg.mul, (x.t(), 2.0), {}),  # non-contiguous
            (fg.sub, (x, y), {}),
            (fg.exp, (x,), {}),
            (fg.gelu, (x,), {"approximate": rng.choice(["none", "tanh"])}),
            (fg.where_self, (x > 0, x, y), {}),
            (fg.sum, (x,), {}),
            (fg.sum_dim, (x, [1]), {}),
            (fg.mean, (x.float(),), {}),
            (fg.softmax, (x.float(), 1), {}),
            (fg.index_select, (x, 0, torch.randint(0, m, (5,), device=DEV)), {}),
            (fg.embedding, (x, torch.randint(0, m, (rng.choice([1, 3, 40]),), device=DEV)), {}),
        ]
        z = torch.randn(0, n, device=DEV)
        cases.append((fg.add, (z, z), {}))  # zero-size
        w, b = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
        cases.append((fg.layer_norm, (x.float(), (n,), w, b, 1e-5), {}))
        cases.append((fg.rms_norm, (x.float(), (n,), w, 1e-5), {}))
        cases.append((fg.add_, (x.float().clone(), 1.0), {}))  # in place
        o = torch.empty(m, 1, device=DEV, dtype=torch.float32)
        cases.append(
            (fg.sum_dim_out, (x.float(), [1]), {"out": o})
        )  # out= (written keepdim, as FlagGems does)
    return cases


def test_flag_gems_ops_match_their_own_path(gems_on):
    import flag_gems as fg

    rng = random.Random(99)
    for op, args, kw in _gems_cases(fg, rng):
        for _ in range(3):  # FlagGems compiles, jitkey records, jitkey replays
            a1, a2 = _clone(args), _clone(args)
            k1, k2 = (dict(zip(kw, _clone(tuple(kw.values())), strict=True)) for _ in range(2))
            got = op(*a1, **k1)
            want = _own(op)(*a2, **k2)
            assert _same(got, want), (op.__name__, [getattr(a, "shape", a) for a in args], kw)
            assert all(_same(x, y) for x, y in zip((*a1, *k1.values()), (*a2, *k2.values()), strict=True))
    rep = gems_on.report()
    warm = rep["replays"] + rep["bound_calls"] + rep["fallbacks"]
    assert rep["replays"] > 0.5 * warm, rep
    assert rep["fallbacks"] == 0, rep["fallback_reasons"]


def test_flag_gems_ops_of_one_tensor_passed_twice_replay(gems_on):
    """``add(x, x)``, ``mul(x, x)``, ``add_(z, z)``: the key holds that both arguments are one tensor, so these are
    recorded and replayed (they ran FlagGems' own Python on every call before), bit-equal to FlagGems' path."""
    import flag_gems

    from jitkey import dsl

    x = torch.randn(300, 255, device=DEV)
    for op in (flag_gems.add, flag_gems.mul, flag_gems.sub):
        for _ in range(3):
            assert _same(op(x, x), _own(op)(x, x)), op.__name__
    z, z2 = x.clone(), x.clone()
    for _ in range(3):
        flag_gems.add_(z, z)
        _own(flag_gems.add_)(z2, z2)
        assert _same(z, z2)
    names = {"flag_gems:add", "flag_gems:mul", "flag_gems:sub", "flag_gems:add_"}
    stats = {s.name: s.stats() for s in dsl.sites() if s.name in names}
    assert set(stats) == names and all(st["replays"] > 0 for st in stats.values()), stats
    assert not any("twice" in r for st in stats.values() for r in st["refused"]), stats


def test_flag_gems_sum_keeps_its_partial_sums_between_replays_where_torch_would_reuse_them(gems_on):
    """FlagGems' ``sum`` allocates a small tensor of partial sums that only its two launches see: the plan keeps it
    between replays on one stream and hands it to the next replay; a call on another stream, under a CUDA graph
    capture or under deterministic algorithms allocates as torch would, and a tensor someone else holds is never
    handed out again. Every result is bit-equal to FlagGems' own path."""
    import weakref

    import flag_gems

    from jitkey import dsl

    x = torch.randn(4096, device=DEV)
    want = _own(flag_gems.sum)(x)
    for _ in range(3):
        assert _same(flag_gems.sum(x), want)
    (site,) = [s for s in dsl.sites() if s.name == "flag_gems:sum"]
    plan = site.plan(x)
    assert plan is not None and not plan.bound
    kinds = [k for k, _ in plan.steps]
    assert kinds.count("empty") == 2 and sum(k is not False for k in plan.kept) == 1, (kinds, plan.kept)

    def kept():  # a weak reference to the tensor kept now (a strong one would stop its reuse)
        (t,) = [k for k in plan.kept if k is not False]
        assert t is not None
        return weakref.ref(t)

    mid = kept()
    assert mid().numel() == 64 and mid().device == x.device  # the partial sums, not the result
    for _ in range(3):
        assert _same(flag_gems.sum(x), want)
        assert kept()() is mid()  # the same tensor, handed out again
    # Another stream: its replays keep their own tensor; the default stream's is not used there.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = flag_gems.sum(x)
        on_s = kept()
        got2 = flag_gems.sum(x)
        assert kept()() is on_s()
    torch.cuda.current_stream().wait_stream(s)
    assert _same(got, want) and _same(got2, want)
    assert on_s() is not None and mid() is None  # the first was given back to torch
    # Held elsewhere: never handed out again.
    flag_gems.sum(x)  # keeps one on this stream
    held = kept()()
    assert _same(flag_gems.sum(x), want)
    assert kept()() is not held
    del held
    # Deterministic algorithms (torch fills new memory): nothing is taken or kept.
    before = kept()
    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert _same(flag_gems.sum(x), want)
        assert kept()() is before()
    finally:
        torch.use_deterministic_algorithms(det)
    # A CUDA graph capture: nothing is taken or kept while capturing, and replays of the graph are right.
    before = kept()
    xs = x.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flag_gems.sum(xs)
    assert kept()() is before()
    xs.copy_(x * 2)
    g.replay()
    torch.cuda.synchronize()
    assert _same(out, _own(flag_gems.sum)(x * 2))
    assert _same(flag_gems.sum(x), want)
    assert kept()() is before()
    assert site.stats()["replays"] > 0


def test_flag_gems_under_use_gems_routes_aten_calls(gems_on):
    import flag_gems

    x, y = torch.randn(4096, device=DEV), torch.randn(4096, device=DEV)
    before = gems_on.report()["calls"]
    with flag_gems.use_gems():
        for _ in range(3):
            assert torch.equal(torch.add(x, y), _own(flag_gems.add)(x, y))
    assert gems_on.report()["calls"] >= before + 3


def test_flag_gems_constructors_called_with_a_layout_replay(gems_on):
    """torch passes ``layout=`` on to FlagGems' registered constructors when a caller names it: the site keys it
    (it used to fall back on every such call) and replays what FlagGems made."""
    import flag_gems

    made = []
    with flag_gems.use_gems():
        for _ in range(4):
            made.append(torch.zeros(257, device=DEV, layout=torch.strided))
            made.append(torch.ones(3, 5, device=DEV, dtype=torch.float16, layout=torch.strided))
    for i, t in enumerate(made):
        want = (
            torch.zeros(257, device=DEV) if i % 2 == 0 else torch.ones(3, 5, device=DEV, dtype=torch.float16)
        )
        assert torch.equal(t, want) and t.dtype == want.dtype and t.layout == torch.strided
    rep = gems_on.report()
    assert not any("torch.layout" in r for r in rep["fallback_reasons"]), rep["fallback_reasons"]
    from jitkey import dsl

    stats = {s.name: s.stats() for s in dsl.sites() if s.name in ("flag_gems:zeros", "flag_gems:ones")}
    assert stats and all(st["replays"] > 0 for st in stats.values()), stats


def test_flag_gems_replays_see_a_launch_hook_added_between_two_calls(gems_on):
    """A replayed ``LibEntry`` launch keeps its hook reads under the watch: ``HookChain.add`` and a hook assigned
    between two calls are seen by the second, as Triton's runner sees them; removed, no longer called."""
    import flag_gems
    from triton import knobs

    x = torch.randn(4096, device=DEV)
    for _ in range(3):
        flag_gems.sum(x)
    before = gems_on.report()["replays"]
    seen = []

    def hook(lazy):
        seen.append(lazy.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        got = flag_gems.sum(x)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    flag_gems.sum(x)
    assert [n.split("_")[0] for n in seen] == ["sum", "sum"], seen  # FlagGems' two kernels
    assert torch.equal(got, _own(flag_gems.sum)(x))
    exits = []
    old = knobs.runtime.launch_exit_hook
    knobs.runtime.launch_exit_hook = lambda lazy: exits.append(lazy.get()["name"])
    try:
        flag_gems.sum(x)
    finally:
        knobs.runtime.launch_exit_hook = old
    flag_gems.sum(x)
    assert len(exits) == 2, exits
    assert gems_on.report()["replays"] >= before + 4


def test_flag_gems_logging_runs_their_own_path(gems_on):
    import logging

    import flag_gems

    why = "FlagGems' logger would record the call (DEBUG)"
    x = torch.randn(1024, device=DEV)
    for _ in range(3):
        flag_gems.exp(x)
    lg = logging.getLogger("flag_gems.ops.exp")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    h = Keep(logging.DEBUG)
    old = lg.level, lg.propagate
    lg.setLevel(logging.DEBUG)
    lg.addHandler(h)
    try:
        before = gems_on.report()["fallback_reasons"].get(why, 0)
        flag_gems.exp(x)
        after = gems_on.report()["fallback_reasons"].get(why, 0)
        assert after == before + 1 and records, (before, after, records)  # logged as FlagGems logs it
        # What use_gems(record=True) leaves on exit: DEBUG, no handler, propagate off: nothing is recorded,
        # so the call replays.
        lg.removeHandler(h)
        lg.propagate = False
        replays = gems_on.report()["replays"]
        flag_gems.exp(x)
        assert gems_on.report()["fallback_reasons"].get(why, 0) == after
        assert gems_on.report()["replays"] > replays
    finally:
        lg.removeHandler(h)
        lg.setLevel(old[0])
        lg.propagate = old[1]


# ---------------------------------------------------------------------------------------------------------
# Native allocation (jitkey._torch_alloc): proven against torch, used by plans, degrades per call
# ---------------------------------------------------------------------------------------------------------


def _alloc():
    from jitkey import _torch_alloc

    torch.zeros(1, device=DEV)  # CUDA initialized: the proof can run
    alloc = _torch_alloc.get()
    assert alloc is not None, _torch_alloc.status()
    return alloc


def _meta(t):
    return (t.shape, t.stride(), t.dtype, t.device)


def test_plans_make_their_cuda_tensors_natively_as_torch_would():
    from jitkey import dsl

    alloc = _alloc()
    x = torch.randn(64, 33, device=DEV)

    def f(x):
        return torch.empty_like(x), torch.empty((5,), dtype=torch.float16, device=x.device)

    _, plan, why = dsl.record(f, (x,))
    assert why is None, why
    assert [k for k, _ in plan.steps] == ["empty_like", "empty"]

    def g(x):  # sizes as a list (Helion writes `torch.empty([m], ...)`), items read from the keyed shape
        m, n = x.size()
        return torch.empty([m, n], dtype=x.dtype, device=x.device)

    _, gplan, why = dsl.record(g, (x,))
    assert why is None, why
    assert [k for k, _ in gplan.steps] == ["empty"]
    made = gplan(x)
    assert _meta(made) == _meta(x)
    wide = torch.randn(8, 8, device=DEV)
    for t in (
        x,
        x.t(),
        wide[:, :4],
        torch.empty(0, 3, device=DEV),
        torch.randn(3, device=DEV, dtype=torch.bfloat16),
    ):
        out, mid = plan(t)
        want = torch.empty_like(t)  # the non-dense slice takes torch's own function, per call
        assert type(out) is torch.Tensor and not out.requires_grad
        assert _meta(out) == _meta(want)
        assert (mid.shape, mid.stride(), mid.dtype, mid.device) == ((5,), (1,), torch.float16, x.device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    outs = [plan(x) for _ in range(50)]
    assert torch.cuda.memory_allocated() > before
    del outs
    assert torch.cuda.memory_allocated() == before  # given back: no reference leaked
    assert not alloc.failed


def test_empty_like_that_changes_only_the_dtype_is_native():
    """FlagGems writes ``torch.empty_like(x, dtype=..., device=x.device)``: keyword arguments that change nothing
    but the dtype keep the native step (with that dtype); any other (another device, a memory format) calls
    torch's function. Every replay's tensors match torch's, for layouts the recording never saw too."""
    from jitkey import dsl

    alloc = _alloc()
    x = torch.randn(64, 33, device=DEV)

    def f(x):
        return (
            torch.empty_like(x, dtype=torch.float16, device=x.device),
            torch.empty_like(x, dtype=x.dtype),
            torch.empty_like(x, device=torch.device("cpu")),
            torch.empty_like(x, memory_format=torch.contiguous_format),
        )

    _, plan, why = dsl.record(f, (x,))
    assert why is None, why
    assert [k for k, _ in plan.steps] == ["empty_like", "empty_like", "call", "call"]
    wide = torch.randn(8, 8, device=DEV)
    # Layouts the recording did not see (a plan replays only for its own key, but the native step reads the
    # layout of the tensor it is given, and falls back to torch for one that is not dense).
    for t in (
        x,
        x.t(),
        wide[:, :4],
        torch.empty(0, 3, device=DEV),
        torch.randn(2, 3, 4, device=DEV)[:, :, ::2],
    ):
        for got, want in zip(plan(t), f(t), strict=True):
            assert type(got) is torch.Tensor and not got.requires_grad
            assert _meta(got) == _meta(want)
    made = alloc.empty_like(x.t(), "bfloat16")
    assert (made.shape, made.stride(), made.dtype) == (x.t().shape, x.t().stride(), torch.bfloat16)
    with pytest.raises(ValueError, match="names no dtype"):
        alloc.empty_like(x, "float128")
    assert not alloc.failed


def test_native_allocation_is_proven_in_a_process_that_has_keyed_nothing_yet():
    """The proof reads tensors through the calibrated tensor layout, which only a compiled tensor rule used to
    install: a process whose first use of jitkey is an allocation (no Signature yet) turned it off for good."""
    code = (
        "import torch\n"
        "from jitkey import _torch_alloc, _tensor_fields\n"
        "torch.zeros(1, device='cuda')\n"
        "assert _tensor_fields.status() is None\n"
        "assert _torch_alloc.get() is not None, _torch_alloc.status()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_native_allocation_fills_memory_under_deterministic_algorithms():
    alloc = _alloc()
    det, fill = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        t = alloc.empty_strided([1024], [1], "float32", torch.cuda.current_device())
        u = alloc.empty_like(torch.randn(256, device=DEV))
        i = alloc.empty_strided([16], [1], "int32", torch.cuda.current_device())
        assert (
            torch.isnan(t).all() and torch.isnan(u).all()
        )  # torch's CUDA factory filled them, as for torch.empty
        assert (i == torch.iinfo(torch.int32).max).all()
    finally:
        torch.use_deterministic_algorithms(det)
        torch.utils.deterministic.fill_uninitialized_memory = fill
