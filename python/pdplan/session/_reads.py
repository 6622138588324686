"""A decode rank's reads from one source rank, gathered over a step's requests and handed to
the engine at once: flat ``(local, remote, length)`` columns, or NIXL 1.5's strided rows where
the engine takes them (``strided_descriptors``: a run of pages one row a buffer) and the cost
model says they take less time, or as long and post less (``CostModel.choose_form_counts``: a
row each and a block each against a flat descriptor each; at its defaults rows win where they
stand for more than one block each on average)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pdplan._descriptors import StridedDescriptors, TransferDescriptors
from pdplan._staging import CostModel
from pdplan.session._engines import TransferEngine


class Reads:
    """What one source rank is read for: each part a request's (or a slice's) descriptors."""

    def __init__(self, strided: bool, model: CostModel | None = None) -> None:
        self.strided = strided
        self.model = model or _DEFAULT_MODEL
        self._parts: list[tuple[Any, ...]] = []
        #: Bytes its parts move (a request's share of a read, for its log line).
        self.bytes = 0
        #: What ``start`` posted: bytes, flat descriptors, strided rows.
        self.posted = (0, 0, 0)

    def add(self, source: Any, *pages: Any, **request: Any) -> None:
        """A request's (or a slice's) descriptors: of a ``PreparedTransfer`` and its pages
        (``descriptors``' arguments), or of a ``PreparedRequest`` (its pages read once)."""
        if self.strided:
            rows: StridedDescriptors = source.strided_descriptors(*pages, **request)
            if rows.num_entries:
                self._parts.append((rows.dst, rows.src))  # read: local is the decode side
                self.bytes += int((rows.dst[:, 1] * rows.dst[:, 4]).sum())
        else:
            flat: TransferDescriptors = source.descriptors(*pages, **request)
            if flat.num_descriptors:
                self._parts.append((flat.dst_addrs, flat.src_addrs, flat.lengths))
                self.bytes += int(flat.lengths.sum())

    def add_tokens(self, source: Any, src_slots: Any, dst_slots: Any, *, buffers: Any) -> None:
        """A request's descriptors of ``buffers`` token by token (``token_descriptors``: the
        two sides' blocks hold other token counts), flat whatever the form: a token's bytes
        are no run of pages a strided row could stand for."""
        flat: TransferDescriptors = source.token_descriptors(src_slots, dst_slots, buffers=buffers)
        if flat.num_descriptors:
            if self.strided:  # rows of one descriptor each, read as the strided form reads
                self._parts.append(_rows_of(flat))
            else:
                self._parts.append((flat.dst_addrs, flat.src_addrs, flat.lengths))
            self.bytes += int(flat.lengths.sum())

    def extend(self, other: Reads) -> None:
        """Takes in ``other``'s parts (read by this one's form and model)."""
        self._parts += other._parts
        self.bytes += other.bytes

    def __bool__(self) -> bool:
        return bool(self._parts)

    def start(self, engine: TransferEngine, peer: bytes) -> Any:
        """One engine read of every part: its handle (None when nothing is to be read)."""
        if not self._parts:
            return None
        columns = [np.concatenate(column) for column in zip(*self._parts)]
        if not self.strided:
            self.posted = (int(columns[2].sum()), len(columns[2]), 0)
            return engine.read(peer, columns[0], columns[1], columns[2])
        local, remote = columns
        blocks = int(local[:, 4].sum())
        moved = int((local[:, 1] * local[:, 4]).sum())
        counts = (blocks, 0, 0, 0, moved)
        choice = self.model.choose_form_counts(counts, strided=(len(local), blocks), staging=False)
        if choice.form == "flat":
            flat = StridedDescriptors(remote, local).expand()
            self.posted = (moved, len(flat.lengths), 0)
            return engine.read(peer, flat.dst_addrs, flat.src_addrs, flat.lengths)
        self.posted = (moved, 0, len(local))
        return engine.read_strided(peer, local, remote)


_DEFAULT_MODEL = CostModel()


def _rows_of(flat: TransferDescriptors) -> tuple[Any, Any]:
    """Flat descriptors as strided rows of one block each, ``(local, remote)`` as a read
    lists them: (address, length, device 0, stride = length, count 1)."""
    n = len(flat.lengths)

    def rows(addresses: Any) -> Any:
        out = np.zeros((n, 5), np.uint64)
        out[:, 0], out[:, 1], out[:, 3], out[:, 4] = addresses, flat.lengths, flat.lengths, 1
        return out

    return rows(flat.dst_addrs), rows(flat.src_addrs)
