"""The connector's scheduler side on vLLM's hybrid block tables, with vLLM's own ``Request`` and
``KVCacheBlocks`` (vLLM 0.32's classes; no engine): the prefill side leaves a model with state
its prompt's last token and sends each group's kept blocks (a window's without its null blocks,
a state group's state slot); the decode side loads all but that token and pairs each group's
blocks to fill with the prefill side's tail to tail, the oracle being the token position each
block holds.

Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

# vLLM's own modules are imported here (its imports warn of torch's deprecations).
pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BLOCK = 32


def spec(name: str, **fields: Any) -> Any:
    return type(name, (), {"block_size": BLOCK, **fields})()


@dataclass
class Group:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class Config:
    kv_cache_groups: list[Group]

    @property
    def transfer_group_ids(self) -> tuple[int, ...]:
        return tuple(range(len(self.kv_cache_groups)))

    @property
    def transfer_groups(self) -> tuple[Group, ...]:
        return tuple(self.kv_cache_groups)

    def select_transfer_block_ids(self, block_ids: Any) -> tuple[Any, ...]:
        return tuple(block_ids)


HYBRID = Config([
    Group(["model.layers.0.self_attn.attn"], spec("SlidingWindowSpec", sliding_window=48)),
    Group(["model.layers.1.mixer"], spec("MambaSpec", block_size=512, num_speculative_blocks=1)),
    Group(["model.layers.2.self_attn.attn"], spec("FullAttentionSpec")),
])  # fmt: skip


def side(config: Config = HYBRID) -> Any:
    from pdplan.connectors.vllm._ranks import Ranks
    from pdplan.connectors.vllm._scheduler import SchedulerSide
    from pdplan.session._settings import Settings

    settings = Settings.of(None)
    return SchedulerSide("engine", settings, Ranks(1, 1, 0, ()), settings.side_channel_port,
                         config)  # fmt: skip


def request(tokens: int, params: dict[str, Any], request_id: str = "r") -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sampling = SamplingParams(max_tokens=8, extra_args={"kv_transfer_params": params})
    return Request(request_id, list(range(1, tokens + 1)), sampling, None)


def test_the_prefill_side_leaves_a_model_with_state_its_last_prompt_token_once() -> None:
    scheduler = side()
    prefill = request(97, {"do_remote_decode": True})
    scheduler.new_request(prefill)
    assert prefill.num_prompt_tokens == 96 and prefill.num_tokens == 96
    assert list(prefill.prompt_token_ids) == list(range(1, 97)) and prefill.max_tokens == 1
    scheduler.new_request(prefill)  # scheduled again (preempted): truncated once
    assert prefill.num_prompt_tokens == 96
    plain = request(97, {})
    scheduler.new_request(plain)
    assert plain.num_prompt_tokens == 97
    attention_only = side(Config(HYBRID.kv_cache_groups[2:]))
    other = request(97, {"do_remote_decode": True})
    attention_only.new_request(other)
    assert other.num_prompt_tokens == 97


def test_the_decode_side_loads_all_but_the_token_it_computes() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_block_ids": [[1], [2], [3]]}  # fmt: skip
    assert side().matched_tokens(request(97, dict(params)), 0) == (96, True)
    attention_only = side(Config(HYBRID.kv_cache_groups[2:]))
    assert attention_only.matched_tokens(request(97, dict(params)), 0) == (97, True)


def test_each_group_pairs_the_blocks_of_the_same_tokens() -> None:
    """A 150-token prompt (the prefill side computed 149): the window keeps blocks 3 and 4
    (tokens 96-159, the window of the next token being tokens 102 on), the state group its
    state slot before one scratch slot, full attention all five."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import RequestStatus

    scheduler = side()
    prefill_ids = ([0, 0, 0, 40, 41], [50, 51], [60, 61, 62, 63, 64])
    prefill = request(149, {"do_remote_decode": True}, "p")
    prefill.status = RequestStatus.FINISHED_LENGTH_CAPPED
    held, params = scheduler.finished(prefill, [list(g) for g in prefill_ids])
    assert held and params is not None
    # Sent: the window's kept blocks, the state slot (the scratch slot dropped), all of KV.
    assert params["remote_block_ids"] == [[40, 41], [50], [60, 61, 62, 63, 64]]

    def blocks(ids: list[list[int]]) -> Any:
        made = tuple([KVCacheBlock(b) for b in group] for group in ids)
        for group in made:
            for block in group:
                block.is_null = block.block_id == 0
        return KVCacheBlocks(made)

    decode = request(150, {**params, "do_remote_prefill": True})
    scheduler.after_alloc(decode, blocks([[0, 0, 0, 7, 8], [9, 10], [11, 12, 13, 14, 15]]), 149)
    receive = scheduler.step().receives[0]
    assert receive.local_blocks == ((7, 8), (9,), (11, 12, 13, 14, 15))
    assert receive.remote_blocks == ((40, 41), (50,), (60, 61, 62, 63, 64))
