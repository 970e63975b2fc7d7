"""``jitkey.integrations.flag_gems._logs_debug``: a FlagGems op replays (and so skips its own ``logger.debug``
call) only where that call would do nothing; it mirrors ``logging.Logger.handle``. Real ``logging`` loggers and
handlers; the FlagGems case repeats what ``flag_gems.logging_utils`` does for ``use_gems(record=True)``."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jitkey.integrations.flag_gems import _logs_debug

_names = itertools.count()


@pytest.fixture
def new() -> Iterator[Callable[[], logging.Logger]]:
    """Makes fresh top-level loggers that do not propagate. Call it inside the test: pytest's logging plugin
    attaches its capture handlers to the root logger and to every non-propagating logger that exists when a
    test phase starts, and those would take every record."""
    made: list[logging.Logger] = []

    def make() -> logging.Logger:
        logger = logging.getLogger(f"jk_logs_debug_{next(_names)}")
        logger.propagate = False
        made.append(logger)
        return logger

    yield make
    for logger in made:
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
        logger.filters.clear()
        logger.setLevel(logging.NOTSET)


def test_not_enabled_for_debug_does_nothing(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    lg.setLevel(logging.INFO)
    lg.addHandler(logging.NullHandler())
    assert not _logs_debug(lg)


def test_a_handler_that_takes_debug_records(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    lg.setLevel(logging.DEBUG)
    lg.addHandler(logging.NullHandler())  # level NOTSET: it handles (and its filters see) every record
    assert _logs_debug(lg)


def test_handlers_above_debug_take_nothing(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    lg.setLevel(logging.DEBUG)
    lg.addHandler(logging.NullHandler(logging.INFO))
    assert not _logs_debug(lg)


def test_no_handler_at_all_goes_to_logging_last_resort(
    new: Callable[[], logging.Logger], monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = new()
    lg.setLevel(logging.DEBUG)
    assert not _logs_debug(lg)  # lastResort is at WARNING
    quiet = logging.lastResort
    assert quiet is not None
    monkeypatch.setattr(logging, "lastResort", logging.StreamHandler())  # level NOTSET: it would print
    assert _logs_debug(lg)
    monkeypatch.setattr(logging, "lastResort", None)  # logging then warns once that no handler exists
    monkeypatch.setattr(lg.manager, "emittedNoHandlerWarning", False)
    assert _logs_debug(lg)
    monkeypatch.setattr(lg.manager, "emittedNoHandlerWarning", True)
    assert not _logs_debug(lg)


def test_a_parent_handler_through_propagation(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    child = logging.getLogger(f"{lg.name}.ops.add")
    child.setLevel(logging.DEBUG)
    lg.addHandler(logging.NullHandler())
    assert _logs_debug(child)
    child.propagate = False
    try:
        assert not _logs_debug(child)
    finally:
        child.propagate = True
        child.setLevel(logging.NOTSET)


def test_a_logger_filter_or_a_record_factory_sees_every_record(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    lg.setLevel(logging.DEBUG)
    lg.addFilter(lambda record: False)  # drops the record, but it ran: it may count or keep it
    assert _logs_debug(lg)
    lg.filters.clear()
    assert not _logs_debug(lg)
    old = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **k: old(*a, **k))
    try:
        assert _logs_debug(lg)
    finally:
        logging.setLogRecordFactory(old)


def test_logging_disable_turns_it_off(new: Callable[[], logging.Logger]) -> None:
    lg = new()
    lg.setLevel(logging.DEBUG)
    lg.addHandler(logging.NullHandler())
    logging.disable(logging.DEBUG)
    try:
        assert not _logs_debug(lg)
    finally:
        logging.disable(logging.NOTSET)
    assert _logs_debug(lg)


def test_flag_gems_record_on_then_off(
    new: Callable[[], logging.Logger], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``use_gems(record=True)``: a file handler, DEBUG, no propagation; on exit the handler goes and the level
    stays. While it records, ops run FlagGems' path; after it, a debug call records nothing anywhere, so a
    replay that skips it changes nothing."""
    lg = new()
    op = logging.getLogger(f"{lg.name}.ops.exp")  # FlagGems' ops log through their modules' loggers
    path = tmp_path / "oplist.log"
    handler = logging.FileHandler(path, mode="w")  # setup_flaggems_logging
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(name)s.%(funcName)s: %(message)s"))
    lg.setLevel(logging.DEBUG)
    lg.addHandler(handler)
    assert _logs_debug(op)
    op.debug("GEMS EXP")
    handler.flush()
    assert "GEMS EXP" in path.read_text()
    lg.removeHandler(handler)  # teardown_flaggems_logging: the level stays at DEBUG
    handler.close()
    assert lg.level == logging.DEBUG and op.isEnabledFor(logging.DEBUG)
    assert not _logs_debug(op)
    size = path.stat().st_size
    op.debug("GEMS EXP again")  # what a replay would skip: it reaches no file, no stream
    assert path.stat().st_size == size
    out, err = capfd.readouterr()
    assert "GEMS EXP" not in out + err
