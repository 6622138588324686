"""The decode side's "done" notices: every prefill rank that holds a request's blocks hears,
with how many decode ranks it waits for, once a step's reads complete. They are gathered a
step (one message a prefill rank, not one a request) and sent by a thread of their own over
sockets kept open per rank, off the engine step's path."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pdplan.session._faults import TransferFault
from pdplan.session._peers import Peer
from pdplan.session._protocol import PROTOCOL, done_messages, reply_body
from pdplan.session._side_channel import configure


class DoneNotices:
    """A step's "done" lines gathered by prefill rank, then handed to the sender."""

    def __init__(self, timeout_seconds: float, on_error: Callable[[str], None]) -> None:
        self._sender = Notices(timeout_seconds, on_error)
        self._outbox: dict[tuple[str, int], list[tuple[str, int]]] = {}

    def add(self, peer: Peer, prefill_request_id: str) -> None:
        """Every prefill rank that holds the request's blocks for this rank hears "done"."""
        for rank in peer.holders:
            where = (peer.host, peer.port + rank)
            self._outbox.setdefault(where, []).append((prefill_request_id, peer.waits.get(rank, 1)))

    def flush(self) -> None:
        """Sends what was gathered since the last flush, a message a prefill rank."""
        for (host, port), lines in self._outbox.items():
            for message in done_messages(lines):
                self._sender.send(host, port, message)
        self._outbox.clear()

    def close(self) -> None:
        self._sender.close()


class Notices:
    """One-way messages to prefill ranks, sent by a thread of their own. A rank that does not
    answer gets its socket renewed and the message is dropped (its lease frees the blocks)."""

    #: Notices waiting at most; past it new ones are dropped, logged.
    MAX_QUEUED = 65536

    def __init__(self, timeout_seconds: float, on_error: Callable[[str], None]) -> None:
        import queue

        self._queue: queue.Queue[tuple[str, int, list[bytes]] | None] = queue.Queue(self.MAX_QUEUED)
        self._timeout = timeout_seconds
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="pdplan-notices", daemon=True)
        self._thread.start()

    def send(self, host: str, port: int, frames: list[bytes]) -> None:
        import queue

        try:
            self._queue.put_nowait((host, port, frames))
        except queue.Full:
            self._on_error(f"notice to {host}:{port} dropped: {self.MAX_QUEUED} waiting")

    def _run(self) -> None:
        import zmq

        context: Any = zmq.Context.instance()
        sockets: dict[tuple[str, int], Any] = {}
        while (item := self._queue.get()) is not None:
            host, port, frames = item
            socket = sockets.get((host, port))
            try:
                if socket is None:
                    socket = context.socket(zmq.REQ)
                    configure(socket, self._timeout)
                    socket.connect(f"tcp://{host}:{port}")
                    sockets[(host, port)] = socket
                socket.send_multipart([PROTOCOL, *frames])
                reply_body(socket.recv_multipart(), f"{host}:{port}")
            except zmq.ZMQError as error:
                self._on_error(f"notice to {host}:{port} not delivered: {error}")
                if socket is not None:
                    socket.close()
                sockets.pop((host, port), None)
            except TransferFault as error:
                self._on_error(f"notice to {host}:{port}: {error}")
        for socket in sockets.values():
            socket.close()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2)
