"""Every file under benches/results says where its figures come from: the command that wrote
it, when, at which commit and on what machine (benches/provenance.py's header in a Markdown
file, its ``provenance`` object in a JSON one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benches" / "results"
FILES = sorted(p for p in RESULTS.iterdir() if p.is_file())
KEYS = {"written_by", "measured", "commit", "machine", "python", "rustc"}


def test_results_are_there() -> None:
    assert {p.suffix for p in FILES} <= {".md", ".json"} and len(FILES) > 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_result_carries_its_provenance(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        found = json.loads(text)
        assert isinstance(found, dict) and KEYS <= set(found["provenance"])
        assert found["provenance"]["written_by"].startswith("python benches/")
        return
    first, second, third = text.splitlines()[:3]
    assert re.fullmatch(r"<!-- written by `python benches/\S+\.py[^`]*` -->", first)
    assert re.match(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC at commit [0-9a-f]{12}", second)
    assert third.startswith("CPython ") and "rustc" in third
