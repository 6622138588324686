"""A request moved slice by slice, layer groups and token ranges in a random order, through
memmove or a transfer engine, against the same request moved whole: every byte of every decode
rank's caches equal, guard bytes intact.

    python tests/slice_moves.py CASE|all ENGINE    # ENGINE: memory, mooncake or nixl

run as a child process by the engine tests (see runtime_pairs.py for why a child)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdplan import (
    AttentionLayer,
    BufferKind,
    Mamba2Layer,
    MlaLayer,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    model_buffer_layouts,
    token_slots,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_pairs import Mover, main

GUARD = 0x5A
PAGES = 24


def guarded(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    block = np.full(nbytes + 128, GUARD, dtype=np.uint8)
    return block[64:-64], block


@dataclass
class Rank:
    """One rank's caches: a guarded block a buffer."""

    inner: list[np.ndarray]
    blocks: list[np.ndarray]

    @classmethod
    def of(cls, buffers: Any, rng: np.random.Generator | None) -> Rank:
        made = [guarded(b.item_stride_bytes * PAGES) for b in buffers]
        inner = [m[0] for m in made]
        for array in inner:
            array[:] = rng.integers(0, 256, array.size, np.uint8) if rng is not None else 0
        return cls(inner, [m[1] for m in made])

    def bases(self) -> list[int]:
        return [a.ctypes.data for a in self.inner]

    def limits(self) -> list[int]:
        return [a.nbytes for a in self.inner]


def partition(rng: np.random.Generator, length: int, most: int) -> list[tuple[int, int]]:
    cuts = sorted({int(c) for c in rng.integers(1, length, size=most)})
    bounds = [0, *cuts, length]
    return [(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def move_request(
    *,
    layers: tuple[Any, ...],
    tps: tuple[int, int],
    sizes: tuple[int, int],
    length: int,
    prefix: int,
    by_slots: bool,
    mover: Mover,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    sides = []
    for tp, size in zip(tps, sizes):
        shape = ModelShape(layer_kinds=layers, dtype="bfloat16", page_size=size)
        sides.append(model_buffer_layouts(shape, tp, tp)[0])
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", tps[0]),
        decode_layout=ParallelLayout("decode", tps[1]),
        prefill_buffers=sides[0],
        decode_buffers=sides[1],
        token_maps=by_slots,
    )
    prefill = [Rank.of(sides[0], rng) for _ in range(tps[0])]
    whole = [Rank.of(sides[1], None) for _ in range(tps[1])]
    sliced = [Rank.of(sides[1], None) for _ in range(tps[1])]
    mover.register(prefill, [*whole, *sliced])
    counts = [-(-length // s) for s in sizes]
    tables = [rng.permutation(PAGES)[:n].astype(np.int64) for n in counts]
    slots = [token_slots(t, s, length) for t, s in zip(tables, sizes)]
    state = [b.buffer_index for b in sides[0] if b.buffer_kind == BufferKind.MAMBA_STATE]
    kv = [b.buffer_index for b in sides[0] if b.buffer_index not in state]
    masked = slots[1].copy()
    masked[:prefix] = -1
    groups = [[i] for i in range(len(layers))]
    ranges = partition(rng, length, 3)
    work = [(g, r) for g in groups for r in ranges]
    order = rng.permutation(len(work))
    for decode_rank in range(tps[1]):
        for prefill_rank, fragments in planner.transfer_fragments(decode_rank).items():

            def prepared(
                dst: Rank, src: Rank = prefill[prefill_rank], fragments: Any = fragments
            ) -> PreparedTransfer:
                return PreparedTransfer(
                    fragments,
                    src.bases(),
                    dst.bases(),
                    src_limits=src.limits(),
                    dst_limits=dst.limits(),
                    buffer_layouts=sides[0],
                )

            one, parts = prepared(whole[decode_rank]), prepared(sliced[decode_rank])
            state_pages = ([int(rng.integers(PAGES))], [int(rng.integers(PAGES))])
            if by_slots:
                mover(one.token_descriptors(slots[0], masked, buffers=kv))
            else:
                skip = prefix // sizes[0]
                mover(one.descriptors(tables[0][skip:], tables[1][skip:], buffers=kv))
            if state:
                mover(one.descriptors(*state_pages, buffers=state))
            for at in order:
                group, (start, stop) = work[at]
                slice_ = dict(
                    layers=group,
                    tokens=range(start, stop),
                    final_length=length,
                    decode_prefix=prefix,
                )
                if by_slots:
                    mover(parts.token_descriptors(slots[0], slots[1], buffers=kv, **slice_))
                else:
                    mover(parts.descriptors(tables[0], tables[1], buffers=kv, **slice_))
                if state:
                    mover(parts.descriptors(*state_pages, buffers=state, **slice_))
    for a, b in zip(whole, sliced):
        for x, y in zip(a.inner, b.inner):
            np.testing.assert_array_equal(x, y)
        for block in [*a.blocks, *b.blocks]:
            assert (block[:64] == GUARD).all() and (block[-64:] == GUARD).all()
    assert any(x.any() for rank in sliced for x in rank.inner), "nothing moved"


WINDOWED = (
    AttentionLayer(2, 8),
    AttentionLayer(2, 8, sliding_window=11),
    Mamba2Layer(4, 4, 4, groups=2),
    MlaLayer(16, 8),
)
PAGED = (AttentionLayer(4, 8), Mamba2Layer(4, 4, 4, groups=4), MlaLayer(16, 8))

CASES: dict[str, Callable[[Mover], None]] = {
    "slot_maps_tp2_to_tp1_pages_4_and_8_with_a_prefix": lambda m: move_request(
        layers=WINDOWED, tps=(2, 1), sizes=(4, 8), length=37, prefix=9, by_slots=True,
        mover=m, seed=1,
    ),
    "slot_maps_tp1_to_tp2_equal_pages": lambda m: move_request(
        layers=WINDOWED, tps=(1, 2), sizes=(8, 8), length=50, prefix=0, by_slots=True,
        mover=m, seed=2,
    ),
    "pages_tp2_to_tp4_with_a_page_prefix": lambda m: move_request(
        layers=PAGED, tps=(2, 4), sizes=(4, 4), length=41, prefix=8, by_slots=False,
        mover=m, seed=3,
    ),
}  # fmt: skip


if __name__ == "__main__":
    main(CASES)
