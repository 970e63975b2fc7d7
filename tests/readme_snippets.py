"""Runs the ```python blocks of the README and of the reference in docs/, each alone in a fresh interpreter, as a
reader would paste them.

Used by ``tests/test_readme.py`` (``make test``) and by ``scripts/install_check.sh`` against a fresh venv
that has only the built wheel or sdist installed. Stdlib only.

Marks (an HTML comment on the line before the fence):
    <!-- snippet: gpu -->            needs a CUDA GPU; skipped without one
    <!-- snippet: skip REASON -->    not runnable as is (e.g. a fragment); always skipped, with the reason
A block that imports torch or triton is skipped when that package is not installed (``--require-all``
makes that a failure instead).

    python tests/readme_snippets.py README.md docs/*.md [--python PY] [--require-all]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

_FENCE = re.compile(r"^```python\s*$")
_MARK = re.compile(r"^<!--\s*snippet:\s*(\w+)\s*(.*?)\s*-->\s*$")
_IMPORT = re.compile(r"^\s*(?:import\s+(?:[\w.]+\s*,\s*)*|from\s+)(torch|triton)\b", re.M)


@dataclasses.dataclass
class Snippet:
    line: int  # 1-based line of the opening fence
    code: str
    file: str = "README.md"
    mark: str | None = None  # "gpu" or "skip"
    reason: str = ""

    @property
    def needs(self) -> set[str]:
        found = set(_IMPORT.findall(self.code))
        return found | ({"triton"} if "jitkey.triton" in self.code else set())

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def snippets(text: str, file: str = "README.md") -> list[Snippet]:
    """Every ```python block of ``text`` (the contents of ``file``), with its mark."""
    out: list[Snippet] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            mark = _MARK.match(lines[start - 1]) if start > 0 else None
            out.append(
                Snippet(
                    line=start + 1,
                    code="\n".join(lines[start + 1 : j]) + "\n",
                    mark=mark.group(1) if mark else None,
                    reason=mark.group(2) if mark else "",
                    file=file,
                )
            )
            i = j
        i += 1
    return out


def _has(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def _has_gpu(python: str) -> bool:
    code = "import sys, torch; sys.exit(not torch.cuda.is_available())"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def skip_reason(s: Snippet, python: str) -> str | None:
    """Why ``s`` cannot run with ``python`` (``None``: it can)."""
    if s.mark == "skip":
        return f"marked skip: {s.reason}"
    for mod in sorted(s.needs):
        if not _has(python, mod):
            return f"needs {mod}, which is not installed for {python}"
    if s.mark == "gpu" and not _has_gpu(python):
        return "needs a CUDA GPU"
    return None


def run(s: Snippet, python: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs the block in a fresh interpreter, in an empty directory, with a private cache directory."""
    with tempfile.TemporaryDirectory(prefix="jitkey-readme-") as tmp:
        env = dict(os.environ, JITKEY_CACHE_DIR=os.path.join(tmp, "cache"))
        return subprocess.run(
            [python, "-c", s.code], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--require-all", action="store_true", help="a block skipped for a missing package fails")
    args = p.parse_args(argv)
    found: list[Snippet] = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            found += snippets(f.read(), os.path.relpath(path))
    failed = ran = 0
    for s in found:
        why = skip_reason(s, args.python)
        if why is not None:
            missing = why.startswith("needs ") and "GPU" not in why
            if args.require_all and missing:
                print(f"FAIL {s.id}: {why}")
                failed += 1
            else:
                print(f"skip {s.id}: {why}")
            continue
        proc = run(s, args.python)
        ran += 1
        if proc.returncode == 0:
            print(f"ok   {s.id}")
        else:
            failed += 1
            print(
                f"FAIL {s.id} (exit {proc.returncode})\n{s.code}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
            )
    print(f"{ran} snippets run, {failed} failed, {len(found) - ran - failed} skipped")
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
