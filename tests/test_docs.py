"""Every example in the docs runs: each page's Python blocks in order, in one namespace a page
(numpy stand-ins for the runtimes' tensors; a block that starts `# engine: nixl` runs with the
NIXL tests), and every `pdplan` command line of a `bash` block, whose `# ` lines below it are
output it must print. The generated tables expand on every page, as the docs build does."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pdplan import limits
from pdplan._core import LAYER_KINDS
from pdplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
sys.path.insert(0, str(ROOT / "scripts"))
import docs_hooks  # noqa: E402

ENGINE = "# engine: nixl"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


def run_page(page: Path, *, engine: bool) -> int:
    """Runs the page's blocks up to its last engine block (or all, without engines)."""
    code = blocks(page, "python")
    if engine:
        last = max(i for i, block in enumerate(code) if block.startswith(ENGINE))
        code = code[: last + 1]
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem}"}
    ran = 0
    for block in code:
        if block.startswith(ENGINE) and not engine:
            continue
        exec(compile(block, str(page), "exec"), namespace)
        ran += 1
    return ran


def test_the_site_has_its_pages() -> None:
    names = {page_id(p) for p in PAGES}
    assert {
        "index.md",
        "getting-started.md",
        "reference/api.md",
        "reference/wire-format.md",
        "guides/integrating-vllm.md",
        "performance.md",
        "architecture.md",
        "contributing.md",
    } <= names
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES:
        assert page_id(page) in nav, f"{page_id(page)} is not in mkdocs.yml's nav"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_a_page_runs(page: Path) -> None:
    if blocks(page, "python"):
        assert run_page(page, engine=False) >= 1


ENGINE_PAGES = [p for p in PAGES if any(b.startswith(ENGINE) for b in blocks(p, "python"))]


# A page with an engine runs in a child that exits as a reader's script does, so a page whose
# agents crash the interpreter at exit (UCX's IB module where there is no InfiniBand device,
# unless the page skips it) fails here.
CHILD = """
import sys
sys.path.insert(0, {tests!r})
from test_docs import run_page
from pathlib import Path
print("ran", run_page(Path({page!r}), engine=True), flush=True)
"""


@pytest.mark.nixl
@pytest.mark.parametrize("page", ENGINE_PAGES, ids=page_id)
def test_a_page_runs_through_nixl(page: Path, nixl_engine: None) -> None:
    code = CHILD.format(tests=str(Path(__file__).parent), page=str(page))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^ran (\d+)$", done.stdout, re.M)  # NIXL logs to stdout too
    assert ran and int(ran[-1]) >= 1, done.stdout


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, command line, output fragments) of every `pdplan` line of a bash block."""
    found = []
    for page in PAGES:
        for block in blocks(page, "bash"):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if not line.startswith("pdplan "):
                    continue
                command = line.split("  #", 1)[0].strip()
                while command.endswith("\\"):
                    i += 1
                    command = command[:-1] + lines[i].split("  #", 1)[0].strip()
                expected = []
                for after in lines[i + 1 :]:
                    if not after.startswith("# "):
                        break
                    expected.append(after[2:])
                found.append((page_id(page), command, expected))
    return found


@pytest.mark.parametrize(("page", "command", "expected"), commands(), ids=lambda v: str(v)[:60])
def test_a_documented_command_prints_what_the_page_says(
    page: str, command: str, expected: list[str]
) -> None:
    argv = shlex.split(command)[1:]
    if "|" in argv:
        argv = argv[: argv.index("|")]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # --help, --version
            code = int(exit_.code or 0)
    printed = out.getvalue() + err.getvalue()
    assert code in (0, 2), (page, command, printed)
    for fragment in expected:
        for piece in fragment.split("..."):
            assert piece.strip() in printed, (page, command, piece)


def test_the_generated_tables_come_from_the_core() -> None:
    table = docs_hooks.expand("<!-- generated:layer-kinds -->")
    for kind, cls, _, fields in LAYER_KINDS:
        assert f"`{cls}` (`{kind}`)" in table
        assert all(f"`{name}:" in table for name, *_ in fields)
    bounds = docs_hooks.expand("<!-- generated:limits -->")
    for name in limits.__all__:
        if name.startswith("MAX_") and name != "MAX_VALUE":
            assert f"`{name}`" in bounds, name
    # Every page that asks for a table gets it.
    for page in PAGES:
        assert "<!-- generated:" not in docs_hooks.expand(page.read_text(encoding="utf-8"))
