"""Timing harness of ``python -m jitkey bench``: cases, timing, the table, JSON and the chart."""

from __future__ import annotations

import dataclasses
import json
import math
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

    def function(self) -> Callable[[], None]:
        """The statement as a function of no arguments with ``env`` (after ``setup``) as its globals, the way
        :mod:`timeit` runs it (assignments in it are locals): what benches/ times under pytest-benchmark."""
        scope = dict(self.env)
        exec(self.setup, scope)
        exec("def _case():\n    " + self.stmt, scope)
        return scope["_case"]  # type: ignore[no-any-return]


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
    #: median / the group's driver floor (launch rows measured with one), e.g. jitkey / driver floor
    floor_ratio: float | None = None

    def spread_pct(self) -> float:
        return 100.0 * (self.max_ns - self.min_ns) / self.median_ns if self.median_ns else 0.0


@dataclasses.dataclass
class Skipped:
    """A section or case that did not run, and why."""

    section: str
    reason: str


class SelfTimed:
    """A section that times itself (GPU launches need syncs between batches; cold starts need fresh processes)
    instead of a list of :class:`Case`: ``describe()`` for the progress line, ``results()`` its rows, and
    ``skipped``, parts that could not run (filled by ``results()``)."""

    skipped: list[Skipped]

    def describe(self) -> str:
        raise NotImplementedError

    def results(self) -> list[Result]:
        raise NotImplementedError


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


def run_cases(
    section: str,
    cases: Iterable[Case],
    *,
    target_s: float,
    repeats: int,
    start: int = 0,
    total: int | None = None,
) -> list[Result]:
    """Checks, then times, every case of a section; ratios are to the group's baseline.

    Progress (``[i/total] group · impl``) goes to stderr; ``start`` is the count of cases run before."""
    results: list[Result] = []
    cases = list(cases)
    total = total if total is not None else start + len(cases)
    for i, case in enumerate(cases, start + 1):
        progress(f"[{i}/{total}] {section}: {case.group} · {case.impl}")
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


SPREAD_FLAG_PCT = 30
"""Rows whose spread ((max - min) / median over the repeats) is above this are flagged as noisy."""

SCHEMA = 1


def environment() -> dict[str, Any]:
    """What the figures were measured on: ``jitkey info``'s facts (versions, fast paths, ``JITKEY_*``)
    plus the timing loop's own overhead."""
    from jitkey._info import collect

    env = collect()
    loop = timeit.Timer("pass").repeat(repeat=5, number=1_000_000)
    env["timeit_loop_overhead_ns"] = round(min(loop) / 1_000_000 * 1e9, 2)
    return env


def group_unit(rows: list[Result]) -> str:
    """One unit per group: ms when a row was measured in ms; µs when a row was measured in µs, or every row
    takes at least 1 µs and one at least 10 µs; else ns."""
    medians = [r.median_ns for r in rows]
    if any(r.unit == "ms" for r in rows):
        return "ms"
    if any(r.unit == "us" for r in rows) or (min(medians) >= 1_000 and max(medians) >= 10_000):
        return "us"
    return "ns"


def fmt_time(ns: float, unit: str) -> str:
    if unit == "ms":
        return f"{ns / 1e6:.2f} ms"
    if unit == "us":
        return f"{ns / 1000:.2f} µs"
    return f"{ns:.0f} ns" if ns >= 100 else f"{ns:.1f} ns"


def _ordered(results: list[Result]) -> list[Result]:
    """Rows of one group together, sections and groups in the order they first appear."""
    first: dict[tuple[str, str], int] = {}
    for i, r in enumerate(results):
        first.setdefault((r.section, r.group), i)
    sections = list(dict.fromkeys(r.section for r in results))
    return sorted(results, key=lambda r: (sections.index(r.section), first[(r.section, r.group)]))


def _groups(results: list[Result]) -> dict[tuple[str, str], list[Result]]:
    out: dict[tuple[str, str], list[Result]] = {}
    for r in _ordered(results):
        out.setdefault((r.section, r.group), []).append(r)
    return out


def fast_path_summary(env: dict[str, Any]) -> list[str]:
    """``fast paths: a on · b OFF · c unknown`` plus one line per path that is off, with the reason."""
    fps = env.get("fast_paths") or {}
    if not fps:
        return []
    state = {True: "on", False: "OFF", None: "unknown"}
    lines = ["fast paths: " + " · ".join(f"{n} {state[fp.get('on')]}" for n, fp in fps.items())]
    lines += [f"  {n} is off: {fp.get('why')}" for n, fp in fps.items() if fp.get("on") is False]
    return lines


def env_caption(env: dict[str, Any]) -> str:
    """One line naming the machine and the software."""
    return (
        f"jitkey {env.get('jitkey')} · Python {env.get('python')} ({env.get('implementation')}) · "
        f"torch {env.get('torch')} · triton {env.get('triton')} · CPU: {env.get('cpu')} "
        f"({env.get('cpu_count')} cores) · GPU: {env.get('gpu') or 'none'}"
    )


def format_table(results: list[Result], skipped: list[Skipped], env: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        env_caption(env),
        *fast_path_summary(env),
        *(f"{k}={v}" for k, v in (env.get("env") or {}).items()),
        "median per call over repeats (spread = (max-min)/median); ratio = median / the group's baseline (*)",
    ]
    if any(r.floor_ratio is not None for r in results):
        lines.append("vs floor = median / the group's driver floor (the launch rows measured with one)")
    width_g = max([len(r.group) for r in results] + [5]) + 2
    width_i = max([len(r.impl) for r in results] + [4]) + 3
    header = f"{'case':<{width_g}}{'impl':<{width_i}}{'median':>11}{'spread':>9}{'ratio':>9}"
    floors = {r.section for r in results if r.floor_ratio is not None}
    current = None
    noisy = 0
    for (section, _), rows in _groups(results).items():
        if section != current:
            current = section
            h = header + (f"{'vs floor':>10}" if section in floors else "")
            lines += ["", f"== {current} ==", h, "-" * len(h)]
        unit = group_unit(rows)
        for r in rows:
            name = r.impl + (" *" if r.baseline else "")
            ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
            flag = " !" if r.spread_pct() > SPREAD_FLAG_PCT else ""
            noisy += bool(flag)
            vs_floor = ""
            if section in floors:
                vs_floor = f"{r.floor_ratio:.2f}x" if r.floor_ratio is not None else "-"
            lines.append(
                f"{r.group:<{width_g}}{name:<{width_i}}{fmt_time(r.median_ns, unit):>11}"
                f"{r.spread_pct():>8.0f}%{ratio:>9}{vs_floor:>10}{flag}"
            )
    for s in skipped:
        lines += ["", f"== {s.section} == skipped: {s.reason}"]
    if noisy:
        lines += [
            "",
            f"! {noisy} row(s) with a spread above {SPREAD_FLAG_PCT}%: the machine was busy while they ran."
            " Rerun them (e.g. jitkey bench --only SECTION) on a quieter machine before trusting those figures.",
        ]
    return "\n".join(lines) + "\n"


def to_json(results: list[Result], skipped: list[Skipped], env: dict[str, Any], argv: list[str]) -> str:
    """Machine-readable results (schema version 1; ``spread_pct`` and ``noisy`` per result)."""
    rows = []
    for r in results:
        d = dataclasses.asdict(r)
        if d["floor_ratio"] is None:  # only the launch rows measured with a driver floor have one
            del d["floor_ratio"]
        d["spread_pct"] = round(r.spread_pct(), 2)
        d["noisy"] = r.spread_pct() > SPREAD_FLAG_PCT
        rows.append(d)
    doc = {
        "schema": SCHEMA,
        "argv": argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "spread_flag_pct": SPREAD_FLAG_PCT,
        "environment": env,
        "results": rows,
        "skipped": [dataclasses.asdict(s) for s in skipped],
    }
    return json.dumps(doc, indent=1)


def load_results(path: str) -> dict[str, Any]:
    """An earlier ``--json`` file, checked enough to compare against (ValueError if it is not one)."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("results"), list):
        raise ValueError(f"not a jitkey bench --json file of schema {SCHEMA}")
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not {"section", "group", "impl", "median_ns"} <= r.keys():
            raise ValueError("a result lacks section/group/impl/median_ns")
        if not all(isinstance(r[k], str) for k in ("section", "group", "impl")):
            raise ValueError(f"result #{i}: section, group and impl must be strings")
        for k in ("median_ns", "min_ns", "max_ns"):
            v = r.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"result #{i}: {k} must be a number of nanoseconds, got {v!r}")
    env = doc.get("environment", {})
    if not isinstance(env, dict) or not isinstance(env.get("fast_paths", {}), dict):
        raise ValueError("environment must be an object (with fast_paths an object)")
    if not all(isinstance(v, dict) or v is None for v in env.get("fast_paths", {}).values()):
        raise ValueError("environment.fast_paths must map names to objects")
    return doc


def format_compare(results: list[Result], env: dict[str, Any], old: dict[str, Any], path: str) -> str:
    """Each case's median against the same case in an earlier run (new / old; lower is faster), and what
    differs between the two environments."""
    old_env = old.get("environment") or {}
    lines = ["", f"== compared with {path} ({old.get('time', '?')}) =="]
    diffs = []
    for k in ("jitkey", "python", "torch", "triton", "cpu", "gpu", "platform"):
        if old_env.get(k) != env.get(k):
            diffs.append(f"  {k}: {old_env.get(k)} -> {env.get(k)}")
    old_fp, new_fp = old_env.get("fast_paths") or {}, env.get("fast_paths") or {}
    for name in dict.fromkeys([*old_fp, *new_fp]):
        a, b = (old_fp.get(name) or {}).get("on"), (new_fp.get(name) or {}).get("on")
        if a != b:
            diffs.append(f"  fast path {name}: {a} -> {b}")
    if old_env.get("env") != env.get("env"):
        diffs.append(f"  JITKEY_*: {old_env.get('env')} -> {env.get('env')}")
    lines += (
        ["environment differences:", *diffs]
        if diffs
        else ["same environment (versions, CPU, GPU, fast paths)"]
    )
    before = {(r["section"], r["group"], r["impl"]): r for r in old["results"]}
    width_g = max([len(r.group) for r in results] + [5]) + 2
    width_i = max([len(r.impl) for r in results] + [4]) + 3
    header = f"{'case':<{width_g}}{'impl':<{width_i}}{'old':>11}{'new':>11}{'new/old':>9}"
    lines += [header, "-" * len(header)]
    matched = 0
    for (_, _), rows in _groups(results).items():
        unit = group_unit(rows)
        for r in rows:
            o = before.get((r.section, r.group, r.impl))
            if o is None or not o.get("median_ns"):
                continue
            matched += 1
            old_spread = 100.0 * (o.get("max_ns", 0) - o.get("min_ns", 0)) / o["median_ns"]
            noisy = max(old_spread, r.spread_pct()) > SPREAD_FLAG_PCT
            lines.append(
                f"{r.group:<{width_g}}{r.impl:<{width_i}}{fmt_time(o['median_ns'], unit):>11}"
                f"{fmt_time(r.median_ns, unit):>11}{r.median_ns / o['median_ns']:>8.2f}x{' !' if noisy else ''}"
            )
    if not matched:
        lines.append("(no case of this run is in the old file)")
    return "\n".join(lines) + "\n"


def write_plot(results: list[Result], env: dict[str, Any], path: str) -> None:
    """A PNG: per section, each case's median as a ratio to its group's baseline on a log axis (lower is
    faster), the min-max of the repeats as a bar, the absolute median and ratio as text, and the
    environment as a caption.

    Raises ImportError with an install hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'jitkey[plot]' (or matplotlib)") from e

    groups = _groups(results)
    sections = list(dict.fromkeys(s for s, _ in groups))
    rows_per = {s: sum(len(rows) + 1 for (sec, _), rows in groups.items() if sec == s) for s in sections}
    heights = [max(2.0, 0.26 * n + 0.9) for n in (rows_per[s] for s in sections)]
    fig, axes = plt.subplots(
        len(sections),
        1,
        figsize=(12, sum(heights) + 1.4),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, section in zip(axes[:, 0], sections, strict=True):
        y = 0.0
        ticks: list[float] = []
        labels: list[str] = []
        ratios: list[float] = []
        for (sec, group), rows in groups.items():
            if sec != section:
                continue
            ax.text(0.0, y, group, transform=ax.get_yaxis_transform(), ha="left", va="center",
                    fontsize=9, fontweight="bold")  # fmt: skip
            y += 1
            unit = group_unit(rows)
            base = next((r for r in rows if r.baseline), None)
            for r in rows:
                ratio = r.ratio if r.ratio is not None else 1.0
                scale = ratio / r.median_ns if r.median_ns else 1.0
                lo, hi = r.min_ns * scale, r.max_ns * scale
                color = "#1f5fa8" if r.impl.startswith("jitkey") else ("#222222" if r.baseline else "#9a9a9a")
                ax.plot([lo, hi], [y, y], color=color, linewidth=5, alpha=0.35, solid_capstyle="butt")
                ax.plot([ratio], [y], "o", color=color, markersize=6)
                flag = "  ! noisy" if r.spread_pct() > SPREAD_FLAG_PCT else ""
                ax.annotate(
                    f"{fmt_time(r.median_ns, unit)}  {ratio:.2f}x{flag}",
                    (max(hi, ratio), y),
                    xytext=(6, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=8,
                    color="#b00000" if flag else "#333333",
                )
                ticks.append(y)
                labels.append(r.impl + (" (baseline)" if r is base else ""))
                ratios += [lo, hi, ratio]
                y += 1
            y += 0.4
        ax.set_yticks(ticks, labels, fontsize=8.5)
        ax.set_ylim(y - 0.4, -1)
        ax.set_xscale("log")
        lo_r, hi_r = min(ratios), max(ratios)
        ax.set_xlim(lo_r / 1.6, hi_r * 4.5)  # room on the right for the labels
        ax.axvline(1.0, color="#222222", linewidth=0.8, linestyle="--")
        ax.grid(axis="x", which="both", alpha=0.25)
        # Labelled ticks at 1-2-5 steps (finer when the range spans less than about a decade).
        left, right = ax.get_xlim()
        for steps in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 8)):
            xt = sorted(m * 10.0**e for e in range(-4, 5) for m in steps)
            xt = [t for t in xt if left <= t <= right]
            if len(xt) >= 5:
                break
        ax.set_xticks(xt, [f"{t:g}x" for t in xt], fontsize=8.5)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{section}: time relative to the group's baseline (log scale, lower is faster)",
                     fontsize=10, loc="left")  # fmt: skip
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    caption = "\n".join(
        [
            env_caption(env),
            " · ".join(fast_path_summary(env)[:1]) or "fast paths: not recorded",
            "dot: median over repeats; bar: min-max of the repeats; blue: jitkey, black: baseline, grey: peers; "
            f"'! noisy': spread above {SPREAD_FLAG_PCT}% (rerun). {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        ]
    )
    fig.text(0.01, 0.005, caption, fontsize=7.5, va="bottom", ha="left", color="#333333")
    fig.tight_layout(rect=(0, 0.9 / (sum(heights) + 1.4), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
