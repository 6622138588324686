"""Failover: plans around prefill ranks that are gone, against brute force.

For every decode rank the oracle deals each buffer's units to the prefill ranks the way a model
shards them (`oracle.dealt_units`), drops the gone ranks, and calls lost every unit no rank
left in the DP group and stage holds. The failover plan's fragments then run as numpy copies
between labelled pages (`oracle.simulate`): every byte not lost arrives exactly once, from a
rank that holds it, and lost bytes are never written. The largest fanout is compared with an
exhaustive search over every way of choosing a holder for every need. Context parallelism is
checked over (unit, token) pairs with `test_context`'s dealing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from test_context import Side, brute_force
from test_oracle import layouts

from pdplan import (
    BufferKind,
    BufferLayout,
    LostRange,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
)

from oracle import (
    dealt_units,
    fanout_from_deliveries,
    layout_is_valid,
    receives,
    simulate,
    stages_of,
    where,
)

UNIT = 64  # bytes of one head (or of the latent) a page, head-major


def kv(index: int, kind: str, tp: int, heads: int, layer: int | None = None) -> BufferLayout:
    replica = max(1, tp // heads)
    held = heads // (tp // replica)
    return BufferLayout(
        index, BufferKind(kind), "kv_head", heads, 16, UNIT, held * UNIT, replica, layer=layer
    )


def latent(index: int, layer: int | None = None) -> BufferLayout:
    return BufferLayout(
        index, BufferKind.TARGET_K, "replicated", 1, 16, 4 * UNIT, 4 * UNIT, layer=layer
    )


@dataclass(frozen=True)
class Case:
    name: str
    prefill: ParallelLayout
    decode: ParallelLayout
    prefill_buffers: tuple[BufferLayout, ...]
    decode_buffers: tuple[BufferLayout, ...]
    replicas: str = "first"

    def simulate(self, rank: int, fragments: Any, group: int, **checks: Any) -> set[int]:
        """`oracle.simulate` of decode rank `rank` reading `fragments` from prefill DP group
        `group` of this case."""
        layouts = (self.prefill, self.decode, self.prefill_buffers, self.decode_buffers)
        return simulate(rank, fragments, *layouts, group, self.replicas, **checks)

    def planner(self) -> PDTransferPlanner:
        return PDTransferPlanner(
            prefill_layout=self.prefill,
            decode_layout=self.decode,
            prefill_buffers=self.prefill_buffers,
            decode_buffers=self.decode_buffers,
            decode_replicas=self.replicas,  # type: ignore[arg-type]
        )


def gqa(prefill_tp: int, decode_tp: int, heads: int, **kwargs: object) -> Case:
    """K and V of one layer."""
    sides = [
        tuple(kv(i, kind, tp, heads) for i, kind in enumerate(("target_k", "target_v")))
        for tp in (prefill_tp, decode_tp)
    ]
    return Case(
        f"gqa_{heads}_heads_tp{prefill_tp}_to_tp{decode_tp}",
        ParallelLayout("prefill", prefill_tp),
        ParallelLayout("decode", decode_tp),
        *sides,
        **kwargs,  # type: ignore[arg-type]
    )


MLA_8_TO_2 = Case(
    "mla_tp8_to_tp2",
    ParallelLayout("prefill", 8),
    ParallelLayout("decode", 2),
    (latent(0), latent(1)),
    (latent(0), latent(1)),
)
GQA_16_TO_4 = gqa(16, 4, 8)  # replica groups {0, 1}, {2, 3}, ... of the 8 heads
PLAIN_4_TO_2 = gqa(4, 2, 8)
# Prefill TP 4 over 2 heads (replica groups {0, 1}, {2, 3}) in 2 stages of 2 layers each,
# decode TP 2 in one stage: a gone rank touches only its stage's layers.
PP = Case(
    "pp2_gqa_2_heads_tp4_to_pp1_tp2",
    ParallelLayout("prefill", 8, pp_size=2),
    ParallelLayout("decode", 2),
    tuple(kv(layer, "target_k", 4, 2, layer) for layer in range(4)),
    tuple(kv(layer, "target_k", 2, 2, layer) for layer in range(4)),
)
DP = Case(
    "dp2_mla_tp4_to_dp2_tp2",
    ParallelLayout("prefill", 8, dp_size=2),
    ParallelLayout("decode", 4, dp_size=2),
    (latent(0),),
    (latent(0),),
)
ALL = gqa(4, 8, 2, replicas="all")  # 2 heads: prefill replica groups of 2, decode of 4
MIXED = Case(
    "mla_and_gqa_tp8_to_tp2",
    ParallelLayout("prefill", 8),
    ParallelLayout("decode", 2),
    (latent(0), kv(1, "target_k", 8, 4), kv(2, "target_v", 8, 4)),
    (latent(0), kv(1, "target_k", 2, 4), kv(2, "target_v", 2, 4)),
)


def needed_units(
    case: Case, decode_rank: int, gone: Iterable[int]
) -> tuple[dict[int, dict[int, frozenset[int]]], int]:
    """For each buffer the decode rank receives, each unit it needs and the available prefill
    ranks (of the DP group it reads, at the buffer's stage) holding it; and that DP group."""
    prefill, decode = case.prefill, case.decode
    ptp, dtp = prefill.tp_size_per_dp, decode.tp_size_per_dp
    group, stage, tp_rank = where(decode, decode_rank)
    source_group = group % prefill.dp_size
    gone = set(gone)
    stages = stages_of(prefill, decode, case.prefill_buffers)
    out: dict[int, dict[int, frozenset[int]]] = {}
    for p, d, (p_stage, d_stage) in zip(case.prefill_buffers, case.decode_buffers, stages):
        if d_stage != stage or not receives(d, dtp, tp_rank, case.replicas):
            continue
        ranks = [source_group * prefill.pp_size * ptp + p_stage * ptp + r for r in range(ptp)]
        out[d.buffer_index] = {
            unit: frozenset(
                rank
                for rank in ranks
                if rank not in gone
                and unit in dealt_units(p, ptp, where(prefill, rank)[2]).tolist()  # type: ignore[union-attr]
            )
            for unit in dealt_units(d, dtp, tp_rank).tolist()  # type: ignore[union-attr]
        }
    return out, source_group


def lost_by_brute_force(case: Case, decode_rank: int, gone: Iterable[int]) -> set[tuple[int, int]]:
    needs, _ = needed_units(case, decode_rank, gone)
    return {(b, u) for b, units in needs.items() for u, holders in units.items() if not holders}


def bare(ranges: Sequence[LostRange]) -> list[LostRange]:
    """Ranges without their kind (check_failover holds every kind to the buffers')."""
    return [r._replace(buffer_kind=None) for r in ranges]


def expanded(ranges: Sequence[LostRange]) -> set[tuple[int, int]]:
    return {(r.buffer_index, u) for r in ranges for u in range(r.unit_start, r.unit_end)}


def least_largest_fanout(case: Case, gone: set[int]) -> int:
    """The smallest largest fanout over every choice, by every decode rank of each group, of
    one available holder for each unit it needs (a prefill rank's fanout: how many decode
    ranks of one group chose it)."""

    def picks(rank: int) -> list[frozenset[int]]:
        needs, _ = needed_units(case, rank, gone)
        sets = {h for units in needs.values() for h in units.values() if h}
        return sorted({frozenset(p) for p in itertools.product(*sets)}, key=len)

    return least_over_groups(case, picks)


def least_over_groups(case: Case, picks: Callable[[int], list[frozenset[int]]]) -> int:
    """The largest, over the decode DP groups, of the least largest fanout when each decode
    rank of the group reads one of its `picks(rank)`."""
    per_group = case.decode.world_size // case.decode.dp_size
    return max(
        least_largest([picks(rank) for rank in range(g * per_group, (g + 1) * per_group)])
        for g in range(case.decode.dp_size)
    )


def least_largest(picks: list[list[frozenset[int]]]) -> int:
    """Exhaustive search with pruning: each decode rank takes one of its `picks` (a set of
    prefill ranks it reads); the least possible largest count of readers of a prefill rank."""
    best = len(picks) + 1
    counts: dict[int, int] = {}

    def search(at: int) -> None:
        nonlocal best
        if max(counts.values(), default=0) >= best:
            return
        if at == len(picks):
            best = max(counts.values(), default=0)
            return
        for pick in picks[at]:
            for r in pick:
                counts[r] = counts.get(r, 0) + 1
            search(at + 1)
            for r in pick:
                counts[r] -= 1

    search(0)
    return best


def least_largest_keeping(case: Case, gone: set[int]) -> int:
    """The smallest largest fanout when every byte the planner of every rank reads from a rank
    still up stays with it (who sent what: the oracle's simulation of that planner's plans),
    over every choice of an available holder for each unit a gone rank sent."""
    planner = case.planner()

    def picks(rank: int) -> list[frozenset[int]]:
        needs, source_group = needed_units(case, rank, gone)
        senders: dict[tuple[int, int], int] = {}
        case.simulate(rank, planner.transfer_fragments(rank), source_group, senders=senders)
        kept = {p for p in senders.values() if p not in gone}
        moved = {needs[b][u] for (b, u), p in senders.items() if p in gone and needs[b][u]}
        # Units a kept source holds could stay with it at no cost; a choice is still free.
        return sorted({frozenset(kept | set(p)) for p in itertools.product(*moved)}, key=len)

    return least_over_groups(case, picks)


def check_failover(
    case: Case,
    gone: Sequence[int],
    least: Callable[[Case, set[int]], int] = least_largest_fanout,
) -> PDTransferPlanner:
    """Every plan of `case` without `gone` against brute force, the largest fanout against
    `least`; returns the failover planner."""
    planner = case.planner()
    failover = planner.without_prefill_ranks(gone)
    assert failover.unavailable_prefill_ranks == frozenset(gone)
    failover.verify()
    delivered, plans = {}, {}
    for d in range(case.decode.world_size):
        plan = failover.plan_for_decode_rank(d)
        fragments = failover.transfer_fragments(d)
        assert not set(plan.target_prefill_ranks) & set(gone), "reads from a gone rank"
        assert not set(plan.notify_prefill_ranks) & set(gone), "notifies a gone rank"
        lost = lost_by_brute_force(case, d, gone)
        assert expanded(failover.lost(d)) == lost, d
        # Each range names its buffer's kind, as the decode side's buffers give it.
        kind_of = {b.buffer_index: b.buffer_kind for b in case.decode_buffers}
        assert all(r.buffer_kind == kind_of[r.buffer_index] for r in failover.lost(d))
        by_buffer: dict[int, set[int]] = {}
        for b, u in lost:
            by_buffer.setdefault(b, set()).add(u)
        _, source_group = needed_units(case, d, gone)
        delivered[d] = case.simulate(d, fragments, source_group, lost=by_buffer)
        # Needs whose holder is up keep it: what the planner of every rank reads from a rank
        # still up, the failover reads from it too (identity plans move whole items instead).
        if planner.plan_for_decode_rank(d).plan_kind == "fragmented":
            for source, sent in planner.transfer_fragments(d).items():
                if source not in gone:
                    assert set(sent) <= set(fragments.get(source, ())), (d, source)
        plans[d] = plan
    fanout = failover.source_fanout
    for plan in plans.values():  # each source waits for the decode ranks its fanout says
        assert plan.required_dst_info_num_by_prefill_rank == {
            rank: fanout[rank] for rank in plan.target_prefill_ranks
        }
    assert fanout == fanout_from_deliveries(case.prefill, case.decode, delivered)
    assert all(fanout[r] == 0 for r in gone)
    assert max(fanout.values()) == least(case, set(gone))
    # The routing table is the plans' pairs: fragments and bytes a page, notify-only rows 0.
    rows = set()
    for d in range(case.decode.world_size):
        plan = failover.plan_for_decode_rank(d)
        for source, sent in failover.transfer_fragments(d).items():
            rows.add((d, source, len(sent), sum(f.bytes_per_page for f in sent)))
        rows |= {(d, source, 0, 0) for source in plan.notify_prefill_ranks}
    table = failover.routing_table()
    assert set(zip(*(column.tolist() for column in table))) == rows
    return failover


@pytest.mark.parametrize("gone", [[0], [5], [0, 4], [1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6]])
def test_mla_reads_the_latent_from_any_rank_left(gone: list[int]) -> None:
    failover = check_failover(MLA_8_TO_2, gone)
    assert all(failover.lost(d) == [] for d in range(2))
    if len(gone) == 7:  # one rank left serves both decode ranks
        assert max(failover.source_fanout.values()) == 2


def test_mla_with_every_rank_gone_loses_everything() -> None:
    failover = check_failover(MLA_8_TO_2, list(range(8)))
    for d in range(2):
        plan = failover.plan_for_decode_rank(d)
        assert plan.target_prefill_ranks == () and plan.fragments_by_prefill_rank == {}
        assert bare(failover.lost(d)) == [LostRange(0, None, 0, 1), LostRange(1, None, 0, 1)]
    assert set(failover.source_fanout.values()) == {0}
    assert failover.routing_table().decode_rank.size == 0


def test_gqa_replica_groups_serve_for_each_other() -> None:
    # Rank 0 gone: its replica, rank 1, sends heads 0 and nothing is lost.
    failover = check_failover(GQA_16_TO_4, [0])
    assert failover.plan_for_decode_rank(0).target_prefill_ranks == (1, 2)
    assert failover.lost(0) == []
    # Both ranks of the group holding head 0 gone: exactly head 0 of K and V is lost.
    failover = check_failover(GQA_16_TO_4, [0, 1])
    assert bare(failover.lost(0)) == [LostRange(0, None, 0, 1), LostRange(1, None, 0, 1)]
    assert all(failover.lost(d) == [] for d in (1, 2, 3))
    # Every pair among the first four replica groups (the others are alike): both of a group,
    # one of each of two groups read by one decode rank, and of groups read by two.
    for gone in itertools.combinations(range(8), 2):
        check_failover(GQA_16_TO_4, list(gone))


def test_plain_tp_loses_the_heads_of_the_gone_rank() -> None:
    # Decode rank 0 holds heads 0..4 from prefill ranks 0 and 1 (two heads each).
    failover = check_failover(PLAIN_4_TO_2, [1])
    assert bare(failover.lost(0)) == [LostRange(0, None, 2, 4), LostRange(1, None, 2, 4)]
    assert failover.lost(1) == []
    assert failover.plan_for_decode_rank(0).target_prefill_ranks == (0,)
    for gone in range(4):
        check_failover(PLAIN_4_TO_2, [gone])


def test_pipeline_stages_lose_only_their_layers() -> None:
    # Rank 4 is stage 1's TP rank 0; its replica (5) serves.
    check_failover(PP, [4])
    # Ranks 4 and 5 hold head 0 of layers 2 and 3 only.
    failover = check_failover(PP, [4, 5])
    assert bare(failover.lost(0)) == [LostRange(2, 2, 0, 1), LostRange(3, 3, 0, 1)]
    for gone in itertools.combinations(range(8), 2):
        check_failover(PP, list(gone))


def test_a_gone_rank_of_one_dp_group_changes_nothing_for_the_others() -> None:
    planner = DP.planner()
    failover = check_failover(DP, [4])  # rank 0 of prefill DP group 1
    for d in (0, 1):  # decode DP group 0 reads prefill group 0
        assert failover.plan_for_decode_rank(d) == planner.plan_for_decode_rank(d)
    assert failover.plan_for_decode_rank(2).target_prefill_ranks == (5,)
    # A router sending group 0's decode ranks to group 1 reads around rank 4 too.
    assert failover.plan_for_decode_rank(0, 1).target_prefill_ranks == (5,)
    assert [failover.source_fanout[r] for r in range(4)] == [
        planner.source_fanout[r] for r in range(4)
    ]


def test_decode_replicas_all_spreads_the_readers_of_a_gone_rank() -> None:
    for gone in ([0], [1], [0, 2], [0, 1]):
        failover = check_failover(ALL, gone)
    # Ranks 0 and 1 hold head 0: decode ranks 0..3 (its replica group) lose it.
    head_0 = [LostRange(0, None, 0, 1), LostRange(1, None, 0, 1)]
    assert all(bare(failover.lost(d)) == head_0 for d in range(4))
    assert failover.idle_decode_ranks == 0


def test_mixed_buffers_prefer_a_rank_already_read() -> None:
    for gone in ([0], [1], [4], [0, 1], [0, 4]):
        check_failover(MIXED, gone)


@pytest.mark.parametrize(
    ("prefill", "decode", "axis", "heads", "gone"),
    [
        # Replicated prefill CP: every CP rank holds every token.
        (Side(1, cp=2, kv="replicated"), Side(2), "kv_head", 8, [0]),
        (Side(1, cp=2, kv="replicated"), Side(2), "kv_head", 8, [0, 1]),
        (Side(2, cp=3, kv="replicated"), Side(4), "kv_head", 4, [1, 2]),
        (Side(2, cp=3, kv="replicated"), Side(4), "kv_head", 4, [0, 2, 4]),
        # Sharded CP: a gone CP rank's tokens are lost, by share.
        (Side(2, cp=2, interleave=16), Side(2), "kv_head", 8, [2]),
        # DCP inside TP (MLA): the other ranks of the share serve.
        (Side(8, dcp=2), Side(2), "replicated", 1, [0]),
        (Side(8, dcp=2), Side(2), "replicated", 1, [0, 2, 4, 6]),
    ],
)
def test_context_parallel_failover_matches_brute_force(
    prefill: Side, decode: Side, axis: str, heads: int, gone: list[int]
) -> None:
    """Over (unit, token) pairs: the sources hold, together, exactly what the decode rank
    needs minus what no available rank holds, and `lost` names those pairs by CP share."""
    planner = PDTransferPlanner(
        prefill_layout=prefill.layout("prefill"),
        decode_layout=decode.layout("decode"),
        prefill_buffers=[prefill.buffer(axis, heads)],
        decode_buffers=[decode.buffer(axis, heads)],
    ).without_prefill_ranks(gone)
    planner.verify()
    for n in (1, 7, 33, 150):
        planner.verify(num_tokens=n)
        needs, held = brute_force(prefill, decode, axis, heads, n, "first")
        readers = dict.fromkeys(held, 0)
        fanouts: dict[int, int] = {}
        for d, needed in needs.items():
            plan = planner.plan_for_decode_rank(d, num_tokens=n)
            group = d // (decode.cp * decode.tp) % prefill.dp
            sources = set(plan.target_prefill_ranks)
            assert not sources & set(gone)
            available = {p for p, (g, _) in held.items() if g == group and p not in gone}
            reachable = needed & set().union(*(held[p][1] for p in available))
            assert set().union(*(held[p][1] & needed for p in sources)) == reachable, (d, n)
            # `lost` names the rest: its units, of the tokens its share's ranks hold.
            named = set()
            for r in planner.lost(d, num_tokens=n):
                of_share = [p for p in held if r.cp_share in (None, share_of(prefill, p))]
                tokens = {t for p in of_share for _, t in held[p][1]}
                named |= set(itertools.product(range(r.unit_start, r.unit_end), tokens))
            assert named & needed == needed - reachable, (d, n)
            for p in sources:
                readers[p] += 1
                fanouts[p] = plan.required_dst_info_num_for_prefill_rank(p)
        assert fanouts == {p: readers[p] for p in fanouts}


def share_of(side: Side, rank: int) -> int | None:
    """Which token share a prefill rank holds, as `Side.holds` deals them (None: every
    token)."""
    cp_rank, tp_rank = divmod(rank % (side.cp * side.tp), side.tp)
    if side.dcp > 1:
        return tp_rank % side.dcp
    return cp_rank if side.cp > 1 and side.kv == "sharded" else None


def test_equal_sets_give_equal_plans_in_any_order_or_steps() -> None:
    planner = GQA_16_TO_4.planner()
    ways = [
        planner.without_prefill_ranks([6, 0, 3]),
        planner.without_prefill_ranks({0, 3, 6}),
        planner.without_prefill_ranks([3]).without_prefill_ranks((6, 0)),
        planner.without_prefill_ranks(iter([0, 6])).without_prefill_ranks([3, 6]),
    ]
    first = ways[0]
    for other in ways[1:]:
        assert other.unavailable_prefill_ranks == frozenset({0, 3, 6})
        assert other.fingerprint == first.fingerprint != planner.fingerprint
        assert other.source_fanout == first.source_fanout
        for d in range(4):
            assert other.plan_for_decode_rank(d) == first.plan_for_decode_rank(d)
            assert other.lost(d) == first.lost(d)
        assert all((a == b).all() for a, b in zip(other.routing_table(), first.routing_table()))


def test_no_ranks_plans_exactly_as_the_planner() -> None:
    for case in (MLA_8_TO_2, GQA_16_TO_4, PLAIN_4_TO_2, PP, DP, ALL, gqa(4, 4, 8)):
        planner = case.planner()
        same = planner.without_prefill_ranks([])
        assert same.unavailable_prefill_ranks == frozenset()
        assert same.fingerprint == planner.fingerprint
        assert same.source_fanout == planner.source_fanout
        for d in range(case.decode.world_size):
            assert same.plan_for_decode_rank(d) == planner.plan_for_decode_rank(d)
            assert same.lost(d) == planner.lost(d) == []


def test_identity_layouts_read_unit_by_unit_around_a_gone_rank() -> None:
    """Same TP without replicas is an identity plan; with a rank gone, the group's plans are
    fragmented and the gone rank's heads lost (nobody else holds them)."""
    case = gqa(4, 4, 8)
    assert case.planner().plan_for_decode_rank(0).plan_kind == "identity"
    failover = check_failover(case, [2])
    assert failover.plan_for_decode_rank(0).plan_kind == "fragmented"
    assert bare(failover.lost(2)) == [LostRange(0, None, 4, 6), LostRange(1, None, 4, 6)]
    assert failover.plan_for_decode_rank(2).target_prefill_ranks == ()


def test_a_prepared_transfer_follows_the_failover() -> None:
    from pdplan import PreparedTransfer

    failover = MLA_8_TO_2.planner().without_prefill_ranks([0])
    bases = ([1 << 20] * 2, [2 << 20] * 2)
    with pytest.raises(UnsupportedPDLayoutError, match="prefill rank 0 sends nothing"):
        PreparedTransfer.from_layouts(failover, 0, 0, *bases)
    prepared = PreparedTransfer.from_layouts(failover, 0, 1, *bases)
    assert prepared.fragments == failover.transfer_fragments(0)[1]


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        ([8], "unavailable prefill rank 8 is out of range: the prefill world has 8 ranks"),
        ([-1], "unavailable prefill rank -1 is out of range"),
        ([2, 2], "unavailable prefill rank 2 is named twice"),
        ([1.0], "an unavailable prefill rank must be an int, got float"),
        ([True], "an unavailable prefill rank must be an int, got bool"),
        (["3"], "an unavailable prefill rank must be an int, got str"),
        (3, "ranks must be an iterable of ints, got int"),
        ("3", "ranks must be an iterable of ints, got str"),
        (itertools.count(), "names more than the 8 prefill ranks there are"),
    ],
)
def test_bad_ranks_are_refused_clearly(ranks: object, message: str) -> None:
    planner = MLA_8_TO_2.planner()
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        planner.without_prefill_ranks(ranks)  # type: ignore[arg-type]
    assert planner.unavailable_prefill_ranks == frozenset()


def test_lost_checks_its_arguments() -> None:
    failover = MLA_8_TO_2.planner().without_prefill_ranks([0])
    with pytest.raises(UnsupportedPDLayoutError, match="decode_rank=2 is out of range"):
        failover.lost(2)
    with pytest.raises(UnsupportedPDLayoutError, match="prefill_dp_group=1 is out of range"):
        failover.lost(0, 1)
    with pytest.raises(UnsupportedPDLayoutError, match="num_tokens=-1"):
        failover.lost(0, num_tokens=-1)


@settings(max_examples=200, deadline=None)
@given(layouts(max_tp=8), st.data())
def test_failover_passes_the_oracle_on_random_layouts(
    layout: tuple[Any, ...], data: st.DataObject
) -> None:
    """Random deployments (TP, DP, PP, replica groups, parts, token-major pages) with random
    ranks gone: every plan through the simulation, lost units by brute force, and the largest
    fanout the least that keeping every healthy read allows."""
    prefill, decode, prefill_buffers, decode_buffers = layout
    assume(layout_is_valid(*layout))
    assume(
        all(
            d.logical_axis != "replicated"
            or d.item_stride_bytes >= d.logical_size * d.bytes_per_logical_unit
            for d in decode_buffers
        )
    )
    replicas = data.draw(st.sampled_from(["first", "all"]))
    case = Case("random", prefill, decode, prefill_buffers, decode_buffers, replicas)
    try:
        case.planner()
    except UnsupportedPDLayoutError:
        assume(False)
    ranks = st.integers(0, prefill.world_size - 1)
    gone = data.draw(st.sets(ranks, min_size=1, max_size=min(4, prefill.world_size)))
    event(f"{len(gone)} gone")
    check_failover(case, sorted(gone), least_largest_keeping)
