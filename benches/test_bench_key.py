"""Key building: encode / digest / fast_hash of Triton-style key tuples vs Python's own tools.

Peers: ``hash(tuple)`` (the in-memory hash a dict key pays; not stable across processes) and
``hashlib.blake2b(pickle.dumps(key))`` (a persistent digest done in Python).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable

import pytest

import jitkey
from jitkey import _reference

IMPLS: dict[str, Callable[[tuple[object, ...]], object]] = {
    "python-hash": hash,
    "python-blake2b-pickle": lambda k: hashlib.blake2b(pickle.dumps(k), digest_size=32).digest(),
    "jitkey-fast_hash": jitkey.fast_hash,
    "jitkey-encode": jitkey.encode,
    "jitkey-digest": jitkey.digest,
}


@pytest.mark.parametrize("impl", IMPLS)
def test_key(benchmark, impl: str, key_tuple: tuple[object, ...]) -> None:  # type: ignore[no-untyped-def]
    fn = IMPLS[impl]
    benchmark.group = f"key/{len(key_tuple)}-entry"
    # Correct first: jitkey agrees with the reference encoder, and every impl is deterministic.
    assert jitkey.encode(key_tuple) == _reference.encode(key_tuple)
    assert jitkey.digest(key_tuple) == _reference.digest(key_tuple)
    assert fn(key_tuple) == fn(key_tuple)
    benchmark(fn, key_tuple)
