"""Timing harness of ``python -m jitkey bench``: cases, timing, the table, JSON and the chart."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Iterable
from typing import Any


@dataclasses.dataclass
class Case:
    """One implementation of one benchmark, e.g. ``lookup/4 args`` with ``jitkey Signature.lookup``.

    ``stmt`` is a Python statement timed by :mod:`timeit` with ``env`` as its globals, so the call
    is made directly from the timing loop (no wrapper lambda adds its own call cost). ``check`` runs
    once before timing and must raise if the implementation gives a wrong result.
    """

    group: str
    impl: str
    stmt: str
    env: dict[str, Any]
    check: Callable[[], None]
    baseline: bool = False
    unit: str = "ns"
    setup: str = "pass"


@dataclasses.dataclass
class Result:
    """The measured times of one case (ns per call)."""

    section: str
    group: str
    impl: str
    median_ns: float
    min_ns: float
    max_ns: float
    repeats: int
    number: int
    baseline: bool
    ratio: float | None = None
    unit: str = "ns"

    def spread_pct(self) -> float:
        return 100.0 * (self.max_ns - self.min_ns) / self.median_ns if self.median_ns else 0.0


@dataclasses.dataclass
class Skipped:
    """A section or case that did not run, and why."""

    section: str
    reason: str


def progress(msg: str) -> None:
    """Progress goes to stderr so stdout stays the table."""
    sys.stderr.write(f"[jitkey bench] {msg}\n")
    sys.stderr.flush()


def time_case(case: Case, *, target_s: float, repeats: int) -> tuple[list[float], int]:
    """Times ``case`` and returns per-call ns of each repeat and the calls per repeat.

    The loop count is calibrated so one repeat takes about ``target_s`` seconds; one untimed
    repeat warms caches (and any lazy initialisation) first.
    """
    timer = timeit.Timer(case.stmt, setup=case.setup, globals=case.env)
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= target_s / 4 or number >= 1 << 24:
            break
        number *= 4 if elapsed < target_s / 40 else 2
    number = max(1, int(number * target_s / max(elapsed, 1e-9)))
    timer.timeit(number)  # warm-up
    per_call = [t / number * 1e9 for t in timer.repeat(repeat=repeats, number=number)]
    return per_call, number


def run_cases(section: str, cases: Iterable[Case], *, target_s: float, repeats: int) -> list[Result]:
    """Checks, then times, every case of a section; ratios are to the group's baseline."""
    results: list[Result] = []
    for case in cases:
        case.check()
        per_call, number = time_case(case, target_s=target_s, repeats=repeats)
        results.append(
            Result(
                section=section,
                group=case.group,
                impl=case.impl,
                median_ns=statistics.median(per_call),
                min_ns=min(per_call),
                max_ns=max(per_call),
                repeats=repeats,
                number=number,
                baseline=case.baseline,
                unit=case.unit,
            )
        )
    set_ratios(results)
    return results


def set_ratios(results: list[Result]) -> None:
    """Fills ``ratio`` = median / the group's baseline median (lower is faster)."""
    base = {r.group: r.median_ns for r in results if r.baseline}
    for r in results:
        if r.group in base and base[r.group] > 0:
            r.ratio = r.median_ns / base[r.group]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    import jitkey

    env: dict[str, Any] = {
        "jitkey": jitkey.__version__,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
    }
    for mod in ("torch", "triton"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:
            env[mod] = None
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["gpu_capability"] = list(torch.cuda.get_device_capability())
    except Exception:
        pass
    env.setdefault("gpu", None)
    loop = timeit.Timer("pass").repeat(repeat=5, number=1_000_000)
    env["timeit_loop_overhead_ns"] = round(min(loop) / 1_000_000 * 1e9, 2)
    return env


def _fmt_time(ns: float, unit: str) -> str:
    if unit == "us" or ns >= 10_000:
        return f"{ns / 1000:.2f} µs"
    return f"{ns:.0f} ns" if ns >= 100 else f"{ns:.1f} ns"


def format_table(results: list[Result], skipped: list[Skipped], env: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        f"jitkey {env['jitkey']} · Python {env['python']} ({env['implementation']}) · torch {env['torch']}"
        f" · triton {env['triton']}",
        f"CPU: {env['cpu']} ({env['cpu_count']} cores) · GPU: {env['gpu'] or 'none'}",
        "median per call over repeats (spread = (max-min)/median); ratio = median / the group's baseline (*)",
        "",
    ]
    width_g = max([len(r.group) for r in results] + [5]) + 2
    width_i = max([len(r.impl) for r in results] + [4]) + 3
    header = f"{'case':<{width_g}}{'impl':<{width_i}}{'median':>11}{'spread':>9}{'ratio':>9}"
    current = None
    # Rows of one group together, groups in the order they first appear.
    first = {}
    for i, r in enumerate(results):
        first.setdefault((r.section, r.group), i)
    sections = list(dict.fromkeys(r.section for r in results))
    ordered = sorted(results, key=lambda r: (sections.index(r.section), first[(r.section, r.group)]))
    for r in ordered:
        if r.section != current:
            current = r.section
            lines += ["", f"== {current} ==", header, "-" * len(header)]
        name = r.impl + (" *" if r.baseline else "")
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append(
            f"{r.group:<{width_g}}{name:<{width_i}}{_fmt_time(r.median_ns, r.unit):>11}"
            f"{r.spread_pct():>8.0f}%{ratio:>9}"
        )
    for s in skipped:
        lines += ["", f"== {s.section} == skipped: {s.reason}"]
    return "\n".join(lines) + "\n"


def to_json(results: list[Result], skipped: list[Skipped], env: dict[str, Any], argv: list[str]) -> str:
    """Machine-readable results (schema version 1)."""
    doc = {
        "schema": 1,
        "argv": argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": env,
        "results": [dataclasses.asdict(r) for r in results],
        "skipped": [dataclasses.asdict(s) for s in skipped],
    }
    return json.dumps(doc, indent=1)


def write_plot(results: list[Result], path: str) -> None:
    """A PNG bar chart: one panel per section, median time per impl, grouped by case.

    Raises ImportError with an install hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'jitkey[plot]' (or matplotlib)") from e

    sections = list(dict.fromkeys(r.section for r in results))
    fig, axes = plt.subplots(len(sections), 1, figsize=(11, 3.2 * len(sections)), squeeze=False)
    for ax, section in zip(axes[:, 0], sections, strict=True):
        rows = [r for r in results if r.section == section]
        labels = [f"{r.group}\n{r.impl}" for r in rows]
        values = [r.median_ns / (1000 if r.unit == "us" else 1) for r in rows]
        colors = ["#1f77b4" if r.impl.startswith("jitkey") else "#999999" for r in rows]
        ax.barh(range(len(rows)), values, color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("µs per call" if rows and rows[0].unit == "us" else "ns per call")
        ax.set_title(f"jitkey bench: {section} (blue = jitkey)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
