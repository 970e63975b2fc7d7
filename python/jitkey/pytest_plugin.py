"""Run a test suite with every user Triton kernel routed through jitkey, and report the fast path's coverage.

``pytest -p jitkey.pytest_plugin`` calls :func:`jitkey.triton.install` before collection (so every kernel the
tests' modules decorate with ``triton.jit`` is a :class:`jitkey.triton.TritonKernel`; Triton's own library
kernels stay Triton's) and prints, at the end, what the kernels' launches did: kernels, launches, hits,
misses, fallbacks by reason, the misses the L2 served (kernels an earlier process compiled, loaded from jitkey's
disk index) and the busiest kernels. With pytest-xdist the workers' numbers are summed.

Options: ``--jitkey-top N`` (busiest kernels shown, default 10), ``--jitkey-report-json PATH`` (the report
as JSON), ``--jitkey-off`` (load the plugin but leave Triton alone: a plain run with the same command line).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

_KEY = "jitkey_report"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jitkey", "jitkey: route triton.jit kernels through jitkey")
    group.addoption("--jitkey-top", type=int, default=10, help="busiest kernels shown in the report")
    group.addoption("--jitkey-report-json", default=None, help="write the fast-path report to this file")
    group.addoption("--jitkey-off", action="store_true", help="do not route triton.jit through jitkey")


def pytest_configure(config: pytest.Config) -> None:
    config._jitkey_reports = []  # type: ignore[attr-defined]
    if config.getoption("--jitkey-off"):
        return
    import jitkey.triton

    jitkey.triton.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    if "jitkey.triton" in __import__("sys").modules:
        import jitkey.triton

        jitkey.triton.uninstall()


def _local_report(config: pytest.Config) -> dict[str, Any] | None:
    import sys

    if "jitkey.triton" not in sys.modules:
        return None
    import jitkey.triton

    return jitkey.triton.report(top=10_000)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the numbers to the controller
        rep = _local_report(config)
        if rep is not None:
            workeroutput[_KEY] = json.dumps(rep)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    raw = getattr(node, "workeroutput", {}).get(_KEY)
    if raw:
        node.config._jitkey_reports.append(json.loads(raw))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if config.getoption("--jitkey-off") or getattr(config, "workeroutput", None) is not None:
        return
    reports = list(config._jitkey_reports)  # type: ignore[attr-defined]
    local = _local_report(config)
    if local is not None and local["kernels"]:
        reports.append(local)
    import jitkey.triton

    top = config.getoption("--jitkey-top")
    rep = jitkey.triton.merge_reports(reports, top)
    path = config.getoption("--jitkey-report-json")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1)
    tr = terminalreporter
    tr.write_sep("=", "jitkey fast-path report")
    share = rep["warm_fast_path"]
    tr.write_line(
        f"kernels {rep['kernels']}  launches {rep['launches']}  hits {rep['hits']}  misses {rep['misses']}  "
        f"fallbacks {rep['fallbacks']}  fast path {'-' if share is None else f'{100 * share:.2f}%'} of warm launches"
    )
    for why, n in list(rep["fallback_reasons"].items())[:20]:
        tr.write_line(f"  fallback {n:>7}  {why}")
    tr.write_line(
        f"hits launched by jitkey itself (cuLaunchKernelEx): {rep['driver_launches']}; "
        f"through Triton's launcher: {rep['hits'] - rep['driver_launches']}"
    )
    for why, n in list(rep["launcher_reasons"].items())[:20]:
        tr.write_line(f"  declined {n:>7} hits  {why}")
    for why, n in list(rep["unplanned_variants"].items())[:20]:
        tr.write_line(f"  no launch plan {n:>5} compiled variants  {why}")
    tr.write_line(
        f"misses served by the L2 (kernels compiled by an earlier process, from jitkey's disk index): "
        f"{rep['l2_hits']}; not in it: {rep['l2_misses']} ({rep['l2_recorded']} recorded for later processes)"
    )
    for why, n in list(rep["l2_skipped"].items())[:20]:
        tr.write_line(f"  L2 not used {n:>6} misses  {why}")
    for why, n in rep["kept"].items():
        tr.write_line(f"  kept by Triton {n:>5} kernels  {why}")
    for b in rep["busiest"]:
        tr.write_line(
            f"  {b['launches']:>8} launches  {b['hits']:>8} hits  {b['misses']:>6} misses  "
            f"{b['fallbacks']:>6} fallbacks  {b['kernel']}"
        )
