"""A native fast path that proves itself once per process before it is used (``jitkey._torch_alloc``,
``jitkey._torch_modes``): the native object is made from torch's loaded libraries and proven on live state
against torch's own functions, or the path is off with why. ``<env>=0`` turns it off; ``jitkey info`` reports it
(``jitkey._fastpaths``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


def cuda_initialized(torch: Any) -> bool:
    """The ``ready`` of a path proven on live CUDA state: CUDA is there and initialized (a proof never
    initializes it)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


class Proven:
    """One such path. ``make(torch)`` returns ``(native object, None)`` when proven, else ``(None, why not)``;
    ``ready(torch)``: whether it can be decided now (else :meth:`get` returns None, undecided)."""

    def __init__(
        self,
        env: str,
        undecided: str,
        make: Callable[[Any], tuple[Any, str | None]],
        ready: Callable[[Any], bool] | None = None,
    ) -> None:
        self.env = env
        self.undecided = undecided
        self._make = make
        self._ready = ready
        self._lock = threading.Lock()
        #: The thread deciding now (its proof's own torch calls may come back here: see :meth:`get`).
        self._deciding: int | None = None
        #: ``(native object or None, why not)`` once decided.
        self.state: tuple[Any, str | None] | None = None

    def get(self) -> Any:
        """The proven native object, or None (undecided, or off: see :meth:`status`).

        A proof runs torch functions, which may reach this path again on the same thread (e.g. under FlagGems'
        ``use_gems()`` a proof's ``fill_`` is a FlagGems op, whose first call is recorded and allocates): that
        use gets None (torch's own functions), never a wait for the proof it is part of."""
        if self.state is not None:
            return self.state[0]
        if self._deciding == threading.get_ident():
            return None
        import torch

        if self._ready is not None and not self._ready(torch):
            return None
        with self._lock:
            if self.state is None:
                self._deciding = threading.get_ident()
                try:
                    self.decide(torch)
                finally:
                    self._deciding = None
        assert self.state is not None
        return self.state[0]

    def decide(self, torch: Any) -> None:
        """Make and prove it now (again)."""
        if os.environ.get(self.env, "").strip() == "0":
            self.state = (None, f"{self.env}=0")
            return
        try:
            obj, why = self._make(torch)
        except Exception as exc:  # proving failed: torch's own functions it is
            obj, why = None, f"proving it raised {type(exc).__name__}: {exc}"
        self.state = (obj, None) if why is None else (None, why)

    def status(self) -> dict[str, Any]:
        """``{"on": bool | None, "why": reason or None}`` (``on`` is None while undecided)."""
        if self.state is None:
            return {"on": None, "why": self.undecided}
        return {"on": self.state[0] is not None, "why": self.state[1]}

    def fast_path(self, what: str) -> dict[str, Any]:
        """The ``jitkey info`` entry: ``on``, ``why``, ``chosen`` (turned off by the environment), ``what``."""
        st = self.status()
        return {**st, "chosen": st["why"] == f"{self.env}=0", "what": what}
