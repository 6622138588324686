"""Hypothesis properties: every plan pdplan makes passes the brute-force oracle, and pdplan
refuses exactly the layouts the oracle calls invalid."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
)

from oracle import (
    check_plan,
    dealt_units,
    expected_fanout,
    expected_routing,
    fanout_from_deliveries,
    layout_is_valid,
    least_largest_fanout,
    simulate,
    stages_of,
    where,
)

TP = st.sampled_from([1, 2, 4, 8] * 3 + [3, 6])


@st.composite
def layouts(draw: Any, max_tp: int = 8) -> tuple[Any, ...]:
    """Both sides of a random deployment: TP, DP groups (decode sometimes with more), and up to
    four buffers: KV heads or state channels (possibly made of parts) or replicated, head- or
    token-major pages, GQA replica groups, padding, and now and then a broken item size."""
    tp_sizes = TP.filter(lambda tp: tp <= max_tp)
    prefill_tp, decode_tp = draw(tp_sizes), draw(tp_sizes)
    prefill_dp = draw(st.integers(1, 3))
    decode_dp = draw(st.integers(1, prefill_dp + (1 if draw(st.integers(0, 9)) == 0 else 0)))
    # Pipeline stages now and then, on either side or both, with layers to deal out.
    pps = st.sampled_from([1, 1, 1, 2, 3])
    prefill_pp, decode_pp = draw(pps), draw(pps)
    layers = draw(st.integers(1, 5))

    def partition(pp: int) -> tuple[int, ...] | None:
        if pp == 1 or draw(st.booleans()):
            return None
        cuts = sorted(
            draw(st.lists(st.integers(1, max(1, layers - 1)), min_size=pp - 1, max_size=pp - 1))
        )
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, layers])) if cuts else (layers,)

    prefill_partition, decode_partition = partition(prefill_pp), partition(decode_pp)
    if any(n <= 0 for n in (prefill_partition or ()) + (decode_partition or ())):
        prefill_partition = decode_partition = None
    prefill = ParallelLayout(
        "prefill", prefill_tp * prefill_dp * prefill_pp, prefill_dp, prefill_pp, prefill_partition
    )
    decode = ParallelLayout(
        "decode", decode_tp * decode_dp * decode_pp, decode_dp, decode_pp, decode_partition
    )
    prefill_buffers, decode_buffers = [], []
    count = draw(st.integers(0, 4))
    for index in range(count):
        # The last buffer takes the last layer, so the buffers name every layer count.
        layer = layers - 1 if index == count - 1 else draw(st.integers(0, layers - 1))
        kind = draw(st.sampled_from(list(BufferKind)))
        axis = draw(st.sampled_from(["kv_head", "state_channel", "replicated"]))
        parts = groups = None
        if axis != "replicated" and draw(st.integers(0, 3)) == 0:
            parts = tuple(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=3)))
            if draw(st.booleans()):  # each part's groups, a divisor of it: copied below them
                groups = tuple(draw(st.sampled_from([g for g in (1, 2, 4, 8) if n % g == 0]))
                               for n in parts)  # fmt: skip
        size = sum(parts) if parts else draw(st.sampled_from([1, 2, 4, 8] * 3 + [3, 6, 12, 24]))
        rows = draw(st.sampled_from([1] * 3 + [2, 4]))
        bpu = draw(st.integers(1, 3)) * rows
        sides = []
        for tp in (prefill_tp, decode_tp):
            natural = tp // size if tp > size and tp % size == 0 else 1
            replica = draw(st.sampled_from([natural] * 4 + [1, 2]))
            shards = max(1, tp // replica)
            held = dealt_units(
                BufferLayout(index, kind, axis, size, 16, bpu, size * bpu, replica, rows, parts,
                             logical_part_groups=groups), tp, 0)  # fmt: skip
            units = -(-size // shards) if held is None else len(held)
            stride = size * bpu if axis == "replicated" else units * bpu
            stride += rows * draw(st.sampled_from([0] * 5 + [1, bpu, -1]))
            stride = max(rows, stride)
            buffer = BufferLayout(
                index, kind, axis, size, 16, bpu, stride, replica, rows, parts, layer,
                logical_part_groups=groups,
            )  # fmt: skip
            sides.append(buffer)
        prefill_buffers.append(sides[0])
        decode_buffers.append(sides[1])
    return prefill, decode, tuple(prefill_buffers), tuple(decode_buffers)


def check_every_rank(planner: PDTransferPlanner, layout: tuple[Any, ...], replicas: str) -> None:
    """Every decode rank's plan through the simulation; then the fanout the planner reports
    against the fanout the moved bytes show (and, under "first", the dealing's own count)."""
    prefill, decode, decode_buffers = layout[0], layout[1], layout[3]
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
    plans, delivered = {}, {}
    for rank in range(decode.world_size):
        plans[rank] = planner.plan_for_decode_rank(rank)
        fragments = planner.transfer_fragments(rank)
        delivered[rank] = check_plan(plans[rank], fragments, rank, *layout, replicas)
    fanout = fanout_from_deliveries(prefill, decode, delivered)
    if replicas == "first":
        assert fanout == expected_fanout(*layout)
    assert planner.source_fanout == fanout
    for plan in plans.values():
        assert plan.required_dst_info_num_by_prefill_rank == {
            rank: fanout[rank] for rank in plan.target_prefill_ranks
        }


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
    check_every_rank(planner, layout, "first")


@settings(max_examples=250, deadline=None)
@given(layouts(max_tp=8))
def test_every_decode_rank_served_with_the_least_fanout(layout: tuple[Any, ...]) -> None:
    """decode_replicas="all": every decode rank receives its whole shard directly, and the
    largest fanout is the least an exhaustive search over source choices finds."""
    prefill, decode, prefill_buffers, decode_buffers = layout
    assume(layout_is_valid(*layout))
    planner = PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
        decode_replicas="all",
    )
    # Idle are only the ranks of decode stages that hold none of the buffers' layers.
    holding = {d_stage for _, d_stage in stages_of(prefill, decode, prefill_buffers)}
    idle = sum(where(decode, rank)[1] not in holding for rank in range(decode.world_size))
    assert planner.idle_decode_ranks == idle
    check_every_rank(planner, layout, "all")
    if planner.plan_for_decode_rank(0).plan_kind == "fragmented":
        least = least_largest_fanout(*layout)
        assert max(planner.source_fanout.values()) == least


def test_needs_with_few_holders_are_served_before_ranks_that_could_read_anywhere() -> None:
    """Decode stage 0 reads one head that all eight prefill TP ranks of stage 0 hold; stage 1
    reads four heads each held by two of them. Served decode rank by decode rank, stage 0's
    ranks took two of those eight first and left a pair with both members loaded (largest
    fanout 2); fewest choices first, every prefill rank serves one decode rank."""
    prefill = ParallelLayout("prefill", 16, 1, 2, (2, 1))
    decode = ParallelLayout("decode", 4, 1, 2, (1, 2))

    def kv(index: int, heads: int, replica: int, item: int, layer: int) -> BufferLayout:
        return BufferLayout(
            index, BufferKind.TARGET_K, "kv_head", heads, 16, 1, item, replica, layer=layer
        )

    layout = (
        prefill,
        decode,
        (
            kv(0, 4, 2, 1, 1),
            kv(1, 1, 8, 1, 0),
            BufferLayout(2, BufferKind.TARGET_K, "replicated", 1, 16, 1, 1, 2, layer=2),
        ),
        (
            kv(0, 4, 1, 2, 1),
            kv(1, 1, 2, 1, 0),
            BufferLayout(2, BufferKind.TARGET_K, "replicated", 1, 16, 1, 1, 2, layer=2),
        ),
    )
    assert layout_is_valid(*layout)
    planner = PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=layout[2],
        decode_buffers=layout[3],
        decode_replicas="all",
    )
    check_every_rank(planner, layout, "all")
    assert max(planner.source_fanout.values()) == least_largest_fanout(*layout) == 1


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_the_routing_table_is_what_the_dealing_says(layout: tuple[Any, ...]) -> None:
    """Rows follow the default DP-group mapping (decode DP above prefill DP included) and count
    the fragments and bytes the dealing gives each (decode rank, prefill rank) pair, identity
    plans too; and they are what `transfer_fragments` moves."""
    prefill, decode, prefill_buffers, decode_buffers = layout
    assume(layout_is_valid(*layout))
    planner = PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
    )
    identity = planner.plan_for_decode_rank(0).plan_kind == "identity"
    table = planner.routing_table()
    # Rows that move data; notify-only rows (no fragment) are checked in test_notify.py.
    rows = [row for row in zip(*(column.tolist() for column in table)) if row[2]]
    assert rows == expected_routing(*layout, identity=identity)
    moved = [
        (rank, source, len(fragments), sum(f.bytes_per_page for f in fragments))
        for rank in range(decode.world_size)
        for source, fragments in planner.transfer_fragments(rank).items()
    ]
    assert rows == moved


@settings(max_examples=150, deadline=None)
@given(layouts(), st.sampled_from(["first", "all"]))
def test_notify_ranks_are_the_holders_of_a_decode_rank_s_bytes_it_reads_nothing_from(
    layout: tuple[Any, ...], replicas: str
) -> None:
    """Brute force over units: a prefill rank of the group read holds some of a decode rank's
    bytes when, for some buffer their stages both hold, their dealt units meet (a replicated
    buffer: always); notify ranks are those holders minus the sources. The routing table's
    notify rows (no fragment) are the same pairs."""
    prefill, decode, prefill_buffers, decode_buffers = layout
    assume(layout_is_valid(*layout))
    planner = PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
        decode_replicas=replicas,  # type: ignore[arg-type]
    )
    stages = stages_of(prefill, decode, prefill_buffers)
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    expected_rows = set()
    for d in range(decode.world_size):
        plan = planner.plan_for_decode_rank(d)
        _, d_stage, d_tp = where(decode, d)
        holders = set()
        for p in range(prefill.world_size):
            p_group, p_stage, p_tp = where(prefill, p)
            if p_group != plan.target_dp_group:
                continue
            for pb, db, (ps, ds) in zip(prefill_buffers, decode_buffers, stages):
                if (ps, ds) != (p_stage, d_stage):
                    continue
                theirs, mine = dealt_units(pb, ptp, p_tp), dealt_units(db, dtp, d_tp)
                assert theirs is not None and mine is not None
                if set(theirs.tolist()) & set(mine.tolist()):
                    holders.add(p)
        notify = holders - set(plan.target_prefill_ranks)
        assert list(plan.notify_prefill_ranks) == sorted(notify), d
        expected_rows |= {(d, p) for p in notify}
        event(f"notify ranks: {bool(notify)}")
    table = planner.routing_table()
    rows = zip(table.decode_rank.tolist(), table.prefill_rank.tolist(), table.fragment_count)
    assert {(d, p) for d, p, count in rows if count == 0} == expected_rows


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
