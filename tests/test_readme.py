"""The code blocks of the README and of docs/*.md run as pasted (each alone in a fresh interpreter): see
tests/readme_snippets.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import readme_snippets

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    s for p in DOCS for s in readme_snippets.snippets(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
]


def test_the_readme_has_runnable_snippets() -> None:
    runnable = [s for s in SNIPPETS if s.mark is None and s.file == "README.md"]
    assert len(runnable) >= 3, [s.id for s in SNIPPETS]
    assert len([s for s in SNIPPETS if s.mark is None]) >= 8, [s.id for s in SNIPPETS]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_readme_snippet_runs(snippet: readme_snippets.Snippet) -> None:
    why = readme_snippets.skip_reason(snippet, sys.executable)
    if why is not None:
        pytest.skip(why)
    proc = readme_snippets.run(snippet, sys.executable)
    assert proc.returncode == 0, f"{snippet.code}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def test_env_table_lists_every_variable_jitkey_reads() -> None:
    from jitkey._info import ENV_VARS

    text = README.read_text(encoding="utf-8")
    for name in ENV_VARS:
        assert f"| `{name}`" in text, f"{name} is missing from the README's environment table"


def test_every_error_and_warning_is_in_the_errors_table() -> None:
    """docs/errors.md names every exception and warning of ``jitkey.errors`` (and nothing it does not define)."""
    import re

    import jitkey.errors

    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = {
        m
        for line in text.splitlines()
        if line.startswith("| `")
        for m in re.findall(r"`(\w+)`", line.split("|")[1])
    }
    assert rows == set(jitkey.errors.__all__)
