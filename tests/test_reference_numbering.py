"""The reference runtime's own buffer numbering, planned as the reference plans it.

Its Mooncake receiver numbers a side's KV buffers by their offset among its KV pointers and
its Mamba state buffers by their offset among its state pointers, each from 0, and resolves a
fragment's ``buffer_index`` against one list or the other by ``buffer_kind``: a hybrid model's
side holds a KV buffer and a state buffer of index 0. Planned here at TP pairs that split
heads and channels both ways, checked byte by byte by the brute-force oracle (which keys a
buffer by its kind's space and index, as that receiver does), then executed on real memory the
receiver's way (each kind's fragments against its own pointers) with guard bytes around every
buffer. One array of base pointers cannot tell the two index 0s apart: refused, naming the way.
A real duplicate (two KV buffers of one index) is still refused."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from pdplan import (
    AttentionLayer,
    BufferKind,
    BufferLayout,
    Mamba2Layer,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
    transfer_descriptors,
)

from oracle import PAGES, check_plan, dealt_units, page_labels, receives, where

#: Attention, Mamba2, attention, Mamba2: KV and state buffers interleaved in model order.
HYBRID = ModelShape(
    layer_kinds=(
        AttentionLayer(4, 8),
        Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=4, conv_kernel=4),
        AttentionLayer(4, 8),
        Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=4, conv_kernel=4),
    ),
    dtype="bfloat16",
    page_size=4,
)

GUARD = 64


def numbered_by_kind(buffers: tuple[BufferLayout, ...]) -> list[BufferLayout]:
    """The receiver's numbering (TokenSpeed's Mooncake receiver, ``_build_kv_buffer_layouts``):
    a KV buffer by its offset among the KV pointers, which list every attention layer's K, then
    every layer's V; a state buffer by its offset among the state pointers, which list every
    recurrent layer's conv state, then every layer's SSM state. Each counts from 0."""
    kv = [b for b in buffers if b.buffer_kind != BufferKind.MAMBA_STATE]
    state = [b for b in buffers if b.buffer_kind == BufferKind.MAMBA_STATE]
    attention_layers = sorted({b.layer for b in kv})
    state_layers = sorted({b.layer for b in state})
    index: dict[int, int] = {}
    for position, b in enumerate(buffers):
        if b.buffer_kind == BufferKind.MAMBA_STATE:
            part = [s for s in state if s.layer == b.layer].index(b)  # conv 0, SSM 1
            index[position] = part * len(state_layers) + state_layers.index(b.layer)
        else:
            plane = 0 if b.buffer_kind == BufferKind.TARGET_K else 1
            index[position] = plane * len(attention_layers) + attention_layers.index(b.layer)
    return [dataclasses.replace(b, buffer_index=index[i]) for i, b in enumerate(buffers)]


def planner_of(ptp: int, dtp: int) -> PDTransferPlanner:
    prefill, decode = model_buffer_layouts(HYBRID, ptp, dtp)
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", ptp),
        decode_layout=ParallelLayout("decode", dtp),
        prefill_buffers=numbered_by_kind(prefill),
        decode_buffers=numbered_by_kind(decode),
    )


PAIRS = [(1, 1), (2, 1), (1, 2), (2, 4), (4, 2), (4, 1)]


def test_the_numbering_holds_both_index_spaces() -> None:
    buffers = planner_of(2, 1).prefill_buffers
    kv = [b.buffer_index for b in buffers if b.buffer_kind != BufferKind.MAMBA_STATE]
    state = [b.buffer_index for b in buffers if b.buffer_kind == BufferKind.MAMBA_STATE]
    # Model order: K0 V0 (layer 0), conv SSM (layer 1), K2 V2 (layer 2), conv SSM (layer 3).
    assert kv == [0, 2, 1, 3] and state == [0, 2, 1, 3]


@pytest.mark.parametrize(("ptp", "dtp"), PAIRS)
def test_the_receiver_s_numbering_is_planned_byte_exact(ptp: int, dtp: int) -> None:
    planner = planner_of(ptp, dtp)
    planner.verify()
    delivered: dict[int, set[int]] = {}
    for rank in range(dtp):
        plan = planner.plan_for_decode_rank(rank)
        delivered[rank] = check_plan(
            plan, planner.transfer_fragments(rank), rank, planner.prefill_layout,
            planner.decode_layout, planner.prefill_buffers, planner.decode_buffers,
        )  # fmt: skip
    for source, fanout in planner.source_fanout.items():
        assert fanout == sum(source in ranks for ranks in delivered.values())


class Memory:
    """One rank's buffers as the receiver keeps them: a KV pointer list and a state pointer
    list, each buffer ``PAGES`` items in real memory between guard bytes."""

    def __init__(self, buffers: list[BufferLayout], labels: list[np.ndarray | None]) -> None:
        self.arrays = []
        for b, label in zip(buffers, labels):
            array = np.full(PAGES * b.item_stride_bytes + 2 * GUARD, 0x5A, dtype=np.uint8)
            if label is not None:
                array[GUARD:-GUARD] = label
            self.arrays.append(array)
        # Each space's pointer list in its index order, as the receiver resolves an index.
        self.pointers: dict[bool, list[int]] = {}
        self.limits: dict[bool, list[int]] = {}
        for space in (False, True):
            mine = sorted(
                (b.buffer_index, a.ctypes.data + GUARD, PAGES * b.item_stride_bytes)
                for b, a in zip(buffers, self.arrays)
                if (b.buffer_kind == BufferKind.MAMBA_STATE) == space
            )
            assert [i for i, _, _ in mine] == list(range(len(mine)))
            self.pointers[space] = [p for _, p, _ in mine]
            self.limits[space] = [n for _, _, n in mine]

    def guards_intact(self) -> bool:
        return all((a[:GUARD] == 0x5A).all() and (a[-GUARD:] == 0x5A).all() for a in self.arrays)


def labelled(b: BufferLayout, tp: int, tp_rank: int) -> np.ndarray:
    """A rank's pages of ``b``: each byte says which logical byte it holds (the oracle's)."""
    units = dealt_units(b, tp, tp_rank)
    assert units is not None
    # Labels fit a byte only modulo 251 (a prime: neighbouring labels stay distinct).
    return (np.tile(page_labels(b, units, b.item_stride_bytes), PAGES) % 251 + 1).astype(np.uint8)


@pytest.mark.parametrize(("ptp", "dtp"), PAIRS)
def test_the_receiver_s_way_moves_the_bytes_on_real_memory(ptp: int, dtp: int) -> None:
    planner = planner_of(ptp, dtp)
    prefill = [
        Memory(list(planner.prefill_buffers),
               [labelled(b, ptp, where(planner.prefill_layout, r)[2])
                for b in planner.prefill_buffers])
        for r in range(ptp)
    ]  # fmt: skip
    pages = np.arange(PAGES)
    for rank in range(dtp):
        tp_rank = where(planner.decode_layout, rank)[2]
        decode = Memory(list(planner.decode_buffers), [None] * len(planner.decode_buffers))
        for source, fragments in planner.transfer_fragments(rank).items():
            for space in (False, True):
                mine = [f for f in fragments if (f.buffer_kind == BufferKind.MAMBA_STATE) == space]
                moves = transfer_descriptors(
                    mine, prefill[source].pointers[space], decode.pointers[space], pages, pages,
                    src_limits=prefill[source].limits[space], dst_limits=decode.limits[space],
                )  # fmt: skip
                for s, t, length in moves.as_array().tolist():
                    ctypes.memmove(t, s, length)
        assert decode.guards_intact() and all(m.guards_intact() for m in prefill)
        for b, array in zip(planner.decode_buffers, decode.arrays):
            got = array[GUARD:-GUARD]
            if receives(b, dtp, tp_rank):
                want = labelled(b, dtp, tp_rank)
                units = dealt_units(b, dtp, tp_rank)
                held = np.tile(page_labels(b, units, b.item_stride_bytes), PAGES) != 0
                np.testing.assert_array_equal(got[held], want[held], f"{b}")
            else:
                assert (got == 0x5A).all()


def test_one_array_of_pointers_cannot_read_both_spaces() -> None:
    planner = planner_of(2, 1)
    fragments = planner.transfer_fragments(0)[0]
    assert {f.buffer_index for f in fragments if f.buffer_kind == BufferKind.MAMBA_STATE} & {
        f.buffer_index for f in fragments if f.buffer_kind != BufferKind.MAMBA_STATE
    }
    bases = [1 << 30] * 16
    clash = r"both name buffer_index=0.*state buffers after the KV ones"
    with pytest.raises(UnsupportedPDLayoutError, match=clash):
        transfer_descriptors(fragments, bases, bases, [0], [0])
    from pdplan import PreparedTransfer

    with pytest.raises(UnsupportedPDLayoutError, match=r"numbered apart"):
        PreparedTransfer(fragments, bases, bases)
    with pytest.raises(UnsupportedPDLayoutError, match=r"numbered apart"):
        PreparedTransfer.from_layouts(planner, 0, 0, bases, bases)


def plan_one_to_one(buffers: list[BufferLayout]) -> PDTransferPlanner:
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=buffers,
        decode_buffers=buffers,
    )


def test_a_duplicate_within_one_space_is_still_refused() -> None:
    prefill, decode = model_buffer_layouts(HYBRID, 1, 1)
    for side in (prefill, decode):
        twice = numbered_by_kind(side)
        kv = [i for i, b in enumerate(twice) if b.buffer_kind != BufferKind.MAMBA_STATE]
        twice[kv[1]] = dataclasses.replace(twice[kv[1]], buffer_index=twice[kv[0]].buffer_index)
        with pytest.raises(UnsupportedPDLayoutError, match=r"buffer_index 0 among the KV"):
            plan_one_to_one(twice)
        state = [i for i, b in enumerate(twice) if b.buffer_kind == BufferKind.MAMBA_STATE]
        again = numbered_by_kind(side)
        again[state[1]] = dataclasses.replace(again[state[1]], buffer_index=0)
        with pytest.raises(UnsupportedPDLayoutError, match=r"among the state"):
            plan_one_to_one(again)


def test_layout_frames_carry_the_numbering_but_not_pointers_it_cannot_index() -> None:
    from pdplan import decode_layout, encode_layout

    planner = planner_of(2, 1)
    layout, buffers = planner.prefill_layout, list(planner.prefill_buffers)
    version, payload = encode_layout(layout, buffers)
    peer = decode_layout(version, payload)
    assert list(peer.buffers) == buffers
    bases = [4096 * (i + 1) for i in range(len(buffers))]
    with pytest.raises(UnsupportedPDLayoutError, match=r"base_ptrs are read by buffer_index"):
        encode_layout(layout, buffers, base_ptrs=bases)


def test_lost_ranges_name_the_kind_an_index_belongs_to() -> None:
    # Prefill TP 2 without rank 1: half of every KV head and state channel set is lost, and a
    # KV buffer and a state buffer of one index are told apart by their kind.
    planner = planner_of(2, 1).without_prefill_ranks([1])
    lost = planner.lost(0)
    kinds = {(b.buffer_index, b.buffer_kind) for b in planner.decode_buffers}
    assert {(r.buffer_index, r.buffer_kind) for r in lost} == kinds
    assert any(r.buffer_kind == BufferKind.MAMBA_STATE and r.buffer_index == 0 for r in lost)
