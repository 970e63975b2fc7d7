"""Damaged persistent-autotune values are counted rejects that retune, never exceptions out of
``kernel[grid](...)`` (issue 13, class 9): deeply nested JSON, timings of the wrong shape, with and
without an autotuning listener set."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

import jitkey

sys.path.insert(0, str(Path(__file__).parent))
import _autotune_workers as w


@pytest.fixture
def index(tmp_path: Path) -> Iterator[jitkey.DiskIndex]:
    with jitkey.DiskIndex(tmp_path / "idx") as idx:
        yield idx


def _tune(index: jitkey.DiskIndex) -> tuple[Any, w.SimulatedGPU, int]:
    gpu = w.SimulatedGPU()
    at = w.make(index, gpu)
    return at, gpu, at[(1,)](*w.args_for(1000))


DAMAGE = {
    "deeply-nested": lambda v: b"[" * 30_000 + b"]" * 30_000,
    "deeply-nested-timings": lambda v: (
        json.dumps({**v, "timings": None})
        .encode()[:-1]
        .replace(b'"timings": null', b'"timings": ' + b"[" * 25_000 + b"]" * 25_000)
        + b"}"
    ),
    "timings-null": lambda v: json.dumps({**v, "timings": None}).encode(),
    "timings-dict": lambda v: json.dumps({**v, "timings": {"0": [1.0]}}).encode(),
    "timings-item-short": lambda v: json.dumps({**v, "timings": [[0]]}).encode(),
    "timings-index-bad": lambda v: json.dumps({**v, "timings": [[99, [1.0]]]}).encode(),
    "timings-value-str": lambda v: json.dumps({**v, "timings": [[0, "fast"]]}).encode(),
    "timings-value-nested": lambda v: json.dumps({**v, "timings": [[0, [[1.0]]]]}).encode(),
}


@pytest.mark.parametrize("listener", [False, True], ids=["no-listener", "listener"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_value_is_a_counted_reject(
    index: jitkey.DiskIndex, damage: str, listener: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    at, _, _ = _tune(index)
    key = at.disk_key(*w.args_for(1000))
    raw = index.get(key)
    assert raw is not None
    heard: list[dict[str, Any]] = []
    if listener:
        # The listener Triton >= 3.9 exposes as knobs.autotuning.listener.
        module = sys.modules[type(at).__module__]
        monkeypatch.setattr(module, "_autotune_listener", lambda: lambda **kw: heard.append(kw))
    index.put(key, DAMAGE[damage](json.loads(raw)))
    at2, gpu, block = _tune(index)
    assert block == 256 and gpu.bench_calls == 3
    st = at2.cache_stats()
    assert st["disk_rejects"] == 1 and st["tunings"] == 1 and st["disk_hits"] == 0
    if listener:
        assert [h["cache_hit"] for h in heard] == [False]
    # The retune stored a good value again: the next one hits, with its timings for the listener.
    at3, gpu3, _ = _tune(index)
    assert gpu3.bench_calls == 0 and at3.cache_stats()["disk_hits"] == 1
    if listener:
        assert heard[-1]["cache_hit"] is True and len(heard[-1]["configs_timings"]) == 3
