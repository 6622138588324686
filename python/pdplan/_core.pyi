"""Stub of the compiled core (src/python/)."""

from collections.abc import Iterable, Sequence
from typing import Literal, final

import numpy as np
import numpy.typing as npt

from pdplan._descriptors import StridedDescriptors, TransferDescriptors
from pdplan._layouts import ItemLengths, ModelLayer, ModelShape
from pdplan._model import (
    BufferLayout,
    ParallelLayout,
    RankTransferPlan,
    TransferFragment,
)
from pdplan._staging import StagingCounts

__all__ = [
    "BUFFER_LAYOUT_FIELDS",
    "CACHE_KEYS",
    "DEFAULT_MAX_FRAGMENTS",
    "DEFAULT_MAX_LAYOUT_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ENCODE_CACHE_ENTRIES",
    "ENCODE_CACHE_ITEMS",
    "FRAME_CACHE_BYTES",
    "FRAME_CACHE_ENTRIES",
    "LAYER_KINDS",
    "LIMITS",
    "MAX_ARRAY_AXES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_DESCRIPTORS",
    "MAX_INTERLEAVE",
    "MAX_LAYERS",
    "MAX_LAYOUT_BUFFERS",
    "MAX_PAGE_SIZE",
    "MAX_PARTS",
    "MAX_PLAN_FRAGMENTS",
    "MAX_ROWS_PER_PAGE",
    "MAX_STAGES",
    "MAX_TOKENS",
    "MAX_VALUE",
    "MAX_WORLD_SIZE",
    "MODEL_PRESETS",
    "RANK_TRANSFER_PLAN_FIELDS",
    "TRANSFER_FRAGMENT_DEFAULTS",
    "TRANSFER_FRAGMENT_FIELDS",
    "TRANSFER_FRAGMENT_SINCE",
    "TRANSFER_PLAN_PROTOCOL_VERSION",
    "TRANSFER_PLAN_READABLE_VERSIONS",
    "FrameFloor",
    "Planner",
    "PreparedRequest",
    "PreparedTransfer",
    "StagingPlan",
    "UnsupportedPDLayoutError",
    "__version__",
    "buffer_from_array",
    "buffers_from_item_lengths",
    "check_buffer_layout",
    "check_cost_model",
    "check_parallel_layout",
    "check_strided_costs",
    "check_transfer_fragment",
    "decode_layout",
    "decode_transfer_fragments",
    "dtype_bytes",
    "encode_cache_info",
    "encode_layout",
    "encode_transfer_fragments",
    "estimate_forms",
    "estimate_staging",
    "even_layer_partition",
    "first_kept_token",
    "fit_line",
    "fragment_slots_checked",
    "frame_cache_info",
    "is_token_indexed",
    "layer_groups",
    "model_buffers",
    "model_families",
    "model_layers",
    "model_shape_parts",
    "model_summary",
    "rank_coordinates",
    "rank_token_share",
    "remake_fragments",
    "scaled_counts",
    "token_owners",
    "token_slots",
    "transfer_descriptors",
    "use_package_types",
    "vllm_layer_partition",
]

__version__: str
MODEL_PRESETS: list[str]
#: The layer-kind schema: (kind, class, what it keeps, [(field, type, default, doc)]).
LAYER_KINDS: list[tuple[str, str, str, list[tuple[str, str, int | None, str]]]]
#: Every bound: (name, least, most, unit, advice).
LIMITS: list[tuple[str, int, int, str, str]]
CACHE_KEYS: list[str]
TRANSFER_PLAN_PROTOCOL_VERSION: int
TRANSFER_PLAN_READABLE_VERSIONS: tuple[int, ...]
TRANSFER_FRAGMENT_FIELDS: list[str]
TRANSFER_FRAGMENT_SINCE: list[tuple[str, int]]
TRANSFER_FRAGMENT_DEFAULTS: dict[str, int | str | None]
RANK_TRANSFER_PLAN_FIELDS: list[str]
MAX_WORLD_SIZE: int
MAX_STAGES: int
MAX_PAGE_SIZE: int
MAX_ROWS_PER_PAGE: int
MAX_PARTS: int
MAX_INTERLEAVE: int
MAX_TOKENS: int
MAX_PLAN_FRAGMENTS: int
MAX_DESCRIPTORS: int
MAX_LAYERS: int
MAX_ARRAY_AXES: int
MAX_LAYOUT_BUFFERS: int
MAX_CONFIG_BYTES: int
MAX_CONFIG_DEPTH: int
MAX_VALUE: int
DEFAULT_MAX_PAYLOAD_BYTES: int
DEFAULT_MAX_FRAGMENTS: int
DEFAULT_MAX_LAYOUT_BYTES: int
FRAME_CACHE_ENTRIES: int
FRAME_CACHE_BYTES: int
ENCODE_CACHE_ENTRIES: int
ENCODE_CACHE_ITEMS: int
BUFFER_LAYOUT_FIELDS: list[str]

class UnsupportedPDLayoutError(ValueError):
    """A layout, plan, frame or request pdplan cannot serve; the message says what to change."""

def check_parallel_layout(layout: ParallelLayout) -> int: ...
def rank_coordinates(layout: ParallelLayout, rank: int) -> tuple[int, int, int, int]: ...
def rank_token_share(
    layout: ParallelLayout, rank: int
) -> tuple[int, int, Literal["interleave", "contiguous", "zigzag"], int]: ...
def is_token_indexed(logical_axis: str) -> bool: ...
def check_buffer_layout(buffer: BufferLayout) -> None: ...
def check_transfer_fragment(fragment_obj: TransferFragment) -> None: ...
def encode_transfer_fragments(fragments: Iterable[TransferFragment]) -> tuple[bytes, bytes]:
    """Fragments as (version frame, payload frame), written in the oldest wire version that
    carries all of them (``TRANSFER_PLAN_PROTOCOL_VERSION``, 1, for the reference's plans). A
    list or tuple of the same ``TransferFragment`` objects encoded before returns the same
    frames from a bounded cache.

    :param fragments: One rank pair's fragments (``RankTransferPlan.fragments_by_prefill_rank``
        of one source).
    """

def decode_transfer_fragments(
    version_frame: bytes | None,
    payload_frame: bytes | None,
    *,
    max_payload_bytes: int | None = None,
    max_fragments: int | None = None,
) -> tuple[TransferFragment, ...]:
    """The fragments a peer's frames carry, read strictly: a payload over ``max_payload_bytes``
    is refused before it is parsed, a frame breaking any rule of the wire format names what is
    wrong. Both frames empty or None is no fragments; one without the other is refused.

    :param version_frame: The version frame, ``b"1"`` to ``b"6"``
        (``TRANSFER_PLAN_READABLE_VERSIONS``).
    :param payload_frame: The payload frame: one JSON array of fragment objects.
    :param max_payload_bytes: The longest payload accepted; None: ``DEFAULT_MAX_PAYLOAD_BYTES``.
    :param max_fragments: The most fragments accepted; None: ``DEFAULT_MAX_FRAGMENTS``.
    """

def transfer_descriptors(
    fragments: Iterable[TransferFragment],
    src_base_ptrs: npt.ArrayLike,
    dst_base_ptrs: npt.ArrayLike,
    src_pages: npt.ArrayLike,
    dst_pages: npt.ArrayLike,
    *,
    coalesce: bool = True,
    src_limits: npt.ArrayLike | None = None,
    dst_limits: npt.ArrayLike | None = None,
) -> TransferDescriptors: ...
def token_slots(
    page_table: npt.NDArray[np.integer] | Sequence[int],
    page_size: int,
    num_tokens: int,
    *,
    tokens: range | None = None,
    layout: ParallelLayout | None = None,
    rank: int | None = None,
) -> npt.NDArray[np.int64]: ...
def token_owners(
    num_tokens: int,
    cp_size: int,
    *,
    cp_split: str | None = None,
    interleave: int | None = None,
    page_size: int | None = None,
) -> npt.NDArray[np.int64]: ...
def model_buffers(
    shape: ModelShape,
    prefill_tp: int,
    decode_tp: int,
    kv_layout: str | None = None,
    prefill_stages: int | None = None,
    decode_stages: int | None = None,
    prefill_cp: int | None = None,
    prefill_dcp: int | None = None,
    decode_cp: int | None = None,
    decode_dcp: int | None = None,
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]: ...
def vllm_layer_partition(layers: int, pp_size: int) -> list[int]: ...
def even_layer_partition(layers: int, pp_size: int) -> list[int]: ...
def buffers_from_item_lengths(
    items: Iterable[ItemLengths], prefill_tp: int, decode_tp: int
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]: ...
def model_shape_parts(
    config_text: str | None = None,
    preset: str | None = None,
    page_size: int | None = None,
    family: str | None = None,
    quant_config_text: str | None = None,
) -> tuple[
    str,
    tuple[ModelLayer, ...],
    tuple[int, int, int],
    tuple[str | None, str | None],
    str | None,
    int,
]: ...
def model_families() -> list[
    tuple[str, list[str], list[str], list[str], str, list[tuple[str, str]]]
]: ...
def model_layers(shape: ModelShape) -> tuple[ModelLayer, ...]: ...
def model_summary(
    shape: ModelShape,
) -> list[tuple[str, list[int], int, int, int | None, int | None, int, int]]: ...
def dtype_bytes(name: str) -> int: ...
def first_kept_token(
    num_tokens: int, sliding_window: int | None = None, attention_chunk_size: int | None = None
) -> int: ...
def encode_layout(
    layout: ParallelLayout,
    buffers: Iterable[BufferLayout],
    *,
    base_ptrs: _Ints | None = None,
    limits: _Ints | None = None,
) -> tuple[bytes, bytes]: ...
def decode_layout(
    version_frame: bytes, payload_frame: bytes, *, max_payload_bytes: int | None = None
) -> tuple[
    tuple[
        Literal["prefill", "decode"],
        int,
        int,
        int,
        tuple[int, ...] | None,
        int,
        int,
        Literal["sharded", "replicated"],
        Literal["interleave", "contiguous", "zigzag"],
        int,
    ],
    tuple[BufferLayout, ...],
    list[int] | None,
    list[int] | None,
]: ...
def buffer_from_array(
    buffer_index: int,
    buffer_kind: str,
    array: object,
    axes: Sequence[str],
    *,
    logical_size: int | None = None,
    tp_size: int | None = None,
    page_size: int | None = None,
    layer: int | None = None,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
    logical_parts: Sequence[int] | None = None,
    logical_part_groups: Sequence[int] | None = None,
) -> tuple[BufferLayout, int, int]: ...

@final
class Planner:
    def __new__(
        cls,
        prefill_layout: ParallelLayout,
        decode_layout: ParallelLayout,
        prefill_buffers: Iterable[BufferLayout],
        decode_buffers: Iterable[BufferLayout],
        decode_replicas: str | None = None,
        token_maps: bool = False,
    ) -> Planner: ...
    def plan_for_decode_rank(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        num_tokens: int | None = None,
    ) -> RankTransferPlan: ...
    def source_fanout(self) -> dict[int, int]: ...
    def verify(self, num_tokens: int | None = None) -> None: ...
    def transfer_fragments(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        num_tokens: int | None = None,
    ) -> dict[int, tuple[TransferFragment, ...]]: ...
    def routing_table(
        self,
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
    ]: ...
    def without_prefill_ranks(self, ranks: Iterable[int]) -> Planner: ...
    @property
    def unavailable_prefill_ranks(self) -> list[int]: ...
    def lost(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        num_tokens: int | None = None,
    ) -> list[tuple[int, int | None, int, int, int | None, str]]: ...
    @property
    def is_identity(self) -> bool: ...
    @property
    def is_staged(self) -> bool: ...
    @property
    def token_maps(self) -> bool: ...
    @property
    def idle_decode_ranks(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    def check_layout(self, layout: ParallelLayout, buffers: Sequence[BufferLayout]) -> None: ...

def frame_cache_info() -> tuple[int, int, int, int]: ...
def encode_cache_info() -> tuple[int, int]: ...
def fragment_slots_checked() -> bool: ...
def use_package_types(types: dict[str, type]) -> None: ...

# The benchmark's floors (benches/compare.py), not part of the API.
def remake_fragments(fragments: tuple[TransferFragment, ...]) -> tuple[TransferFragment, ...]: ...

@final
class FrameFloor:
    def __new__(cls, lists: Iterable[Sequence[TransferFragment]]) -> FrameFloor: ...
    def write(self) -> int: ...

_Ints = npt.NDArray[np.integer] | Sequence[int]

@final
class PreparedTransfer:
    """One (prefill rank, decode rank) pair's fragments, checked once against both sides'
    buffers (base addresses and limits, by ``buffer_index``), for many requests: each then names
    only its pages or slot maps. ``from_frames`` prepares one from a peer's wire frames,
    ``from_layouts`` from a planner. Thread-safe to share."""
    def __new__(
        cls,
        fragments: Iterable[TransferFragment],
        src_base_ptrs: _Ints,
        dst_base_ptrs: _Ints,
        *,
        src_limits: _Ints | None = None,
        dst_limits: _Ints | None = None,
        buffer_layouts: Iterable[BufferLayout] | None = None,
    ) -> PreparedTransfer:
        """
        :param fragments: One rank pair's fragments.
        :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
        :param dst_base_ptrs: Each destination buffer's base address, indexed by
            ``buffer_index``.
        :param src_limits: How many bytes from each source base may be touched, indexed by
            ``buffer_index``; None: no limit (only 64-bit overflow is refused).
        :param dst_limits: The same for the destination buffers.
        :param buffer_layouts: The prefill side's ``BufferLayout`` s (each buffer's layer and
            page size, for slices); None: none known.
        """
    @staticmethod
    def from_frames(
        version_frame: bytes | None,
        payload_frame: bytes | None,
        src_base_ptrs: _Ints,
        dst_base_ptrs: _Ints,
        *,
        src_limits: _Ints | None = None,
        dst_limits: _Ints | None = None,
        max_payload_bytes: int | None = None,
        max_fragments: int | None = None,
        buffer_layouts: Iterable[BufferLayout] | None = None,
    ) -> PreparedTransfer:
        """Prepared from a peer's wire frames, read as strictly as ``decode_transfer_fragments``
        does, making no fragment objects; frames seen before reuse their parse (a bounded cache).

        :param version_frame: The version frame.
        :param payload_frame: The payload frame.
        :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
        :param dst_base_ptrs: The same for the destination buffers.
        :param src_limits: Bytes from each source base that may be touched, by
            ``buffer_index``; None: no limit (only 64-bit overflow is refused).
        :param dst_limits: The same for the destination buffers.
        :param max_payload_bytes: The longest payload accepted, as in
            ``decode_transfer_fragments``.
        :param max_fragments: The most fragments accepted, as in ``decode_transfer_fragments``.
        :param buffer_layouts: The prefill side's ``BufferLayout`` s (each buffer's layer and
            page size, for slices); None: none known.
        """
    @staticmethod
    def from_layouts(
        planner: object,
        decode_rank: int,
        prefill_rank: int,
        src_base_ptrs: _Ints,
        dst_base_ptrs: _Ints,
        *,
        src_limits: _Ints | None = None,
        dst_limits: _Ints | None = None,
        prefill_dp_group: int | None = None,
        num_tokens: int | None = None,
    ) -> PreparedTransfer:
        """Prepared straight from a planner both sides built from exchanged layouts: the
        fragments ``prefill_rank`` sends ``decode_rank``, planned here, never made into objects
        nor framed. It knows the planner's buffers (``buffer_layouts``), for slices.

        :param planner: The ``PDTransferPlanner``.
        :param decode_rank: The decode rank that receives.
        :param prefill_rank: The prefill rank that sends.
        :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
        :param dst_base_ptrs: The same for the destination buffers.
        :param src_limits: Bytes from each source base that may be touched, by
            ``buffer_index``; None: no limit (only 64-bit overflow is refused).
        :param dst_limits: The same for the destination buffers.
        :param prefill_dp_group: The prefill DP group read from, as in
            ``PDTransferPlanner.plan_for_decode_rank``.
        :param num_tokens: The request's length, as in
            ``PDTransferPlanner.plan_for_decode_rank``.
        """
    def descriptors(
        self,
        src_pages: _Ints,
        dst_pages: _Ints,
        *,
        buffers: range | _Ints | None = None,
        coalesce: bool = True,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> TransferDescriptors:
        """One request's descriptors: ``transfer_descriptors`` over the fragments of
        ``buffers``, in fragment order, bounds-checked per request. A slice (the streaming
        guide) moves a page where its last token becomes final (a partial last page once
        ``final_length`` is reached), never pages below the prefix or a window's kept tokens,
        and state in the slice ending at ``final_length``.

        :param src_pages: The request's source pages, one per page pair: a 1-D integer
            array (any integer dtype) or an int sequence.
        :param dst_pages: The destination pages they pair with, as many.
        :param buffers: The buffers whose fragments count (a ``range`` or a sequence of
            ``buffer_index`` values); None: all.
        :param coalesce: Merge neighbours that continue each other on both sides, as
            ``transfer_descriptors`` does.
        :param layers: A slice's layer group: only buffers of these model layers (within
            ``buffers``); needs ``buffer_layouts``.
        :param tokens: A slice's tokens, ``range(start, stop)``: those newly final. None: all.
        :param final_length: The request's length once known: windows and chunks keep their
            tokens of it, and state moves in the slice ending at it. None: not known yet.
        :param decode_prefix: Tokens the decode side holds already: they never move.
        """
    def strided_descriptors(
        self,
        src_pages: _Ints,
        dst_pages: _Ints,
        *,
        buffers: range | _Ints | None = None,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> StridedDescriptors:
        """``descriptors(...)`` as NIXL 1.5's strided lists: page runs a row a fragment row.

        :param src_pages: As in ``descriptors``.
        :param dst_pages: As in ``descriptors``.
        :param buffers: As in ``descriptors``.
        :param layers: As in ``descriptors``.
        :param tokens: As in ``descriptors``.
        :param final_length: As in ``descriptors``.
        :param decode_prefix: As in ``descriptors``.
        """
    def request(self, src_pages: _Ints, dst_pages: _Ints) -> PreparedRequest:
        """One request's page tables read once, with their page runs: its slices
        (``PreparedRequest``) then skip reading them, the per-call cost streaming pays.

        :param src_pages: As in ``descriptors``.
        :param dst_pages: As in ``descriptors``.
        """
    def token_strided_descriptors(
        self,
        src_slots: _Ints,
        dst_slots: _Ints,
        *,
        buffers: range | _Ints | None = None,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> StridedDescriptors:
        """``token_descriptors(...)`` as NIXL 1.5's strided lists.

        :param src_slots: As in ``token_descriptors``.
        :param dst_slots: As in ``token_descriptors``.
        :param buffers: As in ``token_descriptors``.
        :param layers: As in ``token_descriptors``.
        :param tokens: As in ``token_descriptors``.
        :param final_length: As in ``token_descriptors``.
        :param decode_prefix: As in ``token_descriptors``.
        """
    def token_descriptors(
        self,
        src_slots: _Ints,
        dst_slots: _Ints,
        *,
        buffers: range | _Ints | None = None,
        coalesce: bool = True,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> TransferDescriptors:
        """One request's descriptors from its slot maps: a token moves where both hold it
        (fragments need token geometry: ``PDTransferPlanner(..., token_maps=True)``). A slice
        moves tokens ``[max(start, decode_prefix, kept), stop)``, ``kept`` the first token a
        window or chunk keeps of ``final_length`` (of ``stop`` while unknown).

        :param src_slots: The source rank's slot map: entry ``t`` is token ``t``'s slot on
            that rank (``page * page_size + position``), or -1 (``token_slots`` makes one).
        :param dst_slots: The destination rank's slot map; a token moves where both are set.
        :param buffers: The buffers whose fragments count (a ``range`` or a sequence of
            ``buffer_index`` values); None: all.
        :param coalesce: Merge neighbours that continue each other on both sides.
        :param layers: A slice's layer group: only buffers of these model layers (within
            ``buffers``); needs ``buffer_layouts``.
        :param tokens: A slice's tokens, ``range(start, stop)``: those newly final. None: all.
        :param final_length: The request's length once known: windows and chunks keep their
            tokens of it, and state moves in the slice ending at it. None: not known yet.
        :param decode_prefix: Tokens the decode side holds already: they never move.
        """
    def staging_plan(
        self,
        src_pages: _Ints,
        dst_pages: _Ints,
        *,
        buffers: range | _Ints | None = None,
        chunk_bytes: int | None = None,
    ) -> StagingPlan:
        """One request's staging plan from its pages: ``descriptors(src_pages, dst_pages,
        buffers=buffers)`` regrouped into gather, transfer and scatter.

        :param src_pages: As in ``descriptors``.
        :param dst_pages: The destination pages they pair with, as many.
        :param buffers: As in ``descriptors``.
        :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
            each); None: one transfer.
        """
    def token_staging_plan(
        self,
        src_slots: _Ints,
        dst_slots: _Ints,
        *,
        buffers: range | _Ints | None = None,
        chunk_bytes: int | None = None,
    ) -> StagingPlan:
        """One request's staging plan from its slot maps: ``token_descriptors(src_slots,
        dst_slots, buffers=buffers)`` regrouped into gather, transfer and scatter.

        :param src_slots: As in ``token_descriptors``.
        :param dst_slots: As in ``token_descriptors``.
        :param buffers: As in ``descriptors``.
        :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
            each); None: one transfer.
        """
    def staging_counts(
        self,
        src_pages: _Ints,
        dst_pages: _Ints,
        *,
        buffers: range | _Ints | None = None,
        chunk_bytes: int | None = None,
    ) -> StagingCounts:
        """What ``staging_plan`` would count (``StagingCounts``), without building it.

        :param src_pages: As in ``descriptors``.
        :param dst_pages: The destination pages they pair with, as many.
        :param buffers: As in ``descriptors``.
        :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
            each); None: one transfer.
        """
    def scattered_page_counts(
        self, pages: int, *, buffers: range | _Ints | None = None
    ) -> StagingCounts:
        """``staging_counts`` of ``pages`` pages scattered on both sides (no run continues), one
        transfer, in constant time: what a router weighs before any page is chosen.

        :param pages: Pages the request moves on each side.
        :param buffers: As in ``descriptors``.
        """
    def token_staging_counts(
        self,
        src_slots: _Ints,
        dst_slots: _Ints,
        *,
        buffers: range | _Ints | None = None,
        chunk_bytes: int | None = None,
    ) -> StagingCounts:
        """What ``token_staging_plan`` would count, without building its columns.

        :param src_slots: As in ``token_descriptors``.
        :param dst_slots: As in ``token_descriptors``.
        :param buffers: As in ``descriptors``.
        :param chunk_bytes: The wire hop in chunks of at most this many bytes (one descriptor
            each); None: one transfer.
        """
    def nixl_prepped_lists(
        self, src_capacity_pages: int, dst_capacity_pages: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """NIXL's prepped lists for this pair, made once per peer: (local, remote) N x 5 uint64
        arrays of ``(address, length, device 0, page stride, pages)`` rows for
        ``prep_xfer_dlist(..., "DRAM")``, one row per fragment and page row, checked against
        the limits.

        :param src_capacity_pages: Pages each source buffer holds.
        :param dst_capacity_pages: Pages each destination buffer holds.
        """
    def nixl_prepped_indices(
        self,
        src_pages: _Ints,
        dst_pages: _Ints,
        src_capacity_pages: int,
        dst_capacity_pages: int,
        *,
        buffers: range | _Ints | None = None,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """One request as int32 indices into ``nixl_prepped_lists(src_capacity_pages,
        dst_capacity_pages)``, for ``make_prepped_xfer``: (local, remote), in descriptor order.

        :param src_pages: As in ``descriptors``.
        :param dst_pages: The destination pages they pair with, as many.
        :param src_capacity_pages: Pages each source buffer holds, as the lists were made.
        :param dst_capacity_pages: Pages each destination buffer holds, as the lists were made.
        :param buffers: As in ``descriptors``.
        """
    @property
    def fragments(self) -> tuple[TransferFragment, ...]:
        """The fragments, as ``TransferFragment`` objects (made on each call)."""
    def __len__(self) -> int: ...
    def shares_fragments_with(self, other: PreparedTransfer) -> bool:
        """Whether both were prepared from one parsed fragment list (frames seen before).

        :param other: Another prepared transfer.
        """

@final
class PreparedRequest:
    """One request's pages on a ``PreparedTransfer`` (``.request``): each slice's descriptors,
    that transfer's for these pages, as layers and tokens become final."""
    def strided_descriptors(
        self,
        *,
        buffers: range | _Ints | None = None,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> StridedDescriptors:
        """``PreparedTransfer.strided_descriptors`` of these pages.

        :param buffers: As there.
        :param layers: As there.
        :param tokens: As there.
        :param final_length: As there.
        :param decode_prefix: As there.
        """
    def descriptors(
        self,
        *,
        buffers: range | _Ints | None = None,
        coalesce: bool = True,
        layers: _Ints | None = None,
        tokens: range | None = None,
        final_length: int | None = None,
        decode_prefix: int | None = None,
    ) -> TransferDescriptors:
        """``PreparedTransfer.descriptors`` of these pages.

        :param buffers: As there.
        :param coalesce: As there.
        :param layers: As there.
        :param tokens: As there.
        :param final_length: As there.
        :param decode_prefix: As there.
        """
    def __len__(self) -> int: ...

@final
class StagingPlan:
    """One request staged (``PreparedTransfer.staging_plan``): gather into a staging buffer
    (the bytes in the direct descriptors' order, from offset 0, no gap), one transfer or chunks,
    scatter: exactly the bytes the direct descriptors would write."""
    @property
    def gather(self) -> TransferDescriptors:
        """Source cache addresses -> offsets in the source staging buffer (made on each call);
        runs that continue each other in the source cache merge."""
    @property
    def scatter(self) -> TransferDescriptors:
        """Offsets in the destination staging buffer -> destination cache addresses, merged
        wherever the destination continues."""
    @property
    def staging_bytes(self) -> int:
        """Bytes of the request: the least each side's staging buffer must hold."""
    @property
    def chunk_bytes(self) -> int | None:
        """The wire hop's chunk size, as asked for; None: one transfer."""
    @property
    def counts(self) -> StagingCounts:
        """``StagingCounts`` (direct, wire, gather, scatter descriptors, bytes): what a cost
        model weighs."""
    @property
    def num_direct_descriptors(self) -> int:
        """Descriptors the request takes without staging (``counts.direct_descriptors``)."""
    @property
    def num_wire_descriptors(self) -> int:
        """Descriptors of the wire hop: one, or one per chunk (``counts.wire_descriptors``)."""
    @property
    def num_gather_descriptors(self) -> int:
        """Descriptors of the gather (``counts.gather_descriptors``)."""
    @property
    def num_scatter_descriptors(self) -> int:
        """Descriptors of the scatter (``counts.scatter_descriptors``)."""
    def wire_descriptors(
        self,
        src_staging_base: int,
        dst_staging_base: int,
        *,
        src_staging_bytes: int | None = None,
        dst_staging_bytes: int | None = None,
    ) -> TransferDescriptors:
        """The engine's descriptors between the two staging buffers (the wire hop): one, or one
        per chunk. A staging buffer whose size is given and is too small is refused.

        :param src_staging_base: The source staging buffer's address.
        :param dst_staging_base: The destination staging buffer's address.
        :param src_staging_bytes: The source staging buffer's size; None: not checked.
        :param dst_staging_bytes: The destination staging buffer's size; None: not checked.
        """
    def pack(self, staging: npt.NDArray[np.uint8]) -> None:
        """Copies the source caches into ``staging`` (host memory), the GIL released, where
        they live (read in this process, inside the plan's ``src_limits``).

        :param staging: A writable 1-D C-contiguous numpy ``uint8`` array of at least
            ``staging_bytes``, overlapping no cache.
        """
    def unpack(self, staging: npt.NDArray[np.uint8]) -> None:
        """Copies ``staging`` (host memory) into the destination caches, the GIL released,
        where they live (the decode side's plan; inside its ``dst_limits``).

        :param staging: A 1-D C-contiguous numpy ``uint8`` array of at least
            ``staging_bytes``, as ``pack`` filled it, overlapping no cache.
        """

def layer_groups(
    loads: list[tuple[int, int]],
    layer_seconds: float,
    per_transfer_s: float,
    figures: tuple[float, float, float, float, float],
) -> tuple[list[tuple[int, int]], float, float]: ...
def estimate_staging(
    counts: tuple[int, int, int, int, int], figures: tuple[float, float, float, float, float]
) -> tuple[float, float, float, float, float]: ...
def check_cost_model(figures: tuple[float, float, float, float, float]) -> None: ...
def estimate_forms(
    counts: tuple[int, int, int, int, int],
    strided: tuple[int, int] | None,
    staging: bool,
    figures: tuple[float, float, float, float, float],
    strided_costs: tuple[float, float],
) -> tuple[float, float | None, float | None, str]: ...
def check_strided_costs(per_row_s: float, per_block_s: float) -> None: ...
def fit_line(samples: list[tuple[int, float]]) -> tuple[float, float]: ...
def scaled_counts(counts: tuple[int, int, int, int, int], per: int, pages: int) -> StagingCounts:
    """Counts of a request over ``per`` scattered pages (``scattered_page_counts``), scaled to
    ``pages`` pages in one transfer; refused where they do not scale evenly.

    :param counts: The five staging counts over ``per`` pages.
    :param per: The pages they were counted over.
    :param pages: The pages to scale them to.
    """
