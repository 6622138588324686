"""The pure-Python way, for side-by-side benchmarks. Not part of the package.

Two planners over plain frozen dataclasses (no validation hooks, as runtimes write them):

- ``WalkingPlanner`` plans as runtimes do today: for every decode rank, every buffer and every
  prefill TP rank it intersects the two shards (construction walks all decode ranks for fanout).
- ``ArithmeticPlanner`` is pdplan's own algorithm written in Python: buffers that share a
  sharding are routed once, overlapping shards are found by division, fanout is counted per DP
  group. It shows how much of pdplan's speed is the algorithm and how much is Rust.

Both produce plans equal to pdplan's; ``encode``/``decode`` are the JSON wire format v1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fragment:
    buffer_index: int
    buffer_kind: Any
    src_rank: int
    dst_rank: int
    src_page_stride_bytes: int
    dst_page_stride_bytes: int
    src_byte_offset: int
    dst_byte_offset: int
    bytes_per_page: int
    page_count: int | None = None


@dataclass(frozen=True)
class Plan:
    plan_kind: str
    target_dp_group: int
    target_prefill_ranks: tuple[int, ...]
    required_prefill_response_num: int
    fragments_by_prefill_rank: dict[int, tuple[Fragment, ...]]
    required_dst_info_num_by_prefill_rank: dict[int, int]


def shard(buffer: Any, tp_size: int, tp_rank: int) -> tuple[int, int] | None:
    replica = buffer.tp_replica_group_size
    if tp_rank % replica:
        return None
    length = buffer.logical_size // (tp_size // replica)
    start = tp_rank // replica * length
    return start, start + length


class _Base:
    def __init__(self, prefill: Any, decode: Any, prefill_buffers: Any, decode_buffers: Any):
        self.prefill, self.decode = prefill, decode
        self.pairs = list(zip(prefill_buffers, decode_buffers))
        self.ptp = prefill.world_size // prefill.dp_size
        self.dtp = decode.world_size // decode.dp_size
        for p, d in self.pairs:
            for name in (
                "buffer_index",
                "buffer_kind",
                "logical_axis",
                "logical_size",
                "bytes_per_logical_unit",
            ):
                if getattr(p, name) != getattr(d, name):
                    raise ValueError(f"prefill/decode {name} differ")
            if p.logical_axis == "replicated":
                continue
            for tp, b in ((self.ptp, p), (self.dtp, d)):
                shards = tp // b.tp_replica_group_size
                if tp % b.tp_replica_group_size or b.logical_size % shards:
                    raise ValueError("non-aligned TP mapping")
                if b.item_stride_bytes // b.bytes_per_logical_unit < b.logical_size // shards:
                    raise ValueError("buffer item is smaller than its logical shard")
        self.identity = self.ptp == self.dtp and all(
            p.tp_replica_group_size == 1 and d.tp_replica_group_size == 1 for p, d in self.pairs
        )

    def sources(self, pair: Any, decode_tp_rank: int) -> list[tuple[int, int, int, int]]:
        """(prefill TP rank, src offset, dst offset, bytes) for one buffer."""
        raise NotImplementedError

    def fanout_of_tp_ranks(self) -> list[int]:
        counts = [0] * self.ptp
        for decode_tp_rank in range(self.dtp):
            touched = set()
            for pair in self.pairs:
                touched.update(s[0] for s in self.sources(pair, decode_tp_rank))
            for rank in touched:
                counts[rank] += 1
        return counts

    def plan_for_decode_rank(self, decode_rank: int) -> Plan:
        group, tp_rank = divmod(decode_rank, self.dtp)
        base = group * self.ptp
        if self.identity:
            rank = base + tp_rank
            return Plan("identity", group, (rank,), 1, {}, {rank: self.fanout[rank]})
        by_rank: dict[int, list[Fragment]] = {}
        for pair in self.pairs:
            p, d = pair
            for src_tp, src_off, dst_off, length in self.sources(pair, tp_rank):
                by_rank.setdefault(base + src_tp, []).append(
                    Fragment(
                        p.buffer_index,
                        p.buffer_kind,
                        base + src_tp,
                        decode_rank,
                        p.item_stride_bytes,
                        d.item_stride_bytes,
                        src_off,
                        dst_off,
                        length,
                    )
                )
        fragments = {rank: tuple(fs) for rank, fs in sorted(by_rank.items())}
        ranks = tuple(fragments)
        return Plan(
            "fragmented",
            group,
            ranks,
            len(ranks),
            fragments,
            {rank: self.fanout[rank] for rank in ranks},
        )


class WalkingPlanner(_Base):
    """Every decode rank x buffer x prefill TP rank, as runtimes plan today."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.fanout = dict.fromkeys(range(self.prefill.world_size), 0)
        for decode_rank in range(self.decode.world_size):
            group, tp_rank = divmod(decode_rank, self.dtp)
            touched = set()
            for pair in self.pairs:
                touched.update(s[0] for s in self.sources(pair, tp_rank))
            for rank in touched:
                self.fanout[group * self.ptp + rank] += 1

    def sources(self, pair: Any, decode_tp_rank: int) -> list[tuple[int, int, int, int]]:
        p, d = pair
        if p.logical_axis == "replicated":
            return [(decode_tp_rank * self.ptp // self.dtp, 0, 0, d.item_stride_bytes)]
        dst = shard(d, self.dtp, decode_tp_rank)
        if dst is None:
            return []
        out = []
        for prefill_tp_rank in range(self.ptp):
            src = shard(p, self.ptp, prefill_tp_rank)
            if src is None:
                continue
            start, end = max(src[0], dst[0]), min(src[1], dst[1])
            if start < end:
                unit = p.bytes_per_logical_unit
                out.append(
                    (
                        prefill_tp_rank,
                        (start - src[0]) * unit,
                        (start - dst[0]) * unit,
                        (end - start) * unit,
                    )
                )
        return out


class ArithmeticPlanner(_Base):
    """pdplan's algorithm in Python: shared shardings routed once, overlaps by division."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._routes: dict[tuple[Any, int], list[tuple[int, int, int, int]]] = {}
        counts = self.fanout_of_tp_ranks()
        groups = self.decode.dp_size
        self.fanout = {
            rank: counts[rank % self.ptp] if rank // self.ptp < groups else 0
            for rank in range(self.prefill.world_size)
        }

    def _route(self, key: Any, decode_tp_rank: int) -> list[tuple[int, int, int, int]]:
        """(prefill TP rank, src shard start, dst shard start, overlap start, overlap end)."""
        cached = self._routes.get((key, decode_tp_rank))
        if cached is not None:
            return cached
        size, p_replica, d_replica = key
        out: list[Any] = []
        if decode_tp_rank % d_replica == 0:
            dst_len = size // (self.dtp // d_replica)
            dst_start = decode_tp_rank // d_replica * dst_len
            src_len = size // (self.ptp // p_replica)
            for index in range(dst_start // src_len, (dst_start + dst_len - 1) // src_len + 1):
                start = max(index * src_len, dst_start)
                end = min((index + 1) * src_len, dst_start + dst_len)
                out.append((index * p_replica, index * src_len, dst_start, start, end))
        self._routes[(key, decode_tp_rank)] = out
        return out

    def sources(self, pair: Any, decode_tp_rank: int) -> list[tuple[int, int, int, int]]:
        p, d = pair
        if p.logical_axis == "replicated":
            return [(decode_tp_rank * self.ptp // self.dtp, 0, 0, d.item_stride_bytes)]
        key = (p.logical_size, p.tp_replica_group_size, d.tp_replica_group_size)
        unit = p.bytes_per_logical_unit
        return [
            (rank, (start - src0) * unit, (start - dst0) * unit, (end - start) * unit)
            for rank, src0, dst0, start, end in self._route(key, decode_tp_rank)
        ]

    def fanout_of_tp_ranks(self) -> list[int]:
        counts = [0] * self.ptp
        keys = {
            (p.logical_size, p.tp_replica_group_size, d.tp_replica_group_size)
            for p, d in self.pairs
            if p.logical_axis != "replicated"
        }
        replicated = any(p.logical_axis == "replicated" for p, _ in self.pairs)
        for decode_tp_rank in range(self.dtp):
            touched = {route[0] for key in keys for route in self._route(key, decode_tp_rank)}
            if replicated:
                touched.add(decode_tp_rank * self.ptp // self.dtp)
            for rank in touched:
                counts[rank] += 1
        return counts


def encode(fragments: tuple[Any, ...]) -> tuple[bytes, bytes]:
    payload = [
        {
            "buffer_index": f.buffer_index,
            "buffer_kind": f.buffer_kind.value,
            "src_rank": f.src_rank,
            "dst_rank": f.dst_rank,
            "src_page_stride_bytes": f.src_page_stride_bytes,
            "dst_page_stride_bytes": f.dst_page_stride_bytes,
            "src_byte_offset": f.src_byte_offset,
            "dst_byte_offset": f.dst_byte_offset,
            "bytes_per_page": f.bytes_per_page,
            "page_count": f.page_count,
        }
        for f in fragments
    ]
    return b"1", json.dumps(payload, separators=(",", ":")).encode("utf-8")


def decode(version: bytes, payload: bytes, kind_type: Any) -> tuple[Fragment, ...]:
    if version != b"1":
        raise ValueError("unsupported version")
    return tuple(
        Fragment(
            int(e["buffer_index"]),
            kind_type(e["buffer_kind"]),
            int(e["src_rank"]),
            int(e["dst_rank"]),
            int(e["src_page_stride_bytes"]),
            int(e["dst_page_stride_bytes"]),
            int(e["src_byte_offset"]),
            int(e["dst_byte_offset"]),
            int(e["bytes_per_page"]),
            None if e["page_count"] is None else int(e["page_count"]),
        )
        for e in json.loads(payload.decode("utf-8"))
    )


def descriptors_loop(
    fragments: Any, src_bases: Any, dst_bases: Any, src_pages: Any, dst_pages: Any
) -> list[tuple[int, int, int]]:
    """The per-request loop runtimes run today: one tuple per fragment, page pair and row."""
    out = []
    pairs = list(zip(src_pages.tolist(), dst_pages.tolist()))
    for f in fragments:
        src_base = src_bases[f.buffer_index] + f.src_byte_offset
        dst_base = dst_bases[f.buffer_index] + f.dst_byte_offset
        used = pairs if f.page_count is None else pairs[: f.page_count]
        rows = getattr(f, "rows_per_page", 1)
        run = f.bytes_per_page // rows
        src_rs, dst_rs = (
            getattr(f, "src_row_stride_bytes", 0),
            getattr(f, "dst_row_stride_bytes", 0),
        )
        for sp, dp in used:
            src = src_base + sp * f.src_page_stride_bytes
            dst = dst_base + dp * f.dst_page_stride_bytes
            for r in range(rows):
                out.append((src + r * src_rs, dst + r * dst_rs, run))
    return out


def descriptors_numpy(
    fragments: Any, src_bases: Any, dst_bases: Any, src_pages: Any, dst_pages: Any
) -> tuple[Any, Any, Any]:
    """Vectorized: one numpy expression per fragment, concatenated (no bounds checks)."""
    import numpy as np

    sp, dp = src_pages.astype(np.uint64), dst_pages.astype(np.uint64)
    srcs, dsts, lens = [], [], []
    for f in fragments:
        n = len(sp) if f.page_count is None else min(f.page_count, len(sp))
        rows = np.arange(f.rows_per_page, dtype=np.uint64)
        srcs.append(
            (
                np.uint64(src_bases[f.buffer_index] + f.src_byte_offset)
                + sp[:n, None] * np.uint64(f.src_page_stride_bytes)
                + rows[None, :] * np.uint64(f.src_row_stride_bytes)
            ).ravel()
        )
        dsts.append(
            (
                np.uint64(dst_bases[f.buffer_index] + f.dst_byte_offset)
                + dp[:n, None] * np.uint64(f.dst_page_stride_bytes)
                + rows[None, :] * np.uint64(f.dst_row_stride_bytes)
            ).ravel()
        )
        lens.append(np.full(n * f.rows_per_page, f.bytes_per_page // f.rows_per_page, np.uint64))
    return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(lens)
