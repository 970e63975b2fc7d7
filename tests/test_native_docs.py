"""help() and Jupyter show the native API's docs: the built module's docstrings equal the stub's.

The stub (python/jitkey/_core.pyi) is the source; ``python scripts/sync_native_docs.py`` copies its docstrings
into the Rust doc comments. A failure here means the two drifted: edit the stub, run the script, rebuild.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import sync_native_docs

from jitkey import _core

FUNCS, CLASSES = sync_native_docs.stub_docs()
TARGETS = [(name, None) for name in FUNCS] + [
    (cls, member) for cls, (doc, members) in CLASSES.items() for member in [None, *members] if doc or member
]


def test_the_public_api_is_covered() -> None:
    names = {f"{c}.{m}" if m else c for c, m in TARGETS}
    assert {
        "encode",
        "digest",
        "LruCache",
        "LruCache.get_or_insert",
        "DiskIndex.put",
        "Signature.lookup",
    } <= names


@pytest.mark.parametrize(("owner", "member"), TARGETS, ids=[f"{c}.{m}" if m else c for c, m in TARGETS])
def test_native_doc_equals_the_stub(owner: str, member: str | None) -> None:
    if member is None:
        want = FUNCS.get(owner) or CLASSES[owner][0]
        obj = getattr(_core, owner)
    else:
        want = CLASSES[owner][1][member]
        obj = inspect.getattr_static(getattr(_core, owner), member)
    got = inspect.getdoc(obj)
    assert got == inspect.cleandoc(want or ""), (
        f"{owner}{'.' + member if member else ''}: the native docstring differs from _core.pyi; "
        "run `python scripts/sync_native_docs.py` and rebuild"
    )


def test_the_rust_sources_are_in_sync_with_the_stub() -> None:
    assert sync_native_docs.sync(check=True) == []
