"""The prefill instances a decode rank has met: the handshake with each (layouts, identity and
fingerprint compared), the planner built from both layouts (around the ranks found gone), and
what one request needs of it, computed once per instance, not per request."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pdplan._bounded import shown
from pdplan._core import PreparedTransfer, UnsupportedPDLayoutError
from pdplan._exchange import decode_layout
from pdplan._model import RankTransferPlan
from pdplan._planner import PDTransferPlanner
from pdplan.connectors._identity import check_identity
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers


@dataclass(frozen=True)
class PrefillRankInfo:
    """What one prefill rank told in its handshake."""

    bases: tuple[int, ...]
    limits: tuple[int, ...]
    engine: bytes


def rank_info(frames: list[bytes]) -> PrefillRankInfo:
    """A handshake reply's addresses and engine metadata (``identity, version, payload,
    engine, fingerprint``)."""
    if len(frames) != 5:
        raise UnsupportedPDLayoutError(f"a handshake reply has {len(frames)} frames, not 5")
    layout = decode_layout(frames[1], frames[2], max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
    if layout.base_ptrs is None or layout.limits is None:
        raise UnsupportedPDLayoutError("the prefill rank sent no base addresses")
    return PrefillRankInfo(tuple(layout.base_ptrs), tuple(layout.limits), frames[3])


@dataclass
class Peer:
    """One prefill instance as one decode rank reads it."""

    host: str
    port: int
    planner: PDTransferPlanner
    decode_rank: int
    ranks: dict[int, PrefillRankInfo] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    prepared: dict[int, PreparedTransfer] = field(default_factory=dict)
    _plan: RankTransferPlan | None = None
    _waits: dict[int, int] | None = None
    _lost: bool | None = None

    @property
    def lost(self) -> bool:
        """Whether the ranks gone hold bytes of this decode rank no other rank holds."""
        if self._lost is None:
            self._lost = bool(self.planner.lost(self.decode_rank))
        return self._lost

    @property
    def plan(self) -> RankTransferPlan:
        """This decode rank's plan."""
        if self._plan is None:
            self._plan = self.planner.plan_for_decode_rank(self.decode_rank)
        return self._plan

    @property
    def holders(self) -> list[int]:
        """The prefill ranks that hold a request's blocks for this rank (sources and
        notify-only ranks): each hears "done"."""
        return sorted({*self.plan.target_prefill_ranks, *self.plan.notify_prefill_ranks})

    @property
    def waits(self) -> dict[int, int]:
        """How many decode ranks tell each prefill rank they are done."""
        if self._waits is None:
            counts: dict[int, int] = {}
            for rank in range(self.planner.decode_layout.world_size):
                plan = self.planner.plan_for_decode_rank(rank)
                for p in {*plan.target_prefill_ranks, *plan.notify_prefill_ranks}:
                    counts[p] = counts.get(p, 0) + 1
            self._waits = counts
        return self._waits

    def lose(self, rank: int) -> None:
        """Plans around prefill rank ``rank`` from now on (both sides compute the same)."""
        logger.warning("pdplan: prefill rank %d at %s:%d did not answer; reading around it",
                       rank, self.host, self.port + rank)  # fmt: skip
        self.gone.add(rank)
        self.planner = self.planner.without_prefill_ranks(self.gone)
        self.prepared.clear()
        self._plan = self._waits = self._lost = None

    def transfer(self, rank: int, dst_bases: Any, dst_limits: Any) -> PreparedTransfer:
        """The prepared transfer from source ``rank``, built once."""
        prepared = self.prepared.get(rank)
        if prepared is None:
            info = self.ranks[rank]
            prepared = PreparedTransfer.from_layouts(
                self.planner, self.decode_rank, rank, info.bases, dst_bases,
                src_limits=info.limits, dst_limits=dst_limits,
            )  # fmt: skip
            self.prepared[rank] = prepared
        return prepared


def first_peer(
    reply: list[bytes], own_identity: dict[str, Any], planner_of: Any, where: str,
    decode_rank: int, host: str, port: int, rank: int,
) -> Peer:  # fmt: skip
    """The peer of a first handshake reply, its identity and fingerprint checked."""
    info = rank_info(reply)
    check_identity(own_identity, reply[0], "prefill")
    layout = decode_layout(reply[1], reply[2], max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
    planner: PDTransferPlanner = planner_of(layout.layout, layout.buffers)
    if planner.fingerprint.encode() != reply[4]:
        raise UnsupportedPDLayoutError(
            f"the prefill instance at {where} plans differently (fingerprint "
            f"{shown(reply[4])}, here {shown(planner.fingerprint)}); run one pdplan version on "
            "both sides"
        )
    peer = Peer(host, port, planner, decode_rank)
    peer.ranks[rank] = info
    return peer
