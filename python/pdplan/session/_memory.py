"""Where a rank's cache lives: host memory, or one device's. An RDMA engine registers it by
kind and device (NIXL's ``"DRAM"`` / ``"VRAM"`` with the device id), and a reader names the
peer's the same way, so each engine's handshake metadata carries its memory as one tagged
line ahead of the engine's own bytes."""

from __future__ import annotations

from dataclasses import dataclass

from pdplan._bounded import shown
from pdplan.session._faults import ProtocolFault, SettingsFault

#: Memory kinds, as NIXL names them.
KINDS = ("DRAM", "VRAM")
#: Highest device id read from a peer.
MAX_DEVICE = 1023
#: Longest memory tag read from a peer (``VRAM:1023``).
MAX_TAG = 16


@dataclass(frozen=True)
class Memory:
    """A cache's memory: ``kind`` ``"DRAM"`` (host) or ``"VRAM"`` (a device), and the
    device's id (0 for host memory)."""

    kind: str = "DRAM"
    device: int = 0

    @classmethod
    def of_device(cls, device_type: str, index: int | None) -> Memory:
        """The memory of a tensor on ``device_type`` (``"cpu"``, ``"cuda"``) ``index``."""
        if device_type == "cpu":
            return HOST
        if device_type == "cuda":
            return cls("VRAM", int(index or 0))
        raise SettingsFault(
            f"pdplan registers host (cpu) or CUDA device memory; this cache is on "
            f"{shown(device_type)}"
        )

    def tag(self) -> bytes:
        return f"{self.kind}:{self.device}".encode()

    @classmethod
    def of_tag(cls, tag: bytes) -> Memory:
        """A peer's memory tag, read strictly."""
        kind, colon, device = tag[:MAX_TAG].decode(errors="replace").partition(":")
        if (
            len(tag) > MAX_TAG
            or not colon
            or kind not in KINDS
            or not (device.isascii() and device.isdecimal())
            or int(device) > MAX_DEVICE
        ):
            raise ProtocolFault(f"the peer's engine names its memory {shown(tag)}")
        return cls(kind, int(device))


HOST = Memory()


def tagged(memory: Memory, metadata: bytes) -> bytes:
    """An engine's handshake metadata: its memory's tag, a newline, the engine's bytes."""
    return memory.tag() + b"\n" + metadata


def untagged(metadata: bytes) -> tuple[Memory, bytes]:
    """A peer's memory and its engine's own metadata."""
    end = metadata.find(b"\n", 0, MAX_TAG + 1)
    if end < 0:
        raise ProtocolFault("the peer's engine metadata names no memory")
    return Memory.of_tag(metadata[:end]), metadata[end + 1 :]
