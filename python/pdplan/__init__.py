"""pdplan: plans how the KV cache moves from prefill to decode ranks.

A drop-in for the pure-Python reference planner: the same dataclasses, planner and
wire format v1, with intersection, fanout, planning and wire coding done in Rust.
"""

from __future__ import annotations

from pdplan._core import (
    TRANSFER_PLAN_PROTOCOL_VERSION,
    UnsupportedPDLayoutError,
    __version__,
    decode_transfer_fragments,
    encode_transfer_fragments,
)
from pdplan._descriptors import TransferDescriptors, transfer_descriptors
from pdplan._model import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    RankTransferPlan,
    TransferFragment,
)
from pdplan._planner import PDTransferPlanner, RoutingTable

__all__ = [
    "TRANSFER_PLAN_PROTOCOL_VERSION",
    "BufferKind",
    "BufferLayout",
    "PDTransferPlanner",
    "ParallelLayout",
    "RankTransferPlan",
    "RoutingTable",
    "TransferDescriptors",
    "TransferFragment",
    "UnsupportedPDLayoutError",
    "__version__",
    "decode_transfer_fragments",
    "encode_transfer_fragments",
    "transfer_descriptors",
]
