"""A fresh process's cold path: what ``import jitkey.triton`` and decoration do (nothing that can wait for the
first launch), and the detection computed once per installation (``jitkey.triton._installation``).

Each test runs its scenario in child processes with their own ``JITKEY_CACHE_DIR``, since what they check is
what a fresh process does. Timing goals live in ``jitkey bench --only cold``, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")


def run_child(*code: str, cache: Path, **env: str) -> dict:
    """Runs the ``code`` parts (each dedented) in a fresh interpreter with ``JITKEY_CACHE_DIR=cache``; its last
    stdout line is JSON."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("JITKEY_DISK_CACHE", "JITKEY_TRITON_L2")}
    full_env.update(JITKEY_CACHE_DIR=str(cache), **env)
    script = cache.parent / f"child_{len(list(cache.parent.glob('child_*.py')))}.py"  # kernels need a file
    script.write_text("\n".join(textwrap.dedent(part) for part in code))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=full_env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


KERNELS = """
import triton.language as tl
import jitkey.triton as jt

@jt.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i) + tl.load(y + i), mask=i < n)

@jt.jit(do_not_specialize=["n"])
def scale(x, n, S: tl.constexpr = 2):
    tl.store(x + n, S)
"""


def test_import_and_decoration_leave_everything_to_the_first_launch(tmp_path: Path) -> None:
    rep = run_child(
        """
        import json, sys
        import torch, triton
        before = set(sys.modules)
        import jitkey.triton as jt
        """,
        KERNELS,
        """
        imported = sorted(m for m in set(sys.modules) - before if m.startswith("jitkey"))  # import and decoration
        from jitkey.triton import _installed
        k = add
        state = {
            "imported": imported,
            "instance_jk": sorted(n for n in vars(k) if n.startswith("_jk_")),
            "info_made": _installed.triton_info.cache_info().currsize,
            "registry": len(jt._kernel.registry()),
            "made": jt.report()["kernels"],
        }
        problem = k.fast_path_problem  # the first inspection makes jitkey's part
        state.update(problem=problem, after_registry=len(jt._kernel.registry()), ready=k._jk_ready)
        print(json.dumps(state))
        """,
        cache=tmp_path / "jk",
    )
    heavy = {"jitkey.rules", "jitkey.fnkey", "jitkey.remote", "jitkey.env", "jitkey.triton.autotune"}
    heavy |= {
        "jitkey.triton._installed",
        "jitkey.triton._installation",
        "jitkey.triton._l2",
        "jitkey.triton._watch",
    }
    assert heavy.isdisjoint(rep["imported"]), rep["imported"]
    assert rep["instance_jk"] == []  # decoration sets none of jitkey's own attributes
    assert rep["info_made"] == 0  # Triton's internals are inspected at the first launch, not at decoration
    assert rep["registry"] == 0 and rep["made"] == 2  # both kernels count; neither has statistics yet
    assert rep["problem"] is None and rep["after_registry"] == 1 and rep["ready"] is True


def test_install_imports_the_redis_tier_only_when_it_is_configured(tmp_path: Path) -> None:
    """``install()`` runs at a kernel library's import: without ``JITKEY_REMOTE_CACHE`` it asks the variable and
    imports nothing of the tier (``jitkey.remote`` and its protocol module cost about as much as the rest of
    ``install()``); with it, Triton's cache manager is the tiered one, as before."""
    code = """
        import json, os, sys
        import torch, triton
        from triton import knobs
        import jitkey.triton as jt
        before = set(sys.modules)
        jt.install()
        imported = sorted(m for m in set(sys.modules) - before if m.startswith("jitkey"))
        manager = knobs.cache.manager_class
        print(json.dumps({"imported": imported, "manager": None if manager is None else manager.__name__}))
        """
    off = run_child(code, cache=tmp_path / "off")
    assert off["manager"] is None
    assert {"jitkey.remote", "jitkey._resp"}.isdisjoint(off["imported"]), off["imported"]
    on = run_child(code, cache=tmp_path / "on", JITKEY_REMOTE_CACHE="redis://127.0.0.1:1/0")
    assert on["manager"] == "TieredCacheManager"


def test_the_autotuner_imports_at_first_use_and_keeps_its_names(tmp_path: Path) -> None:
    rep = run_child(
        """
        import json, sys
        from jitkey.triton.autotune import SCHEMA  # the submodule first: the package's name stays the function
        import jitkey.triton as jt
        from jitkey.triton import autotune, PersistentAutotuner
        print(json.dumps({
            "fn": callable(autotune) and autotune is jt.autotune and type(autotune).__name__ == "function",
            "cls": PersistentAutotuner.__name__, "schema": SCHEMA,
        }))
        """,
        cache=tmp_path / "jk",
    )
    assert rep == {"fn": True, "cls": "PersistentAutotuner", "schema": "jitkey.triton.autotune"}


INSPECT = """
import json, inspect
import triton
import jitkey.triton as jt
from jitkey.triton import _installed

calls = []
real = inspect.getsource
def counting(obj):
    calls.append(getattr(obj, "__qualname__", "?"))
    return real(obj)
inspect.getsource = counting
info = _installed.TritonInfo()
print(json.dumps({
    "calls": len(calls),
    "facts": [info.problem, info.knob_reads, info.checks_stages_hook, info.launch_dialect,
              info.driver_launch_problem, info.plan_call is not None],
}))
"""


def test_triton_detection_is_read_once_per_installation(tmp_path: Path) -> None:
    cache = tmp_path / "jk"
    first = run_child(INSPECT, cache=cache)
    second = run_child(INSPECT, cache=cache)
    assert first["calls"] > 0  # the first process reads Triton's source
    assert second["calls"] == 0  # a later one reads the result back from the disk index
    assert second["facts"] == first["facts"]
    other = run_child(INSPECT, cache=tmp_path / "other")  # another index: inspected again, same facts
    assert other["calls"] > 0 and other["facts"] == first["facts"]


def test_patched_triton_code_is_inspected_again(tmp_path: Path) -> None:
    cache = tmp_path / "jk"
    run_child(INSPECT, cache=cache)
    patched = run_child(
        """
        from triton.backends.nvidia import driver as nv
        original = nv.CudaLauncher.__call__
        def __call__(self, *args):  # another function under the same name: the launcher is not Triton's own
            return original(self, *args)
        nv.CudaLauncher.__call__ = __call__
        """,
        INSPECT,
        cache=cache,
    )
    assert patched["calls"] > 0
    dialect, why = patched["facts"][3], patched["facts"][4]
    assert dialect is None and "CudaLauncher.__call__ is not" in why


def test_a_damaged_detection_record_is_computed_again(tmp_path: Path) -> None:
    import triton

    import jitkey
    from jitkey.triton import _installation, _installed

    cache = tmp_path / "jk"
    run_child(INSPECT, cache=cache)
    identity = _installed._inspected_identity(str(triton.__version__))  # the child's: same code, same files
    key = jitkey.digest((_installation.SCHEMA, _installation.VERSION, _installed.FACTS_MEMO, identity))
    with jitkey.DiskIndex(cache) as ix:
        assert ix.get(key) is not None
        ix.put(key, b"\xff not json")
    again = run_child(INSPECT, cache=cache)
    assert again["calls"] > 0 and again["facts"][0] is None
    with jitkey.DiskIndex(cache) as ix:
        assert json.loads(ix.get(key))["v"]["problem"] is None  # and stored again


def test_triton_key_is_computed_once_per_installation(tmp_path: Path) -> None:
    code = """
        import json
        import triton.runtime.cache as c
        calls = []
        real = c.triton_key
        def counting():
            calls.append(1)
            return real()
        c.triton_key = counting
        from jitkey.env import _triton_key
        print(json.dumps({"key": _triton_key(), "calls": len(calls)}))
    """
    cache = tmp_path / "jk"
    first, second = run_child(code, cache=cache), run_child(code, cache=cache)
    assert first["calls"] == 1 and second["calls"] == 0
    assert first["key"] == second["key"] and len(first["key"]) == 64


def test_the_fingerprint_follows_the_files(tmp_path: Path) -> None:
    from jitkey.triton import _installation

    root = tmp_path / "pkg"
    (root / "sub" / "__pycache__").mkdir(parents=True)
    (root / "include").mkdir()
    for name in ("a.py", "sub/b.so", "sub/__pycache__/b.pyc", "include/c.h"):
        (root / name).write_bytes(b"x")
    files = _installation.package_files(str(root))
    assert [Path(f).relative_to(root).as_posix() for f in files] == ["a.py", "sub/b.so"]

    def ident() -> tuple:
        return tuple(_installation.file_identity(p) for p in _installation.package_files(str(root)))

    before = ident()
    (root / "sub" / "b.so").write_bytes(b"xy")  # size
    after_size = ident()
    os.utime(root / "a.py", ns=(1, 1))  # mtime
    after_mtime = ident()
    (root / "new.py").write_bytes(b"")  # a new file
    after_new = ident()
    assert len({before, after_size, after_mtime, after_new}) == 4
    assert _installation.file_identity(str(root / "missing")) == (str(root / "missing"),)


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("0", "the disk index is memory-only"),  # JITKEY_DISK_CACHE=0
        ("bogus", "no disk index (ValueError"),  # a bad value: DiskIndex() refuses it
    ],
)
def test_without_a_usable_disk_index_detection_runs_per_process_and_the_l2_is_off(
    tmp_path: Path, setting: str, why: str
) -> None:
    code = INSPECT.replace("print(json.dumps({", "l2 = jt.fast_paths()['l2']\nprint(json.dumps({'l2': l2,", 1)
    assert code != INSPECT
    cache = tmp_path / "jk"
    first = run_child(code, cache=cache, JITKEY_DISK_CACHE=setting, JITKEY_TRITON_L2="1")
    second = run_child(code, cache=cache, JITKEY_DISK_CACHE=setting, JITKEY_TRITON_L2="1")
    assert first["calls"] > 0 and second["calls"] > 0  # nothing persisted: inspected in each process
    assert second["facts"] == first["facts"] and first["facts"][0] is None  # and the fast path is still on
    assert second["l2"]["on"] is False and why in second["l2"]["why"]


L2_CODE = """
import json
import triton
from jitkey.triton import _l2

calls = []
digest = _l2._l2_code_digest
_l2._l2_code_digest = lambda: calls.append(1) or digest()
print(json.dumps({"status": list(_l2._code_status()), "calls": len(calls)}))
"""


def test_the_l2_code_digest_is_read_once_per_installation_whatever_the_hash_seed(tmp_path: Path) -> None:
    """The digest of the Triton code the L2 mirrors (its source, read with ``inspect``: about 0.1 s) is kept under
    the identity of that code. A set display in it compiles to a ``frozenset`` constant whose ``repr`` follows
    the process's string hash: the identity must not, or every process reads the source again."""
    cache = tmp_path / "jk"
    first = run_child(L2_CODE, cache=cache, JITKEY_TRITON_L2="1", PYTHONHASHSEED="1")
    second = run_child(L2_CODE, cache=cache, JITKEY_TRITON_L2="1", PYTHONHASHSEED="2")
    assert first["status"][1] is None and first["calls"] == 1
    assert second["status"] == first["status"] and second["calls"] == 0
