"""Copy the docstrings of ``python/jitkey/_core.pyi`` (the source of truth) into the Rust doc comments of the
native functions, classes, methods and properties, so ``help()``, ``inspect.getdoc`` and Jupyter show them.

    python scripts/sync_native_docs.py          # rewrite the Rust doc comments
    python scripts/sync_native_docs.py --check  # exit 1 if any differs (tests/test_native_docs.py checks the
                                                # built module itself)

Covered: the stub's public module functions, and its public classes with their public methods and properties
(dunders and ``__new__`` are CPython slots whose docs PyO3 cannot set).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "python" / "jitkey" / "_core.pyi"
SRC = ROOT / "rust" / "py" / "src"


def stub_docs() -> tuple[dict[str, str], dict[str, tuple[str | None, dict[str, str]]]]:
    """(function name -> doc, class name -> (class doc, member -> doc)), public names only."""
    tree = ast.parse(STUB.read_text())
    funcs: dict[str, str] = {}
    classes: dict[str, tuple[str | None, dict[str, str]]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if (doc := ast.get_docstring(node)) is not None:
                funcs[node.name] = doc
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            members: dict[str, str] = {}
            for item in node.body:
                public = isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
                if public and (doc := ast.get_docstring(item)) is not None:
                    members[item.name] = doc  # the last overload carries it
            classes[node.name] = (ast.get_docstring(node), members)
    return funcs, classes


def _doc_lines(doc: str, indent: str) -> list[str]:
    return [f"{indent}///{(' ' + line) if line else ''}" for line in inspect.cleandoc(doc).splitlines()]


def _replace_docs(lines: list[str], item: int, doc: str) -> list[str]:
    """Put ``doc`` above the attributes of the ``fn``/``struct`` at line ``item``, replacing the ``///`` lines
    there."""
    indent = re.match(r"\s*", lines[item]).group(0)  # type: ignore[union-attr]
    top = item
    while top > 0:
        s = lines[top - 1].strip()
        if s.startswith(("///", "#[")) or (s.endswith(")]") and not s.startswith("}")):
            top -= 1
        else:
            break
    attrs = [line for line in lines[top:item] if not line.strip().startswith("///")]
    return [*lines[:top], *_doc_lines(doc, indent), *attrs, *lines[item:]]


def _find_fn(lines: list[str], name: str, start: int, end: int, indent: str) -> int | None:
    pat = re.compile(rf"^{indent}(pub(\(crate\))? )?fn {re.escape(name)}\b[<(]")
    for i in range(start, end):
        if pat.match(lines[i]):
            return i
    return None


def sync(check: bool) -> list[str]:
    """Rewrites (or, with ``check``, compares) every Rust file; returns what differed."""
    funcs, classes = stub_docs()
    problems: list[str] = []
    for path in sorted(SRC.glob("*.rs")):
        original = path.read_text().split("\n")
        lines = list(original)
        for name, doc in funcs.items():
            for i, line in enumerate(lines):
                if re.match(rf"^(pub(\(crate\))? )?fn {re.escape(name)}\b[<(]", line) and any(
                    "#[pyfunction]" in x for x in lines[max(0, i - 4) : i]
                ):
                    lines = _replace_docs(lines, i, doc)
                    break
        for cls, (cdoc, members) in classes.items():
            at = next((i for i, x in enumerate(lines) if x.startswith(f'#[pyclass(name = "{cls}"')), None)
            if at is None:
                continue
            struct_at = next(
                i for i in range(at, len(lines)) if re.match(r"^(pub(\(crate\))? )?struct ", lines[i])
            )
            struct = re.match(r"^(?:pub(?:\(crate\))? )?struct (\w+)", lines[struct_at]).group(1)  # type: ignore[union-attr]
            if cdoc is not None:
                lines = _replace_docs(lines, struct_at, cdoc)
            for name, doc in members.items():
                impl = next(
                    (
                        i
                        for i, x in enumerate(lines)
                        if x.startswith(f"impl {struct} {{") and "#[pymethods]" in lines[i - 1]
                    ),
                    None,
                )
                if impl is None:
                    problems.append(f"{path.name}: no #[pymethods] impl {struct}")
                    break
                end = next(i for i in range(impl + 1, len(lines)) if lines[i].startswith("}"))
                fn_at = _find_fn(lines, name, impl, end, "    ")
                if fn_at is None:
                    problems.append(f"{path.name}: {cls}.{name} not found in impl {struct}")
                    continue
                lines = _replace_docs(lines, fn_at, doc)
        if lines != original:
            problems.append(f"{path.relative_to(ROOT)}: doc comments differ from {STUB.relative_to(ROOT)}")
            if not check:
                path.write_text("\n".join(lines))
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    problems = sync(args.check)
    for line in problems:
        print(line)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
