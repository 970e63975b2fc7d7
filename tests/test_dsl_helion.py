"""jitkey.integrations.helion on CPU: Helion's real host functions under Triton's interpreter, each call through
jitkey compared bit for bit with Helion's own path (broadcast, non-contiguous, zero-size, dtype promotion,
scalar, in-place and ``out=`` kernels), the key against what Helion decides on, and ``reset()``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("helion")

import _interp_child


def test_helion_under_the_interpreter_matches_helions_own_path(tmp_path):
    out = _interp_child.run(
        "_dsl_helion_cpu.py",
        900,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        HELION_CACHE_DIR=str(tmp_path / "helion"),
    )
    assert out["mismatches"] == []
    assert out["fallbacks"] == {} and out["refused"] == {}
    assert out["replays"] >= 14  # every case replays from its third call
    assert out["keys_differ"] and out["scalar_keyed"] and out["grad_mode_keyed"]
    assert out["reset_drops_plans"]
    # Helion's matmul examples take a function default (epilogue=...): the kernel is left to Helion, counted
    assert out["epilogue_ok"]
    assert list(out["epilogue_declined"].values()) == [1], out["epilogue_declined"]
    assert all(out["native_call"].values()), out["native_call"]


def test_unknown_helion_version_is_refused(monkeypatch):
    import jitkey.integrations as ji
    import jitkey.integrations.helion as jh
    from jitkey.errors import UnsupportedVersionError

    monkeypatch.setattr(ji, "library_version", lambda dist: "9.9.9")
    with pytest.raises(UnsupportedVersionError, match=r"1\.4\.0"):
        jh.install()
    assert not jh.installed()
    st = ji.status()["helion"]
    assert "not a supported version" in st["why"]
    assert ji.install_available()["helion"] is not None


def test_the_distributed_check_reads_what_is_initialized_returns(monkeypatch):
    import functools

    import torch

    import jitkey.integrations.helion as jh

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    c10d = torch.distributed.distributed_c10d
    check = jh._dist_initialized(torch)
    # On torch 2.11 the source proves the C-level read: no Python frame per Helion call.
    assert isinstance(check, functools.partial), check
    assert not check() and not torch.distributed.is_initialized()
    monkeypatch.setattr(c10d._world, "_default_pg", object())  # what init_process_group sets (through WORLD)
    assert check() and torch.distributed.is_initialized()
    monkeypatch.undo()
    fresh = type(c10d._world)()  # c10d's _world replaced: the check follows the module's attribute
    fresh._default_pg = object()
    monkeypatch.setattr(c10d, "_world", fresh)
    assert check() and torch.distributed.is_initialized()
    monkeypatch.undo()
    # Where torch's source is not what the proof expects, the function itself is the check.
    monkeypatch.setattr(jh, "_dist_check", None)
    monkeypatch.setattr(jh, "_returns", lambda fn, expr: False)
    assert jh._dist_initialized(torch) is torch.distributed.is_initialized
