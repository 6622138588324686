"""Wire format v1 encoding: the Python side reads the fields, Rust checks them and writes JSON."""

from __future__ import annotations

from collections.abc import Iterable

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import TransferFragment

__all__ = ["encode_transfer_fragments"]


def encode_transfer_fragments(fragments: Iterable[TransferFragment]) -> tuple[bytes, bytes]:
    """The (version, payload) frames of ``fragments``: ``b"1"`` and compact JSON, keys in field
    order, byte-identical to the reference encoder. Every integer must lie in [0, 2^63)."""
    try:
        # Attribute reads in a comprehension use CPython's specialised loads: the cheapest way
        # to get at dataclass fields, from Python or from the C API.
        rows = [
            (
                f.buffer_index,
                f.buffer_kind,
                f.src_rank,
                f.dst_rank,
                f.src_page_stride_bytes,
                f.dst_page_stride_bytes,
                f.src_byte_offset,
                f.dst_byte_offset,
                f.bytes_per_page,
                f.page_count,
            )
            for f in fragments
        ]
    except (AttributeError, TypeError) as exc:
        raise UnsupportedPDLayoutError(
            f"fragments must be an iterable of TransferFragment objects: {exc}"
        ) from None
    return _core.encode_fragment_rows(rows)
