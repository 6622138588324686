"""Numpy stand-ins for runtimes' cache tensors, of exactly the shapes and strides vLLM and
SGLang allocate, labelled so that every element says which (layer, K/V, token, head, byte)
it holds; and a transfer that moves real bytes by descriptors, checked element by element.

The oracle knows nothing of pdplan's rules: a decode element's expected label is the label
the prefill element of the same (layer, K/V, request token, global head, dim) carries."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from pdplan import CacheBuffers, PreparedTransfer

#: An element no transfer may write (guard bytes around and between the caches).
GUARD = -7


def label(layer: int, plane: int, token: int, head: int, dim: int) -> int:
    """What a KV element holds: its coordinates, packed (unique for the sizes used here)."""
    return ((((layer * 2 + plane) * 4096 + token) * 64 + head) * 1024 + dim) + 1


def guarded(shape: tuple[int, ...], dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """A zero-filled array with guard elements before and after it: (array, whole block)."""
    count = int(np.prod(shape))
    block = np.full(count + 64, GUARD, dtype=dtype)
    inner = block[32 : 32 + count]
    inner[:] = 0
    return inner.reshape(shape), block


@dataclass
class Side:
    """One rank's cache tensors and where each request token sits in them."""

    tensors: list[Any] = field(default_factory=list)
    blocks: list[np.ndarray] = field(default_factory=list)

    def keep(self, pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        self.blocks.append(pair[1])
        return pair[0]


def vllm_kv(
    *,
    layers: int,
    blocks: int,
    block_size: int,
    heads: int,
    dim: int,
    backend: str = "FLASH_ATTN",
    hnd: bool = False,
) -> Side:
    """Per-layer tensors as vLLM allocates them: the logical shape, memory permuted for HND."""
    side = Side()
    for _ in range(layers):
        if backend == "FLASH_ATTN":
            physical = (2, blocks, heads, block_size, dim) if hnd else None
            logical = (2, blocks, block_size, heads, dim)
            order = (0, 1, 3, 2, 4)
        else:  # FLASHINFER
            physical = (blocks, 2, heads, block_size, dim) if hnd else None
            logical = (blocks, 2, block_size, heads, dim)
            order = (0, 1, 3, 2, 4)
        if physical is None:
            side.tensors.append(side.keep(guarded(logical)))
        else:
            side.tensors.append(side.keep(guarded(physical)).transpose(order))
    return side


def vllm_mla(*, layers: int, blocks: int, block_size: int, width: int) -> Side:
    side = Side()
    for _ in range(layers):
        side.tensors.append(side.keep(guarded((blocks, block_size, width))))
    return side


def sglang_mha(*, layers: int, size: int, page_size: int, heads: int, dim: int) -> Any:
    side = Side()
    k = [side.keep(guarded((size + page_size, heads, dim))) for _ in range(layers)]
    v = [side.keep(guarded((size + page_size, heads, dim))) for _ in range(layers)]
    pool = SimpleNamespace(
        k_buffer=k, v_buffer=v, head_num=heads, head_dim=dim, page_size=page_size, size=size
    )
    return pool, side


def sglang_mla(*, layers: int, size: int, page_size: int, width: int) -> Any:
    side = Side()
    kv = [side.keep(guarded((size + page_size, 1, width))) for _ in range(layers)]
    return SimpleNamespace(kv_buffer=kv, page_size=page_size, size=size), side


@dataclass
class RankCache:
    """One rank's KV cache, element by element: per layer its planes (K, V; MLA one), each
    read a token slot at a time as a writable ``[local head, dim]`` view."""

    planes: list[list[np.ndarray]]
    block_size: int | None  # vLLM's blocks; None for a flat pool

    def token(self, view: np.ndarray, slot: int) -> np.ndarray:
        if self.block_size is None:
            return view[slot]
        at = view[slot // self.block_size, slot % self.block_size]
        return at if at.ndim == 2 else at[None, :]

    @classmethod
    def of_vllm(cls, side: Side, backend: str, block_size: int) -> RankCache:
        planes = []
        for tensor in side.tensors:
            if backend == "FLASH_ATTN":
                planes.append([tensor[0], tensor[1]])
            elif backend == "FLASHINFER":
                planes.append([tensor[:, 0], tensor[:, 1]])
            else:
                planes.append([tensor])
        return cls(planes, block_size)

    @classmethod
    def of_sglang(cls, pool: Any) -> RankCache:
        if hasattr(pool, "k_buffer"):
            return cls([[k, v] for k, v in zip(pool.k_buffer, pool.v_buffer)], None)
        return cls([[kv] for kv in pool.kv_buffer], None)

    def fill(self, slots: np.ndarray, head_of: Any) -> None:
        """Labels every request token's elements (a prefill rank)."""
        for layer, planes in enumerate(self.planes):
            for plane, view in enumerate(planes):
                for token, slot in enumerate(slots.tolist()):
                    at = self.token(view, slot)
                    for local in range(at.shape[0]):
                        at[local, :] = [
                            label(layer, plane, token, head_of(local), d)
                            for d in range(at.shape[1])
                        ]

    def expected(self, slots: np.ndarray, head_of: Any, tokens: range) -> list[np.ndarray]:
        """Every plane as it must be after the moved tokens arrive (a decode rank)."""
        wanted = []
        for layer, planes in enumerate(self.planes):
            for plane, view in enumerate(planes):
                want = view.copy()
                probe = RankCache([[want]], self.block_size)
                for token in tokens:
                    at = probe.token(want, int(slots[token]))
                    for local in range(at.shape[0]):
                        at[local, :] = [
                            label(layer, plane, token, head_of(local), d)
                            for d in range(at.shape[1])
                        ]
                wanted.append(want)
        return wanted

    def actual(self) -> list[np.ndarray]:
        return [view.copy() for planes in self.planes for view in planes]


def move(descriptors: Any) -> int:
    """Copies every descriptor's bytes; returns the bytes moved."""
    total = 0
    for src, dst, length in zip(
        descriptors.src_addrs.tolist(), descriptors.dst_addrs.tolist(), descriptors.lengths.tolist()
    ):
        ctypes.memmove(dst, src, length)
        total += length
    return total


def guards_intact(side: Side) -> bool:
    return all(
        (block[:32] == GUARD).all() and (block[-32:] == GUARD).all() for block in side.blocks
    )


def bases_and_limits(cache: CacheBuffers) -> tuple[list[int], list[int]]:
    return list(cache.base_ptrs), list(cache.limits)


def prepared_between(fragments: Any, src: CacheBuffers, dst: CacheBuffers) -> PreparedTransfer:
    """One rank pair's transfer between two caches as the adapters read them: their base
    addresses and limits."""
    return PreparedTransfer(
        fragments, src.base_ptrs, dst.base_ptrs, src_limits=src.limits, dst_limits=dst.limits
    )
