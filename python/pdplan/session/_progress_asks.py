"""Streams' progress asked without a thread: each source rank's request goes out on a
non-blocking socket kept for that rank, and its reply is picked up by a later step's poll.
Nothing waits on the network, and no reply waits for the GIL either: a background thread's
reply does, behind the engine's step (several milliseconds a reply, what made streamed
requests land 2-3x later than whole ones)."""

from __future__ import annotations

import time
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.session._progress import Progress
from pdplan.session._protocol import (
    MAX_STREAMS_ASKED,
    PROTOCOL,
    notices_of,
    progress_request,
    reply_body,
)
from pdplan.session._side_channel import configure

#: A prefill rank's side channel: host and port.
Endpoint = tuple[str, int]


class AskSockets:
    """One DEALER socket a prefill rank, opened at its first ask and kept (an ask is a send,
    its reply a receive, neither blocking)."""

    def __init__(self, timeout_seconds: float) -> None:
        self._timeout = timeout_seconds
        self._sockets: dict[Endpoint, Any] = {}

    def send(self, endpoint: Endpoint, frames: list[bytes]) -> None:
        import zmq

        socket = self._sockets.get(endpoint)
        if socket is None:
            socket = zmq.Context.instance().socket(zmq.DEALER)
            try:
                configure(socket, self._timeout)
                socket.connect(f"tcp://{endpoint[0]}:{endpoint[1]}")
            except Exception:
                socket.close()
                raise
            self._sockets[endpoint] = socket
        # A DEALER speaks to the server's ROUTER as a REQ would: an empty delimiter first.
        socket.send_multipart([b"", PROTOCOL, *frames], zmq.NOBLOCK)

    def receive(self, endpoint: Endpoint) -> list[bytes] | None:
        """A reply waiting from ``endpoint`` (its frames after the delimiter), or None."""
        import zmq

        socket = self._sockets.get(endpoint)
        if socket is None:
            return None
        try:
            reply: list[bytes] = socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        return reply[1:] if reply[:1] == [b""] else reply

    def reset(self, endpoint: Endpoint) -> None:
        """Closes a rank's socket (its late replies are never read as a later round's)."""
        socket = self._sockets.pop(endpoint, None)
        if socket is not None:
            socket.close()

    def keep(self, endpoints: set[Endpoint]) -> None:
        """Closes the sockets of ranks not in ``endpoints`` (no stream asks them now)."""
        for endpoint in [e for e in self._sockets if e not in endpoints]:
            self.reset(endpoint)

    def close(self) -> None:
        self.keep(set())


class ProgressRound:
    """One round of asks: every source rank asked for its streams (in batches a reply can
    hold), then the replies collected step by step until all are in or the timeout passes.
    A stream's progress is the least of its ranks' (a token is final once every rank holding
    its bytes has run it); a stream some rank has not run, or whose rank did not answer, is
    left out."""

    def __init__(self, sockets: AskSockets, asked: dict[Endpoint, list[str]],
                 timeout_seconds: float) -> None:  # fmt: skip
        self._sockets = sockets
        self._deadline = time.monotonic() + timeout_seconds
        self._waiting: dict[Endpoint, int] = {}  # replies each rank still owes
        self._least: dict[str, Progress] = {}
        self._found: dict[Endpoint, set[str]] = {}  # the streams each rank named
        self._missing: set[str] = set()
        self._asked = {endpoint: set(streams) for endpoint, streams in asked.items()}
        self.failed: set[Endpoint] = set()
        for endpoint, streams in asked.items():
            try:
                for start in range(0, len(streams), MAX_STREAMS_ASKED):
                    part = streams[start : start + MAX_STREAMS_ASKED]
                    sockets.send(endpoint, progress_request(part))
                    self._waiting[endpoint] = self._waiting.get(endpoint, 0) + 1
            except Exception:  # its queue full, its address unusable: this rank's streams wait
                self._fail(endpoint)

    def _fail(self, endpoint: Endpoint) -> None:
        self.failed.add(endpoint)
        self._missing.update(self._asked[endpoint])
        self._waiting.pop(endpoint, None)
        self._sockets.reset(endpoint)

    def poll(self) -> dict[str, Progress] | None:
        """Each stream's progress once every rank answered or timed out, else None."""
        for endpoint in list(self._waiting):
            while self._waiting.get(endpoint):
                reply = self._sockets.receive(endpoint)
                if reply is None:
                    break
                self._waiting[endpoint] -= 1
                try:
                    found = notices_of(reply_body(reply, f"{endpoint[0]}:{endpoint[1]}"))
                except UnsupportedPDLayoutError:
                    self._fail(endpoint)
                    break
                for stream_id, notice in found.items():
                    if stream_id not in self._asked[endpoint]:
                        continue
                    self._found.setdefault(endpoint, set()).add(stream_id)
                    least = self._least.get(stream_id)
                    if least is None or notice.final_tokens < least.final_tokens:
                        self._least[stream_id] = notice
            if self._waiting.get(endpoint) == 0:
                del self._waiting[endpoint]
                # What a rank's replies did not name, it has not run yet.
                named = self._found.get(endpoint, set())
                self._missing.update(s for s in self._asked[endpoint] if s not in named)
        if self._waiting and time.monotonic() > self._deadline:
            for endpoint in list(self._waiting):
                self._fail(endpoint)
        if self._waiting:
            return None
        return {k: v for k, v in self._least.items() if k not in self._missing}
