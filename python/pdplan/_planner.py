"""``PDTransferPlanner``: the reference's planner API over the compiled core."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:  # numpy loads when an array is first made, not when pdplan is imported
    import numpy as np
    import numpy.typing as npt

from pdplan import _core
from pdplan._bounded import bounded_tuple
from pdplan._model import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    RankTransferPlan,
    TransferFragment,
)

__all__ = ["LostRange", "PDTransferPlanner", "RoutingTable"]


class RoutingTable(NamedTuple):
    """Whole-cluster routing: one row per (decode rank, prefill rank) pair that moves data or
    must hear "done" (a notify-only pair: 0 fragments, 0 bytes; see
    ``RankTransferPlan.notify_prefill_ranks``), decode rank then prefill rank ascending.
    Identity pairs count one whole item per buffer."""

    decode_rank: npt.NDArray[np.int64]
    """Each row's decode rank."""
    prefill_rank: npt.NDArray[np.int64]
    """Each row's prefill rank."""
    fragment_count: npt.NDArray[np.int64]
    """Fragments the pair moves (0 for a notify-only pair)."""
    bytes_per_page: npt.NDArray[np.int64]
    """Bytes the pair's fragments move from each page, summed (0 for a notify-only pair)."""


class LostRange(NamedTuple):
    """Units of one buffer a decode rank cannot receive because no available prefill rank
    holds them (``PDTransferPlanner.lost``): ``unit_start`` up to ``unit_end`` (half-open) in
    the buffer's logical units (KV heads, state channels; ``0..logical_size`` of a replicated
    buffer) of layer ``layer``. ``cp_share`` is the prefill token share the units belong to
    when the prefill side deals tokens over CP or DCP ranks (the share's CP or DCP rank), else
    None: the lost bytes are those units of the tokens that share holds."""

    buffer_index: int
    """The buffer (its ``BufferLayout.buffer_index``)."""
    layer: int | None
    """The buffer's ``layer``, None where the buffers name none."""
    unit_start: int
    """The first lost unit."""
    unit_end: int
    """One past the last lost unit."""
    cp_share: int | None = None
    """The prefill token share the units belong to (its CP or DCP rank), or None."""
    buffer_kind: BufferKind | None = None
    """The buffer's kind: a ``buffer_index`` names one buffer within its kind's space (KV
    buffers and state buffers may each count from 0, as the reference runtime numbers them).
    None only in a ``LostRange`` made by hand."""


class PDTransferPlanner:
    """Plans prefill -> decode transfers for one pair of layouts.

    Construction validates both sides and counts every prefill rank's fanout;
    ``plan_for_decode_rank`` then answers one decode rank at a time. All of it runs in Rust.
    """

    def __init__(
        self,
        *,
        prefill_layout: ParallelLayout,
        decode_layout: ParallelLayout,
        prefill_buffers: Sequence[BufferLayout],
        decode_buffers: Sequence[BufferLayout],
        decode_replicas: Literal["first", "all"] = "first",
        token_maps: bool = False,
    ) -> None:
        """Sides the planner cannot serve are refused with ``UnsupportedPDLayoutError``, whose
        message says what to change.

        :param prefill_layout: The prefill side's ranks (``role="prefill"``).
        :param decode_layout: The decode side's ranks (``role="decode"``).
        :param prefill_buffers: The prefill side's buffers, one for each decode buffer, in the
            same order.
        :param decode_buffers: The decode side's buffers.
        :param decode_replicas: Which decode ranks of a replica group (decode TP above the
            KV-head count) receive a sharded buffer: ``"first"`` (the reference's semantics)
            only the group's first rank, and the runtime copies inside the group; ``"all"``
            every decode rank, directly, spread over the prefill ranks that hold the same heads
            so that the largest fanout is as small as it can be.
        :param token_maps: ``True`` gives the fragments of token-indexed buffers (``kv_head``,
            ``replicated``) the token geometry of both sides, so a request can move tokens by
            slot maps (``PreparedTransfer.token_descriptors``); it is on by itself where a
            token-indexed buffer's page sizes differ between the sides, which only slot maps
            can move, or a buffer has a ``sliding_window``, which selects tokens. Such
            fragment lists encode as wire format v3 (v4 with a window).
        """
        self._prefill_layout = prefill_layout
        self._decode_layout = decode_layout
        self._prefill_buffers = bounded_tuple(
            prefill_buffers, "prefill_buffers", "MAX_LAYOUT_BUFFERS"
        )
        self._decode_buffers = bounded_tuple(decode_buffers, "decode_buffers", "MAX_LAYOUT_BUFFERS")
        self._decode_replicas = decode_replicas
        self._unavailable: frozenset[int] = frozenset()
        self._core = _core.Planner(
            prefill_layout,
            decode_layout,
            self._prefill_buffers,
            self._decode_buffers,
            decode_replicas,
            token_maps,
        )

    # What the planner was built from, read-only: a plan is only ever of these.
    @property
    def prefill_layout(self) -> ParallelLayout:
        """The prefill side's layout, as given."""
        return self._prefill_layout

    @property
    def decode_layout(self) -> ParallelLayout:
        """The decode side's layout, as given."""
        return self._decode_layout

    @property
    def prefill_buffers(self) -> tuple[BufferLayout, ...]:
        """The prefill side's buffers, as given (a tuple)."""
        return self._prefill_buffers

    @property
    def decode_buffers(self) -> tuple[BufferLayout, ...]:
        """The decode side's buffers, as given (a tuple)."""
        return self._decode_buffers

    @property
    def decode_replicas(self) -> Literal["first", "all"]:
        """Which decode ranks of a replica group receive: ``"first"`` or ``"all"``, as
        given."""
        return self._decode_replicas

    @property
    def unavailable_prefill_ranks(self) -> frozenset[int]:
        """The prefill ranks this planner plans around (``without_prefill_ranks``); empty for
        a planner of every rank."""
        return self._unavailable

    def without_prefill_ranks(self, ranks: Iterable[int]) -> PDTransferPlanner:
        """This planner with the prefill ranks ``ranks`` unavailable (failed, timed out, never
        up), and any this one already lacks: the same layouts, buffers and options.

        Its plans read every byte that some available prefill rank of the read DP group and
        stage holds from exactly one such rank: an MLA latent from another TP rank, GQA heads
        from another rank of their replica group, replicated-CP tokens from another CP rank.
        Needs whose holder is up keep it; the others go to a holder the decode rank already
        reads from, else the least loaded, so the largest fanout stays as small as it can.
        Unavailable ranks send nothing, hear nothing and have fanout 0; what no available
        rank holds is ``lost``. DP groups without unavailable ranks plan as before.

        Both sides compute it alone: the same set, in any order or in any number of steps,
        gives equal plans and an equal ``fingerprint``. No ranks gives a planner that plans
        exactly as this one. Costs about what construction costs.

        :param ranks: The prefill ranks that are unavailable, ``0 .. world_size`` of the
            prefill side; ranks out of range, named twice or not ints are refused with
            ``UnsupportedPDLayoutError``.
        """
        planner = object.__new__(type(self))
        planner.__dict__.update(self.__dict__)
        planner._core = self._core.without_prefill_ranks(ranks)
        planner._unavailable = frozenset(planner._core.unavailable_prefill_ranks)
        return planner

    def lost(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        *,
        num_tokens: int | None = None,
    ) -> list[LostRange]:
        """What ``decode_rank`` cannot receive because no available prefill rank of the DP
        group it reads holds it, buffer order: recompute those layers (or heads, or the
        tokens of that CP share) or drop the request. Empty when nothing is lost, always so
        on a planner of every rank. Only what the decode rank receives counts: under
        ``decode_replicas="first"`` the non-first ranks of a replica group receive nothing
        and lose nothing.

        :param decode_rank: A rank of the decode side.
        :param prefill_dp_group: The prefill DP group it reads, as in ``plan_for_decode_rank``.
        :param num_tokens: The request's length, as in ``plan_for_decode_rank``.
        """
        return [
            LostRange(*row[:5], BufferKind(row[5]))
            for row in self._core.lost(decode_rank, prefill_dp_group, num_tokens)
        ]

    @property
    def is_staged(self) -> bool:
        """Whether either side runs pipeline stages (and buffers are placed by ``layer``)."""
        return self._core.is_staged

    def plan_for_decode_rank(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        *,
        num_tokens: int | None = None,
    ) -> RankTransferPlan:
        """The plan for one decode rank.

        ``target_dp_group`` is the prefill DP group read from, and
        ``required_dst_info_num_by_prefill_rank`` counts, for each source, the decode ranks one
        request makes it wait for.

        With context parallelism the sources are the prefill ranks holding some of the decode
        rank's tokens: for ``"interleave"`` splits those whose shares meet for a request of at
        least one period; for ``"contiguous"`` and ``"zigzag"`` (whose shares depend on the
        length) every rank that may hold some of them.

        :param decode_rank: A rank of the decode side, ``0 .. world_size``.
        :param prefill_dp_group: The prefill DP group the request was sent to. By default
            decode DP group ``g`` reads from prefill DP group ``g % prefill dp_size`` (the
            reference's ``g``, wherever the reference plans); a router that sends a request to
            another prefill DP group passes it here.
        :param num_tokens: The request's length: ``num_tokens=n`` gives the exact sources,
            response counts and fanouts of a request of ``n`` tokens, for every split (without
            CP it changes nothing).
        """
        plan: RankTransferPlan = self._core.plan_for_decode_rank(
            decode_rank, prefill_dp_group, num_tokens
        )
        return plan

    def transfer_fragments(
        self,
        decode_rank: int,
        prefill_dp_group: int | None = None,
        *,
        num_tokens: int | None = None,
    ) -> dict[int, tuple[TransferFragment, ...]]:
        """The fragments ``decode_rank`` receives, by prefill rank, for both plan kinds.

        A fragmented plan gives its own fragments; an identity plan (which carries none: the
        runtime copies whole items) gives one whole-item fragment per buffer, so the same
        wire and descriptor path serves both. Contiguous pages of a whole-item copy coalesce
        into one descriptor per run.

        :param decode_rank: A rank of the decode side.
        :param prefill_dp_group: The prefill DP group it reads, as in ``plan_for_decode_rank``.
        :param num_tokens: The request's length, as in ``plan_for_decode_rank``.
        """
        fragments: dict[int, tuple[TransferFragment, ...]] = self._core.transfer_fragments(
            decode_rank, prefill_dp_group, num_tokens
        )
        return fragments

    def verify(self, *, num_tokens: int | None = None) -> None:
        """Check every plan against the layouts, in Rust without the GIL.

        For every decode rank and buffer, every byte of its shard of each page must be written
        exactly once, from a prefill rank of its DP group that holds that same logical unit,
        inside both items; with context parallelism, once for each prefill token share that
        holds some of the decode rank's tokens, and never from a rank that holds none of them;
        and every prefill rank's fanout must equal the number of decode ranks whose plans name
        it. On a planner ``without_prefill_ranks``, the bytes no available rank holds (found
        from the layouts, rank by rank) must be written by nobody and be what ``lost``
        reports, every other byte exactly once, and no plan may name an unavailable rank.
        Raises ``UnsupportedPDLayoutError`` naming the first gap, overlap or wrong source.

        :param num_tokens: Checks the plans of a request of that many tokens (as
            ``plan_for_decode_rank(..., num_tokens=)`` gives them); None: the plans without it.
        """
        self._core.verify(num_tokens)

    def routing_table(self) -> RoutingTable:
        """Who talks to whom across the whole cluster, computed in Rust without the GIL."""
        return RoutingTable(*self._core.routing_table())

    @property
    def fingerprint(self) -> str:
        """A short stable hash (16 hex digits) of both sides' layouts and buffers, the
        decode-replica mode, token maps, the wire versions and pdplan's planning rules: two
        sides that built their planners from exchanged layouts compare it once, and equal
        fingerprints mean equal plans."""
        return self._core.fingerprint

    def check_layout(self, layout: ParallelLayout, buffers: Sequence[BufferLayout]) -> None:
        """Refuses a side's layout and buffers (a peer's, from ``decode_layout``) that differ
        from this planner's own view of that side (``layout.role``), naming the first field
        that differs: ``decode buffer 17 (layer 8, target_v): bytes_per_logical_unit 256 vs
        128`` (this planner's value first).

        :param layout: The side's layout; its ``role`` says which side it is compared with.
        :param buffers: That side's buffers.
        """
        self._core.check_layout(layout, buffers)

    @property
    def token_maps(self) -> bool:
        """Whether fragments carry token geometry (asked for, page sizes differ, or a buffer
        has a sliding window)."""
        return self._core.token_maps

    @property
    def idle_decode_ranks(self) -> int:
        """Decode ranks that receive nothing at all. Under ``decode_replicas="first"`` these
        are the non-first ranks of every decode replica group (when no buffer is replicated):
        the runtime must copy to them inside the group, or plan with ``decode_replicas="all"``.
        Under either mode, ranks of a decode pipeline stage that holds none of the buffers'
        layers receive nothing too."""
        return self._core.idle_decode_ranks

    @property
    def source_fanout(self) -> dict[int, int]:
        """For every prefill rank, how many decode ranks one request makes it wait for, under
        the default DP-group mapping (0 for ranks of prefill DP groups no decode group reads by
        default). Equal to the reference's table wherever the reference plans. A copy."""
        return self._core.source_fanout()
