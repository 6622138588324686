"""End to end: plan on the decode side, ship fragments only through the wire format, build
descriptors on each prefill rank, write with a transfer engine, and compare every decode cache
byte for byte with the expected reshard (guard bytes included).

The in-memory double runs every case in one process; the `mooncake` tests run one process a
rank, each with its own Mooncake engine over TCP on loopback, and the `nixl` tests the same with a
NIXL agent a rank (UCX backend, host memory), from descriptor arrays and from prepped lists. Every
prefill rank goes from frames to descriptors through `PreparedTransfer`. In CI (CI=true) a
missing engine fails the run instead of skipping."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from pdplan import (
    AttentionLayer,
    BufferKind,
    Mamba2Layer,
    MlpLayer,
    ModelShape,
    model_buffer_layouts,
)

from pd_transfer import (
    Buffer,
    Context,
    Outcome,
    Scenario,
    Tokens,
    kv_cache,
    run_in_memory,
    run_in_processes,
)

UNIT = 16 * 8 * 2  # 16 tokens x head dim 8 x bf16
NHD = 16  # token-major pages: a row per token
SHUFFLED = {"src_pages": (9, 2, 3, 4, 11, 0), "dst_pages": (5, 6, 7, 1, 10, 3)}


def conv_state(index: int) -> Buffer:
    """Mamba2's conv state: channels x | B | C = 8 | 4 | 4, each part sharded by TP on its own,
    3 inputs of bf16 a channel."""
    return Buffer(
        index, BufferKind.MAMBA_STATE, "state_channel", 16, 3 * 2, padding=4, parts=(8, 4, 4)
    )


def copied_conv_state(index: int, groups: int) -> Buffer:
    """Mamba2's conv state with B and C in ``groups`` groups: at a TP above ``groups`` each
    rank holds its share of x and a whole copy of its heads' group of B and C (vLLM's and
    SGLang's ``extra_groups_for_head_shards``)."""
    return Buffer(
        index, BufferKind.MAMBA_STATE, "state_channel", 16, 3 * 2, padding=4, parts=(8, 4, 4),
        groups=(8, groups, groups),
    )  # fmt: skip


CASES = [
    Scenario("tp8_to_tp2", 8, 2, kv_cache(2, 8, UNIT), **SHUFFLED),
    Scenario("tp2_to_tp8", 2, 8, kv_cache(2, 8, UNIT), **SHUFFLED),
    Scenario("gqa_tp4_2heads_to_tp1", 4, 1, kv_cache(2, 2, UNIT, prefill_replica=2)),
    Scenario(
        "gqa_tp4_to_tp2_replicated_both_sides",
        4,
        2,
        kv_cache(1, 1, UNIT, prefill_replica=4, decode_replica=2),
    ),
    Scenario(
        "mamba_state_tp4_to_tp2",
        4,
        2,
        (
            *kv_cache(1, 4, UNIT),
            Buffer(2, BufferKind.MAMBA_STATE, "state_channel", 16, 64, padding=32),
        ),
        **SHUFFLED,
    ),
    Scenario(
        "mla_replicated_tp4_to_tp2",
        4,
        2,
        (
            Buffer(0, BufferKind.TARGET_K, "replicated", 1, 576 * 2 * 4),
            Buffer(1, BufferKind.DRAFT_K, "replicated", 1, 576 * 2 * 4),
        ),
        **SHUFFLED,
    ),
    Scenario(
        "two_dp_groups_each_side", 2, 1, kv_cache(2, 4, UNIT), prefill_dp=2, decode_dp=2, **SHUFFLED
    ),
    Scenario(
        "identity_tp2_whole_items",
        2,
        2,
        kv_cache(2, 4, UNIT),
        src_pages=(0, 1, 2, 8, 9),
        dst_pages=(3, 4, 5, 6, 11),
    ),
    # Token-major (NHD) pages: a rank's heads are one run per token row.
    Scenario("nhd_tp8_to_tp2", 8, 2, kv_cache(2, 8, UNIT, rows=NHD), **SHUFFLED),
    Scenario("nhd_tp2_to_tp8", 2, 8, kv_cache(2, 8, UNIT, rows=NHD), **SHUFFLED),
    Scenario("nhd_gqa_tp4_2heads_to_tp1", 4, 1, kv_cache(2, 2, UNIT, rows=NHD, prefill_replica=2)),
    Scenario(
        "nhd_tp16_to_tp32_every_decode_rank",
        16,
        32,
        kv_cache(1, 8, UNIT, rows=NHD, prefill_replica=2, decode_replica=4),
        decode_replicas="all",
    ),
    Scenario(
        "fused_kv_pages_tp4_to_tp2",
        4,
        2,
        # FlashInfer's [2][page_size][heads][head_dim]: K rows, then V rows, in one buffer.
        tuple(
            Buffer(i, BufferKind.TARGET_K, "kv_head", 8, 2 * UNIT, padding=4, rows=2 * NHD)
            for i in range(2)
        ),
        **SHUFFLED,
    ),
    Scenario("mamba2_conv_parts_tp1_to_tp2", 1, 2, (conv_state(0), conv_state(1)), **SHUFFLED),
    Scenario("mamba2_conv_parts_tp2_to_tp4", 2, 4, (conv_state(0),)),
    Scenario("mamba2_conv_parts_tp4_to_tp1", 4, 1, (conv_state(0),), **SHUFFLED),
    # n_groups below TP: one group copied onto every rank, two onto each half of the ranks.
    Scenario("mamba2_one_group_tp1_to_tp2", 1, 2, (copied_conv_state(0, 1),), **SHUFFLED),
    Scenario("mamba2_one_group_tp2_to_tp1", 2, 1, (copied_conv_state(0, 1),), **SHUFFLED),
    Scenario("mamba2_one_group_tp2_to_tp4", 2, 4, (copied_conv_state(0, 1),)),
    Scenario("mamba2_one_group_tp4_to_tp2", 4, 2, (copied_conv_state(0, 1),), **SHUFFLED),
    Scenario("mamba2_two_groups_tp1_to_tp4", 1, 4, (copied_conv_state(0, 2),), **SHUFFLED),
    Scenario("mamba2_two_groups_tp8_to_tp2", 8, 2, (copied_conv_state(0, 2),)),
    Scenario("mamba2_two_groups_tp4_to_tp8", 4, 8, (copied_conv_state(0, 2),), **SHUFFLED),
    # Pipeline stages: each stage holds its layers' caches; a decode rank reads each layer from
    # the prefill stage holding it.
    Scenario(
        "pp2_tp2_to_pp1_tp4", 2, 4, kv_cache(4, 4, UNIT, staged=True), prefill_pp=(2, 2), **SHUFFLED
    ),
    Scenario(
        "pp1_tp4_to_pp2_tp2", 4, 2, kv_cache(4, 4, UNIT, staged=True), decode_pp=(2, 2), **SHUFFLED
    ),
    Scenario(
        "pp_uneven_5_layers_3_2_to_2_3",
        2,
        2,
        kv_cache(5, 4, UNIT, staged=True),
        prefill_pp=(3, 2),
        decode_pp=(2, 3),
    ),
    Scenario(
        "nhd_identity_tp2",
        2,
        2,
        kv_cache(2, 4, UNIT, rows=NHD),
        src_pages=(0, 1, 2, 8, 9),
        dst_pages=(3, 4, 5, 6, 11),
    ),
]


TOKEN = 8 * 2  # one head of one token: head dim 8, bf16


def token_kv(
    layers: int, heads: int, sizes: tuple[int, int], planes: int = 0, **replicas: int
) -> tuple[Buffer, ...]:
    """K and V of each layer in pages of `sizes` (prefill, decode) tokens."""
    return kv_cache(layers, heads, TOKEN, page_sizes=sizes, planes=planes, **replicas)


def token_case(
    name: str,
    prefill_tp: int,
    decode_tp: int,
    buffers: tuple[Buffer, ...],
    num_tokens: int = 150,
    moved: tuple[int, int] | None = None,
    window: bool = False,
    **kwargs: object,
) -> Scenario:
    """A request of `num_tokens` tokens in random, different page tables on the two sides;
    `moved` tokens only (default all); with `window`, the decode table holds only the pages
    of the moved tokens (-1 elsewhere), as a sliding-window layer's does."""
    sizes = next(b.page_sizes for b in buffers if b.page_sizes)
    assert sizes is not None
    rng = np.random.default_rng(sum(map(ord, name)))
    src_pages, dst_pages = (-(-num_tokens // size) for size in sizes)
    capacity = max(src_pages, dst_pages) + 3
    src_table = rng.permutation(capacity)[:src_pages]
    dst_table = rng.permutation(capacity)[:dst_pages]
    first, stop = moved or (0, num_tokens)
    if window:
        held = np.arange(dst_pages) >= first // sizes[1]
        dst_table = np.where(held, dst_table, -1)
    tokens = Tokens(num_tokens, tuple(src_table.tolist()), tuple(dst_table.tolist()), (first, stop))
    return Scenario(
        name, prefill_tp, decode_tp, buffers, capacity_pages=capacity, tokens=tokens, **kwargs
    )  # type: ignore[arg-type]


TOKEN_CASES = [
    token_case("tokens_head_major_16_to_64_tp8_to_tp2", 8, 2, token_kv(2, 8, (16, 64))),
    token_case("tokens_head_major_64_to_16_tp2_to_tp8", 2, 8, token_kv(2, 8, (64, 16))),
    token_case("tokens_head_major_12_to_20_tp8_to_tp2", 8, 2, token_kv(1, 8, (12, 20))),
    token_case("tokens_nhd_16_to_64_tp2_to_tp8", 2, 8, token_kv(1, 8, (16, 64), planes=1)),
    token_case("tokens_nhd_64_to_16_tp8_to_tp2", 8, 2, token_kv(2, 8, (64, 16), planes=1)),
    token_case("tokens_nhd_12_to_20_tp2_to_tp8", 2, 8, token_kv(1, 8, (12, 20), planes=1)),
    token_case(
        "tokens_gqa_head_major_16_to_64_tp4_2heads_to_tp1",
        4,
        1,
        token_kv(1, 2, (16, 64), prefill_replica=2),
    ),
    token_case(
        "tokens_gqa_nhd_20_to_12_tp4_to_tp8_every_decode_rank",
        4,
        8,
        token_kv(1, 2, (20, 12), planes=1, prefill_replica=2, decode_replica=4),
        decode_replicas="all",
    ),
    token_case(
        "tokens_prefix_hit_37_of_150_head_major_16_to_64",
        8,
        2,
        token_kv(1, 8, (16, 64)),
        moved=(37, 150),
    ),
    token_case(
        "tokens_prefix_hit_37_of_150_nhd_16_to_16",
        2,
        8,
        token_kv(1, 8, (16, 16), planes=1),
        moved=(37, 150),
    ),
    token_case(
        "tokens_window_last_50_of_200_nhd_16_to_64",
        8,
        2,
        token_kv(1, 8, (16, 64), planes=1),
        num_tokens=200,
        moved=(150, 200),
        window=True,
    ),
    token_case(
        "tokens_window_last_50_of_200_head_major_64_to_16",
        2,
        8,
        token_kv(1, 8, (64, 16)),
        num_tokens=200,
        moved=(150, 200),
        window=True,
    ),
    # Same TP and page size: an identity plan, whose whole-item fragments carry token runs.
    token_case(
        "tokens_identity_tp2_nhd_16_to_16_from_token_5",
        2,
        2,
        token_kv(1, 8, (16, 16), planes=1),
        moved=(5, 150),
    ),
    token_case(
        "tokens_head_major_16_into_nhd_64_tp2_to_tp1",
        2,
        1,
        tuple(
            Buffer(i, kind, "kv_head", 8, TOKEN, padding=8, page_sizes=(16, 64), decode_planes=1)
            for i, kind in enumerate((BufferKind.TARGET_K, BufferKind.TARGET_V))
        ),
    ),
    token_case(
        "tokens_fused_kv_pages_16_to_32_tp4_to_tp2", 4, 2, token_kv(1, 8, (16, 32), planes=2)
    ),
    token_case(
        "tokens_mla_replicated_16_to_64_tp4_to_tp2",
        4,
        2,
        tuple(
            Buffer(i, kind, "replicated", 1, 576 * 2, page_sizes=(16, 64), planes=planes)
            for i, (kind, planes) in enumerate(((BufferKind.TARGET_K, 0), (BufferKind.DRAFT_K, 1)))
        ),
    ),
    # gpt-oss's pattern: a sliding-window layer (window 40), then a full one. The runtime
    # passes every token's slots; the window layer receives only the last 40 tokens, and its
    # bytes of earlier tokens stay untouched (guard bytes) on the decode side.
    token_case(
        "tokens_sliding_window_40_then_full_of_150_16_to_64_tp8_to_tp2",
        8,
        2,
        tuple(
            Buffer(
                2 * layer + i,
                kind,
                "kv_head",
                8,
                TOKEN,
                padding=8,
                page_sizes=(16, 64),
                layer=layer,
                sliding_window=40 if layer == 0 else None,
            )
            for layer in range(2)
            for i, kind in enumerate((BufferKind.TARGET_K, BufferKind.TARGET_V))
        ),
    ),
    # Llama 4's pattern: a chunked local-attention layer (chunks of 64), then a NoPE full
    # one. Of 150 tokens the chunked layer receives its current chunk, tokens 128-149 only.
    token_case(
        "tokens_attention_chunk_64_then_full_of_150_16_to_64_tp8_to_tp2",
        8,
        2,
        tuple(
            Buffer(
                2 * layer + i,
                kind,
                "kv_head",
                8,
                TOKEN,
                page_sizes=(16, 64),
                layer=layer,
                attention_chunk=64 if layer == 0 else None,
            )
            for layer in range(2)
            for i, kind in enumerate((BufferKind.TARGET_K, BufferKind.TARGET_V))
        ),
    ),
    token_case(
        "tokens_hybrid_kv_16_to_64_with_mamba_state_tp4_to_tp2",
        4,
        2,
        (
            *token_kv(1, 4, (16, 64)),
            Buffer(2, BufferKind.MAMBA_STATE, "state_channel", 16, 64, padding=32),
        ),
        src_pages=(3, 1),
        dst_pages=(0, 2),
    ),
]


#: A hybrid model as its layers: Mamba2, MLP, attention, Mamba2, MLP (Nemotron-H's pattern in
#: small). Its buffers are the ones `model_buffer_layouts` makes.
HYBRID = ModelShape(
    layer_kinds=(
        Mamba2Layer(heads=4, head_dim=2, state_size=4, groups=4, conv_kernel=4),
        MlpLayer(),
        AttentionLayer(kv_heads=4, head_dim=8),
        Mamba2Layer(heads=4, head_dim=2, state_size=4, groups=4, conv_kernel=4),
        MlpLayer(),
    )
)


def model_buffers(shape: ModelShape, prefill_tp: int, decode_tp: int) -> tuple[Buffer, ...]:
    """The harness's buffers for a model, checked to lay out exactly as the model's."""
    prefill, decode = model_buffer_layouts(shape, prefill_tp, decode_tp)
    buffers = tuple(
        Buffer(
            b.buffer_index,
            b.buffer_kind,
            b.logical_axis,
            b.logical_size,
            b.bytes_per_logical_unit,
            parts=b.logical_parts,
            layer=b.layer,
            groups=b.logical_part_groups,
        )
        for b in prefill
    )
    for side, (tp, made) in enumerate(((prefill_tp, prefill), (decode_tp, decode))):
        ours = [
            replace(b.layout(tp, 1, side), page_size=m.page_size) for b, m in zip(buffers, made)
        ]
        assert ours == list(made)
    return buffers


#: Pipeline stages that split the hybrid in the middle of its pattern: prefill stages hold
#: layers 0-2 | 3-4, decode stages 0-1 | 2-4 (the stages count the MLP layers too).
MODEL_CASES = [
    Scenario(
        "hybrid_mamba_mlp_attention_pp_3_2_tp2_to_pp_2_3_tp4",
        2,
        4,
        model_buffers(HYBRID, 2, 4),
        prefill_pp=(3, 2),
        decode_pp=(2, 3),
        **SHUFFLED,
    ),
]


def mla(sizes: tuple[int, int] = (16, 16), layers: int = 1) -> tuple[Buffer, ...]:
    """DeepSeek's latent cache (576 bf16 a token), replicated over TP, one buffer a layer."""
    return tuple(
        Buffer(layer, BufferKind.TARGET_K, "replicated", 1, 576 * 2, page_sizes=sizes, layer=layer)
        for layer in range(layers)
    )


NO_CP = Context()


def cp_case(
    name: str,
    prefill_tp: int,
    decode_tp: int,
    buffers: tuple[Buffer, ...],
    prefill: Context = NO_CP,
    decode: Context = NO_CP,
    **kwargs: object,
) -> Scenario:
    """A token case whose sides spread the request's 150 tokens over ranks; every rank has a
    page table of its own for the tokens it holds."""
    return token_case(
        name,
        prefill_tp,
        decode_tp,
        buffers,
        prefill_context=prefill,
        decode_context=decode,
        **kwargs,
    )


CASES_BY_NAME = {c.name: c for c in CASES}


#: Context parallelism on either side (the context-parallelism issue's list). Through the
#: engines each side runs as one process whose ranks share one engine, to keep CI short (the
#: other cases cover a process a rank).
CP_CASES = [
    cp_case("cp_mla_tp8_to_tp8_dcp8_interleave_1", 8, 8, mla(), decode=Context(dcp=8)),
    cp_case(
        "cp_mla_tp8_to_tp8_dcp8_interleave_16",
        8,
        8,
        mla(),
        decode=Context(dcp=8, interleave=16),
    ),
    cp_case(
        "cp_mla_tp8_dcp8_to_tp4_dcp4_interleave_1",
        8,
        4,
        mla(),
        prefill=Context(dcp=8),
        decode=Context(dcp=4),
    ),
    # 2 KV heads over decode TP 4: replica groups of 2 split their tokens over DCP 2.
    cp_case(
        "cp_gqa_2heads_tp2_to_tp4_dcp2_nhd",
        2,
        4,
        token_kv(1, 2, (16, 16), planes=1, decode_replica=2),
        decode=Context(dcp=2),
    ),
    cp_case(
        "cp_prefill_tp2_cp2_block_round_robin_to_tp2",
        2,
        2,
        token_kv(2, 8, (16, 16)),
        prefill=Context(cp=2, interleave=16),
    ),
    cp_case(
        "cp_prefill_tp2_cp2_zigzag_to_tp2",
        2,
        2,
        token_kv(1, 8, (16, 16), planes=1),
        prefill=Context(cp=2, split="zigzag"),
        exact_sources=True,
    ),
    cp_case(
        "cp_prefill_cp4_contiguous_16_to_tp2_dcp2_interleave_1_64",
        1,
        2,
        mla((16, 64)),
        prefill=Context(cp=4, split="contiguous"),
        decode=Context(dcp=2),
        exact_sources=True,
    ),
    # Every prefill CP rank holds every token: each decode rank reads each token once, and
    # the two decode ranks read from different replicas (fanout 1, not 2).
    cp_case(
        "cp_replicated_prefill_cp2_tp1_to_tp2",
        1,
        2,
        token_kv(1, 8, (16, 64)),
        prefill=Context(cp=2, kv="replicated"),
    ),
    cp_case(
        "cp_dp2_prefill_cp2_tp1_to_dp2_tp2_dcp2_mla",
        1,
        2,
        mla(),
        prefill=Context(cp=2, interleave=16),
        decode=Context(dcp=2),
        prefill_dp=2,
        decode_dp=2,
    ),
    cp_case(
        "cp_pp2_prefill_cp2_zigzag_to_tp2_dcp2_mla_two_layers",
        1,
        2,
        mla(layers=2),
        prefill=Context(cp=2, split="zigzag"),
        decode=Context(dcp=2, interleave=4),
        prefill_pp=(1, 1),
        exact_sources=True,
    ),
    cp_case(
        "cp_decode_cp2_of_its_own_tp2_to_cp2_tp2_block_round_robin",
        2,
        2,
        token_kv(1, 8, (16, 16)),
        decode=Context(cp=2, interleave=16),
    ),
]


#: Cases of many ranks that cross the engines one process a side (48 processes a rank would
#: take most of a minute); every other case runs a process a rank.
CP_BY_NAME = {c.name: c for c in CP_CASES}

#: Staging (the staging-plans issue's list): token-major TP 8 -> 2 (a 32-byte run a token),
#: DCP 8 at interleave 1 (a token's latent), and head-major TP 2 -> 8 (whole head slices),
#: where the cost model says staging does not pay; each moved gather -> one descriptor ->
#: scatter.
STAGING_CASES = [
    replace(CASES_BY_NAME["nhd_tp8_to_tp2"], name="staging_nhd_tp8_to_tp2", staging=True),
    replace(
        CP_BY_NAME["cp_mla_tp8_to_tp8_dcp8_interleave_1"],
        name="staging_mla_dcp8_interleave_1",
        staging=True,
    ),
    replace(CASES_BY_NAME["tp2_to_tp8"], name="staging_head_major_tp2_to_tp8", staging=True),
]

#: Cases whose ranks share one engine a side through the engines (transfers still cross
#: processes): what they vary is tokens, contexts or staging, not processes; the page cases
#: keep a process a rank. One process a side saves about 6 s a case.
# One process a side (its ranks sharing one engine; the bytes still cross processes) keeps CI
# short; TP 8 -> 2 and 2 -> 8, the GQA and identity cases and one conv-parts case run one
# process a rank.
PER_SIDE = {c.name for c in TOKEN_CASES + CP_CASES + STAGING_CASES} | {
    "nhd_tp16_to_tp32_every_decode_rank",
    "nhd_tp2_to_tp8",
    "nhd_tp8_to_tp2",
    "pp2_tp2_to_pp1_tp4",
    "pp1_tp4_to_pp2_tp2",
    "pp_uneven_5_layers_3_2_to_2_3",
    "hybrid_mamba_mlp_attention_pp_3_2_tp2_to_pp_2_3_tp4",
    "mamba_state_tp4_to_tp2",
    "mla_replicated_tp4_to_tp2",
    "two_dp_groups_each_side",
    "fused_kv_pages_tp4_to_tp2",
    "mamba2_conv_parts_tp2_to_tp4",
    "mamba2_conv_parts_tp4_to_tp1",
}


def latent_pages(layers: int) -> tuple[Buffer, ...]:
    """DeepSeek's latent cache (576 bf16 a token) in head-major pages, replicated over TP."""
    return tuple(
        Buffer(layer, BufferKind.TARGET_K, "replicated", 1, 16 * 576 * 2) for layer in range(layers)
    )


#: A prefill rank that never comes up: the decode side plans `without_prefill_ranks` and
#: reads from the ranks holding the same bytes; what only gone ranks held stays guard bytes.
FAILOVER_CASES = [
    # Every prefill TP rank holds the latent: rank 1 serves decode rank 0 instead of rank 0.
    Scenario("failover_mla_tp4_to_tp2_rank_0_never_up", 4, 2, latent_pages(2), unavailable=(0,)),
    # 4 heads over prefill TP 8 (replica groups {0, 1}, {2, 3}, ...): with ranks 2, 3 and 4
    # gone, head 1 is lost and head 2 comes from rank 5.
    Scenario(
        "failover_gqa_tp8_4heads_to_tp2_ranks_2_3_4_never_up",
        8,
        2,
        kv_cache(2, 4, UNIT, prefill_replica=2),
        unavailable=(2, 3, 4),
    ),
]


def test_failover_cases_lose_what_they_should(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases are not vacuous: the MLA one loses nothing and reads around rank 0; the GQA
    one loses head 1 of every buffer of decode rank 0 and reads head 2 from rank 5; and a
    decode side planning as if every rank were up reads from a rank that never came up."""
    import pd_transfer

    mla, gqa = (case.planner() for case in FAILOVER_CASES)
    assert mla.plan_for_decode_rank(0).target_prefill_ranks == (1,)
    assert all(mla.lost(d) == [] for d in range(2))
    assert {(r.unit_start, r.unit_end) for r in gqa.lost(0)} == {(1, 2)}
    assert len(gqa.lost(0)) == 4 and gqa.lost(1) == []
    assert gqa.plan_for_decode_rank(1).target_prefill_ranks == (5, 6)
    assert FAILOVER_CASES[1].lost_units(0, 0) == {1}
    everyone = pd_transfer.Scenario.planner
    monkeypatch.setattr(
        pd_transfer.Scenario, "planner", lambda self: everyone(replace(self, unavailable=()))
    )
    for case in FAILOVER_CASES:
        with pytest.raises(RuntimeError, match="never came up"):
            run_in_memory(case)


def expected_writes(scenario: Scenario) -> dict[int, int]:
    """Decode ranks writing to each prefill rank: its fanout (for the request's length when
    the scenario plans for it)."""
    planner = scenario.planner()
    if not scenario.exact_sources:
        return planner.source_fanout
    assert scenario.tokens is not None
    counts = dict.fromkeys(range(scenario.prefill.world_size), 0)
    for rank in range(scenario.decode.world_size):
        plan = planner.plan_for_decode_rank(rank, num_tokens=scenario.tokens.num_tokens)
        for source, fanout in plan.required_dst_info_num_by_prefill_rank.items():
            counts[source] += 1
            assert fanout >= 1
    return counts


def check(scenario: Scenario, outcome: Outcome) -> None:
    assert outcome.mismatches == []
    assert outcome.descriptors > 0 and outcome.bytes > 0
    if scenario.decode_replicas == "all":
        assert scenario.planner().idle_decode_ranks == 0
        assert max(scenario.planner().source_fanout.values()) == 2  # 32 decode over 16 prefill
    # Each prefill rank is written to by exactly as many decode ranks as its fanout says.
    assert outcome.writes_per_prefill_rank == expected_writes(scenario)


@pytest.mark.parametrize(
    "scenario",
    CASES + TOKEN_CASES + MODEL_CASES + CP_CASES + STAGING_CASES + FAILOVER_CASES,
    ids=lambda s: s.name,
)
def test_in_memory(scenario: Scenario) -> None:
    check(scenario, run_in_memory(scenario))


def test_a_wrong_plan_is_caught_by_the_byte_comparison() -> None:
    """The comparison is not vacuous: corrupting one prefill cache shows up as a mismatch."""
    import pd_transfer

    original = pd_transfer.filled_prefill_cache

    def corrupted(*args: object, **kwargs: object) -> object:
        cache = original(*args, **kwargs)  # type: ignore[arg-type]
        cache[CASES[0].src_pages[0], 0] ^= 0xFF
        return cache

    pd_transfer.filled_prefill_cache = corrupted
    try:
        outcome = run_in_memory(CASES[0])
    finally:
        pd_transfer.filled_prefill_cache = original
    assert outcome.mismatches


def test_a_decode_side_that_plans_other_pages_is_caught_by_the_byte_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Staging is checked as strictly: a decode rank that scatters by a plan of other pages
    (its neighbour's request, say) leaves wrong bytes, and so does one that skips unpacking."""
    import pd_transfer

    case = STAGING_CASES[0]
    assert run_in_memory(case).mismatches == []
    other = replace(case, dst_pages=case.dst_pages[1:] + case.dst_pages[:1])
    original = pd_transfer.RankServer.stage_in

    def stage_in(self: pd_transfer.RankServer, *args: Any) -> Any:
        self.scenario = other if self.role == "decode" else self.scenario
        return original(self, *args)

    monkeypatch.setattr(pd_transfer.RankServer, "stage_in", stage_in)
    assert run_in_memory(case).mismatches
    monkeypatch.undo()
    monkeypatch.setattr(
        pd_transfer.StagingPlan, "unpack", lambda self, staging: None, raising=False
    )
    outcome = run_in_memory(case)
    assert outcome.mismatches


#: Token scenarios that vary what the others already cover through an engine (a second
#: prefix, a second window, identity, mixed layouts): in memory only, to keep CI short.
IN_MEMORY_ONLY = {
    "tokens_prefix_hit_37_of_150_nhd_16_to_16",
    "tokens_window_last_50_of_200_head_major_64_to_16",
    "tokens_identity_tp2_nhd_16_to_16_from_token_5",
    "tokens_head_major_16_into_nhd_64_tp2_to_tp1",
    # Through NIXL instead (these run through NIXL, so each still crosses a real engine).
    "tokens_sliding_window_40_then_full_of_150_16_to_64_tp8_to_tp2",
    "tokens_nhd_12_to_20_tp2_to_tp8",
    "tokens_mla_replicated_16_to_64_tp4_to_tp2",
}
MOONCAKE_TOKEN_CASES = [c for c in TOKEN_CASES if c.name not in IN_MEMORY_ONLY]


def test_every_token_case_crosses_an_engine() -> None:
    """Cases kept off Mooncake to keep CI short are variations or run through NIXL."""
    off_mooncake = {c.name for c in TOKEN_CASES} - {c.name for c in MOONCAKE_TOKEN_CASES}
    through_nixl = {c.name for c in NIXL_CASES}
    variations = 4  # the first four IN_MEMORY_ONLY entries vary what others cover
    assert len(off_mooncake - through_nixl) == variations


def test_a_wrong_slot_is_caught_by_the_byte_comparison() -> None:
    """Token scenarios too: one destination slot off by one shows up as a mismatch."""
    import pd_transfer

    original = pd_transfer.Scenario.slot_maps

    def off_by_one(self: Scenario, *ranks: int) -> tuple[np.ndarray, np.ndarray]:
        src, dst = original(self, *ranks)
        dst = dst.copy()
        dst[np.flatnonzero(dst >= 0)[5]] ^= 1
        return src, dst

    pd_transfer.Scenario.slot_maps = off_by_one  # type: ignore[method-assign]
    try:
        outcome = run_in_memory(TOKEN_CASES[0])
    finally:
        pd_transfer.Scenario.slot_maps = original  # type: ignore[method-assign]
    assert outcome.mismatches


def test_a_slot_map_of_the_wrong_cp_rank_is_caught_by_the_byte_comparison() -> None:
    """CP cases too: a decode rank passing another DCP rank's slot map shows up, and so does
    an expected cache that ignores which tokens each rank holds."""
    import pd_transfer

    case = next(c for c in CP_CASES if c.name == "cp_mla_tp8_to_tp8_dcp8_interleave_16")
    original_map, original_held = pd_transfer.Scenario.slot_map, pd_transfer.Scenario.held_tokens

    def neighbour(self: Scenario, role: str, rank: int) -> np.ndarray:
        if role == "decode":
            rank = (rank + 1) % self.decode.world_size
        return original_map(self, role, rank)

    def everything(self: Scenario, role: str, rank: int) -> np.ndarray:
        if role == "decode":
            assert self.tokens is not None
            return np.arange(self.tokens.num_tokens)
        return original_held(self, role, rank)

    for patch, name in ((neighbour, "slot_map"), (everything, "held_tokens")):
        setattr(pd_transfer.Scenario, name, patch)
        try:
            outcome = run_in_memory(case)
        except AssertionError:  # the expected side finds a token on a page the rank lacks
            continue
        finally:
            pd_transfer.Scenario.slot_map = original_map  # type: ignore[method-assign]
            pd_transfer.Scenario.held_tokens = original_held  # type: ignore[method-assign]
        assert outcome.mismatches, name


@pytest.mark.mooncake
@pytest.mark.parametrize(
    "scenario",
    CASES + MOONCAKE_TOKEN_CASES + CP_CASES + STAGING_CASES + FAILOVER_CASES,
    ids=lambda s: s.name,
)
def test_through_mooncake(scenario: Scenario, mooncake_engine: None) -> None:
    check(scenario, run_in_processes(scenario, per_side=scenario.name in PER_SIDE))


NIXL_CASES = [
    case
    for case in CASES + TOKEN_CASES + MODEL_CASES + CP_CASES + STAGING_CASES
    if case.name.startswith(("cp_", "staging_"))
    or case.name
    in {
        "tp8_to_tp2",
        "tp2_to_tp8",
        "gqa_tp4_2heads_to_tp1",
        "gqa_tp4_to_tp2_replicated_both_sides",
        "nhd_tp8_to_tp2",
        "tokens_head_major_16_to_64_tp8_to_tp2",
        "tokens_nhd_12_to_20_tp2_to_tp8",
        "tokens_window_last_50_of_200_nhd_16_to_64",
        "tokens_mla_replicated_16_to_64_tp4_to_tp2",
        "tokens_hybrid_kv_16_to_64_with_mamba_state_tp4_to_tp2",
        "tokens_sliding_window_40_then_full_of_150_16_to_64_tp8_to_tp2",
        "hybrid_mamba_mlp_attention_pp_3_2_tp2_to_pp_2_3_tp4",
    }
]


@pytest.mark.nixl
@pytest.mark.parametrize("scenario", NIXL_CASES, ids=lambda s: s.name)
def test_through_nixl(scenario: Scenario, nixl_engine: None) -> None:
    check(scenario, run_in_processes(scenario, engine="nixl", per_side=scenario.name in PER_SIDE))


@pytest.mark.nixl
@pytest.mark.parametrize("scenario", NIXL_CASES[:2] + NIXL_CASES[4:5], ids=lambda s: s.name)
def test_through_nixl_prepped_lists(scenario: Scenario, nixl_engine: None) -> None:
    check(scenario, run_in_processes(scenario, engine="nixl-prepped"))
