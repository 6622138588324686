"""A decode rank's reads from one source rank, gathered over a step's requests and handed to
the engine at once: flat ``(local, remote, length)`` columns, or NIXL 1.5's strided rows where
the engine takes them (``strided_descriptors``: a run of pages one row a buffer) and they
compress: rows that stand for fewer than two blocks each on average are read flat (through
NIXL here, rows a block each were sometimes slower than flat descriptors, compressed rows as
fast or faster: benches/nixl_strided.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pdplan._descriptors import StridedDescriptors, TransferDescriptors
from pdplan.connectors._engines import TransferEngine


class Reads:
    """What one source rank is read for: each part a request's (or a slice's) descriptors."""

    def __init__(self, strided: bool) -> None:
        self.strided = strided
        self._parts: list[tuple[Any, ...]] = []

    def add(self, prepared: Any, src_pages: Any, dst_pages: Any, **request: Any) -> None:
        """A request's pages (``descriptors``' arguments, slices included)."""
        if self.strided:
            rows: StridedDescriptors = prepared.strided_descriptors(src_pages, dst_pages, **request)
            if rows.num_entries:
                self._parts.append((rows.dst, rows.src))  # read: local is the decode side
        else:
            flat: TransferDescriptors = prepared.descriptors(src_pages, dst_pages, **request)
            if flat.num_descriptors:
                self._parts.append((flat.dst_addrs, flat.src_addrs, flat.lengths))

    def extend(self, other: Reads) -> None:
        self._parts += other._parts

    def __bool__(self) -> bool:
        return bool(self._parts)

    def start(self, engine: TransferEngine, peer: bytes) -> Any:
        """One engine read of every part: its handle (None when nothing is to be read)."""
        if not self._parts:
            return None
        columns = [np.concatenate(column) for column in zip(*self._parts)]
        if not self.strided:
            return engine.read(peer, columns[0], columns[1], columns[2])
        local, remote = columns
        if 2 * len(local) > int(local[:, 4].sum()):
            flat = StridedDescriptors(remote, local).expand()  # too few blocks a row
            return engine.read(peer, flat.dst_addrs, flat.src_addrs, flat.lengths)
        return engine.read_strided(peer, local, remote)
