"""Every guide's Python blocks run, page by page, in one namespace a page (numpy stand-ins for
the runtimes' tensors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDES = sorted(DOCS.glob("*.md"))


def test_the_integration_guides_are_there() -> None:
    names = {page.name for page in GUIDES}
    assert {"integrating-vllm.md", "integrating-sglang.md"} <= names


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_a_guide_runs(page: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    assert blocks, page
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
