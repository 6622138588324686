"""Instruction counts under valgrind's callgrind: the stable measure on a shared machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def instructions(script: str, args: Sequence[str], count: int) -> float:
    """Instructions per call: `script` runs with `args` and then a call count (its last
    argument), once with 0 calls and once with `count`; the difference over `count`."""
    # The interpreter itself, not a shim; a venv's python (a link) keeps its venv.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.py"
        path.write_text(script)
        totals = []
        for n in (0, count):
            out = Path(tmp) / f"cg.{n}"
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
            line = next(x for x in done.stderr.splitlines() if "Collected" in x)
            totals.append(int(line.split(":")[-1].strip()))
    return (totals[1] - totals[0]) / count


def inclusive(script: str, args: Sequence[str], count: int) -> dict[str, float]:
    """Per call, each function's inclusive instructions (callgrind_annotate --inclusive=yes),
    as the difference between a run of `count` calls and one of none, over `count`; the whole
    program's under "PROGRAM TOTALS". A function inlined into its caller has no line of its own."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.py"
        path.write_text(script)
        for n in (0, count):
            out = Path(tmp) / f"cg.{n}"
            subprocess.run(
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
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
                check=True,
            )
            shown = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs.append(_by_function(shown))
    none, some = runs
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
