"""A prefill rank's side of the session: its side-channel server (the handshake, the decode
side's "done", streams' progress, holds), and the requests whose blocks it holds until every
decode rank that reads or must notify it is done, or their lease runs out. A decode side
waiting for a request renews its lease by holds (``hold``), and learns from their replies
whether the blocks are still held: a read is trusted only once a hold confirms it."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace

from pdplan._exchange import decode_layout, encode_layout
from pdplan._model import ParallelLayout
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES
from pdplan.session._cache import WorkerCache
from pdplan.session._engines import TransferEngine
from pdplan.session._faults import ProtocolFault
from pdplan.session._metrics import SessionStats
from pdplan.session._progress import Progress
from pdplan.session._protocol import (
    DONE,
    FREED,
    HELLO,
    HOLD,
    PROGRESS,
    UNKNOWN,
    block_sizes_of,
    check_identity,
    done_lines,
    encode_holds,
    encode_progress,
    generation_frame,
    hello_fields,
    hold_names,
    progress_names,
)
from pdplan.session._side_channel import SideChannelServer

logger = logging.getLogger("pdplan.session")

#: "done" messages kept for requests this rank has not heard of yet (they can arrive before
#: the scheduler's lease): the oldest are dropped past this.
MAX_EARLY_NOTICES = 65536
#: Streams whose progress a rank keeps (the oldest are dropped past this).
MAX_STREAMS = 4096
#: Requests whose blocks went free a rank remembers, to answer a hold for them "freed" (the
#: oldest are forgotten past this).
MAX_FREED_KEPT = 65536
#: What a hold renews a lease to: this share of its length from the hold on (a decode side
#: asks again well before, NixlConnector's heartbeats renew as much).
RENEWED_SHARE = 2 / 3


class PrefillRank:
    """Serves one prefill rank's layout and counts the decode side's notices."""

    def __init__(
        self,
        cache: WorkerCache,
        tp_rank: int,
        tp_size: int,
        engine: TransferEngine,
        host: str,
        port: int,
        stats: SessionStats | None = None,
        generation: int = 1,
        layout: ParallelLayout | None = None,
    ) -> None:
        """``layout``: the instance's ranks where they are more than its TP ranks (pipeline
        stages, ``ParallelLayout("prefill", tp * pp, pp_size=pp, ...)``); ``tp_rank`` is then
        the rank among them (TP fastest, then stage), which listens on ``port + rank``."""
        self._cache = cache
        self._generation = generation
        self._tp_rank = tp_rank
        self._layout = layout or ParallelLayout("prefill", tp_size)
        self._engine = engine
        self._engine_metadata = engine.metadata()
        self._frames = encode_layout(
            self._layout,
            cache.cache.buffers,
            base_ptrs=cache.cache.base_ptrs,
            limits=cache.cache.limits,
        )
        self._lock = threading.Lock()
        self._notices: OrderedDict[str, list[int]] = OrderedDict()  # id -> [heard, expected]
        self._leases: dict[str, tuple[float, float]] = {}  # id -> (deadline, lease seconds)
        self._freed: OrderedDict[str, None] = OrderedDict()
        # Streams' progress: what this step's forward pass makes final, then what is final.
        self._expected: dict[str, Progress] = {}
        self._saved: set[int] = set()  # model layers the running step has written
        self._progress: OrderedDict[str, Progress] = OrderedDict()
        self.stats = stats or SessionStats()
        self._server = SideChannelServer(host, port + tp_rank, self._answer, self.stats.refused)

    def registered_again(self, generation: int) -> None:
        """The engine registered the cache anew, ``generation`` times in all: handshakes
        from now on give its metadata and generation (a decode rank handshakes anew when a
        request names a newer one, or a read of the old registration fails)."""
        self._engine_metadata = self._engine.metadata()
        self._generation = generation

    @property
    def streaming(self) -> bool:
        """Whether the running step makes some stream's tokens final."""
        return bool(self._expected)

    @property
    def serving(self) -> bool:
        """Whether the side channel still answers."""
        return self._server.serving

    def _answer(self, verb: bytes, frames: list[bytes]) -> list[bytes]:
        if verb == HELLO:
            return self._hello(*hello_fields(frames))
        if verb == DONE:
            self._done(done_lines(frames))
            return []
        if verb == PROGRESS:
            return self._streams(progress_names(frames))
        if verb == HOLD:
            return encode_holds(self._hold(hold_names(frames)))
        raise ProtocolFault("expected a hello, a done, a progress or a hold request")

    def _hold(self, request_ids: list[str]) -> dict[str, int | str]:
        """A decode rank waiting for (or reading) requests: each one's lease renewed, and
        how long this rank holds its blocks from now on (milliseconds), or that they went
        free, or that no lease for it has reached this rank yet (its blocks are held by the
        scheduler until one does)."""
        now = time.monotonic()
        states: dict[str, int | str] = {}
        renewed = 0
        with self._lock:
            for request_id in request_ids:
                held = self._leases.get(request_id)
                if held is not None:
                    deadline, seconds = held
                    renewed_to = max(deadline, now + seconds * RENEWED_SHARE)
                    renewed += renewed_to > deadline
                    self._leases[request_id] = (renewed_to, seconds)
                    states[request_id] = int((renewed_to - now) * 1000)
                else:
                    states[request_id] = FREED if request_id in self._freed else UNKNOWN
        if renewed:
            self.stats.renewed(renewed)
        return states

    def _streams(self, names: list[str]) -> list[bytes]:
        """Streams' progress on this rank, for stream ids a line each: one JSON object by
        stream id of ``[request id, blocks per group, final tokens, length]``, naming only
        the streams this rank has run or runs; one whose step runs, and some of whose layers
        that step has saved, adds ``[tokens once the step is done, those layers]``."""
        known = {}
        with self._lock:
            saved = tuple(sorted(self._saved))
            for stream_id in names:
                done = self._progress.get(stream_id)
                running = self._expected.get(stream_id) if saved else None
                if running is not None:
                    # Tokens before the step were final already (computed, or a prefix hit).
                    final = done.final_tokens if done is not None else 0
                    ahead = (running.final_tokens, saved)
                    known[stream_id] = replace(running, final_tokens=final, ahead=ahead)
                elif done is not None:
                    known[stream_id] = done
        return [encode_progress(known)]

    def expect(self, progress: dict[str, Progress]) -> None:
        """What this step's forward pass will make final (published once it is done)."""
        with self._lock:
            self._expected = dict(progress)
            self._saved = set()

    def saved(self, layer: int) -> None:
        """The step's forward pass has written model layer ``layer``'s cache: its tokens of
        the step's streams are final there (told while the step still runs)."""
        if self._expected:
            with self._lock:
                self._saved.add(layer)

    def publish(self) -> None:
        """The step's forward pass is done: its streams' tokens are final here."""
        if not self._expected:
            return
        with self._lock:
            for stream_id, progress in self._expected.items():
                self._progress[stream_id] = progress
                self._progress.move_to_end(stream_id)
            while len(self._progress) > MAX_STREAMS:
                self._progress.popitem(last=False)
            self._expected = {}
            self._saved = set()

    def _hello(self, identity: bytes, version: bytes, payload: bytes) -> list[bytes]:
        """Checks a decode rank's identity and layout, and answers with this rank's."""
        check_identity(self._cache.identity, identity, "decode")
        rules = self._cache.peer_rules(block_sizes_of(identity, len(self._cache.groups), "decode"))
        peer = decode_layout(version, payload, max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
        planner = self._cache.rules.planner(
            prefill_layout=self._layout,
            decode_layout=peer.layout,
            prefill_buffers=self._cache.cache.buffers,
            decode_buffers=peer.buffers,
            token_maps=self._cache.token_maps(rules),
        )
        return [
            self._cache.identity_bytes(),
            *self._frames,
            self._engine_metadata,
            planner.fingerprint.encode(),
            generation_frame(self._generation),
        ]

    def _done(self, heard: list[tuple[str, int]]) -> None:
        """A decode rank's "done" for requests, with how many decode ranks this rank waits
        for each."""
        with self._lock:
            for request_id, count in heard:
                seen = self._notices.setdefault(request_id, [0, count])
                seen[0] += 1
                seen[1] = count
            while len(self._notices) > MAX_EARLY_NOTICES:
                self._notices.popitem(last=False)

    def lease(self, leases: dict[str, float]) -> None:
        """Requests whose blocks this rank holds, each for its lease (seconds from now, on
        this rank's monotonic clock; a decode side's holds renew it)."""
        now = time.monotonic()
        with self._lock:
            for request_id, seconds in leases.items():
                self._leases[request_id] = (now + seconds, seconds)

    def freed(self) -> set[str]:
        """Requests every reader is done with, or whose lease ran out: their blocks go free."""
        now = time.monotonic()
        done: set[str] = set()
        with self._lock:
            for request_id, (deadline, _) in list(self._leases.items()):
                heard = self._notices.get(request_id)
                if heard is not None and heard[0] >= heard[1]:
                    done.add(request_id)
                elif now > deadline:
                    logger.warning(
                        "pdplan: request %s: no decode side read it within its lease; its "
                        "blocks are freed",
                        request_id,
                    )
                    self.stats.expired()
                    done.add(request_id)
            for request_id in done:
                del self._leases[request_id]
                self._notices.pop(request_id, None)
                self._freed[request_id] = None
            while len(self._freed) > MAX_FREED_KEPT:
                self._freed.popitem(last=False)
            if done:
                for stream_id in [k for k, p in self._progress.items() if p.request_id in done]:
                    del self._progress[stream_id]
        return done

    def close(self) -> None:
        self._server.close()
