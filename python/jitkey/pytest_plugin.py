"""Run a test suite with every user Triton kernel routed through jitkey, and report the fast path's coverage.

``pytest -p jitkey.pytest_plugin`` calls :func:`jitkey.triton.install` before the suite's conftest.py files are
imported (so every kernel the suite's conftest files and test modules decorate with ``triton.jit`` is a
:class:`jitkey.triton.TritonKernel`; Triton's own library kernels stay Triton's) and prints, at the end, what the kernels' launches did: kernels, launches, hits,
misses, fallbacks by reason, the misses the L2 served (kernels an earlier process compiled, loaded from jitkey's
disk index) and the busiest kernels. With pytest-xdist the workers' numbers are summed.

Options: ``--jitkey-top N`` (busiest kernels shown, default 10), ``--jitkey-report-json PATH`` (the report
as JSON; with pytest-xdist each worker also keeps a snapshot of its numbers, at most every 5 s between tests,
in ``PATH.workers/<worker>.json``, and a worker whose final numbers never reached the controller, say because a
time limit stopped the run inside a long test, is counted from its last snapshot: the report says how many
were), ``--jitkey-off`` (load the plugin but leave Triton alone: a plain run with the same command line),
``--jitkey-integrations`` (also install every DSL integration whose library is installed and supported,
:func:`jitkey.integrations.install_available`; the report then covers the DSL layer too: calls, plan replays,
bound calls, misses, fallbacks and refused recordings by reason, and a line says which integrations are on and
why the others are off).

The plugin never changes a run's outcome: a failure of its own (Triton missing, the report's JSON file not
writable, a worker's report unreadable) is printed as a ``jitkey plugin warning:`` line in the terminal
summary (on stderr when it happens after it), and the run's exit status is the tests' alone. These are not
Python warnings, so ``-W error`` cannot turn them into failures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

_KEY = "jitkey_report"
#: Seconds between a worker's snapshots of its numbers (taken between tests).
_SNAPSHOT_EVERY = 5.0
#: This process's config when it is an xdist worker that keeps snapshots (else None).
_worker_config: pytest.Config | None = None


def _non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {text!r}")
    return n


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jitkey", "jitkey: route triton.jit kernels through jitkey")
    group.addoption(
        "--jitkey-top", type=_non_negative, default=10, help="busiest kernels shown in the report"
    )
    group.addoption("--jitkey-report-json", default=None, help="write the fast-path report to this file")
    group.addoption("--jitkey-off", action="store_true", help="do not route triton.jit through jitkey")
    group.addoption(
        "--jitkey-integrations",
        action="store_true",
        help="also route the installed DSLs (Helion, FlagGems) through jitkey's DSL layer",
    )


def _problems(config: pytest.Config) -> list[str]:
    problems: list[str] = getattr(config, "_jitkey_problems", None) or []
    config._jitkey_problems = problems  # type: ignore[attr-defined]
    return problems


def _guard(config: pytest.Config, what: str, fn: Callable[[], Any]) -> Any:
    """Runs one step of the plugin; an exception becomes a warning line (returns ``None``), never the run's."""
    try:
        return fn()
    except Exception as e:
        _problems(config).append(f"{what}: {type(e).__name__}: {e}")
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: Any, args: Any) -> None:
    """Route before the suite's own conftest.py files are imported: a conftest that imports a kernel library
    (FlagGems' does) decorates its kernels then. Called only when the plugin is loaded with ``-p`` or as an
    installed plugin; :func:`pytest_configure` installs otherwise (both are idempotent). The options are not
    parsed into the config yet here: they are read from the known arguments parsed so far."""
    known = early_config.known_args_namespace
    off, with_integrations = (bool(getattr(known, n, False)) for n in ("jitkey_off", "jitkey_integrations"))
    _install(early_config, off, with_integrations)


def pytest_configure(config: pytest.Config) -> None:
    global _worker_config
    config._jitkey_reports = []  # type: ignore[attr-defined]
    config._jitkey_reported = set()  # type: ignore[attr-defined]
    config._jitkey_started = time.time() - 1.0  # type: ignore[attr-defined]
    config._jitkey_snapshot_at = float("-inf")  # type: ignore[attr-defined]  # the first test writes one
    if hasattr(config, "workerinput") and _snapshot_dir(config) and not config.getoption("--jitkey-off"):
        _worker_config = config
    _install(config, config.getoption("--jitkey-off"), config.getoption("--jitkey-integrations"))


def _install(config: pytest.Config, off: bool, with_integrations: bool) -> None:
    _problems(config)
    if getattr(config, "_jitkey_installed", False) or off:
        return
    config._jitkey_installed = True  # type: ignore[attr-defined]

    def install() -> None:
        import jitkey.triton

        jitkey.triton.install()

    _guard(config, "not routing triton.jit through jitkey", install)
    if with_integrations:

        def integrations() -> None:
            import jitkey.integrations

            config._jitkey_integrations = jitkey.integrations.install_available()  # type: ignore[attr-defined]

        _guard(config, "not installing the DSL integrations", integrations)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _worker_config
    if _worker_config is config:
        _worker_config = None
    try:
        if "jitkey.integrations" in sys.modules:
            import jitkey.integrations

            jitkey.integrations.uninstall_all()
        if "jitkey.triton" in sys.modules:
            import jitkey.triton

            jitkey.triton.uninstall()
    except Exception as e:  # after the summary: stderr is all that is left
        sys.stderr.write(f"jitkey plugin warning: uninstalling: {type(e).__name__}: {e}\n")


def _local_report(config: pytest.Config) -> dict[str, Any] | None:
    if "jitkey.triton" not in sys.modules:
        return None
    import jitkey.triton

    rep = jitkey.triton.report(top=10_000)
    if "jitkey.dsl" in sys.modules:
        import jitkey.dsl

        rep["dsl"] = jitkey.dsl.report(top=10_000)
    return rep


def _snapshot_dir(config: pytest.Config) -> str | None:
    path = config.getoption("--jitkey-report-json")
    return None if not path else f"{path}.workers"


def _snapshot(config: pytest.Config, rep: dict[str, Any] | None) -> None:
    """An xdist worker that keeps snapshots (``_worker_config``): ``rep``, its numbers so far, written whole
    (temp file + rename)."""
    where = _snapshot_dir(config)
    if rep is None or where is None:
        return
    os.makedirs(where, exist_ok=True)
    final = os.path.join(where, f"{config.workerinput['workerid']}.json")  # type: ignore[attr-defined]
    tmp = f"{final}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rep, f)
    os.replace(tmp, final)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    config = _worker_config
    if config is None:
        return
    now = time.monotonic()
    if now - config._jitkey_snapshot_at < _SNAPSHOT_EVERY:  # type: ignore[attr-defined]
        return
    config._jitkey_snapshot_at = now  # type: ignore[attr-defined]
    _guard(config, "writing this worker's snapshot", lambda: _snapshot(config, _local_report(config)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the numbers to the controller

        def hand_over() -> dict[str, Any] | None:
            rep = _local_report(config)
            if rep is not None:
                workeroutput[_KEY] = json.dumps(rep)
            return rep

        rep = _guard(config, "collecting this worker's report", hand_over)
        if rep is not None and _worker_config is not None:  # the last snapshot: the same numbers
            _guard(config, "writing this worker's snapshot", lambda: _snapshot(config, rep))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    config = node.config

    def collect() -> None:
        raw = getattr(node, "workeroutput", {}).get(_KEY)
        if raw:
            config._jitkey_reports.append(json.loads(raw))
            config._jitkey_reported.add(node.workerinput["workerid"])

    _guard(config, "reading a worker's report", collect)


def _snapshots(config: pytest.Config) -> list[dict[str, Any]]:
    """The last snapshots of the workers whose final numbers did not arrive (this run's: newer than its start)."""
    where = _snapshot_dir(config)
    if not where or not os.path.isdir(where):
        return []
    out = []
    for name in sorted(os.listdir(where)):
        worker, ext = os.path.splitext(name)
        path = os.path.join(where, name)
        if ext != ".json" or worker in config._jitkey_reported:  # type: ignore[attr-defined]
            continue
        if os.stat(path).st_mtime < config._jitkey_started:  # type: ignore[attr-defined]
            continue  # an earlier run's
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    tr = terminalreporter
    rep = None
    if not config.getoption("--jitkey-off"):
        rep = _guard(config, "building the report", lambda: _report(config))
    path = config.getoption("--jitkey-report-json")
    if rep is not None and path:
        _guard(config, f"writing --jitkey-report-json {path}", lambda: _write_json(path, rep))
    if rep is not None:
        _guard(config, "printing the report", lambda: _print(tr, rep))
    integrations = getattr(config, "_jitkey_integrations", None)
    if integrations:  # --jitkey-integrations: which DSLs were routed, and why the others were not
        tr.write_line(
            "jitkey integrations: "
            + "; ".join(
                f"{n} on" if why is None else f"{n} off ({' '.join(str(why).split())})"  # one line
                for n, why in integrations.items()
            )
        )
    for msg in _problems(config):
        tr.write_line(f"jitkey plugin warning: {msg}", yellow=True)


def _report(config: pytest.Config) -> dict[str, Any]:
    reports = list(config._jitkey_reports)  # type: ignore[attr-defined]
    snapshots = _guard(config, "reading the workers' snapshots", lambda: _snapshots(config)) or []
    reports += snapshots
    local = _local_report(config)
    if local is not None and (local["kernels"] or (local.get("dsl") or {}).get("sites")):
        reports.append(local)  # (a run whose kernels stayed Triton's may still have DSL sites)
    merged = merge(reports, config.getoption("--jitkey-top"))
    merged["workers_from_snapshots"] = len(snapshots)
    return merged


def merge(reports: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Fast-path reports of several processes (``jitkey.triton.report()``s, or reports this plugin wrote) summed
    into one, their DSL parts too; ``top``: the busiest kernels and sites kept."""
    import jitkey.triton

    merged: dict[str, Any] = jitkey.triton.merge_reports(reports, top)
    dsl_reports = [r["dsl"] for r in reports if r.get("dsl")]
    if dsl_reports:
        import jitkey.dsl

        merged["dsl"] = jitkey.dsl.merge_reports(dsl_reports, top)
    return merged


def _write_json(path: str, rep: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)


def _reasons(tr: Any, counts: dict[str, int], label: str, most: int | None = 20) -> None:
    """One line per reason, most frequent first (``label`` formats the count ``n``)."""
    for why, n in list(counts.items())[:most]:
        tr.write_line(f"  {label.format(n=n)}  {why}")


def _print(tr: Any, rep: dict[str, Any]) -> None:
    tr.write_sep("=", "jitkey fast-path report")
    if rep.get("workers_from_snapshots"):
        tr.write_line(
            f"({rep['workers_from_snapshots']} xdist workers never reported their final numbers: they are "
            "counted as of their last snapshot)"
        )
    share = rep["warm_fast_path"]
    tr.write_line(
        f"kernels {rep['kernels']}  launches {rep['launches']}  hits {rep['hits']}  misses {rep['misses']}  "
        f"fallbacks {rep['fallbacks']}  fast path {'-' if share is None else f'{100 * share:.2f}%'} of warm launches"
    )
    _reasons(tr, rep["fallback_reasons"], "fallback {n:>7}")
    # driver_launches counts the misses the L2 served too: jitkey launches those as it launches a hit.
    tr.write_line(
        f"hits and L2-served misses launched by jitkey itself (cuLaunchKernelEx): {rep['driver_launches']}; "
        f"through Triton's launcher: {rep['hits'] + rep['l2_hits'] - rep['driver_launches']}"
    )
    _reasons(tr, rep["launcher_reasons"], "declined {n:>7} hits")
    _reasons(tr, rep["unplanned_variants"], "no launch plan {n:>5} compiled variants")
    tr.write_line(
        f"misses served by the L2 (kernels compiled by an earlier process, from jitkey's disk index): "
        f"{rep['l2_hits']}; not in it: {rep['l2_misses']} ({rep['l2_recorded']} recorded for later processes)"
    )
    _reasons(tr, rep["l2_skipped"], "L2 not used {n:>6} misses")
    walks = rep.get("l2_walks", {})
    if walks.get("replayed") or walks.get("walked"):
        tr.write_line(
            f"first cache_key of a jit function (kernel or helper): replayed from the L2 {walks['replayed']}, "
            f"walked by Triton {walks['walked']}"
        )
    _reasons(tr, rep["kept"], "kept by Triton {n:>5} kernels", most=None)
    for b in rep["busiest"]:
        tr.write_line(
            f"  {b['launches']:>8} launches  {b['hits']:>8} hits  {b['misses']:>6} misses  "
            f"{b['fallbacks']:>6} fallbacks  {b['kernel']}"
        )
    d = rep.get("dsl")
    if d:
        share = d["fast_path"]
        tr.write_line(
            f"DSL layer: sites {d['sites']}  calls {d['calls']}  replays {d['replays']}  bound calls "
            f"{d['bound_calls']}  misses {d['misses']} ({d['warmups']} compiled/tuned by the DSL)  fallbacks "
            f"{d['fallbacks']}  fast path {'-' if share is None else f'{100 * share:.2f}%'} of warm calls"
        )
        _reasons(tr, d["fallback_reasons"], "fallback {n:>7}")
        _reasons(tr, d["refused"], "no plan  {n:>7}")
