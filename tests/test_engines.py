"""The transfer engines' registrations: host and device memory, and registering again.

- What NIXL is asked for, recorded by an agent that keeps every call: a device cache
  registers as ``VRAM`` with its device id, and each side of a read names its own memory
  (NIXL pairs a descriptor with the registration of that kind and device).
- A peer's memory travels tagged ahead of its engine metadata, read strictly.
- With a real NIXL agent (``nixl``): after the prefill side drops its registration and
  registers its cache again elsewhere, the old metadata cannot reach it (NIXL refuses the
  read), and a decode side that forgets the old metadata reads the new registration byte
  for byte.
  Mooncake's non-CUDA build refuses device memory by name (``mooncake``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from pdplan import UnsupportedPDLayoutError
from pdplan.session import HOST, Memory, ProtocolFault, SettingsFault
from pdplan.session._engines import NixlEngine
from pdplan.session._memory import tagged, untagged


class RecordingAgent:
    """A NIXL agent that records what it is asked (the registration an engine asks for)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def register_memory(self, rows: Any, kind: str) -> str:
        self.calls.append(("register_memory", rows.tolist(), kind))
        return "registered"

    def deregister_memory(self, descs: Any) -> None:
        self.calls.append(("deregister_memory", descs, None))

    def get_agent_metadata(self) -> bytes:
        return b"agent-bytes"

    def add_remote_agent(self, metadata: bytes) -> bytes:
        self.calls.append(("add_remote_agent", metadata, None))
        return b"prefill-agent"

    def remove_remote_agent(self, name: str) -> None:
        self.calls.append(("remove_remote_agent", name, None))

    def get_xfer_descs(self, rows: Any, kind: str) -> tuple[Any, str]:
        self.calls.append(("get_xfer_descs", rows.tolist(), kind))
        return rows.tolist(), kind

    def prep_xfer_dlist(self, agent: str, rows: Any, kind: str) -> tuple[str, Any, str]:
        self.calls.append(("prep_xfer_dlist", (agent, rows.tolist()), kind))
        return agent, rows.tolist(), kind

    def initialize_xfer(self, op: str, dst: Any, src: Any, peer: str) -> str:
        self.calls.append(("initialize_xfer", (op, peer), None))
        return "handle"

    def make_prepped_xfer(self, op: str, *args: Any) -> str:
        return "handle"

    def transfer(self, handle: Any) -> str:
        return "PROC"


def test_a_device_cache_registers_as_vram_with_its_device() -> None:
    agent = RecordingAgent()
    engine = NixlEngine("decode", memory=Memory("VRAM", 3), agent=agent)
    engine.register([(0x7000_0000, 4096), (0x7100_0000, 8192)])
    assert agent.calls == [
        ("register_memory", [[0x7000_0000, 4096, 3], [0x7100_0000, 8192, 3]], "VRAM")
    ]
    assert engine.metadata() == b"VRAM:3\nagent-bytes"
    engine.deregister()
    engine.deregister()  # idempotent: dropped once
    assert [c[0] for c in agent.calls].count("deregister_memory") == 1


@pytest.mark.parametrize("theirs", [HOST, Memory("VRAM", 1)])
def test_each_side_of_a_read_names_its_own_memory(theirs: Memory) -> None:
    agent = RecordingAgent()
    engine = NixlEngine("decode", memory=Memory("VRAM", 2), agent=agent)
    peer = tagged(theirs, b"prefill-bytes")
    local = np.array([100, 200], np.uint64)
    remote = np.array([300, 400], np.uint64)
    lengths = np.array([8, 16], np.uint64)
    engine.read(peer, local, remote, lengths)
    descs = [c for c in agent.calls if c[0] == "get_xfer_descs"]
    assert descs == [
        ("get_xfer_descs", [[100, 8, 2], [200, 16, 2]], "VRAM"),
        ("get_xfer_descs", [[300, 8, theirs.device], [400, 16, theirs.device]], theirs.kind),
    ]
    # The engine loaded the peer's own metadata, not the tag.
    assert ("add_remote_agent", b"prefill-bytes", None) in agent.calls
    # Strided rows: (address, length, device, stride, count), the device column each side's.
    rows = np.array([[100, 8, 0, 64, 2]], np.uint64)
    engine.read_strided(peer, rows, rows.copy())
    prepped = [c for c in agent.calls if c[0] == "prep_xfer_dlist"]
    assert prepped[0][1][1][0][2] == 2 and prepped[0][2] == "VRAM"
    assert prepped[1][1][1][0][2] == theirs.device and prepped[1][2] == theirs.kind
    engine.forget(peer)
    assert agent.calls[-1] == ("remove_remote_agent", "prefill-agent", None)


def test_memory_of_a_device() -> None:
    assert Memory.of_device("cpu", None) == HOST
    assert Memory.of_device("cuda", 5) == Memory("VRAM", 5)
    assert Memory.of_device("cuda", None) == Memory("VRAM", 0)
    with pytest.raises(SettingsFault, match="host \\(cpu\\) or CUDA"):
        Memory.of_device("xpu", 0)


@pytest.mark.parametrize(
    "metadata",
    [
        b"agent",
        b"GPU:0\nagent",
        b"VRAM:x\nagent",
        b"VRAM:1024\nagent",
        b"VRAM:" + b"9" * 40,
        b"DRAM\nagent",
        b"\nagent",
        b"VRAM:00000000000001\nagent",
    ],
)
def test_a_peer_s_memory_tag_is_read_strictly(metadata: bytes) -> None:
    with pytest.raises(ProtocolFault) as refused:
        untagged(metadata)
    assert isinstance(refused.value, UnsupportedPDLayoutError)
    assert len(str(refused.value)) < 300


def test_a_memory_tag_round_trips() -> None:
    for memory in (HOST, Memory("VRAM", 0), Memory("VRAM", 1023)):
        assert untagged(tagged(memory, b"x\ny")) == (memory, b"x\ny")


def _wait(engine: NixlEngine, handle: Any) -> str:
    deadline = time.monotonic() + 30
    state = "PROC"
    while state == "PROC" and time.monotonic() < deadline:
        state = engine.state(handle)
    return state


@pytest.mark.nixl
def test_a_registration_made_again_is_read_after_the_old_is_forgotten() -> None:
    prefill, decode = NixlEngine("reg-prefill"), NixlEngine("reg-decode")
    source = np.arange(4096, dtype=np.uint8)
    target = np.zeros(4096 + 64, dtype=np.uint8)  # 32 guard bytes each side
    prefill.register([(source.ctypes.data, source.nbytes)])
    decode.register([(target.ctypes.data, target.nbytes)])

    def read(peer: bytes, array: np.ndarray) -> str:
        local = np.array([target.ctypes.data + 32], np.uint64)
        remote = np.array([array.ctypes.data], np.uint64)
        return _wait(decode, decode.read(peer, local, remote, np.array([4096], np.uint64)))

    first = prefill.metadata()
    assert read(first, source) == "DONE"
    np.testing.assert_array_equal(target[32:-32], source)
    target[:] = 0
    # A reload: the registration dropped, the cache registered again at another address.
    prefill.deregister()
    moved = (np.arange(4096) * 7 % 251).astype(np.uint8)
    prefill.register([(moved.ctypes.data, moved.nbytes)])
    again = prefill.metadata()
    assert again != first
    # The old metadata cannot reach the new registration: NIXL refuses the read.
    with pytest.raises(Exception, match="NOT_FOUND"):
        read(first, moved)
    assert not target.any()
    decode.forget(first)
    assert read(again, moved) == "DONE"
    np.testing.assert_array_equal(target[32:-32], moved)
    assert not target[:32].any() and not target[-32:].any()


@pytest.mark.mooncake
def test_mooncake_s_host_build_refuses_a_device_cache() -> None:
    from pdplan.session._engines import MooncakeEngine

    with pytest.raises(SettingsFault, match="non-CUDA build"):
        MooncakeEngine("127.0.0.1", Memory("VRAM", 0))
