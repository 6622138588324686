"""Per-request transfer descriptors: fragments x page pairs -> address arrays, built in Rust."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from pdplan import _core
from pdplan._model import TransferFragment

if TYPE_CHECKING:  # numpy loads when an array is first made, not when pdplan is imported
    import numpy as np
    import numpy.typing as npt

    IntColumn = npt.NDArray[np.integer] | Sequence[int]

__all__ = ["StridedDescriptors", "TransferDescriptors", "transfer_descriptors"]


class TransferDescriptors(NamedTuple):
    """(src address, dst address, length) descriptors as three equal-length uint64 arrays.

    Unpacks as ``src, dst, lengths = descriptors``. Mooncake takes the three sequences;
    NIXL takes ``descriptors.as_array()``, an N x 3 array of rows (src, dst, length).
    """

    src_addrs: npt.NDArray[np.uint64]
    """Where each descriptor reads."""
    dst_addrs: npt.NDArray[np.uint64]
    """Where each descriptor writes."""
    lengths: npt.NDArray[np.uint64]
    """Bytes each descriptor moves."""

    @property
    def num_descriptors(self) -> int:
        """How many descriptors (``len()`` of a NamedTuple is its field count, 3)."""
        return int(self.lengths.shape[0])

    @property
    def total_bytes(self) -> int:
        """Bytes all the descriptors move."""
        return int(self.lengths.sum(dtype="uint64"))

    def as_array(self) -> npt.NDArray[np.uint64]:
        """The descriptors as one C-contiguous N x 3 uint64 array: src, dst, length per row."""
        import numpy as np

        return np.column_stack((self.src_addrs, self.dst_addrs, self.lengths))


class StridedDescriptors(NamedTuple):
    """A request's descriptors as NIXL 1.5's strided lists: two N x 5 uint64 arrays of rows
    ``(address, length, device, stride, count)``, each row ``count`` blocks of ``length`` bytes
    spaced ``stride`` apart (``stride == length`` for a single block), ``src`` and ``dst``
    expanding to the same blocks in the same order; device 0 (``on_devices`` names others).
    Pass each to ``prep_xfer_dlist(..., mem_type="DRAM")`` (for a read, the local side is
    ``dst``), then ``make_prepped_xfer`` over ``range(num_descriptors)`` on both. ``expand()``
    gives the flat descriptors.
    """

    src: npt.NDArray[np.uint64]
    """Where the blocks are read: (address, length, device, stride, count) rows."""
    dst: npt.NDArray[np.uint64]
    """Where the blocks are written, row for row with ``src``."""

    @property
    def num_entries(self) -> int:
        """Rows of each list."""
        return int(self.src.shape[0])

    @property
    def num_descriptors(self) -> int:
        """Blocks the rows stand for: the flat descriptors they expand to."""
        return int(self.src[:, 4].sum(dtype="uint64"))

    @property
    def total_bytes(self) -> int:
        """Bytes all the blocks move."""
        return int((self.src[:, 1] * self.src[:, 4]).sum(dtype="uint64"))

    def on_devices(self, src_device: int, dst_device: int) -> StridedDescriptors:
        """The same lists with each side's device id (0, host memory, as built).

        :param src_device: NIXL's device id of the source memory.
        :param dst_device: NIXL's device id of the destination memory.
        """
        src, dst = self.src.copy(), self.dst.copy()
        src[:, 2], dst[:, 2] = src_device, dst_device
        return StridedDescriptors(src, dst)

    def expand(self) -> TransferDescriptors:
        """The flat (src, dst, length) descriptors, row by row, block by block."""
        import numpy as np

        counts = self.src[:, 4].astype(np.int64)
        rows = np.repeat(np.arange(len(counts)), counts)
        # The k-th block of its row: k = position - where the row's blocks start.
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        k = (np.arange(int(counts.sum())) - starts).astype(np.uint64)
        src = self.src[rows, 0] + k * self.src[rows, 3]
        dst = self.dst[rows, 0] + k * self.dst[rows, 3]
        return TransferDescriptors(src, dst, self.src[rows, 1].copy())


def transfer_descriptors(
    fragments: Iterable[TransferFragment],
    src_base_ptrs: IntColumn,
    dst_base_ptrs: IntColumn,
    src_pages: IntColumn,
    dst_pages: IntColumn,
    *,
    coalesce: bool = True,
    src_limits: IntColumn | None = None,
    dst_limits: IntColumn | None = None,
) -> TransferDescriptors:
    """Turn fragments x page pairs into transfer descriptors, in one pass without the GIL.

    For fragment ``f`` (in the given order), page pair ``i`` (in the given order) and row ``r``
    (``0 .. f.rows_per_page``): ``src = src_base_ptrs[f.buffer_index] + src_pages[i] *
    f.src_page_stride_bytes + f.src_byte_offset + r * f.src_row_stride_bytes``, the same for
    ``dst``, ``f.bytes_per_page // f.rows_per_page`` long (one descriptor a page, the whole
    ``bytes_per_page``, for a head-major fragment). A fragment's ``page_count`` limits it to the
    first ``page_count`` pairs.

    Anything that would point past a limit, negative pages, unequal page lengths, a buffer
    without a base pointer and 64-bit overflow raise ``UnsupportedPDLayoutError`` before any
    descriptor is returned. Safe on fragments decoded from the wire. Fragments between pages of
    different token counts do not pair page to page and are refused: build those from slot
    maps with ``PreparedTransfer.token_descriptors``.

    :param fragments: One rank pair's fragments.
    :param src_base_ptrs: Each source buffer's base address, indexed by ``buffer_index``.
    :param dst_base_ptrs: Each destination buffer's base address, indexed by
        ``buffer_index``.
    :param src_pages: The request's source pages, one per page pair: a 1-D numpy array of any
        integer dtype (or an int sequence).
    :param dst_pages: The destination pages they pair with, as many.
    :param coalesce: Neighbours within one buffer that continue each other on both sides (src
        end == next src and dst end == next dst) merge into one descriptor; without it the
        output equals the plain Python loop.
    :param src_limits: How many bytes from each source buffer's base may be touched, indexed
        by ``buffer_index``; None: no limit (only 64-bit overflow is refused).
    :param dst_limits: The same for the destination buffers.
    """
    return _core.transfer_descriptors(
        fragments,
        src_base_ptrs,
        dst_base_ptrs,
        src_pages,
        dst_pages,
        coalesce=coalesce,
        src_limits=src_limits,
        dst_limits=dst_limits,
    )
