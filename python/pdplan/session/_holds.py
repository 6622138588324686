"""A decode rank's holds: it asks each prefill rank that holds a request's blocks for it to
keep holding them, from the moment the request waits here until its read is confirmed, and
reads each reply as a proof: "held for N ms more" from a rank means the rank held the blocks
from the request's finish up to the reply, and will until N ms past it. A read counts only
once a reply to an ask sent after the read was posted says the rank holds the blocks until
the read landed or later: the rank that answered is the one whose memory was read (an
instance started again on the same port answers ``unknown`` for a request it never had), and
the read's bytes are that request's.

No clock is compared across hosts: a reply's hold is counted on this rank's monotonic clock
from when its ask was *sent* (before the rank answered, so never later than the rank's own
deadline). Asks go out without a thread (``AskSockets``), one round a rank at a time, and a
held request is asked again once a quarter of its hold has passed (NixlConnector's heartbeats
renew every sixth of a lease, a lease 2/3 ahead: several asks may be lost before one runs
out). A rank that answers wrongly or not at all is asked again after a back-off."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from pdplan.session._metrics import SessionStats
from pdplan.session._progress_asks import AskSockets, Endpoint
from pdplan.session._protocol import (
    FREED,
    MAX_NOTICES_A_MESSAGE,
    UNKNOWN,
    hold_request,
    holds_of,
    reply_body,
)

logger = logging.getLogger("pdplan.session")

#: An unconfirmed request is asked again after this (a lease not yet at the rank).
RETRY_SECONDS = 0.02
#: A rank that answered wrongly, not at all, or could not be sent to is asked again after this.
BACKOFF_SECONDS = 1.0
#: The share of a confirmed hold after which it is renewed.
RENEW_AT = 0.25
#: Confirmed states: ``(ask sent at, held until)`` on this rank's monotonic clock, or ``FREED``.
Known = tuple[float, float] | str


@dataclass
class _Rank:
    """One prefill rank's requests: when each is due to be asked, what its replies said, and
    the asks in flight (replies come in the order asks went)."""

    due: dict[str, float] = field(default_factory=dict)
    known: dict[str, Known] = field(default_factory=dict)
    asked: deque[tuple[float, list[str]]] = field(default_factory=deque)
    #: The requests in the asks in flight, each with when its ask went.
    in_flight: dict[str, float] = field(default_factory=dict)


class Holds:
    """The requests this decode rank wants prefill ranks to hold, and what they confirmed."""

    def __init__(self, timeout_seconds: float, stats: SessionStats) -> None:
        self._sockets = AskSockets(timeout_seconds)
        self._timeout = timeout_seconds
        self._stats = stats
        self._ranks: dict[Endpoint, _Rank] = {}

    def want(self, endpoint: Endpoint, request_id: str, now: bool = False) -> None:
        """Asks ``endpoint`` to hold the request from now on (at the next ``send``); ``now``:
        asked at the next ``send`` even if it was asked before (a read was just posted)."""
        rank = self._ranks.setdefault(endpoint, _Rank())
        if now and request_id not in rank.in_flight:
            rank.due[request_id] = 0.0
        else:
            rank.due.setdefault(request_id, 0.0)

    def drop(self, endpoint: Endpoint, request_id: str) -> None:
        """The request needs no hold from ``endpoint`` anymore (read, failed, or gone)."""
        rank = self._ranks.get(endpoint)
        if rank is None:
            return
        rank.due.pop(request_id, None)
        rank.known.pop(request_id, None)
        if not rank.due and not rank.asked:
            del self._ranks[endpoint]
            self._sockets.reset(endpoint)

    def drop_request(self, request_id: str) -> None:
        """The request needs no hold from any rank anymore."""
        for endpoint in list(self._ranks):
            self.drop(endpoint, request_id)

    def freed(self, endpoint: Endpoint, request_id: str) -> bool:
        """Whether the rank said the request's blocks went free."""
        rank = self._ranks.get(endpoint)
        return rank is not None and rank.known.get(request_id) == FREED

    def confirmed(
        self, endpoint: Endpoint, request_id: str, posted_at: float, landed_at: float
    ) -> bool | None:
        """Whether the rank held the request's blocks through a read posted at
        ``posted_at`` that landed by ``landed_at``: True once a reply to an ask sent since the
        post says so, False once one says they went free, None until then (an ask goes out
        at the next ``send`` whose reply can tell)."""
        rank = self._ranks.setdefault(endpoint, _Rank())
        known = rank.known.get(request_id)
        if known == FREED:
            return False
        if isinstance(known, tuple) and known[0] >= posted_at and known[1] >= landed_at:
            return True
        # Asked again (at the next ``send``), unless an ask sent since the read landed is in
        # flight already.
        if rank.in_flight.get(request_id, -1.0) < landed_at:
            rank.due[request_id] = min(rank.due.get(request_id, 0.0), landed_at)
        return None

    def collect(self) -> None:
        """Reads the replies that arrived (a rank whose asks go unanswered past the timeout
        gets its socket renewed and is asked again); forgets ranks no request needs."""
        now = time.monotonic()
        for endpoint, rank in list(self._ranks.items()):
            self._collect(endpoint, rank, now)
            if not rank.due and not rank.asked:
                del self._ranks[endpoint]
                self._sockets.reset(endpoint)

    def send(self) -> None:
        """Sends the asks due, one round a rank at a time."""
        now = time.monotonic()
        for endpoint, rank in list(self._ranks.items()):
            if rank.asked:
                continue
            due = [r for r, at in rank.due.items() if at <= now]
            if due:
                self._ask(endpoint, rank, due, now)

    def _collect(self, endpoint: Endpoint, rank: _Rank, now: float) -> None:
        while rank.asked:
            reply = self._sockets.receive(endpoint)
            if reply is None:
                break
            sent, ids = rank.asked.popleft()
            for request_id in ids:
                rank.in_flight.pop(request_id, None)
            try:
                states = holds_of(reply_body(reply, f"{endpoint[0]}:{endpoint[1]}"))
            except Exception as error:  # a peer's bytes: never the engine's step
                logger.warning("pdplan: prefill rank %s:%d answered a hold wrongly: %s",
                               *endpoint, error)  # fmt: skip
                self._reset(endpoint, rank, now)
                return
            for request_id in ids:
                if request_id not in rank.due:
                    continue  # dropped meanwhile
                state = states.get(request_id, UNKNOWN)
                if state == FREED:
                    rank.known[request_id] = FREED
                    rank.due[request_id] = float("inf")
                elif isinstance(state, int):
                    held = state / 1000
                    rank.known[request_id] = (sent, sent + held)
                    rank.due[request_id] = sent + max(held * RENEW_AT, RETRY_SECONDS)
                elif isinstance(rank.known.get(request_id), tuple):
                    # It held them and forgot: an instance started again on its port.
                    rank.known[request_id] = FREED
                    rank.due[request_id] = float("inf")
                else:  # no lease reached the rank yet: its scheduler holds the blocks
                    rank.due[request_id] = now + RETRY_SECONDS
        if rank.asked and now - rank.asked[0][0] > self._timeout:
            logger.warning("pdplan: prefill rank %s:%d did not answer a hold within %s s",
                           *endpoint, self._timeout)  # fmt: skip
            self._reset(endpoint, rank, now)

    def _reset(self, endpoint: Endpoint, rank: _Rank, now: float) -> None:
        """Asks in flight are dropped (their late replies never read as another's), and the
        rank is asked again after the back-off."""
        later = now + BACKOFF_SECONDS
        for request_id, at in rank.due.items():
            if at <= now or request_id in rank.in_flight:
                rank.due[request_id] = later
        rank.asked.clear()
        rank.in_flight.clear()
        self._sockets.reset(endpoint)

    def _ask(self, endpoint: Endpoint, rank: _Rank, due: list[str], now: float) -> None:
        try:
            for start in range(0, len(due), MAX_NOTICES_A_MESSAGE):
                part = due[start : start + MAX_NOTICES_A_MESSAGE]
                self._sockets.send(endpoint, hold_request(part))
                rank.asked.append((now, part))
                for request_id in part:
                    rank.due[request_id] = float("inf")  # until its reply
                    rank.in_flight[request_id] = now
        except Exception as error:  # its queue full, its address unusable: asked again later
            logger.warning("pdplan: a hold could not be sent to %s:%d: %s", *endpoint, error)
            self._reset(endpoint, rank, now)
            return
        self._stats.held(len(due))

    def close(self) -> None:
        self._sockets.close()
