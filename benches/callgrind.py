"""Instruction counts under valgrind's callgrind: the stable measure on a shared machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _runs(
    script: str, args: Sequence[str], count: int, read: Callable[[Path, str], Any]
) -> list[Any]:
    """`script` run under callgrind with `args` and then a call count (its last argument), once
    with 0 calls and once with `count`; `read(output file, valgrind's stderr)` of each run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.py"
        path.write_text(script)
        found = []
        for n in (0, count):
            out = Path(tmp) / f"cg.{n}"
            # The interpreter itself, not a shim; a venv's python (a link) keeps its venv.
            done = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    str(path),
                    *args,
                    str(n),
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
                check=True,
            )
            found.append(read(out, done.stderr))
        return found


def instructions(script: str, args: Sequence[str], count: int) -> float:
    """Instructions per call: the difference between a run of `count` calls and one of none,
    over `count`."""

    def total(_: Path, stderr: str) -> int:
        line = next(x for x in stderr.splitlines() if "Collected" in x)
        return int(line.split(":")[-1].strip())

    none, some = _runs(script, args, count, total)
    return (some - none) / count


def inclusive(script: str, args: Sequence[str], count: int) -> dict[str, float]:
    """Per call, each function's inclusive instructions (callgrind_annotate --inclusive=yes),
    as the difference between a run of `count` calls and one of none, over `count`; the whole
    program's under "PROGRAM TOTALS". A function inlined into its caller has no line of its own."""

    def by_function(out: Path, _: str) -> dict[str, int]:
        shown = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return _by_function(shown)

    none, some = _runs(script, args, count, by_function)
    return {name: (v - none.get(name, 0)) / count for name, v in some.items()}


def _by_function(annotated: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in annotated.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[.*\])?$", line)
        if match:
            # The function's name, whichever file callgrind_annotate files it under.
            name = match.group(2).split(":", 1)[-1] if ":" in match.group(2) else match.group(2)
            found[name] = max(found.get(name, 0), int(match.group(1).replace(",", "")))
    return found
