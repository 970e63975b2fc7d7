"""``python -m jitkey bench``: jitkey's launch-overhead and key-cost microbenchmark.

Every case checks its result before it is timed; times are medians over repeats of calibrated
loops run by :mod:`timeit` directly on the call under test, and each group reports its ratio to a
baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import sys

from jitkey.bench._harness import (
    Result,
    Skipped,
    environment,
    format_table,
    progress,
    run_cases,
    to_json,
    write_plot,
)
from jitkey.bench._sections import SECTIONS, LaunchRun

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jitkey bench",
        description="Launch-overhead and key-cost microbenchmark of jitkey against its peers.",
    )
    p.add_argument("--quick", action="store_true", help="fewer, shorter repeats (about 5x faster; noisier)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--plot", metavar="PATH", help="also write a PNG bar chart (needs matplotlib)")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="SECTION",
        choices=sorted(SECTIONS),
        help=f"run only these sections (of: {', '.join(sorted(SECTIONS))})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code (2 for usage errors, as argparse does)."""
    args = _parser().parse_args(argv)
    names = args.only or list(SECTIONS)
    target_s, repeats = (0.01, 5) if args.quick else (0.05, 9)
    progress("collecting the environment")
    env = environment()
    results: list[Result] = []
    skipped: list[Skipped] = []
    for name in names:
        progress(f"section {name} ...")
        built = SECTIONS[name](args.quick)
        if isinstance(built, Skipped):
            skipped.append(built)
            progress(f"section {name} skipped: {built.reason}")
            continue
        if isinstance(built, LaunchRun):
            results += built.results()
            continue
        results += run_cases(name, built, target_s=target_s, repeats=repeats)
    sys.stdout.write(format_table(results, skipped, env))
    if args.json:
        with open(args.json, "w") as f:
            f.write(to_json(results, skipped, env, sys.argv[1:] if argv is None else argv))
        progress(f"wrote {args.json}")
    if args.plot:
        try:
            write_plot(results, args.plot)
        except ImportError as e:
            sys.stderr.write(f"jitkey bench: {e}\n")
            return 1
        progress(f"wrote {args.plot}")
    return 0
