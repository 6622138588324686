"""Hypothesis properties: every plan pdplan makes passes the brute-force oracle, and pdplan
refuses exactly the layouts the oracle calls invalid."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
)

from oracle import check_plan, expected_fanout, layout_is_valid, simulate

TP = st.sampled_from([1, 2, 4, 8] * 3 + [3, 6])


@st.composite
def layouts(draw: Any) -> tuple[Any, ...]:
    prefill_tp, decode_tp = draw(TP), draw(TP)
    prefill_dp = draw(st.integers(1, 3))
    decode_dp = draw(st.integers(1, prefill_dp + (1 if draw(st.integers(0, 9)) == 0 else 0)))
    prefill = ParallelLayout("prefill", prefill_tp * prefill_dp, prefill_dp)
    decode = ParallelLayout("decode", decode_tp * decode_dp, decode_dp)
    prefill_buffers, decode_buffers = [], []
    for index in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(list(BufferKind)))
        axis = draw(st.sampled_from(["kv_head", "state_channel", "replicated"]))
        size = draw(st.sampled_from([1, 2, 4, 8] * 3 + [3, 6, 12, 24]))
        bpu = draw(st.integers(1, 5))
        sides = []
        for tp in (prefill_tp, decode_tp):
            natural = tp // size if tp > size and tp % size == 0 else 1
            replica = draw(st.sampled_from([natural] * 4 + [1, 2]))
            shards = max(1, tp // replica)
            stride = size * bpu if axis == "replicated" else -(-size // shards) * bpu
            stride += draw(st.sampled_from([0] * 5 + [1, bpu, -1]))
            sides.append(BufferLayout(index, kind, axis, size, 16, bpu, max(1, stride), replica))
        prefill_buffers.append(sides[0])
        decode_buffers.append(sides[1])
    return prefill, decode, tuple(prefill_buffers), tuple(decode_buffers)


@settings(max_examples=400, deadline=None)
@given(layouts())
def test_plans_pass_the_oracle(layout: tuple[Any, ...]) -> None:
    prefill, decode, prefill_buffers, decode_buffers = layout
    valid = layout_is_valid(*layout)
    try:
        planner = PDTransferPlanner(
            prefill_layout=prefill,
            decode_layout=decode,
            prefill_buffers=prefill_buffers,
            decode_buffers=decode_buffers,
        )
    except UnsupportedPDLayoutError:
        event("refused")
        assert not valid, "pdplan refused a layout the oracle finds valid"
        return
    event("planned")
    assert valid, "pdplan planned a layout the oracle finds invalid"
    cramped = any(
        d.logical_axis == "replicated"
        and d.item_stride_bytes < d.logical_size * d.bytes_per_logical_unit
        for d in decode_buffers
    )
    if cramped:  # the decode item cannot hold the replicated buffer: planned, but a gap
        with pytest.raises(UnsupportedPDLayoutError, match="gap"):
            planner.verify()
    else:
        planner.verify()
    fanout = expected_fanout(*layout)
    assert planner.source_fanout == fanout
    for rank in range(decode.world_size):
        plan, fragments = planner.plan_for_decode_rank(rank), planner.transfer_fragments(rank)
        check_plan(plan, fragments, rank, *layout, fanout)


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_the_routing_table_lists_what_transfer_fragments_move(layout: tuple[Any, ...]) -> None:
    """Rows follow the default DP-group mapping (decode DP above prefill DP included) and
    count the fragments and bytes `transfer_fragments` gives, identity plans too."""
    prefill, decode, prefill_buffers, decode_buffers = layout
    if not layout_is_valid(*layout):
        return
    planner = PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
    )
    table = planner.routing_table()
    rows = list(zip(*(column.tolist() for column in table)))
    expected = [
        (rank, source, len(fragments), sum(f.bytes_per_page for f in fragments))
        for rank in range(decode.world_size)
        for source, fragments in planner.transfer_fragments(rank).items()
    ]
    assert rows == expected
    assert all(0 <= source < prefill.world_size for _, source, _, _ in rows)


def test_the_oracle_catches_broken_plans() -> None:
    """The simulation can fail: a dropped, shifted, doubled or misdirected fragment is caught."""
    unit = 4
    heads = 8

    def kv(tp: int) -> tuple[BufferLayout, ...]:
        return (
            BufferLayout(0, BufferKind.TARGET_K, "kv_head", heads, 16, unit, heads // tp * unit),
        )

    layout = (ParallelLayout("prefill", 4), ParallelLayout("decode", 2), kv(4), kv(2))
    planner = PDTransferPlanner(
        prefill_layout=layout[0],
        decode_layout=layout[1],
        prefill_buffers=layout[2],
        decode_buffers=layout[3],
    )
    good = planner.transfer_fragments(1)
    simulate(1, good, *layout, source_group=0)
    first = good[2][0]
    broken = [
        {3: good[3]},
        {**good, 2: (replace(first, dst_byte_offset=first.dst_byte_offset + unit),)},
        {**good, 2: (first, first)},
        {**good, 2: (replace(first, src_byte_offset=unit),)},
        {**good, 2: (replace(first, dst_page_stride_bytes=first.dst_page_stride_bytes + 1),)},
    ]
    for fragments in broken:
        with pytest.raises(AssertionError):
            simulate(1, fragments, *layout, source_group=0)
