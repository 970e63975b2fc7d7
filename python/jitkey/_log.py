"""The ``jitkey`` logger.

jitkey logs through :mod:`logging` under the name ``jitkey`` (children: ``jitkey.fastpath``,
``jitkey.triton``, ...). It adds no handler of its own, so by default only WARNING and above reach
stderr (through Python's last-resort handler); configure logging as usual to see more, or set
``JITKEY_LOG=debug|info|warning|error`` to have jitkey attach one stderr handler to its logger.

What is logged:

- WARNING: a fast path switched itself off without the user asking (once per process and path),
  e.g. the direct tensor-field reads when torch's layout could not be proven.
- INFO: a fast path that is off because the user or the build chose so (``JITKEY_TENSOR_FIELDS=0``,
  a free-threaded interpreter).
- DEBUG: fallbacks to slower paths, the first time per kernel and reason.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("jitkey")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _configure_from_env() -> None:
    """``JITKEY_LOG=<level>``: attach one stderr handler to the ``jitkey`` logger at that level."""
    value = os.environ.get("JITKEY_LOG", "").strip().lower()
    if not value:
        return
    level = _LEVELS.get(value)
    if level is None:
        logger.warning("JITKEY_LOG=%r is not one of %s; ignored", value, "|".join(_LEVELS))
        return
    if not any(getattr(h, "_jitkey_env", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        handler._jitkey_env = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)


_configure_from_env()
