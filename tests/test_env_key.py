"""jitkey.env_key: env vars by name and prefix, versions, Triton's compiler key, the device."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

import jitkey
from jitkey import env as envmod

PYTHON_KNOBS = {"TRITON_DEBUG", "TRITON_INTERPRET"}  # read by Triton's Python side, not the C++ list


def env_only(**kw: object) -> tuple[object, ...]:
    return jitkey.env_key(versions=False, device=False, compiler=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", jitkey.DEFAULT_ENV_VARS)
def test_each_default_var_changes_the_key(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(name, raising=False)
    unset = jitkey.digest(env_only())
    monkeypatch.setenv(name, "")
    empty = jitkey.digest(env_only())
    monkeypatch.setenv(name, "1")
    one = jitkey.digest(env_only())
    monkeypatch.setenv(name, "0")
    zero = jitkey.digest(env_only())
    assert len({unset, empty, one, zero}) == 4
    monkeypatch.delenv(name)
    assert jitkey.digest(env_only()) == unset


def test_names_and_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.startswith("JKTEST_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("JKTEST_B", "b")
    base = env_only(names=["JKTEST_B", "JKTEST_A"], prefixes=("JKTEST_P_",))
    assert base == (("env", (("JKTEST_A", None), ("JKTEST_B", "b"))),)
    assert env_only(names=("JKTEST_A", "JKTEST_B"), prefixes=["JKTEST_P_"]) == base  # order-free
    monkeypatch.setenv("JKTEST_OTHER", "x")  # neither named nor prefixed
    assert env_only(names=["JKTEST_B", "JKTEST_A"], prefixes=("JKTEST_P_",)) == base
    monkeypatch.setenv("JKTEST_P_ONE", "")
    with_p = env_only(names=["JKTEST_B", "JKTEST_A"], prefixes=("JKTEST_P_",))
    assert with_p == (("env", (("JKTEST_A", None), ("JKTEST_B", "b"), ("JKTEST_P_ONE", ""))),)
    monkeypatch.setenv("JKTEST_P_ONE", "1")
    assert env_only(names=["JKTEST_B", "JKTEST_A"], prefixes=("JKTEST_P_",)) != with_p
    monkeypatch.setenv("JKTEST_A", "a")
    assert env_only(names=["JKTEST_B", "JKTEST_A"]) == (("env", (("JKTEST_A", "a"), ("JKTEST_B", "b"))),)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="single str"):
        jitkey.env_key("TRITON_DEBUG")
    with pytest.raises(TypeError, match="single str"):
        jitkey.env_key(prefixes="TRITON_")
    with pytest.raises(TypeError, match="must be str"):
        jitkey.env_key(names=[1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="non-empty"):
        jitkey.env_key(prefixes=[""])


def test_default_list_matches_installed_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from triton._C.libtriton import get_cache_invalidating_env_vars  # type: ignore[import-untyped]

    for name in jitkey.DEFAULT_ENV_VARS:
        monkeypatch.setenv(name, "1")
    reported = set(get_cache_invalidating_env_vars())
    # Every name of ours that is not a Python-side knob is one Triton itself treats as cache-invalidating.
    assert reported == set(jitkey.DEFAULT_ENV_VARS) - PYTHON_KNOBS


def test_names_triton_reports_are_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envmod, "_triton_set_env_vars", lambda: {"TRITON_SOMETHING_NEW": "7"})
    monkeypatch.setenv("TRITON_SOMETHING_NEW", "7")
    env = dict(env_only()[0][1])  # type: ignore[index]
    assert env["TRITON_SOMETHING_NEW"] == "7"
    assert "TRITON_SOMETHING_NEW" not in dict(env_only(names=["X"])[0][1])  # type: ignore[index]


def test_full_key_sections_versions_compiler_device() -> None:
    torch = pytest.importorskip("torch")
    full = jitkey.env_key()
    sections: dict[Any, Any] = dict(full)  # type: ignore[arg-type]
    assert list(sections) == ["env", "versions", "triton_key", "device"]
    assert sections["versions"] == (
        ("jitkey", jitkey.__version__),
        ("torch", importlib.metadata.version("torch")),
        ("triton", importlib.metadata.version("triton")),
    )
    tk = sections["triton_key"]
    assert isinstance(tk, str) and len(tk) == 64 and int(tk, 16) >= 0
    if torch.cuda.is_available():
        dev = sections["device"]
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        assert dev[:4] == ("cuda", props.name, props.major, props.minor)
    else:
        assert sections["device"] == ("cpu",)
        assert not torch.cuda.is_initialized()
    # keyable, stable within a process, and the flags change the key
    assert jitkey.digest(full) == jitkey.digest(jitkey.env_key())
    variants = [
        jitkey.env_key(versions=False),
        jitkey.env_key(compiler=False),
        jitkey.env_key(device=False),
        full,
    ]
    assert len({jitkey.digest(v) for v in variants}) == 4
    # triton_key hashes the compiler once per process
    assert envmod._triton_key.cache_info().hits >= 1


def test_device_section_on_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch, driven through a stand-in for torch.cuda (CI has no GPU)."""
    torch = pytest.importorskip("torch")

    class Props:
        name = "NVIDIA H100 80GB HBM3"
        major, minor = 9, 0
        gcnArchName = ""  # torch's attribute name (ROCm)

    asked: list[int] = []

    def props(index: int) -> Props:
        asked.append(index)
        return Props()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    current = envmod._device_key(True)
    assert current == ("cuda", "NVIDIA H100 80GB HBM3", 9, 0, "", torch.version.cuda, torch.version.hip)
    assert envmod._device_key(3)[:4] == ("cuda", "NVIDIA H100 80GB HBM3", 9, 0)
    assert asked == [1, 3]
    assert dict(jitkey.env_key(versions=False, compiler=False))["device"] == current  # type: ignore[arg-type]
