"""A request's counts by slot maps (page sizes that differ, context parallelism), in time that
does not grow with its length.

Over scattered pages a descriptor never continues across a page boundary of either side, and
where both sides deal tokens periodically (no CP, or CP and DCP dealing in round-robin blocks)
the boundaries repeat every ``period`` tokens for every rank: a period of the request's middle
adds the same counts as any other. So a long request counts as a shorter one of the same head
and tail, plus whole periods times the counts one period adds, each from a walk of a few
periods that the Rust core runs (``PreparedTransfer.token_staging_counts``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pdplan._context import token_slots
from pdplan._core import UnsupportedPDLayoutError
from pdplan._staging import StagingCounts

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from pdplan._core import PreparedTransfer
    from pdplan._model import ParallelLayout, TransferFragment

__all__ = ["SlotCounter", "token_period"]

#: Periods a walk keeps beside the head and the tail: two, so the unit is measured between
#: walks of at least two pages on each side (no fragment's first and last page are one).
_KEPT_PERIODS = 2


def _spread(layout: ParallelLayout) -> tuple[int, int] | None:
    """Ranks one side deals tokens over and the block it deals, or None where the dealing is
    not periodic (contiguous or zigzag shares depend on the request's length)."""
    ways = layout.cp_size * layout.dcp_size
    if ways == 1 or layout.cp_kv == "replicated":
        return 1, 1
    if layout.cp_split != "interleave":  # CP or DCP shares by the request's length
        return None
    return ways, layout.cp_interleave


def token_period(
    layouts: tuple[ParallelLayout, ParallelLayout], page_sizes: tuple[int, int], chunk: int = 1
) -> int | None:
    """Tokens after which every rank's page boundaries on both sides repeat (and attention
    chunks of `chunk` tokens start), or None."""
    period = chunk
    for layout, page_size in zip(layouts, page_sizes):
        spread = _spread(layout)
        if spread is None:
            return None
        ways, block = spread
        period = math.lcm(period, page_size * ways, block * ways)
    return period


def _add(a: StagingCounts, b: StagingCounts, times: int = 1) -> StagingCounts:
    """``a`` plus ``times`` ``b`` (one transfer, any bytes at all)."""
    total = a.bytes + times * b.bytes
    return StagingCounts(
        a.direct_descriptors + times * b.direct_descriptors,
        int(total > 0),
        a.gather_descriptors + times * b.gather_descriptors,
        a.scatter_descriptors + times * b.scatter_descriptors,
        total,
    )


def _less(a: StagingCounts, b: StagingCounts) -> StagingCounts:
    """What ``a`` counts beyond ``b``."""
    return StagingCounts(*(x - y for x, y in zip(a, b)))


class SlotCounter:
    """Counts one pairing's requests by slot maps.

    :param layouts: The prefill and decode layouts.
    :param page_sizes: Tokens a page on each side.
    :param kv: The token-indexed buffers' indices (state moves apart).
    :param prepare: Prepares a pair's fragments over stand-in caches of so many pages.
    :param reach: The most tokens before the end a layer keeps (its sliding window or
        attention chunk; 0: every layer keeps every token): the kept tail covers it, so the
        periods taken out of the middle are outside every window.
    :param chunk: The attention chunks' size, whose starts the period keeps (1: none).
    """

    def __init__(
        self,
        layouts: tuple[ParallelLayout, ParallelLayout],
        page_sizes: tuple[int, int],
        kv: Sequence[int],
        prepare: Callable[[Sequence[TransferFragment], int], PreparedTransfer],
        reach: int = 0,
        chunk: int = 1,
    ) -> None:
        self.layouts = layouts
        self.page_sizes = page_sizes
        self.kv = list(kv)
        self.prepare = prepare
        self.period = token_period(layouts, page_sizes, chunk)
        # Periods kept before the end: the windows' reach, then the kept periods.
        self._tail = _KEPT_PERIODS + (-(-reach // self.period) if self.period else 0)
        self._units: dict[tuple[int, int], tuple[PreparedTransfer, StagingCounts]] = {}

    def _pages(self, tokens: int) -> int:
        """Pages a stand-in cache needs for a walk of `tokens` tokens (every other page)."""
        return 2 * max(-(-tokens // size) for size in self.page_sizes) + 2

    def walk(
        self, prepared: PreparedTransfer, pair: tuple[int, int], tokens: int, prefix: int
    ) -> StagingCounts:
        """The counts of a request of `tokens` tokens, the decode rank's slots cleared below
        `prefix`, its pages every other one, backwards."""
        import numpy as np

        decode_rank, prefill_rank = pair

        def slots(side: int, rank: int) -> npt.NDArray[np.int64]:
            size = self.page_sizes[side]
            count = -(-tokens // size)
            table = np.arange(2 * count - 2, -1, -2, dtype=np.int64)
            return token_slots(table, size, tokens, layout=self.layouts[side], rank=rank)

        dst = slots(1, decode_rank).copy()
        dst[:prefix] = -1
        return prepared.token_staging_counts(slots(0, prefill_rank), dst, buffers=self.kv)

    def counts(
        self, pair: tuple[int, int], fragments: Sequence[TransferFragment], tokens: int, prefix: int
    ) -> StagingCounts:
        """One pair's KV counts for a request of `tokens` tokens, the decode side holding the
        first `prefix`."""
        period = self.period
        if period is None:
            return self.walk(self.prepare(fragments, self._pages(tokens)), pair, tokens, prefix)
        # Whole periods the prefix covers shift away: the rest starts within the first.
        shift = prefix // period * period
        tokens, prefix = tokens - shift, prefix - shift
        # The first period (holding the prefix's end), kept periods, the middle, then the
        # tail's periods and the last partial one; each period of the middle adds `unit`.
        steady = (1 + _KEPT_PERIODS + self._tail) * period
        if tokens < steady + period:  # nothing to take out: the request as it is
            return self.walk(self.prepare(fragments, self._pages(tokens)), pair, tokens, prefix)
        if pair not in self._units:
            prepared = self.prepare(fragments, self._pages(steady + 2 * period))
            unit = _less(
                self.walk(prepared, pair, steady + period, 0), self.walk(prepared, pair, steady, 0)
            )
            if min(unit) < 0:  # never scale what does not repeat
                raise UnsupportedPDLayoutError(
                    f"rank pair {pair}'s slot maps do not repeat every {period} tokens (a bug in "
                    "pdplan's period)"
                )
            self._units[pair] = (prepared, unit)
        prepared, unit = self._units[pair]
        middle = max(0, tokens // period - steady // period)
        shorter = self.walk(prepared, pair, tokens - middle * period, prefix)
        return _add(shorter, unit, middle) if middle else shorter
