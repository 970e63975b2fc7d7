"""The ``jitkey`` command (also ``python -m jitkey``): ``info``, ``cache``, ``bench``.

Every user error is one line on stderr (``jitkey <command>: <what went wrong>``), never a traceback, and
the exit status says what kind it was:

* 0: success.
* 1: the command ran and found a problem or could not finish: ``cache verify`` found damage or an index it
  cannot use, ``cache compact``/``clear`` could not run, an optional dependency is missing, an output could
  not be written (a full disk, a file that became unwritable).
* 2: usage: bad arguments, or a path that cannot be used (not a directory, not readable or searchable, an
  output that cannot be written), refused before anything runs (argparse's own errors are 2 as well).
* 130: interrupted (Ctrl-C).
* 141: standard output was closed by its reader (``jitkey info | head -0``): no message, as a shell
  reports a program a ``SIGPIPE`` ended.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jitkey

EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_OUTPUT = 141


class CliError(Exception):
    """A user error: printed as one line, ``jitkey <command>: <message>``, and exit status ``status``."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


def os_error_text(e: OSError) -> str:
    """An ``OSError`` as one short line: its message and the file it names, without the errno prefix."""
    text = e.strerror or str(e) or type(e).__name__
    return f"{e.filename}: {text}" if e.filename is not None else text


def _prog() -> str:
    return "python -m jitkey" if os.path.basename(sys.argv[0]) == "__main__.py" else "jitkey"


def parser() -> argparse.ArgumentParser:
    from jitkey import bench

    p = argparse.ArgumentParser(
        prog=_prog(),
        description="jitkey: cache keys and kernel lookup for GPU-kernel JIT frameworks.",
    )
    p.add_argument("--version", action="version", version=f"jitkey {jitkey.__version__}")
    sub = p.add_subparsers(dest="command", title="commands")
    sub.required = True

    info = sub.add_parser(
        "info",
        help="versions, fast paths (on/off and why), the disk index and JITKEY_* variables",
        description="Versions, every fast path (on/off and why), the disk index and the JITKEY_* variables.",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")

    cache = sub.add_parser(
        "cache",
        help="inspect or maintain a DiskIndex directory",
        description="Inspect or maintain a DiskIndex directory (default: the directory DiskIndex() uses).",
    )
    csub = cache.add_subparsers(dest="action", title="actions")
    csub.required = True
    for name, text in [
        ("info", "entries, bytes, mode and damaged records"),
        ("verify", "check every record; exit 1 if any is damaged or the file is not a usable index"),
        ("compact", "rewrite the live entries to a new file now"),
        ("clear", "remove every entry, for every process"),
    ]:
        a = csub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument("dir", nargs="?", metavar="DIR", help="the index directory (default: %(default)s)")
        if name in ("info", "verify"):
            a.add_argument("--json", action="store_true", help="print JSON instead of text")

    b = sub.add_parser(
        "bench",
        help="the launch-overhead and key-cost microbenchmark",
        description=bench.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(b)
    b.set_defaults(bench_parser=b)
    return p


def _cmd_info(args: argparse.Namespace) -> int:
    from jitkey._info import collect, format_info

    info = collect()
    sys.stdout.write(json.dumps(info, indent=1) + "\n" if args.json else format_info(info))
    return 0


def _open_index(d: Path) -> tuple[Any, list[str]]:
    """Opens the index in ``d``, recording its warnings (shown as lines, not Python warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ix = jitkey.DiskIndex(d)
        except ValueError as e:  # a bad JITKEY_DISK_CACHE: the user's configuration
            raise CliError(str(e)) from None
    return ix, [str(w.message) for w in caught]


def _cache_dir(args: argparse.Namespace) -> tuple[Path, bool]:
    """The directory ``cache`` works on, and whether an index file is in it. Never creates anything.

    Raises:
        CliError: no directory configured, or one that is not a directory or cannot be read (usage, 2).
    """
    from jitkey._info import INDEX_FILE

    d = Path(args.dir) if args.dir else jitkey.DiskIndex.default_directory()
    if d is None:
        raise CliError("no cache directory (set JITKEY_CACHE_DIR or pass DIR)")
    try:
        st = os.stat(d)
    except FileNotFoundError:
        return d, False
    except OSError as e:
        raise CliError(f"{d}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CliError(f"{d} is not a directory")
    try:
        os.stat(d / INDEX_FILE)
    except FileNotFoundError:
        return d, False
    except OSError as e:
        raise CliError(f"{d}: {e.strerror or e}") from None
    if not os.access(d, os.R_OK | os.X_OK):
        raise CliError(f"{d}: Permission denied")
    return d, True


def _verdict(doc: dict[str, Any]) -> tuple[bool, str]:
    """Whether a verified snapshot is healthy, and the verdict line. Never advises anything that loses
    data: other processes may be using the index."""
    if doc.get("problem"):
        return False, (
            f"NOT USABLE: {doc['problem']}; jitkey never reads or changes such a file (an index on this "
            "directory runs without it)"
        )
    if doc["warnings"]:
        return False, "NOT USABLE as asked: see the warnings (the index runs read-only or memory-only)"
    if doc["unvalidated_bytes"]:
        how = (
            ""
            if doc["locked"]
            else " (the length was read without the writers' lock, so an append in flight can look like this: "
            "run verify again)"
        )
        return False, (
            f"DAMAGED: {doc['unvalidated_bytes']} bytes after the last valid record are never served (a "
            f"damaged record, or the torn tail of a writer that died, which the next write pads){how}; the "
            "valid entries are unaffected, and `jitkey cache compact` rewrites them to a new file (safe while "
            "other processes use the index)"
        )
    return True, (
        f"ok: every record of the {doc['snapshot_bytes']} bytes committed when the check started validates"
    )


def _cmd_cache(args: argparse.Namespace) -> int:
    from jitkey._core import _verify_index
    from jitkey._info import INDEX_FILE

    d, exists = _cache_dir(args)
    as_json = getattr(args, "json", False)
    if not exists:
        doc: dict[str, Any] = {
            "directory": str(d),
            "exists": False,
            "entries": 0,
            "file_bytes": 0,
            "damaged_records": 0,
        }
        if args.action == "verify":
            doc["ok"] = True
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        else:
            sys.stdout.write(f"{d}: no index here yet (nothing cached; created on first use)\n")
        return 0
    if args.action in ("compact", "clear"):
        ix, notes = _open_index(d)
        try:
            before = ix.stats()
            ok = ix.compact() if args.action == "compact" else ix.clear()
            after = ix.stats()
        finally:
            ix.close()
        if args.action == "compact":
            sys.stdout.write(
                f"{d}: compacted {before['file_bytes']} -> {after['file_bytes']} bytes, {after['entries']} entries\n"
                if ok
                else f"{d}: not compacted (mode {after['mode']}: {after['mode_reason'] or 'see warnings'})\n"
            )
        else:
            sys.stdout.write(
                f"{d}: cleared {before['entries']} entries\n"
                if ok
                else f"{d}: not cleared (mode {after['mode']}: {after['mode_reason'] or 'see warnings'})\n"
            )
        for n in notes:
            sys.stderr.write(f"warning: {n}\n")
        return 0 if ok else EXIT_PROBLEM
    # info / verify: the numbers come from one consistent snapshot (what was committed when the check
    # started), so appends by other processes meanwhile never look like damage.
    ix, notes = _open_index(d)
    try:
        mode, mode_reason = ix.mode, ix.mode_reason
        st = ix.stats()
    finally:
        ix.close()
    try:
        snap = _verify_index(d)
    except OSError as e:
        snap = {"path": str(d / INDEX_FILE), "problem": f"cannot read it: {os_error_text(e)}"}
    doc = {
        "directory": str(d),
        "exists": True,
        "path": str(snap["path"]),
        "mode": mode,
        "mode_reason": mode_reason,
        "entries": snap.get("entries", 0),
        "file_bytes": snap.get("snapshot_bytes", 0),
        "live_bytes": snap.get("live_bytes", 0),
        "max_bytes": st.get("max_bytes"),
        "generation": snap.get("generation"),
        "records": snap.get("records", 0),
        "damaged_records": st.get("corrupt_records_skipped", 0),
        # Bytes of the snapshot past the last record that validates: damage or a torn write (never served).
        "unvalidated_bytes": snap.get("unvalidated_bytes", 0),
        "locked": snap.get("locked", False),
        "problem": snap.get("problem"),
        "warnings": notes,
    }
    doc["snapshot_bytes"] = doc["file_bytes"]
    healthy, verdict = _verdict(doc)
    if as_json:
        if args.action == "verify":
            doc["ok"] = healthy
            doc["verdict"] = verdict
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        mode_text = doc["mode"] + (f" ({doc['mode_reason']})" if doc["mode_reason"] else "")
        out = [
            f"index      {doc['path']}",
            f"mode       {mode_text}",
            f"entries    {doc['entries']}",
            f"bytes      {doc['file_bytes']} on disk, {doc['live_bytes']} live (cap {doc['max_bytes']})",
            f"damaged    {doc['unvalidated_bytes']} bytes past the last valid record",
        ]
        if doc["problem"]:
            out.append(f"problem    {doc['problem']}")
        out += [f"warning    {n}" for n in notes]
        if args.action == "verify":
            out.append(f"verdict    {verdict}")
        sys.stdout.write("\n".join(out) + "\n")
    return EXIT_PROBLEM if args.action == "verify" and not healthy else 0


def _run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command == "info":
        return _cmd_info(args)
    if args.command == "cache":
        return _cmd_cache(args)
    from jitkey import bench

    return bench.run(args, argv, args.bench_parser)


def _quiet_stdout() -> None:
    """Points standard output at /dev/null, so the interpreter's final flush of what is still buffered
    cannot fail (and print a traceback) after the command already reported why."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def guarded(where: str, run: Callable[[], int]) -> int:
    """Runs a command, turning every user error into one line on stderr and its exit status (see the
    module doc): the one place the CLI's commands fail."""
    try:
        try:
            status = run()
        except SystemExit:  # argparse's --help, --version and usage errors: their output flushed here too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # an output error is reported here, not by the interpreter's exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_CLOSED_OUTPUT
    except KeyboardInterrupt:
        sys.stderr.write(f"{where}: interrupted\n")
        return EXIT_INTERRUPTED
    except CliError as e:
        sys.stderr.write(f"{where}: {e}\n")
        return e.status
    except OSError as e:  # an I/O failure while running or writing the output (a full disk, ...)
        _quiet_stdout()
        sys.stderr.write(f"{where}: {os_error_text(e)}\n")
        return EXIT_PROBLEM


def main(argv: list[str] | None = None) -> int:
    """Run the ``jitkey`` command; returns its exit status (see the module doc)."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), "")
    return guarded(f"{_prog()} {command}".rstrip(), lambda: _run(argv))
