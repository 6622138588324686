"""Prefill -> decode KV-cache transfer, end to end, through a real transfer engine.

    python examples/pd_transfer.py                 # Mooncake over TCP on loopback, a process a rank
    python examples/pd_transfer.py --engine nixl   # NIXL agents (UCX backend), a process a rank
    python examples/pd_transfer.py --loopback      # the same flow in one process, memmove engine

Each rank has its own engine and numpy KV caches filled with known values. The decode side plans
and sends every prefill rank its fragments only through the wire format; each prefill rank
turns the frames into a ``PreparedTransfer`` (parsed once, reused for byte-equal frames) whose
per-request descriptors are bounded by both sides' buffer sizes, and writes them into the decode
rank's caches. The coordinator then checks every decode cache byte for byte against the expected
reshard, guard bytes included.

The module doubles as the harness of the end-to-end tests (tests/test_end_to_end.py).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StagingPlan,
    encode_transfer_fragments,
)

GUARD = 0x5A  # every decode byte starts as this; bytes no fragment should touch stay so


@dataclass(frozen=True)
class Buffer:
    """One buffer of both sides: ``axis``, logical units, bytes per unit, per-side replicas;
    ``rows`` a page (token-major pages: a row per token) and the parts of a split axis.

    With ``page_sizes`` (prefill, decode tokens a page) the sides' pages may differ in size:
    ``unit_bytes`` is then one unit of one token (all planes), and ``planes`` > 0 makes pages
    token-major with ``planes x page_size`` rows (0: head-major)."""

    index: int
    kind: BufferKind
    axis: str
    logical_size: int
    unit_bytes: int
    prefill_replica: int = 1
    decode_replica: int = 1
    padding: int = 0  # extra bytes at the end of each row, never copied by fragments
    rows: int = 1
    parts: tuple[int, ...] | None = None
    layer: int | None = None
    page_sizes: tuple[int, int] | None = None
    groups: tuple[int, ...] | None = None  # each part's groups (copied below that many shards)
    planes: int = 0
    decode_planes: int | None = None  # None: as `planes`
    sliding_window: int | None = None  # a window layer's: a request moves its last tokens
    attention_chunk: int | None = None  # a chunked layer's: a request moves its current chunk

    def layout(self, tp: int, replica: int, side: int = 0) -> BufferLayout:
        shards = 1 if self.axis == "replicated" else tp // replica
        page_size, unit, rows = 16, self.unit_bytes, self.rows
        if self.page_sizes is not None:
            page_size = self.page_sizes[side]
            unit = self.unit_bytes * page_size
            planes = self.planes if side == 0 or self.decode_planes is None else self.decode_planes
            rows = planes * page_size if planes else 1
        held = sum(len(run) for run in held_runs(self.logical_size, self.parts, self.groups,
                                                  shards, 0))  # fmt: skip
        row = held * unit // rows + self.padding
        return BufferLayout(
            self.index,
            self.kind,
            self.axis,  # type: ignore[arg-type]
            self.logical_size,
            page_size,
            unit,
            row * rows,
            replica,
            rows,
            self.parts,
            self.layer,
            self.sliding_window,
            self.attention_chunk,
            logical_part_groups=self.groups,
        )


@dataclass(frozen=True)
class Context:
    """How one side spreads a request's tokens (``ParallelLayout``'s CP fields): ``cp`` ranks
    of their own or ``dcp`` ranks inside TP, sharded or (``kv="replicated"``) every token on
    every CP rank, dealt by ``split`` with ``interleave``."""

    cp: int = 1
    dcp: int = 1
    kv: str = "sharded"
    split: str = "interleave"
    interleave: int = 1

    @property
    def ways(self) -> int:
        """Ranks the tokens are dealt over (1: every rank holds every token)."""
        return self.dcp if self.dcp > 1 else (self.cp if self.kv == "sharded" else 1)

    def owners(self, num_tokens: int, page_size: int) -> np.ndarray:
        """The rank of the deal holding each token, as the splits are defined."""
        t, ways = np.arange(num_tokens), self.ways
        if ways == 1:
            return np.zeros(num_tokens, dtype=np.int64)
        if self.split == "interleave":
            return (t // self.interleave) % ways
        if self.split == "contiguous":
            blocks = -(-num_tokens // page_size)
            counts = [blocks // ways + (r < blocks % ways) for r in range(ways)]
            return np.repeat(np.arange(ways), np.array(counts) * page_size)[:num_tokens]
        chunk = max(1, -(-num_tokens // (2 * ways)))
        j = t // chunk
        return np.where(j < ways, j, 2 * ways - 1 - j)


@dataclass(frozen=True)
class Tokens:
    """A request moved by slot maps: ``num_tokens`` tokens, each side's page table (page
    indices of the request's pages in order; -1 for a page the rank does not hold), and the
    tokens ``moved`` (a range's start and stop)."""

    num_tokens: int
    src_table: tuple[int, ...]
    dst_table: tuple[int, ...]
    moved: tuple[int, int]


@dataclass(frozen=True)
class Scenario:
    name: str
    prefill_tp: int
    decode_tp: int
    buffers: tuple[Buffer, ...]
    prefill_dp: int = 1
    decode_dp: int = 1
    capacity_pages: int = 12
    src_pages: tuple[int, ...] = (1, 2, 3, 7)
    dst_pages: tuple[int, ...] = (4, 5, 6, 0)
    decode_replicas: str = "first"
    prefill_pp: tuple[int, ...] = (1,)  # pipeline stages as per-stage layer counts
    decode_pp: tuple[int, ...] = (1,)
    tokens: Tokens | None = None  # move token-indexed buffers by slot maps
    prefill_context: Context = field(default_factory=Context)
    decode_context: Context = field(default_factory=Context)
    exact_sources: bool = False  # plan for the request's length (num_tokens=...)
    # Move each rank pair's request through registered staging buffers: the prefill rank
    # packs, the engine moves one descriptor, the decode rank unpacks.
    staging: bool = False
    # Prefill ranks that never come up: both sides plan around them
    # (`without_prefill_ranks`), and what only they held stays unwritten.
    unavailable: tuple[int, ...] = ()

    @property
    def prefill(self) -> ParallelLayout:
        return self.layout("prefill", self.prefill_tp, self.prefill_dp, self.prefill_pp)

    @property
    def decode(self) -> ParallelLayout:
        return self.layout("decode", self.decode_tp, self.decode_dp, self.decode_pp)

    def context(self, role: str) -> Context:
        return self.prefill_context if role == "prefill" else self.decode_context

    def layout(self, role: str, tp: int, dp: int, stages: tuple[int, ...]) -> ParallelLayout:
        pp, c = len(stages), self.context(role)
        partition = stages if pp > 1 else None
        return ParallelLayout(
            role,  # type: ignore[arg-type]
            tp * dp * pp * c.cp,
            dp,
            pp,
            partition,
            cp_size=c.cp,
            dcp_size=c.dcp,
            cp_kv=c.kv,  # type: ignore[arg-type]
            cp_split=c.split,  # type: ignore[arg-type]
            cp_interleave=c.interleave,
        )

    def coordinates(self, role: str, rank: int) -> tuple[int, int, int]:
        """(stage, CP rank, TP rank) of a rank: TP fastest, then CP, stage, DP group."""
        tp = self.prefill_tp if role == "prefill" else self.decode_tp
        stages = self.prefill_pp if role == "prefill" else self.decode_pp
        cp = self.context(role).cp
        slot = rank % (tp * cp * len(stages))
        return slot // (tp * cp), slot // tp % cp, slot % tp

    def place(self, role: str, rank: int) -> tuple[int, int]:
        """(stage, TP rank) of a rank."""
        stage, _, tp_rank = self.coordinates(role, rank)
        return stage, tp_rank

    def share(self, role: str, rank: int) -> int:
        """Which rank of its side's deal a rank is: its DCP rank (TP rank mod dcp) or its CP
        rank; 0 when every rank holds every token."""
        c = self.context(role)
        _, cp_rank, tp_rank = self.coordinates(role, rank)
        if c.dcp > 1:
            return tp_rank % c.dcp
        return cp_rank if c.ways > 1 else 0

    def page_size(self, role: str) -> int:
        side = 0 if role == "prefill" else 1
        sizes = {(b.page_sizes or (16, 16))[side] for b in self.buffers if self.by_token(b)}
        assert len(sizes) == 1, "one page size a side"
        return sizes.pop()

    def held_tokens(self, role: str, rank: int) -> np.ndarray:
        """The request's tokens the rank holds, in order: its local tokens 0, 1, ..."""
        t = self.tokens
        assert t is not None
        owners = self.context(role).owners(t.num_tokens, self.page_size(role))
        return np.flatnonzero(owners == self.share(role, rank))

    def page_table(self, role: str, rank: int) -> np.ndarray:
        """The rank's page table: the scenario's own without CP, else one of its own (random,
        as many pages as its tokens fill)."""
        t = self.tokens
        assert t is not None
        if self.context(role).ways == 1:
            return np.array(t.src_table if role == "prefill" else t.dst_table)
        pages = -(-len(self.held_tokens(role, rank)) // self.page_size(role))
        rng = np.random.default_rng([sum(map(ord, self.name)), rank, role == "decode"])
        return rng.permutation(self.capacity_pages)[:pages]

    def holds(self, role: str, rank: int, buffer: Buffer) -> bool:
        """Whether a rank's stage holds the buffer's layer (stages take layers in order)."""
        stages = self.prefill_pp if role == "prefill" else self.decode_pp
        if buffer.layer is None or len(stages) == 1:
            return True
        ends = list(itertools.accumulate(stages))
        stage = next(s for s, end in enumerate(ends) if buffer.layer < end)
        return stage == self.place(role, rank)[0]

    def buffers_of(self, role: str) -> tuple[BufferLayout, ...]:
        if role == "prefill":
            return tuple(b.layout(self.prefill_tp, b.prefill_replica, 0) for b in self.buffers)
        return tuple(b.layout(self.decode_tp, b.decode_replica, 1) for b in self.buffers)

    def planner(self) -> PDTransferPlanner:
        planner = PDTransferPlanner(
            prefill_layout=self.prefill,
            decode_layout=self.decode,
            prefill_buffers=self.buffers_of("prefill"),
            decode_buffers=self.buffers_of("decode"),
            decode_replicas=self.decode_replicas,  # type: ignore[arg-type]
            token_maps=self.tokens is not None,
        )
        return planner.without_prefill_ranks(self.unavailable) if self.unavailable else planner

    def lost_units(self, buffer_pos: int, decode_rank: int) -> set[int]:
        """Units of a buffer the decode rank holds that no prefill rank still up holds (in
        the DP group it reads, at the stage holding the layer): nothing can send them."""
        if not self.unavailable:
            return set()
        buffer = self.buffers[buffer_pos]
        p, d = self.buffers_of("prefill")[buffer_pos], self.buffers_of("decode")[buffer_pos]
        per_group = self.prefill.world_size // self.prefill_dp
        group = decode_rank // (self.decode.world_size // self.decode_dp) % self.prefill_dp
        held: set[int] = set()
        for rank in range(group * per_group, (group + 1) * per_group):
            if rank not in self.unavailable and self.holds("prefill", rank, buffer):
                held.update(held_units(p, self.prefill_tp, self.place("prefill", rank)[1]).tolist())
        mine = held_units(d, self.decode_tp, self.place("decode", decode_rank)[1])
        return set(mine.tolist()) - held

    def by_token(self, buffer: Buffer) -> bool:
        """Whether the request moves this buffer by slot maps (state moves by pages)."""
        return self.tokens is not None and buffer.axis != "state_channel"

    def slot_map(self, role: str, rank: int) -> np.ndarray:
        """A rank's slot map of the request, from its page table, as a runtime makes it."""
        t = self.tokens
        assert t is not None
        layout = self.prefill if role == "prefill" else self.decode
        # The harness deals tokens by its own rule; the layout must say the same share.
        share = layout.token_share(rank)
        assert (share.cp_size, share.cp_rank) == (self.context(role).ways, self.share(role, rank))
        return pdplan.token_slots(
            self.page_table(role, rank),
            self.page_size(role),
            t.num_tokens,
            tokens=range(*t.moved),
            layout=layout,
            rank=rank,
        )

    def slot_maps(
        self, prefill_rank: int = 0, decode_rank: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Both ranks' slot maps of the request."""
        return self.slot_map("prefill", prefill_rank), self.slot_map("decode", decode_rank)


def kv_cache(
    layers: int,
    heads: int,
    unit_bytes: int,
    rows: int = 1,
    staged: bool = False,
    page_sizes: tuple[int, int] | None = None,
    planes: int = 0,
    **replicas: int,
) -> tuple[Buffer, ...]:
    """K and V of each layer; `staged` tags each with its layer (for pipeline stages); with
    `page_sizes`, in pages of those (prefill, decode) tokens, `unit_bytes` a unit of a token."""
    kinds = (BufferKind.TARGET_K, BufferKind.TARGET_V)
    return tuple(
        Buffer(
            2 * layer + i,
            kind,
            "kv_head",
            heads,
            unit_bytes,
            padding=8,
            rows=rows,
            layer=layer if staged else None,
            page_sizes=page_sizes,
            planes=planes,
            **replicas,
        )
        for layer in range(layers)
        for i, kind in enumerate(kinds)
    )


def held_runs(
    logical_size: int,
    parts: tuple[int, ...] | None,
    groups: tuple[int, ...] | None,
    shards: int,
    shard: int,
) -> list[range]:
    """The logical units shard ``shard`` of ``shards`` holds of each part, in its item's order:
    each part cut into one equal run a shard, or, where the part has fewer groups than there
    are shards, the whole group the shard's heads read (group ``shard * groups // shards``)."""
    runs, start = [], 0
    for i, size in enumerate(parts or (logical_size,)):
        pieces = shards if groups is None or groups[i] >= shards else groups[i]
        piece = shard * pieces // shards
        runs.append(range(start + piece * size // pieces, start + (piece + 1) * size // pieces))
        start += size
    return runs


def held_units(buffer: BufferLayout, tp: int, tp_rank: int) -> np.ndarray:
    """The logical units a rank holds, in its item's order: ranks in replica groups share a
    shard; each part of the axis is cut into one equal run per shard (or copied, a group a
    shard, where it has fewer groups than shards), part after part."""
    if buffer.logical_axis == "replicated":
        return np.arange(buffer.logical_size)
    shards = tp // buffer.tp_replica_group_size
    shard = tp_rank // buffer.tp_replica_group_size
    runs = held_runs(buffer.logical_size, buffer.logical_parts, buffer.logical_part_groups,
                     shards, shard)  # fmt: skip
    return np.concatenate([np.arange(r.start, r.stop) for r in runs])


def content(buffer_index: int, pages: np.ndarray, global_bytes: np.ndarray) -> np.ndarray:
    """The known value of each logical byte of each page: what every holder of it stores."""
    p = pages.astype(np.int64)[:, None]
    g = global_bytes.astype(np.int64)[None, :]
    return ((buffer_index * 131 + p * 31 + g * 7 + (g >> 8) * 3) % 251).astype(np.uint8)


def page_image(buffer: BufferLayout, units: np.ndarray, pages: np.ndarray, fill: int) -> np.ndarray:
    """Pages of a rank's item holding `units`, as (pages, rows, row bytes): row r holds each
    unit's r-th slice of its bytes, unit after unit; the rest of a row is `fill`."""
    rows = buffer.rows_per_page
    width = buffer.bytes_per_logical_unit // rows
    image = np.full((len(pages), rows, buffer.item_stride_bytes // rows), fill, dtype=np.uint8)
    # logical[r, u, b]: the logical byte of unit u that row r holds at column b.
    logical = (
        units[None, :, None] * buffer.bytes_per_logical_unit
        + np.arange(rows)[:, None, None] * width
        + np.arange(width)[None, None, :]
    ).reshape(rows, -1)
    values = content(buffer.buffer_index, pages, logical.reshape(-1))
    image[:, :, : logical.shape[1]] = values.reshape(len(pages), rows, -1)
    return image


def filled_prefill_cache(buffer: BufferLayout, tp: int, tp_rank: int, capacity: int) -> np.ndarray:
    units = held_units(buffer, tp, tp_rank)
    image = page_image(buffer, units, np.arange(capacity), 0xEE)  # 0xEE: padding
    return image.reshape(capacity, buffer.item_stride_bytes)


def token_view(cache: np.ndarray, buffer: BufferLayout, units: int) -> np.ndarray:
    """A writable view of a (pages, item bytes) cache as [page, plane, slot, unit, byte], as
    the README describes token geometry: head-major pages hold each unit as ``page_size``
    token slices in slot order; token-major pages a row per (plane, slot), each row the
    rank's units in order; a replicated item is one unit of token slices."""
    pages, size = cache.shape[0], buffer.page_size
    unit = buffer.bytes_per_logical_unit
    if buffer.logical_axis == "replicated":
        units, unit = 1, buffer.logical_size * unit
    if buffer.rows_per_page == 1:
        slice_bytes = unit // size
        view = cache[:, : units * unit].reshape(pages, units, size, slice_bytes)
        view = view.transpose(0, 2, 1, 3)[:, None]
    else:
        planes = buffer.rows_per_page // size
        rows = cache.reshape(pages, planes, size, buffer.item_stride_bytes // buffer.rows_per_page)
        slice_bytes = unit // buffer.rows_per_page
        view = rows[..., : units * slice_bytes].reshape(pages, planes, size, units, slice_bytes)
    assert np.shares_memory(view, cache)
    return view


def token_content(
    buffer_index: int, tokens: np.ndarray, units: np.ndarray, shape: tuple[int, ...]
) -> np.ndarray:
    """The known value of every byte of every token: [token, plane, unit, byte] for the given
    logical units, the same wherever (and in whatever page size) the token is stored."""
    _, _, _, _, width = shape
    t = tokens.astype(np.int64)[:, None, None, None]
    q = np.arange(shape[1])[None, :, None, None]
    u = units.astype(np.int64)[None, None, :, None]
    x = np.arange(width)[None, None, None, :]
    return ((buffer_index * 131 + t * 31 + q * 17 + u * 7 + x * 3 + (x >> 8) * 5) % 251).astype(
        np.uint8
    )


def token_units(buffer: BufferLayout, tp: int, tp_rank: int) -> np.ndarray:
    """The logical units of a rank's item in token geometry (a replicated item is one)."""
    if buffer.logical_axis == "replicated":
        return np.zeros(1, dtype=np.int64)
    return held_units(buffer, tp, tp_rank)


def filled_token_cache(s: Scenario, buffer: BufferLayout, rank: int) -> np.ndarray:
    """A prefill cache holding the rank's tokens of the request (all of them without CP):
    its local token ``i`` at slot ``i % page_size`` of page ``table[i // page_size]``."""
    cache = np.full((s.capacity_pages, buffer.item_stride_bytes), 0xEE, dtype=np.uint8)
    units = token_units(buffer, s.prefill_tp, s.place("prefill", rank)[1])
    view = token_view(cache, buffer, len(units))
    held = s.held_tokens("prefill", rank)
    local = np.arange(len(held))
    pages = s.page_table("prefill", rank)[local // buffer.page_size]
    view[pages, :, local % buffer.page_size] = token_content(
        buffer.buffer_index, held, units, view.shape
    )
    return cache


def expected_token_cache(s: Scenario, b: BufferLayout, receives: bool, rank: int) -> np.ndarray:
    """A decode cache after the request: the moved tokens the rank holds, with the bytes of
    the units it receives, at their slots; guard bytes everywhere else."""
    assert s.tokens is not None
    cache = np.full((s.capacity_pages, b.item_stride_bytes), GUARD, dtype=np.uint8)
    if not receives:
        return cache
    units = token_units(b, s.decode_tp, s.place("decode", rank)[1])
    view = token_view(cache, b, len(units))
    held = s.held_tokens("decode", rank)
    tokens = np.intersect1d(np.arange(*s.tokens.moved), held)
    if b.sliding_window is not None:  # a window layer receives the request's last tokens only
        tokens = tokens[tokens >= s.tokens.num_tokens - b.sliding_window]
    if b.attention_chunk_size is not None:  # a chunked layer receives its current chunk only
        chunk = b.attention_chunk_size
        tokens = tokens[tokens >= s.tokens.num_tokens // chunk * chunk]
    local = np.searchsorted(held, tokens)
    pages = s.page_table("decode", rank)[local // b.page_size]
    assert (pages >= 0).all(), "a moved token on a page the decode rank does not hold"
    view[pages, :, local % b.page_size] = token_content(b.buffer_index, tokens, units, view.shape)
    return cache


def expected_decode_cache(s: Scenario, buffer_pos: int, decode_rank: int) -> np.ndarray | None:
    """What a decode rank's cache must hold after the request, computed from the layouts
    (None: the rank's stage does not hold the buffer)."""
    if not s.holds("decode", decode_rank, s.buffers[buffer_pos]):
        return None
    prefill_b = s.buffers_of("prefill")[buffer_pos]
    b = s.buffers_of("decode")[buffer_pos]
    tp_rank = s.place("decode", decode_rank)[1]
    cache = np.full((s.capacity_pages, b.item_stride_bytes), GUARD, dtype=np.uint8)
    # Under "first" the group's first rank receives, or with DCP the first of each token share.
    first_of_group = tp_rank % b.tp_replica_group_size < s.decode_context.dcp
    receives = b.logical_axis == "replicated" or s.decode_replicas == "all" or first_of_group
    if not receives:
        return cache
    if s.by_token(s.buffers[buffer_pos]):
        assert not s.unavailable, "failover scenarios move pages"
        return expected_token_cache(s, b, receives, decode_rank)
    src, dst = np.array(s.src_pages), np.array(s.dst_pages)
    identity = s.planner().plan_for_decode_rank(decode_rank).plan_kind == "identity"
    if identity:  # whole items move, the prefill item's padding with them
        whole = min(prefill_b.item_stride_bytes, b.item_stride_bytes)
        units = held_units(prefill_b, s.prefill_tp, tp_rank)
        image = page_image(prefill_b, units, src, 0xEE).reshape(len(src), -1)
        cache[dst, :whole] = image[:, :whole]
        return cache
    # Only the units' bytes arrive: the rest of every row keeps its guard bytes, and so do
    # the units nobody still up holds.
    units = held_units(b, s.decode_tp, tp_rank)
    image = page_image(b, units, src, GUARD)
    width = b.bytes_per_logical_unit // b.rows_per_page
    for local, unit in enumerate(units.tolist()):
        if unit in s.lost_units(buffer_pos, decode_rank):
            image[:, :, local * width : (local + 1) * width] = GUARD
    cache[dst] = image.reshape(len(src), -1)
    return cache


class LoopbackEngine:
    """The in-memory test double: all ranks in one address space, writes are memmove."""

    def register(self, address: int, nbytes: int) -> None:
        pass

    @property
    def address(self) -> str:
        return "loopback"

    def write(self, peer: str, srcs: np.ndarray, dsts: np.ndarray, lengths: np.ndarray) -> int:
        for src, dst, length in zip(srcs.tolist(), dsts.tolist(), lengths.tolist()):
            ctypes.memmove(dst, src, length)
        return 0


#: Descriptors in one Mooncake batch.
MOONCAKE_BATCH = 2048


class MooncakeEngine:
    """Mooncake's transfer engine with its TCP transport and P2P handshake metadata."""

    def __init__(self) -> None:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        status = self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if status != 0:
            raise RuntimeError(f"Mooncake initialize failed with status {status}")

    def register(self, address: int, nbytes: int) -> None:
        status = self.engine.register_memory(address, nbytes)
        if status != 0:
            raise RuntimeError(f"Mooncake register_memory failed with status {status}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.engine.get_rpc_port()}"

    def write(self, peer: str, srcs: np.ndarray, dsts: np.ndarray, lengths: np.ndarray) -> int:
        # One batch of 4,096 descriptors or more fails with -1 here: write in batches below that.
        for start in range(0, len(lengths), MOONCAKE_BATCH):
            part = slice(start, start + MOONCAKE_BATCH)
            status = int(
                self.engine.batch_transfer_sync_write(
                    peer, srcs[part].tolist(), dsts[part].tolist(), lengths[part].tolist()
                )
            )
            if status != 0:
                return status
        return 0


class NixlEngine:
    """A NIXL agent with the UCX backend over host (DRAM) memory. ``prepped`` writes through
    descriptor lists prepared once per peer and addressed by index, NIXL's preferred form;
    otherwise each request passes N x 3 descriptor arrays."""

    def __init__(self, name: str, prepped: bool = False) -> None:
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        # With libibverbs installed (Mooncake needs it) but no InfiniBand device, UCX's IB
        # module crashes the process in its destructor at exit: skip the module there.
        devices = "/sys/class/infiniband"
        if not (os.path.isdir(devices) and os.listdir(devices)):
            os.environ.setdefault("UCX_MODULES", "^ib")

        self.agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        self.prepped = prepped
        self.peers: dict[bytes, str] = {}
        self.lists: dict[tuple[str, bytes], tuple[Any, Any]] = {}

    def register(self, address: int, nbytes: int) -> None:
        self.agent.register_memory(np.array([[address, nbytes, 0]], dtype=np.uint64), "DRAM")

    @property
    def address(self) -> bytes:
        return bytes(self.agent.get_agent_metadata())

    def peer(self, metadata: bytes) -> str:
        if metadata not in self.peers:
            name = self.agent.add_remote_agent(metadata)
            self.peers[metadata] = name.decode() if isinstance(name, bytes) else name
        return self.peers[metadata]

    def write(self, peer: bytes, srcs: np.ndarray, dsts: np.ndarray, lengths: np.ndarray) -> int:
        zeros = np.zeros_like(lengths)
        local = self.agent.get_xfer_descs(np.column_stack((srcs, lengths, zeros)), "DRAM")
        remote = self.agent.get_xfer_descs(np.column_stack((dsts, lengths, zeros)), "DRAM")
        return self.wait(self.agent.initialize_xfer("WRITE", local, remote, self.peer(peer)))

    def write_prepped(
        self,
        peer: bytes,
        key: bytes,
        prepared: PreparedTransfer,
        pages: tuple[Any, Any],
        caps: tuple[int, int],
    ) -> int:
        """Lists prepared once per (peer, fragment list); each request sends only indices."""
        name = self.peer(peer)
        if (name, key) not in self.lists:
            local, remote = prepared.nixl_prepped_lists(*caps)
            self.lists[(name, key)] = (
                self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM"),
                self.agent.prep_xfer_dlist(name, remote, "DRAM"),
            )
        local_side, remote_side = self.lists[(name, key)]
        local_idx, remote_idx = prepared.nixl_prepped_indices(*pages, *caps)
        handle = self.agent.make_prepped_xfer(
            "WRITE", local_side, local_idx, remote_side, remote_idx
        )
        return self.wait(handle)

    def wait(self, handle: Any, seconds: float = 60.0) -> int:
        state = self.agent.transfer(handle)
        deadline = time.monotonic() + seconds
        while state not in ("DONE", "ERR") and time.monotonic() < deadline:
            state = self.agent.check_xfer_state(handle)
        self.agent.release_xfer_handle(handle)
        return 0 if state == "DONE" else 1


def make_engine(name: str, role: str, rank: int) -> Any:
    if name == "mooncake":
        return MooncakeEngine()
    if name in ("nixl", "nixl-prepped"):
        return NixlEngine(f"{role}{rank}", prepped=name == "nixl-prepped")
    raise ValueError(f"unknown engine {name!r}")


@dataclass
class RankServer:
    """One rank: its caches, its engine, and the messages it answers."""

    scenario: Scenario
    role: str
    rank: int
    engine: Any
    # A cache per buffer this rank's pipeline stage holds; None for other stages' layers.
    caches: list[np.ndarray | None] = field(default_factory=list)
    # With staging: one registered buffer as large as the rank's caches (what a request to or
    # from one rank pair can hold), the decode side's regions handed out per prefill rank,
    # and the decode side's plans waiting to be unpacked.
    staging: np.ndarray | None = None
    staged: dict[int, tuple[StagingPlan, np.ndarray, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.scenario
        tp = s.prefill_tp if self.role == "prefill" else s.decode_tp
        tp_rank = s.place(self.role, self.rank)[1]
        for buffer, b in zip(s.buffers, s.buffers_of(self.role)):
            if not s.holds(self.role, self.rank, buffer):
                self.caches.append(None)
                continue
            if self.role == "prefill" and s.by_token(buffer):
                cache = filled_token_cache(s, b, self.rank)
            elif self.role == "prefill":
                cache = filled_prefill_cache(b, tp, tp_rank, s.capacity_pages)
            else:
                cache = np.full((s.capacity_pages, b.item_stride_bytes), GUARD, dtype=np.uint8)
            self.engine.register(cache.ctypes.data, cache.nbytes)
            self.caches.append(cache)
        if s.staging:
            held = sum(c.nbytes for c in self.caches if c is not None)
            self.staging = np.zeros(max(held, 1), dtype=np.uint8)
            self.engine.register(self.staging.ctypes.data, self.staging.nbytes)

    @property
    def bases(self) -> list[int]:
        """Base pointers by buffer index: 0 (with limit 0) for buffers the rank does not hold."""
        return [0 if c is None else c.ctypes.data for c in self.caches]

    @property
    def limits(self) -> list[int]:
        return [0 if c is None else c.nbytes for c in self.caches]

    def descriptors(
        self, prepared: PreparedTransfer, pages: tuple[Any, Any], decode_rank: int
    ) -> Any:
        """The request's descriptors: by pages, or by slot maps (this rank's and the decode
        rank's) for the token-indexed buffers and by pages for the state buffers beside them
        (one list, tokens first)."""
        s = self.scenario
        if s.tokens is None:
            return prepared.descriptors(*pages)
        by_token = [b.index for b in s.buffers if s.by_token(b)]
        state = [b.index for b in s.buffers if not s.by_token(b)]
        d = prepared.token_descriptors(*s.slot_maps(self.rank, decode_rank), buffers=by_token)
        if not state:
            return d
        rest = prepared.descriptors(*pages, buffers=state)
        return type(d)(*(np.concatenate((a, b)) for a, b in zip(d, rest)))

    def staging_plan(
        self, prepared: PreparedTransfer, prefill_rank: int, decode_rank: int
    ) -> StagingPlan:
        """The pair's staging plan; both sides build it from the same fragments and the
        request's pages or slot maps, each with its own base pointers."""
        s = self.scenario
        if s.tokens is None:
            return prepared.staging_plan(
                np.array(s.src_pages, dtype=np.int64), np.array(s.dst_pages, dtype=np.int64)
            )
        assert all(s.by_token(b) for b in s.buffers), "staging cases move tokens only"
        return prepared.token_staging_plan(*s.slot_maps(prefill_rank, decode_rank))

    def stage_in(self, prefill_rank: int, version: bytes, payload: bytes) -> tuple[int, int]:
        """Decode: plan the scatter of what `prefill_rank` will send, and hand it a region
        of the staging buffer."""
        assert self.staging is not None
        unknown = [0] * len(self.caches)  # the prefill side's addresses: the layout ignores them
        prepared = PreparedTransfer.from_frames(
            version, payload, unknown, self.bases, dst_limits=self.limits
        )
        started = time.perf_counter()
        plan = self.staging_plan(prepared, prefill_rank, self.rank)
        start = sum(region.nbytes for _, region, _ in self.staged.values())
        region = self.staging[start : start + plan.staging_bytes]
        assert region.nbytes == plan.staging_bytes, "decode staging buffer too small"
        self.staged[prefill_rank] = (plan, region, time.perf_counter() - started)
        return region.ctypes.data, region.nbytes

    def handle(self, message: tuple[Any, ...]) -> Any:
        kind = message[0]
        if kind == "hello":
            return self.engine.address
        if kind == "plan":  # decode: fragments for each prefill rank, as wire frames only
            s = self.scenario
            length = s.tokens.num_tokens if s.exact_sources and s.tokens else None
            sources = s.planner().transfer_fragments(self.rank, num_tokens=length)
            return {
                prefill_rank: encode_transfer_fragments(fragments)
                for prefill_rank, fragments in sources.items()
            }
        if kind == "dst_info":
            return self.bases, self.limits
        if kind == "stage_in":
            return self.stage_in(*message[1:])
        if kind == "unpack":  # decode: what a prefill rank sent, into the caches
            plan, region, planned = self.staged.pop(message[1])
            started = time.perf_counter()
            plan.unpack(region)
            return planned + time.perf_counter() - started  # the decode side's seconds
        if kind == "write" and self.scenario.staging:
            return self.write_staged(*message[1:])
        if kind == "write":  # prefill: frames in, descriptors out, write
            _, peer, decode_rank, version, payload, dst_bases, dst_limits = message[:7]
            started = time.perf_counter()
            prepared = PreparedTransfer.from_frames(
                version,
                payload,
                self.bases,
                dst_bases,
                src_limits=self.limits,
                dst_limits=dst_limits,
            )
            pages = (
                np.array(self.scenario.src_pages, dtype=np.int32),
                np.array(self.scenario.dst_pages, dtype=np.int64),
            )
            d = self.descriptors(prepared, pages, decode_rank)
            built = time.perf_counter() - started
            if getattr(self.engine, "prepped", False):
                caps = (self.scenario.capacity_pages, self.scenario.capacity_pages)
                status = self.engine.write_prepped(peer, payload, prepared, pages, caps)
            else:
                status = self.engine.write(peer, d.src_addrs, d.dst_addrs, d.lengths)
            return {
                "status": status,
                "descriptors": d.num_descriptors,
                "bytes": d.total_bytes,
                "build_seconds": built,
                "seconds": time.perf_counter() - started,
            }
        if kind == "dump":
            return [None if c is None else c.copy() for c in self.caches]
        raise ValueError(f"unknown message {kind!r}")

    def write_staged(
        self,
        peer: Any,
        decode_rank: int,
        version: bytes,
        payload: bytes,
        dst_bases: list[int],
        dst_limits: list[int],
        target: tuple[int, int],
    ) -> dict[str, Any]:
        """Prefill: pack the pair's request into the staging buffer and write it to the
        decode rank's staging region in as few descriptors as the plan says."""
        assert self.staging is not None
        started = time.perf_counter()
        prepared = PreparedTransfer.from_frames(
            version, payload, self.bases, dst_bases, src_limits=self.limits, dst_limits=dst_limits
        )
        plan = self.staging_plan(prepared, self.rank, decode_rank)
        plan.pack(self.staging)
        d = plan.wire_descriptors(
            self.staging.ctypes.data,
            target[0],
            src_staging_bytes=self.staging.nbytes,
            dst_staging_bytes=target[1],
        )
        built = time.perf_counter() - started
        status = self.engine.write(peer, d.src_addrs, d.dst_addrs, d.lengths)
        return {
            "status": status,
            "descriptors": d.num_descriptors,
            "direct_descriptors": plan.num_direct_descriptors,
            "bytes": d.total_bytes,
            "build_seconds": built,
            "seconds": time.perf_counter() - started,
        }


def _answer(conn: Any, start: Callable[[], Callable[[Any], Any]]) -> None:
    """A rank process's loop: build its handler (`start`), say whether that worked, then
    answer messages until told to stop."""
    import os

    os.environ.setdefault("GLOG_minloglevel", "2")  # Mooncake's info logging, before it loads
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    try:
        handle = start()
        conn.send(("ok", None))
    except BaseException as exc:
        conn.send(("error", repr(exc)))
        return
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        try:
            conn.send(("ok", handle(message)))
        except BaseException as exc:
            conn.send(("error", repr(exc)))


def _serve(scenario: Scenario, role: str, rank: int, conn: Any, engine: str) -> None:
    """A rank process: one rank, its own engine."""
    _answer(conn, lambda: RankServer(scenario, role, rank, make_engine(engine, role, rank)).handle)


def _serve_side(scenario: Scenario, role: str, ranks: list[int], conn: Any, engine: str) -> None:
    """A process hosting every rank of one side, with one engine they share: messages are
    `(rank, message)`."""

    def start() -> Callable[[Any], Any]:
        shared = make_engine(engine, role, 0)
        servers = {rank: RankServer(scenario, role, rank, shared) for rank in ranks}
        return lambda message: servers[message[0]].handle(message[1])

    _answer(conn, start)


class ProcessRank:
    """The coordinator's handle on a rank process."""

    def __init__(self, scenario: Scenario, role: str, rank: int, engine: str) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(scenario, role, rank, child, engine), daemon=True
        )
        self.process.start()
        self.ready = self.conn  # the first reply says the engine is up

    def wait_ready(self, timeout: float) -> None:
        self._reply(timeout)

    def _reply(self, timeout: float = 60.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError("rank process did not answer in time")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def handle(self, message: tuple[Any, ...]) -> Any:
        self.conn.send(message)
        return self._reply()

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


class SideProcess(ProcessRank):
    """One process for all ranks of a side, one engine among them (a cheaper way through a
    real engine for layouts of many ranks: the transfers still cross processes)."""

    def __init__(self, scenario: Scenario, role: str, ranks: list[int], engine: str) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve_side, args=(scenario, role, ranks, child, engine), daemon=True
        )
        self.process.start()
        self.started = False

    def rank(self, rank: int) -> RankOnSide:
        return RankOnSide(self, rank)


@dataclass
class RankOnSide:
    """A rank hosted by a `SideProcess`: its messages carry its number."""

    side: SideProcess
    number: int

    def wait_ready(self, timeout: float) -> None:
        if not self.side.started:
            self.side.wait_ready(timeout)
            self.side.started = True

    def handle(self, message: tuple[Any, ...]) -> Any:
        return self.side.handle((self.number, message))

    def close(self) -> None:
        if self.side.process.is_alive():
            self.side.close()


@dataclass
class Outcome:
    descriptors: int
    bytes: int
    seconds: float  # building and writing, summed over pairs (staged: also plan + unpack)
    build_seconds: float
    writes_per_prefill_rank: dict[int, int]
    mismatches: list[str]
    # With staging: the descriptors the engine would have moved without it.
    direct_descriptors: int = 0


def run(scenario: Scenario, make_rank: Callable[[str, int], Any]) -> Outcome:
    """Plan, ship fragments over the wire format, write, and compare every decode cache."""
    # A prefill rank that is unavailable never comes up: nothing can read from it.
    prefill = {
        r: make_rank("prefill", r)
        for r in range(scenario.prefill.world_size)
        if r not in scenario.unavailable
    }
    decode = {r: make_rank("decode", r) for r in range(scenario.decode.world_size)}
    try:
        for rank in list(prefill.values()) + list(decode.values()):
            if hasattr(rank, "wait_ready"):
                rank.wait_ready(120.0)
        writes = dict.fromkeys(range(scenario.prefill.world_size), 0)
        totals = {"descriptors": 0, "bytes": 0, "seconds": 0.0, "build_seconds": 0.0}
        totals_staged = {"direct_descriptors": 0}
        for decode_rank, handle in decode.items():
            peer = handle.handle(("hello",))
            dst_bases, dst_limits = handle.handle(("dst_info",))
            frames = handle.handle(("plan",))
            for prefill_rank, (version, payload) in frames.items():
                if prefill_rank not in prefill:
                    raise RuntimeError(
                        f"decode rank {decode_rank} plans to read from prefill "
                        f"rank {prefill_rank}, which never came up"
                    )
                write = ("write", peer, decode_rank, version, payload, dst_bases, dst_limits)
                if scenario.staging:
                    target = handle.handle(("stage_in", prefill_rank, version, payload))
                    write = (*write, target)
                result = prefill[prefill_rank].handle(write)
                if result["status"] != 0:
                    raise RuntimeError(f"transfer to decode rank {decode_rank} failed: {result}")
                if scenario.staging:
                    totals["seconds"] += handle.handle(("unpack", prefill_rank))
                    totals_staged["direct_descriptors"] += result["direct_descriptors"]
                writes[prefill_rank] += 1
                for key in totals:
                    totals[key] += result[key]
        mismatches = []
        for decode_rank, handle in decode.items():
            for pos, cache in enumerate(handle.handle(("dump",))):
                expected = expected_decode_cache(scenario, pos, decode_rank)
                if cache is None or expected is None:
                    if (cache is None) != (expected is None):
                        mismatches.append(f"decode rank {decode_rank}, buffer {pos}: held by?")
                    continue
                if not np.array_equal(cache, expected):
                    wrong = np.argwhere(cache != expected)[:3].tolist()
                    mismatches.append(
                        f"decode rank {decode_rank}, buffer {pos}: first wrong (page, byte) {wrong}"
                    )
        return Outcome(
            int(totals["descriptors"]),
            int(totals["bytes"]),
            totals["seconds"],
            totals["build_seconds"],
            writes,
            mismatches,
            totals_staged["direct_descriptors"],
        )
    finally:
        for handle in list(prefill.values()) + list(decode.values()):
            if hasattr(handle, "close"):
                handle.close()


def run_in_processes(
    scenario: Scenario, engine: str = "mooncake", per_side: bool = False
) -> Outcome:
    """One process a rank, each with its own `engine` (mooncake, nixl or nixl-prepped), or
    with `per_side` one process a side, its ranks sharing one engine."""
    if not per_side:
        return run(scenario, lambda role, rank: ProcessRank(scenario, role, rank, engine))
    sides = {
        role: SideProcess(scenario, role, list(range(layout.world_size)), engine)
        for role, layout in (("prefill", scenario.prefill), ("decode", scenario.decode))
    }
    return run(scenario, lambda role, rank: sides[role].rank(rank))


def run_in_memory(scenario: Scenario) -> Outcome:
    engine = LoopbackEngine()
    return run(scenario, lambda role, rank: RankServer(scenario, role, rank, engine))


DEFAULT = Scenario(
    "Llama-like, 4 layers, 8 KV heads, prefill TP 8 -> decode TP 2",
    prefill_tp=8,
    decode_tp=2,
    buffers=kv_cache(4, 8, 16 * 128 * 2),
    capacity_pages=64,
    src_pages=tuple(range(3, 35)),
    dst_pages=tuple(range(20, 52)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="run every rank in this process with a memmove engine",
    )
    parser.add_argument(
        "--engine",
        choices=("mooncake", "nixl", "nixl-prepped"),
        default="mooncake",
        help="the transfer engine, one per rank process (default mooncake)",
    )
    args = parser.parse_args()
    s = DEFAULT
    print(f"pdplan {pdplan.__version__}: {s.name}")
    print(f"request: {len(s.src_pages)} pages; {len(s.buffers)} buffers")
    started = time.perf_counter()
    outcome = run_in_memory(s) if args.loopback else run_in_processes(s, args.engine)
    wall = time.perf_counter() - started
    names = {
        "mooncake": "Mooncake, TCP on 127.0.0.1",
        "nixl": "NIXL, UCX backend on this host (descriptor arrays)",
        "nixl-prepped": "NIXL, UCX backend on this host (prepped lists, indices per request)",
    }
    print(f"engine: {'loopback (memmove)' if args.loopback else names[args.engine]}")
    print(
        f"moved {outcome.bytes:,} bytes in {outcome.descriptors:,} descriptors; "
        f"descriptor building {outcome.build_seconds * 1e3:.2f} ms, "
        f"build + write {outcome.seconds * 1e3:.1f} ms "
        f"({outcome.bytes / max(outcome.seconds, 1e-9) / 1e6:.0f} MB/s); "
        f"{wall:.1f} s with process start-up"
    )
    print(f"writes per prefill rank: {outcome.writes_per_prefill_rank}")
    if outcome.mismatches:
        raise SystemExit("MISMATCH:\n" + "\n".join(outcome.mismatches))
    print("every decode cache equals the expected reshard, guard bytes untouched")


if __name__ == "__main__":
    main()
