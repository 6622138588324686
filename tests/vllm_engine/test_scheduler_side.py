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


def test_a_client_s_bad_params_never_fail_a_request_s_arrival() -> None:
    """``on_new_request`` runs inside vLLM's ``add_request``: a bad value is refused where
    the request is matched, never raised there."""
    scheduler = side()
    for bad in ({"stream_id": 5}, {"stream_id": "a\nb"}, {"remote_port": "x"}):
        scheduler.new_request(request(40, {"do_remote_prefill": True, **bad}))
    assert scheduler.step().held == {}


def test_the_decode_side_loads_all_but_the_token_it_computes() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_block_ids": [[1], [2], [3]]}  # fmt: skip
    assert side().matched_tokens(request(97, dict(params)), 0) == (96, True)
    attention_only = side(Config(HYBRID.kv_cache_groups[2:]))
    assert attention_only.matched_tokens(request(97, dict(params)), 0) == (97, True)


def test_a_proxy_s_first_token_is_computed_here_never_loaded() -> None:
    """A proxy hands the decode side the prompt and the prefill side's first token: the load
    ends where the prefill side's tokens do (``remote_num_tokens``), past a prefix hit too;
    a hit covering them all only notifies."""
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600, "remote_block_ids": [[3]],
              "remote_num_tokens": 128}  # fmt: skip
    attention_only = side(Config(HYBRID.kv_cache_groups[2:]))
    assert attention_only.matched_tokens(request(129, dict(params)), 0) == (128, True)
    assert attention_only.matched_tokens(request(129, dict(params)), 96) == (32, True)
    assert attention_only.matched_tokens(request(129, dict(params)), 128) == (0, False)
    # A hybrid's prefill side computed all but the last of its 128 tokens.
    params.update(remote_num_tokens=127, remote_block_ids=[[1], [2], [3]])
    assert side().matched_tokens(request(129, dict(params)), 0) == (127, True)


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


def test_a_mamba_hybrid_with_prefix_caching_pairs_as_vllm_s_align_mode_lays_it_out(
    model: Any,
) -> None:
    """vLLM's ``mamba_cache_mode`` ``align`` (prefix caching on a model with state), which
    vLLM 0.32's CPU build cannot run: its real ``Scheduler`` on both sides, the model runner's
    output written by hand. The prefill side computes 149 of 150 tokens in two steps (cut at a
    block boundary); its state group's list holds a slot a block of tokens, the state after the
    last token in the last. The decode side, after a 64-token prefix hit of a local request,
    fills the state slot vLLM reads when it goes on from token 149, and the attention blocks
    past its hit, each paired with the prefill side's of the same tokens; then it computes one
    token. The oracle: each side's own block tables, by position."""
    import inspect

    import torch
    from vllm import SamplingParams
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        MambaSpec,
    )
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    blocks, layers = 64, ["model.layers.0.self_attn.attn", "model.layers.1.mixer"]
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)

    def scheduler(role: str) -> Any:
        transfer = KVTransferConfig(kv_connector="PdplanConnector",
                                    kv_connector_module_path="pdplan.connectors.vllm",
                                    kv_role=role, kv_buffer_device="cpu")  # fmt: skip
        config = VllmConfig(
            model_config=ModelConfig(model=str(model), skip_tokenizer_init=True,
                                     dtype="float32", max_model_len=512),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True,
                                     mamba_cache_mode="align"),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8,
                                             max_model_len=512, is_encoder_decoder=False),
            kv_transfer_config=transfer, device_config=DeviceConfig("cpu"),
        )  # fmt: skip
        assert config.cache_config.mamba_cache_mode == "align"
        config.cache_config.num_gpu_blocks = blocks
        attention = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64,
                                      dtype=torch.float32)  # fmt: skip
        state = MambaSpec(
            block_size=BLOCK,
            shapes=((3, 64), (2, 8, 32)),
            dtypes=(torch.float32, torch.float32),
            page_size_padded=attention.page_size_bytes,
            mamba_cache_mode="align",
        )
        size = attention.page_size_bytes * blocks
        cache = KVCacheConfig(
            num_blocks=blocks,
            kv_cache_tensors=[KVCacheTensor(size=size, layers=[n], layer_stride=size,
                                            block_stride=attention.page_size_bytes)
                              for n in layers],
            kv_cache_groups=[KVCacheGroupSpec(layers[:1], attention),
                             KVCacheGroupSpec(layers[1:], state)],
        )  # fmt: skip
        args: dict[str, Any] = dict(
            vllm_config=config,
            kv_cache_config=cache,
            block_size=BLOCK,
            structured_output_manager=StructuredOutputManager(config),
        )
        if "hash_block_size" in inspect.signature(Scheduler.__init__).parameters:
            args["hash_block_size"] = BLOCK
        return Scheduler(**args)

    def step(side: Any, kv: Any = None) -> Any:
        """A step, its output as a model runner gives it (a token once a prompt is done)."""
        scheduled = side.schedule()
        ids = list(scheduled.num_scheduled_tokens)
        sampled = [[7] if side.requests[r].num_computed_tokens >= side.requests[r].num_prompt_tokens
                   else [] for r in ids]  # fmt: skip
        fields = dict(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                      sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                      pooler_output=[None] * len(ids), kv_connector_output=kv)  # fmt: skip
        known = inspect.signature(ModelRunnerOutput).parameters
        outputs = side.update_from_output(
            scheduled, ModelRunnerOutput(**{k: v for k, v in fields.items() if k in known})
        )
        return scheduled, [o for batch in outputs.values() for o in batch.outputs if o.finished]

    def new(name: str, prompt: list[int], params: dict[str, Any], max_tokens: int) -> Any:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                  extra_args={"kv_transfer_params": params})  # fmt: skip
        return Request(name, prompt, sampling, None, block_hasher=hasher)

    prompt = [(7 * i) % 500 + 1 for i in range(150)]
    prefill = scheduler("kv_producer")
    prefill.add_request(new("p", list(prompt), {"do_remote_decode": True}, 1))
    finished: list[Any] = []
    while not finished:
        scheduled, finished = step(prefill)
        assert max(scheduled.num_scheduled_tokens.values()) <= 128  # cut at block boundaries
    params = finished[0].kv_transfer_params
    held = prefill.kv_cache_manager.get_block_ids("p")
    assert params["remote_num_tokens"] == 149
    last = -(-149 // BLOCK) - 1  # the slot of the state after token 149
    assert params["remote_block_ids"] == [list(held[0]), [held[1][last]]]

    decode = scheduler("kv_consumer")
    decode.add_request(new("local", prompt[:64] + [9] * 30, {}, 1))
    while decode.has_unfinished_requests():
        step(decode)
    reading = new("d", list(prompt), {**params, "do_remote_prefill": True}, 4)
    decode.add_request(reading)
    scheduled, _ = step(decode)
    (receive,) = scheduled.kv_connector_metadata.receives
    mine = decode.kv_cache_manager.get_block_ids("d")
    hit = 64 // BLOCK
    assert reading.num_computed_tokens == 149  # its hit, then what it loads
    assert receive.local_blocks == (tuple(mine[0][hit:]), (mine[1][last],))
    assert receive.remote_blocks == (tuple(held[0]), (held[1][last],))
    # The decode side pairs its blocks with the prefill side's from the tail: the same tokens.
    from pdplan.session._block_pairs import paired_blocks

    assert paired_blocks(receive.local_blocks[0], receive.remote_blocks[0], 0)[1] == tuple(
        held[0][hit:]
    )
    scheduled, _ = step(decode, KVConnectorOutput(finished_recving={"d"}))
    scheduled, _ = step(decode)
    assert dict(scheduled.num_scheduled_tokens) == {"d": 1}


def test_a_cache_of_full_attention_only_reads_past_its_prefix_hit() -> None:
    """Every group full attention (the short way, ``_plain``): the blocks to fill are those
    vLLM found no cached copy of, each group's first at the hit's end; the prefill side sends
    every block. The same as the general way gives, and a null block is refused on either."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import RequestStatus

    two = Config([Group(["a"], spec("FullAttentionSpec")), Group(["b"], spec("FullAttentionSpec"))])
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600, "remote_num_tokens": 160,
              "remote_block_ids": [[40, 41, 42, 43, 44], [50, 51, 52, 53, 54]]}  # fmt: skip
    found = []
    for plain in (True, False):
        scheduler = side(two)
        assert scheduler._plain
        scheduler._plain = plain
        for hit in (0, 2, 4):
            made = tuple(
                [KVCacheBlock(b) for b in ids] for ids in ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
            )
            for group in made:
                for block in group[:hit]:  # a cached block has a hash
                    block._block_hash = b"cached" + bytes([block.block_id])  # type: ignore[assignment]
            decode = request(161, dict(params), f"d{hit}")
            scheduler.after_alloc(decode, KVCacheBlocks(made), 160 - hit * BLOCK)
            [receive] = scheduler.step().receives
            assert receive.local_blocks == ((1, 2, 3, 4, 5)[hit:], (6, 7, 8, 9, 10)[hit:])
            assert receive.local_tokens == ((hit * BLOCK, hit * BLOCK),) * 2
            found.append(receive)
        prefill = request(160, {"do_remote_decode": True}, "p")
        prefill.status = RequestStatus.FINISHED_LENGTH_CAPPED
        _, sent = scheduler.finished(prefill, ([3, 4, 5, 6, 7], [8, 9, 10, 11, 12]))
        assert sent is not None and sent["remote_block_ids"] == [
            [3, 4, 5, 6, 7],
            [8, 9, 10, 11, 12],
        ]
        nulled = request(160, {"do_remote_decode": True}, "q")
        nulled.status = RequestStatus.FINISHED_LENGTH_CAPPED
        assert scheduler.finished(nulled, ([3, 0, 5, 6, 7], [8, 9, 10, 11, 12])) == (False, None)
    assert found[:3] == found[3:]


def test_a_request_aborted_before_its_blocks_tells_only_a_prefill_request_to_free() -> None:
    """Aborted while it waits: a request naming the prefill side's request tells it to free;
    a streamed one names only its stream (no prefill request to free), so nothing is sent."""
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_host": "127.0.0.1",
              "remote_port": 5600}  # fmt: skip
    scheduler = side(Config(HYBRID.kv_cache_groups[2:]))
    pulled = request(40, {**params, "remote_request_id": "p", "remote_block_ids": [[3, 4]]}, "a")
    streamed = request(40, {**params, "stream_id": "s-7"}, "b")
    for made in (pulled, streamed):
        scheduler.new_request(made)
        assert scheduler.finished(made, ([],)) == (False, None)
    receives = scheduler.step().receives
    assert [(r.request_id, r.local_blocks, r.remote.request_id) for r in receives] == [
        ("a", (), "p")
    ]


def test_a_bad_remote_num_tokens_is_computed_here_not_failed() -> None:
    """Read when the request arrives: a bad ``remote_num_tokens`` refuses the pull where the
    request is matched (vLLM computes it), never as a failed load."""
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_block_ids": [[3, 4]]}  # fmt: skip
    scheduler = side(Config(HYBRID.kv_cache_groups[2:]))
    for bad in (-1, "40", None, True):
        made = request(40, {**params, "remote_num_tokens": bad}, f"r{bad}")
        scheduler.new_request(made)
        assert scheduler.matched_tokens(made, 0) == (0, False)
        assert made.kv_transfer_params["do_remote_prefill"] is False
    assert scheduler.step().held == {}


def test_blocks_of_another_number_of_groups_are_refused_to_recompute() -> None:
    """The prefill side sent one group's blocks where this cache has two (a dense pair read by
    the short way) or three (a hybrid, the general way): the request's blocks are handed back
    to recompute, the reason named."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "p",
              "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_block_ids": [[40, 41]]}  # fmt: skip
    dense = Config(
        [Group(["a"], spec("FullAttentionSpec")), Group(["b"], spec("FullAttentionSpec"))]
    )
    for config, ids in ((dense, ([1, 2], [3, 4])), (HYBRID, ([0, 1], [2, 3], [4, 5]))):
        scheduler = side(config)
        made = tuple([KVCacheBlock(b) for b in group] for group in ids)
        for group in made:
            for block in group:
                block.is_null = block.block_id == 0
        decode = request(50, dict(params), "d")
        scheduler.new_request(decode)
        scheduler.after_alloc(decode, KVCacheBlocks(made), 49)
        [receive] = scheduler.step().receives
        assert receive.remote is None and receive.local_blocks
        assert receive.refused == (
            f"the prefill side sent blocks of 1 KV cache groups for {len(ids)} here"
        )
