"""A prefill rank's side of the connector: its side-channel server (the handshake and the
decode side's "done"), and the requests whose blocks it holds until every decode rank that
reads or must notify it is done, or their lease runs out."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace

from pdplan._core import UnsupportedPDLayoutError
from pdplan._exchange import decode_layout, encode_layout
from pdplan._model import ParallelLayout
from pdplan.connectors._engines import TransferEngine
from pdplan.connectors._identity import check_identity
from pdplan.connectors._progress import Progress, encode_progress
from pdplan.connectors._side_channel import SideChannelServer
from pdplan.connectors.vllm._caches import WorkerCache
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers

#: "done" messages kept for requests this rank has not heard of yet (they can arrive before
#: the scheduler's lease): the oldest are dropped past this.
MAX_EARLY_NOTICES = 65536
#: Requests one "done" message may name (the decode side sends at most this many).
MAX_NOTICES_A_MESSAGE = 1024
#: Streams whose progress a rank keeps (the oldest are dropped past this).
MAX_STREAMS = 4096


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
    ) -> None:
        self._cache = cache
        self._tp_rank = tp_rank
        self._layout = ParallelLayout("prefill", tp_size)
        self._engine_metadata = engine.metadata()
        self._frames = encode_layout(
            self._layout,
            cache.cache.buffers,
            base_ptrs=cache.cache.base_ptrs,
            limits=cache.cache.limits,
        )
        self._lock = threading.Lock()
        self._notices: OrderedDict[str, list[int]] = OrderedDict()  # id -> [heard, expected]
        self._leases: dict[str, float] = {}
        # Streams' progress: what this step's forward pass makes final, then what is final.
        self._expected: dict[str, Progress] = {}
        self._saved: set[int] = set()  # model layers the running step has written
        self._progress: OrderedDict[str, Progress] = OrderedDict()
        self._server = SideChannelServer(host, port + tp_rank, self._answer)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if frames[:1] == [b"hello"] and len(frames) == 4:
            return self._hello(frames[1], frames[2], frames[3])
        if frames[:1] == [b"done"] and len(frames) == 2:
            self._done(frames[1])
            return []
        if frames[:1] == [b"progress"] and len(frames) == 2:
            return self._streams(frames[1])
        raise UnsupportedPDLayoutError("expected a hello, a done or a progress request")

    def _streams(self, payload: bytes) -> list[bytes]:
        """Streams' progress on this rank, for stream ids a line each: one JSON object by
        stream id of ``[request id, blocks per group, final tokens, length]``, naming only
        the streams this rank has run or runs; one whose step runs, and some of whose layers
        that step has saved, adds ``[tokens once the step is done, those layers]``."""
        names = payload.split(b"\n")
        if len(names) > MAX_NOTICES_A_MESSAGE:
            raise UnsupportedPDLayoutError(
                f"a progress request names {len(names)} streams, more than {MAX_NOTICES_A_MESSAGE}"
            )
        known = {}
        with self._lock:
            saved = tuple(sorted(self._saved))
            for stream_id in (n.decode(errors="replace")[:256] for n in names):
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
        check_identity(self._cache.identity, identity, "decode")
        peer = decode_layout(version, payload, max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
        planner = self._cache.rules.planner(
            prefill_layout=self._layout,
            decode_layout=peer.layout,
            prefill_buffers=self._cache.cache.buffers,
            decode_buffers=peer.buffers,
        )
        return [
            self._cache.identity_bytes(),
            *self._frames,
            self._engine_metadata,
            planner.fingerprint.encode(),
        ]

    def _done(self, payload: bytes) -> None:
        """A decode rank's "done" for requests, a line each: ``request_id<TAB>count`` (how
        many decode ranks this rank waits for)."""
        lines = payload.split(b"\n")
        if len(lines) > MAX_NOTICES_A_MESSAGE:
            raise UnsupportedPDLayoutError(
                f"a done message names {len(lines)} requests, more than {MAX_NOTICES_A_MESSAGE}"
            )
        heard = []
        for line in lines:
            name, tab, expected = line.partition(b"\t")
            try:
                count = int(expected[:16]) if tab else -1
            except ValueError:
                count = -1
            if count < 0:
                raise UnsupportedPDLayoutError("a done line is not request_id<TAB>count")
            heard.append((name.decode(errors="replace")[:256], count))
        with self._lock:
            for request_id, count in heard:
                seen = self._notices.setdefault(request_id, [0, count])
                seen[0] += 1
                seen[1] = count
            while len(self._notices) > MAX_EARLY_NOTICES:
                self._notices.popitem(last=False)

    def lease(self, leases: dict[str, float]) -> None:
        """Requests whose blocks this rank holds, each until its deadline (``time.time()``)."""
        with self._lock:
            self._leases.update(leases)

    def freed(self) -> set[str]:
        """Requests every reader is done with, or whose lease ran out: their blocks go free."""
        now = time.time()
        done: set[str] = set()
        with self._lock:
            for request_id, deadline in list(self._leases.items()):
                heard = self._notices.get(request_id)
                if heard is not None and heard[0] >= heard[1]:
                    done.add(request_id)
                elif now > deadline:
                    logger.warning(
                        "pdplan: request %s: no decode side read it within its lease; its "
                        "blocks are freed",
                        request_id,
                    )
                    done.add(request_id)
            for request_id in done:
                del self._leases[request_id]
                self._notices.pop(request_id, None)
            if done:
                for stream_id in [k for k, p in self._progress.items() if p.request_id in done]:
                    del self._progress[stream_id]
        return done

    def close(self) -> None:
        self._server.close()
