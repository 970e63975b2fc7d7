"""Every case of ``jitkey bench`` (the CLI's one case list, python/jitkey/bench/_sections.py), run here too.

With ``--benchmark-disable`` (the default ``make test`` run) each case's own result check runs and its
statement is executed once; with ``--benchmark-enable`` pytest-benchmark times the same statement.
"""

from __future__ import annotations

from typing import Any

import pytest

from jitkey.bench._harness import Case, Skipped
from jitkey.bench._sections import SECTIONS

# launch needs a GPU; cold times whole processes, not statements (tests/test_bench_cli.py runs it).
CPU_SECTIONS = [name for name in SECTIONS if name not in ("launch", "cold")]
_built: dict[str, list[Case] | Skipped] = {}


def _cases(section: str) -> list[Case] | Skipped:
    if section not in _built:
        built = SECTIONS[section](True)  # quick: smaller fixtures (e.g. 2,000 disk entries)
        assert isinstance(built, list | Skipped)
        _built[section] = built
    return _built[section]


@pytest.mark.parametrize("section", CPU_SECTIONS)
def test_cli_cases(section: str, benchmark: Any) -> None:
    cases = _cases(section)
    if isinstance(cases, Skipped):
        pytest.skip(cases.reason)
    assert cases and sum(c.baseline for c in cases) == len({c.group for c in cases})  # one baseline per group
    for case in cases:
        case.check()
        scope = dict(case.env)
        exec(case.setup, scope)
        exec(case.stmt, scope)  # the timed statement runs as written
    # time the section's first jitkey case under pytest-benchmark (all of them: --benchmark-enable and -k)
    first = next(c for c in cases if c.impl.startswith("jitkey"))
    code = compile(first.stmt, "<case>", "exec")
    scope = dict(first.env)
    exec(first.setup, scope)
    benchmark(exec, code, scope)
