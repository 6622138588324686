"""The stub matches the compiled module and the package type-checks strictly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pdplan

PACKAGE_DIR = Path(pdplan.__file__).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, timeout=300
    )


def test_stub_matches_the_binary() -> None:
    result = run("mypy.stubtest", "pdplan._core")
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_is_typed_and_passes_mypy_strict() -> None:
    assert (PACKAGE_DIR / "py.typed").exists()
    assert (PACKAGE_DIR / "_core.pyi").exists()
    result = run("mypy", "--strict", "-p", "pdplan")
    assert result.returncode == 0, result.stdout + result.stderr
