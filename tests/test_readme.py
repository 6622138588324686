"""The README's Python examples run (all but the ones marked as sketches)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    runnable = [b for b in blocks if not b.startswith("# (sketch")]
    assert len(runnable) >= 3
    namespace: dict[str, object] = {}
    for block in runnable:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["table"] is not None
