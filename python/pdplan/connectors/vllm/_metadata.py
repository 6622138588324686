"""What the scheduler-side connector tells the workers each step (pickled to each worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdplan.connectors._progress import Progress
from pdplan.connectors._transfer_params import Remote

try:  # vLLM's base class, so vLLM's runner accepts the object
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # pragma: no cover - the connector module refuses a missing vLLM first
    KVConnectorMetadata = object


@dataclass(frozen=True)
class Stream:
    """A decode request that streams: the stream's id, the tokens the decode side holds
    already (its prefix hit) and the prompt's length."""

    stream_id: str
    decode_prefix: int
    final_length: int


@dataclass(frozen=True)
class Receive:
    """One decode request to pull: its local blocks (per KV cache group) and where the prefill
    side keeps the same tokens. Empty ``local_blocks``: nothing to read, only tell the
    prefill ranks they may free the request (an aborted request, a full local hit).
    ``refused``: why its ``kv_transfer_params`` cannot be read (``remote`` is then None); the
    worker reports its blocks for vLLM to recompute."""

    request_id: str
    local_blocks: tuple[tuple[int, ...], ...]
    remote_blocks: tuple[tuple[int, ...], ...]
    remote: Remote | None
    refused: str = ""
    stream: Stream | None = None


@dataclass
class StepMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work: requests to pull (decode), requests whose blocks wait for their
    readers until a deadline (prefill: ``time.time()`` seconds), and streams' progress
    (prefill)."""

    receives: list[Receive] = field(default_factory=list)
    leases: dict[str, float] = field(default_factory=dict)
    progress: dict[str, Progress] = field(default_factory=dict)
    """Streams (by stream id) whose tokens this step's forward pass makes final."""
    cancelled: list[str] = field(default_factory=list)
    """Streamed decode requests that ended before their last slice landed (aborted): their
    reads stop, and their blocks are released once the reads in flight land."""
