"""The core's modules import only what docs/architecture.md says they may: modules of their own
row or of rows above it, never in a circle. Read from the `use crate::` lines themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"


def module_of(path: Path) -> str:
    """`model/readers/state.rs` -> `model/readers`; `planner.rs` -> `planner`."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts[:2] == ["model", "readers"]:
        parts = parts[:2]
    return "/".join(parts)


def documented_rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8").split("<!-- architecture:order -->", 1)[1]
    rows = []
    for line in text.splitlines()[2:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        rows.append(
            [name.removesuffix(".rs").rstrip("/") for name in re.findall(r"`([^`]+)`", first)]
        )
    return rows


def top_level(tree: str) -> list[str]:
    """The first path segment of each item of a `use` tree (`a::b, c::{d, e}` -> a, c)."""
    tree = tree.strip()
    if not tree.startswith("{"):
        return [re.split(r"::|\s", tree, maxsplit=1)[0]]
    inner, depth, items, item = tree[1:-1], 0, [], ""
    for char in inner:
        depth += char == "{"
        depth -= char == "}"
        if char == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += char
    items.append(item)
    return [name for it in items if it.strip() for name in top_level(it)]


def imports(path: Path, module: str) -> set[str]:
    code = path.read_text(encoding="utf-8").split("#[cfg(test)]", 1)[0]
    code = re.sub(r"//[^\n]*", "", code)
    found: set[str] = set()
    for tree in re.findall(r"\buse\s+crate::([^;]+);", code):
        found.update(top_level(tree))
    found.update(re.findall(r"\bcrate::([a-z_]+)::", code))
    names = set()
    for name in found:
        if name == "model":
            continue  # resolved below, by the submodule named after it
        names.add(name)
    for sub in re.findall(r"\bcrate::model::([a-z_]+)", code):
        names.add(f"model/{sub}")
    if module.startswith("model/"):
        parent = "model" if module != "model/readers" or path.name == "mod.rs" else None
        for tree in re.findall(r"\buse\s+super::([^;]+);", code):
            for name in top_level(tree):
                if parent and name != "super":
                    names.add(f"{parent}/{name}")
    return {n for n in names if n not in {"self", module}}


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.rs")):
        if path.relative_to(SRC).parts[0] == "python" or path.name == "lib.rs":
            continue
        module = module_of(path)
        if module == "model":
            continue  # the re-exports of model/
        edges.setdefault(module, set()).update(imports(path, module))
    return edges


def test_every_core_module_has_its_row() -> None:
    rows = documented_rows()
    listed = [m for row in rows for m in row]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) == set(graph()), "modules and the table differ"


def test_no_module_imports_from_below_it() -> None:
    row_of = {m: i for i, row in enumerate(documented_rows()) for m in row}
    upward = [
        f"{module} (row {row_of[module]}) uses {dep} (row {row_of[dep]})"
        for module, deps in graph().items()
        for dep in sorted(deps)
        if dep in row_of and row_of[dep] > row_of[module]
    ]
    assert not upward, upward
    unknown = {dep for deps in graph().values() for dep in deps} - set(row_of)
    assert not unknown, f"imports of modules the table does not know: {unknown}"


def test_no_two_modules_import_each_other() -> None:
    edges = graph()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(edges.get(module, ())):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep] if dep in path else [module, dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_the_reader_finds_imports() -> None:
    """The parser sees what matters: nested trees, paths in code, super:: in model/."""
    edges = graph()
    assert {"fragment", "holders", "notify", "limits"} <= edges["planner"]
    assert "model/config" in edges["model/readers"]
    assert {"model/config", "model/families", "model/shape"} <= edges["model/hf_config"]
