"""GPU tests of jitkey.triton (every test is marked ``cuda`` and skipped without a CUDA GPU).

Each compares the jitkey launch with plain Triton on the same JITFunction: numerical results, the kernels
chosen (the entries in Triton's own kernel cache ``jit_fn.device_caches[dev][0]``), streams, CUDA graphs and
the globals check.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

import jitkey.triton as jt  # noqa: E402
from jitkey.errors import GlobalsChangedError  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GLOBAL_ADD = tl.constexpr(1)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def add_kernel_align(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def copy2d_kernel(src, dst, M, N, s_m, s_n, d_m, d_n, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    rn = tl.program_id(1) * BN + tl.arange(0, BN)[None, :]
    mask = (rm < M) & (rn < N)
    tl.store(dst + rm * d_m + rn * d_n, tl.load(src + rm * s_m + rn * s_n, mask=mask), mask=mask)


@triton.jit
def row_sum_kernel(x, out, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x + row * stride + offs, mask=offs < N, other=0.0)
    tl.store(out + row, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["n", "k"])
def axpb_kernel(x, out, n, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 2 + k, mask=mask)


@triton.jit
def int_arg_kernel(x, out, n, v, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + v, mask=mask)


@triton.jit
def global_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + GLOBAL_ADD, mask=mask)


def _triton_cache(fn):
    return fn.device_caches[torch.cuda.current_device()][0]


def _grid1(n, block):
    return (triton.cdiv(n, block),)


def test_vector_add_matches_triton():
    kernel = jt.bind(add_kernel)
    for i, n in enumerate((1000, 4096, 4096, 1000, 77)):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        ours, theirs = torch.empty_like(x), torch.empty_like(x)
        kernel[_grid1(n, 256)](x, y, ours, n, BLOCK=256)
        add_kernel[_grid1(n, 256)](x, y, theirs, n, BLOCK=256)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(ours, x + y)
        assert kernel.cache_stats()["fallbacks"] == 0, i
    stats = kernel.cache_stats()
    assert stats["hits"] >= 2 and stats["misses"] >= 1


def test_callable_grid_gets_meta():
    kernel = jt.bind(add_kernel)
    n = 3000
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    seen = []

    def grid(meta):
        seen.append(sorted(meta))
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    for _ in range(3):
        out.zero_()
        kernel[grid](x, y, out, n, BLOCK=512)
        torch.testing.assert_close(out, x + y)
    assert seen[-1] == sorted(["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK"])


def test_strided_copy_2d_matches_triton():
    kernel = jt.bind(copy2d_kernel)
    for shape, transpose in (((300, 200), False), ((300, 200), True), ((64, 48), True), ((300, 200), False)):
        src = torch.randn(*shape, device="cuda")
        src = src.t() if transpose else src
        m, n = src.shape
        ours = torch.empty(m, n, device="cuda")
        theirs = torch.empty(m, n, device="cuda")
        grid = (triton.cdiv(m, 32), triton.cdiv(n, 32))
        args = (m, n, src.stride(0), src.stride(1), ours.stride(0), ours.stride(1))
        kernel[grid](src, ours, *args, BM=32, BN=32)
        copy2d_kernel[grid](src, theirs, *args, BM=32, BN=32)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(ours, src)
    assert kernel.cache_stats()["fallbacks"] == 0


def test_reduction_with_constexpr_block():
    kernel = jt.bind(row_sum_kernel)
    x = torch.randn(64, 1000, device="cuda")
    for block in (128, 256, 128, 1024, 256):
        ours = torch.empty(64, device="cuda")
        theirs = torch.empty(64, device="cuda")
        kernel[(64,)](x, ours, 1000, x.stride(0), BLOCK=block)
        row_sum_kernel[(64,)](x, theirs, 1000, x.stride(0), BLOCK=block)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(ours, x.sum(1), rtol=1e-4, atol=1e-3)
    stats = kernel.cache_stats()
    assert stats["entries"] == 3 and stats["hits"] == 2 and stats["fallbacks"] == 0


def test_do_not_specialize():
    kernel = jt.bind(axpb_kernel)
    x = torch.randn(2048, device="cuda")
    for n, k in ((2048, 1), (2048, 16), (1000, 17), (16, 3)):
        ours = torch.zeros_like(x)
        theirs = torch.zeros_like(x)
        kernel[_grid1(n, 256)](x, ours, n, k, BLOCK=256)
        axpb_kernel[_grid1(n, 256)](x, theirs, n, k, BLOCK=256)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert len(_triton_cache(axpb_kernel)) == 1
    stats = kernel.cache_stats()
    assert stats["entries"] == 1 and stats["misses"] == 1 and stats["hits"] == 3


def test_misaligned_view_gets_its_own_kernel():
    kernel = jt.bind(add_kernel_align)
    n = 4096
    x, y = torch.randn(n + 1, device="cuda"), torch.randn(n + 1, device="cuda")
    out = torch.empty(n + 1, device="cuda")
    ck_aligned = kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    torch.testing.assert_close(out[:n], x[:n] + y[:n])
    ck_mis = kernel[_grid1(n, 256)](x[1:], y[1:], out[1:], n, BLOCK=256)
    torch.testing.assert_close(out[1:], x[1:] + y[1:])
    assert ck_mis is not ck_aligned
    assert len(_triton_cache(kernel)) == 2
    assert kernel.cache_stats()["entries"] == 2
    # and the hits go to the matching kernel
    assert kernel[_grid1(n, 256)](x[1:], y[1:], out[1:], n, BLOCK=256) is ck_mis
    assert kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256) is ck_aligned


def test_int_and_bool_specializations_match_triton():
    kernel = jt.bind(int_arg_kernel)
    x = torch.arange(1024, device="cuda", dtype=torch.int64)
    chosen = {}
    for v in (1, 16, 17, 2**31, True, False, 1, 32, 33, 2**31 + 16, True):
        out = torch.empty_like(x)
        ck = kernel[(4,)](x, out, 1024, v, BLOCK=256)
        torch.testing.assert_close(out, x + int(v))
        chosen.setdefault(ck, set()).add(repr(v))
    triton_entries = len(_triton_cache(kernel))
    assert triton_entries == 5  # 1 | 16,32 | 17,33 | 2**31(+16) | bools
    assert len(chosen) == triton_entries  # the same kernels Triton picks, split exactly where Triton splits
    stats = kernel.cache_stats()
    # the native rules may key bools by value: finer (one more entry), never another kernel
    assert triton_entries <= stats["entries"] <= triton_entries + 1
    assert kernel.cache_stats()["fallbacks"] == 0


def test_side_stream_context():
    kernel = jt.bind(add_kernel)
    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    y = torch.ones(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)  # warm: the next launches are hits
    hits = kernel.cache_stats()["hits"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps s busy; a launch on another stream would run first
        x.fill_(1.0)
        kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert kernel.cache_stats()["hits"] == hits + 1
    torch.testing.assert_close(out, torch.full_like(out, 2.0))


def test_cuda_graph_capture():
    kernel = jt.bind(add_kernel)
    n = 4096
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)  # compile outside the capture
    torch.cuda.synchronize()
    hits = kernel.cache_stats()["hits"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    assert kernel.cache_stats()["hits"] == hits + 1
    for _ in range(2):
        x.copy_(torch.randn(n, device="cuda"))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x + y)


def test_launch_hooks_see_launches():
    kernel = jt.bind(add_kernel)
    n = 1024
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    seen = []

    def hook(lazy):
        seen.append(lazy.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    assert seen == ["add_kernel"]


def test_globals_changed_since_compile_raise():
    global GLOBAL_ADD
    kernel = jt.bind(global_kernel)
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    kernel[(4,)](x, out, 1024, BLOCK=256)
    kernel[(4,)](x, out, 1024, BLOCK=256)
    torch.testing.assert_close(out, x + 1)
    global_kernel[(4,)](x, out, 1024, BLOCK=256)  # plain Triton compiles it too
    old = GLOBAL_ADD
    try:
        GLOBAL_ADD = tl.constexpr(2)
        with pytest.raises(RuntimeError, match="GLOBAL_ADD"):
            global_kernel[(4,)](x, out, 1024, BLOCK=256)  # Triton raises ...
        with pytest.raises(GlobalsChangedError, match="GLOBAL_ADD"):
            kernel[(4,)](x, out, 1024, BLOCK=256)  # ... and so does the jitkey hit path
    finally:
        GLOBAL_ADD = old
    kernel[(4,)](x, out, 1024, BLOCK=256)
    torch.testing.assert_close(out, x + 1)


def test_pre_run_hook_falls_back_and_runs():
    kernel = jt.bind(add_kernel)
    n = 1024
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    calls = []
    kernel.add_pre_run_hook(lambda *a, **k: calls.append(len(a)))
    try:
        kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    finally:
        kernel.pre_run_hooks.clear()
    assert calls == [4]
    torch.testing.assert_close(out, x + y)
    assert kernel.cache_stats()["fallback_reasons"] == {"pre_run_hooks": 1}


def test_autotune_over_jitkey_kernel():
    @triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"])
    @jt.jit
    def at_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    n = 5000
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    for _ in range(3):
        out = torch.empty_like(x)
        at_add[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out, n)
        torch.testing.assert_close(out, x + y)
    stats = at_add.fn.cache_stats()
    assert stats["fallbacks"] == 0 and stats["hits"] >= 2


def test_autotune_over_a_jitkey_kernel_uses_the_fast_path():
    @triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"])
    @jt.jit
    def at_add2(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    with pytest.raises(TypeError, match="under the decorator"):
        jt.bind(at_add2)
    n = 1000
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    for _ in range(3):
        out = torch.full_like(x, float("nan"))
        at_add2[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out, n)
        torch.testing.assert_close(out, x + y)
    stats = at_add2.fn.cache_stats()
    assert stats["fallbacks"] == 0 and stats["hits"] >= 2, stats


def test_cpu_tensor_rejected_like_triton():
    kernel = jt.bind(add_kernel)
    n = 256
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[(1,)](x, y, out, n, BLOCK=256)
    with pytest.raises(ValueError, match="cpu tensor"):
        kernel[(1,)](x.cpu(), y, out, n, BLOCK=256)  # a hit: Triton's launcher checks the pointer


# --- drop-in: helpers, Triton's own objects as arguments, torch.compile -------------------------------------


@jt.jit
def _dropin_helper(x):
    return x * 2 + 1


@jt.jit
def _dropin_caller(x_ptr, out_ptr, n, OUT_DTYPE: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = ACT(tl.load(x_ptr + offs, mask=mask))
    tl.store(out_ptr + offs, v.to(OUT_DTYPE), mask=mask)


@jt.jit
def _dropin_desc(in_desc, out_desc, BM: tl.constexpr, BN: tl.constexpr):
    m = tl.program_id(0) * BM
    tile = in_desc.load([m, 0])
    out_desc.store([m, 0], tile + 1)


@jt.jit
def _dropin_reinterpret(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def test_dropin_helpers_and_dtype_constexprs_hit():
    """A jitkey helper passed as a constexpr and tl.dtype constexpr arguments take the fast path."""
    x = torch.randn(1000, device="cuda")
    for dt, torch_dt in ((tl.float32, torch.float32), (tl.float16, torch.float16)):
        out = torch.empty(1000, device="cuda", dtype=torch_dt)
        for _ in range(3):
            out.fill_(float("nan"))
            _dropin_caller[(4,)](x, out, 1000, dt, _dropin_helper, BLOCK=256)
            torch.testing.assert_close(out, (x * 2 + 1).to(torch_dt))
    stats = _dropin_caller.cache_stats()
    assert stats["fallbacks"] == 0 and stats["hits"] == 4 and stats["misses"] == 2, stats


def test_dropin_tensor_descriptor_and_reinterpret_hit():
    from triton.tools.tensor_descriptor import TensorDescriptor

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("host TensorDescriptors need Hopper or newer")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    a = torch.randn(256, 64, device="cuda")
    out = torch.empty_like(a)
    for _ in range(3):
        out.fill_(float("nan"))
        ind, outd = TensorDescriptor.from_tensor(a, [64, 64]), TensorDescriptor.from_tensor(out, [64, 64])
        _dropin_desc[(4,)](ind, outd, BM=64, BN=64)
        torch.testing.assert_close(out, a + 1)
    assert _dropin_desc.cache_stats()["fallbacks"] == 0 and _dropin_desc.cache_stats()["hits"] == 2
    raw = torch.arange(512, device="cuda", dtype=torch.int16)
    dst = torch.empty(512, device="cuda", dtype=torch.int16)
    for _ in range(3):
        dst.zero_()
        _dropin_reinterpret[(2,)](
            triton.reinterpret(raw, tl.float16), triton.reinterpret(dst, tl.float16), 512, 256
        )
        assert torch.equal(dst, raw)
    assert (
        _dropin_reinterpret.cache_stats()["fallbacks"] == 0 and _dropin_reinterpret.cache_stats()["hits"] == 2
    )


def _graph_breaks(fn, *args):
    import torch._dynamo

    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args)


@jt.jit
def _dropin_helper_jk(x):
    return x * 2 + 1


@triton.jit
def _dropin_helper_plain(x):
    return x * 2 + 1


@pytest.mark.parametrize("which", ["simple", "constexpr objects"])
def test_torch_compile_fullgraph_without_graph_breaks(which):
    """torch.compile treats a jitkey kernel as a user-defined Triton kernel, exactly as it treats the plain
    Triton kernel of the same function (graphs and graph breaks); with plain arguments: no graph break,
    fullgraph works, the result is right."""
    import torch._dynamo

    def make(kernel, helper):
        def simple(x, y):
            out = torch.empty_like(x)
            n = x.numel()
            kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
            return out + 1

        def objects(x, y):
            out = torch.empty_like(x)
            n = x.numel()
            kernel[(triton.cdiv(n, 256),)](x, out, n, tl.float32, helper, BLOCK=256)
            return out + y

        return simple if which == "simple" else objects

    fn = add_kernel.fn if which == "simple" else _dropin_caller.fn
    plain_f = make(triton.jit(fn), _dropin_helper_plain)
    jk_f = make(jt.jit(fn), _dropin_helper_jk)
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    want = x + y + 1 if which == "simple" else x * 2 + 1 + y
    plain = _graph_breaks(plain_f, x, y)
    ours = _graph_breaks(jk_f, x, y)
    assert (ours.graph_count, ours.graph_break_count) == (plain.graph_count, plain.graph_break_count)
    if which == "simple":
        assert ours.graph_count == 1 and ours.graph_break_count == 0, ours
        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            got = torch.compile(jk_f, fullgraph=True, backend=backend)(x, y)
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(jk_f, backend="eager")(x, y), want)


# --- jitkey's own launch (cuLaunchKernelEx from Rust, issue: launch below CompiledKernel.run) ---------------


def _driver_on() -> bool:
    return jt.fast_paths()["driver_launch"]["on"]


def _driver_launches(kernel) -> int:
    return kernel.cache_stats()["driver_launches"]


@triton.jit
def typed_kernel(
    out,
    a: tl.int8,
    b: tl.int16,
    c: tl.int32,
    d: tl.int64,
    e: tl.uint8,
    f: tl.uint16,
    g: tl.uint32,
    h: tl.uint64,
    i: tl.float16,
    j: tl.bfloat16,
    k: tl.float32,
    m: tl.float64,
    flag,
    x,
    y,
    BLOCK: tl.constexpr,
):
    tl.store(out + 0, a.to(tl.float64))
    tl.store(out + 1, b.to(tl.float64))
    tl.store(out + 2, c.to(tl.float64))
    tl.store(out + 3, d.to(tl.float64))
    tl.store(out + 4, e.to(tl.float64))
    tl.store(out + 5, f.to(tl.float64))
    tl.store(out + 6, g.to(tl.float64))
    tl.store(out + 7, h.to(tl.float64))
    tl.store(out + 8, i.to(tl.float64))
    tl.store(out + 9, j.to(tl.float64))
    tl.store(out + 10, k.to(tl.float64))
    tl.store(out + 11, m)
    tl.store(out + 12, flag.to(tl.float64))
    tl.store(out + 13, x.to(tl.float64))
    tl.store(out + 14, y)
    tl.store(out + 15, (a + c + d).to(tl.float64))


_TYPED_VALUES = [
    (
        3,
        -7,
        100_000,
        -(2**40),
        200,
        65_000,
        4_000_000_000,
        2**63 + 5,
        1.5,
        -2.25,
        3.125,
        1e-300,
        True,
        7,
        0.1,
    ),
    (255, 32_767, -(2**31), 2**63 - 1, 0, 1, 7, 0, 65504.0, 1e38, -1e-40, -0.0, False, -3, -1e200),
    (17, -32_768, 16, 32, 16, 48, 64, 2**64 - 1, 6.1e-5, 3, 16, 2**53 + 1, True, 2**40, 5),
]


def test_driver_launch_packs_every_type_like_triton():
    if not _driver_on():
        pytest.skip(f"driver launch off: {jt.fast_paths()['driver_launch']['why']}")
    kernel = jt.bind(typed_kernel)
    for vals in _TYPED_VALUES:
        ref = torch.full((16,), float("nan"), device="cuda", dtype=torch.float64)
        typed_kernel[(1,)](ref, *vals, BLOCK=16)  # plain Triton
        for _ in range(2):  # the first call may be a miss (Triton's path); the second is a hit
            got = torch.full_like(ref, float("nan"))
            kernel[(1,)](got, *vals, BLOCK=16)
            torch.cuda.synchronize()
            assert torch.equal(got.view(torch.int64), ref.view(torch.int64)), (vals, got, ref)
    assert _driver_launches(kernel) >= len(_TYPED_VALUES)


def test_driver_launch_declines_what_triton_rejects_and_raises_the_same():
    kernel = jt.bind(typed_kernel)
    out = torch.empty(16, device="cuda", dtype=torch.float64)
    good = list(_TYPED_VALUES[0])
    kernel[(1,)](out, *good, BLOCK=16)
    kernel[(1,)](out, *good, BLOCK=16)
    for pos, bad in (
        (0, -1),
        (8, 1e6),
        (1, 2**20),
    ):  # i8 < 0 and i16 overflow raise in Triton 3.6; fp16 overflows
        vals = list(good)
        vals[pos] = bad
        with pytest.raises(Exception) as plain_err:
            typed_kernel[(1,)](out, *vals, BLOCK=16)
        with pytest.raises(type(plain_err.value)) as jk_err:
            kernel[(1,)](out, *vals, BLOCK=16)
        assert str(jk_err.value) == str(plain_err.value)
    if _driver_on():
        reasons = kernel.cache_stats()["launcher_reasons"]
        assert set(reasons) <= {
            "an integer argument is not an int in its type's range",
            "a float argument is NaN, or too large for its float type (or an int too large for a double)",
        }, reasons


def test_driver_launch_error_is_tritons_error():
    kernel = jt.bind(add_kernel)
    n = 256
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[(1,)](x, y, out, n, BLOCK=256)
    before = _driver_launches(kernel)
    with pytest.raises(RuntimeError) as plain_err:
        add_kernel[(1, 70_000, 1)](x, y, out, n, BLOCK=256)  # gridDim.y > 65535: the driver refuses
    with pytest.raises(RuntimeError) as jk_err:
        kernel[(1, 70_000, 1)](x, y, out, n, BLOCK=256)
    assert str(jk_err.value) == str(plain_err.value)
    assert "Triton Error [CUDA]" in str(jk_err.value)
    kernel[(1,)](x, y, out, n, BLOCK=256)  # the context is fine afterwards
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
    if _driver_on():
        assert _driver_launches(kernel) == before + 1  # the failed launch is not counted as launched


def test_driver_launch_streams_graphs_and_hooks():
    if not _driver_on():
        pytest.skip(f"driver launch off: {jt.fast_paths()['driver_launch']['why']}")
    kernel = jt.bind(add_kernel)
    n = 1 << 16
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)
    before = _driver_launches(kernel)
    # a side stream: the launch is ordered after the sleep on that stream
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        out.zero_()
        kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
    # graph capture and replay
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)
    for _ in range(2):
        x.copy_(torch.randn(n, device="cuda"))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x + y)
    # Proton-style hooks: enter and exit, in order, with the launch metadata
    events = []
    enter = lambda md: events.append(("enter", md.get()["name"], md.get()["stream"]))  # noqa: E731
    leave = lambda md: events.append(("exit", md.get()["name"]))  # noqa: E731
    knobs.runtime.launch_enter_hook.add(enter)
    knobs.runtime.launch_exit_hook.add(leave)
    try:
        kernel[_grid1(n, 1024)](x, y, out, n, BLOCK=1024)
    finally:
        knobs.runtime.launch_enter_hook.remove(enter)
        knobs.runtime.launch_exit_hook.remove(leave)
    stream = torch.cuda.current_stream().cuda_stream
    assert events == [("enter", "add_kernel", stream), ("exit", "add_kernel")]
    assert _driver_launches(kernel) == before + 3


# -- the watched state and the device/stream read through torch's C shim (issue 26) ---------------------------


def _native() -> Any:
    from jitkey.triton import _installed

    rt = _installed.get_runtime()
    assert rt is not None
    return rt


def test_native_current_is_proven_and_follows_torch():
    """On a GPU with torch 2.11 the shim is proven at the first launch and then reads exactly what torch's
    getters read: under side streams of either priority, during CUDA-graph capture, and on each device."""
    kernel = jt.bind(add_kernel)
    n = 1024
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
    rt = _native()
    if rt.native_problem == "JITKEY_NATIVE_CURRENT=0":
        pytest.skip("JITKEY_NATIVE_CURRENT=0")
    assert rt.native is not None, rt.native_problem
    assert kernel._jk_launcher.native_current
    assert jt.fast_paths()["native_current"]["on"] is True
    shim = rt.native
    get_device, get_stream = torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream
    dev = get_device()
    for s in (torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream(priority=-1)):
        with torch.cuda.stream(s):
            assert (
                (shim.device(), shim.stream(dev)) == (get_device(), get_stream(dev)) == (dev, s.cuda_stream)
            )
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(g, stream=side):
        x.add_(0)
        assert shim.stream(dev) == get_stream(dev) == side.cuda_stream
    for d in range(torch.cuda.device_count()):
        with torch.cuda.device(d):
            s = torch.cuda.Stream()
            assert shim.device() == get_device() == d
            with torch.cuda.stream(s):
                assert shim.stream(d) == get_stream(d) == s.cuda_stream
    assert not shim.failed


def test_hits_on_every_device():
    """Each device gets its own kernel (Triton's, from that device's cache) and the hit launches on it."""
    kernel = jt.bind(add_kernel)
    n = 4096
    for d in range(torch.cuda.device_count()):
        with torch.cuda.device(d):
            x, y = torch.randn(n, device=f"cuda:{d}"), torch.randn(n, device=f"cuda:{d}")
            out = torch.empty(n, device=f"cuda:{d}")
            ck = kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256)
            out.zero_()
            assert kernel[_grid1(n, 256)](x, y, out, n, BLOCK=256) is ck
            torch.cuda.synchronize()
            torch.testing.assert_close(out, x + y)
            assert dict.get(kernel.device_caches, d)[0]  # Triton holds it for this device
    assert kernel.cache_stats()["fallbacks"] == 0


def test_a_knob_flipped_between_two_launches_gets_tritons_kernel_for_it():
    """knobs.runtime.debug flipped between two launches: the second launches the kernel Triton compiles for the
    new value (its metadata says so, as plain Triton's does), kept until the knob is flipped back."""
    kernel = jt.bind(add_kernel)
    n = 1024
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    grid = _grid1(n, 256)
    plain = add_kernel[grid](x, y, out, n, BLOCK=256)
    first = kernel[grid](x, y, out, n, BLOCK=256)
    assert kernel[grid](x, y, out, n, BLOCK=256) is first and not first.metadata.debug
    with knobs.runtime.scope():
        knobs.runtime.debug = True
        debug = kernel[grid](x, y, out, n, BLOCK=256)
        assert debug is not first and debug.metadata.debug
        assert kernel[grid](x, y, out, n, BLOCK=256) is debug  # reads the state again (after a miss)
        assert kernel[grid](x, y, out, n, BLOCK=256) is debug  # served by the kept state
        assert add_kernel[grid](x, y, out, n, BLOCK=256).metadata.debug  # plain Triton agrees
    assert kernel[grid](x, y, out, n, BLOCK=256) is first
    assert add_kernel[grid](x, y, out, n, BLOCK=256) is plain
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
    ws = kernel.cache_stats()["watched_state"]
    if jt.fast_paths()["watched_state"]["on"]:
        assert ws["unwatched"] is None and ws["watched"] >= 2, ws


# -- the data pointers read while keying are the ones launched (issue 26) --------------------------------------


@pytest.mark.parametrize("nptr", [40, 70])  # inline slots up to 64 parameters; beyond, the heap path
def test_wide_kernels_launch_the_pointers_of_this_call(nptr, tmp_path):
    """A hit packs the data pointers its key read. Every call here passes other tensors (views at other
    offsets of other storages), through each kind of grid; a grid function that moves an argument's storage
    (``set_``) runs before the packing, so the launch must use the moved pointer, as Triton's does."""
    from jitkey.triton_bench import _add_kernel

    plain = _add_kernel(nptr, str(tmp_path))
    kernel = jt.bind(plain)
    n = 4096

    def fresh() -> list[Any]:
        # views into a larger buffer at a 16-byte-aligned offset (the key's alignment bucket stays the same)
        return [torch.randn(n + 4 * nptr, device="cuda")[4 * k :][:n] for k in range(nptr - 1)]

    def check(ins: list[Any], out: Any) -> None:
        torch.cuda.synchronize()
        ref = ins[0].clone()
        for t in ins[1:]:
            ref += t
        torch.testing.assert_close(out, ref)

    def moving(meta: dict[str, Any]) -> tuple[int]:
        # replaces the first input's storage with a new one of other values, before the launch packs it
        ins0 = meta["p0"]
        ins0.set_(torch.randn(n, device="cuda").untyped_storage(), 0, (n,))
        return (triton.cdiv(n, meta["BLOCK"]),)

    grids = [
        lambda ins: (triton.cdiv(n, 1024),),
        lambda ins: [triton.cdiv(n, 1024)],
        lambda ins: lambda meta: (triton.cdiv(n, meta["BLOCK"]),),
        lambda ins: moving,
    ]
    for _ in range(3):
        for make_grid in grids:
            ins, out = fresh(), torch.full((n,), float("nan"), device="cuda")
            kernel[make_grid(ins)](*ins, out, n, BLOCK=1024)
            check(ins, out)
    assert kernel.cache_stats()["fallbacks"] == 0
    if _driver_on():
        assert _driver_launches(kernel) >= 3 * len(grids) - 1
