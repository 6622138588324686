"""Layouts the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdplan import (
    BufferLayout,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    model_buffer_layouts,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    prefill: ParallelLayout
    decode: ParallelLayout
    prefill_buffers: tuple[BufferLayout, ...]
    decode_buffers: tuple[BufferLayout, ...]

    @property
    def args(self) -> tuple[object, ...]:
        return (self.prefill, self.decode, self.prefill_buffers, self.decode_buffers)

    def planner(self) -> PDTransferPlanner:
        return PDTransferPlanner(
            prefill_layout=self.prefill,
            decode_layout=self.decode,
            prefill_buffers=self.prefill_buffers,
            decode_buffers=self.decode_buffers,
        )


def cluster(
    prefill_dp: int,
    prefill_tp: int,
    decode_dp: int,
    decode_tp: int,
    *,
    layers: int = 80,
    heads: int = 8,
    head_dim: int = 128,
    page: int = 16,
    dtype: str = "bfloat16",
    kv_layout: Literal["HND", "NHD"] = "HND",
    prefill_pp: int = 1,
    decode_pp: int = 1,
) -> Scenario:
    """K and V of every layer, built by pdplan's own model-layout builder."""
    shape = ModelShape(layers, heads, head_dim, dtype=dtype, page_size=page)
    prefill_buffers, decode_buffers = model_buffer_layouts(
        shape, prefill_tp, decode_tp, kv_layout, prefill_pp=prefill_pp, decode_pp=decode_pp
    )
    prefill_world = prefill_dp * prefill_pp * prefill_tp
    decode_world = decode_dp * decode_pp * decode_tp
    return Scenario(
        name=f"prefill {prefill_dp}x{prefill_pp}x{prefill_tp} -> decode "
        f"{decode_dp}x{decode_pp}x{decode_tp}",
        prefill=ParallelLayout("prefill", prefill_world, prefill_dp, prefill_pp),
        decode=ParallelLayout("decode", decode_world, decode_dp, decode_pp),
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
    )


def large_world() -> Scenario:
    """The scale issue's target: 4096 prefill ranks (256 x TP 16), 1024 decode (256 x TP 4),
    80 layers of K and V, 8 KV heads (replica groups of 2 on prefill), 16-token pages,
    head dim 128, bf16."""
    return cluster(256, 16, 256, 4)


@dataclass(frozen=True)
class Request:
    """One request's transfer from one prefill rank: its fragments, base pointers and pages."""

    fragments: tuple[object, ...]
    src_bases: list[int]
    dst_bases: list[int]
    src_pages: object
    dst_pages: object
    src_limits: list[int]
    dst_limits: list[int]


def llama70b_request(
    tokens: int = 32768, page: int = 16, kv_layout: Literal["HND", "NHD"] = "HND"
) -> Request:
    """A Llama-3-70B-like model (80 layers, 8 KV heads, head dim 128, bf16) going from prefill
    TP 8 to decode TP 2: prefill rank 5's 160 fragments to decode rank 1, 2048 pages of a
    32k-token request in two contiguous runs, pages placed as a paged allocator would. In NHD
    pages each fragment moves one run per token row (16 a page)."""
    import numpy as np

    from pdplan import PDTransferPlanner

    s = cluster(1, 8, 1, 2, layers=80, heads=8, head_dim=128, page=page, kv_layout=kv_layout)
    planner = PDTransferPlanner(
        prefill_layout=s.prefill,
        decode_layout=s.decode,
        prefill_buffers=s.prefill_buffers,
        decode_buffers=s.decode_buffers,
    )
    fragments = planner.plan_for_decode_rank(1).fragments_by_prefill_rank[5]
    pages = tokens // page
    half = pages // 2
    src_pages = np.concatenate([np.arange(100, 100 + half), np.arange(5000, 5000 + pages - half)])
    dst_pages = np.concatenate([np.arange(7, 7 + half), np.arange(3000, 3000 + pages - half)])
    capacity = 8192  # pages each buffer holds
    src_limits = [b.item_stride_bytes * capacity for b in s.prefill_buffers]
    dst_limits = [b.item_stride_bytes * capacity for b in s.decode_buffers]
    src_bases = [0x7F00_0000_0000 + i * src_limits[i] for i in range(len(src_limits))]
    dst_bases = [0x7E00_0000_0000 + i * dst_limits[i] for i in range(len(dst_limits))]
    return Request(
        fragments,
        src_bases,
        dst_bases,
        src_pages.astype(np.int32),
        dst_pages.astype(np.int32),
        src_limits,
        dst_limits,
    )
