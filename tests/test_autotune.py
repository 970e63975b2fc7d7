"""jitkey.triton.autotune: persistent selection, keys and invalidation (CPU, simulated timer) + GPU tests.

Only the launch and the timer are simulated (tests/_autotune_workers.py); the keys, the in-memory cache,
the selection and the DiskIndex are the real ones. Environment changes are simulated by patching what
``jitkey.env_key`` reads (importlib.metadata, triton's ``triton_key``, torch.cuda's device queries,
os.environ), never the autotuner.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import json
import multiprocessing
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import triton

import jitkey
import jitkey.env
import jitkey.triton as jt
from jitkey.errors import ArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _autotune_workers as w


@pytest.fixture
def index(tmp_path: Path) -> Iterator[jitkey.DiskIndex]:
    with jitkey.DiskIndex(tmp_path / "idx") as idx:
        yield idx


@pytest.fixture
def fresh_env() -> Iterator[None]:
    """Clear env_key's per-process memo before and after a test that patches what it reads."""
    from jitkey.triton import _installation

    jitkey.env._versions.cache_clear()
    jitkey.env._triton_key.cache_clear()
    _installation.triton_key_digest.cache_clear()
    yield
    jitkey.env._versions.cache_clear()
    jitkey.env._triton_key.cache_clear()
    _installation.triton_key_digest.cache_clear()


def _tune(index: jitkey.DiskIndex, n: int = 1000, **kw: Any) -> tuple[Any, w.SimulatedGPU, int]:
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu, **kw)
    block = at[(1,)](*w.args_for(n))
    return at, gpu, block


# ---------------------------------------------------------------------------------------------------------
# Selection, memory cache, stats
# ---------------------------------------------------------------------------------------------------------


def test_selects_fastest_and_caches_in_memory(index: jitkey.DiskIndex) -> None:
    at, gpu, block = _tune(index)
    assert block == 256 and at.best_config is w.CONFIGS[1]
    # each config launched once under the timer, then the winner; config fields reach the launch
    assert [launch[3]["BLOCK"] for launch in gpu.launches] == [128, 256, 512, 256]
    assert [launch[3]["num_warps"] for launch in gpu.launches] == [4, 4, 8, 4]
    assert gpu.launches[-1][1] == (1,) and gpu.launches[-1][0] is at.fn
    for _ in range(5):
        assert at[(1,)](*w.args_for(1000)) == 256
    st = at.cache_stats()
    assert st == {
        "memory_hits": 5,
        "disk_hits": 0,
        "tunings": 1,
        "benchmarks": 3,
        "disk_rejects": 0,
        "entries": 1,
    }
    assert gpu.bench_calls == 3
    assert len(index) == 1
    raw = index.get(at.disk_key(*w.args_for(1000)))
    assert raw is not None
    stored = json.loads(raw)
    assert stored["schema"] == "jitkey.triton.autotune" and stored["v"] == 1 and stored["index"] == 1
    assert [t[0] for t in stored["timings"]] == [0, 1, 2]


def test_key_values_and_dtypes_retune(index: jitkey.DiskIndex) -> None:
    at, _gpu, _ = _tune(index, n=1000)
    at[(1,)](*w.args_for(1000))
    assert at.cache_stats()["tunings"] == 1
    at[(1,)](*w.args_for(1024))  # another autotune key value
    assert at.cache_stats()["tunings"] == 2
    at[(1,)](*w.args_for(1000, torch.float32))  # another dtype
    assert at.cache_stats()["tunings"] == 3
    # a non-key argument (alpha) does not retune; a keyword call keys like a positional one
    x, y, out, n, _ = w.args_for(1000)
    at[(1,)](x, y, out, n, 3.5)
    at[(1,)](x, y, out, n=n, alpha=2.0)
    st = at.cache_stats()
    assert st["tunings"] == 3 and st["memory_hits"] == 3 and st["entries"] == 3
    assert len({at.disk_key(*w.args_for(1000)), at.disk_key(*w.args_for(1024))}) == 2
    assert at.disk_key(x, y, out, n, 3.5) == at.disk_key(x, y, out, n=n, alpha=2.0)
    assert at.disk_key(*w.args_for(1000)) != at.disk_key(*w.args_for(1000, torch.float32))


def test_generated_key_matches_general_path(index: jitkey.DiskIndex) -> None:
    import numpy as np

    at, _, _ = _tune(index)
    x, y, out, n, alpha = w.args_for(64)
    calls = [
        (x, y, out, n, alpha),
        (x.double(), y, out, n, alpha),
        (torch.nn.Parameter(x.float()), y, out, n, alpha),  # tensor subclass: via getattr
        (np.zeros(4, dtype=np.float32), y, out, n, alpha),  # a non-torch dtype: by str
        (x, y, out, 1 << 40, alpha),
        (x, y, out, n, 1),
    ]
    keys = set()
    for c in calls:
        fast = at._key(-1, c, {})
        assert fast == at._call_key(-1, c, {})
        assert fast == at._key(-1, c[:3], {"n": c[3], "alpha": c[4]})  # keyword call: general path
        keys.add(fast)
    assert len(keys) == len(calls) - 1  # alpha (not a key, no dtype) alone does not change the key
    with pytest.raises(ArgumentError, match="multiple values"):
        at._key(-1, (x, y, out, n, alpha), {"n": n})


def test_exact_key_values(index: jitkey.DiskIndex) -> None:
    at, _, _ = _tune(index, n=1000)
    x, y, out, _, alpha = w.args_for(16)
    # 16 and 32 share Triton's specialization buckets but are different autotune key values
    at[(1,)](x, y, out, 16, alpha)
    at[(1,)](x, y, out, 32, alpha)
    assert at.cache_stats()["tunings"] == 3


def test_unkeyable_key_value_raises(index: jitkey.DiskIndex) -> None:
    at, _, _ = _tune(index)
    x, y, out, _, alpha = w.args_for(16)
    with pytest.raises(ArgumentError, match="cannot key"):
        at[(1,)](x, y, out, [16], alpha)
    with pytest.raises(ArgumentError, match="missing autotune key argument 'n'"):
        at[(1,)](x, y, out)


def test_single_config_launches_without_tuning_or_storing(index: jitkey.DiskIndex) -> None:
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu, configs=[w.CONFIGS[2]])
    assert at[(1,)](*w.args_for(1000)) == 512
    assert gpu.bench_calls == 0 and len(index) == 0 and at.cache_stats()["tunings"] == 0


def test_in_memory_only(tmp_path: Path) -> None:
    gpu = w.SimulatedGPU()
    at = w.make(False, gpu)
    assert at[(1,)](*w.args_for(1000)) == 256
    assert at[(1,)](*w.args_for(1000)) == 256
    assert at.cache_stats()["memory_hits"] == 1 and gpu.bench_calls == 3


def test_index_as_path(tmp_path: Path) -> None:
    _tune(tmp_path / "p")  # type: ignore[arg-type]
    at, gpu, block = _tune(tmp_path / "p")  # type: ignore[arg-type]
    assert block == 256 and gpu.bench_calls == 0 and at.cache_stats()["disk_hits"] == 1


class _DictStore:
    """A store of the user's own with the methods of jitkey.remote.Index (a dict underneath)."""

    def __init__(self) -> None:
        self.d: dict[bytes, bytes] = {}
        self.closed = False

    def get(self, key: object) -> bytes | None:
        return self.d.get(jitkey.digest(key))

    def put(self, key: object, value: bytes) -> bool:
        self.d[jitkey.digest(key)] = bytes(value)
        return True

    def put_many(self, items: Any) -> bool:
        for k, v in dict(items).items():
            self.put(k, v)
        return True

    def delete(self, key: object) -> bool:
        return self.d.pop(jitkey.digest(key), None) is not None

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self.d)}

    def close(self) -> None:
        self.closed = True


def test_index_is_any_store_with_the_index_methods() -> None:
    from jitkey.remote import Index

    store = _DictStore()
    assert isinstance(store, Index)
    _tune(store)  # type: ignore[arg-type]
    at, gpu, block = _tune(store)  # type: ignore[arg-type]
    assert block == 256 and gpu.bench_calls == 0 and at.cache_stats()["disk_hits"] == 1 and len(store.d) == 1
    with pytest.raises(TypeError, match=r"jitkey\.remote\.Index"):
        _tune(object())  # type: ignore[arg-type]


def test_config_pre_hook_runs_on_every_launch(index: jitkey.DiskIndex) -> None:
    def hook(nargs: dict[str, Any]) -> None:
        nargs["y_ptr"].add_(nargs["BLOCK"])

    cfgs = [triton.Config({"BLOCK": 128}, pre_hook=hook), triton.Config({"BLOCK": 256}, pre_hook=hook)]
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu, configs=cfgs)
    x, y, out, n, alpha = w.args_for(1000)
    at[(1,)](x, y, out, n, alpha)
    at[(1,)](x, y, out, n, alpha)
    assert float(y[0]) == 128 + 256 + 256 + 256  # two benchmark runs, the tuned launch, the warm launch


def test_unkeyable_config_pre_hook_is_rejected(index: jitkey.DiskIndex) -> None:
    calls: list[int] = []
    cfgs = [triton.Config({"BLOCK": 128}, pre_hook=lambda nargs: calls.append(1)), *w.CONFIGS[1:]]
    with pytest.raises(TypeError, match=r"cannot key configs\[0\]\.pre_hook"):
        w.make(index, w.SimulatedGPU(), configs=cfgs)


def test_reset_to_zero_and_restore_value_run_while_benchmarking(index: jitkey.DiskIndex) -> None:
    seen: list[tuple[float, float]] = []

    class Writer(w.SimulatedGPU):
        def launcher(self, fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
            x, _, out = args[0], args[1], args[2]
            seen.append((float(out[0]), float(x[0])))
            out.add_(1.0)
            x.add_(1.0)
            return super().launcher(fn, grid, args, kwargs)

    gpu = Writer()
    at = w.make(index, gpu, reset_to_zero=["out_ptr"], restore_value=["x_ptr"])
    x, y, out, n, alpha = w.args_for(1000)
    out.fill_(7.0)
    at[(1,)](x, y, out, n, alpha)
    # every benchmark launch found out zeroed and x restored; the final (real) launch saw the reset state
    assert seen == [(0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)]
    assert float(out[0]) == 1.0 and float(x[0]) == 1.0


def test_prune_configs_by(index: jitkey.DiskIndex) -> None:
    def keep_small(configs: list[Any], nargs: dict[str, Any], **kwargs: Any) -> list[Any]:
        return [c for c in configs if c.kwargs["BLOCK"] <= 256]

    at, gpu, block = _tune(index, prune_configs_by={"early_config_prune": keep_small})
    assert block == 256 and gpu.bench_calls == 2
    # the prune function is part of the key: the unpruned autotuner does not reuse its result
    at2, gpu2, _ = _tune(index)
    assert gpu2.bench_calls == 3 and at2.disk_key(*w.args_for(1000)) != at.disk_key(*w.args_for(1000))

    def model(**kw: Any) -> float:
        return -float(kw["BLOCK"])

    # One config left after pruning: launched without benchmarking or storing it (Triton 3.9's rule; the
    # choice is the same as timing it alone, which Triton 3.6 does).
    stored = len(index)
    at3, gpu3, block3 = _tune(index, prune_configs_by={"perf_model": model, "top_k": 1})
    assert gpu3.bench_calls == 0 and block3 == 512 and len(index) == stored
    assert at3[(1,)](*w.args_for(1000)) == 512
    assert at3.cache_stats()["tunings"] == 0 and at3.cache_stats()["memory_hits"] == 1
    # A top_k fraction that rounds down to zero keeps one config (Triton 3.9; 3.6 would prune all).
    _at4, gpu4, block4 = _tune(index, prune_configs_by={"perf_model": model, "top_k": 0.2})
    assert gpu4.bench_calls == 0 and block4 == 512
    _at5, gpu5, block5 = _tune(index, prune_configs_by={"perf_model": model, "top_k": 2})
    assert gpu5.bench_calls == 2 and block5 == 256


def test_reset_to_zero_and_restore_value_skip_none(index: jitkey.DiskIndex) -> None:
    """An optional tensor argument passed as None is skipped by the hooks (as Triton 3.9 does)."""
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu, reset_to_zero=["out_ptr", "y_ptr"], restore_value=["x_ptr", "y_ptr"])
    x, y, _out, n, alpha = w.args_for(1000)
    x.fill_(3.0)
    y.fill_(5.0)
    assert at[(1,)](x, y, None, n, alpha) == 256
    assert gpu.bench_calls == 3 and float(y[0]) == 0.0 and float(x[0]) == 3.0
    assert at[(1,)](None, y, None, n, alpha) == 256  # no dtype for x now: another key, tuned again
    assert at.cache_stats()["tunings"] == 2


def _has_autotune_listener() -> bool:
    from triton import knobs

    return hasattr(type(getattr(knobs, "autotuning", None)), "listener")


@pytest.mark.skipif(not _has_autotune_listener(), reason="this Triton has no knobs.autotuning.listener")
def test_autotune_listener_is_called_like_triton(tmp_path: Path) -> None:
    from triton import knobs

    events: list[dict[str, Any]] = []

    def listener(**kw: Any) -> None:
        events.append(kw)

    old = knobs.autotuning.listener
    knobs.autotuning.listener = listener
    try:
        with jitkey.DiskIndex(tmp_path / "idx") as index:
            at, _gpu, _ = _tune(index)
            at[(1,)](*w.args_for(1000))  # a memory hit: no event (Triton calls it only when it resolves)
            _at2, gpu2, _ = _tune(index)  # a second autotuner: disk hit
            _tune(index, configs=[w.CONFIGS[0]])  # a single config: no event
    finally:
        knobs.autotuning.listener = old
    assert gpu2.bench_calls == 0 and len(events) == 2
    tuned, hit = events
    mkey = at._key(at._get_device(), w.args_for(1000), {})
    assert tuned["fn"] is w.scale_add and hit["fn"] is w.scale_add
    assert tuned["key"] == mkey and hit["key"] == mkey
    assert tuned["best_config"] is w.CONFIGS[1] and hit["best_config"] is w.CONFIGS[1]
    assert tuned["cache_hit"] is False and hit["cache_hit"] is True
    assert tuned["duration"] == at.bench_time and hit["duration"] is None
    assert set(tuned["configs_timings"]) == set(w.CONFIGS) == set(hit["configs_timings"])
    assert list(hit["configs_timings"][w.CONFIGS[1]]) == pytest.approx([1.0, 0.9, 1.1])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cache_results": True}, ValueError, "cache_results"),
        ({"warmup": 5}, ValueError, "do_bench"),
        ({"prune_configs_by": {"topk": 1}}, ValueError, "prune_configs_by"),
        ({"reset_to_zero": ["nope"]}, ValueError, "not a parameter"),
    ],
)
def test_rejects(index: jitkey.DiskIndex, kwargs: dict[str, Any], error: type, match: str) -> None:
    gpu = w.SimulatedGPU()
    with pytest.raises(error, match=match):
        w.make(index, gpu, **kwargs)


def test_rejects_configs_and_kernels(index: jitkey.DiskIndex) -> None:
    gpu = w.SimulatedGPU()
    with pytest.raises(ValueError, match="ir_override"):
        w.make(index, gpu, configs=[triton.Config({"BLOCK": 1}, ir_override="x.ttgir"), *w.CONFIGS])
    with pytest.raises(TypeError, match="cannot key"):
        w.make(index, gpu, configs=[triton.Config({"BLOCK": [1]}), *w.CONFIGS])
    with pytest.raises(ValueError, match="not parameters"):
        w.make(index, gpu, configs=[triton.Config({"BLOK": 1}), *w.CONFIGS])
    with pytest.raises(ValueError, match="not a parameter"):
        jt.autotune(w.CONFIGS, key=["m"], index=index)(w.scale_add)
    with pytest.raises(TypeError, match="single str"):
        jt.autotune(w.CONFIGS, key="n", index=index)(w.scale_add)
    inner = triton.autotune(w.CONFIGS, key=["n"])(triton.jit(w.scale_add.fn))
    with pytest.raises(TypeError, match="another autotuner"):
        w.make(index, gpu, kernel=inner)
    with pytest.raises(TypeError, match=r"wraps a triton\.jit"):
        w.make(index, gpu, kernel=lambda: None)


def test_plain_jitfunction_and_heuristics(index: jitkey.DiskIndex) -> None:
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu, kernel=triton.jit(w.scale_add.fn))  # a plain triton JITFunction is bound
    assert isinstance(at.fn, jt.TritonKernel) and at[(1,)](*w.args_for(1000)) == 256
    # same kernel content: the bound jitkey kernel shares its disk entry
    at2, gpu2, _ = _tune(index)
    assert gpu2.bench_calls == 0 and at2.cache_stats()["disk_hits"] == 1
    # a heuristics layer is part of the kernel key
    heur = triton.heuristics(values={"alpha": lambda a: 1.0})(w.scale_add)
    at3 = w.make(index, w.SimulatedGPU(), kernel=heur)
    assert at3.disk_key(*w.args_for(1000)) != at.disk_key(*w.args_for(1000))


# ---------------------------------------------------------------------------------------------------------
# Persistence across processes
# ---------------------------------------------------------------------------------------------------------


def test_second_process_hits_disk_without_benchmarking(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        first = pool.apply(w.tune_once, (str(tmp_path / "idx"), 1000))
    with ctx.Pool(1) as pool:
        second = pool.apply(w.tune_once, (str(tmp_path / "idx"), 1000))
    assert first["pid"] != second["pid"]
    assert first["bench_calls"] == 3 and first["stats"]["tunings"] == 1 and first["block"] == 256
    assert second["bench_calls"] == 0 and second["stats"]["tunings"] == 0
    assert second["stats"]["disk_hits"] == 1 and second["launched_blocks"] == [256]
    assert first["disk_key"] == second["disk_key"]


def test_second_autotuner_in_process_hits_disk(index: jitkey.DiskIndex) -> None:
    _tune(index)
    at, gpu, block = _tune(index)
    assert block == 256 and gpu.bench_calls == 0 and gpu.launches[-1][3]["BLOCK"] == 256
    assert at.cache_stats()["disk_hits"] == 1


# ---------------------------------------------------------------------------------------------------------
# Invalidation
# ---------------------------------------------------------------------------------------------------------


def _assert_retunes_after(index: jitkey.DiskIndex, change: Any) -> None:
    """A control (same environment: disk hit), then ``change()``: a miss and a retune."""
    _tune(index)
    _, gpu, _ = _tune(index)
    assert gpu.bench_calls == 0, "control: the unchanged environment must hit"
    change()
    at, gpu, _ = _tune(index)
    assert gpu.bench_calls == 3 and at.cache_stats()["tunings"] == 1 and at.cache_stats()["disk_hits"] == 0
    _, gpu, _ = _tune(index)  # and the new environment's entry is itself reused
    assert gpu.bench_calls == 0


def test_triton_version_change_misses(
    index: jitkey.DiskIndex, monkeypatch: pytest.MonkeyPatch, fresh_env: None
) -> None:
    real = importlib.metadata.version

    def change() -> None:
        monkeypatch.setattr(importlib.metadata, "version", lambda n: "99.0.0" if n == "triton" else real(n))
        jitkey.env._versions.cache_clear()

    _assert_retunes_after(index, change)


def test_triton_compiler_hash_change_misses(
    index: jitkey.DiskIndex, monkeypatch: pytest.MonkeyPatch, fresh_env: None
) -> None:
    import triton.runtime.cache

    from jitkey.triton import _installation

    def change() -> (
        None
    ):  # another installation of Triton: its files (fingerprint) and its triton_key() differ
        monkeypatch.setattr(triton.runtime.cache, "triton_key", lambda: "another-compiler-build")
        monkeypatch.setattr(_installation, "fingerprint", lambda: b"another-installation".ljust(32))
        _installation.triton_key_digest.cache_clear()
        jitkey.env._triton_key.cache_clear()

    _assert_retunes_after(index, change)


def _fake_gpu(
    monkeypatch: pytest.MonkeyPatch, major: int, minor: int, name: str = "NVIDIA H100 80GB HBM3"
) -> None:
    props = types.SimpleNamespace(name=name, major=major, minor=minor, gcnArchName="")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def test_device_capability_change_misses(index: jitkey.DiskIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, 9, 0)
    _assert_retunes_after(index, lambda: _fake_gpu(monkeypatch, 8, 9))
    # and the device name alone counts too
    _fake_gpu(monkeypatch, 8, 9, name="NVIDIA L40S")
    _, gpu, _ = _tune(index)
    assert gpu.bench_calls == 3


def test_compile_env_var_change_misses(index: jitkey.DiskIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITKEY_UNRELATED_TEST_VAR", "1")
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    _assert_retunes_after(index, lambda: monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0"))


def _load_kernel_module(tmp_path: Path, tag: str, edit: tuple[str, str] = ("", "")) -> Any:
    """``w.scale_add`` from a module of its own under ``tmp_path/tag``, its source edited by ``str.replace(*edit)``."""
    kernel = inspect.getsource(w.scale_add.fn)
    assert edit[0] in kernel
    src = "import triton.language as tl\nimport jitkey.triton as jt\n\n" + kernel.replace(*edit)
    path = tmp_path / tag / "atk_kernels.py"
    path.parent.mkdir()
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("atk_kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["atk_kernels"] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["atk_kernels"]
    return mod.scale_add


def test_kernel_source_change_misses(index: jitkey.DiskIndex, tmp_path: Path) -> None:
    v1 = _load_kernel_module(tmp_path, "a")
    v1_copy = _load_kernel_module(tmp_path, "b")
    v2 = _load_kernel_module(tmp_path, "c", ("x * alpha + y", "x * alpha - y"))
    _tune(index, kernel=v1)
    _, gpu, _ = _tune(index, kernel=v1_copy)  # same source in another file: same key
    assert gpu.bench_calls == 0
    at, gpu, _ = _tune(index, kernel=v2)
    assert gpu.bench_calls == 3 and at.cache_stats()["disk_hits"] == 0


@pytest.mark.parametrize(
    "configs",
    [
        pytest.param([*w.CONFIGS, triton.Config({"BLOCK": 1024}, num_warps=8)], id="added"),
        pytest.param(w.CONFIGS[:2], id="removed"),
        pytest.param(list(reversed(w.CONFIGS)), id="reordered"),
        pytest.param(
            [w.CONFIGS[0], triton.Config({"BLOCK": 256}, num_warps=8), w.CONFIGS[2]], id="num_warps"
        ),
        pytest.param(
            [w.CONFIGS[0], triton.Config({"BLOCK": 256}, num_stages=2), w.CONFIGS[2]], id="num_stages"
        ),
        pytest.param([w.CONFIGS[0], triton.Config({"BLOCK": 256}, num_ctas=2), w.CONFIGS[2]], id="num_ctas"),
        pytest.param([w.CONFIGS[0], triton.Config({"BLOCK": 256}, maxnreg=128), w.CONFIGS[2]], id="maxnreg"),
        pytest.param(
            [w.CONFIGS[0], triton.Config({"BLOCK": 256}, pre_hook=lambda nargs: None), w.CONFIGS[2]],
            id="pre_hook",
        ),
    ],
)
def test_config_set_change_misses(index: jitkey.DiskIndex, configs: list[Any]) -> None:
    _tune(index)
    # equal configs in new objects: hit
    same = [triton.Config(dict(c.kwargs), num_warps=c.num_warps) for c in w.CONFIGS]
    _, gpu, _ = _tune(index, configs=same)
    assert gpu.bench_calls == 0
    at, gpu, _ = _tune(index, configs=configs)
    assert gpu.bench_calls == len(configs) and at.cache_stats()["disk_hits"] == 0


def test_config_pre_hook_content_is_keyed(index: jitkey.DiskIndex) -> None:
    def hook_a(nargs: dict[str, Any]) -> None:
        nargs["out_ptr"].zero_()

    def hook_b(nargs: dict[str, Any]) -> None:
        nargs["out_ptr"].fill_(1.0)

    def with_hook(h: Any) -> list[Any]:
        return [triton.Config({"BLOCK": 128}, pre_hook=h), triton.Config({"BLOCK": 256}, pre_hook=h)]

    at_a, _, _ = _tune(index, configs=with_hook(hook_a))
    at_b, gpu, _ = _tune(index, configs=with_hook(hook_b))
    assert gpu.bench_calls == 2
    assert at_a.disk_key(*w.args_for(1000)) != at_b.disk_key(*w.args_for(1000))


# ---------------------------------------------------------------------------------------------------------
# Bad stored values
# ---------------------------------------------------------------------------------------------------------


def _good_value(index: jitkey.DiskIndex) -> tuple[bytes, dict[str, Any]]:
    at, _, _ = _tune(index)
    key = at.disk_key(*w.args_for(1000))
    raw = index.get(key)
    assert raw is not None
    return key, json.loads(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda v: b"\x00\xffnot json", id="garbage"),
        pytest.param(lambda v: b"[1, 2]", id="json-list"),
        pytest.param(lambda v: json.dumps({**v, "schema": "other.tool"}).encode(), id="foreign-schema"),
        pytest.param(lambda v: json.dumps({**v, "v": 2}).encode(), id="future-version"),
        pytest.param(lambda v: json.dumps({**v, "index": 7}).encode(), id="index-out-of-range"),
        pytest.param(lambda v: json.dumps({**v, "index": -1}).encode(), id="negative-index"),
        pytest.param(lambda v: json.dumps({**v, "index": "1"}).encode(), id="index-type"),
        pytest.param(lambda v: json.dumps({**v, "index": True}).encode(), id="index-bool"),
        pytest.param(lambda v: json.dumps({**v, "index": 0}).encode(), id="config-digest-mismatch"),
        pytest.param(
            lambda v: json.dumps({k: x for k, x in v.items() if k != "config"}).encode(), id="no-digest"
        ),
    ],
)
def test_bad_stored_value_is_a_miss_and_retunes(index: jitkey.DiskIndex, mutate: Any) -> None:
    key, value = _good_value(index)
    index.put(key, mutate(value))
    at, gpu, block = _tune(index)
    assert block == 256 and gpu.bench_calls == 3
    assert at.cache_stats()["disk_rejects"] == 1 and at.cache_stats()["tunings"] == 1
    # the retune rewrote a good value: the next autotuner hits
    _, gpu, _ = _tune(index)
    assert gpu.bench_calls == 0


# ---------------------------------------------------------------------------------------------------------
# GPU: real Triton kernels and do_bench
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_gpu_add_autotune_persists(tmp_path: Path) -> None:
    x = torch.randn(100_000, device="cuda")
    y = torch.randn_like(x)
    n = x.numel()

    def build() -> Any:
        return jt.autotune(w.CONFIGS, key=["n"], index=tmp_path / "idx")(w.scale_add)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK"]),)

    at = build()
    out = torch.empty_like(x)
    at[grid](x, y, out, n, 2.0)
    torch.testing.assert_close(out, x * 2.0 + y)
    st = at.cache_stats()
    assert st["tunings"] == 1 and st["benchmarks"] == 3
    out2 = torch.empty_like(x)
    at[grid](x, y, out2, n, 2.0)
    torch.testing.assert_close(out2, x * 2.0 + y)
    assert at.cache_stats()["memory_hits"] == 1
    at2 = build()
    out3 = torch.empty_like(x)
    at2[grid](x, y, out3, n, 2.0)
    torch.testing.assert_close(out3, x * 2.0 + y)
    st2 = at2.cache_stats()
    assert st2["disk_hits"] == 1 and st2["benchmarks"] == 0
    assert at2.best_config is at.best_config


@pytest.mark.cuda
def test_gpu_matmul_autotune_reset_and_restore(tmp_path: Path) -> None:
    matmul_kernel = w.matmul_kernel
    a = torch.randn(256, 192, device="cuda", dtype=torch.float16)
    b = torch.randn(192, 128, device="cuda", dtype=torch.float16)
    configs = [
        triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4),
        triton.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=4),
        triton.Config({"BM": 64, "BN": 128, "BK": 64}, num_warps=8),
    ]
    at = jt.autotune(configs, key=["M", "N", "K"], index=tmp_path / "idx", reset_to_zero=["c_ptr"])(
        matmul_kernel
    )
    c = torch.empty(256, 128, device="cuda", dtype=torch.float32)

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(256, meta["BM"]), triton.cdiv(128, meta["BN"]))

    at[grid](a, b, c, 256, 128, 192, a.stride(0), b.stride(0), c.stride(0))
    torch.testing.assert_close(c, (a.float() @ b.float()), rtol=1e-2, atol=1e-2)
    assert at.cache_stats()["tunings"] == 1 and at.cache_stats()["benchmarks"] == 3
    # another shape is another key; the same shape in a new autotuner is a disk hit
    at2 = jt.autotune(configs, key=["M", "N", "K"], index=tmp_path / "idx", reset_to_zero=["c_ptr"])(
        matmul_kernel
    )
    c2 = torch.empty_like(c)
    at2[grid](a, b, c2, 256, 128, 192, a.stride(0), b.stride(0), c2.stride(0))
    torch.testing.assert_close(c2, c)
    assert at2.cache_stats()["disk_hits"] == 1 and at2.cache_stats()["benchmarks"] == 0
