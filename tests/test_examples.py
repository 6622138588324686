"""The example script runs as the docs describe it (docs/guides/engines.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "pd_transfer.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_example_in_memory() -> None:
    done = run("--loopback")
    assert done.returncode == 0, done.stderr
    assert "moved 8,388,608 bytes in 2,048 descriptors" in done.stdout
    assert "every decode cache equals the expected reshard" in done.stdout


@pytest.mark.mooncake
def test_example_through_mooncake(mooncake_engine: None) -> None:
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Mooncake, TCP on 127.0.0.1" in done.stdout
    assert "every decode cache equals the expected reshard" in done.stdout


@pytest.mark.nixl
def test_example_through_nixl(nixl_engine: None) -> None:
    done = run("--engine", "nixl")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NIXL, UCX backend" in done.stdout
    assert "every decode cache equals the expected reshard" in done.stdout
