"""Compare two pytest JUnit XML files of the same suite: a plain run and a run under jitkey.

    python scripts/compare_junit.py plain.xml jitkey.xml [--json out.json]

Either side may be a glob pattern (quoted: ``'out/flaggems-plain-*.xml'``): the shards of a sharded run
(``SHARDS=N scripts/gpu_clients.sh``), merged.

Prints passed/failed/skipped counts of each run and every regression (passed plain, not passed with jitkey).
Exit status 1 when there is a regression.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = child.tag
                break
            if child.tag == "skipped":
                state = "skipped"
        if out.get(name, "passed") != "passed":  # a test with a setup error and a call: keep the worst
            continue
        out[name] = state
    return out


def merged(pattern: str) -> dict[str, str]:
    """``outcomes`` of one file, or of every file a glob pattern matches (the shards of one run), merged."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths:
        raise SystemExit(f"no JUnit XML matches {pattern}")
    out: dict[str, str] = {}
    for path in paths:
        out.update(outcomes(path))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("plain")
    ap.add_argument("jitkey")
    ap.add_argument("--json")
    a = ap.parse_args()
    p, j = merged(a.plain), merged(a.jitkey)
    count = lambda d, s: sum(v == s for v in d.values())  # noqa: E731
    # a test the jitkey run did not reach (a run stopped at its time limit) is not a regression: counted apart
    regressions = sorted(n for n, s in p.items() if s == "passed" and j.get(n, "passed") != "passed")
    unreached = sorted(n for n, s in p.items() if s == "passed" and n not in j)
    fixed = sorted(n for n, s in j.items() if s == "passed" and p.get(n) not in (None, "passed"))
    summary = {
        "plain": {s: count(p, s) for s in ("passed", "failure", "error", "skipped")},
        "jitkey": {s: count(j, s) for s in ("passed", "failure", "error", "skipped")},
        "regressions": regressions,
        "passed_plain_not_run_with_jitkey": unreached,
        "passed_only_with_jitkey": fixed,
    }
    print(f"plain  {summary['plain']}\njitkey {summary['jitkey']}\nregressions: {len(regressions)}")
    print(f"passed plain, not reached by the jitkey run: {len(unreached)}")
    for n in regressions:
        print(f"  REGRESSION {n}  (jitkey: {j.get(n, 'missing')})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
