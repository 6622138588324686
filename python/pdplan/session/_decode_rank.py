"""A decode rank's side of the session: per request the runtime's block ids turned into
descriptors by the planner both sides built (``PreparedTransfer.from_layouts``) and read
through the engine; then every prefill rank that holds the request's blocks hears "done", off
the step's path. Nothing here waits on the network: a request waits (up to its transfer
timeout) while its peer connects in the background, the others go on. A prefill rank that does
not answer is read around where another holds its bytes; what no rank can give is reported as
blocks the runtime must recompute, never decoded from stale memory.

A read counts only once its prefill ranks confirm they held the request's blocks through it
(``_holds``: the same asks renew their leases while the request waits); a read that failed or
ran late is aborted through the engine, and its request reported only once no byte of it can
still land in blocks the runtime would hand to another request."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pdplan._model import ParallelLayout
from pdplan._staging import CostModel
from pdplan.session._block_pairs import paired_blocks, paired_slots
from pdplan.session._cache import WorkerCache
from pdplan.session._engines import TransferEngine
from pdplan.session._faults import (
    LayoutRefused,
    LeaseExpired,
    PeerGone,
    SettingsFault,
    TransferFailed,
    cause_of,
)
from pdplan.session._holds import Holds
from pdplan.session._metrics import SessionStats
from pdplan.session._notices import DoneNotices
from pdplan.session._peers import Peer, Peers
from pdplan.session._reads import Reads
from pdplan.session._requests import Receive, Remote
from pdplan.session._streams import Following, Streams

logger = logging.getLogger("pdplan.session")


@dataclass
class Pull:
    """One step's reads in flight, and the requests they serve (each with its peer)."""

    requests: list[tuple[Receive, Peer, int]]  # each with the bytes read for it
    handles: list[Any]
    deadline: float
    started: float
    moved_bytes: int
    #: Why the pull failed (a read failed, or ran past its deadline): its requests fail once
    #: the engine says no byte of its handles still in flight can land.
    failed: str = ""


@dataclass
class Landed:
    """A request whose bytes landed, waiting for its source ranks to confirm they held its
    blocks through the read."""

    receive: Receive
    peer: Peer
    moved: int
    started: float
    landed_at: float
    deadline: float


class DecodeRank:
    """Pulls requests' KV into this rank's cache."""

    def __init__(
        self, cache: WorkerCache, tp_rank: int, tp_size: int, engine: TransferEngine,
        handshake_timeout: float, transfer_timeout: float, strided: bool = False,
        model: CostModel | None = None, stats: SessionStats | None = None,
        layout: ParallelLayout | None = None,
    ) -> None:  # fmt: skip
        """``layout``: the instance's ranks where they are more than its TP ranks (pipeline
        stages); ``tp_rank`` is then the rank among them (TP fastest, then stage)."""
        self._cache = cache
        self._engine = engine
        self._form = (strided, model)  # strided rows where the cost model weighs them less
        self._transfer_timeout = transfer_timeout
        self.stats = stats or SessionStats()
        self._peers = Peers(cache, layout or ParallelLayout("decode", tp_size), tp_rank,
                            handshake_timeout, self._forget)  # fmt: skip
        self._notices = DoneNotices(handshake_timeout, lambda m: logger.warning("pdplan: %s", m))
        self._streams = Streams(cache, engine, self._peers, transfer_timeout, self._form,
                                self.stats)  # fmt: skip
        self._waiting: list[tuple[Receive, float]] = []  # for their peer, until a deadline
        # Groups of state buffers: one slot a request, paired as pages whatever their blocks.
        self._state_groups = {number for number, group in enumerate(cache.groups) if group.state}
        self._pulls: list[Pull] = []
        self._landed: list[Landed] = []
        self._holds = Holds(handshake_timeout, self.stats)
        # Requests waiting in the runtime's queue (by request id here), their prefill side
        # asked to hold them once it is connected; those not asked yet.
        self._queued: dict[str, Remote] = {}
        self._to_hold: set[str] = set()
        self._load_errors: set[int] = set()
        self._finished: set[str] = set()
        self._failed: set[str] = set()
        self._released: set[str] = set()

    # -- per request --------------------------------------------------------------------

    def hold(self, queued: dict[str, Remote]) -> None:
        """Requests (by request id here) that wait in the runtime's queue for their turn:
        their prefill ranks are asked to hold their blocks until their reads are confirmed
        (``unhold``: they left the queue otherwise)."""
        self._queued.update(queued)
        self._to_hold.update(queued)

    def unhold(self, request_ids: list[str]) -> None:
        """Queued requests that ended before they were read (aborted, computed here)."""
        for request_id in request_ids:
            self._to_hold.discard(request_id)
            remote = self._queued.pop(request_id, None)
            if remote is not None:
                self._holds.drop_request(remote.request_id)

    def _hold_queued(self) -> None:
        for request_id in list(self._to_hold):
            remote = self._queued[request_id]
            try:
                peer = self._peers.connected(remote)
            except Exception:  # not connected now: tried again at a later poll
                continue
            if peer is None:
                continue  # connecting: asked once it is
            self._to_hold.discard(request_id)
            if not peer.lost:
                self._want(peer, remote.request_id)

    def _want(self, peer: Peer, prefill_request: str, now: bool = False) -> None:
        for rank in peer.holders:
            self._holds.want((peer.host, peer.port + rank), prefill_request, now)

    def start(self, receives: list[Receive]) -> None:
        """Takes a step's requests: each starts once its peer is connected (``poll``)."""
        deadline = time.monotonic() + self._transfer_timeout
        for receive in receives:
            self._to_hold.discard(receive.request_id)
            queued = self._queued.pop(receive.request_id, None)
            if receive.remote is None:
                if queued is not None:  # held while it waited: no more
                    self._holds.drop_request(queued.request_id)
                self._fail(receive, SettingsFault(receive.refused))
            else:
                self._waiting.append((receive, deadline))
        self._start_ready()

    def _start_ready(self) -> None:
        """Starts the reads of every waiting request whose peer is connected: one engine read
        a source rank for all of them (each read's fixed cost paid once a step, not once a
        request)."""
        batch: list[tuple[Receive, Peer, int]] = []
        parts: dict[tuple[str, int], tuple[Peer, Reads]] = {}
        waiting, self._waiting = self._waiting, []
        now = time.monotonic()
        for receive, deadline in waiting:
            assert receive.remote is not None  # only requests with a remote wait
            peer: Peer | None = None
            try:
                peer = self._peers.connected(receive.remote)
                if peer is None:
                    if now > deadline:
                        raise PeerGone("the prefill instance did not finish its handshake within "
                                       f"{self._transfer_timeout} s")  # fmt: skip
                    self._waiting.append((receive, deadline))
                    continue
                if peer.lost:
                    self._holds.drop_request(receive.remote.request_id)
                    self._fail(
                        receive,
                        PeerGone(
                            f"prefill ranks {sorted(peer.gone)} are gone "
                            "and hold bytes no other rank holds"
                        ),
                    )
                    self._notices.add(peer, receive.remote.request_id)
                    continue
                if receive.stream is not None:
                    self._streams.follow(receive, peer)
                    continue
                if not receive.local_blocks:  # nothing to read: the prefill side may free it
                    self._holds.drop_request(receive.remote.request_id)
                    self._done(receive)
                    self._notices.add(peer, receive.remote.request_id)
                    continue
                # Asked as the read is posted: its reply confirms the read.
                self._want(peer, receive.remote.request_id, now=True)
                for rank in peer.sources:  # checked before every read
                    if self._holds.freed((peer.host, peer.port + rank), receive.remote.request_id):
                        raise LeaseExpired(
                            f"prefill rank {rank} freed the request's blocks before they were "
                            "read (their lease ran out)"
                        )
                pages = self._pages(receive, peer)
                reads = [(rank, self._descriptors(peer, rank, pages)) for rank in peer.sources]
            except Exception as error:  # a request's fault fails the request, never the engine
                self._fail(receive, error)
                self._holds.drop_request(receive.remote.request_id)
                if isinstance(error, LeaseExpired) and peer is not None:
                    self._notices.add(peer, receive.remote.request_id)
                continue
            batch.append((receive, peer, sum(read.bytes for _, read in reads)))
            for rank, read in reads:
                key = (receive.remote.engine_id, rank)
                parts.setdefault(key, (peer, Reads(*self._form)))[1].extend(read)
        self._notices.flush()
        if not batch:
            return
        handles = []
        moved = 0
        for (_, rank), (peer, gathered) in parts.items():
            if gathered:
                try:
                    handle = gathered.start(self._engine, peer.ranks[rank].engine)
                except Exception:  # the engine refused the read: its requests fail below
                    logger.exception("pdplan: a read of prefill rank %d could not start", rank)
                    handle = None
                handles.append(handle)
                self.stats.posted(*gathered.posted[1:])
                moved += gathered.posted[0]
        self._pulls.append(Pull(batch, handles, now + self._transfer_timeout, now, moved))

    def _pages(self, receive: Receive, peer: Peer) -> list[tuple[str, Any, Any, tuple[int, ...]]]:
        """Per KV cache group, what the request reads of it from every source rank: ``("pages",
        prefill pages, pages here, buffers)``, each group's blocks paired from the tail, or
        where the two sides' blocks hold other token counts ``("slots", prefill slot map, slot
        map here, buffers)``, token by token. The same for every source rank, computed once."""
        if len(receive.remote_blocks) != len(self._cache.groups):
            raise LayoutRefused(
                f"request {receive.request_id}: the prefill side sent blocks of "
                f"{len(receive.remote_blocks)} KV cache groups for {len(self._cache.groups)} here"
            )
        pages = []
        for number, (local, remote, group, theirs) in enumerate(
            zip(receive.local_blocks, receive.remote_blocks, self._cache.groups, peer.rules)
        ):
            mine = group.rules
            same = (mine.block_size, mine.kernel_block_size) == (
                theirs.block_size,
                theirs.kernel_block_size,
            )
            if same or number in self._state_groups:
                # A state group keeps one slot a request whatever its block: paired as pages.
                local, remote = paired_blocks(local, remote, number)
                pages.append(("pages", theirs.pages(remote), mine.pages(local), group.buffers))
                continue
            if len(receive.local_tokens) != len(self._cache.groups) or not receive.num_tokens:
                raise LayoutRefused(
                    f"request {receive.request_id}: KV cache group {number} holds "
                    f"{theirs.block_size} tokens a block there, {mine.block_size} here, and the "
                    "request names no token positions to pair them by"
                )
            remote_slots, local_slots = paired_slots(
                local, receive.local_tokens[number], mine.block_size,
                remote, theirs.block_size, receive.num_tokens, number,
            )  # fmt: skip
            pages.append(("slots", remote_slots, local_slots, group.buffers))
        return pages

    def _descriptors(
        self, peer: Peer, rank: int, pages: list[tuple[str, Any, Any, tuple[int, ...]]]
    ) -> Reads:
        """What this rank reads of source ``rank``, per KV cache group."""
        own = self._cache.cache
        prepared = peer.transfer(rank, own.base_ptrs, own.limits)
        reads = Reads(*self._form)
        for how, remote, local, buffers in pages:
            if how == "pages":
                reads.add(prepared, remote, local, buffers=buffers)
            else:
                reads.add_tokens(prepared, remote, local, buffers=buffers)
        return reads

    def _fail(self, receive: Receive, error: BaseException | str) -> None:
        """Logs the request's fault once, with its peer, and reports its blocks for the
        runtime to recompute."""
        cause = error if isinstance(error, str) else cause_of(error)
        remote = receive.remote
        where = f" from {remote.host}:{remote.port}" if remote is not None else ""
        blocks = {b for group in receive.local_blocks for b in group}
        if cause == "internal" and not isinstance(error, str):
            logger.error("pdplan: request %s%s failed in the session", receive.request_id,
                         where, exc_info=error)  # fmt: skip
        else:
            logger.error("pdplan: request %s%s cannot be read (%s): %s; its %d blocks are "
                         "reported for the runtime to recompute", receive.request_id, where, cause,
                         error if not isinstance(error, str) else "", len(blocks))  # fmt: skip
        self.stats.failed(cause, len(blocks))
        if blocks:
            self._failed.add(receive.request_id)
        self._load_errors.update(blocks)
        self._done(receive)

    @staticmethod
    def _read(receive: Receive, moved: int, seconds: float, how: str = "") -> None:
        """The one line a request that was read logs (a failed one logs ``_fail``'s)."""
        remote = receive.remote
        assert remote is not None  # only requests with a remote are read
        blocks = sum(len(group) for group in receive.local_blocks)
        logger.info("pdplan: request %s read %d blocks (%d bytes) from %s:%d in %.1f ms%s",
                    receive.request_id, blocks, moved, remote.host, remote.port,
                    seconds * 1e3, f"; {how}" if how else "")  # fmt: skip

    def _done(self, receive: Receive) -> None:
        # Only a request parked waiting for its blocks is reported: one without local blocks
        # (aborted before allocation, a full local hit) only notifies.
        if receive.local_blocks:
            self._finished.add(receive.request_id)

    def _forget(self, peer: Peer) -> None:
        """A peer dropped: the engine forgets its ranks' metadata before a new handshake's."""
        for info in peer.ranks.values():
            try:
                self._engine.forget(info.engine)
            except Exception:  # never the step: the next handshake loads it anew
                logger.exception("pdplan: forgetting prefill rank metadata failed")

    def cancel(self, request_ids: list[str]) -> None:
        """Streamed requests that ended (aborted): their reads stop, their blocks are released
        once those in flight land (``take_released``)."""
        cancelled = set(request_ids)
        self._waiting = [(r, d) for r, d in self._waiting if r.request_id not in cancelled]
        for request_id in request_ids:
            if not self._streams.cancel(request_id):
                self._released.add(request_id)

    def take_released(self) -> set[str]:
        """Cancelled streamed requests whose reads have all landed."""
        released, self._released = self._released, set()
        return released

    def _ended(self, following: Following, cause: str | None) -> None:
        """A stream that ended: read, failed, or cancelled (its blocks released)."""
        if cause == "cancelled":
            self._released.add(following.receive.request_id)
        elif cause is None and following.prefill_request is not None:
            done = following.finished_receive()
            self._read(following.receive, following.read_bytes,
                       time.monotonic() - following.started, following.summary())  # fmt: skip
            self._done(done)
            self._notices.add(following.peer, following.prefill_request)
            return
        else:
            self._fail(following.receive, cause or PeerGone.cause)
        if following.prefill_request is not None:  # its prefill ranks may free it
            self._notices.add(following.peer, following.prefill_request)

    def poll(self) -> None:
        """Starts the requests whose peer connected, completes those whose reads landed and
        were confirmed held, and fails those whose reads failed or timed out once no byte
        of theirs can still land."""
        self._holds.collect()  # first: what a rank said decides which reads start or count
        self._hold_queued()
        self._start_ready()
        if self._streams:
            for following, cause in self._streams.advance():
                self._ended(following, cause)
        in_flight = []
        for pull in self._pulls:
            self._settle(pull, time.monotonic())
            now = time.monotonic()  # every byte of a pull that landed had landed by now
            if pull.handles:
                in_flight.append(pull)
            elif pull.failed:
                for receive, peer, _ in pull.requests:
                    assert receive.remote is not None  # only requests with a remote are read
                    self._fail(receive, TransferFailed(pull.failed))
                    self._let_go(peer, receive.remote.request_id)
                    # Met anew at its next request (its registration may have changed).
                    self._peers.drop(receive.remote.engine_id)
            else:
                self.stats.read(len(pull.requests), pull.moved_bytes, now - pull.started)
                self._landed += [Landed(r, p, m, pull.started, now, pull.deadline)
                                 for r, p, m in pull.requests]  # fmt: skip
        self._pulls = in_flight
        if self._landed:
            self._confirm(time.monotonic())
        self._holds.send()
        self._notices.flush()

    def _settle(self, pull: Pull, now: float) -> None:
        """Polls a pull's handles: a failed or late one fails the pull, and then every handle
        still in flight is aborted through the engine, kept until the engine says it ended
        (a read the engine cannot stop may still write into the blocks)."""
        states = [self._engine.state(h) for h in pull.handles]
        pull.handles = [h for h, state in zip(pull.handles, states) if state == "PROC"]
        if not pull.failed:
            if "ERR" in states:
                pull.failed = "a read failed"
            elif pull.handles and now > pull.deadline:
                pull.failed = f"a read ran past its {self._transfer_timeout} s timeout"
            else:
                return
            if pull.handles:
                logger.warning("pdplan: %s; its %d reads still in flight are aborted, and its "
                               "blocks wait until the engine says they ended", pull.failed,
                               len(pull.handles))  # fmt: skip
        pull.handles = [h for h in pull.handles if not self._engine.abort(h)]

    def _confirm(self, now: float) -> None:
        """Requests whose bytes landed: read once every source rank confirms it held their
        blocks through the read, failed once one says they went free (or none confirms
        before the request's deadline)."""
        waiting = []
        for landed in self._landed:
            receive, peer = landed.receive, landed.peer
            assert receive.remote is not None  # only requests with a remote are read
            prefill_request = receive.remote.request_id
            verdicts = [
                self._holds.confirmed((peer.host, peer.port + r), prefill_request,
                                      landed.started, landed.landed_at)
                for r in peer.sources
            ]  # fmt: skip
            if all(verdicts):
                self._read(receive, landed.moved, now - landed.started)
                self._done(receive)
            elif False in verdicts:
                self._fail(
                    receive,
                    LeaseExpired(
                        "the prefill side freed the request's blocks (their lease ran out) before "
                        "the read was confirmed: the bytes read may be another request's"
                    ),
                )
            elif now > landed.deadline:
                self._fail(
                    receive,
                    LeaseExpired(
                        f"no prefill rank confirmed within {self._transfer_timeout} s that it held "
                        "the request's blocks through the read"
                    ),
                )
                # Silent that long, it may be gone: met anew at its next request.
                self._peers.drop(receive.remote.engine_id)
            else:
                waiting.append(landed)
                continue
            self._let_go(peer, prefill_request)
        self._landed = waiting

    def _let_go(self, peer: Peer, prefill_request: str) -> None:
        """The request is done here: no hold for it, and its prefill ranks may free it."""
        self._holds.drop_request(prefill_request)
        self._notices.add(peer, prefill_request)

    def take_finished(self) -> tuple[set[str], set[str], set[int]]:
        """Requests done since the last call, those of them that failed, and their blocks."""
        done, failed, blocks = self._finished, self._failed, self._load_errors
        self._finished, self._failed, self._load_errors = set(), set(), set()
        return done, failed, blocks

    def close(self) -> None:
        self._streams.close()
        self._holds.close()
        self._peers.close()
        self._notices.close()
