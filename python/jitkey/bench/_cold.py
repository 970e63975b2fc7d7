"""``jitkey bench --only cold``: the cold path of a fresh process, plain Triton against jitkey.

Every figure comes from fresh Python processes (``_cold_child.py``, run as a script so plain runs never import
jitkey), the two modes alternating (plain, jitkey, plain, ...) after one untimed warm-up run of each, so that
both see the same page cache and bytecode caches (the children run with bytecode caching on, as an installed
package has it). Times are taken inside the child around exactly the step measured; a row's figure is the
median over the runs (min and max shown as spread).

* **Decoration** (CPU and GPU): importing a module of 150 kernels decorated with ``triton.jit`` against the same
  module with ``jitkey.triton.jit``, and a kernel library's import (700 kernels, as many as FlagGems defines)
  with ``triton.jit`` against the same under ``jitkey.triton.install()``; on a GPU where FlagGems is installed,
  ``import flag_gems`` plain and under ``install()`` (set ``GEMS_VENDOR=nvidia`` as its CI does). ``torch`` and
  ``triton`` are imported first; jitkey's own import is part of its figure.
* **First launch** (an NVIDIA GPU): 30 kernels x 2 dtypes, Triton's cache and jitkey's disk index warm (prepared
  first: one plain and one jitkey process compile and record every variant). Per process: its very first launch
  (the one-time costs: Triton's installation hash, the driver, jitkey's detection), the first launch of each
  variant after that (a kernel loaded from Triton's cache, or jitkey's L2), and the second launch of each
  variant. Host time of the launch call; the results are checked against torch after the timed launches.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jitkey.bench._harness import Result, SelfTimed, Skipped, progress, set_ratios

CHILD = Path(__file__).with_name("_cold_child.py")

KERNEL = """
@{dec}
def k{i}(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x + y * {i}, mask=m)
"""


def kernel_module(path: Path, n: int, dec: str) -> Path:
    """A module of ``n`` kernels ``k0..k{n-1}`` (``out = x + y * i``), decorated with ``dec``."""
    head = "import triton\nimport triton.language as tl\n"
    if dec.startswith("jitkey"):
        head += "import jitkey.triton\n"
    path.write_text(head + "".join(KERNEL.format(dec=dec, i=i) for i in range(n)))
    return path


@dataclasses.dataclass
class ColdCase:
    """One comparison: the same step in plain and jitkey processes."""

    group: str
    phase: str  # "decorate" | "launch"
    modes: dict[str, tuple[str, Path]]  # impl label -> (child mode, kernels module)
    baseline: str
    kernels: int
    dtypes: tuple[str, ...] = ()
    library: str | None = None  # an installed kernel library imported by name


def _child_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode cached
    env["TRITON_CACHE_DIR"] = str(root / "triton-cache")  # the bench's own caches, prepared by it
    env["JITKEY_CACHE_DIR"] = str(root / "jitkey-index")
    for name in ("JITKEY_TRITON", "JITKEY_TRITON_L2", "JITKEY_DISK_CACHE"):
        env.pop(name, None)
    env["JITKEY_TRITON_L2"] = "1"  # what the cold bench measures (the L2 is opt-in)
    return env


def _run_child(cfg: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"cold bench child failed ({cfg['phase']}, {cfg['mode']}):\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _result(group: str, impl: str, values: list[float], baseline: bool, repeats: int, unit: str) -> Result:
    scale = 1e9  # seconds -> ns
    return Result(
        section="cold",
        group=group,
        impl=impl,
        median_ns=statistics.median(values) * scale,
        min_ns=min(values) * scale,
        max_ns=max(values) * scale,
        repeats=repeats,
        number=1,
        baseline=baseline,
        unit=unit,
    )


@dataclasses.dataclass
class ColdRun(SelfTimed):
    """The cold section: builds its modules, runs its processes, and turns their figures into rows."""

    quick: bool
    gpu_reason: str | None
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        what = "decoration" if self.gpu_reason else "decoration and first launches"
        return f"{what}, fresh processes, modes alternating, {self._repeats()} runs each"

    def _repeats(self) -> int:
        return 2 if self.quick else 7

    def cases(self, root: Path) -> list[ColdCase]:
        cases = [
            ColdCase(
                "decoration/150 kernels (import incl. one-time costs)",
                "decorate",
                {
                    "triton.jit": ("plain", kernel_module(root / "plain150.py", 150, "triton.jit")),
                    "jitkey.triton.jit": (
                        "jitkey",
                        kernel_module(root / "jitkey150.py", 150, "jitkey.triton.jit"),
                    ),
                },
                "triton.jit",
                150,
            ),
            ColdCase(
                "decoration/library of 700 kernels",
                "decorate",
                {
                    "triton.jit": ("plain", kernel_module(root / "lib700.py", 700, "triton.jit")),
                    "triton.jit + jitkey install()": ("install", root / "lib700.py"),
                },
                "triton.jit",
                700,
            ),
        ]
        if (
            self.gpu_reason is None and importlib.util.find_spec("flag_gems") is not None
        ):  # it needs a GPU to import
            none = root / "unused.py"
            cases.append(
                ColdCase(
                    "decoration/import flag_gems",
                    "decorate",
                    {
                        "import flag_gems": ("plain", none),
                        "import flag_gems under jitkey install()": ("install", none),
                    },
                    "import flag_gems",
                    0,
                    library="flag_gems",
                )
            )
        if self.gpu_reason is None:
            module = kernel_module(root / "launch30.py", 30, "triton.jit")
            cases.append(
                ColdCase(
                    "launch",
                    "launch",
                    {"triton": ("plain", module), "jitkey": ("install", module)},
                    "triton",
                    30,
                    ("float32", "float16"),
                )
            )
        else:
            self.skipped.append(Skipped("cold", f"first launches: {self.gpu_reason}"))
        return cases

    def results(self) -> list[Result]:
        with tempfile.TemporaryDirectory(prefix="jitkey-cold-") as tmp:
            root = Path(tmp)
            env = _child_env(root)
            out: list[Result] = []
            for case in self.cases(root):
                out += self._run_case(case, env)
            set_ratios(out)
            return out

    def _run_case(self, case: ColdCase, env: dict[str, str]) -> list[Result]:
        runs = self._repeats()
        cfg = {
            "phase": case.phase,
            "kernels": case.kernels,
            "dtypes": list(case.dtypes),
            "library": case.library,
        }
        if (
            case.phase == "launch"
        ):  # warm Triton's cache and jitkey's index: every variant compiled and recorded
            progress(f"cold: preparing {case.kernels} kernels x {len(case.dtypes)} dtypes (compiles once)")
            for mode, module in case.modes.values():
                _run_child({**cfg, "mode": mode, "module": str(module)}, env)
        got: dict[str, list[dict[str, Any]]] = {impl: [] for impl in case.modes}
        for r in range(runs + 1):  # the first round warms up and is not counted
            for impl, (mode, module) in case.modes.items():
                progress(f"cold: {case.group} · {impl} ({'warm-up' if r == 0 else f'{r}/{runs}'})")
                one = _run_child({**cfg, "mode": mode, "module": str(module)}, env)
                if r:
                    got[impl].append(one)
        rows: list[Result] = []
        for impl, res in got.items():
            base = impl == case.baseline
            if case.phase == "decorate":
                rows.append(_result(case.group, impl, [x["seconds"] for x in res], base, runs, "ms"))
                continue
            if impl != case.baseline and any(x.get("l2_misses") for x in res):
                raise RuntimeError(
                    "cold: jitkey missed its disk index after the preparation (see jitkey info)"
                )
            n = len(res[0]["first"])
            rows.append(
                _result(
                    "launch/the process's first launch", impl, [x["first"][0] for x in res], base, runs, "ms"
                )
            )
            rows.append(
                _result(
                    f"launch/first launch per variant (median of {n - 1})",
                    impl,
                    [statistics.median(x["first"][1:]) for x in res],
                    base,
                    runs,
                    "us",
                )
            )
            rows.append(
                _result(
                    f"launch/all {n - 1} first launches after it",
                    impl,
                    [sum(x["first"][1:]) for x in res],
                    base,
                    runs,
                    "ms",
                )
            )
            rows.append(
                _result(
                    f"launch/second launch per variant (median of {n})",
                    impl,
                    [statistics.median(x["second"]) for x in res],
                    base,
                    runs,
                    "us",
                )
            )
        return rows
