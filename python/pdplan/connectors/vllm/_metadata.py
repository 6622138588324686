"""What the scheduler-side connector tells the workers each step (pickled to each worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdplan.session import Receive, Remote
from pdplan.session._progress import Progress

try:  # vLLM's base class, so vLLM's runner accepts the object
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # pragma: no cover - the connector module refuses a missing vLLM first
    KVConnectorMetadata = object


@dataclass
class StepMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work: requests to pull (decode), requests whose blocks wait for their
    readers for a lease (prefill: seconds), and streams' progress (prefill)."""

    receives: list[Receive] = field(default_factory=list)
    leases: dict[str, float] = field(default_factory=dict)
    progress: dict[str, Progress] = field(default_factory=dict)
    """Streams (by stream id) whose tokens this step's forward pass makes final."""
    cancelled: list[str] = field(default_factory=list)
    """Streamed decode requests that ended before their last slice landed (aborted): their
    reads stop, and their blocks are released once the reads in flight land."""
    held: dict[str, Remote] = field(default_factory=dict)
    """Decode requests that joined the queue, by request id: their prefill ranks are asked to
    hold their blocks while they wait."""
    unheld: list[str] = field(default_factory=list)
    """Queued decode requests that ended before their blocks were allocated."""
