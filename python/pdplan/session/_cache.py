"""One rank's cache as the session moves it, whatever the runtime: its buffers (a
``CacheBuffers`` a runtime adapter read from its own tensors), the groups of buffers that share
block ids (a runtime's KV cache groups: each with its own blocks and pages), and the identity
two instances must share to pair."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdplan._arrays import CacheBuffers
from pdplan.runtimes._conventions import RuntimeConventions
from pdplan.session._protocol import identity_bytes


@dataclass(frozen=True)
class GroupCache:
    """Buffers that one list of block ids addresses, and how those ids name cache pages
    (the runtime's conventions: block size, kernel pages, the replica rule)."""

    buffers: tuple[int, ...]
    rules: RuntimeConventions


@dataclass(frozen=True)
class WorkerCache:
    """A rank's buffers, each group's, and its identity: what must match the peer's for the
    two to pair (the model, its dtype, the groups the runtime made)."""

    cache: CacheBuffers
    groups: tuple[GroupCache, ...]
    identity: dict[str, Any]
    family: str
    """The model's architecture, as refusals name it."""

    @property
    def rules(self) -> RuntimeConventions:
        """The runtime's planning rules (the replica rule; the blocks of the first group)."""
        return self.groups[0].rules

    def identity_bytes(self) -> bytes:
        return identity_bytes(self.identity)

    @property
    def layers(self) -> tuple[int, ...] | None:
        """Every model layer of the buffers, for reads of some layers ahead of the others;
        None where a buffer names no layer (then streams read whole steps only)."""
        known = [b.layer for b in self.cache.buffers]
        if None in known:
            return None
        return tuple(sorted({int(k) for k in known if k is not None}))
