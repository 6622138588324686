"""Context parallelism: which CP rank holds each token, and each rank's slot map. The dealing
runs in Rust (src/context.rs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdplan import _core
from pdplan._model import CpSplit, ParallelLayout

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["token_owners", "token_slots"]


def token_slots(
    page_table: npt.NDArray[np.integer] | Sequence[int],
    page_size: int,
    num_tokens: int,
    *,
    tokens: range | None = None,
    layout: ParallelLayout | None = None,
    rank: int | None = None,
) -> npt.NDArray[np.int64]:
    """One rank's slot map for a request of ``num_tokens`` tokens (int64, -1 for tokens it
    holds no slot for), for ``token_descriptors``.

    Its tokens, in order, are its local tokens ``0, 1, ...``; local token ``i`` sits at
    ``page_table[i // page_size] * page_size + i % page_size``.

    :param page_table: The rank's pages of the request, in order (a 1-D integer array or a
        sequence of ints). An entry of -1 is a page the rank does not hold (a token asked for
        on one is refused).
    :param page_size: Tokens a page holds.
    :param num_tokens: The request's length: the map has one entry a token.
    :param tokens: The tokens the rank holds (a range); None: all.
    :param layout: With ``rank``: the rank holds only the tokens of its share
        (``layout.token_share(rank)``: its CP or DCP share, dealt as the layout says).
    :param rank: With ``layout``: the rank whose share it is.
    """
    return _core.token_slots(
        page_table, page_size, num_tokens, tokens=tokens, layout=layout, rank=rank
    )


def token_owners(
    num_tokens: int,
    cp_size: int,
    *,
    cp_split: CpSplit = "interleave",
    interleave: int = 1,
    page_size: int = 1,
) -> npt.NDArray[np.int64]:
    """The CP rank holding each token of a request of ``num_tokens`` tokens (int64).

    - ``"interleave"``: token ``t`` on rank ``(t // interleave) % cp_size`` (vLLM's DCP;
      ``interleave = page_size`` is block round-robin, TRT-LLM's and vLLM-PD's);
    - ``"contiguous"``: blocks of ``page_size`` tokens dealt in runs, rank ``r`` holding
      ``N // cp_size`` blocks plus one if ``r < N % cp_size`` (``N`` blocks in the request);
    - ``"zigzag"``: chunks of ``ceil(num_tokens / (2 * cp_size))`` tokens, rank ``r`` holding
      chunk ``r`` and chunk ``2 * cp_size - 1 - r`` (SGLang's, rtp-llm's).

    :param num_tokens: The request's length.
    :param cp_size: Ranks the tokens are dealt over.
    :param cp_split: How they are dealt: ``"interleave"``, ``"contiguous"`` or ``"zigzag"``.
    :param interleave: Consecutive tokens one rank takes under ``"interleave"``.
    :param page_size: Tokens a block under ``"contiguous"``.
    """
    return _core.token_owners(
        num_tokens, cp_size, cp_split=cp_split, interleave=interleave, page_size=page_size
    )
