"""Native allocation for replayed DSL plans (``jitkey._core._TorchAlloc``, ``jitkey/_torch_alloc.py``): the shim and
torch's tensor wrapper resolved from torch's libraries, the dense-layout rule, the ``"empty"`` / ``"empty_like"``
plan steps and their fallback to torch's own functions (no GPU here: every CUDA allocation falls back; the
native path itself is proven against torch on the GPU in tests/test_dsl_gpu.py)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from jitkey import _fastpaths, _torch_alloc, dsl  # noqa: E402
from jitkey._core import _Plan, _TorchAlloc  # noqa: E402

LIB = os.path.join(os.path.dirname(torch.__file__), "lib")


@pytest.fixture
def alloc() -> _TorchAlloc:
    try:
        return _TorchAlloc(os.path.join(LIB, "libtorch_cpu.so"), os.path.join(LIB, "libtorch_python.so"))
    except OSError as exc:
        pytest.skip(f"this torch has no C shim: {exc}")


def test_missing_libraries_or_symbols_raise_oserror() -> None:
    with pytest.raises(OSError):
        _TorchAlloc("/nonexistent/libtorch_cpu.so", "/nonexistent/libtorch_python.so", loaded_only=False)
    with pytest.raises(OSError, match="has no"):
        # the wrapper looked up where it is not
        _TorchAlloc(os.path.join(LIB, "libtorch_cpu.so"), os.path.join(LIB, "libtorch_cpu.so"))


def test_only_cuda_tensors_are_made(alloc: _TorchAlloc) -> None:
    assert alloc.empty_like(torch.empty(3, 4)) is None  # a CPU tensor: torch's function
    assert alloc.empty_like(torch.empty(3, 4, device="meta")) is None
    with pytest.raises(ValueError, match="names no dtype"):
        alloc.empty_strided([2], [1], "not_a_dtype", 0)
    with pytest.raises(ValueError, match="differ in length"):
        alloc.empty_strided([2, 3], [1], "float32", 0)
    assert not alloc.failed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the degraded path of a machine without CUDA")
def test_a_shim_error_degrades_to_torchs_function(alloc: _TorchAlloc) -> None:
    # No CUDA: the shim reports an error (it raises inside torch) and is never called again.
    assert alloc.empty_strided([4], [1], "float32", 0) is None
    assert alloc.failed
    assert alloc.empty_strided([4], [1], "float32", 0) is None

    plan = _Plan(
        0, [("empty", (alloc, torch.zeros, [2, 3], [3, 1], "float32", 0), [("c", (2, 3))], None)], ("s", 0)
    )
    out = plan()
    assert out.shape == (2, 3) and out.device.type == "cpu" and out.sum().item() == 0  # torch.zeros ran


def test_plan_steps_fall_back_to_torch_for_what_the_shim_does_not_make(alloc: _TorchAlloc) -> None:
    plan = _Plan(1, [("empty_like", (alloc, torch.empty_like), [("a", 0)], None)], ("s", 0))
    assert plan.steps[0][0] == "empty_like"
    x = torch.randn(5, 7).t()
    out = plan(x)
    assert out.shape == x.shape and out.stride() == x.stride() and out.data_ptr() != x.data_ptr()

    # A dtype the shim does not name: the step is torch's call.
    plan = _Plan(0, [("empty", (alloc, torch.empty, [3], [1], "qint8", 0), [("c", 3)], None)], ("s", 0))
    assert plan.steps[0][0] == "call"
    with pytest.raises(ValueError, match="one tensor"):
        _Plan(2, [("empty_like", (alloc, torch.empty_like), [("a", 0), ("a", 1)], None)], ("s", 0))
    with pytest.raises(ValueError, match="_TorchAlloc"):
        _Plan(1, [("empty_like", (object(), torch.empty_like), [("a", 0)], None)], ("s", 0))


def test_the_recorder_keeps_cpu_factories_as_calls() -> None:
    def f(x):
        return torch.empty_like(x).fill_(1) + torch.empty((3,), dtype=x.dtype, device=x.device).sum()

    _, plan, why = dsl.record(f, (torch.zeros(4),))
    assert why is None and plan is not None
    assert [k for k, _ in plan.steps][:2] == ["call", "call"]  # CPU tensors: never native


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITKEY_NATIVE_ALLOC", "0")
    monkeypatch.setattr(_torch_alloc.PATH, "state", None)
    _torch_alloc.PATH.decide(torch)
    assert _torch_alloc.status() == {"on": False, "why": "JITKEY_NATIVE_ALLOC=0"}
    fp = _fastpaths.native_alloc()
    assert fp["on"] is False and fp["chosen"] is True
    monkeypatch.setattr(_torch_alloc.PATH, "state", None)
    assert _fastpaths.native_alloc()["on"] is None  # undecided until the first recorded CUDA allocation
