"""The benchmarks of benches/: every case of ``jitkey bench`` (the one case list, python/jitkey/bench/_sections.py),
one pytest-benchmark test per case.

Each test runs the case's ``check()`` (its result is right) and then times its statement, the call as
``jitkey bench`` times it. With ``--benchmark-disable`` (pyproject's default, so ``make test``) the statement
runs once, as a correctness check; time them with

    .venv/bin/python -m pytest benches/test_bench_cli_cases.py --benchmark-enable --benchmark-disable-gc \\
        --benchmark-min-time=0.2 --benchmark-group-by=group

and compare medians within a group (``jitkey bench`` prints the same cases with each group's ratio to its
baseline, ``*``). The sections are built once, at collection, with ``quick=True`` fixtures (e.g. 2,000 disk
entries). Sections that time themselves (launch and dsl: a GPU; cold: fresh processes) are ``jitkey bench``'s
alone: tests/test_bench_cli.py runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jitkey.bench._harness import Case, SelfTimed, Skipped
from jitkey.bench._sections import SECTIONS

BUILT: dict[str, list[Case]] = {}


def _params() -> Iterator[Any]:
    for name, build in SECTIONS.items():
        try:
            built = build(True)
        except Exception as e:  # the section's own test fails with it, instead of the whole module
            yield pytest.param(name, e, id=f"{name}/setup")
            continue
        if isinstance(built, Skipped):
            yield pytest.param(name, None, id=name, marks=pytest.mark.skip(reason=built.reason))
        elif isinstance(built, SelfTimed):
            why = f"times itself ({built.describe()}): jitkey bench --only {name}"
            yield pytest.param(name, None, id=name, marks=pytest.mark.skip(reason=why))
        else:
            BUILT[name] = built
            yield from (pytest.param(name, c, id=f"{name}/{c.group}/{c.impl}") for c in built)


@pytest.mark.parametrize(("section", "case"), list(_params()))
def test_case(section: str, case: Case | Exception, benchmark: Any) -> None:
    if isinstance(case, Exception):
        raise case
    case.check()
    benchmark.group = f"{section}: {case.group}"
    benchmark(case.function())


@pytest.mark.parametrize("section", list(BUILT))
def test_one_baseline_per_group(section: str) -> None:
    """Each group has exactly one baseline and distinct implementations (the ratios are to that baseline)."""
    groups: dict[str, list[Case]] = {}
    for c in BUILT[section]:
        groups.setdefault(c.group, []).append(c)
    for group, cases in groups.items():
        assert sum(c.baseline for c in cases) == 1, group
        assert len({c.impl for c in cases}) == len(cases), group
