"""What a decode rank is asked to pull, as the session sees a request whatever the runtime:
its blocks here, where the prefill side keeps the same tokens, and whether it streams. A
runtime's adapter fills these from its own request protocol (vLLM: ``kv_transfer_params``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pdplan._core import UnsupportedPDLayoutError

#: KV cache groups a request names at most, and blocks a group.
MAX_GROUPS = 64
MAX_BLOCKS = 1 << 22


class Remote(NamedTuple):
    """Where a decode request's KV is: the prefill instance and its request. (A tuple: made
    once a request on vLLM's scheduling thread, where a frozen dataclass costs four times.)"""

    engine_id: str
    request_id: str
    host: str
    port: int
    tp_size: int
    #: How many times the prefill instance has registered its memory, as it last said: a
    #: newer one than the handshake met means its engine metadata changed (re-handshake).
    generation: int = 0
    #: The instance's pipeline stages: its ranks are ``tp_size * pp_size``, TP fastest.
    pp_size: int = 1

    @property
    def ranks(self) -> int:
        """The instance's ranks (of one DP group), each listening on ``port + rank``."""
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class Stream:
    """A decode request that streams: the stream's id, the tokens the decode side holds
    already (its prefix hit) and the prompt's length."""

    stream_id: str
    decode_prefix: int
    final_length: int


class Receive(NamedTuple):
    """One decode request to pull: its local blocks (per KV cache group) and where the prefill
    side keeps the same tokens (a tuple, as ``Remote``: one made a request on vLLM's scheduling
    thread). Empty ``local_blocks``: nothing to read, only tell the
    prefill ranks they may free the request (an aborted request, a full local hit).
    ``refused``: why the request's parameters cannot be read (``remote`` is then None); the
    decode rank reports its blocks for the runtime to recompute."""

    request_id: str
    local_blocks: tuple[tuple[int, ...], ...]
    remote_blocks: tuple[tuple[int, ...], ...]
    remote: Remote | None
    refused: str = ""
    stream: Stream | None = None
    #: Per KV cache group, ``(the token local_blocks[g][0] starts at, the first token this
    #: side needs of the group)``: where the blocks sit in the request, so that groups of other
    #: block sizes on the two sides pair token by token. () where unknown (equal block sizes
    #: pair block by block from the tail).
    local_tokens: tuple[tuple[int, int], ...] = ()
    #: Tokens of the request the prefill side holds (its blocks cover ``[0, num_tokens)``,
    #: each group's kept ones the tail); 0 where unknown.
    num_tokens: int = 0


def block_groups(block_ids: Any, key: str = "remote_block_ids") -> tuple[tuple[int, ...], ...]:
    """Block ids per KV cache group, whether given as one list or one per group, read
    strictly (they come from a client or a peer)."""
    if type(block_ids) is list and len(block_ids) == 1 and type(block_ids[0]) is list:
        # One group, as a request of one KV cache group names them: the common case, checked
        # at C speed (exact ints, none negative, at most MAX_BLOCKS).
        only = block_ids[0]
        if len(only) <= MAX_BLOCKS and (
            not only or (set(map(type, only)) == {int} and min(only) >= 0)
        ):
            return (tuple(only),)
    if not isinstance(block_ids, (list, tuple)):
        raise UnsupportedPDLayoutError(f"{key} must be a list")
    if not block_ids:
        return ()
    groups = [block_ids] if not isinstance(block_ids[0], (list, tuple)) else list(block_ids)
    if len(groups) > MAX_GROUPS:
        raise UnsupportedPDLayoutError(f"{key} holds over {MAX_GROUPS} KV cache groups")
    out = []
    for group in groups:
        if not isinstance(group, (list, tuple)) or len(group) > MAX_BLOCKS:
            raise UnsupportedPDLayoutError(f"{key} must hold lists of at most {MAX_BLOCKS} ids")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in group):
            raise UnsupportedPDLayoutError(f"{key} must hold non-negative integers")
        out.append(tuple(group))
    return tuple(out)
