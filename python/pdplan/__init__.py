"""pdplan: plans how the KV cache moves from prefill to decode ranks.

A drop-in for the pure-Python reference planner: the same dataclasses, planner and
wire format v1, with intersection, fanout, planning and wire coding done in Rust.
"""

from __future__ import annotations

# _package_types hands the compiled core the classes whose objects it makes (no import circle).
from pdplan import _field_docs, _package_types, limits  # noqa: F401
from pdplan._arrays import CacheBuffers, StateSpec, buffer_from_array, page_parts, state_specs
from pdplan._context import token_owners, token_slots
from pdplan._core import (
    DEFAULT_MAX_FRAGMENTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    TRANSFER_PLAN_PROTOCOL_VERSION,
    TRANSFER_PLAN_READABLE_VERSIONS,
    PreparedRequest,
    PreparedTransfer,
    StagingPlan,
    UnsupportedPDLayoutError,
    __version__,
    decode_transfer_fragments,
    encode_transfer_fragments,
)
from pdplan._descriptors import StridedDescriptors, TransferDescriptors, transfer_descriptors
from pdplan._exchange import LAYOUT_VERSION_FRAME, PeerLayout, decode_layout, encode_layout
from pdplan._layer_groups import LayerGroups, layer_groups
from pdplan._layouts import (
    CACHE_KEYS,
    MODEL_PRESETS,
    AttentionLayer,
    AttentionMamba2Layer,
    DeepseekV4Layer,
    GatedDeltaNetLayer,
    ItemLengths,
    KdaLayer,
    LayerKindSummary,
    LightningAttentionLayer,
    Mamba1Layer,
    Mamba2Layer,
    MlaLayer,
    MlpLayer,
    ModelFamily,
    ModelLayer,
    ModelShape,
    SharedKvLayer,
    ShortConvLayer,
    buffer_layouts_from_item_lengths,
    even_layer_partition,
    model_buffer_layouts,
    model_families,
    vllm_layer_partition,
)
from pdplan._model import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    RankCoordinates,
    RankTransferPlan,
    TokenShare,
    TransferFragment,
)
from pdplan._planner import LostRange, PDTransferPlanner, RoutingTable
from pdplan._posting import PostingCalibration, calibrate_posting
from pdplan._staging import CostEstimate, CostModel, FormEstimate, StagingCounts
from pdplan._transfer_cost import PairCost, Pairing, TransferCost, model_planner, transfer_cost

__all__ = [
    "CACHE_KEYS",
    "DEFAULT_MAX_FRAGMENTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "LAYOUT_VERSION_FRAME",
    "MODEL_PRESETS",
    "TRANSFER_PLAN_PROTOCOL_VERSION",
    "TRANSFER_PLAN_READABLE_VERSIONS",
    "AttentionLayer",
    "AttentionMamba2Layer",
    "BufferKind",
    "BufferLayout",
    "CacheBuffers",
    "CostEstimate",
    "CostModel",
    "DeepseekV4Layer",
    "FormEstimate",
    "GatedDeltaNetLayer",
    "ItemLengths",
    "KdaLayer",
    "LayerGroups",
    "LayerKindSummary",
    "LightningAttentionLayer",
    "LostRange",
    "Mamba1Layer",
    "Mamba2Layer",
    "MlaLayer",
    "MlpLayer",
    "ModelFamily",
    "ModelLayer",
    "ModelShape",
    "PDTransferPlanner",
    "PairCost",
    "Pairing",
    "ParallelLayout",
    "PeerLayout",
    "PostingCalibration",
    "PreparedRequest",
    "PreparedTransfer",
    "RankCoordinates",
    "RankTransferPlan",
    "RoutingTable",
    "SharedKvLayer",
    "ShortConvLayer",
    "StagingCounts",
    "StagingPlan",
    "StateSpec",
    "StridedDescriptors",
    "TokenShare",
    "TransferCost",
    "TransferDescriptors",
    "TransferFragment",
    "UnsupportedPDLayoutError",
    "__version__",
    "buffer_from_array",
    "buffer_layouts_from_item_lengths",
    "calibrate_posting",
    "decode_layout",
    "decode_transfer_fragments",
    "encode_layout",
    "encode_transfer_fragments",
    "even_layer_partition",
    "layer_groups",
    "limits",
    "model_buffer_layouts",
    "model_families",
    "model_planner",
    "page_parts",
    "state_specs",
    "token_owners",
    "token_slots",
    "transfer_cost",
    "transfer_descriptors",
    "vllm_layer_partition",
]

# help() shows each public dataclass's and named tuple's field descriptions.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type) and _public.__module__.startswith("pdplan."):
        _field_docs.document_fields(_public)
del _name, _public
