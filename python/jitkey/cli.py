"""The ``jitkey`` command (also ``python -m jitkey``): ``info``, ``cache``, ``bench``.

Exit status: 0 on success, 1 when a command ran but found a problem (``cache verify`` found damage,
a compaction failed), 2 for usage errors (as argparse does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import jitkey


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


def _open_index(d: Path | None) -> tuple[Any, list[str]]:
    """Opens the index in ``d``, recording its warnings (shown as lines, not Python warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ix = jitkey.DiskIndex(d)
    return ix, [str(w.message) for w in caught]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from jitkey._info import INDEX_FILE

    d = Path(args.dir) if args.dir else jitkey.DiskIndex.default_directory()
    if d is None:
        sys.stderr.write("jitkey cache: no cache directory (set JITKEY_CACHE_DIR or pass DIR)\n")
        return 2
    if d.exists() and not d.is_dir():
        sys.stderr.write(f"jitkey cache: {d} is not a directory\n")
        return 2
    as_json = getattr(args, "json", False)
    if not (d / INDEX_FILE).exists():
        doc: dict[str, Any] = {
            "directory": str(d),
            "exists": False,
            "entries": 0,
            "file_bytes": 0,
            "damaged_records": 0,
        }
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        else:
            sys.stdout.write(f"{d}: no index here yet (nothing cached; created on first use)\n")
        return 0
    ix, notes = _open_index(d)
    try:
        before = ix.stats()
        if args.action == "compact":
            ok = ix.compact()
            after = ix.stats()
            sys.stdout.write(
                f"{d}: compacted {before['file_bytes']} -> {after['file_bytes']} bytes, "
                f"{after['entries']} entries\n"
                if ok
                else f"{d}: not compacted (mode {after['mode']}: {after['mode_reason'] or 'see warnings'})\n"
            )
            for n in notes:
                sys.stderr.write(f"warning: {n}\n")
            return 0 if ok else 1
        if args.action == "clear":
            ok = ix.clear()
            sys.stdout.write(
                f"{d}: cleared {before['entries']} entries\n"
                if ok
                else f"{d}: not cleared (mode {ix.mode}: {ix.mode_reason or 'see warnings'})\n"
            )
            for n in notes:
                sys.stderr.write(f"warning: {n}\n")
            return 0 if ok else 1
        doc = {
            "directory": str(d),
            "exists": True,
            "path": str(ix.path),
            "mode": before["mode"],
            "mode_reason": before["mode_reason"],
            "entries": before["entries"],
            "file_bytes": before["file_bytes"],
            "live_bytes": before.get("live_bytes"),
            "max_bytes": before.get("max_bytes"),
            "generation": before.get("generation"),
            "damaged_records": before.get("corrupt_records_skipped", 0),
            # Bytes past the last record that validates: a torn write or damage (nothing there is served).
            "unvalidated_bytes": max(0, _size(ix.path) - before["file_bytes"]),
            "warnings": notes,
        }
    finally:
        ix.close()
    healthy = doc["damaged_records"] == 0 and doc["unvalidated_bytes"] == 0 and not notes
    if as_json:
        if args.action == "verify":
            doc["ok"] = healthy
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        mode = doc["mode"] + (f" ({doc['mode_reason']})" if doc["mode_reason"] else "")
        out = [
            f"index      {doc['path']}",
            f"mode       {mode}",
            f"entries    {doc['entries']}",
            f"bytes      {doc['file_bytes']} on disk, {doc['live_bytes']} live (cap {doc['max_bytes']})",
            f"damaged    {doc['damaged_records']} records skipped, {doc['unvalidated_bytes']} bytes past the last"
            " valid record",
        ]
        out += [f"warning    {n}" for n in notes]
        if args.action == "verify":
            out.append(
                "verdict    ok: every record validates"
                if healthy
                else "verdict    DAMAGED: damaged records are never returned; `jitkey cache compact` rewrites "
                "the valid ones (or `jitkey cache clear`)"
            )
        sys.stdout.write("\n".join(out) + "\n")
    return 1 if args.action == "verify" and not healthy else 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``jitkey`` command; returns its exit status."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "info":
        return _cmd_info(args)
    if args.command == "cache":
        return _cmd_cache(args)
    from jitkey import bench

    return bench.run(args, sys.argv[1:] if argv is None else argv, args.bench_parser)
