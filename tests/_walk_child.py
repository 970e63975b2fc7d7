"""Run by tests/test_triton_walk.py in a fresh process: a kernels module's ``cache_key``s, recorded or replayed by
``jitkey.triton._walk``, against Triton's own walk.

Usage: ``python _walk_child.py CONFIG_JSON`` with ``{"mode": "record" | "replay" | "plain", "dir": the folder of
the kernels modules, "names": [kernel names of l2walk_kernels]}``, taken in order. ``record``: Triton computes each
``cache_key`` (its walk), then ``_walk.record``. ``replay``: ``_walk.restore`` on each, then ``cache_key``.
``plain``: ``cache_key`` alone (Triton's walk: the reference, since under Triton 3.6 what a walk merges from a
callee depends on what the process hashed before). ``JITCallable.parse`` is counted throughout (a walk parses
the source). Prints, per name: what record/restore said, the sources parsed, the ``cache_key`` (or its error) and
``used_global_vals`` (names, whether read from the module's globals, values).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from triton.runtime import jit as J


def _globals(fn: Any) -> list[Any]:
    return [[name, d is fn.__globals__, repr(v)] for (name, _), (v, d) in fn.used_global_vals.items()]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    sys.path.insert(0, cfg["dir"])
    from jitkey.triton import _l2, _walk

    dialect = _l2.process_status()[0]
    assert dialect is not None, _l2.process_status()
    parses: list[str] = []
    parse = J.JITCallable.parse

    def counted(self: Any) -> Any:
        parses.append(self._fn_name.rsplit(".", 1)[-1])
        return parse(self)

    import l2walk_kernels as mod

    out: dict[str, Any] = {}
    for name in cfg["names"]:
        k = getattr(mod, name)
        row: dict[str, Any] = {}
        J.JITCallable.parse = counted
        try:
            if cfg["mode"] == "replay":  # (a callee of an earlier kernel is hashed already)
                row["said"] = "hashed" if k.__dict__.get("hash") is not None else _walk.restore(k, dialect)
            try:
                row["key"] = k.cache_key
                row["globals"] = _globals(k)
            except Exception as exc:
                row["key"] = f"{type(exc).__name__}: {exc}"
        finally:
            J.JITCallable.parse = parse
        row["parsed"] = sorted(set(parses))
        parses.clear()
        if cfg["mode"] == "record" and "globals" in row:
            row["said"] = _walk.record(k, dialect)
        out[name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
