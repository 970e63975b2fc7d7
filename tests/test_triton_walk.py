"""A kernel's ``cache_key`` replayed from its recorded walk (``jitkey.triton._walk``) against Triton's own walk.

Each scenario runs fresh processes (tests/_walk_child.py): one computes the ``cache_key``s with Triton's walk and
records them, a later one replays them, and a plain one (Triton's walk alone) is the reference: the replayed
``cache_key`` and ``used_global_vals`` must be exactly Triton's in every case, parsing no source when the replay
applies, and falling back to Triton's walk (parsing) where it does not: a global that now holds another kind of
value, a changed source, a damaged record, a source the replay does not follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")

HERE = Path(__file__).parent

HELPERS = """
import triton
import triton.language as tl

FACTOR = tl.constexpr(2)


@triton.jit
def twice(x):
    return x * FACTOR
"""

KERNELS = """
import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

import l2walk_helpers as H

C = tl.constexpr(int(os.environ.get("WALK_C", "5")))
PLAIN = int(os.environ.get("WALK_PLAIN", "7"))  # a global that is not a constexpr: used_global_vals only
DT = tl.float16


@triton.jit
def leaf(x):
    return x * C


@triton.jit
def rec(x, n: tl.constexpr):
    return rec(x, n - 1) if n > 0 else x


@triton.jit(noinline=True)
def mid(x):
    return leaf(x) + H.twice(x) + PLAIN


HELP = leaf if os.environ.get("WALK_KIND") != "1" else 3


@triton.jit
def kern(x_ptr, n, B: tl.constexpr = C, D: tl.constexpr = DT):
    i = tl.arange(0, B)
    v = tl.load(x_ptr + i, mask=i < n)
    for j in range(2):
        v = mid(v).to(D) + HELP(v)
    w, z = v, libdevice.exp(v)
    tl.store(x_ptr + i, w + z + H.FACTOR, mask=i < n)


def factory():
    K = tl.constexpr(int(os.environ.get("WALK_K", "3")))

    @triton.jit
    def inner(x_ptr):
        tl.store(x_ptr, K + C)

    return inner


inner = factory()


@triton.jit
def assigns(x_ptr):
    H.FACTOR = 1
    tl.store(x_ptr, 0)
"""

NAMES = ["kern", "leaf", "rec", "mid", "inner", "assigns"]


class Scene:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.index = root / "jitkey-index"
        (root / "l2walk_helpers.py").write_text(textwrap.dedent(HELPERS))
        (root / "l2walk_kernels.py").write_text(textwrap.dedent(KERNELS))

    def edit(self, module: str, old: str, new: str) -> None:
        path = self.root / f"{module}.py"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    def run(self, mode: str, names: list[str] = NAMES, **env: str) -> dict[str, Any]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("WALK_", "JITKEY_"))}
        full_env.update(
            JITKEY_CACHE_DIR=str(self.index), JITKEY_TRITON_L2="1", PYTHONDONTWRITEBYTECODE="1", **env
        )
        cfg = {"mode": mode, "dir": str(self.root), "names": names}
        out = subprocess.run(
            [sys.executable, str(HERE / "_walk_child.py"), json.dumps(cfg)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-6000:]
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def assert_triton(replayed: dict[str, Any], plain: dict[str, Any]) -> None:
    """Every kernel's cache_key and used_global_vals (or error) as Triton's walk gives them."""
    assert set(replayed) == set(plain)
    for name in plain:
        assert replayed[name]["key"] == plain[name]["key"], name
        assert replayed[name].get("globals") == plain[name].get("globals"), name


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return Scene(tmp_path)


def test_a_recorded_walk_replays_to_tritons_cache_key_without_parsing(scene: Scene) -> None:
    rec = scene.run("record")
    assert [rec[n]["said"] for n in NAMES] == [None] * 5 + ["an attribute assigned to in the source"]
    again = scene.run("replay")
    plain = scene.run("plain")
    assert_triton(again, plain)
    assert_triton(rec, plain)
    # Every kernel the replay follows was restored without one parse: its callees (mid, leaf, rec, H.twice)
    # were replayed too. The one it does not follow took Triton's walk.
    for name in NAMES[:-1]:
        assert again[name]["said"] in (True, "hashed") and again[name]["parsed"] == [], name
    assert [again[n]["said"] for n in ("kern", "rec", "inner")] == [True] * 3
    assert again["assigns"]["said"] is False and again["assigns"]["parsed"] == ["assigns"]
    assert plain["kern"]["parsed"] == ["kern", "leaf", "mid", "twice"]
    # The walk's reads are all there: constexpr globals (here and through callees), a plain one, a closure's.
    assert "C" in {g[0] for g in plain["kern"]["globals"]}
    # (Triton 3.6 merges leaf's C into mid's only if leaf was hashed before mid.)
    assert "PLAIN" in {g[0] for g in plain["mid"]["globals"]}
    assert [g[:2] for g in plain["inner"]["globals"]] == [["C", True], ["K", False]]


@pytest.mark.parametrize(
    "env",
    [
        {"WALK_C": "6"},  # a constexpr global: in the hash
        {"WALK_PLAIN": "8"},  # a plain global: in used_global_vals
        {"WALK_K": "9"},  # a closure's value
    ],
)
def test_changed_values_replay_to_tritons_new_cache_key(scene: Scene, env: dict[str, str]) -> None:
    before = scene.run("record")
    again = scene.run("replay", **env)
    plain = scene.run("plain", **env)
    assert_triton(again, plain)
    assert all(again[n]["said"] in (True, "hashed") and again[n]["parsed"] == [] for n in NAMES[:-1])
    changed = {
        n for n in NAMES if again[n]["key"] != before[n]["key"] or again[n]["globals"] != before[n]["globals"]
    }
    assert changed, env


def test_a_global_of_another_kind_takes_tritons_walk(scene: Scene) -> None:
    scene.run("record")
    # HELP was a jit function when recorded; now an int: the replay stops, Triton's walk runs (and agrees).
    again = scene.run("replay", WALK_KIND="1")
    plain = scene.run("plain", WALK_KIND="1")
    assert_triton(again, plain)
    assert again["kern"]["said"] is False and "kern" in again["kern"]["parsed"]
    assert again["rec"]["said"] is True and again["rec"]["parsed"] == []


def test_a_changed_source_takes_tritons_walk_and_its_callers_follow(scene: Scene) -> None:
    rec = scene.run("record")
    scene.edit("l2walk_helpers", "return x * FACTOR", "return x * FACTOR + 1")
    again = scene.run("replay")
    plain = scene.run("plain")
    assert_triton(again, plain)
    # twice's own source changed: no trace for it, Triton's walk; kern and mid replay with its new cache_key.
    assert again["kern"]["said"] is True and again["kern"]["parsed"] == ["twice"]
    assert again["kern"]["key"] != rec["kern"]["key"] and again["leaf"]["key"] == rec["leaf"]["key"]
    # Lines moved: the key holds the line, read live.
    before = again["kern"]["key"]
    scene.edit("l2walk_kernels", "DT = tl.float16", "DT = tl.float16\n\n")
    again, plain = scene.run("replay"), scene.run("plain")
    assert_triton(again, plain)
    assert again["kern"]["said"] is True and again["kern"]["key"] != before


def test_damaged_records_take_tritons_walk(scene: Scene) -> None:
    scene.run("record")
    for f in scene.index.glob("index*"):
        data = bytearray(f.read_bytes())
        for i in range(64, len(data), 97):
            data[i] ^= 0x5A
        f.write_bytes(bytes(data))
    again = scene.run("replay")
    plain = scene.run("plain")
    assert_triton(again, plain)
    assert any(again[n]["said"] is False for n in NAMES[:-1])  # the damage reached the traces: walked again
