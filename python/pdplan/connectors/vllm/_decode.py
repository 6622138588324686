"""A decode rank's side of the connector: per request the scheduler's block ids turned into
descriptors by the planner both sides built (``PreparedTransfer.from_layouts``), read through
the engine; then every prefill rank that holds the request's blocks hears "done", off the step's
path. A prefill rank that does not answer is read around where another holds its bytes
(``without_prefill_ranks``); what no rank can give is reported as blocks vLLM must recompute,
never decoded from stale memory."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan._exchange import encode_layout
from pdplan._model import BufferLayout, ParallelLayout
from pdplan._planner import PDTransferPlanner
from pdplan._staging import CostModel
from pdplan.connectors._engines import TransferEngine
from pdplan.connectors._reads import Reads
from pdplan.connectors._side_channel import Notices, PeerGone, ask
from pdplan.connectors._transfer_params import Remote
from pdplan.connectors.vllm._caches import WorkerCache
from pdplan.connectors.vllm._metadata import Receive
from pdplan.connectors.vllm._peers import Peer, first_peer, rank_info
from pdplan.connectors.vllm._streams import Following, progress, slice_reads

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers

#: How long an instance none of whose ranks answered is taken as gone before it is asked
#: again (each ask waits the handshake timeout).
RETRY_SILENT_SECONDS = 30.0
#: How long a prefill rank that did not answer a progress request is not asked again.
RETRY_QUIET_SECONDS = 5.0
#: Ranks asked for a first handshake at most, when the first ones do not answer.
MAX_FIRST_TRIES = 8
#: Requests one "done" message names at most (a prefill rank reads at most this many).
MAX_NOTICES_A_MESSAGE = 1024


@dataclass
class Pull:
    """One step's reads in flight, and the requests they serve (each with its peer)."""

    requests: list[tuple[Receive, Peer]]
    handles: list[Any]
    deadline: float


class DecodeRank:
    """Pulls requests' KV into this rank's cache."""

    def __init__(
        self, cache: WorkerCache, tp_rank: int, tp_size: int, engine: TransferEngine,
        handshake_timeout: float, transfer_timeout: float, strided: bool = False,
        model: CostModel | None = None,
    ) -> None:  # fmt: skip
        self._cache = cache
        self._rank = tp_rank
        self._layout = ParallelLayout("decode", tp_size)
        self._engine = engine
        self._strided = strided
        self._model = model  # weighs strided rows against flat descriptors
        self._handshake_timeout = handshake_timeout
        self._transfer_timeout = transfer_timeout
        self._frames = encode_layout(self._layout, cache.cache.buffers)
        self._rules = cache.rules
        self._notices = Notices(handshake_timeout, lambda m: logger.warning("pdplan: %s", m))
        self._peers: dict[str, Peer] = {}
        self._silent: dict[str, float] = {}  # instances that did not answer, since when
        self._pulls: list[Pull] = []
        self._outbox: dict[tuple[str, int], list[str]] = {}
        self._load_errors: set[int] = set()
        self._finished: set[str] = set()
        self._failed: set[str] = set()
        self._following: dict[str, Following] = {}
        self._released: set[str] = set()
        # Prefill ranks that did not answer a progress request, since when (skipped a while).
        self._quiet: dict[tuple[str, int], float] = {}
        # Every model layer of this rank's buffers, for reads of some layers ahead of the
        # others; None where a buffer names no layer (then streams read whole steps only).
        known = [b.layer for b in cache.cache.buffers]
        self._layers = (
            None if None in known else tuple(sorted({int(k) for k in known if k is not None}))
        )

    # -- the handshake ------------------------------------------------------------------

    def _hello(self, host: str, port: int) -> list[bytes]:
        frames = [b"hello", self._cache.identity_bytes(), *self._frames]
        return ask(host, port, frames, self._handshake_timeout)

    def _planner(
        self, layout: ParallelLayout, buffers: tuple[BufferLayout, ...]
    ) -> PDTransferPlanner:
        return self._rules.planner(
            prefill_layout=layout,
            decode_layout=self._layout,
            prefill_buffers=buffers,
            decode_buffers=self._cache.cache.buffers,
        )

    def _peer(self, remote: Remote) -> Peer:
        peer = self._peers.get(remote.engine_id)
        if peer is not None:
            return peer
        host, port = remote.host, remote.port
        silent_since = self._silent.get(remote.engine_id)
        if silent_since is not None and time.monotonic() - silent_since < RETRY_SILENT_SECONDS:
            raise PeerGone(f"the prefill instance at {host}:{port} did not answer lately")
        first_error: Exception | None = None
        for rank in range(min(remote.tp_size, MAX_FIRST_TRIES)):
            try:
                reply = self._hello(host, port + rank)
            except PeerGone as error:
                first_error = first_error or error
                continue
            try:
                address = f"{host}:{port + rank}"
                peer = first_peer(reply, self._cache.identity, self._planner, address,
                                  self._rank, host, port, rank)  # fmt: skip
            except UnsupportedPDLayoutError as error:
                raise UnsupportedPDLayoutError(
                    f"{self._cache.family}, prefill TP {remote.tp_size} -> decode TP "
                    f"{self._layout.world_size}: {error}"
                ) from None
            for silent in range(rank):
                peer.lose(silent)
            self._peers[remote.engine_id] = peer
            return peer
        self._silent[remote.engine_id] = time.monotonic()
        raise first_error or UnsupportedPDLayoutError(f"no prefill rank at {host}:{port}")

    def _source_ready(self, peer: Peer, rank: int) -> bool:
        """Whether source ``rank`` has told its addresses (asked once); False when gone."""
        if rank in peer.gone:
            return False
        if rank not in peer.ranks:
            try:
                peer.ranks[rank] = rank_info(self._hello(peer.host, peer.port + rank))
            except PeerGone:
                peer.lose(rank)
                return False
        return True

    # -- per request --------------------------------------------------------------------

    def start(self, receives: list[Receive]) -> None:
        """Starts a step's reads: one engine read a source rank for all of the step's requests
        it serves (each read's fixed cost paid once a step, not once a request); a request
        without local blocks only notifies."""
        batch: list[tuple[Receive, Peer]] = []
        parts: dict[tuple[str, int], tuple[Peer, Reads]] = {}
        for receive in receives:
            if receive.remote is None:
                logger.error("pdplan: request %s cannot be read: %s", receive.request_id,
                             receive.refused)  # fmt: skip
                self._fail(receive)
                continue
            if receive.stream is not None:
                self._follow(receive)
                continue
            try:
                peer = self._peer(receive.remote)
                sources = self._sources(peer, receive) if receive.local_blocks else []
                pages = self._pages(receive) if sources else []
                reads = [(rank, self._descriptors(peer, rank, pages)) for rank in sources or ()]
            except UnsupportedPDLayoutError as error:
                logger.error("pdplan: request %s cannot be read: %s", receive.request_id, error)
                self._fail(receive)
                continue
            except Exception:  # a connector fault fails the request, never the engine
                logger.exception("pdplan: request %s failed in the connector", receive.request_id)
                self._fail(receive)
                continue
            if sources is None:
                self._fail(receive)
                self._notify(peer, receive)
                continue
            batch.append((receive, peer))
            for rank, read in reads:
                key = (receive.remote.engine_id, rank)
                parts.setdefault(key, (peer, Reads(self._strided, self._model)))[1].extend(read)
        self._flush()
        if not batch:
            return
        handles = []
        for (_, rank), (peer, gathered) in parts.items():
            if gathered:
                handles.append(gathered.start(self._engine, peer.ranks[rank].engine))
        self._pulls.append(Pull(batch, handles, time.monotonic() + self._transfer_timeout))

    def _sources(self, peer: Peer, receive: Receive) -> list[int] | None:
        """The source ranks to read, each ready (its addresses known), after reading around
        the ranks that are gone; None when something is lost."""
        while True:
            if peer.lost:
                logger.warning(
                    "pdplan: request %s: prefill ranks %s are gone and hold bytes no other "
                    "rank holds", receive.request_id, sorted(peer.gone),
                )  # fmt: skip
                return None
            sources = peer.plan.target_prefill_ranks
            if all([self._source_ready(peer, p) for p in sources]):
                return list(sources)

    def _pages(self, receive: Receive) -> list[tuple[Any, Any, tuple[int, ...]]]:
        """Per KV cache group, the request's pages on the prefill side and here (each group's
        blocks span its own pages), and the group's buffers: the same for every source rank,
        computed once."""
        if len(receive.remote_blocks) != len(self._cache.groups):
            raise UnsupportedPDLayoutError(
                f"request {receive.request_id}: the prefill side sent blocks of "
                f"{len(receive.remote_blocks)} KV cache groups for {len(self._cache.groups)} here"
            )
        pages = []
        for number, (local, remote, group) in enumerate(
            zip(receive.local_blocks, receive.remote_blocks, self._cache.groups)
        ):
            if len(remote) != len(local):
                raise UnsupportedPDLayoutError(
                    f"request {receive.request_id}: the prefill side holds {len(remote)} "
                    f"blocks of group {number} for {len(local)} here"
                )
            pages.append((group.rules.pages(remote), group.rules.pages(local), group.buffers))
        return pages

    def _descriptors(
        self, peer: Peer, rank: int, pages: list[tuple[Any, Any, tuple[int, ...]]]
    ) -> Reads:
        """What this rank reads of source ``rank``, per KV cache group."""
        own = self._cache.cache
        prepared = peer.transfer(rank, own.base_ptrs, own.limits)
        reads = Reads(self._strided, self._model)
        for remote, local, buffers in pages:
            reads.add(prepared, remote, local, buffers=buffers)
        return reads

    def _fail(self, receive: Receive) -> None:
        blocks = {b for group in receive.local_blocks for b in group}
        if blocks:
            logger.warning("pdplan: request %s: its %d blocks are reported for vLLM to "
                           "recompute", receive.request_id, len(blocks))  # fmt: skip
            self._failed.add(receive.request_id)
        self._load_errors.update(blocks)
        self._done(receive)

    def _done(self, receive: Receive) -> None:
        # Only a request parked waiting for its blocks is reported: one without local blocks
        # (aborted before allocation, a full local hit) only notifies.
        if receive.local_blocks:
            self._finished.add(receive.request_id)

    def _follow(self, receive: Receive) -> None:
        """Starts following a streamed request: its reads start as its prefill's progress
        notices come (``_advance``)."""
        assert receive.remote is not None and receive.stream is not None
        try:
            peer = self._peer(receive.remote)
            sources = self._sources(peer, receive)
        except Exception:  # a connector fault fails the request, never the engine
            logger.exception("pdplan: request %s cannot stream", receive.request_id)
            self._fail(receive)
            return
        if sources is None:
            self._fail(receive)
            return
        deadline = time.monotonic() + self._transfer_timeout
        self._following[receive.request_id] = Following(receive, peer, sources, 0, deadline)
        logger.info("pdplan: request %s streams from %s:%d (decode prefix %d of %d tokens)",
                    receive.request_id, peer.host, peer.port, receive.stream.decode_prefix,
                    receive.stream.final_length)  # fmt: skip

    def cancel(self, request_ids: list[str]) -> None:
        """Streamed requests that ended (aborted): their reads stop, their blocks are released
        once those in flight land (``take_released``)."""
        for request_id in request_ids:
            following = self._following.get(request_id)
            if following is None:
                self._released.add(request_id)
            else:
                following.cancelled = True

    def take_released(self) -> set[str]:
        """Cancelled streamed requests whose reads have all landed."""
        released, self._released = self._released, set()
        return released

    def _advance(self) -> None:
        """Reads what each followed stream's prefill made final since its last slice (one
        progress request a source rank for all streams); a stream whose last slice landed is
        done."""
        now = time.monotonic()
        self._quiet = {k: t for k, t in self._quiet.items() if now - t < RETRY_QUIET_SECONDS}
        idle = [f for f in self._following.values() if not f.handles and not f.cancelled]
        notices: dict[str, Any] = {}
        if idle:
            notices, failed = progress(idle, self._handshake_timeout, set(self._quiet))
            self._quiet.update(dict.fromkeys(failed, now))
        for request_id, following in list(self._following.items()):
            if following.cancelled:
                if not self._landed(following):
                    continue
                del self._following[request_id]
                self._released.add(request_id)
                self._tell_prefill(following)
                continue
            notice = notices.get(following.stream.stream_id)
            try:
                finished = self._advance_one(following, notice)
            except Exception:  # a connector fault fails the request, never the engine
                logger.exception("pdplan: request %s failed while streaming", request_id)
                finished, failed_one = True, True
            else:
                failed_one = finished is None
            if finished is not False:
                del self._following[request_id]
                if failed_one or following.prefill_request is None:
                    self._fail(following.receive)
                    self._tell_prefill(following)
                else:
                    done = following.finished_receive()
                    self._done(done)
                    self._notify(following.peer, done)
        self._flush()

    def _landed(self, following: Following) -> bool:
        """Whether a stream's reads in flight have all ended (landed or failed)."""
        states = [self._engine.state(h) for h in following.handles]
        following.handles = [h for h, state in zip(following.handles, states) if state == "PROC"]
        return not following.handles

    def _tell_prefill(self, following: Following) -> None:
        """A stream that ends early: its prefill ranks may free the request, where known."""
        if following.prefill_request is not None:
            self._notify(following.peer, following.finished_receive())

    def _advance_one(self, following: Following, notice: Any) -> bool | None:
        """True when the stream is done, None when it failed, else False."""
        states = [self._engine.state(h) for h in following.handles]
        if "ERR" in states:
            return None
        following.handles = [h for h, state in zip(following.handles, states) if state == "PROC"]
        final = following.stream.final_length
        if notice is not None:  # the prefill side runs it: waiting is not stalling
            following.deadline = time.monotonic() + self._transfer_timeout
        late = time.monotonic() > following.deadline
        if following.handles:
            return None if late else False
        if following.read_to >= final:
            return True
        if notice is None:
            return None if late else False
        if notice.final_length != final:
            raise UnsupportedPDLayoutError(
                f"the prefill side streams {notice.final_length} tokens for {final} here"
            )
        was = following.read_to
        slices = following.slices(notice, self._layers)
        if not slices:
            return None if late else False
        following.prefill_request = notice.request_id
        own = self._cache.cache
        reads = slice_reads(
            following, notice,
            lambda rank: following.peer.transfer(rank, own.base_ptrs, own.limits),
            self._cache.groups, slices, (self._strided, self._model),
        )  # fmt: skip
        for rank, read in reads:
            if read:
                engine = following.peer.ranks[rank].engine
                following.handles.append(read.start(self._engine, engine))
        request = following.receive.request_id
        if was < following.read_to < final:
            logger.info("pdplan: request %s: tokens %d-%d of %d read while its prefill runs",
                        request, was, following.read_to, final)  # fmt: skip
        for layers, start, stop in slices:
            if layers is not None and stop > following.read_to:
                logger.info("pdplan: request %s: layers %s, tokens %d-%d of %d read while "
                            "their step runs", request, list(layers), start, stop,
                            final)  # fmt: skip
        following.deadline = time.monotonic() + self._transfer_timeout
        return not following.handles and following.read_to >= final

    def poll(self) -> None:
        """Completes the requests whose reads are done, failed or timed out."""
        if self._following:
            self._advance()
        now = time.monotonic()
        waiting = []
        for pull in self._pulls:
            states = [self._engine.state(h) for h in pull.handles]
            pull.handles = [h for h, s in zip(pull.handles, states) if s == "PROC"]
            failed = "ERR" in states or (pull.handles and now > pull.deadline)
            if pull.handles and not failed:
                waiting.append(pull)
                continue
            for receive, peer in pull.requests:
                if failed:
                    logger.error("pdplan: request %s: a read failed or timed out",
                                 receive.request_id)  # fmt: skip
                    self._fail(receive)
                else:
                    self._done(receive)
                self._notify(peer, receive)
        self._pulls = waiting
        self._flush()

    def _notify(self, peer: Peer, receive: Receive) -> None:
        """Queues "done" for every prefill rank that holds the request's blocks, with how many
        decode ranks it waits for; ``_flush`` sends them."""
        assert receive.remote is not None  # only requests with a remote reach a peer
        for rank in peer.holders:
            line = f"{receive.remote.request_id}\t{peer.waits.get(rank, 1)}"
            self._outbox.setdefault((peer.host, peer.port + rank), []).append(line)

    def _flush(self) -> None:
        """One "done" message a prefill rank for what this call completed (not one a request:
        a step's requests finish together), off the step's path."""
        for (host, port), lines in self._outbox.items():
            for start in range(0, len(lines), MAX_NOTICES_A_MESSAGE):
                part = lines[start : start + MAX_NOTICES_A_MESSAGE]
                self._notices.send(host, port, [b"done", "\n".join(part).encode()])
        self._outbox.clear()

    def take_finished(self) -> tuple[set[str], set[str], set[int]]:
        """Requests done since the last call, those of them that failed, and their blocks."""
        done, failed, blocks = self._finished, self._failed, self._load_errors
        self._finished, self._failed, self._load_errors = set(), set(), set()
        return done, failed, blocks

    def close(self) -> None:
        self._notices.close()
