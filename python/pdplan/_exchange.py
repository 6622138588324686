"""Layouts exchanged once (``encode_layout``, ``decode_layout``): each side sends its parallel
layout, buffers and one rank's base addresses and limits; both build the same planner, and a
request then needs only its pages or slot maps (``PreparedTransfer.from_layouts``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from pdplan import _core
from pdplan._model import BufferLayout, ParallelLayout

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    _Ints = npt.NDArray[np.integer] | Sequence[int]

__all__ = ["LAYOUT_VERSION_FRAME", "PeerLayout", "decode_layout", "encode_layout"]

#: The version frame of the layout frames this build writes and reads.
LAYOUT_VERSION_FRAME = b"layout/1"


class PeerLayout(NamedTuple):
    """What a layout frame holds: one side's layout and buffers, and the sending rank's base
    addresses and limits (``None`` when it sent none)."""

    layout: ParallelLayout
    """The peer side's layout."""
    buffers: tuple[BufferLayout, ...]
    """The peer side's buffers."""
    base_ptrs: tuple[int, ...] | None
    """The sending rank's base address of each buffer, or None."""
    limits: tuple[int, ...] | None
    """How many bytes from each base may be touched, or None."""


def encode_layout(
    layout: ParallelLayout,
    buffers: Sequence[BufferLayout],
    *,
    base_ptrs: _Ints | None = None,
    limits: _Ints | None = None,
) -> tuple[bytes, bytes]:
    """One side as (version frame, payload frame): its layout and buffers, and optionally one
    rank's base addresses and limits (one of each for every buffer).

    :param layout: The side's layout.
    :param buffers: The side's buffers.
    :param base_ptrs: The sending rank's base address of each buffer; None: none sent.
    :param limits: How many bytes from each base may be touched (only with ``base_ptrs``);
        None: none sent.
    """
    version, payload = _core.encode_layout(layout, buffers, base_ptrs=base_ptrs, limits=limits)
    return version, payload


def decode_layout(
    version_frame: bytes, payload_frame: bytes, *, max_payload_bytes: int | None = None
) -> PeerLayout:
    """A peer's layout frames, strictly: the version must be ``LAYOUT_VERSION_FRAME``, the
    payload at most ``max_payload_bytes``, every key present and none unknown, and every value
    valid as the dataclasses require. Raises ``UnsupportedPDLayoutError`` naming what is wrong.

    :param version_frame: The version frame, as ``encode_layout`` wrote it.
    :param payload_frame: The payload frame.
    :param max_payload_bytes: The longest payload accepted, refused on its length before it is
        parsed; None: ``pdplan.limits.DEFAULT_MAX_LAYOUT_BYTES`` (1 MiB).
    """
    fields, buffers, bases, limits = _core.decode_layout(
        version_frame, payload_frame, max_payload_bytes=max_payload_bytes
    )
    return PeerLayout(
        ParallelLayout(*fields),
        buffers,
        None if bases is None else tuple(bases),
        None if limits is None else tuple(limits),
    )
