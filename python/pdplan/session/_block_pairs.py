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
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pdplan._context import token_slots
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


def paired_slots(
    local: Sequence[int],
    local_tokens: tuple[int, int],
    local_block: int,
    remote: Sequence[int],
    remote_block: int,
    num_tokens: int,
    group: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The two sides' slot maps of a group whose blocks hold other token counts on the two
    sides, ``(remote, local)``, each ``num_tokens`` long (-1 where a side does not hold a
    token): a token moves where both hold it, from the first the decode side needs.

    The prefill side's kept blocks are the tail of its list over ``[0, num_tokens)``; the
    decode side's start at ``local_tokens[0]`` and it needs the group's tokens from
    ``local_tokens[1]`` (its prefix hit, a window's first kept token) up to ``num_tokens``.

    :param local: The decode side's blocks to fill.
    :param local_tokens: The token its first block starts at, and the first token it needs.
    :param local_block: Tokens a decode block holds (the scheduler's).
    :param remote: The prefill side's kept blocks.
    :param remote_block: Tokens a prefill block holds.
    :param num_tokens: The tokens the prefill side holds.
    :param group: The group's number, for the refusal.
    """
    first, needed = local_tokens
    blocks_over = -(-num_tokens // remote_block)
    remote_first = (blocks_over - len(remote)) * remote_block
    if remote_first < 0:
        raise UnsupportedPDLayoutError(
            f"KV cache group {group}: the prefill side sent {len(remote)} blocks of "
            f"{remote_block} tokens for {num_tokens} tokens"
        )
    if first % local_block or first > needed:
        raise UnsupportedPDLayoutError(
            f"KV cache group {group}: the decode side's blocks start at token {first}, which "
            f"is no block boundary at or before the first token it needs ({needed})"
        )
    if remote_first > needed or first + len(local) * local_block < num_tokens:
        raise UnsupportedPDLayoutError(
            f"KV cache group {group}: the decode side needs tokens {needed}..{num_tokens}, the "
            f"prefill side keeps {remote_first}..{num_tokens} and the decode side's blocks "
            f"hold {first}..{first + len(local) * local_block}: the prefill side freed bytes "
            "the decode side needs (a window kept differently on the two sides)"
        )

    def slots(blocks: Sequence[int], start: int, block: int, wanted: range) -> Any:
        table = np.concatenate(
            [np.full(start // block, -1, np.int64), np.asarray(blocks, np.int64)]
        )
        return token_slots(table, block, num_tokens, tokens=wanted)

    wanted = range(needed, num_tokens)
    return (
        slots(remote, remote_first, remote_block, wanted),
        slots(local, first, local_block, wanted),
    )
