"""The prefill instances a decode rank has met. Each is connected in the background (its
handshakes on an executor, never on the engine's step): the first rank that answers tells the
layout (identity and planner fingerprint compared), then every source rank this decode rank
reads tells its addresses; ranks that do not answer are planned around where others hold their
bytes. What one request needs of a peer is computed once per instance, not per request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdplan._bounded import shown
from pdplan._core import PreparedTransfer, UnsupportedPDLayoutError
from pdplan._exchange import decode_layout, encode_layout
from pdplan._model import ParallelLayout, RankTransferPlan
from pdplan._planner import PDTransferPlanner
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES
from pdplan.runtimes._conventions import RuntimeConventions
from pdplan.session._cache import WorkerCache
from pdplan.session._faults import (
    LayoutRefused,
    PeerGone,
    SettingsFault,
    TransferFault,
    VersionSkew,
)
from pdplan.session._protocol import (
    PrefillRankInfo,
    block_sizes_of,
    check_identity,
    hello,
    rank_info,
)
from pdplan.session._requests import Remote
from pdplan.session._side_channel import ask

logger = logging.getLogger("pdplan.session")

#: How long an instance whose handshake failed (none of its ranks answered, or it refused)
#: fails its requests with that fault before it is asked again (each ask waits the handshake
#: timeout; an instance started again is met within this).
RETRY_FAILED_SECONDS = 5.0
#: Ranks asked for a first handshake at most, when the first ones do not answer.
MAX_FIRST_TRIES = 8
#: Instances connected at once (each connection waits on the network, not a core), and
#: instances waiting to connect at most (their engine ids come from clients).
HANDSHAKE_THREADS = 8
MAX_CONNECTING = 256


@dataclass
class Peer:
    """One prefill instance as one decode rank reads it."""

    host: str
    port: int
    planner: PDTransferPlanner
    decode_rank: int
    #: Each of the instance's KV cache groups' rules: its blocks and pages, which may hold
    #: other token counts than ours (those groups pair token by token).
    rules: tuple[RuntimeConventions, ...]
    ranks: dict[int, PrefillRankInfo] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    #: The instance's registration generation, as its first handshake reply said.
    generation: int = 0
    #: Dropped for a newer registration (or a failed read): its streams end, no read starts.
    stale: bool = False
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
    def sources(self) -> list[int]:
        """The prefill ranks this decode rank reads."""
        return list(self.plan.target_prefill_ranks)

    @property
    def ready(self) -> bool:
        """Whether every source rank has told its addresses (or the peer is lost)."""
        return self.lost or all(rank in self.ranks for rank in self.sources)

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


def _side(tp: int, pp: int) -> str:
    """A side's parallel layout as refusals name it."""
    return f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "")


def _check_generation(remote: Remote, peer: Peer) -> None:
    """A request whose blocks were written before its instance registered its cache again
    fails: they are gone. Generation 0 is a request that does not know (a streamed one, or
    one from a runtime without generations)."""
    if 0 < remote.generation < peer.generation:
        raise PeerGone(
            f"the prefill instance registered its cache again (generation {peer.generation}) "
            f"after this request's blocks were written (generation {remote.generation}): "
            "they are gone"
        )


class Peers:
    """The prefill instances one decode rank reads, each connected in the background:
    ``connected`` never waits on the network."""

    def __init__(self, cache: WorkerCache, layout: ParallelLayout, rank: int,
                 timeout_seconds: float,
                 on_dropped: Callable[[Peer], None] = lambda peer: None) -> None:  # fmt: skip
        self._cache = cache
        self._layout = layout
        self._rank = rank
        self.timeout = timeout_seconds
        self._frames = encode_layout(layout, cache.cache.buffers)
        self._peers: dict[str, Peer] = {}
        # Told of a peer dropped (its engine metadata to forget before the next handshake).
        self._on_dropped = on_dropped
        self._connecting: dict[str, Future[Peer]] = {}
        # Instances whose handshake failed: the fault, and since when.
        self._failed: dict[str, tuple[TransferFault, float]] = {}
        self._executor = ThreadPoolExecutor(HANDSHAKE_THREADS, "pdplan-handshake")

    def connected(self, remote: Remote) -> Peer | None:
        """The instance's peer once connected, None while it connects; its fault when it
        could not be (each request waiting for it fails with it)."""
        peer = self._peers.get(remote.engine_id)
        if peer is not None and 0 < peer.generation < remote.generation:
            # It registered its memory again (it slept, or reloaded weights): handshake anew.
            self.drop(remote.engine_id)
            peer = None
        if peer is not None and peer.ready:
            _check_generation(remote, peer)
            return peer
        future = self._connecting.get(remote.engine_id)
        if future is None:
            failed = self._failed.get(remote.engine_id)
            if failed is not None and time.monotonic() - failed[1] < RETRY_FAILED_SECONDS:
                raise type(failed[0])(str(failed[0]))
            if len(self._connecting) >= MAX_CONNECTING:
                raise SettingsFault(f"{MAX_CONNECTING} prefill instances are connecting already")
            self._connecting[remote.engine_id] = self._executor.submit(self._connect, remote, peer)
            return None
        if not future.done():
            return None
        del self._connecting[remote.engine_id]
        try:
            peer = future.result()
        except Exception as error:  # every request waiting for the instance fails with it
            fault = error if isinstance(error, TransferFault) else TransferFault(str(error))
            self._failed[remote.engine_id] = (fault, time.monotonic())
            raise fault from None
        self._peers[remote.engine_id] = peer
        _check_generation(remote, peer)
        return peer

    def drop(self, engine_id: str) -> None:
        """Forgets an instance's peer (its next request handshakes anew)."""
        peer = self._peers.pop(engine_id, None)
        self._failed.pop(engine_id, None)
        if peer is not None:
            peer.stale = True
            self._on_dropped(peer)

    def ask(self, host: str, port: int, frames: list[bytes]) -> list[bytes]:
        """One request to a prefill rank, waiting the handshake timeout at most."""
        return ask(host, port, frames, self.timeout)

    def _hello(self, host: str, port: int) -> list[bytes]:
        return self.ask(host, port, hello(self._cache.identity_bytes(), self._frames))

    def _connect(self, remote: Remote, peer: Peer | None) -> Peer:
        """Runs on the executor: the first handshake (unless met before), then each source
        rank's, reading around those that do not answer."""
        if peer is None:
            peer = self._first(remote)
        while not peer.ready:
            for rank in peer.sources:
                if rank not in peer.ranks:
                    try:
                        peer.ranks[rank] = rank_info(self._hello(peer.host, peer.port + rank))
                    except PeerGone:
                        peer.lose(rank)
                        break
        return peer

    def _first(self, remote: Remote) -> Peer:
        host, port = remote.host, remote.port
        first_error: Exception | None = None
        for rank in range(min(remote.ranks, MAX_FIRST_TRIES)):
            try:
                reply = self._hello(host, port + rank)
            except PeerGone as error:
                first_error = first_error or error
                continue
            try:
                peer = self._peer_of(reply, host, port, rank)
            except UnsupportedPDLayoutError as error:
                kind = type(error) if isinstance(error, TransferFault) else LayoutRefused
                raise kind(
                    f"{self._cache.family}, prefill {_side(remote.tp_size, remote.pp_size)} -> "
                    f"decode {_side(self._layout.tp_size_per_dp, self._layout.pp_size)}: {error}"
                ) from None
            for silent in range(rank):
                peer.lose(silent)
            return peer
        raise first_error or PeerGone(f"no prefill rank at {host}:{port}")

    def _peer_of(self, reply: list[bytes], host: str, port: int, rank: int) -> Peer:
        """The peer of a first handshake reply, its identity and fingerprint checked."""
        info = rank_info(reply)
        check_identity(self._cache.identity, reply[0], "prefill")
        rules = self._cache.peer_rules(block_sizes_of(reply[0], len(self._cache.groups), "prefill"))
        layout = decode_layout(reply[1], reply[2], max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
        planner = self._cache.rules.planner(
            prefill_layout=layout.layout,
            decode_layout=self._layout,
            prefill_buffers=layout.buffers,
            decode_buffers=self._cache.cache.buffers,
            token_maps=self._cache.token_maps(rules),
        )
        if planner.fingerprint.encode() != reply[4]:
            raise VersionSkew(
                f"the prefill instance at {host}:{port + rank} plans differently (fingerprint "
                f"{shown(reply[4])}, here {shown(planner.fingerprint)}); run one pdplan version "
                "on both sides"
            )
        peer = Peer(host, port, planner, self._rank, rules, generation=info.generation)
        peer.ranks[rank] = info
        return peer

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
