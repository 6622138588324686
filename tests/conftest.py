"""Shared fixtures."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI's verdict on a commit is the same on every run, as scripts/fuzz.sh fixes libFuzzer's
# seed: examples derive from each test, not from a random seed. Elsewhere hypothesis explores
# at random (and keeps what it finds in .hypothesis/).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def mooncake_engine() -> None:
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the machine
        message = f"Mooncake transfer engine unavailable: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(
                message + " (CI must install it: pip install '.[test,engines]', libibverbs1)"
            )
        pytest.skip(message)


@pytest.fixture(scope="session")
def nixl_engine() -> None:
    try:
        from nixl_cu12._api import nixl_agent  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the machine
        message = f"NIXL unavailable: {exc}"
        if os.environ.get("CI") == "true":
            hint = " (CI must install it: pip install --no-deps nixl-cu12)"
            pytest.fail(message + hint)
        pytest.skip(message)
