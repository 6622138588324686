"""Writes the compiled module's docstrings from its stub: the stub (python/pdplan/_core.pyi)
is the one text IDEs and the API reference read, and each documented function, class, method
and property of it becomes the doc comment of its binding in src/python/, which PyO3 hands to
``help()``. A class's ``__new__`` text follows the class's own (Python shows no separate
constructor doc for a compiled class). tests/test_api_docs.py holds the two to each other.

    python scripts/stub_docs.py          # rewrite the doc comments that differ
    python scripts/stub_docs.py --check  # list them, exit 1 if any
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "python" / "pdplan" / "_core.pyi"
BINDING = ROOT / "src" / "python"


def stub_docs() -> dict[tuple[str | None, str], str]:
    """``(class or None, name) -> docstring`` of every documented item in the stub."""
    docs: dict[tuple[str | None, str], str] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
            docs[(None, node.name)] = ast.get_docstring(node) or ""
        elif isinstance(node, ast.ClassDef):
            if any(isinstance(b, ast.Name) and b.id.endswith("Error") for b in node.bases):
                continue  # an exception: its text is create_exception!'s, held by the test
            own = ast.get_docstring(node) or ""
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and ast.get_docstring(item):
                    text = ast.get_docstring(item) or ""
                    if item.name == "__new__":
                        own = f"{own}\n\n{text}" if own else text
                    else:
                        docs[(node.name, item.name)] = text
            if own:
                docs[(node.name, "")] = own
    return docs


def header_start(lines: list[str], at: int) -> int:
    """The first line of the doc comments and attributes right above line ``at``."""
    start = at
    while start > 0:
        above = lines[start - 1].strip()
        if not above or (above[-1] in "{};" and not above.startswith(("#[", "///"))):
            break
        start -= 1
    return start


def with_doc(lines: list[str], at: int, doc: str) -> bool:
    """Puts ``doc`` as the doc comment of the item at line ``at``; whether it changed."""
    start = header_start(lines, at)
    indent = re.match(r"\s*", lines[at]).group(0)  # type: ignore[union-attr]
    header = lines[start:at]
    kept = [line for line in header if not line.strip().startswith("///")]
    written = [f"{indent}///" + (f" {line}" if line else "") for line in doc.split("\n")]
    if header == written + kept:
        return False
    lines[start:at] = written + kept
    return True


def locate(text: list[str]) -> dict[tuple[str | None, str], int]:
    """Where each binding's item is: pyfunctions, pyclasses by their Python name, methods of a
    ``#[pymethods] impl`` by their Python name."""
    found: dict[tuple[str | None, str], int] = {}
    rust_class: dict[str, str] = {}
    joined = "\n".join(text)
    for match in re.finditer(r'#\[pyclass\([^\]]*name = "(\w+)"\)\]\s*pub struct (\w+)', joined):
        rust_class[match.group(2)] = match.group(1)
    current: str | None = None
    pending_name: str | None = None
    for i, line in enumerate(text):
        stripped = line.strip()
        impl = re.match(r"impl (\w+) \{", stripped)
        if impl:
            current = rust_class.get(impl.group(1))
            continue
        if line.startswith("}"):
            current = None
        struct = re.match(r"pub struct (\w+)", stripped)
        if struct and struct.group(1) in rust_class:
            found[(rust_class[struct.group(1)], "")] = i
        renamed = re.search(r'name = "(\w+)"', stripped)
        if stripped.startswith("#[pyo3(") and renamed:
            pending_name = renamed.group(1)
        fn = re.match(r"(?:pub )?fn (\w+)", stripped)
        if fn:
            name = pending_name or fn.group(1)
            pending_name = None
            found.setdefault((current, name), i)
    return found


def main() -> int:
    check = "--check" in sys.argv
    docs = stub_docs()
    placed: set[tuple[str | None, str]] = set()
    differing = []
    for file in sorted(BINDING.glob("*.rs")):
        lines = file.read_text().split("\n")
        changed = False
        for key, at in sorted(locate(lines).items(), key=lambda kv: -kv[1]):
            if key not in docs:
                continue
            placed.add(key)
            before = list(lines)
            if with_doc(lines, at, docs[key]):
                differing.append(f"{file.name}: {key[0] or ''}.{key[1]}".replace("..", "."))
                changed = True
                if check:
                    lines = before
        if changed and not check:
            file.write_text("\n".join(lines))
    unplaced = sorted(f"{c or ''}.{n}" for c, n in set(docs) - placed)
    for line in differing:
        print(("differs: " if check else "wrote: ") + line)
    for name in unplaced:
        print(f"no binding found for the stub's {name}")
    return 1 if (check and differing) or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
