"""Fast paths that switch themselves off say so, once: a warning unless the user chose it (tests/test_cli.py
checks that ``jitkey info`` reports them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

# Runs in a fresh process: the tensor-field decision is made once per process, at the first tensor rule.
PROBE = """
import json, logging, sys
from jitkey import Signature, _fastpaths, _tensor_fields, rules
if sys.argv[1] == "broken":
    _tensor_fields._calibrate = lambda torch: "simulated: a field moved"  # torch's layout is not the proven one
Signature([("x", rules.tensor())])
Signature([("y", rules.tensor(shape="exact"))])          # a second tensor rule: no second message
print(json.dumps(_fastpaths.tensor_fields()))
"""


def probe(mode: str, **env: str) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_an_unproven_layout_turns_the_tensor_reads_off_with_one_warning() -> None:
    state, stderr = probe("broken")
    assert state["on"] is False and state["chosen"] is False
    assert "simulated: a field moved" in str(state["why"])
    # No handler is configured, so the warning reaches stderr through logging's last resort, once.
    assert stderr.count("direct tensor-field reads are off") == 1, stderr
    assert "Set JITKEY_TENSOR_FIELDS=0 to choose this" in stderr


def test_the_users_choice_is_logged_at_info_only() -> None:
    state, stderr = probe("ok", JITKEY_TENSOR_FIELDS="0")
    assert state == {**state, "on": False, "chosen": True}
    assert "tensor-field" not in stderr  # INFO is below the default level
    _, stderr = probe("ok", JITKEY_TENSOR_FIELDS="0", JITKEY_LOG="info")
    assert stderr.count("jitkey.fastpath INFO: direct tensor-field reads are off: turned off by") == 1, stderr


def test_on_when_proven() -> None:
    state, stderr = probe("ok")
    assert state["on"] is True and state["why"] is None and "tensor-field" not in stderr


def test_cpython_layout_reason_mirrors_the_native_decision() -> None:
    from jitkey import _core, _fastpaths

    st = _fastpaths.cpython_layout()
    assert st["on"] is bool(_core._FAST_LAYOUT)
    v = sys.version_info
    proven_here = v[:2] >= (3, 10) and v[:2] <= (3, 14) and getattr(sys, "_is_gil_enabled", lambda: True)()
    assert st["on"] is bool(proven_here) or st["why"]


def test_a_proof_that_comes_back_to_its_own_path_gets_none_not_a_deadlock() -> None:
    """A proof runs torch functions; under a DSL that routes them (FlagGems' ``use_gems()``) they can reach the
    same path on the same thread. That use gets None (torch's own functions); other threads wait for the
    decision. (Found on the GPU: the FlagGems suite hung in the native allocation's proof.)"""
    import threading

    from jitkey._proven import Proven

    seen: list[object] = []

    def make(torch: object) -> tuple[object, str | None]:
        seen.append(path.get())  # the proof's own torch call coming back
        return "native", None

    path = Proven("JITKEY_TEST_PROVEN", "undecided", make)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(path.get()), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the proof waited for itself"
    assert done == ["native"] and seen == [None]
    assert path.get() == "native" and path.status() == {"on": True, "why": None}
