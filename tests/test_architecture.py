"""The house's imports. The core's modules import only what docs/architecture.md says they may:
modules of their own row or of rows above it, never in a circle (read from the `use crate::`
lines themselves). The Python package's modules, the compiled module among them, never import
in a circle either. No module of `src/` or `python/` runs past `MAX_LINES`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "python" / "pdplan"
BINDING = SRC / "python"
COMPILED = "pdplan._core"
# A module past this many lines holds more than one idea: split it (a folder module's files
# count one by one).
MAX_LINES = 800


def folder_modules() -> set[str]:
    """Rows naming a folder (`planner/`, `model/readers/`): one module split into files by idea,
    each file a part of the folder's one purpose."""
    return {name for row in documented_rows() for name in row if (SRC / name).is_dir()}


def module_of(path: Path) -> str:
    """`model/readers/state.rs` -> `model/readers`; `planner/fanout.rs` -> `planner`;
    `planner.rs` -> `planner`."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    folders = folder_modules()
    for end in range(1, len(parts) + 1):
        if "/".join(parts[:end]) in folders:
            return "/".join(parts[:end])
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
        if path.name == "tests.rs":
            continue  # a folder module's unit tests (`#[cfg(test)] mod tests;`)
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


def first_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `edges` (module -> modules it imports), or None."""
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(edges.get(module, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep] if dep in path else [module, dep]
            if dep not in state and (cycle := visit(dep, [*path, dep])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_no_two_modules_import_each_other() -> None:
    cycle = first_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_reader_finds_imports() -> None:
    """The parser sees what matters: nested trees, paths in code, super:: in model/."""
    edges = graph()
    assert {"fragment", "holders", "notify", "limits"} <= edges["planner"]
    assert "model/config" in edges["model/readers"]
    assert {"model/config", "model/families", "model/shape"} <= edges["model/hf_config"]


def python_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def python_imports(module: str, source: str, *, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules `module` imports: every `import` and `from ... import` anywhere in
    it (under `TYPE_CHECKING` and inside functions too), relative ones resolved; `from a import
    b` is module `a.b` when that is a module, else `a`."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            # `import a.b.c` imports the longest prefix that is a module.
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                if ".".join(parts[:end]) in known:
                    found.add(".".join(parts[:end]))
                    break
    return found - {module}


def binding_imports() -> set[str]:
    """The package's modules the compiled module imports at run time (`py.import("...")` in
    `src/python/`)."""
    found: set[str] = set()
    for path in sorted(BINDING.rglob("*.rs")):
        found.update(re.findall(r"\.import\(\s*\"([\w.]+)\"", path.read_text(encoding="utf-8")))
    return found


def python_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, the compiled module included. Its stub
    (`_core.pyi`) names the package's types for the type checker only and is not an import."""
    modules = python_modules()
    known = {*modules, COMPILED}
    edges = {
        module: python_imports(
            module,
            path.read_text(encoding="utf-8"),
            is_package=path.name == "__init__.py",
            known=known,
        )
        for module, path in modules.items()
    }
    edges[COMPILED] = {name for name in binding_imports() if name in known}
    return edges


def test_no_python_module_imports_in_a_circle() -> None:
    cycle = first_cycle(python_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_python_reader_finds_imports() -> None:
    """The reader sees what matters: relative and absolute forms, `from package import module`,
    imports under `TYPE_CHECKING`, and the binding's own imports."""
    edges = python_graph()
    assert {"pdplan._model", "pdplan._core"} <= edges["pdplan._context"]
    assert {"pdplan._package_types", "pdplan.limits", "pdplan._planner"} <= edges["pdplan"]
    assert "pdplan._model" in edges["pdplan._exchange"]
    assert "types" in binding_imports()  # fragment_slots.rs: py.import("types")
    known = {"pdplan", "pdplan._b", "pdplan.sub", "pdplan.sub._a", "pdplan.sub.c"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import _a\n"
        "if TYPE_CHECKING:\n"
        "    from pdplan._b import Thing\n"
        "def f():\n"
        "    from .. import Name\n"
        "    import pdplan.sub.c.attr\n"
    )
    found = python_imports("pdplan.sub.probe", source, is_package=False, known=known)
    assert found == {"pdplan.sub._a", "pdplan._b", "pdplan", "pdplan.sub.c"}


def test_the_reader_catches_a_circle() -> None:
    assert first_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert first_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_runs_past_the_line_bound() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in [*SRC.rglob("*.rs"), *PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by idea (at most {MAX_LINES} lines a file): {long}"


#: The transfer session's package, and what it may not reach: a runtime's own packages, and
#: pdplan's modules that read one runtime's objects (its adapters). The runtimes' shared
#: conventions (``pdplan.runtimes._conventions``, and the package that holds it) are neutral.
SESSION = "pdplan.session"
RUNTIME_PACKAGES = {"vllm", "sglang", "torch", "tokenspeed", "dynamo"}
NEUTRAL_RUNTIME_MODULES = {"pdplan.runtimes", "pdplan.runtimes._conventions"}


def external_imports(source: str) -> set[str]:
    """The top-level packages a module's absolute imports name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def runtime_reach(module: str, edges: dict[str, set[str]]) -> list[str]:
    """Every runtime module ``module`` reaches through pdplan's own imports."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(edges.get(current, ()))
    return sorted(
        name
        for name in seen
        if name.startswith(("pdplan.connectors", "pdplan.runtimes"))
        and name not in NEUTRAL_RUNTIME_MODULES
    )


def test_the_session_imports_no_runtime() -> None:
    """The session serves every runtime: none of its modules imports a runtime's package, or
    reaches (through any chain of pdplan's imports) a module that reads one runtime's objects."""
    modules = python_modules()
    edges = python_graph()
    session = sorted(m for m in modules if m == SESSION or m.startswith(SESSION + "."))
    assert len(session) > 10, session
    offenders = {}
    for module in session:
        packages = external_imports(modules[module].read_text(encoding="utf-8"))
        reached = runtime_reach(module, edges)
        if packages & RUNTIME_PACKAGES or reached:
            offenders[module] = sorted(packages & RUNTIME_PACKAGES) + reached
    assert not offenders, offenders


def test_the_layering_check_catches_a_runtime_import() -> None:
    edges = {
        "pdplan.session._a": {"pdplan.session._b"},
        "pdplan.session._b": {"pdplan.runtimes.vllm"},
    }
    assert runtime_reach("pdplan.session._a", edges) == ["pdplan.runtimes.vllm"]
    assert external_imports("import torch.cuda\nfrom vllm.config import X\n") == {"torch", "vllm"}


def test_the_vllm_adapter_leaves_the_network_to_the_session() -> None:
    """vLLM's adapter speaks vLLM; the side channel, its frames and the reads are the
    session's: no adapter module opens a socket or builds a frame."""
    modules = python_modules()
    adapter = [m for m in modules if m.startswith("pdplan.connectors.vllm")]
    for module in adapter:
        source = modules[module].read_text(encoding="utf-8")
        assert not external_imports(source) & {"zmq", "socket", "nixl", "mooncake"}, module
        assert not re.search(r"session\._(side_channel|protocol|notices)\b", source), module
