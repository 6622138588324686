"""One request of a deployment, rank pair by rank pair: what the layout costs it in
descriptors and bytes, and what the cost model says of staging it. The command prints this."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdplan._context import token_slots
from pdplan._core import PreparedTransfer, UnsupportedPDLayoutError
from pdplan._planner import PDTransferPlanner
from pdplan._staging import CostEstimate, CostModel, FormEstimate, StagingCounts

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["PairRequest", "page_sizes", "request_pairs"]


@dataclass(frozen=True)
class PairRequest:
    """One (decode rank, prefill rank) pair's share of a request."""

    decode_rank: int
    prefill_rank: int
    descriptors: int
    bytes: int
    estimate: CostEstimate
    forms: FormEstimate
    """The token-indexed buffers' form of least time, their pages consecutive on both sides
    (a fresh allocator's: where strided lists compress)."""


def page_sizes(planner: PDTransferPlanner) -> tuple[int, int]:
    """Tokens a page on each side, of the token-indexed buffers. One request is one page table
    a side here; a model whose caches page at several sizes (DeepSeek-V4: a block table per
    KV cache group, in entries of several tokens for compressed caches) is refused naming
    them."""
    sides = []
    for buffers in (planner.prefill_buffers, planner.decode_buffers):
        sizes = sorted({b.page_size for b in buffers if b.is_token_indexed})
        if len(sizes) > 1:
            raise UnsupportedPDLayoutError(
                f"the token-indexed buffers page at {len(sizes)} sizes ({sizes}), so a request "
                "has a page table per KV cache group (DeepSeek-V4's compressed caches count "
                "entries of several tokens a page): one request of N tokens on one page table "
                "is not that; move each group's pages with descriptors(..., buffers=group)"
            )
        sides.append(sizes[0] if sizes else 1)
    return sides[0], sides[1]


def request_pairs(
    planner: PDTransferPlanner,
    tokens: int,
    model: CostModel | None = None,
    chunk_bytes: int | None = None,
) -> Iterator[PairRequest]:
    """Every rank pair of one request of `tokens` tokens landing on decode DP group 0, its
    pages scattered on both sides (so no two pages happen to be neighbours). Token-indexed
    buffers move by slot maps when the plan maps tokens, else by pages; state moves as one
    page, in a staging plan of its own."""
    import numpy as np

    model = model or CostModel()
    sizes = page_sizes(planner)
    counts = [-(-tokens // size) for size in sizes]
    # Every other page, backwards: neighbours in the request are never neighbours in memory.
    tables = [np.arange(2 * count - 2, -1, -2, dtype=np.int64) for count in counts]
    consecutive = [np.arange(count, dtype=np.int64) for count in counts]
    capacity = 2 * max(counts)
    by_token = [b.buffer_index for b in planner.prefill_buffers if b.is_token_indexed]
    state = [b.buffer_index for b in planner.prefill_buffers if not b.is_token_indexed]
    src_limits = [b.item_stride_bytes * capacity for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * capacity for b in planner.decode_buffers]
    bases = [1 << 40] * len(src_limits)
    layouts = (planner.prefill_layout, planner.decode_layout)

    def slots(side: int, rank: int, pages: Any = tables) -> npt.NDArray[np.int64]:
        # The rank's share of the tokens (all of them without CP), in its own pages.
        return token_slots(pages[side], sizes[side], tokens, layout=layouts[side], rank=rank)

    def forms(prepared: PreparedTransfer, decode_rank: int, prefill_rank: int) -> FormEstimate:
        if not planner.token_maps:
            return model.choose_form(
                prepared, *consecutive, buffers=by_token, chunk_bytes=chunk_bytes
            )
        src, dst = slots(0, prefill_rank, consecutive), slots(1, decode_rank, consecutive)
        counts = prepared.token_staging_counts(src, dst, buffers=by_token, chunk_bytes=chunk_bytes)
        strided = prepared.token_strided_descriptors(src, dst, buffers=by_token)
        return model.choose_form_counts(
            counts, strided=(strided.num_entries, strided.num_descriptors)
        )

    for rank in range(planner.decode_layout.world_size):
        if planner.decode_layout.rank_coordinates(rank).dp_group != 0:
            continue
        dst_slots = slots(1, rank) if planner.token_maps else None
        sources = planner.transfer_fragments(rank, num_tokens=tokens)
        for prefill_rank, fragments in sources.items():
            prepared = PreparedTransfer(
                fragments, bases, bases, src_limits=src_limits, dst_limits=dst_limits
            )
            parts: list[StagingCounts] = []
            if dst_slots is not None:
                src_slots = slots(0, prefill_rank)
                parts.append(
                    prepared.token_staging_counts(
                        src_slots, dst_slots, buffers=by_token, chunk_bytes=chunk_bytes
                    )
                )
            else:
                parts.append(
                    prepared.staging_counts(*tables, buffers=by_token, chunk_bytes=chunk_bytes)
                )
            if state:
                parts.append(
                    prepared.staging_counts([0], [0], buffers=state, chunk_bytes=chunk_bytes)
                )
            yield PairRequest(
                rank,
                prefill_rank,
                sum(c.direct_descriptors for c in parts),
                sum(c.bytes for c in parts),
                CostEstimate.total([model.estimate_counts(c) for c in parts]),
                forms(prepared, rank, prefill_rank),
            )
