"""The KV cache groups the vLLM connector reads from the ``kv_cache_config`` vLLM 0.32 passes it,
built here as vLLM's classes name them (``v1/kv_cache_interface.py``; vLLM is not needed):
each spec class read as what its blocks keep, a window's tokens, a state group's scratch slots;
a spec pdplan does not know refused by name, a subclass of a known one too (never read as its
parent); the groups that do not take part in transfer left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pdplan import UnsupportedPDLayoutError
from pdplan.runtimes._vllm_groups import backoff, cache_groups, transfer_block_ids


def spec(name: str, **fields: Any) -> Any:
    """An object of a class named as vLLM's spec class ``name``, with ``fields``."""
    return type(name, (), {"block_size": 32, **fields})()


@dataclass
class Group:
    layer_names: list[str]
    kv_cache_spec: Any
    enable_kv_transfer: bool = True


@dataclass
class Config:
    kv_cache_groups: list[Group]
    transfer_group_ids: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.transfer_group_ids = tuple(
            i for i, g in enumerate(self.kv_cache_groups) if g.enable_kv_transfer
        )

    @property
    def transfer_groups(self) -> tuple[Group, ...]:
        return tuple(self.kv_cache_groups[i] for i in self.transfer_group_ids)

    def select_transfer_block_ids(self, block_ids: Any) -> tuple[list[int], ...]:
        return tuple(block_ids[i] for i in self.transfer_group_ids)


def test_each_spec_class_reads_as_what_its_blocks_keep() -> None:
    config = Config([
        Group(["model.layers.0.self_attn.attn"], spec("SlidingWindowSpec", sliding_window=48)),
        Group(["model.layers.1.self_attn.attn"], spec("FullAttentionSpec")),
        Group(["model.layers.2.mixer"], spec("MambaSpec", block_size=512,
                                             num_speculative_blocks=2)),
        Group(["model.layers.3.self_attn.attn"], spec("ChunkedLocalAttentionSpec",
                                                      attention_chunk_size=8192)),
        Group(["model.layers.4.self_attn.attn"], spec("MLAAttentionSpec", block_size=16)),
    ])  # fmt: skip
    groups = cache_groups(config)
    assert [g.kind for g in groups] == ["window", "attention", "state", "window", "attention"]
    assert [g.window for g in groups] == [48, None, None, 8192, None]
    assert [g.block_size for g in groups] == [32, 32, 512, 32, 16]
    assert groups[2].scratch_blocks == 2
    # The decode side recomputes the last prompt token: state, windows and chunks must still
    # hold what it reads, so the prefill side leaves it; full attention and MLA keep all.
    assert [backoff(groups[i : i + 1]) for i in range(5)] == [1, 0, 1, 1, 0]
    # The block size is no part of what both sides must share: it may differ (the session
    # states each side's apart, and groups of other sizes pair token by token).
    assert groups[0].identity() == ["SlidingWindowSpec", 48, 0]


def test_groups_outside_transfer_are_left_out_with_their_blocks() -> None:
    config = Config([
        Group(["model.layers.0.attn"], spec("FullAttentionSpec")),
        Group(["model.layers.0.replica"], spec("CrossAttentionSpec"), enable_kv_transfer=False),
        Group(["model.layers.1.mixer"], spec("MambaSpec")),
    ])  # fmt: skip
    assert [g.kind for g in cache_groups(config)] == ["attention", "state"]
    assert transfer_block_ids(config, [[1, 2], [3], [4]]) == ([1, 2], [4])


@pytest.mark.parametrize("name", ["CrossAttentionSpec", "HiddenStateCacheSpec",
                                  "SinkFullAttentionSpec", "CircularBufferSpec"])  # fmt: skip
def test_a_spec_pdplan_does_not_read_is_refused_naming_it(name: str) -> None:
    config = Config([Group(["model.layers.0.attn"], spec(name))])
    with pytest.raises(UnsupportedPDLayoutError, match=f"a KV cache group of {name}"):
        cache_groups(config)


def test_a_group_of_layers_with_their_own_specs_reads_as_their_one_kind() -> None:
    own = {
        "a.0": spec("SlidingWindowSpec", sliding_window=8),
        "a.1": spec("SlidingWindowSpec", sliding_window=8),
    }
    mixed = {"a.0": spec("SlidingWindowSpec", sliding_window=8), "a.1": spec("MambaSpec")}
    uniform = Config([Group(list(own), spec("UniformTypeKVCacheSpecs", kv_cache_specs=own))])
    assert [g.kind for g in cache_groups(uniform)] == ["window"]
    two = Config([Group(list(mixed), spec("UniformTypeKVCacheSpecs", kv_cache_specs=mixed))])
    with pytest.raises(UnsupportedPDLayoutError, match="mixes specs"):
        cache_groups(two)


def test_no_groups_is_refused() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="no KV cache groups"):
        cache_groups(Config([]))
