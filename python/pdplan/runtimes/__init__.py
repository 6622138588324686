"""Cache layouts read from the runtimes' own objects by name: ``pdplan.runtimes.vllm`` and
``pdplan.runtimes.sglang``. Duck-typed on their tensors and pools; neither runtime (nor torch)
is imported. Each returns a ``CacheBuffers`` numbered the same way, so any two sides pair."""

from __future__ import annotations

from pdplan._arrays import CacheBuffers, StateSpec, state_specs
from pdplan.runtimes._conventions import RuntimeConventions

__all__ = ["CacheBuffers", "RuntimeConventions", "StateSpec", "state_specs"]
