"""The side channel between a decode rank and a prefill rank: a ZeroMQ request/reply over TCP
with bounded frames. The decode rank asks, the prefill rank's server thread answers; a peer
that does not answer within the timeout is an error, never a hang."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pdplan._core import UnsupportedPDLayoutError

#: The protocol's first frame: a peer speaking another version is refused by it.
PROTOCOL = b"pdplan-side/1"

#: Frames the channel carries at most, and bytes a message may take (a layout frame of a
#: large model is well below a MiB; pdplan.limits bounds the layout itself).
MAX_FRAMES = 8
MAX_MESSAGE_BYTES = 4 << 20

#: Answers a request's frames (after the protocol frame) with reply frames.
Handler = Callable[[list[bytes]], list[bytes]]


class SideChannelServer:
    """A prefill rank's listener: one thread answering requests with ``handler``."""

    def __init__(self, host: str, port: int, handler: Handler) -> None:
        import zmq

        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as error:
            self._socket.close()
            raise UnsupportedPDLayoutError(
                f"the side channel cannot listen on {host}:{port} ({error}); give each "
                "instance its own side_channel_port (a rank listens on port + its rank)"
            ) from None
        self._handler = handler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pdplan-side-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not dict(poller.poll(100)):
                continue
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                continue
            # ROUTER: identity, empty delimiter (REQ), then the request.
            identity, body = frames[0], frames[2:] if len(frames) > 1 and not frames[1] else []
            reply = self._answer(body)
            self._socket.send_multipart([identity, b"", *reply])

    def _answer(self, body: list[bytes]) -> list[bytes]:
        if not body or body[0] != PROTOCOL or len(body) > MAX_FRAMES:
            return [b"refused", b"not a pdplan side-channel request (protocol pdplan-side/1)"]
        try:
            return [b"ok", *self._handler(body[1:])]
        except UnsupportedPDLayoutError as error:
            return [b"refused", str(error).encode()[:4096]]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()


def ask(host: str, port: int, frames: list[bytes], timeout_seconds: float) -> list[bytes]:
    """One request to a prefill rank's server: its reply frames after ``ok``. A refusal, a
    reply of too many frames or no reply within ``timeout_seconds`` raises
    ``UnsupportedPDLayoutError`` (``PeerGone`` for no reply)."""
    import zmq

    context = zmq.Context.instance()
    socket: Any = context.socket(zmq.REQ)
    try:
        _configure(socket, timeout_seconds)
        socket.connect(f"tcp://{host}:{port}")
        socket.send_multipart([PROTOCOL, *frames])
        reply: list[bytes] = socket.recv_multipart()
    except zmq.Again:
        raise PeerGone(
            f"the prefill rank at {host}:{port} did not answer within {timeout_seconds} s"
        ) from None
    except zmq.ZMQError as error:
        raise UnsupportedPDLayoutError(f"the side channel to {host}:{port}: {error}") from None
    finally:
        socket.close()
    if len(reply) > MAX_FRAMES + 1:
        raise UnsupportedPDLayoutError(f"the peer at {host}:{port} sent {len(reply)} frames")
    if reply[:1] != [b"ok"]:
        message = reply[1][:4096].decode(errors="replace") if len(reply) > 1 else "no reason"
        raise UnsupportedPDLayoutError(f"the prefill rank at {host}:{port} refused: {message}")
    return reply[1:]


def _configure(socket: Any, timeout_seconds: float) -> None:
    import zmq

    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_seconds * 1000)))
    socket.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_seconds * 1000)))


class Notices:
    """One-way notices to prefill ranks ("done"), sent by a thread of their own over sockets
    kept open per rank, off the engine step's path. A rank that does not answer gets its
    socket renewed and the notice is dropped (its lease frees the blocks)."""

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

        context = zmq.Context.instance()
        sockets: dict[tuple[str, int], Any] = {}
        while (item := self._queue.get()) is not None:
            host, port, frames = item
            socket = sockets.get((host, port))
            try:
                if socket is None:
                    socket = context.socket(zmq.REQ)
                    _configure(socket, self._timeout)
                    socket.connect(f"tcp://{host}:{port}")
                    sockets[(host, port)] = socket
                socket.send_multipart([PROTOCOL, *frames])
                reply = socket.recv_multipart()
                if reply[:1] != [b"ok"]:
                    self._on_error(f"{host}:{port} refused a notice")
            except zmq.ZMQError as error:
                self._on_error(f"notice to {host}:{port} not delivered: {error}")
                if socket is not None:
                    socket.close()
                sockets.pop((host, port), None)
        for socket in sockets.values():
            socket.close()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2)


class PeerGone(UnsupportedPDLayoutError):
    """A peer that did not answer (dead, or not started)."""
