"""Which of a request's blocks a KV cache group moves, and how the decode side's blocks pair
with the prefill side's: the same on every runtime whose block tables name a null block for
blocks a group no longer keeps (vLLM's hybrid allocator; SGLang's SWA pool).

A group's block list covers the request's tokens from the first, one block a position. A
sliding-window or chunked-local group replaces the blocks that left its window with the null
block, always at the head of the list; a state group (Mamba, GDN, short conv) keeps its
running state in one slot, after any it superseded and before the speculative scratch slots.
Both sides keep the same positions for the same tokens, so a group's live blocks pair from the
tail: the decode side's last block with the prefill side's last block. Pairing from the head
(what a full-attention group allows) would give a window group's decode blocks the prefill
side's null blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pdplan._core import UnsupportedPDLayoutError

#: How a group holds a request's blocks: every token's (``"attention"``), the tokens of a
#: window or a chunk, the rest null (``"window"``), or one state slot (``"state"``).
GroupKind = Literal["attention", "window", "state"]


def kept_blocks(
    blocks: Sequence[int], kind: GroupKind, null_block: int, scratch_blocks: int = 0
) -> tuple[int, ...]:
    """The blocks of a request a group keeps, in order: for a window, those after its leading
    null blocks; for a state group, the running state's slot (``scratch_blocks`` trailing
    speculative slots dropped); for attention, all. A null block where a group keeps bytes is
    refused: nothing would be read into it, or from it, but noise.

    :param blocks: The group's block ids, as the runtime lists them (nulls included).
    :param kind: The group's ``GroupKind``.
    :param null_block: The id standing for a block not kept (vLLM's: 0).
    :param scratch_blocks: Speculative scratch slots a state group holds after its state.
    """
    listed = tuple(blocks)
    if kind == "state":
        if not listed:
            return ()
        scratch = min(scratch_blocks, len(listed) - 1)
        kept = listed[: len(listed) - scratch][-1:]
    elif kind == "window":
        live = next((i for i, b in enumerate(listed) if b != null_block), len(listed))
        kept = listed[live:]
    else:
        kept = listed
    if null_block in kept:
        raise UnsupportedPDLayoutError(
            f"a {kind} group's blocks {list(listed)[:16]} hold the null block {null_block} "
            "where the group keeps bytes"
        )
    return kept


def paired_blocks(
    local: Sequence[int], remote: Sequence[int], group: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The prefill side's blocks that pair with the decode side's ``local`` (both as
    ``kept_blocks`` gives them), tail to tail: the decode side may hold fewer (a prefix it
    computed or cached itself, a window's blocks it never kept), never more.

    :param local: The decode side's blocks to fill.
    :param remote: The prefill side's kept blocks.
    :param group: The group's number, for the refusal.
    """
    if len(local) > len(remote):
        raise UnsupportedPDLayoutError(
            f"KV cache group {group}: the decode side holds {len(local)} blocks to fill, the "
            f"prefill side keeps {len(remote)}: the prefill side freed bytes the decode side "
            "needs (a window or state kept differently on the two sides)"
        )
    return tuple(local), tuple(remote[len(remote) - len(local) :])
