"""The reference API's value types: frozen dataclasses that validate through the Rust core."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, NamedTuple

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError

__all__ = [
    "BufferKind",
    "BufferLayout",
    "CpSplit",
    "ParallelLayout",
    "RankCoordinates",
    "RankTransferPlan",
    "TokenShare",
    "TransferFragment",
    "UnsupportedPDLayoutError",
]


CpSplit = Literal["interleave", "contiguous", "zigzag"]


class TokenShare(NamedTuple):
    """Which of a request's tokens one rank holds (``ParallelLayout.token_share``): the
    ``cp_rank``-th of ``cp_size`` shares, dealt by ``cp_split`` (``token_owners``). Without
    context parallelism, the one share of every token (``cp_size=1``); for decode context
    parallel, ``cp_rank`` is the DCP rank."""

    cp_size: int
    cp_rank: int
    cp_split: CpSplit
    interleave: int


class RankCoordinates(NamedTuple):
    """Where one rank sits on its side (``ParallelLayout.rank_coordinates``)."""

    dp_group: int
    stage: int
    cp_rank: int
    tp_rank: int


class BufferKind(str, Enum):
    TARGET_K = "target_k"
    TARGET_V = "target_v"
    DRAFT_K = "draft_k"
    DRAFT_V = "draft_v"
    MAMBA_STATE = "mamba_state"


def _coerce_kind(obj: object) -> None:
    """Store ``buffer_kind`` as its ``BufferKind`` member (a plain string such as ``"target_k"``
    is accepted); the core has already checked that it names one."""
    kind = obj.buffer_kind  # type: ignore[attr-defined]
    if not isinstance(kind, BufferKind):
        object.__setattr__(obj, "buffer_kind", BufferKind(kind))


@dataclass(frozen=True)
class ParallelLayout:
    """One side's ranks: ``world_size`` ranks in ``dp_size`` DP groups, each of ``pp_size``
    pipeline stages of ``cp_size`` context-parallel ranks of equal TP size (``world_size =
    dp_size * pp_size * cp_size * tp``). Ranks are numbered TP fastest, then CP rank, stage,
    DP group: ``rank = dp_group * (pp_size * cp_size * tp) + stage * (cp_size * tp) + cp_rank
    * tp + tp_rank`` (TRT-LLM's order; vLLM's without CP).

    Stages hold consecutive layers in order: ``pp_layer_partition`` gives each stage's layer
    count (like vLLM's ``VLLM_PP_LAYER_PARTITION``); by default the layers are split as evenly
    as possible, the first stages taking one more (``vllm_layer_partition`` gives vLLM's own
    default, which favours the stages before the last instead).

    Context parallelism spreads a request's tokens over ranks, one way a side:
    ``cp_size`` ranks of their own (prefill CP), or ``dcp_size`` ranks carved out of TP (vLLM's
    decode context parallel: TP rank ``r`` is DCP rank ``r % dcp_size``; ``dcp_size`` divides
    the TP size and every KV-head replica group). ``cp_kv="replicated"`` says CP ranks hold
    every token (after an all-gather) and are replicas to read from. ``cp_split`` and
    ``cp_interleave`` say how tokens are dealt (see ``token_owners``). Plans with CP move
    tokens by slot maps (``token_slots(..., layout=, rank=)``).
    """

    role: Literal["prefill", "decode"]
    world_size: int
    dp_size: int = 1
    pp_size: int = 1
    pp_layer_partition: tuple[int, ...] | None = None
    cp_size: int = 1
    dcp_size: int = 1
    cp_kv: Literal["sharded", "replicated"] = "sharded"
    cp_split: CpSplit = "interleave"
    cp_interleave: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.pp_layer_partition, list):
            object.__setattr__(self, "pp_layer_partition", tuple(self.pp_layer_partition))
        # The core checks the layout and says its TP size (its rank space's fastest axis).
        object.__setattr__(self, "_tp_size", _core.check_parallel_layout(self))

    @property
    def tp_size_per_dp(self) -> int:
        """TP ranks of one CP rank of one pipeline stage of one DP group (all of a DP group
        without PP and CP); DCP ranks are among them."""
        tp: int = self.__dict__["_tp_size"]
        return tp

    def rank_coordinates(self, rank: int) -> RankCoordinates:
        """Where rank ``rank`` sits: its DP group, pipeline stage, CP rank and TP rank."""
        return RankCoordinates(*_core.rank_coordinates(self, rank))

    def token_share(self, rank: int) -> TokenShare:
        """Which of a request's tokens rank ``rank`` holds: its CP share (``cp_size``), its
        DCP share (``dcp_size``: DCP rank ``tp_rank % dcp_size``, always interleaved), or every
        token. ``token_slots(..., layout=, rank=)`` builds its slot map from it."""
        cp_size, cp_rank, cp_split, interleave = _core.rank_token_share(self, rank)
        return TokenShare(cp_size, cp_rank, cp_split, interleave)


@dataclass(frozen=True)
class BufferLayout:
    """Logical layout for one cache/state buffer.

    ``tp_replica_group_size`` describes TP ranks that hold the same logical
    shard. It is used by GQA/MQA-style KV caches when the prefill TP size is
    larger than the number of distinct KV heads.
    """

    buffer_index: int
    buffer_kind: BufferKind
    logical_axis: Literal["kv_head", "state_channel", "replicated"]
    logical_size: int
    page_size: int
    bytes_per_logical_unit: int
    item_stride_bytes: int
    tp_replica_group_size: int = 1
    #: Rows a page: each row holds this rank's units in order, a unit taking
    #: ``bytes_per_logical_unit / rows_per_page`` bytes of it, rows ``page_bytes /
    #: rows_per_page`` apart. 1: head-major (HND); ``page_size``: token-major (NHD);
    #: ``2 * page_size``: FlashInfer's fused K/V page.
    rows_per_page: int = 1
    #: The split axis as a concatenation of parts (summing to ``logical_size``), each split
    #: evenly over the TP shards: Mamba2's conv state ``x | B | C``. None: one part.
    logical_parts: tuple[int, ...] | None = None
    #: The model layer the buffer belongs to: required when either side has pipeline stages
    #: (which hold layers in order), ignored otherwise.
    layer: int | None = None
    #: A sliding-window attention layer's window (tokens): with token maps (turned on by a
    #: window) a request of ``n`` tokens moves only its tokens ``t >= n - sliding_window``.
    sliding_window: int | None = None
    #: A chunked local-attention layer's chunk (tokens, Llama 4): with token maps (turned on by
    #: a chunk) a request of ``n`` tokens moves only its current chunk, tokens ``t >= (n //
    #: attention_chunk_size) * attention_chunk_size``. Not with ``sliding_window``.
    attention_chunk_size: int | None = None
    #: Bytes of each page this buffer owns, from the page's start (rows are ``page_bytes /
    #: rows_per_page`` apart); the rest of ``item_stride_bytes`` belongs to other buffers: K
    #: and V of one fused page (FlashInfer) are two buffers, each a page stride of the fused
    #: page and ``page_bytes`` of its half. None: the whole stride.
    page_bytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logical_parts, list):
            object.__setattr__(self, "logical_parts", tuple(self.logical_parts))
        _core.check_buffer_layout(self)
        _coerce_kind(self)

    @property
    def is_token_indexed(self) -> bool:
        """Whether the buffer holds a value per token (``kv_head``, ``replicated``): moved by
        slot maps with token maps. State (``state_channel``) is one value per request."""
        return _core.is_token_indexed(self.logical_axis)


@dataclass(frozen=True, slots=True)
class TransferFragment:
    """Bytes ``[offset, offset + bytes_per_page)`` of every page of one buffer, one rank pair;
    for token-major pages, one run per row (a row fragment, wire format v2); with token maps,
    where each token's bytes lie on both sides (wire format v3).

    Slotted (no ``__dict__``): a plan holds hundreds of thousands of these. The fragments pdplan
    makes (plans, decoded frames, ``PreparedTransfer.fragments``) and their tuples are not
    tracked by the cyclic garbage collector: a fragment holds only ints, ``None`` and a
    ``BufferKind`` member, so it is in no reference cycle (as CPython untracks tuples of such
    values), and walking them was most of a large plan's cost. Reference counting frees them as
    usual; a cycle forced into one with ``object.__setattr__`` would never be collected.
    """

    buffer_index: int
    buffer_kind: BufferKind
    src_rank: int
    dst_rank: int
    src_page_stride_bytes: int
    dst_page_stride_bytes: int
    src_byte_offset: int
    dst_byte_offset: int
    bytes_per_page: int
    page_count: int | None = None
    #: Runs a page: ``rows_per_page`` runs of ``bytes_per_page / rows_per_page`` bytes, run
    #: ``r`` at ``offset + r * row_stride`` on each side. 1 (strides 0): one span, as in v1.
    rows_per_page: int = 1
    src_row_stride_bytes: int = 0
    dst_row_stride_bytes: int = 0
    #: Token geometry (wire format v3; all 0 without it): each token moves ``token_runs`` runs
    #: of ``token_run_bytes`` bytes, run ``i`` of slot ``s`` at ``byte_offset + i *
    #: token_run_stride + s * token_stride`` in that side's page of ``page_size`` tokens.
    src_page_size: int = 0
    dst_page_size: int = 0
    token_runs: int = 0
    token_run_bytes: int = 0
    src_token_stride_bytes: int = 0
    dst_token_stride_bytes: int = 0
    src_token_run_stride_bytes: int = 0
    dst_token_run_stride_bytes: int = 0
    #: A sliding-window buffer's window (wire format v4): a request of ``n`` tokens moves only
    #: tokens ``t >= n - sliding_window``. Needs token geometry.
    sliding_window: int | None = None
    #: A chunked local-attention buffer's chunk (wire format v5): a request of ``n`` tokens
    #: moves only tokens ``t >= (n // attention_chunk_size) * attention_chunk_size``. Needs
    #: token geometry.
    attention_chunk_size: int | None = None
    #: 1: pages do not pair one to one though both sides' hold as many tokens (head-major
    #: facing token-major, wire format v6): only slot maps move the fragment.
    pages_unpaired: int = 0

    def __post_init__(self) -> None:
        _core.check_transfer_fragment(self)
        _coerce_kind(self)


@dataclass(frozen=True)
class RankTransferPlan:
    """What one decode rank receives: its prefill sources, fragments and their fanouts."""

    plan_kind: Literal["identity", "fragmented"]
    target_dp_group: int
    target_prefill_ranks: tuple[int, ...]
    required_prefill_response_num: int
    fragments_by_prefill_rank: dict[int, tuple[TransferFragment, ...]]
    required_dst_info_num_by_prefill_rank: dict[int, int]
    #: Prefill ranks of the target DP group that hold some of this decode rank's bytes but
    #: send it none (MLA replicas, GQA replica groups under ``decode_replicas="first"``, CP
    #: and DCP shares read elsewhere), ascending: the runtime sends them a notify-only
    #: message so that they free the request's blocks, as vLLM does.
    notify_prefill_ranks: tuple[int, ...] = ()

    def required_dst_info_num_for_prefill_rank(self, prefill_rank: int) -> int:
        try:
            return self.required_dst_info_num_by_prefill_rank[prefill_rank]
        except (KeyError, TypeError):
            raise UnsupportedPDLayoutError(
                f"prefill_rank={prefill_rank!r} is not a source of this plan; its sources are "
                f"{list(self.target_prefill_ranks)}"
            ) from None
