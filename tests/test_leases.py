"""Leases that cannot lie, and reads never abandoned (no runtime): prefill and decode ranks in
this process over their real side channel, vLLM's CPU cache shape in numpy memory, engines
that copy with ctypes. The oracles: the arrays' bytes, and what each rank reports when.

- A request waiting on the decode side keeps its lease: the decode rank's holds renew it past
  its length, and it is read whole.
- A request whose lease ran out (the prefill rank freed it, and another request's bytes took
  its pages) is never reported read: it fails with cause ``lease``, its blocks recomputed.
- A read lands before any lease reached the prefill rank: it is reported only once the rank
  confirms it holds the blocks.
- A read that failed or ran past its timeout is not reported until the engine says no byte
  of it can land (its sibling reads in flight aborted, the abort retried while refused).
- The hold messages are read strictly."""

from __future__ import annotations

import ctypes
import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_session import HOST, Loopback, cache_array, finished, worker_cache

from pdplan.session import (
    DecodeRank,
    PrefillRank,
    ProtocolFault,
    Receive,
    Remote,
    SettingsFault,
)
from pdplan.session._engines import NixlEngine
from pdplan.session._protocol import (
    FREED,
    MAX_NOTICES_A_MESSAGE,
    UNKNOWN,
    encode_holds,
    hold_names,
    hold_request,
    holds_of,
)

#: Ports of this file's own, apart for each xdist worker (tests of one file run on both).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_ports = itertools.count(9400 + 200 * _WORKER, 4)


@pytest.fixture
def prefill() -> Iterator[tuple[PrefillRank, np.ndarray, int]]:
    port = next(_ports)
    pages = cache_array(11)
    rank = PrefillRank(worker_cache(pages, 1), 0, 1, Loopback(), HOST, port)
    yield rank, pages, port
    rank.close()


def remote(port: int, request: str, tp: int = 1) -> Remote:
    return Remote(f"prefill-{port}", request, HOST, port, tp)


def puller_of(engine: Any = None, timeout: float = 20.0) -> tuple[DecodeRank, np.ndarray]:
    """A decode rank at TP 1 over a fresh cache (returned too: kept alive while the engine
    writes into it)."""
    decode = cache_array()
    return DecodeRank(worker_cache(decode, 1), 0, 1, engine or Loopback(), 2.0, timeout), decode


def poll_for(puller: DecodeRank, seconds: float, check: Any = None) -> None:
    """Polls as a runtime's steps would for ``seconds``, calling ``check`` after each."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        puller.poll()
        if check is not None:
            check()
        time.sleep(0.02)


def until_freed(rank: PrefillRank, request: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while request not in rank.freed():
        assert time.monotonic() < deadline, f"{request} never freed"
        time.sleep(0.02)


def test_a_waiting_request_keeps_its_lease_past_its_length(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank, pages, port = prefill
    puller, decode = puller_of()
    try:
        rank.lease({"waits": 0.6})
        puller.hold({"d-waits": remote(port, "waits")})

        def held() -> None:
            assert "waits" not in rank.freed(), "freed while the decode side held it"

        poll_for(puller, 2.0, held)  # over three leases
        puller.start([Receive("d-waits", ((4, 6),), ((1, 3),), remote(port, "waits"))])
        seen = finished(puller, {"d-waits"})
        assert seen["failed"] == set()
        np.testing.assert_array_equal(decode[[4, 6]], pages[[1, 3]])
        until_freed(rank, "waits")  # every reader's done arrived
        assert rank.stats.take()["counts"]["leases_renewed"] >= 3
        assert puller.stats.take()["counts"]["holds_sent"] >= 3
    finally:
        puller.close()


def test_a_request_read_after_its_lease_ran_out_is_recomputed(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank, pages, port = prefill
    puller, _decode = puller_of()  # kept alive while the engine writes into it
    try:
        rank.lease({"late": 0.05})
        until_freed(rank, "late")
        pages[[1, 3]] = -1.0  # another request took its pages
        puller.start([Receive("d-late", ((4, 6),), ((1, 3),), remote(port, "late"))])
        seen = finished(puller, {"d-late"})
        assert (seen["failed"], seen["blocks"]) == ({"d-late"}, {4, 6})
        failures = puller.stats.take()["failures"]
        assert failures == {"requests:lease": 1, "recomputed_blocks:lease": 2}, failures
    finally:
        puller.close()


class Counting(Loopback):
    """A loopback engine that counts its reads."""

    reads = 0

    def read(self, peer: bytes, local: Any, remote: Any, lengths: Any) -> Any:
        self.reads += 1
        return super().read(peer, local, remote, lengths)


def test_a_queued_request_told_freed_is_never_read(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    """The decode side learns from a hold while the request waits that its lease ran out:
    the request fails before any read is posted."""
    rank, _, port = prefill
    engine = Counting()
    puller, _ = puller_of(engine)
    try:
        rank.lease({"gone": 0.05})
        until_freed(rank, "gone")
        puller.hold({"d-gone": remote(port, "gone")})
        poll_for(puller, 1.0)  # its hold answered "freed" meanwhile
        puller.start([Receive("d-gone", ((5,),), ((1,),), remote(port, "gone"))])
        assert finished(puller, {"d-gone"})["failed"] == {"d-gone"}
        assert engine.reads == 0
    finally:
        puller.close()


def test_a_prefill_instance_started_again_confirms_nothing_it_never_held() -> None:
    """A request held by an instance that is then killed and started again on the same port:
    the new one answers ``unknown`` for it, which after a hold means it forgot (the bytes
    there are not the request's): the read fails, even though the old hold had not ended."""
    port = next(_ports)
    # Both kept alive: the loopback engine reads whichever addresses the handshake gave.
    pages = [cache_array(30), cache_array(31), cache_array()]
    first = PrefillRank(worker_cache(pages[0], 1), 0, 1, Loopback(), HOST, port)
    puller = DecodeRank(worker_cache(pages[2], 1), 0, 1, Loopback(), 2.0, 5.0)
    again: PrefillRank | None = None
    try:
        first.lease({"r": 60})
        puller.hold({"d-r": remote(port, "r")})
        poll_for(puller, 0.5)
        first.close()
        deadline = time.monotonic() + 10
        while again is None:  # the port is free once the old server's socket closed
            try:
                again = PrefillRank(worker_cache(pages[1], 1), 0, 1, Loopback(), HOST, port)
            except SettingsFault:
                assert time.monotonic() < deadline, "the port never came free"
                time.sleep(0.1)
        puller.start([Receive("d-r", ((4,),), ((1,),), remote(port, "r"))])
        seen = finished(puller, {"d-r"})
        assert (seen["failed"], seen["blocks"]) == ({"d-r"}, {4})
    finally:
        puller.close()
        if again is not None:
            again.close()


def test_a_read_waits_for_the_prefill_rank_to_confirm_its_lease(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank, pages, port = prefill
    puller, decode = puller_of()
    try:
        puller.start([Receive("d-early", ((4,),), ((1,),), remote(port, "early"))])

        def unreported() -> None:  # the bytes landed; no lease at the rank yet
            assert puller.take_finished()[0] == set()

        poll_for(puller, 0.5, unreported)
        rank.lease({"early": 60})
        seen = finished(puller, {"d-early"})
        assert seen["failed"] == set()
        np.testing.assert_array_equal(decode[4], pages[1])
    finally:
        puller.close()


class Stuck(Loopback):
    """Reads copy at once but stay in flight until aborted; the first ``refusals`` aborts
    are refused (the engine cannot stop them yet); a read of ``failing`` ports' memory fails."""

    def __init__(self, refusals: int, failing: int = -1) -> None:
        super().__init__()
        self.refusals = refusals
        self.failing = failing
        self.reads = 0
        self.aborts = 0

    def read(self, peer: bytes, local: Any, remote: Any, lengths: Any) -> Any:
        for dst, src, n in zip(local.tolist(), remote.tolist(), lengths.tolist()):
            ctypes.memmove(dst, src, n)
        self.reads += 1
        return {"failed": self.reads == self.failing, "ended": False}

    def state(self, handle: Any) -> str:
        if handle["failed"]:
            return "ERR"
        return "DONE" if handle["ended"] else "PROC"

    def abort(self, handle: Any) -> bool:
        self.aborts += 1
        if self.aborts <= self.refusals:
            return False
        handle["ended"] = True
        return True


@pytest.mark.parametrize("failing", [-1, 2])
def test_a_failed_or_late_read_is_reported_only_once_the_engine_let_it_go(failing: int) -> None:
    """Two prefill ranks (TP 2), a read of each: one runs past the timeout (``failing`` -1)
    or fails while the other is in flight (2): nothing is reported while the engine refuses
    to abort the read in flight, and the request fails once it does."""
    port = next(_ports)
    ranks = [PrefillRank(worker_cache(cache_array(20 + r), 2, kv_heads=2), r, 2, Loopback(),
                         HOST, port) for r in range(2)]  # fmt: skip
    engine = Stuck(refusals=5, failing=failing)
    decode = np.zeros((8, 2, 32, 32), np.float32)  # both ranks' heads
    puller = DecodeRank(worker_cache(decode, 1, kv_heads=2), 0, 1, engine, 2.0, 0.3)
    try:
        for rank in ranks:
            rank.lease({"r": 60})
        puller.start([Receive("d-r", ((4,),), ((1,),), remote(port, "r", tp=2))])
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "never aborted"
            puller.poll()
            done, failed, blocks = puller.take_finished()
            if engine.aborts <= engine.refusals:  # the read in flight may still land
                assert done == set(), "reported while a read may land"
            elif done:
                break
            time.sleep(0.02)
        assert (done, failed, blocks) == ({"d-r"}, {"d-r"}, {4})
        assert puller.stats.take()["failures"]["requests:transfer"] == 1
    finally:
        puller.close()
        for rank in ranks:
            rank.close()


class Agent:
    """NIXL's agent as far as ``NixlEngine.state`` uses it: a transfer in error whose handle
    NIXL refuses to release ``refusals`` times (NIXL_ERR_REPOST_ACTIVE)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.released: list[Any] = []

    def check_xfer_state(self, handle: Any) -> str:
        return "ERR"

    def release_xfer_handle(self, handle: Any) -> None:
        if self.refusals:
            self.refusals -= 1
            raise RuntimeError("NIXL_ERR_REPOST_ACTIVE")
        self.released.append(handle)


def test_a_nixl_handle_nixl_will_not_release_stays_in_flight() -> None:
    agent = Agent(refusals=2)
    engine = NixlEngine("test", agent=agent)
    assert [engine.state("h") for _ in range(3)] == ["PROC", "PROC", "ERR"]
    assert agent.released == ["h"]


def test_hold_messages_round_trip_and_are_read_strictly() -> None:
    names = ["a", "b-1", "c"]
    assert hold_names(hold_request(names)[1:]) == names
    states: dict[str, int | str] = {"a": 1500, "b-1": FREED, "c": UNKNOWN}
    assert holds_of(encode_holds(states)) == states
    assert holds_of([b""]) == {}
    assert holds_of([b"a\tb\t7"]) == {"a\tb": 7}  # an id with a tab: its last one splits
    for bad in (
        ["a\t\u00b2".encode()],  # digits str.isdigit takes, int() does not
        ["a\t\u0661".encode()],
        [b"a\t-5"],
        [b"a"],
        [b"a\tsoon"],
        [b"a\t1234567890"],
        [b"x", b"y"],
        ["\n".join(f"r{i}\t1" for i in range(MAX_NOTICES_A_MESSAGE + 1)).encode()],
    ):
        with pytest.raises(ProtocolFault):
            holds_of(bad)
    with pytest.raises(ProtocolFault):
        hold_names(["\n".join(["r"] * (MAX_NOTICES_A_MESSAGE + 1)).encode()])


def test_a_prefill_rank_answers_holds_by_what_it_holds(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank = prefill[0]
    rank.lease({"held": 3.0, "short": 0.01})
    until_freed(rank, "short")
    answered = rank._hold(["held", "short", "never"])
    assert answered["short"] == FREED and answered["never"] == UNKNOWN
    assert 2900 <= int(answered["held"]) <= 3000  # what was left: never shortened
    time.sleep(1.5)
    renewed = int(rank._hold(["held"])["held"])
    assert 1950 <= renewed <= 2000, renewed  # renewed to 2/3 of the lease from now
