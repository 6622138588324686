"""Requests moved through NIXL 1.5's strided lists (``strided_descriptors`` and
``token_strided_descriptors``, each side prepared with ``prep_xfer_dlist`` as an N x 5 array,
then ``make_prepped_xfer`` over every block) against the same requests' flat descriptors moved
by memmove: every byte of every decode rank's caches equal, guard bytes intact. Head-major and
token-major pages, a TP change, MLA, pages of different sizes by slot maps, a slice.

    python tests/strided_moves.py CASE|all nixl

run as a child process by tests/test_strided.py (NIXL agents crash the interpreter at exit;
runtime_pairs.py says more)."""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pdplan import (
    AttentionLayer,
    MlaLayer,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StridedDescriptors,
    TransferDescriptors,
    calibrate_posting,
    model_buffer_layouts,
    token_slots,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_pairs import main
from slice_moves import GUARD, PAGES, Rank


class StridedNixl:
    """Two NIXL agents (UCX, DRAM), prefill and decode; each request's strided lists are
    prepared on both sides and written by index, every block."""

    def __init__(self) -> None:
        import os

        from nixl_cu12._api import nixl_agent, nixl_agent_config

        if not (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")):
            os.environ.setdefault("UCX_MODULES", "^ib")
        self.source = nixl_agent("strided-prefill", nixl_agent_config(backends=["UCX"]))
        self.target = nixl_agent("strided-decode", nixl_agent_config(backends=["UCX"]))
        name = self.source.add_remote_agent(self.target.get_agent_metadata())
        self.peer = name.decode() if isinstance(name, bytes) else name
        self.moved = self.rows = self.blocks = 0

    def register(self, prefill: list[Rank], decode: list[Rank]) -> None:
        for agent, ranks in ((self.source, prefill), (self.target, decode)):
            for rank in ranks:
                for block in rank.blocks:
                    rows = np.array([[block.ctypes.data, block.nbytes, 0]], dtype=np.uint64)
                    agent.register_memory(rows, "DRAM")
        # The target's registrations reach the source with its metadata, sent again.
        self.source.add_remote_agent(self.target.get_agent_metadata())

    def flat(self, flat: TransferDescriptors) -> None:
        """Flat descriptors written through NIXL (N x 3 lists, ``initialize_xfer``)."""
        zeros = np.zeros_like(flat.lengths)
        local = self.source.get_xfer_descs(
            np.column_stack((flat.src_addrs, flat.lengths, zeros)), "DRAM"
        )
        remote = self.source.get_xfer_descs(
            np.column_stack((flat.dst_addrs, flat.lengths, zeros)), "DRAM"
        )
        self.wait(self.source.initialize_xfer("WRITE", local, remote, self.peer))

    def wait(self, handle: Any) -> None:
        state = self.source.transfer(handle)
        deadline = time.monotonic() + 60
        while state not in ("DONE", "ERR") and time.monotonic() < deadline:
            state = self.source.check_xfer_state(handle)
        self.source.release_xfer_handle(handle)
        assert state == "DONE", state

    def __call__(self, strided: StridedDescriptors) -> None:
        if strided.num_entries == 0:
            return
        self.moved += strided.total_bytes
        self.rows += strided.num_entries
        self.blocks += strided.num_descriptors
        local = self.source.prep_xfer_dlist("NIXL_INIT_AGENT", strided.src, "DRAM")
        remote = self.source.prep_xfer_dlist(self.peer, strided.dst, "DRAM")
        every = np.arange(strided.num_descriptors, dtype=np.int32)
        self.wait(self.source.make_prepped_xfer("WRITE", local, every, remote, every))
        self.source.release_dlist_handle(local)
        self.source.release_dlist_handle(remote)


class ConnectorReads:
    """The connector's own engines (``pdplan.session._engines.NixlEngine``): the decode one
    reads strided rows from the prefill one (``read_strided``), as a decode rank does."""

    def __init__(self) -> None:
        from pdplan.session._engines import NixlEngine

        self.prefill, self.decode = NixlEngine("engine-prefill"), NixlEngine("engine-decode")
        self.moved = self.rows = self.blocks = 0

    def register(self, prefill: list[Rank], decode: list[Rank]) -> None:
        for engine, ranks in ((self.prefill, prefill), (self.decode, decode)):
            engine.register([(b.ctypes.data, b.nbytes) for r in ranks for b in r.blocks])

    def __call__(self, strided: StridedDescriptors) -> None:
        if strided.num_entries == 0:
            return
        self.moved += strided.total_bytes
        self.rows += strided.num_entries
        self.blocks += strided.num_descriptors
        handle = self.decode.read_strided(self.prefill.metadata(), strided.dst, strided.src)
        deadline = time.monotonic() + 60
        state = "PROC"
        while state == "PROC" and time.monotonic() < deadline:
            state = self.decode.state(handle)
        assert state == "DONE", state


def memmove(flat: Any) -> None:
    for s, d, n in zip(*(column.tolist() for column in flat)):
        ctypes.memmove(d, s, n)


def runs_table(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` distinct pages below ``PAGES``: a run of step 1, one of step 2, the rest
    scattered (what a fresh allocator and a used one hand out)."""
    first = list(range(0, count // 3))
    second = list(range(count // 3, count // 3 + 2 * (count // 3), 2))
    rest = [p for p in rng.permutation(PAGES).tolist() if p not in first and p not in second]
    return np.array((first + second + rest)[:count], dtype=np.int64)


def move(layers: tuple[Any, ...], tps: tuple[int, int], sizes: tuple[int, int], kv_layout: str,
         by_slots: bool, mover: Any, seed: int) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    sides = []
    for tp, size in zip(tps, sizes):
        shape = ModelShape(layer_kinds=layers, dtype="bfloat16", page_size=size)
        sides.append(model_buffer_layouts(shape, tp, tp, kv_layout)[0])  # type: ignore[arg-type]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", tps[0]),
        decode_layout=ParallelLayout("decode", tps[1]),
        prefill_buffers=sides[0],
        decode_buffers=sides[1],
        token_maps=by_slots,
    )
    prefill = [Rank.of(sides[0], rng) for _ in range(tps[0])]
    flat_side = [Rank.of(sides[1], None) for _ in range(tps[1])]
    strided_side = [Rank.of(sides[1], None) for _ in range(tps[1])]
    mover.register(prefill, strided_side)
    length = 7 * max(sizes) + 3
    tables = [runs_table(rng, -(-length // s)) for s in sizes]
    slots = [token_slots(t, s, length) for t, s in zip(tables, sizes)]
    for decode_rank in range(tps[1]):
        for prefill_rank, fragments in planner.transfer_fragments(decode_rank).items():
            src = prefill[prefill_rank]

            def prepared(dst: Rank, src: Rank = src, fragments: Any = fragments) -> Any:
                return PreparedTransfer(fragments, src.bases(), dst.bases(),
                                        src_limits=src.limits(), dst_limits=dst.limits(),
                                        buffer_layouts=sides[0])  # fmt: skip

            flat, strided = prepared(flat_side[decode_rank]), prepared(strided_side[decode_rank])
            # The whole request, then one more slice of the first layer (written again: the
            # same bytes, so the caches stay equal).
            slice_ = dict(layers=[0], tokens=range(0, length), final_length=length)
            if by_slots:
                for kwargs in ({}, slice_):
                    memmove(flat.token_descriptors(*slots, **kwargs))
                    mover(strided.token_strided_descriptors(*slots, **kwargs))
            else:
                for kwargs in ({}, slice_):
                    memmove(flat.descriptors(*tables, **kwargs))
                    mover(strided.strided_descriptors(*tables, **kwargs))
    for want, got in zip(flat_side, strided_side):
        for a, b in zip(want.blocks, got.blocks):
            assert (a[:64] == GUARD).all() and (b[:64] == GUARD).all()
            assert (a[-64:] == GUARD).all() and (b[-64:] == GUARD).all()
            assert np.array_equal(a, b), "a strided request moved other bytes than the flat one"
            assert (a[64:-64] != 0).any(), "nothing moved"
    # Runs of pages (or of slots) compressed: fewer rows than the blocks they stand for.
    assert 0 < mover.rows < mover.blocks, (mover.rows, mover.blocks)


FULL = AttentionLayer(2, 8)
CASES = {
    "head-major-tp2-1": lambda m: move((FULL, FULL), (2, 1), (8, 8), "HND", False, m, 1),
    "token-major-tp2-1": lambda m: move((FULL, FULL), (2, 1), (8, 8), "NHD", False, m, 2),
    "token-major-tp1-2": lambda m: move((FULL,), (1, 2), (4, 4), "NHD", False, m, 3),
    "mla-tp2-2": lambda m: move((MlaLayer(16, 8), FULL), (2, 2), (8, 8), "HND", False, m, 4),
    "slot-maps-4-into-8": lambda m: move((FULL, FULL), (2, 1), (4, 8), "NHD", True, m, 5),
}


def calibrate(_: Any) -> None:
    """``calibrate_posting`` through NIXL itself: every block it moves lands byte for byte in
    the registered target, nothing else of it is written, and the figures are times."""
    link = StridedNixl()
    block, counts = 64, (8, 64, 256)
    span = 2 * block * max(counts)
    rng = np.random.default_rng(11)
    source = rng.integers(1, 256, size=span + 2 * GUARD, dtype=np.uint8)
    target = np.zeros(span + 2 * GUARD, dtype=np.uint8)
    for agent, array in ((link.source, source), (link.target, target)):
        agent.register_memory(np.array([[array.ctypes.data, array.nbytes, 0]], np.uint64), "DRAM")
    link.source.add_remote_agent(link.target.get_agent_metadata())
    at = (source.ctypes.data + GUARD, span), (target.ctypes.data + GUARD, span)
    done = calibrate_posting(link.flat, link, src=at[0], dst=at[1], counts=counts, repeat=2)
    # Blocks of `block` bytes, two lengths apart from the start of each span.
    written = np.zeros(target.shape, dtype=bool)
    for k in range(max(counts)):
        written[GUARD + 2 * block * k : GUARD + 2 * block * k + block] = True
    assert np.array_equal(target[written], source[written])
    assert not target[~written].any()
    m = done.model
    figures = (m.per_descriptor_s, m.per_row_s, m.per_block_s)
    assert all(np.isfinite(f) and f >= 0 for f in figures) and m.per_descriptor_s > 0, figures
    assert [n for n, _ in done.flat] == [n for n, _ in done.rows] == list(counts)


#: ``calibrate_posting`` through NIXL.
CALIBRATION_CASES = {"calibration": calibrate}

#: The connector's engine reading, on the cases of both page layouts.
ENGINE_CASES = {
    "connector-" + name: CASES[name] for name in ("head-major-tp2-1", "token-major-tp1-2")
}

if __name__ == "__main__":
    runs = {name: (lambda mover, case=case: case(StridedNixl())) for name, case in CASES.items()}
    for name, case in ENGINE_CASES.items():
        runs[name] = lambda mover, case=case: case(ConnectorReads())
    main({**runs, **CALIBRATION_CASES})
