"""A decode rank's side of the connector: the handshake once per prefill instance, and per
request the scheduler's block ids turned into descriptors by the planner both sides built
(``PreparedTransfer.from_layouts``), read through the engine; then every prefill rank that
holds the request's blocks hears "done". A prefill rank that does not answer is read around
where another holds its bytes (``without_prefill_ranks``); what no rank can give is reported
as blocks vLLM must recompute, never decoded from stale memory."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdplan._core import PreparedTransfer, UnsupportedPDLayoutError
from pdplan._exchange import decode_layout, encode_layout
from pdplan._model import ParallelLayout
from pdplan._planner import PDTransferPlanner
from pdplan.connectors._engines import TransferEngine
from pdplan.connectors._identity import check_identity
from pdplan.connectors._side_channel import PeerGone, ask
from pdplan.connectors.vllm._caches import WorkerCache
from pdplan.connectors.vllm._metadata import Receive
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES
from pdplan.runtimes import vllm as vllm_adapter

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers

#: How long an instance none of whose ranks answered is taken as gone before it is asked
#: again (each ask waits the handshake timeout).
RETRY_SILENT_SECONDS = 30.0


@dataclass
class PrefillRankInfo:
    """What one prefill rank told in its handshake."""

    bases: tuple[int, ...]
    limits: tuple[int, ...]
    engine: bytes


@dataclass
class Peer:
    """One prefill instance: its planner (around the ranks found gone) and its ranks."""

    host: str
    port: int
    planner: PDTransferPlanner
    ranks: dict[int, PrefillRankInfo] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    prepared: dict[int, PreparedTransfer] = field(default_factory=dict)


@dataclass
class Pull:
    """One request's reads in flight."""

    receive: Receive
    peer: Peer
    handles: list[Any]
    deadline: float


class DecodeRank:
    """Pulls requests' KV into this rank's cache."""

    def __init__(
        self, cache: WorkerCache, tp_rank: int, tp_size: int, engine: TransferEngine,
        handshake_timeout: float, transfer_timeout: float,
    ) -> None:  # fmt: skip
        self._cache = cache
        self._rank = tp_rank
        self._layout = ParallelLayout("decode", tp_size)
        self._engine = engine
        self._handshake_timeout = handshake_timeout
        self._transfer_timeout = transfer_timeout
        self._frames = encode_layout(self._layout, cache.cache.buffers)
        self._rules = vllm_adapter.conventions(
            block_size=cache.block_size, kernel_block_size=cache.kernel_block_size
        )
        self._peers: dict[str, Peer] = {}
        self._silent: dict[str, float] = {}  # instances that did not answer, since when
        self._pulls: dict[str, Pull] = {}
        self._load_errors: set[int] = set()
        self._finished: set[str] = set()
        self._failed: set[str] = set()

    # -- the handshake ------------------------------------------------------------------

    def _hello(self, host: str, port: int, rank: int) -> list[bytes]:
        frames = [b"hello", self._cache.identity_bytes(), *self._frames]
        return ask(host, port + rank, frames, self._handshake_timeout)

    def _peer(self, engine_id: str, host: str, port: int, tp_size: int) -> Peer:
        peer = self._peers.get(engine_id)
        if peer is not None:
            return peer
        silent_since = self._silent.get(engine_id)
        if silent_since is not None and time.monotonic() - silent_since < RETRY_SILENT_SECONDS:
            raise PeerGone(f"the prefill instance at {host}:{port} did not answer lately")
        first_error: Exception | None = None
        for rank in range(max(1, tp_size)):
            try:
                reply = self._hello(host, port, rank)
            except PeerGone as error:
                first_error = first_error or error
                continue
            peer = self._first_handshake(host, port, rank, reply)
            peer.gone.update(r for r in range(rank))
            if peer.gone:
                peer.planner = peer.planner.without_prefill_ranks(peer.gone)
            self._peers[engine_id] = peer
            return peer
        self._silent[engine_id] = time.monotonic()
        raise first_error or UnsupportedPDLayoutError(f"no prefill rank at {host}:{port}")

    def _first_handshake(self, host: str, port: int, rank: int, reply: list[bytes]) -> Peer:
        if len(reply) != 5:
            raise UnsupportedPDLayoutError(f"the prefill rank at {host}:{port + rank} sent "
                                           f"{len(reply)} handshake frames, not 5")  # fmt: skip
        identity, version, payload, engine, fingerprint = reply
        check_identity(self._cache.identity, identity, "prefill")
        layout = decode_layout(version, payload, max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
        planner = self._rules.planner(
            prefill_layout=layout.layout,
            decode_layout=self._layout,
            prefill_buffers=layout.buffers,
            decode_buffers=self._cache.cache.buffers,
        )
        if planner.fingerprint.encode() != fingerprint:
            raise UnsupportedPDLayoutError(
                f"the prefill instance at {host}:{port} plans differently (fingerprint "
                f"{fingerprint[:64]!r}, here {planner.fingerprint!r}); run one pdplan version "
                "on both sides"
            )
        peer = Peer(host, port, planner)
        peer.ranks[rank] = self._rank_info(layout.base_ptrs, layout.limits, engine)
        return peer

    @staticmethod
    def _rank_info(bases: Any, limits: Any, engine: bytes) -> PrefillRankInfo:
        if bases is None or limits is None:
            raise UnsupportedPDLayoutError("the prefill rank sent no base addresses")
        return PrefillRankInfo(tuple(bases), tuple(limits), engine)

    def _source(self, peer: Peer, rank: int) -> PrefillRankInfo | None:
        """A source rank's addresses, asked for once; None when it is gone."""
        if rank in peer.gone:
            return None
        if rank not in peer.ranks:
            try:
                reply = self._hello(peer.host, peer.port, rank)
            except PeerGone:
                self._lose(peer, rank)
                return None
            layout = decode_layout(reply[1], reply[2], max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
            peer.ranks[rank] = self._rank_info(layout.base_ptrs, layout.limits, reply[3])
        return peer.ranks[rank]

    def _lose(self, peer: Peer, rank: int) -> None:
        logger.warning("pdplan: prefill rank %d at %s:%d did not answer; reading around it",
                       rank, peer.host, peer.port + rank)  # fmt: skip
        peer.gone.add(rank)
        peer.planner = peer.planner.without_prefill_ranks(peer.gone)
        peer.prepared.clear()

    # -- per request --------------------------------------------------------------------

    def start(self, receive: Receive) -> None:
        """Starts a request's reads (or, without local blocks, only its notices)."""
        params = receive.remote
        try:
            peer = self._peer(
                str(params["remote_engine_id"]),
                str(params["remote_host"]),
                int(params["remote_port"]),
                int(params.get("tp_size", 1)),
            )
            handles = self._post(peer, receive) if receive.local_blocks else []
        except UnsupportedPDLayoutError as error:
            logger.error("pdplan: request %s cannot be read: %s", receive.request_id, error)
            self._fail(receive)
            return
        except Exception:  # a connector fault fails the request, never the engine
            logger.exception("pdplan: request %s failed in the connector", receive.request_id)
            self._fail(receive)
            return
        if handles is None:
            self._fail(receive)
            return
        deadline = time.monotonic() + self._transfer_timeout
        self._pulls[receive.request_id] = Pull(receive, peer, handles, deadline)

    def _post(self, peer: Peer, receive: Receive) -> list[Any] | None:
        """Posts one read a source rank; None when something is lost (after reading around
        the ranks that are gone)."""
        while True:
            plan = peer.planner.plan_for_decode_rank(self._rank)
            if peer.planner.lost(self._rank):
                logger.warning(
                    "pdplan: request %s: prefill ranks %s are gone and hold bytes no other "
                    "rank holds; its blocks are reported for vLLM to recompute",
                    receive.request_id, sorted(peer.gone),
                )  # fmt: skip
                return None
            sources = {p: self._source(peer, p) for p in plan.target_prefill_ranks}
            if all(info is not None for info in sources.values()):
                break
        handles = []
        for rank, info in sources.items():
            assert info is not None  # every source answered (the loop above)
            local, remote, lengths = self._descriptors(peer, rank, info, receive)
            if len(lengths):
                handles.append(self._engine.read(info.engine, local, remote, lengths))
        return handles

    def _descriptors(
        self, peer: Peer, rank: int, info: PrefillRankInfo, receive: Receive
    ) -> tuple[Any, Any, Any]:
        prepared = peer.prepared.get(rank)
        if prepared is None:
            own = self._cache.cache
            prepared = PreparedTransfer.from_layouts(
                peer.planner, self._rank, rank, info.bases, own.base_ptrs,
                src_limits=info.limits, dst_limits=own.limits,
            )  # fmt: skip
            peer.prepared[rank] = prepared
        parts = []
        for group, (local, remote) in enumerate(zip(receive.local_blocks, receive.remote_blocks)):
            if len(remote) != len(local):
                raise UnsupportedPDLayoutError(
                    f"request {receive.request_id}: the prefill side holds {len(remote)} "
                    f"blocks of group {group} for {len(local)} here"
                )
            parts.append(
                prepared.descriptors(
                    self._rules.pages(remote),
                    self._rules.pages(local),
                    buffers=self._cache.groups[group],
                )
            )
        src = np.concatenate([p.src_addrs for p in parts]) if parts else np.zeros(0, np.uint64)
        dst = np.concatenate([p.dst_addrs for p in parts]) if parts else np.zeros(0, np.uint64)
        lengths = np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.uint64)
        return dst, src, lengths

    def _fail(self, receive: Receive) -> None:
        blocks = {b for group in receive.local_blocks for b in group}
        if blocks:
            logger.warning("pdplan: request %s: its %d blocks are reported for vLLM to "
                           "recompute", receive.request_id, len(blocks))  # fmt: skip
        self._load_errors.update(blocks)
        if receive.local_blocks:
            self._failed.add(receive.request_id)
        self._done(receive)

    def _done(self, receive: Receive) -> None:
        # Only a request parked waiting for its blocks is reported: one without local blocks
        # (aborted before allocation, a full local hit) only notifies.
        if receive.local_blocks:
            self._finished.add(receive.request_id)

    def poll(self) -> None:
        """Completes the requests whose reads are done, failed or timed out."""
        now = time.monotonic()
        for request_id, pull in list(self._pulls.items()):
            states = [self._engine.state(h) for h in pull.handles]
            pull.handles = [h for h, s in zip(pull.handles, states) if s == "PROC"]
            failed = "ERR" in states or (pull.handles and now > pull.deadline)
            if pull.handles and not failed:
                continue
            del self._pulls[request_id]
            if failed:
                logger.error("pdplan: request %s: a read failed or timed out; its blocks are "
                             "reported for vLLM to recompute", request_id)  # fmt: skip
                self._fail(pull.receive)
            else:
                self._done(pull.receive)
            self._notify(pull.peer, pull.receive)

    def _notify(self, peer: Peer, receive: Receive) -> None:
        """Tells every prefill rank that holds the request's blocks that this rank is done,
        with how many decode ranks it waits for."""
        waits = self._waits(peer)
        request_id = str(receive.remote["remote_request_id"]).encode()
        plan = peer.planner.plan_for_decode_rank(self._rank)
        for rank in sorted({*plan.target_prefill_ranks, *plan.notify_prefill_ranks}):
            try:
                ask(peer.host, peer.port + rank,
                    [b"done", request_id, str(waits.get(rank, 1)).encode()],
                    self._handshake_timeout)  # fmt: skip
            except UnsupportedPDLayoutError as error:
                logger.warning("pdplan: prefill rank %d not told of %s: %s", rank,
                               receive.request_id, error)  # fmt: skip

    def _waits(self, peer: Peer) -> dict[int, int]:
        """How many decode ranks tell each prefill rank they are done (sources and
        notify-only ranks of every decode rank's plan)."""
        counts: dict[int, int] = {}
        for rank in range(self._layout.world_size):
            plan = peer.planner.plan_for_decode_rank(rank)
            for p in {*plan.target_prefill_ranks, *plan.notify_prefill_ranks}:
                counts[p] = counts.get(p, 0) + 1
        return counts

    def take_finished(self) -> tuple[set[str], set[str], set[int]]:
        """Requests done since the last call, those of them that failed, and their blocks."""
        done, failed, blocks = self._finished, self._failed, self._load_errors
        self._finished, self._failed, self._load_errors = set(), set(), set()
        return done, failed, blocks
