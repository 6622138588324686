"""What a pairing of a prefill and a decode instance costs a request, from configs alone: the
bytes and descriptors of every rank pair, the largest fanout and the cost model's time, for a
router choosing where to send a request before any page is allocated.

A ``Pairing`` builds the planner once; ``Pairing.cost`` then counts one request exactly as
planning it would (its pages scattered on both sides, so no descriptor continues another),
without building it: where the two sides move by pages the Rust core counts two pages and
scales; where they move by slot maps (page sizes that differ, context parallelism) it walks a
few periods of both sides' page boundaries and multiplies the middle ones (``_slot_counts``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from pdplan import _core
from pdplan._bounded import shown
from pdplan._core import PreparedTransfer, UnsupportedPDLayoutError
from pdplan._layer_groups import (
    DEFAULT_LAYER_SECONDS_PER_TOKEN,
    DEFAULT_PER_TRANSFER_S,
    LayerGroups,
    layer_groups,
)
from pdplan._layouts import MODEL_PRESETS, ModelShape, even_layer_partition, model_buffer_layouts
from pdplan._model import ParallelLayout
from pdplan._planner import PDTransferPlanner
from pdplan._request import page_sizes
from pdplan._slot_counts import SlotCounter
from pdplan._staging import CostEstimate, CostModel, StagingCounts
from pdplan.limits import MAX_TOKENS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pdplan._model import BufferLayout, TransferFragment

__all__ = ["PairCost", "Pairing", "TransferCost", "model_planner", "transfer_cost"]

#: Each buffer's stand-in base address: 2^40 apart, so no two buffers' bytes ever touch.
_BASE_STEP = 1 << 40


def _with_stages(layout: ParallelLayout, layers: int) -> ParallelLayout:
    """`layout`, its stages splitting all `layers` layers (MLP-only ones too) where it names no
    partition: pdplan's default split."""
    if layout.pp_size == 1 or layout.pp_layer_partition is not None:
        return layout
    return replace(layout, pp_layer_partition=even_layer_partition(layers, layout.pp_size))


def model_planner(
    shape: ModelShape,
    prefill: ParallelLayout,
    decode: ParallelLayout,
    *,
    prefill_page_size: int | None = None,
    decode_page_size: int | None = None,
    kv_layout: Literal["HND", "NHD"] = "HND",
    decode_replicas: Literal["first", "all"] = "first",
) -> PDTransferPlanner:
    """The planner of a model between two layouts, each side's buffers in its own page size
    (the model's where None): what ``pdplan plan`` and ``pdplan check`` plan.

    :param shape: The model.
    :param prefill: The prefill side's layout (stages without a partition split all the
        model's layers as evenly as possible).
    :param decode: The decode side's layout.
    :param prefill_page_size: Tokens a prefill page; None: ``shape.page_size``.
    :param decode_page_size: Tokens a decode page; None: ``shape.page_size``.
    :param kv_layout: How KV pages store tokens, ``"HND"`` or ``"NHD"``.
    :param decode_replicas: Which decode ranks of a replica group receive.
    """
    for name, layout in (("prefill", prefill), ("decode", decode)):
        if not isinstance(layout, ParallelLayout) or layout.role != name:
            got = layout.role if isinstance(layout, ParallelLayout) else type(layout).__name__
            raise UnsupportedPDLayoutError(
                f"{name} must be the {name} side's ParallelLayout (role {shown(name)}), "
                f"got {shown(got)}"
            )
    prefill = _with_stages(prefill, shape.num_layers)
    decode = _with_stages(decode, shape.num_layers)

    def buffers(side: int, page_size: int | None) -> tuple[BufferLayout, ...]:
        sized = shape if page_size is None else replace(shape, page_size=page_size)
        return model_buffer_layouts(
            sized,
            prefill.tp_size_per_dp,
            decode.tp_size_per_dp,
            kv_layout,
            prefill_pp=prefill.pp_size,
            decode_pp=decode.pp_size,
            prefill_cp=prefill.cp_size,
            decode_cp=decode.cp_size,
            prefill_dcp=prefill.dcp_size,
            decode_dcp=decode.dcp_size,
        )[side]

    return PDTransferPlanner(
        prefill_layout=prefill,
        decode_layout=decode,
        prefill_buffers=buffers(0, prefill_page_size),
        decode_buffers=buffers(1, decode_page_size),
        decode_replicas=decode_replicas,
    )


def _check_request(tokens: int, decode_prefix: int) -> None:
    """A request's length and decode-side prefix, refused by name where they cannot be one."""
    for name, value, least in (("tokens", tokens, 1), ("decode_prefix", decode_prefix, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UnsupportedPDLayoutError(
                f"{name} must be an int of at least {least}, got {shown(value)}"
            )
    if tokens > MAX_TOKENS:
        raise UnsupportedPDLayoutError(
            f"tokens={tokens} is above the limit of {MAX_TOKENS} tokens a request "
            "(pdplan.limits.MAX_TOKENS)"
        )
    if decode_prefix > tokens:
        raise UnsupportedPDLayoutError(
            f"decode_prefix ({decode_prefix}) cannot exceed the request's tokens ({tokens})"
        )


@dataclass(frozen=True)
class PairCost:
    """One (decode rank, prefill rank) pair's share of a request."""

    decode_rank: int
    """The decode rank that reads."""
    prefill_rank: int
    """The prefill rank it reads from."""
    descriptors: int
    """Descriptors the engine gets, sent directly (the KV's and the state's)."""
    bytes: int
    """Bytes the pair moves."""
    estimate: CostEstimate
    """The cost model's figures for the pair, direct and staged."""

    @property
    def seconds(self) -> float:
        """The pair's time the cheaper way (``estimate.choice``)."""
        return min(self.estimate.direct_s, self.estimate.staging_s)


@dataclass(frozen=True)
class TransferCost:
    """What one request costs a pairing."""

    tokens: int
    """The request's length."""
    decode_prefix: int
    """Tokens the decode side already holds (its prefix cache hit)."""
    moved_tokens: int
    """Tokens whose KV moves: from the first page (or token, by slot maps) the prefix does not
    cover to the end."""
    by: Literal["pages", "slots"]
    """How the request moves: by page ids (both sides' pages alike) or by slot maps."""
    pairs: tuple[PairCost, ...]
    """Every (decode rank, prefill rank) pair the decode DP group reads from."""
    decode_dp_group: int = 0
    """The decode DP group the request lands on."""

    @property
    def largest_fanout(self) -> int:
        """The most decode ranks reading bytes from one prefill rank."""
        readers: dict[int, int] = {}
        for p in self.pairs:
            if p.bytes:
                readers[p.prefill_rank] = readers.get(p.prefill_rank, 0) + 1
        return max(readers.values(), default=0)

    @property
    def bytes(self) -> int:
        """Bytes over all pairs."""
        return sum(p.bytes for p in self.pairs)

    @property
    def descriptors(self) -> int:
        """Descriptors over all pairs."""
        return sum(p.descriptors for p in self.pairs)

    @property
    def seconds(self) -> float:
        """The cost model's time for the request: each rank serves its pairs one after another
        (a decode rank reads its sources in turn, a prefill rank feeds its readers in turn),
        ranks in parallel; the busiest rank's total."""
        busy: dict[tuple[str, int], float] = {}
        for p in self.pairs:
            for rank in (("decode", p.decode_rank), ("prefill", p.prefill_rank)):
                busy[rank] = busy.get(rank, 0.0) + p.seconds
        return max(busy.values(), default=0.0)

    def bytes_by_pair(self) -> dict[tuple[int, int], int]:
        """Bytes per (decode rank, prefill rank)."""
        return {(p.decode_rank, p.prefill_rank): p.bytes for p in self.pairs}


@dataclass(frozen=True)
class _Source:
    """One pair's counts, kept per pairing: its KV over one and over two scattered pages (more
    pages scale the two), and its state."""

    decode_rank: int
    prefill_rank: int
    one_page: StagingCounts
    two_pages: StagingCounts
    state: StagingCounts | None

    def kv(self, pages: int) -> StagingCounts:
        if pages == 1:
            return self.one_page
        return _core.scaled_counts(self.two_pages, 2, pages)


class Pairing:
    """A prefill and a decode deployment of one model, planned once, for costing requests.

    :param model: The model: a ``ModelShape``, a preset name, or a config path.
    :param prefill: The prefill side's layout.
    :param decode: The decode side's layout.
    :param prefill_page_size: Tokens a prefill page; None: the model's.
    :param decode_page_size: Tokens a decode page; None: the model's.
    :param kv_layout: How KV pages store tokens, ``"HND"`` or ``"NHD"``.
    :param decode_replicas: Which decode ranks of a replica group receive.
    :param cost_model: The engine's figures; None: ``CostModel()``.
    :param decode_dp_group: The decode DP group the requests land on.
    """

    model: ModelShape
    """The model."""
    planner: PDTransferPlanner
    """The planner of the pairing, built once."""
    cost_model: CostModel
    """The engine's figures each pair is timed with."""
    decode_dp_group: int
    """The decode DP group the requests land on."""
    page_sizes: tuple[int, int]
    """Tokens a page of the KV cache on each side (prefill, decode)."""

    def __init__(
        self,
        model: ModelShape | str | os.PathLike[str],
        prefill: ParallelLayout,
        decode: ParallelLayout,
        *,
        prefill_page_size: int | None = None,
        decode_page_size: int | None = None,
        kv_layout: Literal["HND", "NHD"] = "HND",
        decode_replicas: Literal["first", "all"] = "first",
        cost_model: CostModel | None = None,
        decode_dp_group: int = 0,
    ) -> None:
        if isinstance(model, (str, os.PathLike)):
            model = (
                ModelShape.preset(model)
                if isinstance(model, str) and model in MODEL_PRESETS
                else ModelShape.from_hf_config(model)
            )
        if not isinstance(model, ModelShape):
            raise UnsupportedPDLayoutError(
                f"Pairing takes a ModelShape, a preset name or a config path, got "
                f"{type(model).__name__}"
            )
        self.model = model
        # What a one-layer pairing of the same deployment is built with (`layer_groups`).
        self._deployment = (
            prefill, decode, prefill_page_size, decode_page_size, kv_layout, decode_replicas
        )  # fmt: skip
        self.planner = model_planner(
            model,
            prefill,
            decode,
            prefill_page_size=prefill_page_size,
            decode_page_size=decode_page_size,
            kv_layout=kv_layout,
            decode_replicas=decode_replicas,
        )
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise UnsupportedPDLayoutError(
                f"cost_model must be a CostModel, got {type(cost_model).__name__}"
            )
        self.cost_model = cost_model or CostModel()
        groups = self.planner.decode_layout.dp_size
        if (
            isinstance(decode_dp_group, bool)
            or not isinstance(decode_dp_group, int)
            or not 0 <= decode_dp_group < groups
        ):
            raise UnsupportedPDLayoutError(
                f"decode_dp_group must be in 0..{groups - 1}, got {decode_dp_group}"
            )
        self.decode_dp_group = decode_dp_group
        prefill_buffers = self.planner.prefill_buffers
        self.page_sizes = page_sizes(self.planner)
        self._kv = [b.buffer_index for b in prefill_buffers if b.is_token_indexed]
        self._states: dict[tuple[int, int], StagingCounts] = {}
        self._state = [b.buffer_index for b in prefill_buffers if not b.is_token_indexed]

    @cached_property
    def _decode_ranks(self) -> tuple[int, ...]:
        layout = self.planner.decode_layout
        return tuple(
            r
            for r in range(layout.world_size)
            if layout.rank_coordinates(r).dp_group == self.decode_dp_group
        )

    def _prepared(self, fragments: Sequence[TransferFragment], pages: int) -> PreparedTransfer:
        """Fragments over stand-in caches of `pages` pages a buffer, 2^40 apart."""
        planner = self.planner
        src_bases = [(i + 1) * _BASE_STEP for i in range(len(planner.prefill_buffers))]
        dst_bases = [(i + 1) * _BASE_STEP for i in range(len(planner.decode_buffers))]
        return PreparedTransfer(
            list(fragments),
            src_bases,
            dst_bases,
            src_limits=[b.item_stride_bytes * pages for b in planner.prefill_buffers],
            dst_limits=[b.item_stride_bytes * pages for b in planner.decode_buffers],
        )

    @cached_property
    def _sources(self) -> tuple[_Source, ...]:
        """Every pair's counts for requests by pages (three pages a buffer: counts use two)."""
        sources = []
        for rank in self._decode_ranks:
            for prefill_rank, fragments in self.planner.transfer_fragments(rank).items():
                prepared = self._prepared(tuple(fragments), 3)
                count = prepared.scattered_page_counts
                state = count(1, buffers=self._state) if self._state else None
                kv = (count(1, buffers=self._kv), count(2, buffers=self._kv))
                sources.append(_Source(rank, prefill_rank, *kv, state))
        return tuple(sources)

    def cost(self, tokens: int, *, decode_prefix: int = 0) -> TransferCost:
        """One request's cost: ``tokens`` long, of which the decode side already holds the
        first ``decode_prefix``.

        :param tokens: The request's length (its prompt), at least 1.
        :param decode_prefix: Tokens the decode side holds already (its prefix cache hit), at
            most ``tokens``. By pages, moving starts at the page the hit ends in; by slot maps,
            at the token. State layers always move (their state is the prompt's end).
        """
        _check_request(tokens, decode_prefix)
        if self.planner.token_maps:
            return self._by_slots(tokens, decode_prefix)
        page_size = self.page_sizes[0]
        first = decode_prefix // page_size
        pages = -(-tokens // page_size) - first
        pairs = []
        for source in self._sources:
            parts = [source.kv(pages)]
            if source.state is not None:
                parts.append(source.state)
            pairs.append(self._pair(source.decode_rank, source.prefill_rank, parts))
        return TransferCost(
            tokens, decode_prefix, tokens - first * page_size, "pages", tuple(pairs),
            self.decode_dp_group,
        )  # fmt: skip

    def layer_groups(
        self,
        tokens: int,
        *,
        decode_prefix: int = 0,
        layer_seconds: float | None = None,
        per_transfer_s: float = DEFAULT_PER_TRANSFER_S,
    ) -> LayerGroups:
        """The layer groups to stream one request in while prefill runs (``layer_groups``):
        each layer's load is its busiest rank pair's descriptors and bytes for this request.

        :param tokens: The request's length.
        :param decode_prefix: Tokens the decode side holds already.
        :param layer_seconds: Seconds prefill takes a layer for this request, as the runtime
            measures it; None: ``tokens * DEFAULT_LAYER_SECONDS_PER_TOKEN``.
        :param per_transfer_s: Seconds a transfer costs however small.
        """
        _check_request(tokens, decode_prefix)
        loads = self._layer_loads(tokens, decode_prefix)
        seconds = (
            tokens * DEFAULT_LAYER_SECONDS_PER_TOKEN if layer_seconds is None else layer_seconds
        )
        return layer_groups(
            loads,
            layer_seconds=seconds,
            cost_model=self.cost_model,
            per_transfer_s=per_transfer_s,
        )

    def _layer_loads(self, tokens: int, decode_prefix: int) -> list[tuple[int, int]]:
        """Each model layer's load on its busiest rank pair. A layer's load is its kind's, so
        each kind is costed once, as a one-layer model of the same deployment."""
        prefill, decode, prefill_page_size, decode_page_size, kv_layout, replicas = self._deployment
        if prefill.pp_size > 1 or decode.pp_size > 1:
            raise UnsupportedPDLayoutError(
                "layer groups are chosen without pipeline stages: a stage streams its own "
                "layers; cost a pairing of one stage's TP layout instead"
            )
        m = self.model
        loads: dict[object, tuple[int, int]] = {}
        out = []
        for layer in m.model_layers:
            if layer not in loads:
                one = ModelShape(
                    layer_kinds=(layer,), dtype=m.dtype, page_size=m.page_size,
                    kv_cache_dtype=m.kv_cache_dtype, state_dtype=m.state_dtype,
                )  # fmt: skip
                if not one.summary()[0].token_bytes and not one.summary()[0].state_bytes:
                    loads[layer] = (0, 0)
                else:
                    cost = Pairing(
                        one, prefill, decode, prefill_page_size=prefill_page_size,
                        decode_page_size=decode_page_size, kv_layout=kv_layout,
                        decode_replicas=replicas, cost_model=self.cost_model,
                        decode_dp_group=self.decode_dp_group,
                    ).cost(tokens, decode_prefix=decode_prefix)  # fmt: skip
                    busiest = max(cost.pairs, key=lambda p: (p.seconds, p.bytes))
                    loads[layer] = (busiest.descriptors, busiest.bytes)
            out.append(loads[layer])
        return out

    def _pair(self, decode_rank: int, prefill_rank: int, parts: list[StagingCounts]) -> PairCost:
        estimate = CostEstimate.total([self.cost_model.estimate_counts(c) for c in parts])
        return PairCost(
            decode_rank,
            prefill_rank,
            sum(c.direct_descriptors for c in parts),
            sum(c.bytes for c in parts),
            estimate,
        )

    @cached_property
    def _slot_counter(self) -> SlotCounter:
        layouts = (self.planner.prefill_layout, self.planner.decode_layout)
        kinds = self.model.summary()
        windows = [k.sliding_window or 0 for k in kinds]
        chunks = [k.attention_chunk_size or 1 for k in kinds]
        reach = max([*windows, *(c for c in chunks if c > 1), 0])
        return SlotCounter(
            layouts, self.page_sizes, self._kv, self._prepared, reach, math.lcm(*chunks, 1)
        )

    @cached_property
    def _long_request_fragments(self) -> dict[int, dict[int, tuple[TransferFragment, ...]]]:
        """Each decode rank's fragments by source for a request of at least one period (the
        sources of shorter ones under CP are fewer)."""
        return {rank: self.planner.transfer_fragments(rank) for rank in self._decode_ranks}

    def _state_counts(
        self, rank: int, prefill_rank: int, fragments: Sequence[TransferFragment]
    ) -> StagingCounts:
        """A pair's state counts (one page each side), counted once."""
        key = (rank, prefill_rank)
        if key not in self._states:
            prepared = self._prepared(fragments, 3)
            self._states[key] = prepared.scattered_page_counts(1, buffers=self._state)
        return self._states[key]

    def _by_slots(self, tokens: int, decode_prefix: int) -> TransferCost:
        """Slot maps over scattered pages (every other page, backwards), the decode side's
        slots cleared below the prefix (``SlotCounter``)."""
        counter = self._slot_counter
        short = counter.period is None or tokens < counter.period
        pairs = []
        for rank in self._decode_ranks:
            sources = (
                self.planner.transfer_fragments(rank, num_tokens=tokens)
                if short
                else self._long_request_fragments[rank]
            )
            for prefill_rank, fragments in sources.items():
                parts = [counter.counts((rank, prefill_rank), fragments, tokens, decode_prefix)]
                if self._state:
                    parts.append(self._state_counts(rank, prefill_rank, fragments))
                pairs.append(self._pair(rank, prefill_rank, parts))
        return TransferCost(
            tokens, decode_prefix, tokens - decode_prefix, "slots", tuple(pairs),
            self.decode_dp_group,
        )  # fmt: skip


def transfer_cost(
    model: ModelShape | str | os.PathLike[str],
    prefill: ParallelLayout,
    decode: ParallelLayout,
    *,
    tokens: int,
    decode_prefix: int = 0,
    prefill_page_size: int | None = None,
    decode_page_size: int | None = None,
    kv_layout: Literal["HND", "NHD"] = "HND",
    decode_replicas: Literal["first", "all"] = "first",
    cost_model: CostModel | None = None,
    decode_dp_group: int = 0,
) -> TransferCost:
    """One request's cost on a pairing, planned for this call: a router costing many requests
    keeps a ``Pairing`` and calls ``Pairing.cost``, which plans once.

    :param model: The model: a ``ModelShape``, a preset name, or a config path.
    :param prefill: The prefill side's layout.
    :param decode: The decode side's layout.
    :param tokens: The request's length.
    :param decode_prefix: Tokens the decode side already holds.
    :param prefill_page_size: Tokens a prefill page; None: the model's.
    :param decode_page_size: Tokens a decode page; None: the model's.
    :param kv_layout: How KV pages store tokens, ``"HND"`` or ``"NHD"``.
    :param decode_replicas: Which decode ranks of a replica group receive.
    :param cost_model: The engine's figures; None: ``CostModel()``.
    :param decode_dp_group: The decode DP group the request lands on.
    """
    pairing = Pairing(
        model,
        prefill,
        decode,
        prefill_page_size=prefill_page_size,
        decode_page_size=decode_page_size,
        kv_layout=kv_layout,
        decode_replicas=decode_replicas,
        cost_model=cost_model,
        decode_dp_group=decode_dp_group,
    )
    return pairing.cost(tokens, decode_prefix=decode_prefix)
