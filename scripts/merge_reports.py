"""Merge the fast-path reports (``--jitkey-report-json``) of several pytest processes into one and print it.

    python scripts/merge_reports.py OUT.json REPORT.json...

Used by ``gpu_clients.sh`` when a suite runs as shards: each shard writes its own report, and the share of warm
launches on the fast path is a property of the whole run. The reports are the plugin's own (already a merge of
a run's workers), so merging them again sums the same counters; the print is the plugin's own.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from jitkey import pytest_plugin


class _Terminal:
    """The two calls of pytest's terminal reporter that the plugin's printer makes."""

    def write_sep(self, sep: str, title: str) -> None:
        print(f" {title} ".center(100, sep))

    def write_line(self, line: str, **_markup: Any) -> None:
        print(line)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    reports = []
    for path in argv[1:]:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:  # a shard stopped before writing it: say so, merge the rest
            print(f"skipped {path}: {e}", file=sys.stderr)
    if not reports:
        print("no report to merge", file=sys.stderr)
        return 1
    merged = pytest_plugin.merge(reports, 20)
    merged["workers_from_snapshots"] = sum(r.get("workers_from_snapshots", 0) for r in reports)
    pytest_plugin._write_json(argv[0], merged)
    print(f"{len(reports)} reports merged")
    pytest_plugin._print(_Terminal(), merged)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
