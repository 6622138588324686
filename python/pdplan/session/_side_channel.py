"""The side channel between a decode rank and a prefill rank: a ZeroMQ request/reply over TCP.
The prefill rank's server thread answers whatever reaches its port: a message is read a frame
at a time within the protocol's bounds (frames past them are drained, never kept in Python;
libzmq bounds each frame, ``MAXMSGSIZE``, and holds a message's frames until its last one
arrives), and any fault while answering (malformed, hostile, or a bug) becomes a refusal, so no
client can stop the thread. The decode rank asks with a timeout: a peer that does not answer is
a ``PeerGone``, never a hang."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.session._faults import (
    PeerGone,
    ProtocolFault,
    SettingsFault,
    TransferFault,
    cause_of,
)
from pdplan.session._protocol import (
    MAX_FRAMES,
    MAX_MESSAGE_BYTES,
    OK,
    PROTOCOL,
    refusal,
    reply_body,
    request_body,
)

logger = logging.getLogger("pdplan.session")

#: Answers a request's verb and frames with reply frames (after ``OK``).
Handler = Callable[[bytes, list[bytes]], list[bytes]]
#: How often refusals of bad requests are logged at most (they are counted always).
REFUSALS_LOGGED_EVERY_SECONDS = 60.0


class SideChannelServer:
    """A prefill rank's listener: one thread answering requests with ``handler``.
    ``on_refused(cause)`` hears of every request refused (for metrics)."""

    def __init__(
        self, host: str, port: int, handler: Handler,
        on_refused: Callable[[str], None] = lambda cause: None,
    ) -> None:  # fmt: skip
        import zmq

        self._context: Any = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        # A frame over the bound disconnects its sender before it is buffered.
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as error:
            self._socket.close()
            raise SettingsFault(
                f"the side channel cannot listen on {host}:{port} ({error}); give each "
                "instance its own side_channel_port (a rank listens on port + its rank)"
            ) from None
        self.where = f"{host}:{port}"
        self._handler = handler
        self._on_refused = on_refused
        self._refusals = 0
        self._logged_at = -REFUSALS_LOGGED_EVERY_SECONDS
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pdplan-side-channel", daemon=True)
        self._thread.start()

    @property
    def serving(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not dict(poller.poll(100)):
                    continue
                message = self._receive()
                if message is None:
                    continue
                identity, body = message
                self._socket.send_multipart([identity, b"", *self._answer(body)], zmq.NOBLOCK)
            except zmq.ZMQError:
                continue  # a peer gone mid-reply, or its queue full: its reply is dropped
            except Exception:  # never the thread: a fault here is logged and the loop goes on
                logger.exception("pdplan: the side channel at %s failed on a request", self.where)

    def _receive(self) -> tuple[bytes, list[bytes] | None] | None:
        """One message a frame at a time: the sender's identity and its request, or None
        for a request too long (drained, refused) or not shaped as a request (dropped)."""
        import zmq

        parts: list[bytes] = []
        total = 0
        more = True
        while more:
            frame = self._socket.recv(zmq.NOBLOCK)
            total += 1
            if total <= MAX_FRAMES + 2:  # identity and the empty delimiter, then the request
                parts.append(frame)
            more = bool(self._socket.getsockopt(zmq.RCVMORE))
        # ROUTER: the sender's identity, an empty delimiter (REQ), then the request.
        if len(parts) < 2 or parts[1]:
            self._refused("protocol", f"a message from {len(parts)} frames not of a request")
            return None
        if total > MAX_FRAMES + 2:
            return parts[0], None
        return parts[0], parts[2:]

    def _answer(self, body: list[bytes] | None) -> list[bytes]:
        try:
            if body is None:
                raise ProtocolFault(f"a side-channel request has over {MAX_FRAMES} frames")
            verb, frames = request_body(body)
            return [OK, *self._handler(verb, frames)]
        except UnsupportedPDLayoutError as error:
            self._refused(cause_of(error), str(error))
            return refusal(error)
        except Exception as error:  # any input's fault is a refusal, never the thread's end
            self._refused("internal", f"{type(error).__name__}: {error}")
            return refusal(
                TransferFault("the prefill rank failed on this request; its log says why")
            )

    def _refused(self, cause: str, reason: str) -> None:
        self._refusals += 1
        self._on_refused(cause)
        now = time.monotonic()
        if now - self._logged_at >= REFUSALS_LOGGED_EVERY_SECONDS:
            self._logged_at = now
            logger.warning("pdplan: the side channel at %s refused a request (%s: %.200s); %d "
                           "refused so far", self.where, cause, reason, self._refusals)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if not self._thread.is_alive():  # a ZeroMQ socket is closed by its own thread only
            self._socket.close()


def ask(host: str, port: int, frames: list[bytes], timeout_seconds: float) -> list[bytes]:
    """One request to a prefill rank's server: its reply frames after ``OK``. No reply
    within ``timeout_seconds`` raises ``PeerGone``; a refusal raises the fault the peer
    names; a reply that is not the protocol, ``ProtocolFault``."""
    import zmq

    context: Any = zmq.Context.instance()
    socket: Any = context.socket(zmq.REQ)
    where = f"{host}:{port}"
    try:
        configure(socket, timeout_seconds)
        socket.connect(f"tcp://{where}")
        socket.send_multipart([PROTOCOL, *frames])
        reply: list[bytes] = socket.recv_multipart()
    except zmq.Again:
        raise PeerGone(
            f"the prefill rank at {where} did not answer within {timeout_seconds} s"
        ) from None
    except zmq.ZMQError as error:
        raise SettingsFault(f"the side channel to {where}: {error}") from None
    finally:
        socket.close()
    return reply_body(reply, where)


def configure(socket: Any, timeout_seconds: float) -> None:
    import zmq

    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_seconds * 1000)))
    socket.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_seconds * 1000)))
