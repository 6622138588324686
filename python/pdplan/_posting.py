"""A short calibration a runtime runs at start: what its transfer engine takes per flat
descriptor, per strided row and per block of a row, so that the cost model chooses the form of
each pair (``CostModel.choose_form``) by that engine's figures, not by defaults.

The engine moves small blocks (bytes are negligible beside posting) of memory it registered,
in three shapes at a few counts: n flat descriptors, one strided row of n blocks, n rows of one
block. The core fits a line through each shape's best times: the slopes are the per-descriptor,
per-block and per-row-and-block costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pdplan import _core
from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._descriptors import StridedDescriptors, TransferDescriptors
from pdplan._staging import CostModel

__all__ = ["PostingCalibration", "calibrate_posting"]

#: A calibration's default counts of descriptors, rows or blocks.
CALIBRATION_COUNTS = (64, 512, 2048)


@dataclass(frozen=True)
class PostingCalibration:
    """What ``calibrate_posting`` measured and the cost model it makes."""

    model: CostModel
    """The given model with ``per_descriptor_s``, ``per_row_s`` and ``per_block_s`` measured."""
    flat: tuple[tuple[int, float], ...]
    """(descriptors, best seconds) of n flat descriptors."""
    blocks: tuple[tuple[int, float], ...]
    """(blocks, best seconds) of one strided row of n blocks."""
    rows: tuple[tuple[int, float], ...]
    """(rows, best seconds) of n strided rows of one block each."""


def calibrate_posting(
    move_flat: Callable[[TransferDescriptors], object],
    move_strided: Callable[[StridedDescriptors], object] | None,
    *,
    src: tuple[int, int],
    dst: tuple[int, int],
    model: CostModel | None = None,
    block_bytes: int = 64,
    counts: Sequence[int] = CALIBRATION_COUNTS,
    repeat: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> PostingCalibration:
    """Times the engine's moves of small blocks and fits the cost model's posting figures.

    :param move_flat: Moves flat descriptors and returns once they landed (the engine's
        whole path: list preparation, posting, completion).
    :param move_strided: The same for strided lists (NIXL 1.5's ``prep_xfer_dlist`` of each
        N x 5 list); None where the engine takes none (its strided figures stay the model's).
    :param src: (address, bytes) of registered source memory the blocks are read from.
    :param dst: (address, bytes) of registered destination memory they are written to.
    :param model: The model whose other figures are kept; None: the defaults.
    :param block_bytes: Each block's bytes (small: posting, not bytes, is measured).
    :param counts: The counts timed (two distinct at least).
    :param repeat: Times each shape is timed; the best counts.
    :param clock: Seconds, monotonic.
    """
    if model is not None and not isinstance(model, CostModel):
        raise UnsupportedPDLayoutError(
            f"model must be a CostModel or None, got {type(model).__name__}"
        )
    if not callable(move_flat) or not (move_strided is None or callable(move_strided)):
        raise UnsupportedPDLayoutError(
            "move_flat must be a callable (and move_strided one, or None): each moves the "
            "descriptors it is given and returns once they landed"
        )
    if not callable(clock):
        raise UnsupportedPDLayoutError("clock must be a callable returning seconds")
    model = model or CostModel()
    sizes = _checked_counts(counts, repeat, block_bytes)
    # Blocks two lengths apart on each side: no two flat descriptors continue each other.
    span = 2 * block_bytes * max(sizes)
    for name, memory in (("src", src), ("dst", dst)):
        whole = isinstance(memory, tuple) and len(memory) == 2
        if not whole or not all(isinstance(v, int) and not isinstance(v, bool) for v in memory):
            raise UnsupportedPDLayoutError(f"{name} must be (address, bytes), got {shown(memory)}")
        address, size = memory
        if address < 0 or size < span or address + size >= 1 << 64:
            raise UnsupportedPDLayoutError(
                f"{name}=({address}, {size}) must be registered memory of at least {span} bytes "
                f"(2 x block_bytes x the largest count) inside 64 bits"
            )

    def offsets(n: int) -> npt.NDArray[np.uint64]:
        return np.arange(n, dtype=np.uint64) * np.uint64(2 * block_bytes)

    def flat(n: int) -> TransferDescriptors:
        length = np.full(n, block_bytes, dtype=np.uint64)
        return TransferDescriptors(src[0] + offsets(n), dst[0] + offsets(n), length)

    def rows(n: int, count: int) -> StridedDescriptors:
        """n rows of `count` blocks each, the rows as far apart as the blocks."""

        def side(base: int) -> npt.NDArray[np.uint64]:
            out = np.zeros((n, 5), dtype=np.uint64)
            out[:, 0] = base + offsets(n)
            # A single block's stride is its length (the form pdplan writes).
            stride = 2 * block_bytes if count > 1 else block_bytes
            out[:, 1], out[:, 3], out[:, 4] = block_bytes, stride, count
            return out

        return StridedDescriptors(side(src[0]), side(dst[0]))

    # Every shape at every count in each round, side by side: an engine whose speed drifts
    # (a loopback's progress thread on a busy machine) drifts for all shapes alike.
    shapes: list[tuple[Callable[[Any], object], Callable[[int], Any]]] = [(move_flat, flat)]
    if move_strided is not None:
        shapes += [(move_strided, lambda n: rows(1, n)), (move_strided, lambda n: rows(n, 1))]
    made = [[shape(n) for n in sizes] for _, shape in shapes]
    best = [[float("inf")] * len(sizes) for _ in shapes]
    for _ in range(repeat):
        for i, (move, _) in enumerate(shapes):
            for j in range(len(sizes)):
                start = clock()
                move(made[i][j])
                best[i][j] = min(best[i][j], clock() - start)
    timed = [tuple(zip(sizes, times, strict=True)) for times in best]
    flat_times = timed[0]
    per_descriptor = _core.fit_line(list(flat_times))[1]
    block_times: tuple[tuple[int, float], ...] = ()
    row_times: tuple[tuple[int, float], ...] = ()
    per_row, per_block = model.per_row_s, model.per_block_s
    if move_strided is not None:
        block_times, row_times = timed[1], timed[2]
        per_block = _core.fit_line(list(block_times))[1]
        # A row of one block costs the row and its block.
        per_row = max(0.0, _core.fit_line(list(row_times))[1] - per_block)
    calibrated = replace(
        model, per_descriptor_s=per_descriptor, per_row_s=per_row, per_block_s=per_block
    )
    return PostingCalibration(calibrated, flat_times, block_times, row_times)


def _checked_counts(counts: Sequence[int], repeat: int, block_bytes: int) -> tuple[int, ...]:
    def whole(value: object, least: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= least

    sizes = tuple(counts) if isinstance(counts, (tuple, list, range)) else ()
    if not all(whole(n, 1) and n <= 1 << 20 for n in sizes) or len(set(sizes)) < 2:
        raise UnsupportedPDLayoutError(
            f"counts must hold two different counts at least, each 1 to 2^20, got {shown(counts)}"
        )
    if not whole(repeat, 1) or not whole(block_bytes, 1):
        raise UnsupportedPDLayoutError(
            "repeat and block_bytes must be ints of at least 1, got "
            f"{shown(repeat)} and {shown(block_bytes)}"
        )
    return sizes
