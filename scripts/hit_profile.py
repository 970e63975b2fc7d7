"""A warm ``kernel[grid](...)`` hit on a machine without a GPU, through jitkey's own launch, for timing and profiling.

The launch is real up to the driver: a Triton ``CudaLauncher`` of the installed Triton and the ``_LaunchPlan`` jitkey
makes for it, packing the parameters and calling ``cuLaunchKernelEx`` of a stand-in ``libcuda.so.1``
(tests/data/standin_cuda.c, which records the launch). Triton's own path (the miss) is faked; pointer parameters
are passed as ints (a CPU tensor would be declined); the device and stream getters are C builtins returning 0,
like torch's ``_cuda_getDevice``/``_cuda_getCurrentRawStream`` (``native``: torch's C shim, the stand-in of
tests/data/standin_torch.c, instead).

    cc -shared -fPIC -O1 -I<triton>/backends/nvidia/include tests/data/standin_cuda.c -o /tmp/sl/libcuda.so.1
    cc -shared -fPIC -O1 tests/data/standin_torch.c -o /tmp/sl/libstandin_torch.so
    LD_LIBRARY_PATH=/tmp/sl TRITON_LIBCUDA_PATH=/tmp/sl python scripts/hit_profile.py NPTR [kw|kwsite] [native]

``NPTR`` pointers (``NPTR + 2`` arguments); ``kw``: three launch options passed as ``**kw`` (a fresh keyword
tuple per call); ``kwsite``: the same options written at the call site (one constant tuple; NPTR 2 only);
``native``: the device and stream through the stand-in shim; ``compiled``: the same kernel launched as a DSL
plan's compiled step (``_CompiledLaunch((1, 1, 1), *args)``, what FlagGems' ``LibEntry`` launches); ``tensors``:
the pointers are CPU tensors marked as tensors of CUDA device 0 in their ``TensorImpl`` (the device field of
``jitkey._tensor_fields``, restored before exit), so that the key and the packing take the path of real CUDA tensors
(nothing is ever launched on a device: the stand-in driver only records). Prints the minimum and median over 9 loops of ``N``
(env, default 100,000) hits, ns per hit. Instructions per hit, independent of a noisy machine::

    valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect=_core::fastcall::entry python scripts/hit_profile.py 2

(with an unstripped ``_core``: ``cargo build --release -p jitkey-py`` and its ``lib_core.so`` as
``jitkey/_core.abi3.so``), the collected total divided by ``9 * N + 1``.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _driver_launch_child as child
import jitkey.triton as jt
from jitkey.triton import _installed


def kernel(nptr: int) -> Any:
    names = [f"p{i}" for i in range(nptr)] + ["n"]
    path = Path(tempfile.mkdtemp()) / f"hit_profile_{nptr}.py"
    path.write_text(
        f"import triton.language as tl\n\n\ndef kern({', '.join(names)}, BLOCK: tl.constexpr):\n    pass\n"
    )
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return jt.jit(mod.kern)


class CompiledKernel:
    """What a miss hands jitkey: the launcher, the function handle, the metadata (weak-referenceable, as
    Triton's: jitkey keeps the launch plan per compiled kernel)."""

    def __init__(self, run: Any) -> None:
        self.run, self.function, self.packed_metadata, self.src = run, child.FUNCTION, (4, 1, 0), run.jk_src

    def launch_metadata(self, *args: Any) -> None:
        return None


def _set_device(t: Any, tf: Any, raw: bytes) -> None:
    """Writes the three bytes of ``t``'s ``TensorImpl`` device field (profiling only; see ``tensors``)."""
    impl = int.from_bytes(ctypes.string_at(id(t) + tf.PYOBJ_TENSORIMPL, 8), "little")
    ctypes.memmove(impl + tf.IMPL_DEVICE, raw, 3)


def main() -> None:
    nptr, flags = int(sys.argv[1]), set(sys.argv[2:])
    k = kernel(nptr)
    rt = types.SimpleNamespace(get_device=int, get_stream=abs, native=None, native_problem="hit_profile")
    if "native" in flags:
        from jitkey._core import _TorchCurrent

        lib = os.path.join(os.environ["LD_LIBRARY_PATH"].split(":")[0], "libstandin_torch.so")
        rt.native = _TorchCurrent(lib, lib, loaded_only=False)
        ctypes.CDLL(lib).standin_set(0, ctypes.c_void_p(0))
    _installed.runtime = rt  # type: ignore[assignment]
    sig = {f"p{i}": "*fp32" for i in range(nptr)} | {"n": "i32", "BLOCK": "constexpr"}
    run = child.runner(sig, (4, 1, 0, False, False), "")
    child.expect(sig)
    ck = CompiledKernel(run)

    def triton_run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        dict.setdefault(k.device_caches, 0, ({}, {}, None, None, None))[0]["key"] = ck
        return ck

    k._jk_triton_run = triton_run
    marked: list[Any] = []
    if "tensors" in flags:
        import torch

        from jitkey import _tensor_fields as tf

        marked = [torch.empty(1024, dtype=torch.float32) for _ in range(nptr)]
        for t in marked:
            _set_device(t, tf, b"\x01\x00\x01")  # CUDA (c10::DeviceType 1), index 0, has_value
        a = (*marked, 4096, 64)
    else:
        a = (*(0x10000 * (i + 1) for i in range(nptr)), 4096, 64)
    kw = {"num_warps": 4, "num_stages": 2, "maxnreg": 128} if flags & {"kw", "kwsite"} else {}
    k[(1,)](*a, **kw)  # the miss builds the launcher; from now on k[grid] is C
    f = k[(1,)]
    if "compiled" in flags:  # a DSL plan's compiled step (FlagGems' LibEntry launch) of the same kernel
        from triton import knobs
        from triton.knobs import HookChain

        from jitkey._core import _CompiledLaunch, _TritonEntry
        from jitkey.triton import _watch

        plan, why = _installed.launch_plan(ck, ck.run, nptr + 2)
        assert plan is not None, why
        entry = _TritonEntry(ck, ck.run, ck.function, ck.packed_metadata, None, None, plan)
        cl = _CompiledLaunch(entry, rt, knobs, HookChain, _watch.hook_watch(knobs.runtime), 0, [])
        grid = (1, 1, 1)
        f = functools.partial(cl, grid)
        assert not kw, "compiled: no launch options"
    f(*a, **kw)
    n = int(os.environ.get("N", "100000"))

    def loop() -> float:
        perf = time.perf_counter
        t0 = perf()
        if "kwsite" in flags:
            a0, a1, a2, a3 = a
            for _ in range(n):
                f(a0, a1, a2, a3, num_warps=4, num_stages=2, maxnreg=128)
        elif kw:
            for _ in range(n):
                f(*a, **kw)
        else:
            for _ in range(n):
                f(*a)
        return (perf() - t0) / n * 1e9

    before = child.lib.standin_launches()
    res = [loop() for _ in range(9)]
    st = k.cache_stats()
    assert child.lib.standin_launches() - before == 9 * n, "every hit launched through the stand-in"
    assert "compiled" in flags or (st["fallbacks"] == 0 and st["driver_launches"] >= 9 * n), st
    if marked:
        from jitkey import _tensor_fields as tf

        for t in marked:
            _set_device(t, tf, b"\x00\xff\x01")  # back to the CPU device (index -1) before torch frees them
    print(
        f"{nptr + 2} args {' '.join(sorted(flags))}: min {min(res):.0f} ns, median {statistics.median(res):.0f} ns"
        f" per hit; watched state {st.get('watched_state')}"
    )


if __name__ == "__main__":
    main()
