"""A decode rank following streams: a request whose prefill still runs is read slice by slice,
the tokens each prefill step makes final, as the prefill ranks' progress notices say (pull with
progress notices: the decode side's blocks are allocated when its request arrives, the prefill
side's as its chunks are scheduled, so the decode side asks and reads). Slices are pdplan's
(``descriptors(..., tokens=, final_length=, decode_prefix=)``): each byte once, once final.
Progress is asked one round at a time for every idle stream, on non-blocking sockets a step
sends on and a later step reads from (``_progress_asks``); a step only reads what the last
round said."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pdplan._staging import CostModel
from pdplan.session._cache import GroupCache, WorkerCache
from pdplan.session._engines import TransferEngine
from pdplan.session._faults import LayoutRefused, PeerGone, ProtocolFault, TransferFailed, cause_of
from pdplan.session._metrics import SessionStats
from pdplan.session._peers import Peer, Peers
from pdplan.session._progress import Progress, Slice, next_slices
from pdplan.session._progress_asks import AskSockets, Endpoint, ProgressRound
from pdplan.session._reads import Reads
from pdplan.session._requests import Receive

logger = logging.getLogger("pdplan.session")

#: How long a prefill rank that did not answer a progress request is not asked again.
RETRY_QUIET_SECONDS = 5.0


@dataclass
class Following:
    """One streamed request this rank reads: how far its reads have gone, and those in
    flight."""

    receive: Receive
    peer: Peer
    sources: list[int]
    read_to: int
    deadline: float
    prefill_request: str | None = None
    handles: list[Any] = field(default_factory=list)
    #: Its request ended (aborted): no more reads; released once those in flight land.
    cancelled: bool = False
    #: Why it failed while reads were in flight: it ends once the engine let them go.
    failed: str = ""
    #: Model layers read past ``read_to`` (their step's layers saved ahead), to which token.
    ahead: dict[int, int] = field(default_factory=dict)
    #: The reads in flight: their bytes, and when they were posted.
    in_flight: tuple[int, float] = (0, 0.0)
    #: Bytes landed so far, and when it started being followed (its one log line).
    read_bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    #: Slices read while its prefill still ran, and layers read while their step ran.
    early: int = 0
    read_ahead: int = 0

    def summary(self) -> str:
        """How it streamed, for its one log line."""
        stream = self.stream
        return (f"streamed: decode prefix {stream.decode_prefix} of {stream.final_length} "
                f"tokens, {self.early} slices read while its prefill runs, {self.read_ahead} layer "
                f"slices read while their step runs")  # fmt: skip

    @property
    def stream(self) -> Any:
        assert self.receive.stream is not None
        return self.receive.stream

    def finished_receive(self) -> Receive:
        """The request, naming the prefill side's own request id (its "done" notice)."""
        remote = self.receive.remote
        assert remote is not None and self.prefill_request is not None
        return self.receive._replace(remote=remote._replace(request_id=self.prefill_request))

    def slices(self, notice: Progress, layers: tuple[int, ...] | None) -> list[Slice]:
        """What to read of ``notice`` (``next_slices``), the marks moved as if read."""
        slices, self.read_to, self.ahead = next_slices(self.read_to, self.ahead, notice, layers)
        return slices

    def endpoints(self) -> list[Endpoint]:
        return [(self.peer.host, self.peer.port + rank) for rank in self.sources]


def slice_reads(
    following: Following,
    notice: Progress,
    prepared_of: Any,
    groups: tuple[GroupCache, ...],
    slices: list[Slice],
    form: tuple[bool, CostModel | None],
) -> list[tuple[int, Reads]]:
    """Each source rank's reads of ``slices`` of the stream, in ``form`` (strided where the
    engine takes them, and the cost model that weighs them: ``Reads``' arguments)."""
    stream = following.stream
    receive = following.receive
    if len(notice.blocks) != len(receive.local_blocks):
        raise ProtocolFault(
            f"request {receive.request_id}: the prefill side streams {len(notice.blocks)} KV "
            f"cache groups for {len(receive.local_blocks)} here"
        )
    out = []
    for rank in following.sources:
        prepared = prepared_of(rank)
        reads = Reads(*form)
        for group, theirs, ours in zip(groups, notice.blocks, receive.local_blocks):
            pages = group.rules.pages
            request = prepared.request(pages(theirs), pages(ours))  # read once a step
            for layers, start, stop in slices:
                reads.add(
                    request, buffers=group.buffers, layers=layers, tokens=range(start, stop),
                    final_length=stream.final_length, decode_prefix=stream.decode_prefix,
                )  # fmt: skip
        out.append((rank, reads))
    return out


#: A stream that ended: None when it read everything, else why not (``faults`` causes;
#: ``"cancelled"`` for a request that ended first).
Ended = tuple[Following, str | None]


class Streams:
    """The streamed requests one decode rank follows."""

    def __init__(
        self, cache: WorkerCache, engine: TransferEngine, peers: Peers,
        transfer_timeout: float, form: tuple[bool, CostModel | None],
        stats: SessionStats,
    ) -> None:  # fmt: skip
        self._cache = cache
        self._engine = engine
        self._peers = peers
        self._transfer_timeout = transfer_timeout
        self._form = form
        self._stats = stats
        self._layers = cache.layers
        self._following: dict[str, Following] = {}
        self._sockets = AskSockets(peers.timeout)
        self._asking: ProgressRound | None = None
        # Prefill ranks that did not answer a progress request, since when (skipped a while).
        self._quiet: dict[Endpoint, float] = {}

    def __bool__(self) -> bool:
        return bool(self._following)

    def follow(self, receive: Receive, peer: Peer) -> None:
        """Starts following a streamed request: its reads start as its prefill's progress
        notices come."""
        assert receive.stream is not None
        if self._cache.token_maps(peer.rules):
            raise LayoutRefused(
                "a streamed request reads its prefill side's blocks page by page as they fill, "
                "so both instances must keep blocks of one size; send it whole (no stream_id) "
                "or serve both with one block size"
            )
        deadline = time.monotonic() + self._transfer_timeout
        self._following[receive.request_id] = Following(receive, peer, peer.sources, 0, deadline)
        logger.debug("pdplan: request %s streams from %s:%d (decode prefix %d of %d tokens)",
                    receive.request_id, peer.host, peer.port, receive.stream.decode_prefix,
                    receive.stream.final_length)  # fmt: skip

    def cancel(self, request_id: str) -> bool:
        """Stops a stream's reads (its request ended); False when it is not followed."""
        following = self._following.get(request_id)
        if following is not None:
            following.cancelled = True
        return following is not None

    def advance(self) -> list[Ended]:
        """Reads what each stream's prefill made final since its last slice, as the last
        progress answer says, and asks again in the background; returns the streams that
        ended."""
        notices = self._answered()
        ended: list[Ended] = []
        for request_id, following in list(self._following.items()):
            if following.cancelled or following.failed:
                if self._let_go(following):
                    del self._following[request_id]
                    ended.append((following, "cancelled" if following.cancelled
                                  else following.failed))  # fmt: skip
                continue
            try:
                outcome = self._advance_one(following, notices.get(following.stream.stream_id))
            except Exception as error:  # a connector fault fails the request, never the engine
                logger.exception("pdplan: request %s failed while streaming", request_id)
                outcome = cause_of(error)
            if outcome is not None and outcome != "" and following.handles:
                # Failed with reads in flight: it ends once no byte of them can land.
                following.failed = outcome
                if not self._let_go(following):
                    continue
            if outcome != "":
                del self._following[request_id]
                ended.append((following, outcome))
        self._ask()
        return ended

    def _answered(self) -> dict[str, Progress]:
        """The last round's progress, once every rank answered (empty while it is out)."""
        asking = self._asking
        if asking is None:
            return {}
        try:
            notices = asking.poll()
        except Exception:  # the round's own fault: every stream waits for the next round
            logger.exception("pdplan: a progress ask failed")
            self._asking = None
            return {}
        if notices is None:
            return {}
        self._asking = None
        now = time.monotonic()
        self._quiet.update(dict.fromkeys(asking.failed, now))
        return notices

    def _ask(self) -> None:
        """One round of progress asks for the streams with no reads in flight (its replies
        picked up by later polls)."""
        if self._asking is not None:
            return
        now = time.monotonic()
        self._quiet = {k: t for k, t in self._quiet.items() if now - t < RETRY_QUIET_SECONDS}
        asked: dict[Endpoint, list[str]] = {}
        for following in self._following.values():
            if following.handles or following.cancelled:
                continue
            endpoints = following.endpoints()
            if any(e in self._quiet for e in endpoints):
                continue
            for endpoint in endpoints:
                asked.setdefault(endpoint, []).append(following.stream.stream_id)
        self._sockets.keep(set(asked))  # a rank no stream reads any more: its socket closed
        if asked:
            self._asking = ProgressRound(self._sockets, asked, self._peers.timeout)

    def close(self) -> None:
        self._sockets.close()

    def _landed(self, following: Following) -> bool:
        """Whether a stream's reads in flight have all ended (landed or failed)."""
        states = [self._engine.state(h) for h in following.handles]
        following.handles = [h for h, state in zip(following.handles, states) if state == "PROC"]
        return not following.handles

    def _let_go(self, following: Following) -> bool:
        """Aborts an ended stream's reads in flight: whether the engine let all go (none of
        their bytes can land any more)."""
        self._landed(following)
        following.handles = [h for h in following.handles if not self._engine.abort(h)]
        return not following.handles

    def _advance_one(self, following: Following, notice: Progress | None) -> str | None:
        """None when the stream read everything, a cause when it failed, "" while it goes."""
        if following.peer.stale:  # its instance registered anew: what it read is gone
            return PeerGone.cause if self._landed(following) else ""
        states = [self._engine.state(h) for h in following.handles]
        if "ERR" in states:
            return TransferFailed.cause
        following.handles = [h for h, state in zip(following.handles, states) if state == "PROC"]
        if states and not following.handles:  # the reads in flight landed
            moved, posted_at = following.in_flight
            done = following.read_to >= following.stream.final_length
            self._stats.read(int(done), moved, time.monotonic() - posted_at)
            following.read_bytes += moved
            following.in_flight = (0, 0.0)
        final = following.stream.final_length
        if notice is not None:  # the prefill side runs it: waiting is not stalling
            following.deadline = time.monotonic() + self._transfer_timeout
        over = time.monotonic() > following.deadline
        late = PeerGone.cause if over else ""
        if following.handles:
            return TransferFailed.cause if over else ""
        if following.read_to >= final:
            return None
        if notice is None:
            return late
        if notice.final_length != final:
            raise ProtocolFault(
                f"the prefill side streams {notice.final_length} tokens for {final} here"
            )
        was = following.read_to
        slices = following.slices(notice, self._layers)
        if not slices:
            return late
        following.prefill_request = notice.request_id
        own = self._cache.cache
        reads = slice_reads(
            following, notice,
            lambda rank: following.peer.transfer(rank, own.base_ptrs, own.limits),
            self._cache.groups, slices, self._form,
        )  # fmt: skip
        moved = 0
        for rank, read in reads:
            if read:
                engine = following.peer.ranks[rank].engine
                following.handles.append(read.start(self._engine, engine))
                self._stats.posted(*read.posted[1:])
                moved += read.posted[0]
        following.in_flight = (moved, time.monotonic())
        request = following.receive.request_id
        if was < following.read_to < final:
            following.early += 1
            logger.debug("pdplan: request %s: tokens %d-%d of %d read while its prefill runs",
                        request, was, following.read_to, final)  # fmt: skip
        for layers, start, stop in slices:
            if layers is not None and stop > following.read_to:
                following.read_ahead += 1
                logger.debug("pdplan: request %s: layers %s, tokens %d-%d of %d read while "
                            "their step runs", request, list(layers), start, stop,
                            final)  # fmt: skip
        following.deadline = time.monotonic() + self._transfer_timeout
        return None if not following.handles and following.read_to >= final else ""
