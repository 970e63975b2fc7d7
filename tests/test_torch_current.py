"""The current device and stream through torch's stable C shim (``jitkey._core._TorchCurrent``,
jitkey/_torch_current.py): resolution from the libraries, the proof against the Python getters, the fallback
when the symbols are absent or the proof fails, and hits that read through it (no GPU: the shim is the stand-in
of tests/data/standin_torch.c, the launch the recording stand-in of tests/test_triton_cpu.py). On a GPU,
tests/test_triton_gpu.py proves the real shim against torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

import jitkey.triton as jt  # noqa: E402
import test_triton_cpu as cpu  # noqa: E402
from jitkey import _torch_current as _current  # noqa: E402
from jitkey._core import _TorchCurrent  # noqa: E402

fake_runtime = cpu.fake_runtime  # the fixtures of tests/test_triton_cpu.py
fake_triton = cpu.fake_triton

HERE = Path(__file__).parent
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def standin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    if CC is None:
        pytest.skip("no C compiler to build the stand-in shim")
    out = tmp_path_factory.mktemp("standin_torch") / "libstandin_torch.so"
    subprocess.run(
        [CC, "-shared", "-fPIC", "-O1", str(HERE / "data" / "standin_torch.c"), "-o", str(out)], check=True
    )
    return str(out)


class Shim:
    """The stand-in library (what the shim functions return) and a ``_TorchCurrent`` resolved from it."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.lib.standin_set.argtypes = [ctypes.c_int32, ctypes.c_void_p]
        self.lib.standin_frozen.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.lib.standin_fail(0)
        self.lib.standin_frozen(0, None)
        self.current = _TorchCurrent(path, path, loaded_only=False)

    def set(self, device: int, stream: int) -> None:
        self.lib.standin_set(device, stream)


@pytest.fixture
def shim(standin_path: str) -> Shim:
    return Shim(standin_path)


class Getters:
    """Python getters that agree with the stand-in (as torch's do with the real shim)."""

    def __init__(self, shim: Shim, device: int = 0, stream: int = 0x5000) -> None:
        self.shim, self.device, self.stream = shim, device, stream
        shim.set(device, stream)

    def get_device(self) -> int:
        return self.device

    def get_stream(self, device: int) -> int:
        assert device == self.device
        return self.stream

    @contextlib.contextmanager
    def use_stream(self, address: int) -> Iterator[None]:  # torch.cuda.stream(ExternalStream(address))
        old = self.stream
        self.stream = address
        self.shim.set(self.device, address)
        try:
            yield
        finally:
            self.stream = old
            self.shim.set(self.device, old)


def test_the_shim_reads_what_the_library_returns(shim: Shim) -> None:
    shim.set(3, 0xABC0)
    assert shim.current.device() == 3 and shim.current.stream(3) == 0xABC0 and not shim.current.failed


def test_an_error_stops_the_shim_for_good(shim: Shim) -> None:
    shim.lib.standin_fail(7)
    assert shim.current.device() is None and shim.current.failed
    shim.lib.standin_fail(0)
    calls = shim.lib.standin_calls()
    assert shim.current.device() is None and shim.current.stream(0) is None  # not called again
    assert shim.lib.standin_calls() == calls


def test_missing_symbols_and_libraries_are_reported(standin_path: str, tmp_path: Path) -> None:
    other = tmp_path / "libnothing.so"
    src = tmp_path / "nothing.c"
    src.write_text("int nothing(void) { return 0; }\n")
    if CC is None:
        pytest.skip("no C compiler")
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(other)], check=True)
    with pytest.raises(OSError, match="has no aoti_torch_get_current_device_index"):
        _TorchCurrent(str(other), standin_path, loaded_only=False)
    with pytest.raises(OSError, match="has no aoti_torch_get_current_cuda_stream"):
        _TorchCurrent(standin_path, str(other), loaded_only=False)
    with pytest.raises(OSError, match="cannot be opened"):
        _TorchCurrent(str(tmp_path / "absent.so"), standin_path, loaded_only=False)
    never = tmp_path / "libnever.so"
    shutil.copy(other, never)
    with pytest.raises(OSError, match="is not loaded in this process"):
        _TorchCurrent(str(never), str(never))  # loaded_only (the default): never loads a library itself


def test_torch_2_11_exports_the_shim() -> None:
    """The installed torch's libraries have both functions (resolved, not called: no GPU here)."""
    shim, why = _current.resolve(torch)
    assert shim is not None, why


def test_resolve_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITKEY_NATIVE_CURRENT", "0")
    assert _current.resolve(torch) == (None, "JITKEY_NATIVE_CURRENT=0")


def test_verify_accepts_a_shim_that_follows_the_getters(shim: Shim) -> None:
    g = Getters(shim, device=2, stream=0x7000)
    assert _current.verify(shim.current, g.get_device, g.get_stream, g.use_stream) is None


def test_verify_rejects_a_shim_that_reads_something_else(shim: Shim) -> None:
    g = Getters(shim, device=1, stream=0x7000)
    shim.set(1, 0x7100)  # another stream than the getters'
    why = _current.verify(shim.current, g.get_device, g.get_stream, g.use_stream)
    assert why is not None and "C shim read" in why
    g = Getters(shim, device=1, stream=0x7000)
    shim.lib.standin_frozen(1, 0x7000)  # right now, but deaf to torch.cuda.stream()
    why = _current.verify(shim.current, g.get_device, g.get_stream, g.use_stream)
    assert why is not None and "under another current stream" in why


def test_verify_rejects_a_failing_shim_and_never_asks_it_first(shim: Shim) -> None:
    g = Getters(shim)
    shim.lib.standin_fail(5)
    why = _current.verify(shim.current, g.get_device, g.get_stream, g.use_stream)
    assert why is not None and shim.current.failed

    def no_cuda() -> int:
        raise RuntimeError("no CUDA")

    fresh = Shim(shim.lib._name)
    calls = fresh.lib.standin_calls()
    why = _current.verify(fresh.current, no_cuda, g.get_stream, g.use_stream)
    assert why is not None and "RuntimeError: no CUDA" in why
    assert fresh.lib.standin_calls() == calls  # the Python getter failed first: the shim was never called


def test_native_getters_need_torchs_own_getters(shim: Shim) -> None:
    g = Getters(shim)
    shim_, why = _current.native_getters(torch, g.get_device, g.get_stream)
    assert shim_ is None and "does not read the device and stream through torch's C functions" in str(why)


# -- hits read through the shim --------------------------------------------------------------------------------


def _k(a, n, BLOCK: tl.constexpr):
    pass


def test_hits_read_device_and_stream_through_the_shim(
    shim: Shim, fake_runtime: Any, fake_triton: Any
) -> None:
    shim.set(0, 1000)  # what FakeRuntime's Python getters read for device 0
    fake_runtime.native = shim.current
    kernel = jt.jit(_k)
    fake_triton(kernel)
    x = torch.empty(64)
    ck = kernel[(1,)](x, 16, 64)
    kernel[(1,)](x, 16, 64)
    assert ck.launches[-1][3] == 1000
    assert kernel._jk_launcher.native_current
    shim.set(0, 0x9990)  # the shim's answer is the one used (the Python getter still says 1000)
    kernel[(1,)](x, 16, 64)
    assert ck.launches[-1][3] == 0x9990
    shim.lib.standin_fail(3)  # an error: the Python getters from then on
    kernel[(1,)](x, 16, 64)
    assert ck.launches[-1][3] == 1000 and shim.current.failed
    assert kernel.cache_stats()["fallbacks"] == 0


def test_the_shims_device_keys_the_call(shim: Shim, fake_runtime: Any, fake_triton: Any) -> None:
    fake_runtime.native = shim.current
    kernel = jt.jit(_k)
    state = fake_triton(kernel)
    x = torch.empty(64)
    shim.set(0, 1000)
    kernel[(1,)](x, 16, 64)
    kernel[(1,)](x, 16, 64)
    assert len(state["calls"]) == 1
    shim.set(1, 1001)
    fake_runtime.device = 1  # the miss is Triton's run, which reads the device through the driver
    ck = kernel[(1,)](x, 16, 64)  # another device: another key, a miss
    kernel[(1,)](x, 16, 64)
    assert len(state["calls"]) == 2 and ck.launches[-1][3] == 1001


# -- DSL sites read the device through the shim ----------------------------------------------------------------


def test_a_dsl_site_reads_the_device_through_the_shim_once_proven(
    shim: Shim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site keys the current device; from its first miss after the shim is proven, it asks the shim, not
    ``torch._C._cuda_getDevice`` (here a stand-in that answers otherwise, to see which one was read), and goes
    back to the Python getter once the shim reports an error."""
    from jitkey import dsl

    asked: list[int] = []

    def get_device() -> int:  # stands for torch._C._cuda_getDevice
        asked.append(1)
        return 1

    def host(x: Any) -> Any:
        return torch.add(x, x)

    monkeypatch.setattr(torch._C, "_cuda_getDevice", get_device, raising=False)
    monkeypatch.setattr(_current.PATH, "state", None)
    site = dsl.Site("test:device", host, lambda args: dsl.Bound(host), fallback=host, state=[get_device])
    assert site._current_pending
    x = torch.randn(8)
    on_getter = site.key(x)
    assert asked
    torch.testing.assert_close(site.call(x), x + x)  # a miss while undecided: the site asks again later
    assert site._current_pending and site._native.native_reads == len(_reads_of(site)) - 1
    shim.set(5, 0x5000)
    monkeypatch.setattr(_current.PATH, "state", (shim.current, None))  # proven
    site.call(torch.randn(9))  # another key: a miss, which hands the site the shim
    assert not site._current_pending and site._native.native_reads == len(_reads_of(site))
    asked.clear()
    on_shim = site.key(x)
    assert on_shim != on_getter and not asked  # the shim's device (5), the getter not called
    shim.set(1, 0x5000)
    assert site.key(x) == on_getter and not asked  # the same device as the getter's: the same key
    torch.testing.assert_close(site.call(x), x + x)
    shim.lib.standin_fail(3)  # an error: the Python getter from then on
    shim.set(5, 0x5000)
    assert site.key(x) == on_getter and asked


def test_a_dsl_site_keeps_the_python_getter_when_the_shim_is_off(
    shim: Shim, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jitkey import dsl

    def get_device() -> int:
        return 0

    def host(x: Any) -> Any:
        return torch.neg(x)

    monkeypatch.setattr(torch._C, "_cuda_getDevice", get_device, raising=False)
    monkeypatch.setattr(_current.PATH, "state", (None, "JITKEY_NATIVE_CURRENT=0"))
    site = dsl.Site("test:device-off", host, lambda args: dsl.Bound(host), fallback=host, state=[get_device])
    x = torch.randn(4)
    site.call(x)
    assert not site._current_pending  # decided: off, for good
    assert site._native.native_reads == len(_reads_of(site)) - 1


def _reads_of(site: Any) -> list[str]:
    """The site's reads that can be native: its torch mode reads (when proven here) and the device."""
    from jitkey import _torch_modes

    n = 4 if _torch_modes.get() is not None else 0
    return ["mode"] * n + ["device"]


def test_a_compiled_launch_reads_the_stream_through_the_runtimes_shim(shim: Shim) -> None:
    """FlagGems' LibEntry launches (``jitkey._core._CompiledLaunch``, a DSL plan's compiled step) read the stream
    through the runtime's proven shim when it has one, else through its ``get_stream``; after a shim error, the
    Python getter again."""
    from triton.knobs import HookChain

    from jitkey._core import _CompiledLaunch, _TritonEntry

    class Runtime:
        def __init__(self, native: Any) -> None:
            self.native = native

        def get_stream(self, device: int) -> int:
            return 1000 + device

    ck = cpu.FakeCK("compiled")
    entry = _TritonEntry(ck, ck.run, ck.function, ck.packed_metadata, None, None, None)
    x = torch.empty(4)
    shim.set(0, 0x7770)
    with_shim = _CompiledLaunch(entry, Runtime(shim.current), knobs, HookChain, None, 0, [])
    without = _CompiledLaunch(entry, Runtime(None), knobs, HookChain, None, 0, [])
    assert with_shim((2, 1, 1), x, 8) is ck and ck.launches[-1][:4] == (2, 1, 1, 0x7770)
    assert without((2, 1, 1), x, 8) is ck and ck.launches[-1][:4] == (2, 1, 1, 1000)
    shim.lib.standin_fail(3)
    assert with_shim((3, 1, 1), x, 8) is ck and ck.launches[-1][:4] == (3, 1, 1, 1000)
    with pytest.raises(TypeError):
        _CompiledLaunch(entry, Runtime(object()), knobs, HookChain, None, 0, [])  # not a _TorchCurrent
