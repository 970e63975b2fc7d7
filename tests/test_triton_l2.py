"""jitkey's L2 of compiled kernels (``jitkey.triton._l2``) against Triton's own cache, on a CPU.

Each scenario runs fresh processes (tests/_l2_child.py): Triton compiles for sm90 with its real ``ptxas`` and a
recording stand-in driver. A jitkey process records what Triton compiled; a later one loads it from the L2 with
Triton's compile path and ``triton_key()`` forbidden; a plain Triton process on the same Triton cache is the
reference, and the two must agree on everything: the compiled kernel (hash, binary, metadata, IR, source), the
module loaded, the launch, what ``device_caches`` holds. Then what Triton's own cache tests change (helpers,
globals, env, knobs, ``jit(debug=...)``; runtime/test_cache.py), an upgrade, and files deleted, truncated or
replaced under the L2 must be misses that end in Triton's own result, never a wrong kernel or a crash. The GPU
side (real modules and launches) is in tests/test_triton_gpu.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")

HERE = Path(__file__).parent

KERNELS = """
import triton
import triton.language as tl

SCALE = tl.constexpr(3)


@triton.jit
def helper(x):
    return x * 2


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, helper(tl.load(x_ptr + i, mask=m)) + tl.load(y_ptr + i, mask=m), mask=m)


@triton.jit
def scale(x_ptr, n, F: tl.constexpr, ACC: tl.constexpr = tl.float32):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    v = tl.load(x_ptr + i, mask=i < n).to(ACC)
    tl.store(x_ptr + i, (v * F * SCALE).to(x_ptr.dtype.element_ty), mask=i < n)


@triton.jit(debug=True)
def checked(x_ptr, n):
    i = tl.arange(0, 128)
    tl.device_assert(n > 0)
    tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)
"""

CALLS: list[list[Any]] = [
    ["add", [["t", "float32"], ["t", "float32"], ["t", "float32"], 4096], {"BLOCK": 256}],
    ["add", [["t", "float16"], ["t", "float16"], ["t", "float16"], 16], {"BLOCK": 256, "num_warps": 2}],
    ["add", [["t+1", "float32"], ["t", "float32"], ["t", "float32"], 1], {"BLOCK": 256}],
    ["scale", [["t", "float16"], 100, 2.5], {}],
    ["scale", [["t", "float32"], 100, 2], {"ACC": ["tl", "float16"]}],
    ["checked", [["t", "float32"], 7], {}],
]


class Scene:
    """A Triton cache, a jitkey index and a kernels module shared by the processes of one test."""

    def __init__(self, root: Path, source: str = KERNELS, calls: list[list[Any]] = CALLS) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.calls = calls
        self.triton_cache = root / "triton-cache"
        self.index = root / "jitkey-index"
        self.module = root / "l2_kernels.py"
        self.write(source)

    def write(self, source: str) -> None:
        self.module.write_text(textwrap.dedent(source))
        for pyc in self.root.glob("__pycache__/*"):
            pyc.unlink()

    def run(
        self, mode: str, setup: str = "", watch: bool = False, then: str = "", **env: str
    ) -> dict[str, Any]:
        cfg = {"mode": mode, "module": str(self.module), "calls": self.calls, "setup": setup, "then": then}
        cfg["watch"] = watch
        full_env = {
            **os.environ,
            "TRITON_CACHE_DIR": str(self.triton_cache),
            "JITKEY_CACHE_DIR": str(self.index),
        }
        for name in ("JITKEY_DISK_CACHE", "JITKEY_TRITON_L2", "JITKEY_TRITON", "TRITON_DEFAULT_FP_FUSION"):
            full_env.pop(name, None)
        full_env["JITKEY_TRITON_L2"] = "1"  # opt-in (see jitkey.triton._l2)
        full_env.update(env)
        out = subprocess.run(
            [sys.executable, str(HERE / "_l2_child.py"), json.dumps(cfg)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-6000:]
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def l2(rep: dict[str, Any], field: str) -> int:
    return sum(s[field] for s in rep["stats"].values())


def assert_same(jk: dict[str, Any], plain: dict[str, Any]) -> None:
    """The jitkey process's kernels (or errors), loads, launches and Triton state are exactly the plain Triton
    process's."""
    for a, b in zip(jk["calls"], plain["calls"], strict=True):
        assert a == b
    assert jk["loads"] == plain["loads"]
    assert jk["launches"] == plain["launches"]
    assert jk["device_caches"] == plain["device_caches"]


@pytest.fixture(scope="module")
def warm(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Scene, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A scene where a jitkey process compiled and recorded every call: (scene, recording, L2 process, plain)."""
    scene = Scene(tmp_path_factory.mktemp("l2"))
    first = scene.run("jitkey")
    loaded = scene.run("jitkey", watch=True)
    plain = scene.run("plain", watch=True)
    return scene, first, loaded, plain


def test_a_fresh_process_loads_exactly_the_kernel_triton_loads(warm: Any) -> None:
    _, first, loaded, plain = warm
    assert all("error" not in c for c in plain["calls"])
    assert first["l2"] == {"on": True, "why": None}
    assert l2(first, "l2_misses") == len(CALLS) and l2(first, "l2_recorded") == len(CALLS)
    assert l2(first, "l2_hits") == 0
    # The later process: every call from the L2; neither Triton's compile path, triton_key() nor its binder ran,
    # nor was the binder generated (nor Gluon imported, as Triton's first binder call does), nor a kernel's
    # source parsed (its cache_key walk replayed).
    assert l2(loaded, "l2_hits") == len(CALLS) and l2(loaded, "l2_misses") == 0
    assert loaded["watched"] == [] and loaded["gluon"] is False
    # The watch is real: the plain process ran all of them.
    assert {
        "compile",
        "triton_key",
        "_do_compile",
        "dynamic_func",
        "create_function_from_signature",
        "parse",
    } <= set(plain["watched"]) and plain["gluon"]
    assert all(s["fallbacks"] == 0 for s in loaded["stats"].values())
    assert_same(loaded, plain)
    assert_same(first, plain)
    assert loaded["report"]["l2_hits"] == len(CALLS)
    # Each kernel's cache_key walked by Triton (and recorded, its helper's too) first; all replayed later.
    assert first["report"]["l2_walks"] == {"replayed": 0, "walked": 3}  # (helper: inside add's walk)
    assert loaded["report"]["l2_walks"] == {"replayed": 4, "walked": 0}


def test_the_binder_of_a_loaded_kernel_binds_as_tritons_at_its_first_use(warm: Any) -> None:
    """The L2 leaves the binder to be generated at its first call: Triton's own path through the kernel (here a
    warmup, then a launch through ``JITFunction.run``) gets what Triton's own binder gives, and compiles
    nothing new."""
    scene = warm[0]
    then = """
from triton.runtime.jit import JITFunction, create_function_from_signature
k = mod.add
_, _, _, backend, binder = k.device_caches[0]
x, y, out = (torch.empty(4096 + 16, dtype=torch.float32) for _ in range(3))
lazy = type(binder).__name__
got = binder(x, y, out, 4096, BLOCK=256, debug=False)
ref = create_function_from_signature(k.signature, k.params, backend)(x, y, out, 4096, BLOCK=256, debug=False)
JITFunction.run(k, x, y, out, 4096, grid=(4,), warmup=True, BLOCK=256)
JITFunction.run(k, x, y, out, 4096, grid=(4,), warmup=False, BLOCK=256)
extra = [lazy, repr(got) == repr(ref), len(k.device_caches[0][0])]
"""
    rep = scene.run("jitkey", then=then)
    lazy, same, kernels = rep["extra"]
    assert lazy == "LazyBinder" and same
    assert l2(rep, "l2_hits") == len(CALLS) and l2(rep, "l2_misses") == 0
    assert kernels == sum(
        c[0] == "add" for c in CALLS
    )  # Triton's own path found the L2's kernel in its cache


def test_the_loaded_kernel_is_a_compiled_kernel_in_every_detail(warm: Any) -> None:
    _, _, loaded, plain = warm
    for a, b in zip(loaded["calls"], plain["calls"], strict=True):
        assert a["type"] == "CompiledKernel" and a["vars"] == b["vars"]
        assert set(a["asm"]) >= {"cubin", "ptx", "ttir"} and a["asm"] == b["asm"]


# One call per kernel: the scenarios below each compile their own Triton cache (a copied cache's group files name
# the original's paths, and TRITON_CACHE_DIR is part of the key).
SMALL = [CALLS[0], CALLS[3], CALLS[5]]


def recorded(root: Path, calls: list[list[Any]] = SMALL) -> tuple[Scene, dict[str, Any]]:
    """A scene whose L2 recorded ``calls`` (Triton compiled them), and the recording run."""
    scene = Scene(root, calls=calls)
    rep = scene.run("jitkey")
    assert l2(rep, "l2_recorded") == len(calls)
    return scene, rep


def hashes(rep: dict[str, Any]) -> list[str]:
    return [c["hash"] for c in rep["calls"]]


@pytest.mark.parametrize(
    ("what", "old", "new", "changed"),
    [
        ("helper", "return x * 2", "return x * 3", {"add"}),  # test_nested1_change & co
        (
            "global",
            "SCALE = tl.constexpr(3)",
            "SCALE = tl.constexpr(4)",
            {"scale"},
        ),  # test_kernel_global_var_change
        ("body", "tl.load(x_ptr + i) + 1)", "tl.load(x_ptr + i) + 2)", {"checked"}),  # test_toplevel_change
        ("lines", "SCALE = tl.constexpr(3)", "\nSCALE = tl.constexpr(3)", {"add", "scale", "checked"}),
        ("debug", "@triton.jit(debug=True)", "@triton.jit(debug=False)", {"checked"}),  # test_jit_debug
    ],
)
def test_a_changed_kernel_misses_and_gets_tritons_kernel(
    tmp_path: Path, what: str, old: str, new: str, changed: set[str]
) -> None:
    """runtime/test_cache.py's changes: what they change misses, the rest still hits, and what is launched is
    what plain Triton launches for the changed source."""
    scene, before = recorded(tmp_path)
    assert old in KERNELS
    scene.write(KERNELS.replace(old, new))
    jk, plain = scene.run("jitkey"), scene.run("plain")
    assert_same(jk, plain)
    for (name, _, _), a, b in zip(SMALL, jk["calls"], before["calls"], strict=True):
        assert (a["hash"] != b["hash"]) == (name in changed), (what, name)
    stats = jk["stats"]
    assert {n for n in stats if stats[n]["l2_misses"]} == changed
    assert {n for n in stats if stats[n]["l2_hits"]} == {"add", "scale", "checked"} - changed
    again = scene.run("jitkey", watch=True)  # the changed kernels were recorded in turn
    assert l2(again, "l2_hits") == len(SMALL) and again["watched"] == []
    assert_same(again, plain)


@pytest.mark.parametrize(
    ("what", "env"),
    [
        ("env", {"TRITON_DEFAULT_FP_FUSION": "0"}),  # a cache-invalidating variable (and an option default)
        ("ptxas", {"TRITON_MOCK_PTX_VERSION": "12.0"}),  # what backend.hash() reads
        ("arch", {"TRITON_OVERRIDE_ARCH": "sm80"}),  # a knob CUDAOptions reads
    ],
)
def test_the_environment_is_part_of_the_key(tmp_path: Path, what: str, env: dict[str, str]) -> None:
    scene, before = recorded(tmp_path)
    jk, plain = scene.run("jitkey", **env), scene.run("plain", **env)
    assert_same(jk, plain)
    assert l2(jk, "l2_hits") == 0 and set(hashes(jk)).isdisjoint(hashes(before)), what
    again = scene.run("jitkey", watch=True, **env)  # recorded under the changed environment
    assert l2(again, "l2_hits") == len(SMALL)
    assert_same(again, plain)
    back = scene.run("jitkey", watch=True)  # and the original environment still finds its kernels
    assert l2(back, "l2_hits") == len(SMALL) and hashes(back) == hashes(before)


@pytest.mark.parametrize(
    "setup",
    [
        "triton.knobs.runtime.debug = True",  # jit(debug=...) and TRITON_DEBUG
        "triton.knobs.language.default_fp_fusion = False",
        "triton.knobs.nvidia.mock_ptx_version = '12.1'",
        "triton.knobs.runtime.override_arch = 'sm80'",
    ],
)
def test_knobs_set_in_process_are_part_of_the_key(tmp_path: Path, setup: str) -> None:
    scene, before = recorded(tmp_path)
    jk, plain = scene.run("jitkey", setup=setup), scene.run("plain", setup=setup)
    assert_same(jk, plain)
    assert l2(jk, "l2_hits") == 0 and hashes(jk) != hashes(
        before
    )  # checked is debug already: it compiles alike
    back = scene.run("jitkey", watch=True)  # the knobs as they were: the recorded kernels again
    assert l2(back, "l2_hits") == len(SMALL) and hashes(back) == hashes(before)


def test_a_triton_upgrade_misses(tmp_path: Path) -> None:
    scene, before = recorded(tmp_path)
    upgraded = (
        "from jitkey.triton import _installation\n"
        "_installation.fingerprint = lambda: b'another installation of triton'.ljust(32)\n"
    )
    jk = scene.run("jitkey", setup=upgraded)
    assert l2(jk, "l2_hits") == 0 and l2(jk, "l2_misses") == len(SMALL)
    assert hashes(jk) == hashes(before)  # (the same Triton, in truth: its own cache still serves it)
    assert l2(scene.run("jitkey"), "l2_hits") == len(SMALL)  # the real installation's records are intact


def _entry_files(scene: Scene, rep: dict[str, Any], ext: str) -> list[Path]:
    from triton.runtime.cache import _base32

    return [p for h in hashes(rep) for p in (scene.triton_cache / _base32(h)).glob(f"*.{ext}") if p.is_file()]


@pytest.mark.parametrize(
    "damage", ["delete entry", "delete file", "truncate", "replace", "touch", "metadata", "record"]
)
def test_files_changed_under_the_l2_are_misses(tmp_path: Path, damage: str) -> None:
    scene, before = recorded(tmp_path)
    cubins = _entry_files(scene, before, "cubin")
    assert len(cubins) == len(SMALL)
    victim = cubins[0]
    if damage == "delete entry":  # e.g. rm -rf of Triton's cache: Triton compiles it again
        shutil.rmtree(victim.parent)
    elif (
        damage == "delete file"
    ):  # Triton 3.6 then builds the kernel without its binary and fails: as it does
        victim.unlink()
    elif damage == "truncate":  # in place, the modification time put back
        st = victim.stat()
        with open(victim, "r+b") as f:
            f.truncate(st.st_size // 2)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "replace":  # another kernel's binary, atomically, as a writer would
        tmp = victim.with_suffix(".tmp")
        tmp.write_bytes(cubins[1].read_bytes())
        os.replace(tmp, victim)
    elif damage == "touch":
        st = victim.stat()
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif damage == "metadata":  # rewritten in place with the same size and time: the content check catches it
        meta = _entry_files(scene, before, "json")[0]
        st = meta.stat()
        text = meta.read_text()
        with open(meta, "r+") as f:
            f.write(text.replace('"num_warps": 4', '"num_warps": 8'))
        os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert meta.stat().st_size == st.st_size
    else:  # the L2's own records: every value damaged
        _damage_records(scene.index)
    jk = scene.run("jitkey")
    plain_now = scene.run("plain")  # what Triton's own path gives now: the miss gets exactly that
    assert_same(jk, plain_now)
    skipped = [k for s in jk["stats"].values() for k, n in s["l2_skipped"].items() for _ in range(n)]
    if damage == "record":
        assert l2(jk, "l2_hits") == 0 and skipped == ["a damaged L2 record"] * len(SMALL)
        assert hashes(jk) == hashes(before)
        return
    assert l2(jk, "l2_hits") == len(SMALL) - 1 and l2(jk, "l2_misses") == 1
    healed = scene.run("jitkey")
    assert_same(healed, plain_now)
    if damage == "metadata":  # Triton's entry contradicts its own key: served by Triton, never recorded
        assert skipped == [
            "Triton's cache entry is not this call's kernel",
            "not recorded: the compiled kernel's options differ from the key's",
        ]
        assert l2(healed, "l2_hits") == len(SMALL) - 1
        return
    if damage == "delete file" and "error" in jk["calls"][0]:  # 3.6 builds it without a binary and fails
        assert skipped[0] == "Triton's cache entry changed or is gone"
        assert l2(healed, "l2_hits") == len(SMALL) - 1  # nothing to record
        return
    assert skipped == ["Triton's cache entry changed or is gone"]
    assert all("error" not in c for c in jk["calls"])
    assert l2(healed, "l2_hits") == len(SMALL)  # the miss was recorded again


def _damage_records(index: Path) -> None:
    """Overwrite every L2 record's value (found by its JSON prefix in the log) with a damaged one."""
    import jitkey
    from jitkey.triton._l2 import VERSION

    data = (index / "index.v1.jki").read_bytes()
    marker = b'{"v": %d, "hash": ' % VERSION
    keys = set()
    with jitkey.DiskIndex(index) as ix:
        at = data.find(marker)
        while at >= 0:  # the record's key is among the 32-byte windows shortly before its value
            for start in range(max(0, at - 64), at - 31):
                k = data[start : start + 32]
                v = ix.get(k)
                if v is not None and data[at : at + len(v)] == v:
                    keys.add(k)
            at = data.find(marker, at + 1)
        assert len(keys) == len(SMALL)
        for k in keys:
            ix.put(k, b'{"v": %d, "hash": 7}' % VERSION)


def test_triton_cache_dir_changes_miss(tmp_path: Path) -> None:
    scene, before = recorded(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    jk = scene.run("jitkey", TRITON_CACHE_DIR=str(elsewhere))  # an empty cache: Triton compiles there
    assert l2(jk, "l2_hits") == 0 and hashes(jk) == hashes(before)
    assert any(elsewhere.iterdir())


def test_watched_or_altered_compiles_stay_on_tritons_path(tmp_path: Path) -> None:
    scene, before = recorded(tmp_path)
    setup = (
        "seen = []\n"
        "triton.knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw['key'])\n"
        "extra = seen\n"
    )
    jk = scene.run("jitkey", setup=setup)
    assert l2(jk, "l2_hits") == 0 and len(jk["extra"]) == len(SMALL)  # the hook saw every compile
    reasons = {k for s in jk["stats"].values() for k in s["l2_skipped"]}
    assert reasons == {"a jit_cache_hook or jit_post_compile_hook is set"}
    assert hashes(jk) == hashes(before)
    off = scene.run("jitkey", JITKEY_TRITON_L2="0")
    assert off["l2"] == {"on": False, "why": "JITKEY_TRITON_L2=0"} and l2(off, "l2_hits") == 0
    manager = scene.run("jitkey", TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager")
    assert l2(manager, "l2_hits") == 0
    assert {k for s in manager["stats"].values() for k in s["l2_skipped"]} == {
        "a cache manager other than Triton's default (TRITON_CACHE_MANAGER)"
    }
    assert l2(scene.run("jitkey", watch=True), "l2_hits") == len(SMALL)  # nothing of that touched the records


LAZY = r"""
import json, sys
sys.path.insert(0, {tests!r})
import _l2_child as c
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.driver import driver
import triton
from triton.backends.nvidia.driver import CudaLauncher
from jitkey.triton import _l2

made = []
class Launcher(c.Launcher):  # the recording launcher, counting how often it is made
    def __init__(self, src, metadata):
        made.append(1)
        super().__init__(src, metadata)

drv = c.FakeDriver()
drv.launcher_cls = Launcher
driver.set_active(drv)
spec = __import__("importlib").util.spec_from_file_location("l2_kernels", {module!r})
mod = __import__("importlib").util.module_from_spec(spec); spec.loader.exec_module(mod)
src = ASTSource(mod.add, {{"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}},
                {{(4,): 256}}, {{(0,): [["tt.divisibility", 16]]}})
out = {{}}
for shared in (None, 10**9):
    a = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    b = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    if shared is not None:
        for ck in (a, b):
            ck.metadata = ck.metadata._replace(shared=shared)
    res = []
    for ck, init in ((a, lambda ck: ck._init_handles()), (b, _l2._init_handles_36)):
        made.clear()
        try:
            init(ck)
            res.append(["ok", len(made)])
        except Exception as exc:
            res.append(["raised", f"{{type(exc).__name__}}: {{exc}}", len(made)])
            try:
                ck.run(1, 1, 1)
            except Exception as again:
                res[-1].append(f"{{type(again).__name__}}: {{again}}")
        res[-1].append({{k: v for k, v in vars(ck).items() if k in ("n_regs", "n_spills", "n_max_threads")}})
        res[-1].append(c.LOADS[-1] if c.LOADS else None)  # what was loaded: name, binary digest, shared, device
    lazy_made = len(made)
    if shared is None:
        b.run(4, 1, 1, 7, b.function, b.packed_metadata, None, None, None, 1, 2, 3, 4, 256)  # a call builds it
        res.append([lazy_made, len(made), type(b._run).__name__, c.LAUNCHES[-1]])
    out[str(shared)] = res
print(json.dumps(out, default=repr))
"""


def test_the_lazy_launcher_loads_as_triton_and_builds_the_launcher_at_its_first_call(tmp_path: Path) -> None:
    """Under 3.6, ``_init_handles_36`` is ``CompiledKernel._init_handles`` with the launcher made at its first call:
    the same module load, the same errors (too much shared memory), and no launcher until one is needed."""
    from jitkey.triton import _l2

    # The installed Triton's dialect by its code alone: ``_code_status()`` is None while the L2 is not opted into
    # (JITKEY_TRITON_L2=1), which the test process is not, and would skip this test everywhere.
    if _l2._KNOWN_L2_CODE.get(_l2._l2_code_digest()) != "3.6":
        pytest.skip("the lazy launcher is Triton 3.6's (3.9 builds no launcher per kernel)")
    scene = Scene(tmp_path)
    script = tmp_path / "lazy.py"
    script.write_text(LAZY.format(tests=str(HERE), module=str(scene.module)))
    env = {**os.environ, "TRITON_CACHE_DIR": str(scene.triton_cache), "JITKEY_CACHE_DIR": str(scene.index)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    triton_ok, lazy_ok, (made_before, made_after, run_type, launch) = rep["None"]
    assert triton_ok[0] == "ok" and triton_ok[1] == 1  # Triton makes its launcher in _init_handles
    assert lazy_ok == ["ok", 0, *triton_ok[2:]]  # the same module load and handles, no launcher yet
    assert (made_before, made_after, run_type) == (0, 1, "Launcher") and launch[:3] == [4, 1, 1]
    triton_err, lazy_err = rep[str(10**9)]
    assert triton_err[0] == lazy_err[0] == "raised" and "shared memory" in triton_err[1]
    assert (
        triton_err[1:2] + triton_err[3:] == lazy_err[1:2] + lazy_err[3:]
    )  # same error, same error again after


CONFLICTING = """
import triton
import triton.language as tl

G = tl.constexpr(0)


@triton.jit
def inner():
    a = G  # noqa: F841


@triton.jit
def kernel1():
    a = G  # noqa: F841
    inner()


@triton.jit
def kernel2():
    a = G  # noqa: F841
    inner()
"""


def test_a_cache_key_that_raises_leaves_the_kernel_to_raise_again(tmp_path: Path, monkeypatch: Any) -> None:
    """Triton's runtime/test_cache.py::test_conflicting_global_in_inner_function: ``cache_key`` raises for a
    kernel whose inner kernel saw another value of a global, and Triton's property leaves a placeholder hash
    behind when it raises. The L2 reads ``cache_key`` before Triton's compile path does; read through
    ``jitkey._triton_table.cache_key`` the kernel is left as it was, so Triton's own read raises the same error (read
    directly, Triton's next read would return the placeholder and compile on to another error)."""
    import importlib

    import jitkey.triton
    from jitkey._triton_table import cache_key

    (tmp_path / "conflicting_mod.py").write_text(CONFLICTING)
    monkeypatch.syspath_prepend(str(tmp_path))
    jitkey.triton.install()
    try:
        mod = importlib.import_module("conflicting_mod")
    finally:
        jitkey.triton.uninstall()
    assert isinstance(mod.kernel2, jitkey.triton.TritonKernel)
    assert cache_key(mod.kernel1)  # the inner kernel records G == 0
    mod.G = 1
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Global variable G has value 1"):
            cache_key(mod.kernel2)
        assert mod.kernel2.hash is None
    with pytest.raises(RuntimeError, match="Global variable G has value 1"):
        mod.kernel2.cache_key  # noqa: B018  (Triton's own read, after jitkey's)


ANNOTATED = """
import triton
import triton.language as tl


def annotate(**types):
    def deco(f):
        f.__annotations__ = dict(types)
        return f

    return deco


@triton.jit
@annotate(v="tl.uint8")
def store_v(x_ptr, v):
    tl.store(x_ptr, v)
"""


def test_an_annotation_set_apart_from_the_source_is_part_of_the_key(tmp_path: Path) -> None:
    """Triton's language/test_annotations.py sets a parameter's annotation with a decorator under
    ``@triton.jit``: the kernel's source (and ``cache_key``) stay the same, but Triton's binder types the int by
    the annotation and compiles another kernel. The L2 keys the annotations, so it misses and the launch is
    plain Triton's (it returned the kernel compiled for the first annotation before)."""
    scene = Scene(tmp_path, ANNOTATED, [["store_v", [["t", "float32"], 3], {}]])
    first = scene.run("jitkey")
    assert l2(first, "l2_recorded") == 1
    scene.write(ANNOTATED.replace('v="tl.uint8"', 'v="tl.int16"'))
    jk, plain = scene.run("jitkey"), scene.run("plain")
    assert_same(jk, plain)
    assert jk["calls"][0]["hash"] != first["calls"][0]["hash"]
    assert l2(jk, "l2_hits") == 0 and l2(jk, "l2_misses") == 1
    again = scene.run("jitkey")
    assert l2(again, "l2_hits") == 1
    assert_same(again, plain)


APPLY = """
import triton
import triton.language as tl


@triton.jit
def double(v):
    return v * 2


@triton.jit
def triple(v):
    return v * 3


@triton.jit
def apply(x_ptr, n, F: tl.constexpr, G: tl.constexpr = double):
    i = tl.arange(0, 128)
    m = i < n
    tl.store(x_ptr + i, G(F(tl.load(x_ptr + i, mask=m))), mask=m)
"""

APPLY_CALLS: list[list[Any]] = [
    ["apply", [["t", "float32"], 100, ["fn", "double"]], {}],
    ["apply", [["t", "float32"], 100, ["fn", "triple"]], {}],
    ["apply", [["t", "float32"], 100, ["fn", "double"]], {"G": ["fn", "triple"]}],
    ["apply", [["t", "float32"], 100], {"F": ["fn", "triple"], "G": ["fn", "triple"]}],
]


def test_a_jit_function_passed_as_a_constexpr_is_recorded_and_taken_from_the_call(tmp_path: Path) -> None:
    """A kernel that takes a jit function as a ``tl.constexpr`` (Triton's tests and kernel libraries pass
    activations that way): the record keeps the function's ``cache_key`` and a later process takes the function
    from its own call (positional, keyword or the default), so it loads what Triton loads. An edited function
    has another key: a miss, then Triton's kernel for it."""
    scene = Scene(tmp_path, APPLY, APPLY_CALLS)
    first = scene.run("jitkey")
    assert l2(first, "l2_recorded") == len(APPLY_CALLS), first["stats"]
    assert len(set(hashes(first))) == len(APPLY_CALLS)
    jk, plain = scene.run("jitkey", watch=True), scene.run("plain")
    assert l2(jk, "l2_hits") == len(APPLY_CALLS) and jk["watched"] == []
    assert_same(jk, plain)
    scene.write(APPLY.replace("return v * 3", "return v * 4"))  # triple changes: three of the calls pass it
    jk, plain = scene.run("jitkey"), scene.run("plain")
    assert_same(jk, plain)
    assert l2(jk, "l2_hits") == 1 and l2(jk, "l2_misses") == 3
    assert [a["hash"] == b["hash"] for a, b in zip(jk["calls"], first["calls"], strict=True)] == [
        True,
        False,
        False,
        False,
    ]
