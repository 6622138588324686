"""Instruction counts under valgrind's callgrind: the stable measure on a shared machine."""

from __future__ import annotations

import os
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
