"""The transfer session on its own (no runtime): prefill and decode ranks in this process over
their real side channel (ZeroMQ on loopback), vLLM's CPU cache shape in numpy memory, and a
loopback engine that copies descriptors with ctypes. The oracle is the arrays' own bytes.

- A decode rank reads around a prefill rank that does not answer, where another holds the
  same bytes (one KV head at prefill TP 2: a replica group).
- A peer that never answers stalls no other request: the decode rank's step never waits on the
  network, and the silent peer's request fails after its timeout, its blocks recomputed.
- No client can stop a prefill rank's side channel: malformed, oversized, deeply nested,
  wrong-protocol, many-frame and raw-TCP clients, many at once, and random frames
  (hypothesis) each get a bounded refusal or are dropped; the server keeps answering and a
  decode rank then pulls exactly.
- Faults come by type, each an ``UnsupportedPDLayoutError``, counted by cause."""

from __future__ import annotations

import ctypes
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdplan import UnsupportedPDLayoutError
from pdplan.runtimes import vllm as vllm_adapter
from pdplan.session import (
    DecodeRank,
    GroupCache,
    LayoutRefused,
    PeerGone,
    PrefillRank,
    ProtocolFault,
    Receive,
    Remote,
    TransferFault,
    VersionSkew,
    WorkerCache,
)
from pdplan.session._memory import Memory, tagged
from pdplan.session._protocol import BLOCK_SIZES, MAX_MESSAGE_BYTES, PROTOCOL, identity_bytes
from pdplan.session._side_channel import ask

BLOCKS, BLOCK, HEAD = 8, 32, 16
HOST = "127.0.0.1"
#: Ports of this file's own (pytest-xdist runs files on separate workers).
_ports = itertools.count(7300, 4)
IDENTITY = {"model": "tiny", "dtype": "float32", "cache_dtype": "auto", "num_layers": 1}


class Loopback:
    """An engine in one process: a read is a memmove, done at once. Each registration has
    its own metadata; the peers' forgotten are recorded."""

    def __init__(self) -> None:
        self.registrations = 1
        self.forgotten: list[bytes] = []

    def register(self, regions: list[tuple[int, int]]) -> None:
        self.registrations += 1

    def deregister(self) -> None:
        return None

    def metadata(self) -> bytes:
        return tagged(Memory(), b"loopback-%d" % self.registrations)  # host memory

    def forget(self, peer: bytes) -> None:
        self.forgotten.append(peer)

    def read(self, peer: bytes, local: Any, remote: Any, lengths: Any) -> Any:
        for dst, src, n in zip(local.tolist(), remote.tolist(), lengths.tolist()):
            ctypes.memmove(dst, src, n)
        return "done"

    def state(self, handle: Any) -> str:
        return "DONE"

    def abort(self, handle: Any) -> bool:
        return True  # a memmove ended before its handle was returned

    def close(self) -> None:
        return None


def worker_cache(tensor: np.ndarray, tp: int, kv_heads: int = 1, **identity: Any) -> WorkerCache:
    layer = "model.layers.0.self_attn.attn"
    cache = vllm_adapter.buffers({layer: tensor}, backend="CPU_ATTN", tp_size=tp,
                                 num_kv_heads=kv_heads)  # fmt: skip
    # One full-attention group owning every buffer, its blocks one page each.
    rules = vllm_adapter.conventions(block_size=BLOCK, kernel_block_size=BLOCK)
    owned = GroupCache(tuple(range(len(cache.buffers))), rules)
    return WorkerCache(cache, (owned,), {**IDENTITY, **identity}, "LlamaForCausalLM")


def cache_array(seed: int | None = None) -> np.ndarray:
    """vLLM's CPU cache: (blocks, kv_heads on the rank, block_size, 2 * head_size)."""
    if seed is None:
        return np.zeros((BLOCKS, 1, BLOCK, 2 * HEAD), np.float32)
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BLOCKS, 1, BLOCK, 2 * HEAD)).astype(np.float32)


def finished(puller: DecodeRank, until: set[str], seconds: float = 20) -> dict[str, set[Any]]:
    """Polls as a runtime's steps would until every request of ``until`` is reported."""
    done: set[str] = set()
    failed: set[str] = set()
    blocks: set[int] = set()
    deadline = time.monotonic() + seconds
    while not until <= done:
        assert time.monotonic() < deadline, f"{until - done} never finished"
        puller.poll()
        d, f, b = puller.take_finished()
        done |= d
        failed |= f
        blocks |= b
        time.sleep(0.01)
    return {"done": done, "failed": failed, "blocks": blocks}


@pytest.fixture
def prefill() -> Iterator[tuple[PrefillRank, np.ndarray, int]]:
    """One prefill rank at TP 1 serving random pages."""
    port = next(_ports)
    pages = cache_array(7)
    rank = PrefillRank(worker_cache(pages, 1), 0, 1, Loopback(), HOST, port)
    yield rank, pages, port
    rank.close()


def test_a_prefill_instance_that_registered_again_is_met_again(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    """vLLM 0.34's weight reload (``restore_kv_caches``): the prefill rank registers its cache
    again, its handshakes say generation 2 and its requests name it. A decode rank
    handshakes anew for a newer generation (the old engine metadata forgotten at once) and
    reads byte for byte; a request of an older generation, whose blocks the reload
    overwrote, fails and is recomputed, also when it is the first a decode rank sees; a
    request that names none (0: a streamed one) reads."""
    rank, pages, port = prefill
    decode = cache_array()
    engine = Loopback()
    puller = DecodeRank(worker_cache(decode, 1), 0, 1, engine, 2.0, 20.0)

    def request(reader: DecodeRank, name: str, generation: int, src: int,
                dst: int) -> dict[str, set[Any]]:  # fmt: skip
        remote = Remote(f"prefill-{port}", name, HOST, port, 1, generation)
        rank.lease({name: 60})  # the prefill side holds it (a hold confirms the read)
        reader.start([Receive(name, ((dst,),), ((src,),), remote)])
        return finished(reader, {name})

    fresh = DecodeRank(worker_cache(cache_array(), 1), 0, 1, Loopback(), 2.0, 20.0)
    try:
        assert request(puller, "gen-1", 1, 1, 4)["failed"] == set()
        np.testing.assert_array_equal(decode[4], pages[1])
        rank._engine.register([])  # the same regions, registered again
        rank.registered_again(2)
        pages[2] += 1.0  # the reload's new bytes
        assert request(puller, "gen-2", 2, 2, 5)["failed"] == set()
        np.testing.assert_array_equal(decode[5], pages[2])
        # The old registration's metadata, forgotten.
        assert engine.forgotten == [tagged(Memory(), b"loopback-1")]
        stale = request(puller, "late-gen-1", 1, 3, 6)
        assert (stale["failed"], stale["blocks"]) == ({"late-gen-1"}, {6})
        assert not decode[6].any()
        unknown = request(puller, "no-generation", 0, 3, 7)
        assert unknown["failed"] == set()
        np.testing.assert_array_equal(decode[7], pages[3])
        failures = puller.stats.take()["failures"]
        assert failures == {"requests:peer_gone": 1, "recomputed_blocks:peer_gone": 1}, failures
        # A decode rank whose first request is of the older generation: the handshake
        # says 2, and the request fails.
        first = request(fresh, "first-gen-1", 1, 1, 4)
        assert (first["failed"], first["blocks"]) == ({"first-gen-1"}, {4})
    finally:
        puller.close()
        fresh.close()


def pull(port: int, decode: np.ndarray, request: str, prefill_tp: int = 1,
         **identity: Any) -> tuple[DecodeRank, dict[str, set[Any]]]:  # fmt: skip
    """A decode rank at TP 1 pulls prefill pages 1 and 3 into its pages 4 and 6."""
    puller = DecodeRank(worker_cache(decode, 1, **identity), 0, 1, Loopback(), 2.0, 20.0)
    remote = Remote(f"prefill-{port}", request, HOST, port, prefill_tp)
    puller.start([Receive(request, ((4, 6),), ((1, 3),), remote)])
    return puller, finished(puller, {request})


def test_a_silent_prefill_rank_is_read_around_from_its_replica() -> None:
    prefill = [cache_array(4), cache_array(5)]
    decode = cache_array()
    port = next(_ports)
    ranks = [PrefillRank(worker_cache(t, 2), r, 2, Loopback(), HOST, port)
             for r, t in enumerate(prefill)]  # fmt: skip
    ranks[0].close()  # rank 0 is gone: it answers nothing
    try:
        ranks[1].lease({"req-1": 60})
        puller, seen = pull(port, decode, "req-1", prefill_tp=2)
        assert (seen["failed"], seen["blocks"]) == (set(), set())
        np.testing.assert_array_equal(decode[[4, 6]], prefill[1][[1, 3]])
        assert not decode[[0, 1, 2, 3, 5, 7]].any()
        counts = puller.stats.take()["counts"]
        assert counts["bytes_read"] == decode[[4, 6]].nbytes
        assert (counts["requests_read"], counts["transfers"], counts["reads_posted"]) == (1, 1, 1)
        deadline = time.monotonic() + 10
        while "req-1" not in ranks[1].freed():
            assert time.monotonic() < deadline, "rank 1 never heard done"
            time.sleep(0.05)
        puller.close()
    finally:
        ranks[1].close()


def test_a_peer_that_never_answers_stalls_no_other_request(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank, pages, port = prefill
    silent_port = next(_ports)
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"tcp://{HOST}:{silent_port}")
    decode = cache_array()
    puller = DecodeRank(worker_cache(decode, 1), 0, 1, Loopback(), 2.0, 20.0)
    try:
        rank.lease({"good": 60})
        puller.start([
            Receive("stuck", ((2,),), ((2,),), Remote("silent", "stuck", HOST, silent_port, 1)),
            Receive("good", ((4, 6),), ((1, 3),), Remote("prefill", "good", HOST, port, 1)),
        ])  # fmt: skip
        # The silent instance holds the stuck request's hello, unanswered, while the other
        # request is read and reported.
        assert silent.poll(5000), "the silent instance was never asked"
        held = silent.recv_multipart()
        assert held[2:4] == [PROTOCOL, b"hello"]
        seen = finished(puller, {"good"})
        assert "stuck" not in seen["done"] and not silent.poll(0)
        np.testing.assert_array_equal(decode[[4, 6]], pages[[1, 3]])
        # Past its handshake timeout the stuck request fails, its block handed back.
        seen = finished(puller, {"stuck"})
        assert seen == {"done": {"stuck"}, "failed": {"stuck"}, "blocks": {2}}
        assert puller.stats.take()["failures"] == {
            "requests:peer_gone": 1, "recomputed_blocks:peer_gone": 1,
        }  # fmt: skip
    finally:
        puller.close()
        silent.close()


def dealer(port: int) -> Any:
    socket_ = zmq.Context.instance().socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    socket_.connect(f"tcp://{HOST}:{port}")
    return socket_


def exchange(port: int, frames: list[bytes], wait_ms: int = 2000) -> list[bytes] | None:
    """Sends ``frames`` as they are (no REQ envelope added) and returns the reply, or None."""
    client = dealer(port)
    try:
        client.send_multipart(frames)
        return client.recv_multipart() if client.poll(wait_ms) else None
    finally:
        client.close()


def hostile_requests(version: bytes, payload: bytes) -> list[tuple[list[bytes], bytes]]:
    """REQ-shaped requests no prefill rank may act on, and the cause each is refused with."""
    identity = identity_bytes({**IDENTITY, BLOCK_SIZES: [[BLOCK, BLOCK]]})
    return [
        ([b"", PROTOCOL, b"hello", b"[" * 4000, version, payload], b"protocol"),  # nested
        ([b"", PROTOCOL, b"hello", b"{" * 4096, version, payload], b"protocol"),
        ([b"", PROTOCOL, b"hello", identity, b"v999", payload], b"layout"),
        ([b"", PROTOCOL, b"hello", identity, version, os.urandom(2048)], b"layout"),
        ([b"", PROTOCOL, b"hello", identity, version, payload[: len(payload) // 2]], b"layout"),
        ([b"", PROTOCOL, b"hello", identity_bytes(IDENTITY), version, payload], b"protocol"),
        *[
            (
                [
                    b"",
                    PROTOCOL,
                    b"hello",
                    identity_bytes({**IDENTITY, BLOCK_SIZES: bad}),
                    version,
                    payload,
                ],
                b"protocol",
            )
            for bad in (
                [[BLOCK, BLOCK]] * 2,
                [[0, 1]],
                [[32, 5]],
                [[True, 1]],
                [["32", 32]],
                [[2**40, 32]],
                [[1 << 24, 16]],  # a million pages a block: ids a peer could make us expand
                "32",
                [[32, 32, 32]],
            )
        ],
        ([b"", PROTOCOL, b"hello"], b"protocol"),
        ([b"", PROTOCOL], b"protocol"),
        ([b"", PROTOCOL, b"shutdown"], b"protocol"),
        ([b"", PROTOCOL, b"done", b"req\tmany"], b"protocol"),
        ([b"", PROTOCOL, b"done", b"\n".join([b"r\t1"] * 5000)], b"protocol"),
        ([b"", PROTOCOL, b"progress", b"a", b"b"], b"protocol"),
        ([b"", PROTOCOL, b"progress", b"\n" * 4096], b"protocol"),
        ([b"", b"GET / HTTP/1.1"], b"version"),
        ([b"", b"pdplan-side/0", b"hello"], b"version"),
        ([b"", PROTOCOL, *[b"x"] * 10000], b"protocol"),
    ]


def test_no_client_can_stop_a_prefill_rank_s_side_channel(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    rank, pages, port = prefill
    decode = cache_array()
    version, payload = _decode_frames(decode)
    for frames, cause in hostile_requests(version, payload):
        reply = exchange(port, frames)
        assert reply is not None and reply[:2] == [b"", b"refused"], frames[:3]
        assert len(reply[2]) <= 4096 and reply[3] == cause, (frames[:3], reply)
        assert rank.serving
    # Not shaped as a request (no delimiter), or a frame over the bound: dropped unanswered.
    assert exchange(port, [b"no delimiter", b"x"], 300) is None
    assert exchange(port, [b"", PROTOCOL, b"done", b"x" * (MAX_MESSAGE_BYTES + 1)], 300) is None
    # Raw TCP: random bytes, a truncated greeting, and many connections held open at once.
    held = []
    for garbage in [os.urandom(4096), b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f", b""] * 22:
        connection = socket.create_connection((HOST, port))
        connection.sendall(garbage)
        held.append(connection)
    threads = [threading.Thread(target=exchange, args=(port, [b"", b"junk"])) for _ in range(32)]
    for thread in threads:
        thread.start()
    try:
        rank.lease({"after": 60})
        puller, seen = pull(port, decode, "after")
        assert seen["failed"] == set()
        np.testing.assert_array_equal(decode[[4, 6]], pages[[1, 3]])
        puller.close()
    finally:
        for connection in held:
            connection.close()
        for thread in threads:
            thread.join()
    assert rank.serving
    assert rank.stats.take()["failures"]["refused:protocol"] >= 12


def _decode_frames(decode: np.ndarray) -> tuple[bytes, bytes]:
    """A real decode rank's layout frames (version, payload), as its hello carries them."""
    from pdplan._exchange import encode_layout
    from pdplan._model import ParallelLayout

    version, payload = encode_layout(
        ParallelLayout("decode", 1), worker_cache(decode, 1).cache.buffers
    )
    return version, payload


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.binary(max_size=48), max_size=10),
    st.sampled_from([b"hello", b"done", b"progress", b"other"]),
)
def test_random_frames_get_an_answer_and_stop_nothing(
    prefill: tuple[PrefillRank, np.ndarray, int], frames: list[bytes], verb: bytes
) -> None:
    rank, _, port = prefill
    reply = exchange(port, [b"", PROTOCOL, verb, *frames])
    assert reply is not None and reply[0] == b"" and reply[1] in (b"ok", b"refused")
    assert rank.serving


def test_faults_come_by_type_and_stay_unsupported_layout_errors(
    prefill: tuple[PrefillRank, np.ndarray, int],
) -> None:
    _, _, port = prefill
    kinds = [PeerGone, ProtocolFault, LayoutRefused, VersionSkew]
    assert all(issubclass(kind, TransferFault) for kind in kinds)
    assert issubclass(TransferFault, UnsupportedPDLayoutError)
    # Another model: the prefill rank refuses, and the decode side hears it as its type;
    # every request waiting for that instance fails with it, from one handshake.
    puller = DecodeRank(worker_cache(cache_array(), 1, model="other"), 0, 1, Loopback(), 2, 20)
    names = {"a", "b", "c"}
    puller.start([Receive(n, ((4,),), ((1,),), Remote("p", n, HOST, port, 1)) for n in names])
    seen = finished(puller, names)
    assert seen["failed"] == names and seen["blocks"] == {4}
    assert puller.stats.take()["failures"]["requests:layout"] == 3
    puller.close()
    with pytest.raises(LayoutRefused, match="differs in model"):
        ask(HOST, port, [b"hello", identity_bytes({**IDENTITY, "model": "x"}), b"", b""], 2.0)
    # A peer that answers in another protocol.
    other_port = next(_ports)
    other = zmq.Context.instance().socket(zmq.ROUTER)
    other.setsockopt(zmq.LINGER, 0)
    other.bind(f"tcp://{HOST}:{other_port}")
    try:
        answer = threading.Thread(target=lambda: other.send_multipart(
            [*other.recv_multipart()[:2], b"HTTP/1.1 400"]))  # fmt: skip
        answer.start()
        with pytest.raises(ProtocolFault, match=f"does not answer in {PROTOCOL.decode()}"):
            ask(HOST, other_port, [b"hello"], 2.0)
        answer.join()
    finally:
        other.close()
    with pytest.raises(PeerGone, match="did not answer within"):
        ask(HOST, next(_ports), [b"hello"], 0.2)


def test_a_progress_round_takes_each_stream_s_least_and_never_waits() -> None:
    """Streams' progress asked on non-blocking sockets: a stream's progress is the least its
    source ranks report, a stream a rank has not run is left out, and a rank that never
    answers holds nothing up: every poll returns at once, and the round ends at its timeout
    with that rank failed."""
    from pdplan.session import Progress
    from pdplan.session._progress_asks import AskSockets, ProgressRound

    port = next(_ports)
    ranks = [PrefillRank(worker_cache(cache_array(r), 2), r, 2, Loopback(), HOST, port)
             for r in range(2)]  # fmt: skip
    silent_port = next(_ports)
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"tcp://{HOST}:{silent_port}")
    sockets = AskSockets(1.0)
    try:
        blocks = ((1, 2, 3),)
        ranks[0].expect({"both": Progress("p-both", blocks, 96, 100),
                         "one": Progress("p-one", blocks, 64, 100)})  # fmt: skip
        ranks[1].expect({"both": Progress("p-both", blocks, 64, 100)})
        for rank in ranks:
            rank.publish()
        asked = {(HOST, port): ["both", "one"], (HOST, port + 1): ["both", "one"]}
        answered = ProgressRound(sockets, asked, 5.0)
        deadline = time.monotonic() + 10
        while (notices := answered.poll()) is None:
            assert time.monotonic() < deadline, "the ranks' replies never came"
            time.sleep(0.001)
        # "both": the least of 96 and 64; "one": rank 1 has not run it.
        assert {k: v.final_tokens for k, v in notices.items()} == {"both": 64}
        assert answered.failed == set()

        # With a rank that never answers: polls return at once, then the round times out.
        quiet = ProgressRound(sockets, {**asked, (HOST, silent_port): ["both"]}, 0.5)
        polls = 0
        while (notices := quiet.poll()) is None:
            polls += 1
            assert polls < 100_000, "the round never timed out"
            time.sleep(0.001)
        assert polls > 10  # each poll came back while the silent rank still owed its reply
        assert quiet.failed == {(HOST, silent_port)}
        assert notices == {}  # "both" is read from the silent rank too: left out
        # The next round asks the answering ranks again on the same sockets.
        again = ProgressRound(sockets, asked, 5.0)
        deadline = time.monotonic() + 10
        while (notices := again.poll()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert {k: v.final_tokens for k, v in notices.items()} == {"both": 64}
    finally:
        sockets.close()
        silent.close()
        for rank in ranks:
            rank.close()
