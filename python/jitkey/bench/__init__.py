"""``jitkey bench``: jitkey's launch-overhead and key-cost microbenchmark.

Every case checks its result before it is timed; times are medians over repeats of calibrated
loops run by :mod:`timeit` directly on the call under test, and each group reports its ratio to a
baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jitkey.bench._harness import (
    SPREAD_FLAG_PCT,
    Case,
    Result,
    SelfTimed,
    Skipped,
    environment,
    format_compare,
    format_table,
    load_results,
    progress,
    run_cases,
    to_json,
    write_plot,
)
from jitkey.bench._sections import DEFAULT_SECTIONS, SECTIONS, gpu_unavailable_reason

__all__ = ["DESCRIPTION", "add_arguments", "main", "run"]

DESCRIPTION = f"""Launch-overhead and key-cost microbenchmark of jitkey against its peers.

Sections: key, cache, lookup, disk, fnkey, autotune, remote (CPU), launch and dsl (need an NVIDIA GPU; dsl also a DSL:
Helion 1.4.0 or FlagGems 5.0.0); cold (only with --only cold: a fresh process's decoration and, on a GPU, first
launches, plain Triton vs jitkey, in fresh subprocesses). Every case checks its result before it is timed.
Times are medians of calibrated timeit repeats; ratio = median / the
group's baseline (*) measured in the same run. Rows whose spread ((max-min)/median) exceeds
{SPREAD_FLAG_PCT}% are flagged with '!': the machine was busy; rerun them before trusting the figure.
Progress goes to stderr, the table to stdout."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench options (shared by ``jitkey bench`` and ``python -m jitkey bench``)."""
    p.add_argument("--quick", action="store_true", help="fewer, shorter repeats (about 5x faster; noisier)")
    p.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON ('-': to stdout, table to stderr)"
    )
    p.add_argument("--plot", metavar="PATH", help="also write a PNG chart (needs matplotlib: jitkey[plot])")
    p.add_argument(
        "--compare", metavar="OLD.json", help="also print each case's ratio to an earlier --json run"
    )
    p.add_argument(
        "--only",
        action="extend",
        nargs="+",
        metavar="SECTION",
        choices=list(SECTIONS),
        help=f"run only these sections; repeatable, adds up (of: {', '.join(SECTIONS)}; cold runs only when named)",
    )


def _check_output(p: argparse.ArgumentParser, opt: str, path: str) -> None:
    """Fail before the run (not after it) when an output path cannot be written. Any error of the
    check itself (an unsearchable parent, a name too long) is such a failure, as one usage line."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        if target.is_dir():
            p.error(f"{opt} {path}: is a directory")
        if not parent.is_dir():
            p.error(f"{opt} {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
            p.error(f"{opt} {path}: not writable")
    except OSError as e:
        p.error(f"{opt} {path}: {e.strerror or e}")


def _write_output(opt: str, path: str, write: Any) -> None:
    """Writes one output after the run; a failure (a full disk, a path that became unwritable) is one
    line and exit status 1, not a traceback (the table was already printed)."""
    from jitkey.cli import CliError, os_error_text

    try:
        write()
    except OSError as e:
        raise CliError(f"{opt} {path}: writing failed: {os_error_text(e)}", 1) from None


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any] | None:
    """Every check that can fail before the run: output paths, --compare's file, matplotlib, a GPU for
    --only launch. Returns the --compare document."""
    if args.json and args.json != "-":
        _check_output(p, "--json", args.json)
    if args.plot:
        if args.plot == "-":
            p.error("--plot needs a file path")
        _check_output(p, "--plot", args.plot)
        from jitkey._deps import require

        try:
            require("matplotlib", "--plot")
        except ModuleNotFoundError as e:
            p.exit(1, f"jitkey bench: {e}\n")
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:
            p.exit(1, f"jitkey bench: --plot needs matplotlib, which failed to import ({e}): "
                   "pip install matplotlib  (or: pip install 'jitkey[plot]')\n")  # fmt: skip
    old = None
    if args.compare:
        try:
            old = load_results(args.compare)
        except (OSError, ValueError) as e:
            p.error(f"--compare {args.compare}: {e}")
    for gpu in ("launch", "dsl"):
        if args.only and gpu in args.only:
            why = gpu_unavailable_reason()
            if why is not None:
                p.error(f"--only {gpu}: {why}")
    return old


def run(args: argparse.Namespace, argv: list[str], p: argparse.ArgumentParser | None = None) -> int:
    """Runs the benchmark for parsed ``args``; returns the exit status."""
    if p is None:
        p = argparse.ArgumentParser(prog="jitkey bench")
    old = validate(p, args)
    names = list(dict.fromkeys(args.only)) if args.only else list(DEFAULT_SECTIONS)
    target_s, repeats = (0.01, 5) if args.quick else (0.05, 9)
    progress("collecting the environment (versions, fast paths)")
    env = environment()
    skipped: list[Skipped] = []
    built: list[tuple[str, list[Case] | SelfTimed]] = []
    for name in names:
        progress(f"setting up {name}")
        b = SECTIONS[name](args.quick)
        if isinstance(b, Skipped):
            skipped.append(b)
            progress(f"{name} skipped: {b.reason}")
        else:
            built.append((name, b))
    total = sum(1 if isinstance(b, SelfTimed) else len(b) for _, b in built)
    results: list[Result] = []
    done = 0
    for name, b in built:
        if isinstance(b, SelfTimed):
            done += 1
            progress(f"[{done}/{total}] {name}: {b.describe()}")
            results += b.results()
            skipped += b.skipped
            continue
        results += run_cases(name, b, target_s=target_s, repeats=repeats, start=done, total=total)
        done += len(b)
    table = format_table(results, skipped, env)
    if old is not None:
        table += format_compare(results, env, old, args.compare)
    to_stdout_json = args.json == "-"
    (sys.stderr if to_stdout_json else sys.stdout).write(table)
    if args.json:
        doc = to_json(results, skipped, env, argv)
        if to_stdout_json:
            sys.stdout.write(doc + "\n")
        else:
            _write_output("--json", args.json, lambda: Path(args.json).write_text(doc))
            progress(f"wrote {args.json}")
    if args.plot:
        _write_output("--plot", args.plot, lambda: write_plot(results, env, args.plot))
        progress(f"wrote {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``jitkey bench`` with its own parser (argv without the ``bench`` word)."""
    from jitkey.cli import guarded

    p = argparse.ArgumentParser(prog="jitkey bench", description=DESCRIPTION)
    add_arguments(p)
    args = sys.argv[1:] if argv is None else argv
    return guarded("jitkey bench", lambda: run(p.parse_args(args), args, p))
