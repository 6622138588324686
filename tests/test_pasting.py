"""Every Python block of the README and the docs pastes into the interactive interpreter as it
is. Each block is fed line by line to `code.InteractiveConsole`, which reads lines as the `>>>`
prompt does, and no line may be a syntax error there. The blocks are compiled, not run:
`test_docs.py` and `test_readme.py` run them.

At the prompt a compound statement (`for`, `with`, `def`, ...) ends only at a blank line. So
a dedented line straight after a loop body is an error, and so is a blank line inside a
function body."""

from __future__ import annotations

import code
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


class PasteConsole(code.InteractiveConsole):
    """A prompt that compiles what is pasted into it and records each syntax error."""

    def __init__(self) -> None:
        super().__init__()
        self.line_number = 0
        self.errors: list[str] = []

    def runcode(self, code: object) -> None:
        """Compiling is the check; the docs tests run the blocks."""

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        error = sys.exc_info()[1]
        message = getattr(error, "msg", str(error))
        self.errors.append(f"pasted line {self.line_number}: {message}")


def paste_errors(block: str) -> list[str]:
    console = PasteConsole()
    for console.line_number, line in enumerate(block.splitlines(), 1):
        console.push(line)
    console.push("")  # the blank line that ends a last compound statement
    return console.errors


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S), 1):
            found.append((f"{page.relative_to(ROOT)} block {number}", block))
    return found


BLOCKS = python_blocks()


def test_the_pages_have_blocks() -> None:
    assert len(BLOCKS) >= 30


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_a_block_pastes_into_the_prompt(where: str, block: str) -> None:
    assert not paste_errors(block), f"{where}: {paste_errors(block)}"


def test_the_console_catches_what_a_prompt_refuses() -> None:
    loop_then_code = "for i in range(2):\n    x = i\ny = 1\n"
    blank_in_a_body = "def f():\n    a = 1\n\n    return a\n"
    assert paste_errors(loop_then_code)
    assert paste_errors(blank_in_a_body)
    assert not paste_errors("for i in range(2):\n    x = i\n\ny = 1\n")
    assert not paste_errors("def f():\n    a = 1\n    return a\n\n\nf()\n")
