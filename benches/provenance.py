"""Where a benchmark figure comes from: the header every script writes above its results."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"


def _run(*command: str) -> str:
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def invocation() -> str:
    """The command line this process runs, as a reader would type it again."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = sys.argv[0]
    return " ".join(["python", shown, *sys.argv[1:]])


def commit() -> str:
    """The commit measured (12 hex digits), or "unknown"."""
    return _run("git", "rev-parse", "--short=12", "HEAD")


def fields(command: str | None = None) -> dict[str, str]:
    """How, where and on what the figures were measured: a JSON result's ``provenance``."""
    measured = commit()
    # Results a run writes are not changes to what was measured.
    changed = _run(
        "git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benches/results"
    )
    if changed not in ("", "unknown"):
        measured += " (with uncommitted changes)"
    return {
        "written_by": command or invocation(),
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": measured,
        "machine": f"{_cpu()} ({os.cpu_count()} cores)",
        "python": f"CPython {platform.python_version()}",
        "rustc": _run("rustc", "--version"),
    }


def header(command: str | None = None) -> str:
    """The lines that say how, where and on what the figures below were measured."""
    f = fields(command)
    return "\n".join(
        [
            f"<!-- written by `{f['written_by']}` -->",
            f"Measured {f['measured']} at commit {f['commit']}, on {f['machine']},",
            f"{f['python']}, {f['rustc']}.",
            "",
        ]
    )


def write_json(name: str, data: dict[str, Any]) -> None:
    """Writes `benches/results/<name>`: ``data`` under its ``provenance``."""
    (RESULTS / name).write_text(json.dumps({"provenance": fields(), **data}, indent=1) + "\n")


def write(name: str, text: str) -> None:
    """Writes `benches/results/<name>` with the header above `text`."""
    (RESULTS / name).write_text(header() + "\n" + text.rstrip("\n") + "\n")
