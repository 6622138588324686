"""One rank's cache as the session moves it, whatever the runtime: its buffers (a
``CacheBuffers`` a runtime adapter read from its own tensors), the groups of buffers that share
block ids (a runtime's KV cache groups: each with its own blocks and pages), and the identity
two instances must share to pair."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pdplan._arrays import CacheBuffers
from pdplan.runtimes._conventions import RuntimeConventions
from pdplan.session._faults import LayoutRefused
from pdplan.session._protocol import BLOCK_SIZES, identity_bytes


@dataclass(frozen=True)
class GroupCache:
    """Buffers that one list of block ids addresses, and how those ids name cache pages
    (the runtime's conventions: block size, kernel pages, the replica rule)."""

    buffers: tuple[int, ...]
    rules: RuntimeConventions
    state: bool = False
    """A group of recurrent state: one slot a request whatever its block's token count
    (vLLM's block of ``max_model_len`` tokens), so its pages pair as they stand."""


@dataclass(frozen=True)
class WorkerCache:
    """A rank's buffers, each group's, and its identity: what must match the peer's for the
    two to pair (the model, its dtype, the groups the runtime made)."""

    cache: CacheBuffers
    groups: tuple[GroupCache, ...]
    identity: dict[str, Any]
    family: str
    """The model's architecture, as refusals name it."""
    whole_pages: str = ""
    """Why this cache's pages move only whole, never token by token (a layout whose token
    bytes depend on its block size); empty where tokens move between any block sizes."""

    def peer_rules(
        self, block_sizes: tuple[tuple[int, int], ...]
    ) -> tuple[RuntimeConventions, ...]:
        """The peer's groups' rules: ours with its ``(block, page)`` tokens (the identity's
        ``BLOCK_SIZES``); a peer whose blocks differ from ours where only whole pages move is
        refused naming why."""
        rules = tuple(
            replace(g.rules, block_size=block, kernel_block_size=page)
            for g, (block, page) in zip(self.groups, block_sizes)
        )
        split = [n for n, (g, r) in enumerate(zip(self.groups, rules)) if g.state
                 and r.block_size != r.kernel_block_size]  # fmt: skip
        if split:
            raise LayoutRefused(
                f"the peer's state group {split[0]} splits a block into pages "
                f"({list(block_sizes[split[0]])}); a state slot is one page a request"
            )
        if self.whole_pages and self.token_maps(rules):
            raise LayoutRefused(
                f"the two instances' blocks differ ({[list(s) for s in block_sizes]} there, "
                f"{[[g.rules.block_size, g.rules.kernel_block_size] for g in self.groups]} "
                f"here), and {self.whole_pages}: serve both with one block size"
            )
        return rules

    def token_maps(self, peer_rules: tuple[RuntimeConventions, ...]) -> bool:
        """Whether a pair with a peer of these rules moves some group token by token (their
        blocks hold other token counts; state groups' slots pair whatever their blocks' token
        counts): both sides plan with token maps then."""
        return any(
            (r.block_size, r.kernel_block_size) != (g.rules.block_size, g.rules.kernel_block_size)
            for g, r in zip(self.groups, peer_rules)
            if not g.state
        )

    @property
    def rules(self) -> RuntimeConventions:
        """The runtime's planning rules (the replica rule; the blocks of the first group)."""
        return self.groups[0].rules

    def identity_bytes(self) -> bytes:
        """The identity, with each group's blocks stated for the peer (``BLOCK_SIZES``)."""
        blocks = [[g.rules.block_size, g.rules.kernel_block_size] for g in self.groups]
        return identity_bytes({**self.identity, BLOCK_SIZES: blocks})

    @property
    def layers(self) -> tuple[int, ...] | None:
        """Every model layer of the buffers, for reads of some layers ahead of the others;
        None where a buffer names no layer (then streams read whole steps only)."""
        known = [b.layer for b in self.cache.buffers]
        if None in known:
            return None
        return tuple(sorted({int(k) for k in known if k is not None}))
