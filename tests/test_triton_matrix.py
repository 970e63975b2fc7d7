"""The CPU test matrix over Triton versions runs against the Triton it asked for.

``make test-python`` sets ``JITKEY_EXPECT_TRITON`` to the pinned version (requirements-dev.txt) and
``make test-triton-latest`` to ``TRITON_LATEST`` (installed into ``.triton-latest/`` and put first on
``PYTHONPATH``). A silently wrong install (the pinned Triton shadowing the requested one, or the other way
round) fails here instead of passing the whole suite against the wrong version.
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest

triton = pytest.importorskip("triton")

import jitkey.triton as jt  # noqa: E402

EXPECT = os.environ.get("JITKEY_EXPECT_TRITON")


@pytest.mark.skipif(not EXPECT, reason="not a matrix run (JITKEY_EXPECT_TRITON is unset)")
def test_matrix_runs_the_requested_triton() -> None:
    assert triton.__version__ == EXPECT, f"imported triton {triton.__version__} from {triton.__file__}"
    # What jitkey.env_key records (the first 'triton' distribution on sys.path) must be the same one.
    assert importlib.metadata.version("triton") == EXPECT
    # The binding recognises this Triton's internals: the fast path (and its differential tests) is live,
    # not a silent fallback to Triton's own path.
    info = jt.triton_info()
    assert info.version == EXPECT
    assert info.problem is None, info.problem
