"""Staging plans: gather -> transfer -> scatter writes exactly the bytes the direct descriptors
write, and nothing else, checked on real numpy memory; host pack and unpack against a numpy
copy of the gather and scatter arrays; every refusal; the cost model's choices."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tokens import kv

from pdplan import (
    BufferKind,
    CostModel,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StagingPlan,
    TransferDescriptors,
    TransferFragment,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
    token_slots,
)


def memmove_all(d: TransferDescriptors) -> None:
    """The engine, by definition: each descriptor's bytes from src to dst, in order."""
    for src, dst, n in zip(d.src_addrs.tolist(), d.dst_addrs.tolist(), d.lengths.tolist()):
        ctypes.memmove(dst, src, n)


@dataclass
class Pair:
    """Two sides' caches in real memory and the pair's prepared transfer."""

    planner: PDTransferPlanner
    src: list[np.ndarray]
    dst: list[np.ndarray]
    prepared: PreparedTransfer
    fragments: tuple[TransferFragment, ...]

    @property
    def dst_bases(self) -> list[int]:
        return [a.ctypes.data for a in self.dst]

    def fresh_dst(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for a in self.dst:
            a[:] = rng.integers(0, 256, a.nbytes, dtype=np.uint8)

    def decode_side(self) -> PreparedTransfer:
        """What the decode side prepares: its own bases, none of the prefill side's."""
        return PreparedTransfer(
            self.fragments,
            [0] * len(self.src),
            self.dst_bases,
            dst_limits=[a.nbytes for a in self.dst],
        )


def pair(planner: PDTransferPlanner, decode_rank: int, prefill_rank: int, pages: int) -> Pair:
    fragments = planner.transfer_fragments(decode_rank)[prefill_rank]
    rng = np.random.default_rng(prefill_rank)
    src = [
        rng.integers(0, 256, b.item_stride_bytes * pages, dtype=np.uint8)
        for b in planner.prefill_buffers
    ]
    dst = [np.zeros(b.item_stride_bytes * pages, dtype=np.uint8) for b in planner.decode_buffers]
    prepared = PreparedTransfer(
        fragments,
        [a.ctypes.data for a in src],
        [a.ctypes.data for a in dst],
        src_limits=[a.nbytes for a in src],
        dst_limits=[a.nbytes for a in dst],
    )
    return Pair(planner, src, dst, prepared, tuple(fragments))


def planner_for(shape: ModelShape, ptp: int, dtp: int, layout: str) -> PDTransferPlanner:
    prefill, decode = model_buffer_layouts(shape, ptp, dtp, layout)  # type: ignore[arg-type]
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", ptp),
        decode_layout=ParallelLayout("decode", dtp),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )


def kv_planner(
    ptp: int, dtp: int, layout: str, layers: int = 2, head_dim: int = 16
) -> PDTransferPlanner:
    shape = ModelShape(layers=layers, kv_heads=8, head_dim=head_dim, page_size=16)
    return planner_for(shape, ptp, dtp, layout)


NHD_8_TO_2 = kv_planner(8, 2, "NHD")
HND_2_TO_8 = kv_planner(2, 8, "HND")
#: Token-major pages of 16 tokens into pages of 64: only slot maps move these.
TOKENS_4_TO_2 = PDTransferPlanner(
    prefill_layout=ParallelLayout("prefill", 4),
    decode_layout=ParallelLayout("decode", 2),
    prefill_buffers=kv(4, 16, rows=16, token_bytes=64),
    decode_buffers=kv(2, 64, rows=64, token_bytes=64),
)


def staged_through(plan: StagingPlan, p: Pair) -> None:
    """Pack, move the transfer descriptors between two staging arrays, unpack."""
    src_staging = np.zeros(plan.staging_bytes + 7, dtype=np.uint8)
    dst_staging = np.zeros(plan.staging_bytes + 3, dtype=np.uint8)
    plan.pack(src_staging)
    memmove_all(plan.wire_descriptors(src_staging.ctypes.data, dst_staging.ctypes.data))
    plan.unpack(dst_staging)


@settings(max_examples=40, deadline=None)
@given(
    case=st.sampled_from([(NHD_8_TO_2, 1, 6), (HND_2_TO_8, 5, 1), (NHD_8_TO_2, 0, 1)]),
    data=st.data(),
)
def test_staging_writes_exactly_what_the_direct_descriptors_write(
    case: tuple[PDTransferPlanner, int, int], data: st.DataObject
) -> None:
    planner, decode_rank, prefill_rank = case
    p = pair(planner, decode_rank, prefill_rank, pages=12)
    n = data.draw(st.integers(0, 12))
    src_pages = data.draw(st.permutations(range(12)))[:n]
    dst_pages = data.draw(st.permutations(range(12)))[:n]
    chunk = data.draw(st.one_of(st.none(), st.integers(1, 5000)))
    p.fresh_dst(1)
    memmove_all(p.prepared.descriptors(src_pages, dst_pages))
    want = [a.copy() for a in p.dst]
    p.fresh_dst(1)  # the same bytes before: what staging leaves alone must stay as it was
    plan = p.prepared.staging_plan(src_pages, dst_pages, chunk_bytes=chunk)
    staged_through(plan, p)
    for got, expected in zip(p.dst, want):
        assert np.array_equal(got, expected)
    direct = p.prepared.descriptors(src_pages, dst_pages)
    assert plan.staging_bytes == direct.total_bytes
    assert plan.num_direct_descriptors == direct.num_descriptors
    if chunk is not None and plan.staging_bytes:
        assert plan.num_wire_descriptors == -(-plan.staging_bytes // chunk)


def check_partition(offsets: np.ndarray, lengths: np.ndarray, total: int) -> None:
    """Offsets from 0, in order, with no gap or overlap, ending at `total`."""
    assert offsets.tolist() == np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
    assert int(lengths.sum()) == total


def test_gather_and_scatter_are_a_numpy_gather_and_scatter_and_merge_each_side() -> None:
    p = pair(NHD_8_TO_2, 1, 6, pages=12)
    pages = (np.array([3, 4, 5, 9]), np.array([0, 7, 8, 2]))
    plan = p.prepared.staging_plan(*pages)
    g, s = plan.gather, plan.scatter
    check_partition(g.dst_addrs, g.lengths, plan.staging_bytes)
    check_partition(s.src_addrs, s.lengths, plan.staging_bytes)
    # Merged wherever a side continues: no neighbour continues the one before it.
    assert not np.any(g.src_addrs[:-1] + g.lengths[:-1] == g.src_addrs[1:])
    assert not np.any(s.dst_addrs[:-1] + s.lengths[:-1] == s.dst_addrs[1:])
    # Token-major TP 8 -> 2: a prefill rank's slice of a page is contiguous at the source
    # (its rows are its whole rows) but strided at the destination.
    assert g.num_descriptors < s.num_descriptors == plan.num_direct_descriptors
    # The arrays are what a gather kernel takes: numpy does it from them alone.
    memory = {a.ctypes.data: a for a in p.src}
    staging = np.zeros(plan.staging_bytes, dtype=np.uint8)
    for src, offset, n in zip(g.src_addrs.tolist(), g.dst_addrs.tolist(), g.lengths.tolist()):
        base = max(b for b in memory if b <= src)
        staging[offset : offset + n] = memory[base][src - base : src - base + n]
    packed = np.zeros(plan.staging_bytes, dtype=np.uint8)
    plan.pack(packed)
    assert np.array_equal(packed, staging)


def test_the_decode_side_plans_the_same_scatter_without_the_prefill_addresses() -> None:
    for planner, d, s in ((NHD_8_TO_2, 1, 6), (HND_2_TO_8, 5, 1)):
        p = pair(planner, d, s, pages=12)
        pages = (np.array([3, 4, 5, 9]), np.array([0, 7, 8, 2]))
        prefill_side = p.prepared.staging_plan(*pages).scatter
        decode_side = p.decode_side().staging_plan(*pages).scatter
        for a, b in zip(prefill_side, decode_side):
            assert np.array_equal(a, b)


def test_token_staging_moves_what_token_descriptors_move() -> None:
    planner = TOKENS_4_TO_2
    p = pair(planner, 0, 1, pages=10)
    n = 150
    src_slots = token_slots(np.array([9, 0, 4, 2, 7, 1, 3, 5, 6, 8]), 16, n)
    dst_slots = token_slots(np.array([3, 1, 0]), 64, n)
    p.fresh_dst(2)
    memmove_all(p.prepared.token_descriptors(src_slots, dst_slots))
    want = [a.copy() for a in p.dst]
    p.fresh_dst(2)
    plan = p.prepared.token_staging_plan(src_slots, dst_slots, chunk_bytes=1000)
    staged_through(plan, p)
    for got, expected in zip(p.dst, want):
        assert np.array_equal(got, expected)
    decode_side = p.decode_side().token_staging_plan(src_slots, dst_slots).scatter
    assert np.array_equal(decode_side.dst_addrs, plan.scatter.dst_addrs)


def test_large_copies_run_on_threads_and_stay_exact() -> None:
    """Above the threading threshold (4 MiB), pack and unpack split the work."""
    planner = kv_planner(8, 2, "NHD", layers=4, head_dim=32)
    p = pair(planner, 0, 3, pages=1024)
    src_pages, dst_pages = np.arange(1024), np.random.default_rng(3).permutation(1024)
    p.fresh_dst(3)
    memmove_all(p.prepared.descriptors(src_pages, dst_pages))
    want = [a.copy() for a in p.dst]
    p.fresh_dst(3)
    plan = p.prepared.staging_plan(src_pages, dst_pages)
    assert plan.staging_bytes > 4 << 20
    staged_through(plan, p)
    for got, expected in zip(p.dst, want):
        assert np.array_equal(got, expected)


def test_overlapping_writes_unpack_in_order_like_the_direct_descriptors() -> None:
    """Two fragments writing the same destination bytes (a peer's frames may say so): the
    scatter copies one after another, the later winning, as the direct list would."""
    f = TransferFragment(0, BufferKind.TARGET_K, 0, 0, 64, 64, 0, 0, 64)
    g = TransferFragment(1, BufferKind.TARGET_K, 0, 0, 64, 64, 0, 0, 64)
    src = [np.full(64 * 4, 1, dtype=np.uint8), np.full(64 * 4, 2, dtype=np.uint8)]
    dst = np.zeros(64 * 4, dtype=np.uint8)
    prepared = PreparedTransfer(
        [f, g],
        [a.ctypes.data for a in src],
        [dst.ctypes.data, dst.ctypes.data],
        src_limits=[a.nbytes for a in src],
        dst_limits=[dst.nbytes, dst.nbytes],
    )
    plan = prepared.staging_plan([0, 1, 2, 3], [0, 1, 2, 3])
    staging = np.zeros(plan.staging_bytes, dtype=np.uint8)
    plan.pack(staging)
    plan.unpack(staging)
    assert np.all(dst == 2)


def test_chunks_cover_the_staging_buffer_exactly() -> None:
    p = pair(NHD_8_TO_2, 1, 6, pages=12)
    plan = p.prepared.staging_plan(range(12), range(12), chunk_bytes=1000)
    t = plan.wire_descriptors(1 << 20, 1 << 30)
    assert plan.chunk_bytes == 1000
    assert t.src_addrs.tolist() == list(range(1 << 20, (1 << 20) + plan.staging_bytes, 1000))
    assert t.dst_addrs.tolist() == [a - (1 << 20) + (1 << 30) for a in t.src_addrs.tolist()]
    assert t.total_bytes == plan.staging_bytes and int(t.lengths.max()) == 1000
    whole = p.prepared.staging_plan(range(12), range(12)).wire_descriptors(0, 0)
    assert whole.num_descriptors == 1
    assert p.prepared.staging_plan([], []).wire_descriptors(0, 0).num_descriptors == 0


def refused(match: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=match):
        call(*args, **kwargs)


def test_every_bad_staging_request_is_refused_with_the_fix() -> None:
    p = pair(NHD_8_TO_2, 1, 6, pages=12)
    plan = p.prepared.staging_plan(range(4), range(4))
    need = plan.staging_bytes
    refused("chunk_bytes must be at least 1", p.prepared.staging_plan, [1], [1], chunk_bytes=0)
    refused("chunk_bytes", p.prepared.staging_plan, [1], [1], chunk_bytes=-4)
    refused("past its limit", p.prepared.staging_plan, [12], [0])
    refused(f"holds {need - 1} bytes", plan.pack, np.zeros(need - 1, dtype=np.uint8))
    refused(f"holds {need - 1} bytes", plan.unpack, np.zeros(need - 1, dtype=np.uint8))
    refused("uint8", plan.pack, np.zeros(need, dtype=np.int16))
    refused("C-contiguous", plan.pack, np.zeros(2 * need, dtype=np.uint8)[::2])
    refused("uint8", plan.pack, bytearray(need))
    frozen = np.zeros(need, dtype=np.uint8)
    frozen.flags.writeable = False
    refused("not writable", plan.pack, frozen)
    # A staging array that is one of the caches (or inside one) would copy onto itself.
    one_page = p.prepared.staging_plan([0], [0])
    assert one_page.staging_bytes <= p.src[0].nbytes
    refused("overlaps a src cache", one_page.pack, p.src[0])
    refused("overlaps a dst cache", one_page.unpack, p.dst[1][3:])
    # Host copies go through raw addresses: without limits the plan cannot vouch for them.
    decode_side = p.decode_side().staging_plan(range(4), range(4))
    refused("src_limits", decode_side.pack, np.zeros(need, dtype=np.uint8))
    unlimited = PreparedTransfer(p.fragments, [a.ctypes.data for a in p.src], p.dst_bases)
    refused(
        "dst_limits", unlimited.staging_plan(range(4), range(4)).unpack, np.zeros(need, np.uint8)
    )
    refused("dst staging buffer holds 5", plan.wire_descriptors, 0, 0, dst_staging_bytes=5)
    refused("src_staging_base", plan.wire_descriptors, -1, 0)
    # Slot maps need token geometry, as for token_descriptors.
    refused("token", p.prepared.token_staging_plan, [0], [0])


# ---------------------------------------------------------------------------------------------
# The cost model


def request_pair(planner: PDTransferPlanner, decode_rank: int, tokens: int, page: int) -> Any:
    """A prepared pair for a `tokens`-token request on made-up addresses (nothing is copied)."""
    sources = planner.transfer_fragments(decode_rank)
    prefill_rank = min(sources)
    pages = -(-tokens // page)
    prepared = PreparedTransfer(
        sources[prefill_rank],
        [(1 << 40) * (i + 1) for i in range(len(planner.prefill_buffers))],
        [(1 << 41) * (i + 1) for i in range(len(planner.decode_buffers))],
    )
    return prepared, np.arange(pages), np.arange(pages)


def llama70b(ptp: int, dtp: int, layout: str, page_size: int = 64) -> PDTransferPlanner:
    shape = replace(ModelShape.preset("llama-3-70b"), page_size=page_size)
    return planner_for(shape, ptp, dtp, layout)


def test_the_default_model_stages_tiny_descriptors_and_not_whole_head_slices() -> None:
    model = CostModel()
    nhd = model.estimate(*request_pair(llama70b(8, 2, "NHD"), 0, 32768, 64))
    assert nhd.choice == "staging" and nhd.bytes_per_descriptor == 256
    hnd = model.estimate(*request_pair(llama70b(2, 8, "HND"), 0, 32768, 64))
    assert hnd.choice == "direct" and hnd.bytes_per_descriptor == 16384
    assert hnd.wire_descriptors == 1 and hnd.direct_descriptors == 80 * 2 * 512
    # 16-token pages make 4 KiB slices: a quarter of the bytes a descriptor, and then the
    # descriptors (0.27 µs each) outlast the bytes on a 400 Gb/s wire.
    small_pages = model.estimate(*request_pair(llama70b(2, 8, "HND", 16), 0, 32768, 16))
    assert small_pages.choice == "staging" and small_pages.bytes_per_descriptor == 4096


def test_the_choice_follows_the_figures() -> None:
    args = request_pair(llama70b(2, 8, "HND"), 0, 4096, 64)
    # Descriptors that cost nothing never pay for copies; costly ones always do.
    assert CostModel(per_descriptor_s=0.0).estimate(*args).choice == "direct"
    assert CostModel(per_descriptor_s=1e-5).estimate(*args).choice == "staging"
    slow = CostModel(copy_bytes_per_s=1e9).estimate(*args)
    fast = CostModel(copy_bytes_per_s=1e13).estimate(*args)
    assert slow.staging_s > fast.staging_s and slow.direct_s == fast.direct_s
    e = CostModel().estimate(*args)
    assert e.staging_s == pytest.approx(e.gather_s + e.wire_s + e.scatter_s)
    for bad in (
        {"network_bytes_per_s": 0.0},
        {"per_copy_s": -1.0},
        {"copy_bytes_per_s": float("nan")},
        {"per_descriptor_s": "fast"},
        {"per_segment_s": None},
        {"network_bytes_per_s": True},
    ):
        with pytest.raises(UnsupportedPDLayoutError):
            CostModel(**bad)  # type: ignore[arg-type]
    refused("takes a PreparedTransfer, got str", CostModel().estimate, "p", [0], [0])
    refused("takes a PreparedTransfer", CostModel().estimate_tokens, None, [0], [0])
    refused("takes a StagingPlan, got int", CostModel().estimate_plan, 7)


def test_token_estimates_weigh_the_slot_map_request() -> None:
    planner = TOKENS_4_TO_2
    prepared, _, _ = request_pair(planner, 0, 1, 16)
    slots = token_slots(np.arange(64), 16, 1024), token_slots(np.arange(16), 64, 1024)
    e = CostModel().estimate_tokens(prepared, *slots)
    assert e.direct_descriptors == prepared.token_descriptors(*slots).num_descriptors
    assert e.bytes == prepared.token_descriptors(*slots).total_bytes


def test_counts_without_a_plan_are_the_plans_counts() -> None:
    """The cost model counts without building gather and scatter; the counts must be the
    plan's, which the byte-level tests above check."""
    for planner, d, s in ((NHD_8_TO_2, 1, 6), (HND_2_TO_8, 5, 1)):
        p = pair(planner, d, s, pages=12)
        pages = (np.array([3, 4, 5, 9, 10]), np.array([0, 7, 8, 2, 3]))
        for chunk in (None, 100):
            plan = p.prepared.staging_plan(*pages, chunk_bytes=chunk)
            assert p.prepared.staging_counts(*pages, chunk_bytes=chunk) == plan.counts
            g, sc = plan.gather, plan.scatter
            assert plan.counts == (
                plan.num_direct_descriptors,
                plan.num_wire_descriptors,
                g.num_descriptors,
                sc.num_descriptors,
                g.total_bytes,
            )
    p = pair(TOKENS_4_TO_2, 0, 1, pages=10)
    slots = token_slots(np.arange(10)[::-1], 16, 150), token_slots(np.array([3, 1, 0]), 64, 150)
    plan = p.prepared.token_staging_plan(*slots, chunk_bytes=7)
    assert p.prepared.token_staging_counts(*slots, chunk_bytes=7) == plan.counts
    refused(
        "chunk_bytes must be at least 1", p.prepared.token_staging_counts, *slots, chunk_bytes=0
    )


def test_staging_leaves_the_direct_descriptors_alone() -> None:
    """Staging is opt-in: a plan's descriptors do not change because it can be staged."""
    p = pair(NHD_8_TO_2, 1, 6, pages=12)
    before = p.prepared.descriptors(range(4), range(4))
    p.prepared.staging_plan(range(4), range(4))
    after = p.prepared.descriptors(range(4), range(4))
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_one_plan_packs_for_threads_at_once() -> None:
    """Pack runs without the GIL: threads share one plan, each with its staging array."""
    import threading

    p = pair(kv_planner(8, 2, "NHD", layers=4, head_dim=32), 0, 3, pages=1024)
    plan = p.prepared.staging_plan(np.arange(1024), np.arange(1024)[::-1])
    expected = np.zeros(plan.staging_bytes, dtype=np.uint8)
    plan.pack(expected)
    outputs = [np.zeros(plan.staging_bytes, dtype=np.uint8) for _ in range(4)]
    threads = [threading.Thread(target=plan.pack, args=(out,)) for out in outputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(np.array_equal(out, expected) for out in outputs)


def test_the_cost_model_takes_counts_as_a_plain_tuple_too() -> None:
    from pdplan import CostModel, StagingCounts, UnsupportedPDLayoutError

    model = CostModel()
    named = model.estimate_counts(StagingCounts(1000, 1, 10, 10, 1 << 20))
    plain = model.estimate_counts((1000, 1, 10, 10, 1 << 20))
    assert named == plain and plain.direct_descriptors == 1000 and plain.wire_descriptors == 1
    # The wire alone: 1000 descriptors at the model's cost each, or the bytes at its rate.
    assert plain.direct_s == max(
        1000 * model.per_descriptor_s, (1 << 20) / model.network_bytes_per_s
    )
    for bad in ((1, 2), "12345", None):
        with pytest.raises(UnsupportedPDLayoutError, match="five staging counts"):
            model.estimate_counts(bad)  # type: ignore[arg-type]
