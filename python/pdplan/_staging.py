"""The cost model that says, per rank pair and request, whether staging pays.

``PreparedTransfer.staging_plan`` (Rust) regroups a request's direct descriptors into a gather,
a transfer and a scatter; this module weighs the two ways with a handful of figures.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from pdplan import _core
from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError

#: The descriptor forms a cost model weighs: flat descriptors, NIXL 1.5's strided lists, a
#: staging plan.
FORMS = ("flat", "strided", "staging")
#: The cost model's five staging figures, in the order the core takes them.
_STAGING_FIGURES = (
    "per_descriptor_s",
    "network_bytes_per_s",
    "copy_bytes_per_s",
    "per_copy_s",
    "per_segment_s",
)
#: A strided row's and a block's costs, by default: the default ``per_descriptor_s`` split as
#: NIXL's GPU path spends it, 57% posting the descriptor (a row posts once) and 43% moving
#: its block (NIXL's cuda_ipc path, as measured in adopting NIXL 1.5's strided lists).
PER_ROW_S = 0.57 * 0.27e-6
PER_BLOCK_S = 0.43 * 0.27e-6

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np
    import numpy.typing as npt

    from pdplan._core import PreparedTransfer, StagingPlan

    IntColumn = npt.NDArray[np.integer] | Sequence[int]
    Buffers = range | IntColumn | None

__all__ = ["CostEstimate", "CostModel", "FormEstimate", "StagingCounts"]


class StagingCounts(NamedTuple):
    """What one request's staging plan counts (``StagingPlan.counts``,
    ``PreparedTransfer.staging_counts``): descriptors sent directly, descriptors of the wire
    hop between the staging buffers, of the gather and of the scatter, and the bytes moved."""

    direct_descriptors: int
    """Descriptors the engine would send without staging."""
    wire_descriptors: int
    """Descriptors of the wire hop between the staging buffers: one, or one per chunk."""
    gather_descriptors: int
    """Copies into the source staging buffer (runs that continue each other in the source
    cache merge)."""
    scatter_descriptors: int
    """Copies out of the destination staging buffer (merged where the destination
    continues)."""
    bytes: int
    """Bytes the request moves (the staging buffer's size)."""


@dataclass(frozen=True)
class CostEstimate:
    """Seconds one request takes each way, and what the model chooses."""

    direct_s: float
    """Seconds of the direct transfer: the wire's roofline over the direct descriptors."""
    staging_s: float
    """Seconds staged: ``gather_s + wire_s + scatter_s``."""
    gather_s: float
    """Seconds of the gather into the source staging buffer (0 with nothing to copy)."""
    wire_s: float
    """Seconds of the wire hop between the staging buffers (the same roofline)."""
    scatter_s: float
    """Seconds of the scatter out of the destination staging buffer (0 with nothing to
    copy)."""
    direct_descriptors: int
    """Descriptors of the direct transfer (``StagingCounts.direct_descriptors``)."""
    wire_descriptors: int
    """Descriptors of the wire hop (``StagingCounts.wire_descriptors``)."""
    bytes: int
    """Bytes the request moves."""

    @classmethod
    def total(cls, estimates: Sequence[CostEstimate]) -> CostEstimate:
        """Several transfers of one request (say its KV and its state), one after another:
        every field summed.

        :param estimates: The transfers' estimates.
        """
        return cls(*(sum(getattr(e, name) for e in estimates) for name in cls.__dataclass_fields__))

    @property
    def choice(self) -> Literal["direct", "staging"]:
        """``"staging"`` where it takes less time than the direct transfer, else
        ``"direct"``."""
        return "staging" if self.staging_s < self.direct_s else "direct"

    @property
    def bytes_per_descriptor(self) -> float:
        """Bytes a direct descriptor moves on average."""
        return self.bytes / self.direct_descriptors if self.direct_descriptors else 0.0


@dataclass(frozen=True)
class FormEstimate:
    """Seconds one request takes in each descriptor form the engine takes, and the form of
    least time (``CostModel.choose_form``); of forms that tie (the bytes bound them all), the
    one posting least, then flat (the default form), then strided."""

    form: Literal["flat", "strided", "staging"]
    """The form of least time."""
    flat_s: float
    """Seconds as flat descriptors: the wire's roofline over them."""
    strided_s: float | None
    """Seconds as strided lists (``rows * per_row_s + blocks * per_block_s`` against the
    bytes' time); None where the engine takes none."""
    staging_s: float | None
    """Seconds staged (``CostEstimate.staging_s``); None where the runtime does not stage."""
    descriptors: int
    """Flat descriptors (coalesced)."""
    strided_rows: int | None
    """Rows of the strided lists; None where not asked."""
    bytes: int
    """Bytes the request moves."""

    @property
    def seconds(self) -> float:
        """The chosen form's seconds."""
        chosen = {"flat": self.flat_s, "strided": self.strided_s, "staging": self.staging_s}
        return float(chosen[self.form] or 0.0)


@dataclass(frozen=True)
class CostModel:
    """Figures of one deployment's engine, network and copies.

    The wire is a roofline: a transfer takes the longer of ``descriptors * per_descriptor_s``
    and ``bytes / network_bytes_per_s``. A gather or scatter takes ``per_copy_s + segments *
    per_segment_s + bytes / copy_bytes_per_s``. Staging is gather + wire (its few descriptors)
    + scatter, not overlapped.

    The defaults describe GPU caches behind one 400 Gb/s RDMA NIC:

    - ``per_descriptor_s`` 0.27 µs: NIXL (UCCL backend) moved 1 KiB descriptors at 3.78 GB/s
      on one rail, 3.7 M descriptors/s (LMCache/LMCache#4161). Mooncake managed 2.1 M/s with
      576-byte descriptors in a DCP 8 deployment (1.23 GB/s, sgl-project/sglang#35186), 0.47
      µs; at that figure 16 KiB descriptors are no longer bandwidth-bound.
    - ``network_bytes_per_s`` 50e9: one ConnectX-7 port at 400 Gb/s (NDR).
    - ``copy_bytes_per_s`` 1.675e12: H100 SXM HBM3 at 3.35 TB/s, halved because a copy reads
      and writes every byte.
    - ``per_copy_s`` 5 µs: a kernel launch and its wait, a few microseconds (NVIDIA, "Getting
      Started with CUDA Graphs").
    - ``per_segment_s`` 0: a GPU kernel copies segments in parallel; their cost is in the
      bandwidth. For host copies, calibrate it (``benches/staging.py``).
    - ``per_row_s`` 0.154 µs and ``per_block_s`` 0.116 µs: a strided list's row and each
      block of a row, ``per_descriptor_s`` split as NIXL's ``cuda_ipc`` path spends it (57%
      posting, which a row does once; 43% the block's own work), so rows win once they stand
      for more than one block each. UCX on loopback here is another engine: a row costs
      almost nothing and a block about a flat descriptor (``benches/posting.py``). A runtime
      measures its own at start (``calibrate_posting``).
    """

    per_descriptor_s: float = 0.27e-6
    """Seconds the engine takes per descriptor."""
    network_bytes_per_s: float = 50e9
    """The network's bandwidth, in bytes a second."""
    copy_bytes_per_s: float = 1.675e12
    """A gather's or scatter's bandwidth, in bytes a second (reading and writing each byte)."""
    per_copy_s: float = 5e-6
    """Seconds a gather or scatter takes however small (a kernel launch and its wait)."""
    per_segment_s: float = 0.0
    """Seconds a gather or scatter takes per segment it copies."""
    per_row_s: float = PER_ROW_S
    """Seconds the engine takes per row of a strided list (NIXL 1.5's N x 5 rows)."""
    per_block_s: float = PER_BLOCK_S
    """Seconds the engine takes per block a strided row stands for."""

    def __post_init__(self) -> None:
        _core.check_cost_model(self._figures())
        _core.check_strided_costs(*self._strided_costs())

    def _strided_costs(self) -> tuple[float, float]:
        return self._numbers("per_row_s", "per_block_s")  # type: ignore[return-value]

    def _figures(self) -> tuple[float, float, float, float, float]:
        a, b, c, d, e = self._numbers(*_STAGING_FIGURES)
        return a, b, c, d, e

    def _numbers(self, *names: str) -> tuple[float, ...]:
        figures = []
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UnsupportedPDLayoutError(
                    f"CostModel.{name} must be a number, got {type(value).__name__}"
                )
            figures.append(float(value))
        return tuple(figures)

    def choose_form(
        self,
        prepared: PreparedTransfer,
        src_pages: IntColumn,
        dst_pages: IntColumn,
        *,
        buffers: Buffers = None,
        forms: Sequence[str] = FORMS,
        chunk_bytes: int | None = None,
    ) -> FormEstimate:
        """The descriptor form that moves one request of page pairs soonest. Its strided lists
        are built (to count their rows); staging is counted, not built.

        :param prepared: The rank pair's ``PreparedTransfer``.
        :param src_pages: The request's source pages, as for ``PreparedTransfer.descriptors``.
        :param dst_pages: The destination pages they pair with.
        :param buffers: The buffers moved (a ``range`` or indexes); None: all.
        :param forms: The forms the engine and runtime take, of ``"flat"``, ``"strided"``
            (NIXL 1.5; not Mooncake) and ``"staging"``; flat is always one.
        :param chunk_bytes: The staged wire hop's chunk size; None: one transfer.
        """
        offered = _forms(forms)
        prepared = _prepared(prepared, "choose_form")
        counts = prepared.staging_counts(
            src_pages, dst_pages, buffers=buffers, chunk_bytes=chunk_bytes
        )
        rows = None
        if "strided" in offered:
            strided = prepared.strided_descriptors(src_pages, dst_pages, buffers=buffers)
            rows = (strided.num_entries, strided.num_descriptors)
        return self.choose_form_counts(counts, strided=rows, staging="staging" in offered)

    def choose_form_counts(
        self,
        counts: StagingCounts | tuple[int, int, int, int, int],
        *,
        strided: tuple[int, int] | None = None,
        staging: bool = True,
    ) -> FormEstimate:
        """The descriptor form of least time for a request's counts.

        :param counts: Its staging counts (``PreparedTransfer.staging_counts``).
        :param strided: Its strided lists' (rows, blocks) (``StridedDescriptors.num_entries``
            and ``num_descriptors``); None: the engine takes no strided lists.
        :param staging: Whether the runtime may stage it.
        """
        counts = StagingCounts(*_five_counts(counts, "choose_form_counts"))
        strided = _strided_counts(strided, staging)
        flat_s, strided_s, staging_s, form = _core.estimate_forms(
            counts, strided, staging, _checked_figures(self), self._strided_costs()
        )
        return FormEstimate(
            form=form,  # type: ignore[arg-type]
            flat_s=flat_s,
            strided_s=strided_s,
            staging_s=staging_s,
            descriptors=counts.direct_descriptors,
            strided_rows=None if strided is None else strided[0],
            bytes=counts.bytes,
        )

    def estimate_counts(
        self, counts: StagingCounts | tuple[int, int, int, int, int]
    ) -> CostEstimate:
        """The estimate for a request's staging counts.

        :param counts: The counts, as ``StagingPlan.counts`` and
            ``PreparedTransfer.staging_counts`` give them (or the same five as a plain tuple).
        """
        counts = StagingCounts(*_five_counts(counts, "estimate_counts"))
        direct, staging, gather, wire, scatter = _core.estimate_staging(
            counts, _checked_figures(self)
        )
        return CostEstimate(
            direct_s=direct,
            staging_s=staging,
            gather_s=gather,
            wire_s=wire,
            scatter_s=scatter,
            direct_descriptors=counts.direct_descriptors,
            wire_descriptors=counts.wire_descriptors,
            bytes=counts.bytes,
        )

    def estimate_plan(self, plan: StagingPlan) -> CostEstimate:
        """The estimate for a staging plan already built.

        :param plan: The plan (its ``counts``).
        """
        if not isinstance(plan, _core.StagingPlan):
            raise UnsupportedPDLayoutError(
                f"estimate_plan takes a StagingPlan, got {type(plan).__name__}"
            )
        return self.estimate_counts(plan.counts)

    def estimate(
        self,
        prepared: PreparedTransfer,
        src_pages: IntColumn,
        dst_pages: IntColumn,
        *,
        buffers: Buffers = None,
        chunk_bytes: int | None = None,
    ) -> CostEstimate:
        """Direct against staged for one request of page pairs (counted, not built).

        :param prepared: The rank pair's ``PreparedTransfer``.
        :param src_pages: The request's source pages, as for ``PreparedTransfer.descriptors``.
        :param dst_pages: The destination pages they pair with.
        :param buffers: The buffers moved (a ``range`` or indexes); None: all.
        :param chunk_bytes: The wire hop's chunk size; None: one transfer.
        """
        counts = _prepared(prepared, "estimate").staging_counts(
            src_pages, dst_pages, buffers=buffers, chunk_bytes=chunk_bytes
        )
        return self.estimate_counts(counts)

    def estimate_tokens(
        self,
        prepared: PreparedTransfer,
        src_slots: IntColumn,
        dst_slots: IntColumn,
        *,
        buffers: Buffers = None,
        chunk_bytes: int | None = None,
    ) -> CostEstimate:
        """Direct against staged for one request of slot maps (counted, not built).

        :param prepared: The rank pair's ``PreparedTransfer``.
        :param src_slots: The source rank's slot map, as for
            ``PreparedTransfer.token_descriptors``.
        :param dst_slots: The destination rank's slot map.
        :param buffers: The buffers moved (a ``range`` or indexes); None: all.
        :param chunk_bytes: The wire hop's chunk size; None: one transfer.
        """
        counts = _prepared(prepared, "estimate_tokens").token_staging_counts(
            src_slots, dst_slots, buffers=buffers, chunk_bytes=chunk_bytes
        )
        return self.estimate_counts(counts)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64


def _five_counts(counts: object, method: str) -> tuple[int, int, int, int, int]:
    if (
        not isinstance(counts, tuple)
        or len(counts) != len(StagingCounts._fields)
        or not all(_count(c) for c in counts)
    ):
        raise UnsupportedPDLayoutError(
            f"{method} takes the five staging counts, ints of at least 0 (StagingCounts: "
            f"{', '.join(StagingCounts._fields)}), got {shown(counts)}"
        )
    a, b, c, d, e = counts
    return a, b, c, d, e


def _strided_counts(strided: object, staging: object) -> tuple[int, int] | None:
    if strided is not None and not (
        isinstance(strided, tuple) and len(strided) == 2 and all(_count(c) for c in strided)
    ):
        raise UnsupportedPDLayoutError(
            "strided must be None or (rows, blocks), two ints of at least 0 "
            f"(StridedDescriptors.num_entries, num_descriptors), got {shown(strided)}"
        )
    if not isinstance(staging, bool):
        raise UnsupportedPDLayoutError(f"staging must be True or False, got {shown(staging)}")
    return strided


def _forms(forms: object) -> frozenset[str]:
    chosen = frozenset(forms) if isinstance(forms, (tuple, list, set, frozenset)) else None
    if chosen is None or not chosen <= set(FORMS):
        raise UnsupportedPDLayoutError(
            f"forms must be a sequence of {', '.join(map(repr, FORMS))}, got {shown(forms)}"
        )
    return chosen | {"flat"}


def _prepared(value: object, method: str) -> PreparedTransfer:
    if not isinstance(value, _core.PreparedTransfer):
        raise UnsupportedPDLayoutError(
            f"CostModel.{method} takes a PreparedTransfer, got {type(value).__name__}"
        )
    return value


@functools.lru_cache(maxsize=64)
def _checked_figures(model: CostModel) -> tuple[float, float, float, float, float]:
    """A model's figures, read once: estimates are on a router's per-request path."""
    return model._figures()
