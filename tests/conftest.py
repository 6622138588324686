"""Shared fixtures."""

from __future__ import annotations

import os

import pytest


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
