"""The public API matches the reference's shape and refuses bad input clearly."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    RankTransferPlan,
    TransferFragment,
    UnsupportedPDLayoutError,
)


def kv(index: int, tp: int, heads: int = 8, replica: int = 1, **changes: Any) -> BufferLayout:
    shards = tp // replica
    fields: dict[str, Any] = dict(
        buffer_index=index,
        buffer_kind=BufferKind.TARGET_K,
        logical_axis="kv_head",
        logical_size=heads,
        page_size=16,
        bytes_per_logical_unit=4096,
        item_stride_bytes=heads // shards * 4096,
        tp_replica_group_size=replica,
    )
    fields.update(changes)
    return BufferLayout(**fields)


def planner(prefill_tp: int = 8, decode_tp: int = 2, **kwargs: Any) -> PDTransferPlanner:
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_tp, **kwargs),
        decode_layout=ParallelLayout("decode", decode_tp),
        prefill_buffers=(kv(0, prefill_tp),),
        decode_buffers=(kv(0, decode_tp),),
    )


def test_public_names() -> None:
    assert set(pdplan.__all__) == {
        "CacheBuffers",
        "limits",
        "RankCoordinates",
        "TokenShare",
        "StagingCounts",
        "even_layer_partition",
        "LAYOUT_VERSION_FRAME",
        "PeerLayout",
        "decode_layout",
        "encode_layout",
        "StateSpec",
        "buffer_from_array",
        "state_specs",
        "AttentionLayer",
        "AttentionMamba2Layer",
        "DeepseekV4Layer",
        "GatedDeltaNetLayer",
        "KdaLayer",
        "LightningAttentionLayer",
        "ShortConvLayer",
        "SharedKvLayer",
        "LayerKindSummary",
        "LayerGroups",
        "layer_groups",
        "LostRange",
        "Mamba1Layer",
        "Mamba2Layer",
        "MlaLayer",
        "MlpLayer",
        "ModelLayer",
        "BufferKind",
        "ParallelLayout",
        "BufferLayout",
        "CostEstimate",
        "CostModel",
        "FormEstimate",
        "PostingCalibration",
        "calibrate_posting",
        "StagingPlan",
        "TransferFragment",
        "RankTransferPlan",
        "PDTransferPlanner",
        "Pairing",
        "PairCost",
        "TransferCost",
        "transfer_cost",
        "model_planner",
        "RoutingTable",
        "MODEL_PRESETS",
        "CACHE_KEYS",
        "ItemLengths",
        "ModelFamily",
        "model_families",
        "page_parts",
        "ModelShape",
        "buffer_layouts_from_item_lengths",
        "model_buffer_layouts",
        "StridedDescriptors",
        "TransferDescriptors",
        "transfer_descriptors",
        "token_owners",
        "token_slots",
        "vllm_layer_partition",
        "PreparedRequest",
        "PreparedTransfer",
        "UnsupportedPDLayoutError",
        "encode_transfer_fragments",
        "decode_transfer_fragments",
        "TRANSFER_PLAN_PROTOCOL_VERSION",
        "TRANSFER_PLAN_READABLE_VERSIONS",
        "DEFAULT_MAX_PAYLOAD_BYTES",
        "DEFAULT_MAX_FRAGMENTS",
        "__version__",
    }
    for name in pdplan.__all__:
        assert hasattr(pdplan, name)
    assert pdplan.TRANSFER_PLAN_PROTOCOL_VERSION == 1
    assert isinstance(pdplan.__version__, str) and pdplan.__version__
    assert issubclass(UnsupportedPDLayoutError, ValueError)


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (
            ParallelLayout,
            [
                ("role", None),
                ("world_size", None),
                ("dp_size", 1),
                ("pp_size", 1),
                ("pp_layer_partition", None),
                ("cp_size", 1),
                ("dcp_size", 1),
                ("cp_kv", "sharded"),
                ("cp_split", "interleave"),
                ("cp_interleave", 1),
            ],
        ),
        (
            BufferLayout,
            [
                ("buffer_index", None),
                ("buffer_kind", None),
                ("logical_axis", None),
                ("logical_size", None),
                ("page_size", None),
                ("bytes_per_logical_unit", None),
                ("item_stride_bytes", None),
                ("tp_replica_group_size", 1),
                ("rows_per_page", 1),
                ("logical_parts", None),
                ("layer", None),
                ("sliding_window", None),
                ("attention_chunk_size", None),
                ("page_bytes", None),
                ("logical_part_groups", None),
                ("token_pieces", None),
            ],
        ),
        (
            TransferFragment,
            [
                ("buffer_index", None),
                ("buffer_kind", None),
                ("src_rank", None),
                ("dst_rank", None),
                ("src_page_stride_bytes", None),
                ("dst_page_stride_bytes", None),
                ("src_byte_offset", None),
                ("dst_byte_offset", None),
                ("bytes_per_page", None),
                ("page_count", None),
                ("rows_per_page", 1),
                ("src_row_stride_bytes", 0),
                ("dst_row_stride_bytes", 0),
                ("src_page_size", 0),
                ("dst_page_size", 0),
                ("token_runs", 0),
                ("token_run_bytes", 0),
                ("src_token_stride_bytes", 0),
                ("dst_token_stride_bytes", 0),
                ("src_token_run_stride_bytes", 0),
                ("dst_token_run_stride_bytes", 0),
                ("sliding_window", None),
                ("attention_chunk_size", None),
                ("pages_unpaired", 0),
            ],
        ),
        (
            RankTransferPlan,
            [
                ("plan_kind", None),
                ("target_dp_group", None),
                ("target_prefill_ranks", None),
                ("required_prefill_response_num", None),
                ("fragments_by_prefill_rank", None),
                ("required_dst_info_num_by_prefill_rank", None),
                ("notify_prefill_ranks", ()),
            ],
        ),
    ],
)
def test_dataclass_fields_order_and_defaults(cls: type, fields: list[tuple[str, Any]]) -> None:
    got = [
        (f.name, None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    ]
    assert got == fields
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_buffer_kind_values() -> None:
    assert [k.value for k in BufferKind] == [
        "target_k",
        "target_v",
        "draft_k",
        "draft_v",
        "mamba_state",
    ]
    assert BufferKind.TARGET_K == "target_k"


def test_positional_and_keyword_construction_are_equal_and_hashable() -> None:
    positional = ParallelLayout("prefill", 8, 2)
    keyword = ParallelLayout(role="prefill", world_size=8, dp_size=2)
    assert positional == keyword and hash(positional) == hash(keyword)
    assert positional.tp_size_per_dp == 4
    assert ParallelLayout("decode", 4).dp_size == 1
    buffer = kv(0, 2)
    assert buffer == BufferLayout(0, BufferKind.TARGET_K, "kv_head", 8, 16, 4096, 4 * 4096)
    assert len({buffer, kv(0, 2), kv(1, 2)}) == 2
    fragment = TransferFragment(0, BufferKind.TARGET_V, 1, 0, 64, 128, 0, 64, 64)
    assert fragment.page_count is None
    assert hash(fragment) == hash(TransferFragment(0, "target_v", 1, 0, 64, 128, 0, 64, 64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        buffer.logical_size = 4  # type: ignore[misc]


def test_string_buffer_kind_becomes_the_enum_member() -> None:
    buffer = kv(0, 2, buffer_kind="target_v")
    assert buffer.buffer_kind is BufferKind.TARGET_V
    with pytest.raises(UnsupportedPDLayoutError, match="buffer_kind"):
        kv(0, 2, buffer_kind="target_q")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("prefill", 0), "world_size=0 must be between 1 and"),
        (("prefill", 8, 0), "dp_size must be positive"),
        (("prefill", 8, 3), "divisible"),
        (("prefill", -8), "world_size"),
        (("router", 8), "role"),
        (("prefill", True), "world_size"),
        (("prefill", 8.0), "world_size"),
        (("prefill", "8"), "world_size"),
        (("prefill", 2**31), "MAX_WORLD_SIZE.*one slice"),
        (("prefill", 2**70), "world_size"),
    ],
)
def test_parallel_layout_refusals(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        ParallelLayout(*args)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"logical_size": 0}, "logical_size must be positive"),
        ({"page_size": 0}, "page_size must be positive"),
        ({"bytes_per_logical_unit": 0}, "bytes_per_logical_unit must be positive"),
        ({"item_stride_bytes": 0}, "item_stride_bytes must be positive"),
        ({"tp_replica_group_size": 0}, "tp_replica_group_size must be positive"),
        ({"logical_axis": "kv_heads"}, "logical_axis"),
        ({"buffer_index": -1}, "buffer_index"),
        ({"buffer_index": False}, "buffer_index"),
        ({"logical_size": 2.0}, "logical_size"),
        ({"item_stride_bytes": 2**63}, "item_stride_bytes"),
        ({"logical_size": 2**40, "bytes_per_logical_unit": 2**40}, "2\\^63"),
    ],
)
def test_buffer_layout_refusals(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        kv(0, 2, **changes)


def test_fragment_refusals() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="src_rank"):
        TransferFragment(0, BufferKind.TARGET_K, -1, 0, 64, 64, 0, 0, 64)
    with pytest.raises(UnsupportedPDLayoutError, match="page_count"):
        TransferFragment(0, BufferKind.TARGET_K, 0, 0, 64, 64, 0, 0, 64, page_count=1.5)


def test_planner_mismatch_refusals() -> None:
    def build(prefill: tuple[BufferLayout, ...], decode: tuple[BufferLayout, ...]) -> None:
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 8),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=prefill,
            decode_buffers=decode,
        )

    with pytest.raises(UnsupportedPDLayoutError, match="buffer counts differ"):
        build((kv(0, 8), kv(1, 8)), (kv(0, 2),))
    with pytest.raises(UnsupportedPDLayoutError, match="buffer indexes differ"):
        build((kv(0, 8),), (kv(1, 2),))
    with pytest.raises(UnsupportedPDLayoutError, match="buffer kinds differ"):
        build((kv(0, 8),), (kv(0, 2, buffer_kind=BufferKind.TARGET_V),))
    with pytest.raises(UnsupportedPDLayoutError, match="logical axes differ"):
        build((kv(0, 8),), (kv(0, 2, logical_axis="state_channel"),))
    with pytest.raises(UnsupportedPDLayoutError, match="logical sizes differ"):
        build((kv(0, 8),), (kv(0, 2, heads=16),))
    with pytest.raises(UnsupportedPDLayoutError, match="logical unit sizes differ"):
        build((kv(0, 8),), (kv(0, 2, bytes_per_logical_unit=2048),))
    with pytest.raises(UnsupportedPDLayoutError, match="smaller than its logical shard"):
        build((kv(0, 8),), (kv(0, 2, item_stride_bytes=4096),))
    with pytest.raises(UnsupportedPDLayoutError, match="non-aligned"):
        build((kv(0, 8, heads=4, item_stride_bytes=4096),), (kv(0, 2, heads=4),))
    with pytest.raises(UnsupportedPDLayoutError, match="replica group must divide"):
        build((kv(0, 8, heads=2, replica=3, item_stride_bytes=4096),), (kv(0, 2, heads=2),))
    with pytest.raises(UnsupportedPDLayoutError, match="buffer"):
        build((kv(0, 8), "not a buffer"), (kv(0, 2), kv(1, 2)))  # type: ignore[arg-type]
    mla_p = kv(0, 8, logical_axis="replicated", item_stride_bytes=4096)
    mla_d = kv(0, 2, logical_axis="replicated", item_stride_bytes=8192)
    with pytest.raises(UnsupportedPDLayoutError, match="read past the prefill item"):
        build((mla_p,), (mla_d,))


def test_decode_dp_groups_wrap_and_routers_choose_a_prefill_group() -> None:
    p = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 4, 2),
        decode_layout=ParallelLayout("decode", 6, 3),
        prefill_buffers=(kv(0, 2),),
        decode_buffers=(kv(0, 2),),
    )
    # Decode groups 0, 1, 2 read prefill groups 0, 1, 0 by default.
    assert [p.plan_for_decode_rank(r).target_prefill_ranks for r in range(6)] == [
        (0,),
        (1,),
        (2,),
        (3,),
        (0,),
        (1,),
    ]
    routed = p.plan_for_decode_rank(4, prefill_dp_group=1)
    assert routed.target_dp_group == 1 and routed.target_prefill_ranks == (2,)
    assert routed.required_dst_info_num_by_prefill_rank == {2: 1}
    assert p.transfer_fragments(4, prefill_dp_group=1)[2][0].src_rank == 2
    # One request makes each source wait for one decode rank, whichever group it came from.
    assert p.source_fanout == {0: 1, 1: 1, 2: 1, 3: 1}
    p.verify()
    for bad in (2, -1):
        with pytest.raises(UnsupportedPDLayoutError, match=f"prefill_dp_group={bad} is out of"):
            p.plan_for_decode_rank(0, prefill_dp_group=bad)
    for wrong, name in ((True, "bool"), ("1", "str")):
        with pytest.raises(
            UnsupportedPDLayoutError, match=f"prefill_dp_group must be an int, got {name}"
        ):
            p.plan_for_decode_rank(0, prefill_dp_group=wrong)


@pytest.mark.parametrize("rank", [-1, 2, 2**64])
def test_decode_rank_out_of_range(rank: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=f"decode_rank={rank} is out of range"):
        planner().plan_for_decode_rank(rank)


@pytest.mark.parametrize(("rank", "name"), [(True, "bool"), (1.0, "float"), ("0", "str")])
def test_decode_rank_of_another_type_is_a_type_error(rank: Any, name: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=f"decode_rank must be an int, got {name}"):
        planner().plan_for_decode_rank(rank)


def test_plan_accessors_and_source_fanout() -> None:
    p = planner()
    plan = p.plan_for_decode_rank(1)
    assert plan.plan_kind == "fragmented"
    assert plan.target_prefill_ranks == (4, 5, 6, 7)
    assert plan.required_dst_info_num_for_prefill_rank(5) == 1
    with pytest.raises(UnsupportedPDLayoutError, match="not a source"):
        plan.required_dst_info_num_for_prefill_rank(0)
    assert p.source_fanout == dict.fromkeys(range(8), 1)
    p.source_fanout[0] = 99
    assert p.source_fanout[0] == 1, "source_fanout hands out a copy"
    with pytest.raises(AttributeError):
        p.source_fanout = {}  # type: ignore[misc]
    assert p.prefill_layout == ParallelLayout("prefill", 8)
    assert p.prefill_buffers == (kv(0, 8),)


def test_identity_plan_and_idle_prefill_groups() -> None:
    p = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8, 2),
        decode_layout=ParallelLayout("decode", 4),
        prefill_buffers=(kv(0, 4),),
        decode_buffers=(kv(0, 4),),
    )
    plan = p.plan_for_decode_rank(3)
    assert plan.plan_kind == "identity"
    assert plan.target_prefill_ranks == (3,)
    assert plan.fragments_by_prefill_rank == {}
    assert plan.required_dst_info_num_by_prefill_rank == {3: 1}
    assert p.source_fanout == {0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0}


def test_planning_a_huge_world_is_refused_at_once() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_WORLD_SIZE"):
        planner(prefill_tp=2**31)


def test_the_suite_runs_against_the_package_it_was_asked_to() -> None:
    """scripts/test_wheel.sh sets PDPLAN_EXPECT_INSTALLED to the venv the wheel went into; the
    suite must then import pdplan from there, not from the source tree."""
    venv = os.environ.get("PDPLAN_EXPECT_INSTALLED")
    location = Path(pdplan.__file__).resolve()
    assert (location.parent / "_core.pyi").exists()
    # The compiled core is the one that came with this package, not another build.
    assert Path(pdplan._core.__file__).resolve().parent == location.parent
    if venv is None:
        # The source tree's package (an editable install) or an installed one.
        source_tree = Path(__file__).resolve().parents[1] / "python" / "pdplan"
        assert location.parent == source_tree or location.parent.parent.name == "site-packages"
        return
    assert location.is_relative_to(Path(venv).resolve()), f"imported from {location}"
    assert "site-packages" in location.parts


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rows_per_page": 0}, "rows_per_page=0 must be between 1"),
        ({"rows_per_page": 3}, "rows_per_page=3 must divide"),
        ({"logical_parts": (4, 3)}, "must add up to logical_size=8"),
        ({"logical_parts": ()}, "between 1 and 8 parts"),
        ({"logical_parts": (1,) * 9}, "between 1 and 8 parts"),
        ({"logical_parts": (8, 0)}, "positive"),
        ({"logical_axis": "replicated", "logical_parts": (4, 4)}, "replicated buffer"),
    ],
)
def test_rows_and_parts_refusals(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        kv(0, 2, **changes)


def test_parts_given_as_a_list_become_a_tuple() -> None:
    buffer = kv(0, 2, logical_parts=[4, 4])
    assert buffer.logical_parts == (4, 4) and hash(buffer)


def test_sides_must_store_pages_alike() -> None:
    def build(prefill: BufferLayout, decode: BufferLayout) -> PDTransferPlanner:
        return PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 8),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=(prefill,),
            decode_buffers=(decode,),
        )

    # Token-major facing head-major pages of one size plan by slot maps, not pages.
    assert build(kv(0, 8, rows_per_page=16), kv(0, 2)).token_maps
    with pytest.raises(UnsupportedPDLayoutError, match="stored differently"):
        build(kv(0, 8, rows_per_page=32), kv(0, 2))
    with pytest.raises(UnsupportedPDLayoutError, match="logical parts differ"):
        build(kv(0, 8, logical_parts=(4, 4)), kv(0, 2, logical_parts=(2, 6)))
    with pytest.raises(UnsupportedPDLayoutError, match="a logical part of=2 is not divisible"):
        build(kv(0, 8, logical_parts=(2, 6)), kv(0, 2, logical_parts=(2, 6)))


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("First", "decode_replicas must be 'first' or 'all'"),
        ("every", "decode_replicas must be 'first' or 'all'"),
        (1, "decode_replicas must be a str, got int"),
    ],
)
def test_decode_replicas_must_be_first_or_all(mode: Any, message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 8),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=(kv(0, 8),),
            decode_buffers=(kv(0, 2),),
            decode_replicas=mode,
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("prefill", 8, 1, 3), "divisible by dp_size x pp_size"),
        (("prefill", 8, 1, 0), "pp_size=0 must be between 1"),
        (("prefill", 8, 1, 2, (3,)), "one layer count per stage"),
        (("prefill", 8, 1, 2, (3, 0)), "at least one layer"),
    ],
)
def test_pipeline_layout_refusals(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        ParallelLayout(*args)


def test_pipeline_stages_need_layers_that_add_up() -> None:
    staged = ParallelLayout("prefill", 4, 1, 2, (2, 1))
    assert (staged.tp_size_per_dp, staged.pp_layer_partition) == (2, (2, 1))
    layered = tuple(kv(i, 2, layer=i) for i in range(3))

    def build(prefill: ParallelLayout, buffers: tuple[BufferLayout, ...]) -> PDTransferPlanner:
        decode_buffers = tuple(kv(b.buffer_index, 1, layer=b.layer) for b in buffers)
        return PDTransferPlanner(
            prefill_layout=prefill,
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=buffers,
            decode_buffers=decode_buffers,
        )

    planner = build(staged, layered)
    planner.verify()
    # Layers 0 and 1 live on stage 0 (ranks 0, 1), layer 2 on stage 1 (ranks 2, 3).
    sources = planner.transfer_fragments(0)
    assert {r: [f.buffer_index for f in fs] for r, fs in sources.items()} == {
        0: [0, 1],
        1: [0, 1],
        2: [2],
        3: [2],
    }
    with pytest.raises(UnsupportedPDLayoutError, match="names no layer"):
        build(staged, (*layered[:2], kv(2, 2)))
    with pytest.raises(UnsupportedPDLayoutError, match="covers 3 layers"):
        build(staged, (*layered, kv(3, 2, layer=3)))
    # Layers past the last buffer's keep no cache (an MLP layer): the partition may cover them.
    build(staged, layered[:2]).verify()
    # Without stages the layer is ignored: the same plans as the reference's.
    plain = build(ParallelLayout("prefill", 2), layered)
    unlayered = build(ParallelLayout("prefill", 2), tuple(kv(i, 2) for i in range(3)))
    assert plain.transfer_fragments(0) == unlayered.transfer_fragments(0)


def test_a_one_stage_partition_is_checked_against_the_layers_the_buffers_name() -> None:
    """pp_size=1 holds every layer on its one stage: a partition given with it is accepted when
    the buffers name no layers, and checked against the layers they name."""
    one_stage = ParallelLayout("prefill", 2, pp_layer_partition=(3,))

    def build(buffers: tuple[BufferLayout, ...], decode_pp: int = 1) -> PDTransferPlanner:
        decode_buffers = tuple(kv(b.buffer_index, 1, layer=b.layer) for b in buffers)
        return PDTransferPlanner(
            prefill_layout=one_stage,
            decode_layout=ParallelLayout("decode", decode_pp, pp_size=decode_pp),
            prefill_buffers=buffers,
            decode_buffers=decode_buffers,
        )

    unnamed = build(tuple(kv(i, 2) for i in range(2)))
    unnamed.verify()
    build(tuple(kv(i, 2, layer=i) for i in range(3)), decode_pp=3).verify()
    with pytest.raises(UnsupportedPDLayoutError, match=r"partition \[3\] covers 3 layers, but"):
        build(tuple(kv(i, 2, layer=i) for i in range(4)), decode_pp=2)


def test_vllm_layer_partition() -> None:
    assert pdplan.vllm_layer_partition(10, 4) == (2, 3, 3, 2)
    assert pdplan.vllm_layer_partition(5, 2) == (3, 2)
    with pytest.raises(UnsupportedPDLayoutError, match="cannot split 2 layers over 4"):
        pdplan.vllm_layer_partition(2, 4)


def test_ranks_are_placed_by_the_core() -> None:
    """DP 2 x PP 3 x TP 2: TP fastest, then the stage, then the DP group; with CP, the CP rank
    between the stage and TP (TRT-LLM's order)."""
    layout = ParallelLayout("prefill", 12, 2, 3)
    assert layout.tp_size_per_dp == 2
    placed = [pdplan._core.rank_coordinates(layout, rank) for rank in range(12)]
    by_hand = [(g, s, 0, t) for g in range(2) for s in range(3) for t in range(2)]
    assert placed == by_hand
    layout = ParallelLayout("prefill", 24, 2, 3, cp_size=2)
    assert layout.tp_size_per_dp == 2
    placed = [pdplan._core.rank_coordinates(layout, rank) for rank in range(24)]
    by_hand = [(g, s, c, t) for g in range(2) for s in range(3) for c in range(2) for t in range(2)]
    assert placed == by_hand
    with pytest.raises(UnsupportedPDLayoutError, match="rank=24 is out of range"):
        pdplan._core.rank_coordinates(layout, 24)
    with pytest.raises(UnsupportedPDLayoutError, match="rank must be an int, got str"):
        pdplan._core.rank_coordinates(layout, "3")  # type: ignore[arg-type]


def test_a_planner_is_read_only_over_what_it_was_built_from() -> None:
    prefill = [BufferLayout(0, BufferKind.TARGET_K, "kv_head", 8, 16, 64, 64 * 4)]
    decode = [BufferLayout(0, BufferKind.TARGET_K, "kv_head", 8, 16, 64, 64 * 8)]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    prefill.clear()  # the caller's list is not the planner's
    assert len(planner.prefill_buffers) == 1 and not planner.is_staged
    for name in ("prefill_layout", "decode_layout", "prefill_buffers", "decode_buffers"):
        with pytest.raises(AttributeError):
            setattr(planner, name, None)
    assert planner.decode_buffers[0].is_token_indexed
    state = BufferLayout(1, BufferKind.MAMBA_STATE, "state_channel", 8, 1, 64, 64 * 8)
    assert not state.is_token_indexed


def test_the_even_layer_partition_is_the_one_planners_use() -> None:
    for layers, pp in [(5, 2), (10, 4), (7, 7), (64, 3)]:
        split = pdplan.even_layer_partition(layers, pp)
        # As even as possible, the extra layers first.
        assert sum(split) == layers and max(split) - min(split) <= 1
        assert list(split) == sorted(split, reverse=True)
        # A planner left to its default holds consecutive layers in those counts: one K
        # buffer a layer, prefill TP 1 a stage, and each stage's rank sends its own layers.
        buffers = [
            BufferLayout(i, BufferKind.TARGET_K, "kv_head", 8, 16, 64, 8 * 64, layer=i)
            for i in range(layers)
        ]
        planner = PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", pp, pp_size=pp),
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=buffers,
            decode_buffers=buffers,
        )
        sent = planner.transfer_fragments(0)
        held = [sorted(f.buffer_index for f in sent.get(stage, ())) for stage in range(pp)]
        starts = [sum(split[:s]) for s in range(pp)]
        assert held == [list(range(a, a + n)) for a, n in zip(starts, split)]
    with pytest.raises(UnsupportedPDLayoutError, match="cannot split 2 layers over 3"):
        pdplan.even_layer_partition(2, 3)
