"""Process workers for tests/test_remote.py (importable by spawned children).

``tune_on_host`` is one process of one "host" (its own local DiskIndex directory) running the simulated-timer
autotune of tests/_autotune_workers.py over a TieredIndex; ``hammer`` is one process of the concurrency test.
Neither imports torch at module level (the hammer workers only need jitkey).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any


def tune_on_host(local_dir: str, url: str, ns: list[int], via_env: bool = False) -> dict[str, Any]:
    """Autotune ``scale_add`` for each ``n`` with a TieredIndex over ``local_dir`` and ``url``.

    ``via_env``: configure through ``JITKEY_CACHE_DIR`` / ``JITKEY_REMOTE_CACHE`` and ``index=None`` (the
    default index), as a user would without code changes.
    """
    import warnings

    import _autotune_workers as w
    import jitkey

    warnings.simplefilter("error")  # any RemoteCacheWarning here is a test failure
    if via_env:
        os.environ["JITKEY_CACHE_DIR"] = local_dir
        os.environ["JITKEY_REMOTE_CACHE"] = url
        from jitkey.remote import default_index

        index: Any = default_index()
        assert isinstance(index, jitkey.TieredIndex), index
        arg: Any = None
    else:
        index = jitkey.TieredIndex(jitkey.DiskIndex(local_dir), jitkey.RemoteIndex(url))
        arg = index
    gpu = w.SimulatedGPU()
    at = w.make(arg, gpu)
    blocks = [at[(1,)](*w.args_for(n)) for n in ns]
    out = {
        "pid": os.getpid(),
        "blocks": blocks,
        "bench_calls": gpu.bench_calls,
        "stats": at.cache_stats(),
        "index_stats": index.stats(),
    }
    index.close()
    return out


def value_for(key: int, writer: int = 0) -> bytes:
    """The bytes a process writes for ``key``: a function of the key (so overlapping writers agree),
    of varied length (1..4000 bytes)."""
    seed = hashlib.blake2b(f"k{key}".encode(), digest_size=32).digest()
    n = 1 + int.from_bytes(seed[:2], "little") % 4000
    return (seed * (n // 32 + 1))[:n]


def hammer(local_dir: str, url: str, keys: list[int], go_file: str) -> dict[str, Any]:
    """Get-or-put every key through a TieredIndex (bytes checked on every hit); what was acknowledged."""
    import jitkey

    index = jitkey.TieredIndex(jitkey.DiskIndex(local_dir), jitkey.RemoteIndex(url, timeout=5.0))
    deadline = time.monotonic() + 60
    while not Path(go_file).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    acked: list[int] = []
    wrong: list[int] = []
    hits = 0
    for i, k in enumerate(keys):
        key = ("hammer", k)
        got = index.get(key)
        if got is None:
            if i % 7 == 0:  # a batch path too
                batch = [(("hammer", k2), value_for(k2)) for k2 in keys[i : i + 3]]
                if index.put_many(batch):
                    acked += keys[i : i + 3]
            elif index.put(key, value_for(k)):
                acked.append(k)
        elif got != value_for(k):
            wrong.append(k)
        else:
            hits += 1
    stats = index.stats()
    index.close()
    return {"acked": acked, "wrong": wrong, "hits": hits, "stats": stats}
