"""Layouts the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass

from pdplan import BufferKind, BufferLayout, ParallelLayout


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


def kv_buffers(
    tp: int, layers: int, heads: int, head_dim: int, page: int, dtype_bytes: int
) -> tuple[BufferLayout, ...]:
    replica = tp // heads if tp > heads else 1
    unit = page * head_dim * dtype_bytes
    local = heads // (tp // replica)
    return tuple(
        BufferLayout(
            i,
            BufferKind.TARGET_K if i % 2 == 0 else BufferKind.TARGET_V,
            "kv_head",
            heads,
            page,
            unit,
            local * unit,
            replica,
        )
        for i in range(2 * layers)
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
    dtype_bytes: int = 2,
) -> Scenario:
    shape = (layers, heads, head_dim, page, dtype_bytes)
    return Scenario(
        name=f"prefill {prefill_dp}x{prefill_tp} -> decode {decode_dp}x{decode_tp}",
        prefill=ParallelLayout("prefill", prefill_dp * prefill_tp, prefill_dp),
        decode=ParallelLayout("decode", decode_dp * decode_tp, decode_dp),
        prefill_buffers=kv_buffers(prefill_tp, *shape),
        decode_buffers=kv_buffers(decode_tp, *shape),
    )


def large_world() -> Scenario:
    """The scale issue's target: 4096 prefill ranks (256 x TP 16), 1024 decode (256 x TP 4),
    80 layers of K and V, 8 KV heads (replica groups of 2 on prefill), 16-token pages,
    head dim 128, bf16."""
    return cluster(256, 16, 256, 4)
