"""The real-engine tests' shared pieces: one tiny model and one reference run a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import (
    LENGTHS,
    MAX_TOKENS,
    Instance,
    llm_args,
    prompts_of,
    streamed_prompts,
    write_model,
)


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def reference(model: Path, logs: Path) -> dict[tuple[int, ...], list[int]]:
    """Greedy tokens of one instance without a connector, by prompt."""
    one = Instance(llm_args(model), logs / "reference.log")
    try:
        prompts = prompts_of(LENGTHS) + prompts_of(tuple(range(8, 120, 11)), salt=5)
        prompts += streamed_prompts()
        greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
        outputs = one.generate(prompts, [greedy] * len(prompts))
    finally:
        one.close()
    return {tuple(p): o["tokens"] for p, o in zip(prompts, outputs)}
