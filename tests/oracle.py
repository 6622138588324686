"""A brute-force oracle, independent of the planner's arithmetic.

It assigns every logical unit of every buffer to the ranks that hold it by walking the units
one by one, then checks a set of plans byte by byte: each byte of each decode rank's shard of
a page is written exactly once, by a fragment whose source holds that same unit at that same
byte of the unit, inside both items; and each prefill rank's fanout is the number of decode
ranks that need one of its units.
"""

from __future__ import annotations

from collections import Counter

from pdplan import BufferLayout, ParallelLayout, RankTransferPlan


def owner_tp_rank(buffer: BufferLayout, tp_size: int, unit: int) -> int:
    """The first TP rank of the replica group holding `unit` (the one that sends/receives)."""
    replica = buffer.tp_replica_group_size
    units_per_shard = buffer.logical_size // (tp_size // replica)
    return (unit // units_per_shard) * replica


def units_of(buffer: BufferLayout, tp_size: int, tp_rank: int) -> list[int]:
    return [u for u in range(buffer.logical_size) if owner_tp_rank(buffer, tp_size, u) == tp_rank]


def layout_is_valid(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: tuple[BufferLayout, ...],
    decode_buffers: tuple[BufferLayout, ...],
) -> bool:
    if len(prefill_buffers) != len(decode_buffers):
        return False
    for p, d in zip(prefill_buffers, decode_buffers):
        same = (
            "buffer_index",
            "buffer_kind",
            "logical_axis",
            "logical_size",
            "bytes_per_logical_unit",
        )
        if any(getattr(p, name) != getattr(d, name) for name in same):
            return False
        if p.logical_axis == "replicated":
            if d.item_stride_bytes > p.item_stride_bytes:
                return False
            continue
        for layout, b in ((prefill, p), (decode, d)):
            tp = layout.tp_size_per_dp
            if tp % b.tp_replica_group_size:
                return False
            shards = tp // b.tp_replica_group_size
            if b.logical_size % shards:
                return False
            if b.item_stride_bytes // b.bytes_per_logical_unit < b.logical_size // shards:
                return False
    return True


def expected_fanout(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: tuple[BufferLayout, ...],
    decode_buffers: tuple[BufferLayout, ...],
) -> dict[int, int]:
    """Decode ranks one request makes each prefill rank wait for, under the default mapping
    (decode DP group g reads prefill DP group g % prefill dp_size); 0 where nobody reads."""
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    fanout = dict.fromkeys(range(prefill.world_size), 0)
    for group in range(decode.dp_size):
        source_group = group % prefill.dp_size
        readers = dict.fromkeys(range(ptp), 0)
        for tp_rank in range(dtp):
            sources: set[int] = set()
            for p, d in zip(prefill_buffers, decode_buffers):
                if p.logical_axis == "replicated":
                    sources.add(tp_rank * ptp // dtp)
                    continue
                for unit in units_of(d, dtp, tp_rank):
                    sources.add(owner_tp_rank(p, ptp, unit))
            for source in sources:
                readers[source] += 1
        for source, count in readers.items():
            fanout[source_group * ptp + source] = count
    return fanout


def check_plan(
    plan: RankTransferPlan,
    decode_rank: int,
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: tuple[BufferLayout, ...],
    decode_buffers: tuple[BufferLayout, ...],
    fanout: dict[int, int],
) -> None:
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    decode_group, tp_rank = divmod(decode_rank, dtp)
    group = decode_group % prefill.dp_size  # the prefill DP group read by default
    assert plan.target_dp_group == group
    assert list(plan.target_prefill_ranks) == sorted(plan.target_prefill_ranks)
    assert plan.required_prefill_response_num == len(plan.target_prefill_ranks)
    assert plan.required_dst_info_num_by_prefill_rank == {
        rank: fanout[rank] for rank in plan.target_prefill_ranks
    }
    if plan.plan_kind == "identity":
        # Whole items rank to rank: same TP, no replica groups, so the same units.
        assert ptp == dtp
        assert all(b.tp_replica_group_size == 1 for b in prefill_buffers + decode_buffers)
        assert plan.target_prefill_ranks == (group * ptp + tp_rank,)
        assert plan.fragments_by_prefill_rank == {}
        return
    assert tuple(plan.fragments_by_prefill_rank) == plan.target_prefill_ranks
    for fragments in plan.fragments_by_prefill_rank.values():
        assert fragments, "a target prefill rank with no fragments"
    written: dict[int, Counter[int]] = {b.buffer_index: Counter() for b in decode_buffers}
    by_index = {d.buffer_index: (p, d) for p, d in zip(prefill_buffers, decode_buffers)}
    for src_rank, fragments in plan.fragments_by_prefill_rank.items():
        src_group, src_tp_rank = divmod(src_rank, ptp)
        assert src_group == group, "a source outside the decode rank's DP group"
        for f in fragments:
            assert (f.src_rank, f.dst_rank) == (src_rank, decode_rank)
            p, d = by_index[f.buffer_index]
            assert f.buffer_kind == p.buffer_kind
            assert (f.src_page_stride_bytes, f.dst_page_stride_bytes) == (
                p.item_stride_bytes,
                d.item_stride_bytes,
            )
            assert f.bytes_per_page > 0
            assert f.src_byte_offset + f.bytes_per_page <= p.item_stride_bytes
            assert f.dst_byte_offset + f.bytes_per_page <= d.item_stride_bytes
            if p.logical_axis == "replicated":
                assert src_tp_rank == tp_rank * ptp // dtp
                assert f.src_byte_offset == f.dst_byte_offset == 0
                written[f.buffer_index].update(range(f.bytes_per_page))
                continue
            src_units = units_of(p, ptp, src_tp_rank)
            dst_units = units_of(d, dtp, tp_rank)
            bpu = p.bytes_per_logical_unit
            for dst_byte in range(f.dst_byte_offset, f.dst_byte_offset + f.bytes_per_page):
                src_byte = f.src_byte_offset + (dst_byte - f.dst_byte_offset)
                assert dst_byte // bpu < len(dst_units), "writes past the decode shard"
                assert src_byte // bpu < len(src_units), "reads past the prefill shard"
                assert src_units[src_byte // bpu] == dst_units[dst_byte // bpu]
                assert src_byte % bpu == dst_byte % bpu
                written[f.buffer_index][dst_byte] += 1
    for p, d in zip(prefill_buffers, decode_buffers):
        if p.logical_axis == "replicated":
            shard_bytes = d.item_stride_bytes
        else:
            shard_bytes = len(units_of(d, dtp, tp_rank)) * d.bytes_per_logical_unit
        counts = written[d.buffer_index]
        assert set(counts) == set(range(shard_bytes)), f"gap in buffer {d.buffer_index}"
        assert set(counts.values()) <= {1}, f"byte written twice in buffer {d.buffer_index}"
