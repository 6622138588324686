"""The README: short, its quick start runs and reaches an engine's descriptors, and its
headline figures are the benchmark scripts' own (benches/results/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")


def test_the_readme_is_short() -> None:
    assert len(TEXT.splitlines()) < 250


def test_the_quick_start_runs_to_descriptors() -> None:
    blocks = re.findall(r"```python\n(.*?)```", TEXT, re.S)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert "descriptors(" in blocks[-1] and "memmove" in blocks[-1]


def test_headline_figures_are_the_benchmarks_own() -> None:
    table = TEXT.split("<!-- headline-figures -->", 1)[1]
    results = "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "benches/results").glob("*.md")
    )
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # Every time and ratio a row quotes is in a results file, as written there.
        quoted = " ".join(cells[1:4])
        figures = re.findall(r"\d[\d,.]*\s?(?:µs|ms|s|\N{MULTIPLICATION SIGN})", quoted)
        assert figures, row
        for figure in figures:
            assert figure in results, (figure, row)


def test_the_docs_the_readme_links_exist() -> None:
    for target in re.findall(r"\]\(((?:docs/|CONTRIBUTING)[^)#]*)", TEXT):
        assert (ROOT / target).is_file(), target
