"""torch's mode state read natively for DSL sites (``jitkey._core._TorchModes``, ``jitkey/_torch_modes.py``): the
proof on this torch, the reads against torch's Python functions in every state, a site's keys and checks equal
with and without the native reads, and the ways it turns off."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from jitkey import _fastpaths, _torch_modes, dsl  # noqa: E402
from jitkey._core import _TorchModes  # noqa: E402


def _modes():
    modes = _torch_modes.get()
    assert modes is not None, _torch_modes.status()
    return modes


def test_the_proof_passes_on_this_torch_and_is_reported():
    _modes()
    assert _torch_modes.status() == {"on": True, "why": None}
    fp = _fastpaths.native_modes()
    assert fp["on"] is True and fp["why"] is None and not fp["chosen"]
    assert "native_modes" in _fastpaths.fast_paths(decide=False, triton=False)


@pytest.mark.parametrize("index", range(12))
def test_every_read_equals_torchs_python_function_in_each_state(index):
    modes = _modes()
    name, factory = _torch_modes._states(torch)[index]
    with factory():
        got, want = modes.values(), tuple(f() for f in _torch_modes.functions(torch))
        assert got == want, name
        assert [type(v) for v in got] == [type(v) for v in want], name
    assert modes.values() == tuple(f() for f in _torch_modes.functions(torch))


def test_the_reads_are_per_thread():
    modes = _modes()
    seen = {}

    def other():
        seen["values"] = modes.values()

    with torch.no_grad(), torch.inference_mode():
        assert modes.values()[:2] == (False, True)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen["values"][:2] == (True, False)


def _site(modes_on: bool, monkeypatch: pytest.MonkeyPatch) -> dsl.Site:
    def host(x, y, *, alpha=1.0):
        return torch.add(x, y, alpha=alpha)

    if not modes_on:
        monkeypatch.setattr(_torch_modes, "get", lambda: None)
    site = dsl.Site(f"test:modes-{modes_on}", host, lambda args: dsl.Bound(host), fallback=host)
    monkeypatch.undo()
    return site


def test_a_sites_keys_and_checks_are_the_same_with_native_reads(monkeypatch):
    native, python = _site(True, monkeypatch), _site(False, monkeypatch)
    assert native._native.native_reads == 4  # two checks (function, dispatch mode) and two state reads
    assert python._native.native_reads == 0
    x, y = torch.randn(8), torch.randn(8)
    keys = set()
    for name, factory in _torch_modes._states(torch)[:5]:  # the grad and inference states change the key
        with factory():
            k = native.key(x, y)
            assert k == python.key(x, y), name
            keys.add(k)
    assert len(keys) == 3  # grad on, grad off, inference mode (where grad reads off as well)
    for site in (native, python):
        for _ in range(3):
            torch.testing.assert_close(site.call(x, y, alpha=2.0), x + 2 * y)
    assert native.stats()["replays"] == python.stats()["replays"] == 2
    # An active torch function or dispatch mode: the DSL's own path, with the same reason either way.
    for name, factory in _torch_modes._states(torch)[5:]:
        if name.startswith("DisableTorchFunction"):
            continue
        with factory():
            for site in (native, python):
                torch.testing.assert_close(site.call(x, y), x + y)
    assert native.fallbacks == python.fallbacks
    assert set(native.fallbacks) == {"a torch function mode is active", "a torch dispatch mode is active"}


def test_a_wrong_read_fails_the_proof():
    fns = list(_torch_modes.functions(torch))
    fns[0], fns[1] = fns[1], fns[0]  # grad mode's read now stands for inference mode's function
    lib = torch.__file__.rsplit("/", 1)[0] + "/lib"
    swapped = _TorchModes(f"{lib}/libtorch_cpu.so", f"{lib}/libc10.so", fns)
    why = _torch_modes.prove(torch, swapped)
    assert why is not None and "no mode set" in why


def test_missing_symbols_and_bad_arguments_raise():
    lib = torch.__file__.rsplit("/", 1)[0] + "/lib"
    fns = _torch_modes.functions(torch)
    with pytest.raises(OSError, match="has no"):
        _TorchModes(f"{lib}/libc10.so", f"{lib}/libc10.so", fns)  # the shim function is in libtorch_cpu
    with pytest.raises(OSError, match="not loaded"):
        _TorchModes("/nonexistent/libtorch_cpu.so", f"{lib}/libc10.so", fns)
    with pytest.raises(TypeError, match="four callables"):
        _TorchModes(f"{lib}/libtorch_cpu.so", f"{lib}/libc10.so", fns[:3])


def test_turned_off_by_the_environment():
    code = (
        "import json, torch; from jitkey import _torch_modes, _fastpaths, dsl\n"
        "f = lambda x: x\n"
        "s = dsl.Site('t', f, lambda a: dsl.Bound(f), fallback=f)\n"
        "print(json.dumps([_torch_modes.status(), _fastpaths.native_modes()['chosen'], s._native.native_reads]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "JITKEY_NATIVE_MODES": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    import json

    status, chosen, reads = json.loads(out.strip().splitlines()[-1])
    assert status == {"on": False, "why": "JITKEY_NATIVE_MODES=0"} and chosen and reads == 0
