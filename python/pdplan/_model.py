"""The reference API's value types: frozen dataclasses that validate through the Rust core."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, NamedTuple

from pdplan import _core
from pdplan._bounded import shown
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
    """Shares the tokens are dealt into: the side's ``cp_size`` (1 under
    ``cp_kv="replicated"``, whose CP ranks each hold every token), its ``dcp_size``, or 1."""
    cp_rank: int
    """The share the rank holds, ``0 .. cp_size``: its CP rank, or its DCP rank."""
    cp_split: CpSplit
    """How the tokens are dealt (``token_owners``): the layout's ``cp_split``."""
    interleave: int
    """Consecutive tokens dealt to one rank under ``"interleave"``: the layout's
    ``cp_interleave``."""


class RankCoordinates(NamedTuple):
    """Where one rank sits on its side (``ParallelLayout.rank_coordinates``)."""

    dp_group: int
    """Its DP group, ``0 .. dp_size``."""
    stage: int
    """Its pipeline stage in the DP group, ``0 .. pp_size``."""
    cp_rank: int
    """Its context-parallel rank in the stage, ``0 .. cp_size``."""
    tp_rank: int
    """Its TP rank in the CP rank, ``0 .. tp_size_per_dp`` (a DCP rank is ``tp_rank %
    dcp_size``)."""


class BufferKind(str, Enum):
    """What a buffer holds: the target model's K or V cache, the draft model's (speculative
    decoding), or a recurrent layer's state. Wherever a kind is asked for, its string value
    (``"target_k"``) is accepted too; the wire format writes that string."""

    TARGET_K = "target_k"
    """The target model's K cache; also an MLA layer's latent, the MLA indexer's key cache
    and K's block scales."""
    TARGET_V = "target_v"
    """The target model's V cache (and V's block scales)."""
    DRAFT_K = "draft_k"
    """The draft model's K cache."""
    DRAFT_V = "draft_v"
    """The draft model's V cache."""
    MAMBA_STATE = "mamba_state"
    """A recurrent layer's state (SSM, conv, linear-attention): one value per request, not per
    token."""


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
    """Which side this is: ``"prefill"`` or ``"decode"``."""
    world_size: int
    """The side's ranks, all of them: ``dp_size * pp_size * cp_size`` times the TP size,
    which follows from it."""
    dp_size: int = 1
    """DP groups, each holding the whole model."""
    pp_size: int = 1
    """Pipeline stages of each DP group."""
    pp_layer_partition: tuple[int, ...] | None = None
    """Each stage's layer count, in stage order; None: as even as possible, the first stages
    taking one more (``even_layer_partition``)."""
    cp_size: int = 1
    """Context-parallel ranks of their own in each stage (prefill CP); 1: none."""
    dcp_size: int = 1
    """Decode-context-parallel ranks carved out of TP (vLLM's DCP); 1: none."""
    cp_kv: Literal["sharded", "replicated"] = "sharded"
    """``"sharded"``: CP ranks hold disjoint shares of the tokens; ``"replicated"``: each holds
    every token and they are replicas to read from."""
    cp_split: CpSplit = "interleave"
    """How tokens are dealt over CP or DCP ranks: ``"interleave"``, ``"contiguous"`` or
    ``"zigzag"`` (``token_owners``)."""
    cp_interleave: int = 1
    """Consecutive tokens dealt to one rank under ``"interleave"`` (``token_owners``'s
    ``interleave``)."""

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
        """Where rank ``rank`` sits: its DP group, pipeline stage, CP rank and TP rank.

        :param rank: A rank of this side, ``0 .. world_size``; others are refused.
        """
        return RankCoordinates(*_core.rank_coordinates(self, rank))

    def token_share(self, rank: int) -> TokenShare:
        """Which of a request's tokens rank ``rank`` holds: its CP share (``cp_size``), its
        DCP share (``dcp_size``: DCP rank ``tp_rank % dcp_size``, dealt by ``cp_split`` like
        CP; vLLM's DCP interleaves), or every token. ``token_slots(..., layout=, rank=)``
        builds its slot map from it.

        :param rank: A rank of this side, ``0 .. world_size``; others are refused.
        """
        cp_size, cp_rank, cp_split, interleave = _core.rank_token_share(self, rank)
        return TokenShare(cp_size, cp_rank, cp_split, interleave)


@dataclass(frozen=True)
class BufferLayout:
    """Logical layout for one cache/state buffer: which of its units (KV heads, state channels)
    a rank holds and where their bytes sit in each page of the rank's own buffer."""

    buffer_index: int
    """The buffer's number: both sides list the same buffers in the same order, with the same
    numbers, and descriptors find its base pointer and limit at this index."""
    buffer_kind: BufferKind
    """What the buffer holds (a ``BufferKind``; its string value is accepted)."""
    logical_axis: Literal["kv_head", "state_channel", "replicated"]
    """The axis split over TP ranks: ``"kv_head"`` (KV heads, a value per token),
    ``"state_channel"`` (state channels, one value per request) or ``"replicated"`` (every
    rank holds all of it, a value per token: an MLA latent)."""
    logical_size: int
    """Logical units (KV heads, state channels) in the whole buffer, across all TP ranks."""
    page_size: int
    """Tokens a page holds (a state buffer's page is one request's state)."""
    bytes_per_logical_unit: int
    """Bytes one logical unit takes in one page of this rank's buffer."""
    item_stride_bytes: int
    """Bytes from one page of this rank's buffer to the next."""
    tp_replica_group_size: int = 1
    """TP ranks that hold the same logical shard. It is used by GQA/MQA-style KV caches when
    the side's TP size is larger than the number of distinct KV heads; 1: none."""
    rows_per_page: int = 1
    """Rows a page: each row holds this rank's units in order, a unit taking
    ``bytes_per_logical_unit / rows_per_page`` bytes of it, rows ``page_bytes /
    rows_per_page`` apart. 1: head-major (HND); ``page_size``: token-major (NHD);
    ``2 * page_size``: FlashInfer's fused K/V page."""
    logical_parts: tuple[int, ...] | None = None
    """The split axis as a concatenation of parts (summing to ``logical_size``), each split
    evenly over the TP shards: Mamba2's conv state ``x | B | C``. None: one part."""
    layer: int | None = None
    """The model layer the buffer belongs to: required when either side has pipeline stages
    (which hold layers in order), ignored otherwise."""
    sliding_window: int | None = None
    """A sliding-window attention layer's window (tokens): with token maps (turned on by a
    window) a request of ``n`` tokens moves only its tokens ``t >= n - sliding_window``."""
    attention_chunk_size: int | None = None
    """A chunked local-attention layer's chunk (tokens, Llama 4): with token maps (turned on by
    a chunk) a request of ``n`` tokens moves only its current chunk, tokens ``t >= (n //
    attention_chunk_size) * attention_chunk_size``. Not with ``sliding_window``."""
    page_bytes: int | None = None
    """Bytes of each page this buffer owns, from the page's start (rows are ``page_bytes /
    rows_per_page`` apart); the rest of ``item_stride_bytes`` belongs to other buffers: K and V
    of one fused page (FlashInfer) are two buffers, each a page stride of the fused page and
    ``page_bytes`` of its half. None: the whole stride."""
    logical_part_groups: tuple[int, ...] | None = None
    """The groups each of ``logical_parts`` is made of, one count a part: runs of units a rank
    keeps whole (Mamba2's B and C are ``n_groups`` groups of ``state_size`` channels). A side
    with more TP shards than a part has groups copies the part: shard ``s`` of ``S`` holds group
    ``s * groups // S``, the group its heads read (vLLM's and SGLang's Mamba2 below
    ``n_groups``); each decode rank's copy is written, read from one prefill copy. With as
    many groups or more, a part splits at group boundaries. None: parts split evenly."""
    token_pieces: tuple[int, ...] | None = None
    """Where a head-major unit's tokens lie when not one after another: the unit's page is cut
    into equal planes, and within plane ``i`` a token's bytes lie in ``token_pieces[i]`` equal
    pieces, the page's tokens one after another inside each piece. vLLM's CPU backend keeps
    each head's K transposed, then its V: ``(head_size, 1)``. Only token moves (pages of other
    sizes) read it; None: one plane of one piece."""

    def __post_init__(self) -> None:
        for name in ("logical_parts", "logical_part_groups", "token_pieces"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
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
    """The buffer the bytes belong to (its ``BufferLayout.buffer_index``, the same on both
    sides)."""
    buffer_kind: BufferKind
    """That buffer's kind."""
    src_rank: int
    """The prefill rank that sends."""
    dst_rank: int
    """The decode rank that receives."""
    src_page_stride_bytes: int
    """Bytes from one source page to the next."""
    dst_page_stride_bytes: int
    """Bytes from one destination page to the next."""
    src_byte_offset: int
    """Where the fragment's bytes start in a source page."""
    dst_byte_offset: int
    """Where they land in a destination page."""
    bytes_per_page: int
    """Bytes one page moves (all rows of it)."""
    page_count: int | None = None
    """Only the first ``page_count`` page pairs of a request; None: all."""
    rows_per_page: int = 1
    """Runs a page: ``rows_per_page`` runs of ``bytes_per_page / rows_per_page`` bytes, run
    ``r`` at ``offset + r * row_stride`` on each side. 1 (strides 0): one span, as in v1."""
    src_row_stride_bytes: int = 0
    """Bytes between source rows (0 with one row)."""
    dst_row_stride_bytes: int = 0
    """Bytes between destination rows (0 with one row)."""
    src_page_size: int = 0
    """Tokens a source page holds. Token geometry (wire format v3; all 0 without it): each
    token moves ``token_runs`` runs of ``token_run_bytes`` bytes, run ``i`` of slot ``s`` at
    ``byte_offset + i * token_run_stride + s * token_stride`` in that side's page of
    ``page_size`` tokens."""
    dst_page_size: int = 0
    """Tokens a destination page holds (token geometry)."""
    token_runs: int = 0
    """Runs a token moves (token geometry)."""
    token_run_bytes: int = 0
    """Bytes of one run (token geometry)."""
    src_token_stride_bytes: int = 0
    """Bytes between a source page's slots (token geometry)."""
    dst_token_stride_bytes: int = 0
    """Bytes between a destination page's slots (token geometry)."""
    src_token_run_stride_bytes: int = 0
    """Bytes between a token's runs, source side (token geometry)."""
    dst_token_run_stride_bytes: int = 0
    """Bytes between a token's runs, destination side (token geometry)."""
    sliding_window: int | None = None
    """A sliding-window buffer's window (wire format v4): a request of ``n`` tokens moves only
    tokens ``t >= n - sliding_window``. Needs token geometry."""
    attention_chunk_size: int | None = None
    """A chunked local-attention buffer's chunk (wire format v5): a request of ``n`` tokens
    moves only tokens ``t >= (n // attention_chunk_size) * attention_chunk_size``. Needs token
    geometry."""
    pages_unpaired: int = 0
    """1: pages do not pair one to one though both sides' hold as many tokens (head-major
    facing token-major, wire format v6): only slot maps move the fragment."""

    def __post_init__(self) -> None:
        _core.check_transfer_fragment(self)
        _coerce_kind(self)


@dataclass(frozen=True)
class RankTransferPlan:
    """What one decode rank receives: its prefill sources, fragments and their fanouts."""

    plan_kind: Literal["identity", "fragmented"]
    """``"identity"``: both sides hold the same shards in pages that line up (the same TP size
    and stages, no replica groups, no context parallelism), so the decode rank copies whole
    items from its one source and the plan carries no fragments
    (``PDTransferPlanner.transfer_fragments`` gives them as whole-item fragments);
    ``"fragmented"``: the fragments say which bytes."""
    target_dp_group: int
    """The prefill DP group the decode rank reads from."""
    target_prefill_ranks: tuple[int, ...]
    """Its sources: the prefill ranks it reads from, ascending."""
    required_prefill_response_num: int
    """How many sources it waits for: ``len(target_prefill_ranks)``."""
    fragments_by_prefill_rank: dict[int, tuple[TransferFragment, ...]]
    """Each source's fragments, in buffer order; empty for an identity plan."""
    required_dst_info_num_by_prefill_rank: dict[int, int]
    """For each source, how many decode ranks one request makes it wait for (its fanout)."""
    notify_prefill_ranks: tuple[int, ...] = ()
    """Prefill ranks of the target DP group that hold some of this decode rank's bytes but
    send it none (MLA replicas, GQA replica groups under ``decode_replicas="first"``, CP and
    DCP shares read elsewhere), ascending: the runtime sends them a notify-only message so
    that they free the request's blocks, as vLLM does."""

    def required_dst_info_num_for_prefill_rank(self, prefill_rank: int) -> int:
        """How many decode ranks one request makes source ``prefill_rank`` wait for (its
        entry of ``required_dst_info_num_by_prefill_rank``). A rank that is no source of this
        plan is refused with ``UnsupportedPDLayoutError``, naming the sources.

        :param prefill_rank: One of ``target_prefill_ranks``.
        """
        try:
            return self.required_dst_info_num_by_prefill_rank[prefill_rank]
        except (KeyError, TypeError):
            raise UnsupportedPDLayoutError(
                f"prefill_rank={shown(prefill_rank)} is not a source of this plan; its sources are "
                f"{list(self.target_prefill_ranks)}"
            ) from None
