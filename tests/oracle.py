"""A brute-force oracle that knows nothing of the planner's arithmetic.

It deals each buffer's logical units out to the ranks the way a model shards them (ranks in
replica groups of consecutive ranks, the units split evenly over the groups), builds every
rank's page as a real numpy array whose every byte is labelled with the logical byte it holds,
then runs a plan's fragments as plain array copies and compares what each decode rank ends up
with against what it should hold. Validity comes from the same dealing: a layout is valid when
every rank can be dealt a shard that fits its item and every decode byte has a source.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from pdplan import BufferKind, BufferLayout, ParallelLayout, RankTransferPlan, TransferFragment

#: Pages simulated per buffer: two, so a wrong page stride shows.
PAGES = 2


def staged(prefill: ParallelLayout, decode: ParallelLayout) -> bool:
    return prefill.pp_size > 1 or decode.pp_size > 1


def layer_count(buffers: Sequence[BufferLayout]) -> int:
    return max((b.layer + 1 for b in buffers if b.layer is not None), default=0)


def stage_of_layer(layout: ParallelLayout, layers: int) -> list[int] | None:
    """Each layer's stage, dealt out in order: the partition's counts, else as evenly as
    possible with the first stages one more; None when no dealing fits."""
    pp = layout.pp_size
    if layout.pp_layer_partition is not None:
        counts = list(layout.pp_layer_partition)
        # Layers past the buffers' keep no cache (an MLP layer may end a model): a partition
        # may cover more layers than the buffers name, not fewer.
        if sum(counts) < layers:
            return None
    elif pp == 1:
        return [0] * layers  # one stage holds every layer, however few
    else:
        if layers < pp:
            return None
        counts = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    return [stage for stage, count in enumerate(counts) for _ in range(count)]


def stages_of(
    prefill: ParallelLayout, decode: ParallelLayout, buffers: Sequence[BufferLayout]
) -> list[tuple[int, int]]:
    """(prefill stage, decode stage) of each buffer; stage 0 everywhere without stages."""
    if not staged(prefill, decode):
        return [(0, 0)] * len(buffers)
    layers = layer_count(buffers)
    p, d = stage_of_layer(prefill, layers), stage_of_layer(decode, layers)
    assert p is not None and d is not None
    return [(p[b.layer], d[b.layer]) for b in buffers]  # type: ignore[index]


def where(layout: ParallelLayout, rank: int) -> tuple[int, int, int]:
    """(DP group, stage, TP rank) of a rank: TP fastest, then stage, then group."""
    tp = layout.tp_size_per_dp
    group, slot = divmod(rank, layout.pp_size * tp)
    return group, slot // tp, slot % tp


def dealt_units(buffer: BufferLayout, tp_size: int, tp_rank: int) -> np.ndarray | None:
    """The logical units `tp_rank` holds, in item order, or None when no even dealing exists.

    Ranks form replica groups of `tp_replica_group_size` consecutive ranks; each part of the
    axis (the whole axis unless `logical_parts` says otherwise) is split into one equal
    contiguous run per group, and every rank of a group holds its runs, part after part. A
    part of `logical_part_groups[i]` groups, fewer than the replica groups, is not split but
    copied: replica group `g` of `G` holds its group `g * groups // G` whole (Mamba2's B and C
    below n_groups ranks); a part's groups are never split and deal evenly or not at all.
    """
    if buffer.logical_axis == "replicated":
        return np.arange(buffer.logical_size)
    replica = buffer.tp_replica_group_size
    shards, stray = divmod(tp_size, replica)
    if stray or shards == 0:
        return None  # some ranks would belong to no whole replica group
    units = np.arange(buffer.logical_size)
    parts = buffer.logical_parts or (buffer.logical_size,)
    groups = buffer.logical_part_groups or (None,) * len(parts)
    shard = tp_rank // replica
    held = []
    for part, count in zip(np.split(units, np.cumsum(parts)[:-1]), groups):
        if count is not None and count < shards:
            if shards % count:
                return None  # copies cannot be dealt evenly
            held.append(np.split(part, count)[shard * count // shards])
            continue
        if len(part) % shards or (count is not None and count % shards):
            return None  # the part (or its groups) cannot be split evenly over the shards
        held.append(np.split(part, shards)[shard])
    return np.concatenate(held)


def layout_is_valid(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
) -> bool:
    """Valid when both sides describe the same buffers, every rank of both sides can be dealt
    its units and its item holds them, and every decode byte of a replicated buffer exists
    on the prefill side."""
    if len(prefill_buffers) != len(decode_buffers):
        return False
    if staged(prefill, decode):
        # Stages hold layers: every buffer must name one, and the layers must deal out.
        if any(b.layer is None for b in prefill_buffers):
            return False
        layers = layer_count(prefill_buffers)
        if stage_of_layer(prefill, layers) is None or stage_of_layer(decode, layers) is None:
            return False
    same = (
        "buffer_index",
        "buffer_kind",
        "logical_axis",
        "logical_size",
        "bytes_per_logical_unit",
        "rows_per_page",
        "logical_parts",
        "logical_part_groups",
        "layer",
    )
    for p, d in zip(prefill_buffers, decode_buffers):
        if any(getattr(p, name) != getattr(d, name) for name in same):
            return False
        if p.logical_axis == "replicated":
            # The decode item is copied whole from a prefill item: every byte it should hold
            # must sit at the same place in the prefill item.
            if d.item_stride_bytes > p.item_stride_bytes:
                return False
            units = np.arange(p.logical_size)
            src = page_labels(p, units, p.item_stride_bytes)[: d.item_stride_bytes]
            dst = page_labels(d, units, d.item_stride_bytes)
            if not np.array_equal(src[dst != 0], dst[dst != 0]):
                return False
            continue
        for layout, b in ((prefill, p), (decode, d)):
            tp = layout.tp_size_per_dp
            for tp_rank in range(tp):
                units = dealt_units(b, tp, tp_rank)
                if units is None or len(units) * b.bytes_per_logical_unit > b.item_stride_bytes:
                    return False
    return True


def page_labels(buffer: BufferLayout, units: np.ndarray, item_bytes: int) -> np.ndarray:
    """One page of a rank's item as a (rows, row bytes) tensor flattened: row r holds, unit by
    unit in the rank's order, bytes r*w .. (r+1)*w of each unit (w = bytes_per_logical_unit /
    rows), each byte labelled 1 + its logical byte (unit * bytes_per_logical_unit + byte of
    the unit); 0 marks padding."""
    rows = buffer.rows_per_page
    unit_bytes = buffer.bytes_per_logical_unit
    width = unit_bytes // rows
    # logical[u, r, b] = unit u's byte r*width + b
    logical = (
        units[:, None, None] * unit_bytes
        + np.arange(rows)[None, :, None] * width
        + np.arange(width)[None, None, :]
        + 1
    )
    page = np.zeros((rows, item_bytes // rows), dtype=np.int64)
    row_major = logical.transpose(1, 0, 2).reshape(rows, -1)  # row r: every unit's r-th slice
    held = min(row_major.shape[1], page.shape[1])
    page[:, :held] = row_major[:, :held]
    return page.reshape(-1)


def first_holder(buffer: BufferLayout, tp_size: int, unit: int) -> int:
    """The lowest TP rank holding `unit`: the one that sends it (reference semantics)."""
    return min(holders(buffer, tp_size, unit))


def holders(buffer: BufferLayout, tp_size: int, unit: int) -> list[int]:
    """Every TP rank holding `unit`, ascending."""
    return [
        rank
        for rank in range(tp_size)
        if unit in set(dealt_units(buffer, tp_size, rank).tolist())  # type: ignore[union-attr]
    ]


def sender(p: BufferLayout, ptp: int, unit: int, d: BufferLayout, dtp: int, d_rank: int) -> int:
    """The prefill TP rank that sends decode TP rank `d_rank` the unit: its first holder; for a
    copied unit (several shards hold it), the first holder whose shard sits where the decode
    rank's does (its fraction of the shards overlaps the decode shard's), so that a copy never
    adds a source the decode rank's own share would not."""
    have = holders(p, ptp, unit)
    p_shards, d_shards = ptp // p.tp_replica_group_size, dtp // d.tp_replica_group_size
    mine = d_rank // d.tp_replica_group_size
    aligned = [
        r
        for r in have
        if (r // p.tp_replica_group_size) * d_shards < (mine + 1) * p_shards
        and mine * p_shards < (r // p.tp_replica_group_size + 1) * d_shards
    ]
    return min(aligned or have)


def receives(buffer: BufferLayout, tp_size: int, tp_rank: int, replicas: str = "first") -> bool:
    """Whether a decode rank receives this buffer: every rank under ``"all"``; under
    ``"first"`` only the first rank of its replica group (the runtime copies inside the
    group)."""
    if buffer.logical_axis == "replicated" or replicas == "all":
        return True
    return tp_rank % buffer.tp_replica_group_size == 0


def expected_fanout(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
) -> dict[int, int]:
    """Decode ranks one request makes each prefill rank wait for, under the default mapping
    (decode DP group g reads prefill DP group g % prefill dp_size); 0 where nobody reads.
    A decode rank waits on the sender of every unit it receives."""
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    stages = stages_of(prefill, decode, prefill_buffers)
    group_size = prefill.pp_size * ptp
    fanout = dict.fromkeys(range(prefill.world_size), 0)
    for group in range(decode.dp_size):
        source_group = group % prefill.dp_size
        readers = dict.fromkeys(range(group_size), 0)
        for stage, tp_rank in itertools.product(range(decode.pp_size), range(dtp)):
            sources: set[int] = set()  # (prefill stage * ptp + TP rank) within the group
            for (p, d), (p_stage, d_stage) in zip(zip(prefill_buffers, decode_buffers), stages):
                if d_stage != stage:
                    continue  # another stage's layer
                if p.logical_axis == "replicated":
                    # the reference's choice of source
                    sources.add(p_stage * ptp + tp_rank * ptp // dtp)
                    continue
                if not receives(d, dtp, tp_rank):
                    continue
                units = dealt_units(d, dtp, tp_rank)
                assert units is not None
                sources.update(
                    p_stage * ptp + sender(p, ptp, int(u), d, dtp, tp_rank) for u in units
                )
            for source in sources:
                readers[source] += 1
        for source, count in readers.items():
            fanout[source_group * group_size + source] = count
    return fanout


def part_of(buffer: BufferLayout, unit: int) -> int:
    """Which part of the split axis a logical unit belongs to."""
    bounds = np.cumsum(buffer.logical_parts or (buffer.logical_size,))
    return int(np.searchsorted(bounds, unit, side="right"))


def expected_routing(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
    identity: bool,
) -> list[tuple[int, int, int, int]]:
    """The whole cluster's routing under the default mapping and ``decode_replicas="first"``,
    from the dealing alone: rows (decode rank, prefill rank, fragments, bytes a page), decode
    rank then prefill rank ascending. Each unit a decode rank receives comes from its first
    holder, one fragment per buffer part a source sends; a replicated buffer is one whole
    decode item from the reference's source; an identity plan copies every buffer's smaller
    item from the rank at the same place of the source group."""
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    stages = stages_of(prefill, decode, prefill_buffers)
    rows = []
    for rank in range(decode.world_size):
        group, stage, tp_rank = where(decode, rank)
        base = (group % prefill.dp_size) * prefill.pp_size * ptp
        sent: dict[int, list[int]] = {}  # prefill rank -> [fragments, bytes a page]

        def send(
            p_stage: int,
            src_tp: int,
            fragments: int,
            nbytes: int,
            sent: dict[int, list[int]] = sent,
            base: int = base,
        ) -> None:
            entry = sent.setdefault(base + p_stage * ptp + src_tp, [0, 0])
            entry[0] += fragments
            entry[1] += nbytes

        for (p, d), (p_stage, d_stage) in zip(zip(prefill_buffers, decode_buffers), stages):
            if d_stage != stage:
                continue
            if identity:
                send(p_stage, tp_rank, 1, min(p.item_stride_bytes, d.item_stride_bytes))
            elif p.logical_axis == "replicated":
                send(p_stage, tp_rank * ptp // dtp, 1, d.item_stride_bytes)
            elif receives(d, dtp, tp_rank):
                by_holder: dict[int, set[int]] = {}
                units = dealt_units(d, dtp, tp_rank)
                assert units is not None
                source = {u: sender(p, ptp, u, d, dtp, tp_rank) for u in units.tolist()}
                for unit in units.tolist():
                    by_holder.setdefault(source[unit], set()).add(part_of(p, unit))
                for holder, parts in by_holder.items():
                    count = sum(source[u] == holder for u in units.tolist())
                    send(p_stage, holder, len(parts), count * p.bytes_per_logical_unit)
        rows.extend((rank, source, f, b) for source, (f, b) in sorted(sent.items()))
    return rows


def key(item: BufferLayout | TransferFragment) -> tuple[bool, int]:
    """A buffer as a runtime resolves its index: KV buffers and state buffers may be numbered
    apart (the reference runtime's receiver numbers each from 0), so the kind's space counts."""
    return (item.buffer_kind == BufferKind.MAMBA_STATE, item.buffer_index)


def simulate(
    decode_rank: int,
    fragments_by_source: Mapping[int, Sequence[TransferFragment]],
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
    source_group: int,
    replicas: str = "first",
    lost: Mapping[int, set[int]] | None = None,
    senders: dict[tuple[int, int], int] | None = None,
) -> set[int]:
    """Runs the fragments as numpy copies between labelled items and checks every byte the
    decode rank should hold arrived exactly once, and nothing else was written. A row
    fragment copies `rows_per_page` runs a page, run r at offset + r * row stride. Returns the
    prefill ranks that delivered bytes the decode rank should hold. `lost` names, by buffer
    index, logical units no source can send: their bytes must stay unwritten. `senders`, when
    given, is filled with the prefill rank that sent each (buffer index, logical unit)."""
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    _, stage, tp_rank = where(decode, decode_rank)
    by_index = {key(d): (p, d) for p, d in zip(prefill_buffers, decode_buffers)}
    stage_by_index = dict(
        zip((key(b) for b in prefill_buffers), stages_of(prefill, decode, prefill_buffers))
    )
    received: dict[tuple[bool, int], np.ndarray] = {}
    writes: dict[tuple[bool, int], np.ndarray] = {}
    writer: dict[tuple[bool, int], np.ndarray] = {}  # which prefill rank wrote each byte
    for d in decode_buffers:
        received[key(d)] = np.zeros(PAGES * d.item_stride_bytes, dtype=np.int64)
        writes[key(d)] = np.zeros(PAGES * d.item_stride_bytes, dtype=np.int64)
        writer[key(d)] = np.full(PAGES * d.item_stride_bytes, -1, dtype=np.int64)
    for src_rank, fragments in fragments_by_source.items():
        src_group, src_stage, src_tp = where(prefill, src_rank)
        assert src_group == source_group, "a source outside the DP group read from"
        for f in fragments:
            assert (f.src_rank, f.dst_rank) == (src_rank, decode_rank)
            p, d = by_index[key(f)]
            assert f.buffer_kind == p.buffer_kind
            # Both ranks hold the buffer's layer.
            assert stage_by_index[key(f)] == (src_stage, stage), "a stage without it"
            units = dealt_units(p, ptp, src_tp)
            assert units is not None
            src_page = page_labels(p, units, p.item_stride_bytes)
            source = np.tile(src_page, PAGES)
            assert f.bytes_per_page > 0
            run = f.bytes_per_page // f.rows_per_page
            for page, row in itertools.product(range(PAGES), range(f.rows_per_page)):
                s = (
                    page * f.src_page_stride_bytes
                    + f.src_byte_offset
                    + row * f.src_row_stride_bytes
                )
                t = (
                    page * f.dst_page_stride_bytes
                    + f.dst_byte_offset
                    + row * f.dst_row_stride_bytes
                )
                assert s + run <= len(source), "reads past the prefill buffer"
                assert t + run <= len(received[key(d)]), "writes past"
                received[key(d)][t : t + run] = source[s : s + run]
                writes[key(d)][t : t + run] += 1
                writer[key(d)][t : t + run] = src_rank
    delivered: set[int] = set()
    for d in decode_buffers:
        units = dealt_units(d, dtp, tp_rank)
        assert units is not None
        held = stage_by_index[key(d)][1] == stage
        if held and receives(d, dtp, tp_rank, replicas):
            expected = np.tile(page_labels(d, units, d.item_stride_bytes), PAGES)
        else:
            expected = np.zeros(PAGES * d.item_stride_bytes, dtype=np.int64)
        gone_units = sorted((lost or {}).get(d.buffer_index, set()))
        if gone_units:  # a label is 1 + unit * bytes_per_logical_unit + byte of the unit
            unit_of = (expected - 1) // d.bytes_per_logical_unit
            expected[(expected != 0) & np.isin(unit_of, gone_units)] = 0
        got, count = received[key(d)], writes[key(d)]
        wanted = expected != 0
        name = f"decode rank {decode_rank}, buffer {d.buffer_index}"
        assert (count[wanted] == 1).all(), f"{name}: a byte missed or written twice"
        # A whole-item copy may carry padding onto padding; nothing else may land outside.
        stray = ~wanted & (count > 0)
        assert (got[stray] == 0).all() and (count[stray] == 1).all(), f"{name}: stray bytes"
        assert np.array_equal(got, expected), f"{name}: wrong bytes arrived"
        delivered.update(writer[key(d)][wanted].tolist())
        if senders is not None:
            unit_of = (expected[wanted] - 1) // d.bytes_per_logical_unit
            for unit, rank in zip(unit_of.tolist(), writer[key(d)][wanted].tolist()):
                senders[(d.buffer_index, unit)] = rank
    return delivered


def check_plan(
    plan: RankTransferPlan,
    fragments_by_source: Mapping[int, Sequence[TransferFragment]],
    decode_rank: int,
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
    replicas: str = "first",
) -> set[int]:
    """A decode rank's plan (and its `transfer_fragments`, which carry identity plans' whole
    items) against the simulation; returns the prefill ranks that delivered bytes to it (the
    fanouts are checked by the caller, from every rank's deliveries)."""
    group = where(decode, decode_rank)[0] % prefill.dp_size
    assert plan.target_dp_group == group
    assert list(plan.target_prefill_ranks) == sorted(plan.target_prefill_ranks)
    assert plan.required_prefill_response_num == len(plan.target_prefill_ranks)
    if plan.plan_kind == "identity":
        assert plan.fragments_by_prefill_rank == {}
        assert set(fragments_by_source) <= set(plan.target_prefill_ranks)
    else:
        assert dict(plan.fragments_by_prefill_rank) == dict(fragments_by_source)
        assert tuple(plan.fragments_by_prefill_rank) == plan.target_prefill_ranks
        assert all(plan.fragments_by_prefill_rank.values()), "a source with no fragments"
    return simulate(
        decode_rank,
        fragments_by_source,
        prefill,
        decode,
        prefill_buffers,
        decode_buffers,
        group,
        replicas,
    )


def fanout_from_deliveries(
    prefill: ParallelLayout, decode: ParallelLayout, delivered: Mapping[int, set[int]]
) -> dict[int, int]:
    """Each prefill rank's fanout as the bytes moved say it: how many decode ranks of one
    decode DP group it delivered to (0 where no decode group reads it by default)."""
    fanout = dict.fromkeys(range(prefill.world_size), 0)
    for group in range(decode.dp_size):
        counts = dict.fromkeys(range(prefill.world_size), 0)
        for rank, sources in delivered.items():
            if where(decode, rank)[0] == group:
                for source in sources:
                    counts[source] += 1
        fanout.update({rank: n for rank, n in counts.items() if n})
    return fanout


def least_largest_fanout(
    prefill: ParallelLayout,
    decode: ParallelLayout,
    prefill_buffers: Sequence[BufferLayout],
    decode_buffers: Sequence[BufferLayout],
) -> int:
    """The smallest possible largest fanout when every decode rank of a group receives all its
    units directly, by exhaustive search: each decode rank picks, for each set of prefill
    ranks holding a unit it needs, one of them (replicated buffers: the reference's source);
    a prefill rank's fanout is how many decode ranks picked it."""
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    stages = stages_of(prefill, decode, prefill_buffers)
    holders_of = []  # per decode rank of a group: the distinct holder sets it must hit
    for stage, tp_rank in itertools.product(range(decode.pp_size), range(dtp)):
        needs: set[frozenset[int]] = set()  # prefill slots: stage * ptp + TP rank
        for (p, d), (p_stage, d_stage) in zip(zip(prefill_buffers, decode_buffers), stages):
            if d_stage != stage:
                continue
            if p.logical_axis == "replicated":
                needs.add(frozenset({p_stage * ptp + tp_rank * ptp // dtp}))
                continue
            for unit in dealt_units(d, dtp, tp_rank).tolist():  # type: ignore[union-attr]
                needs.add(
                    frozenset(
                        p_stage * ptp + r
                        for r in range(ptp)
                        if unit in set(dealt_units(p, ptp, r).tolist())  # type: ignore[union-attr]
                    )
                )
        choices = {frozenset(pick) for pick in itertools.product(*needs)}
        holders_of.append(sorted(choices, key=len))
    best = [len(holders_of) + 1]

    def search(rank: int, counts: list[int]) -> None:
        if max(counts) >= best[0]:
            return
        if rank == len(holders_of):
            best[0] = max(counts)
            return
        for pick in holders_of[rank]:
            for r in pick:
                counts[r] += 1
            search(rank + 1, counts)
            for r in pick:
                counts[r] -= 1

    search(0, [0] * (prefill.pp_size * ptp))
    return best[0] if dtp else 0
