"""Context parallelism: token dealing against the splits' definitions, slot maps against vLLM's
DCP slot mapping, routing and fanouts against brute force over (unit, token) pairs, and the
refusals. The oracles here are written from the issue's definitions, not from the planner."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
    token_owners,
    token_slots,
)

SPLITS = [
    (2, "interleave", 1, 16),
    (4, "interleave", 3, 16),
    (8, "interleave", 16, 16),
    (3, "contiguous", 1, 4),
    (4, "contiguous", 1, 16),
    (2, "zigzag", 1, 16),
    (3, "zigzag", 1, 16),
]
LENGTHS = [1, 2, 5, 16, 17, 47, 100, 129]
# Two CP ranks of TP 1 (a page table of one 16-token page holds 16 tokens).
CP2 = ParallelLayout("prefill", 2, cp_size=2)


def owners_by_definition(n: int, cp: int, split: str, interleave: int, page: int) -> list[int]:
    """The CP rank of every token, written out as the issue defines the splits."""
    if split == "interleave":
        return [(t // interleave) % cp for t in range(n)]
    if split == "contiguous":
        blocks = -(-n // page)
        out: list[int] = []
        for rank in range(cp):
            out += [rank] * ((blocks // cp + (rank < blocks % cp)) * page)
        return out[:n]
    chunk = -(-n // (2 * cp))
    out = [0] * n
    for rank in range(cp):
        for j in (rank, 2 * cp - 1 - rank):
            for t in range(j * chunk, min((j + 1) * chunk, n)):
                out[t] = rank
    return out


@pytest.mark.parametrize(("cp", "split", "interleave", "page"), SPLITS)
def test_token_owners_follow_the_definitions(
    cp: int, split: str, interleave: int, page: int
) -> None:
    for n in LENGTHS:
        owners = token_owners(n, cp, cp_split=split, interleave=interleave, page_size=page)  # type: ignore[arg-type]
        assert owners.dtype == np.int64
        assert owners.tolist() == owners_by_definition(n, cp, split, interleave, page), n


@pytest.mark.parametrize(("cp", "split", "interleave", "page"), SPLITS)
def test_each_rank_stores_its_tokens_in_order_in_its_own_pages(
    cp: int, split: str, interleave: int, page: int
) -> None:
    """A rank's tokens, in order, are its local tokens 0, 1, ...: local token i sits at slot
    i % page of page table[i // page]. Over all ranks, every token has exactly one slot."""
    rng = np.random.default_rng(cp * 31 + page)
    for n in LENGTHS:
        owners = np.array(owners_by_definition(n, cp, split, interleave, page))
        seen = np.zeros(n, dtype=int)
        for rank in range(cp):
            held = np.flatnonzero(owners == rank)
            table = rng.permutation(64)[: -(-len(held) // page)]
            layout = ParallelLayout(
                "prefill",
                cp,
                cp_size=cp,
                cp_split=split,  # type: ignore[arg-type]
                cp_interleave=interleave,
            )
            assert layout.token_share(rank) == (cp, rank, split, interleave)
            slots = token_slots(table, page, n, layout=layout, rank=rank)
            assert (slots[owners != rank] == -1).all()
            local = np.arange(len(held))
            assert slots[held].tolist() == (table[local // page] * page + local % page).tolist()
            seen[held] += 1
        assert (seen == 1).all()


def vllm_dcp_slots(
    table: np.ndarray, block_size: int, n: int, dcp: int, rank: int, interleave: int
) -> np.ndarray:
    """vLLM's DCP slot mapping (v1 BlockTable.compute_slot_mapping): a virtual block of
    block_size * dcp tokens per block-table entry, dealt over the DCP ranks by interleave."""
    positions = np.arange(n)
    virtual = block_size * dcp
    numbers = table[positions // virtual]
    offsets = positions % virtual
    mask = offsets // interleave % dcp == rank
    local = offsets // (dcp * interleave) * interleave + offsets % interleave
    return np.where(mask, numbers * block_size + local, -1)


@pytest.mark.parametrize(("dcp", "interleave", "block"), [(8, 1, 16), (8, 16, 16), (4, 4, 64)])
def test_dcp_slot_maps_equal_vllms_virtual_block_tables(
    dcp: int, interleave: int, block: int
) -> None:
    rng = np.random.default_rng(dcp + interleave)
    for n in (1, 100, 1000, 4097):
        for rank in range(dcp):
            table = rng.permutation(512)[: -(-n // (block * dcp))]
            layout = ParallelLayout("decode", dcp, dcp_size=dcp, cp_interleave=interleave)
            ours = token_slots(table, block, n, layout=layout, rank=rank)
            assert ours.tolist() == vllm_dcp_slots(table, block, n, dcp, rank, interleave).tolist()


@dataclass(frozen=True)
class Side:
    """One side of a brute-force case."""

    tp: int
    cp: int = 1
    dcp: int = 1
    kv: str = "sharded"
    split: str = "interleave"
    interleave: int = 1
    dp: int = 1
    page: int = 16

    def layout(self, role: str) -> ParallelLayout:
        return ParallelLayout(
            role,  # type: ignore[arg-type]
            self.dp * self.cp * self.tp,
            self.dp,
            cp_size=self.cp,
            dcp_size=self.dcp,
            cp_kv=self.kv,  # type: ignore[arg-type]
            cp_split=self.split,  # type: ignore[arg-type]
            cp_interleave=self.interleave,
        )

    def buffer(self, axis: str, heads: int) -> BufferLayout:
        if axis == "replicated":
            return BufferLayout(
                0, BufferKind.TARGET_K, "replicated", 1, self.page, 64 * self.page, 64 * self.page
            )
        replica = max(1, self.tp // heads)
        units = heads // (self.tp // replica)
        unit = 32 * self.page
        return BufferLayout(
            0, BufferKind.TARGET_K, "kv_head", heads, self.page, unit, units * unit, replica
        )

    def holds(
        self, rank: int, axis: str, heads: int, n: int
    ) -> tuple[int, frozenset[tuple[int, int]]]:
        """(DP group, the (unit, token) pairs) rank holds, from the definitions."""
        group, rest = divmod(rank, self.cp * self.tp)
        cp_rank, tp_rank = divmod(rest, self.tp)
        if axis == "replicated":
            units = [0]
        else:
            replica = max(1, self.tp // heads)
            shards = self.tp // replica
            shard = tp_rank // replica
            units = list(range(shard * heads // shards, (shard + 1) * heads // shards))
        if self.dcp > 1:
            ways, index = self.dcp, tp_rank % self.dcp
        elif self.cp > 1 and self.kv == "sharded":
            ways, index = self.cp, cp_rank
        else:
            ways, index = 1, 0
        owners = (
            owners_by_definition(n, ways, self.split, self.interleave, self.page)
            if ways > 1
            else [0] * n
        )
        tokens = [t for t in range(n) if owners[t] == index]
        return group, frozenset(itertools.product(units, tokens))


CASES = [
    # (prefill, decode, axis, KV heads)
    (Side(8), Side(8, dcp=8), "replicated", 1),
    (Side(8), Side(8, dcp=8, interleave=16), "replicated", 1),
    (Side(8, dcp=8), Side(4, dcp=4), "replicated", 1),
    (Side(8, dcp=2), Side(2), "replicated", 1),
    (Side(2), Side(4, dcp=2), "kv_head", 2),
    (Side(4, dcp=2), Side(8, dcp=4), "kv_head", 2),
    (Side(2, cp=2, interleave=16), Side(2), "kv_head", 8),
    (Side(2, cp=2, split="zigzag"), Side(2), "kv_head", 8),
    (Side(2, cp=4, split="contiguous"), Side(4, dcp=2), "kv_head", 2),
    (Side(1, cp=4, split="contiguous"), Side(2, dcp=2, page=64), "replicated", 1),
    (Side(1, cp=2, kv="replicated"), Side(2), "kv_head", 8),
    (Side(2, cp=3, kv="replicated"), Side(4), "kv_head", 4),
    (Side(1, cp=2, interleave=4, dp=2), Side(2, dcp=2, dp=2), "replicated", 1),
    (Side(2), Side(2, cp=2, interleave=16), "kv_head", 8),
    (Side(4, cp=2, split="zigzag"), Side(2, cp=3, interleave=5), "kv_head", 4),
]


def brute_force(
    prefill: Side, decode: Side, axis: str, heads: int, n: int, replicas: str
) -> tuple[
    dict[int, frozenset[tuple[int, int]]], dict[int, tuple[int, frozenset[tuple[int, int]]]]
]:
    """What each decode rank must receive (under "first", a rank holding exactly what a lower
    rank of its DP group holds receives nothing), and what each prefill rank holds."""
    held = {
        r: prefill.holds(r, axis, heads, n) for r in range(prefill.dp * prefill.cp * prefill.tp)
    }
    needs: dict[int, frozenset[tuple[int, int]]] = {}
    seen: set[tuple[int, frozenset[tuple[int, int]]]] = set()
    for d in range(decode.dp * decode.cp * decode.tp):
        group, pairs = decode.holds(d, axis, heads, n)
        first = (group, pairs) not in seen
        seen.add((group, pairs))
        needs[d] = pairs if (first or replicas == "all" or axis == "replicated") else frozenset()
    return needs, held


@pytest.mark.parametrize(("prefill", "decode", "axis", "heads"), CASES)
@pytest.mark.parametrize("replicas", ["first", "all"])
def test_sources_and_fanouts_match_brute_force(
    prefill: Side, decode: Side, axis: str, heads: int, replicas: str
) -> None:
    planner = PDTransferPlanner(
        prefill_layout=prefill.layout("prefill"),
        decode_layout=decode.layout("decode"),
        prefill_buffers=[prefill.buffer(axis, heads)],
        decode_buffers=[decode.buffer(axis, heads)],
        decode_replicas=replicas,  # type: ignore[arg-type]
    )
    assert planner.token_maps
    planner.verify()
    for n in (1, 7, 33, 150):
        planner.verify(num_tokens=n)
        needs, held = brute_force(prefill, decode, axis, heads, n, replicas)
        readers = dict.fromkeys(held, 0)
        fanouts: dict[int, int] = {}
        for d, needed in needs.items():
            plan = planner.plan_for_decode_rank(d, num_tokens=n)
            group = d // (decode.cp * decode.tp) % prefill.dp
            sources = set(plan.target_prefill_ranks)
            assert plan.required_prefill_response_num == len(sources)
            # Without a length, a plan lists at least the sources of every length.
            assert sources <= set(planner.plan_for_decode_rank(d).target_prefill_ranks)
            # Every source holds something the decode rank needs, and together they hold it all.
            useful = {p for p, (g, pairs) in held.items() if g == group and pairs & needed}
            assert sources <= useful, (d, n)
            assert set().union(*(held[p][1] & needed for p in sources)) == needed, (d, n)
            if prefill.kv == "sharded" and (axis == "kv_head" and prefill.tp <= heads):
                assert sources == useful, (d, n)  # nobody else holds those pairs
            # Who must hear "done": every rank of the group holding some of what this decode
            # rank holds (needed or not: a replica that reads nothing), that it reads nothing
            # from.
            _, mine = decode.holds(d, axis, heads, n)
            holders = {p for p, (g, pairs) in held.items() if g == group and pairs & mine}
            assert set(plan.notify_prefill_ranks) == holders - sources, (d, n)
            assert list(plan.notify_prefill_ranks) == sorted(plan.notify_prefill_ranks)
            for p in sources:
                readers[p] += 1
                fanouts[p] = plan.required_dst_info_num_for_prefill_rank(p)
        for p, count in fanouts.items():
            assert count == readers[p], (p, n)


def test_decode_ranks_share_tokens_only_within_their_residue() -> None:
    """vllm-project/vllm#50611: prefill DCP 8 and decode DCP 4 at interleave 1 (MLA at TP 8
    and 4): decode rank d reads only from prefill ranks r = d mod 4, and nobody waits for more."""
    layout = ParallelLayout("prefill", 8, dcp_size=8)
    mla = Side(8).buffer("replicated", 1)
    planner = PDTransferPlanner(
        prefill_layout=layout,
        decode_layout=ParallelLayout("decode", 4, dcp_size=4),
        prefill_buffers=[mla],
        decode_buffers=[mla],
    )
    for d in range(4):
        assert planner.plan_for_decode_rank(d).target_prefill_ranks == (d, d + 4)
    assert set(planner.source_fanout.values()) == {1}


def test_replicated_prefill_cp_spreads_readers_over_the_replicas() -> None:
    """Prefill TP 1 x CP 2 holding every token: two decode ranks read from two replicas."""
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2, cp_size=2, cp_kv="replicated"),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=[Side(1).buffer("kv_head", 8)],
        decode_buffers=[Side(2).buffer("kv_head", 8)],
    )
    assert planner.source_fanout == {0: 1, 1: 1}
    assert {planner.plan_for_decode_rank(d).target_prefill_ranks for d in range(2)} == {
        (0,),
        (1,),
    }


def test_length_dependent_splits_list_every_rank_that_may_share_tokens() -> None:
    """Without a length, a zigzag prefill lists every CP rank; a short request needs fewer."""
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 4, cp_size=4, cp_split="zigzag"),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=[Side(1).buffer("kv_head", 8)],
        decode_buffers=[Side(1).buffer("kv_head", 8)],
    )
    assert planner.plan_for_decode_rank(0).target_prefill_ranks == (0, 1, 2, 3)
    # 3 tokens in chunks of one: ranks 0, 1, 2 hold one each, rank 3 none.
    short = planner.plan_for_decode_rank(0, num_tokens=3)
    assert short.target_prefill_ranks == (0, 1, 2)
    assert short.required_dst_info_num_by_prefill_rank == {0: 1, 1: 1, 2: 1}
    assert planner.plan_for_decode_rank(0, num_tokens=0).target_prefill_ranks == ()


def kv(tp: int, heads: int = 8, page: int = 16, replica: int = 1) -> BufferLayout:
    unit = 32 * page
    return BufferLayout(
        0,
        BufferKind.TARGET_K,
        "kv_head",
        heads,
        page,
        unit,
        heads // (tp // replica) * unit,
        replica,
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ParallelLayout("prefill", 8, cp_size=2, dcp_size=2), "one way only"),
        (lambda: ParallelLayout("decode", 8, dcp_size=3), "divide the decode side's TP size"),
        (
            lambda: ParallelLayout("decode", 8, cp_size=3),
            "divisible by dp_size x pp_size x cp_size",
        ),
        (lambda: ParallelLayout("decode", 8, cp_size=0), "cp_size must be positive"),
        (
            lambda: ParallelLayout("decode", 8, dcp_size=2, cp_kv="replicated"),
            "DCP ranks always hold",
        ),
        (lambda: ParallelLayout("decode", 8, cp_size=2, cp_split="ring"), "cp_split must be"),  # type: ignore[arg-type]
        (lambda: ParallelLayout("decode", 8, cp_size=2, cp_kv="gathered"), "cp_kv must be"),  # type: ignore[arg-type]
        (lambda: ParallelLayout("decode", 8, cp_size=2, cp_interleave=0), "cp_interleave=0"),
        (
            lambda: PDTransferPlanner(
                prefill_layout=ParallelLayout("prefill", 2),
                decode_layout=ParallelLayout("decode", 2, dcp_size=2),
                prefill_buffers=[kv(2)],
                decode_buffers=[kv(2)],
            ),
            "must divide the decode side's replica group",
        ),
        (
            lambda: PDTransferPlanner(
                prefill_layout=ParallelLayout("prefill", 2, cp_size=2),
                decode_layout=ParallelLayout("decode", 1),
                prefill_buffers=[
                    BufferLayout(0, BufferKind.MAMBA_STATE, "state_channel", 8, 1, 64, 512)
                ],
                decode_buffers=[
                    BufferLayout(0, BufferKind.MAMBA_STATE, "state_channel", 8, 1, 64, 512)
                ],
            ),
            "state with CP is not supported",
        ),
        (
            lambda: PDTransferPlanner(
                prefill_layout=ParallelLayout("prefill", 2, cp_size=2, cp_split="contiguous"),
                decode_layout=ParallelLayout("decode", 1),
                prefill_buffers=[
                    kv(1),
                    BufferLayout(1, BufferKind.DRAFT_K, "kv_head", 8, 32, 32 * 32, 8 * 32 * 32),
                ],
                decode_buffers=[
                    kv(1),
                    BufferLayout(1, BufferKind.DRAFT_K, "kv_head", 8, 32, 32 * 32, 8 * 32 * 32),
                ],
            ),
            "pages of different sizes",
        ),
        (lambda: token_slots([0], 16, 16, layout=CP2, rank=2), "rank=2 is out of range"),
        (lambda: token_slots([0], 16, 16, layout=CP2), "layout= and rank= together"),
        (lambda: token_slots([0], 16, 16, rank=0), "layout= and rank= together"),
        (lambda: token_owners(16, 0), "cp_size=0 must be between 1"),
        (lambda: token_owners(16, 2, interleave=0), "cp_interleave=0"),
        (lambda: token_owners(16, 2, cp_split="ring"), "cp_split must be"),  # type: ignore[arg-type]
        (lambda: token_slots([0], 16, 40, layout=CP2, rank=0), "page table has 1 entries"),
        (lambda: token_owners(-1, 2), "num_tokens"),
        (lambda: token_owners(1 << 29, 2), "above the limit"),
    ],
)
def test_refusals_say_what_to_change(make: object, message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        make()  # type: ignore[operator]


def test_request_lengths_are_checked() -> None:
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2, cp_size=2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=[kv(1)],
        decode_buffers=[kv(1)],
    )
    for bad in (-1, pdplan.limits.MAX_TOKENS + 1):
        with pytest.raises(UnsupportedPDLayoutError, match="num_tokens"):
            planner.plan_for_decode_rank(0, num_tokens=bad)
    with pytest.raises(UnsupportedPDLayoutError, match="num_tokens"):
        planner.transfer_fragments(0, num_tokens="7")  # type: ignore[arg-type]


def test_layouts_without_cp_plan_as_before() -> None:
    """num_tokens changes nothing without CP, and CP fields keep their defaults."""
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=[kv(8)],
        decode_buffers=[kv(2)],
    )
    assert not planner.token_maps
    assert planner.plan_for_decode_rank(1) == planner.plan_for_decode_rank(1, num_tokens=3)
    layout = ParallelLayout("prefill", 8)
    assert (layout.cp_size, layout.dcp_size, layout.cp_kv, layout.cp_split) == (
        1,
        1,
        "sharded",
        "interleave",
    )


def test_a_rank_share_comes_from_its_layout() -> None:
    """DCP ranks are TP ranks mod dcp_size inside each DP group; CP ranks their own axis."""
    dcp = ParallelLayout("decode", 16, 2, dcp_size=4, cp_interleave=16)
    for rank in range(16):
        tp_rank = rank % 8
        assert dcp.token_share(rank) == (4, tp_rank % 4, "interleave", 16)
        assert dcp.rank_coordinates(rank) == (rank // 8, 0, 0, tp_rank)
    cp = ParallelLayout("prefill", 8, cp_size=2, cp_split="zigzag")  # TP 4 x CP 2
    assert [cp.token_share(r).cp_rank for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ParallelLayout("prefill", 4).token_share(3) == (1, 0, "interleave", 1)
    # Replicated CP ranks hold every token: one share.
    assert ParallelLayout("prefill", 4, cp_size=2, cp_kv="replicated").token_share(3)[:2] == (1, 0)
    # The slot map of a DCP rank holds exactly the tokens its share's owner says.
    owners = np.array(owners_by_definition(100, 4, "interleave", 16, 16))
    slots = token_slots(np.arange(8), 16, 100, layout=dcp, rank=13)
    assert np.array_equal(slots >= 0, owners == 1)
