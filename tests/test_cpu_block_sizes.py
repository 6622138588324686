"""vLLM's CPU attention cache between block sizes: ``[blocks, kv_heads, block_size, 2 *
head_size]`` float32 as its ``"vec"`` kernel fills it (``cpu_attn_reshape_and_cache``: each
(block, head) holds K transposed, element ``d`` of the block's token ``p`` at ``d *
block_size + p``, then V token by token at ``block_size * head_size + p * head_size + d``).
pdplan describes a head's page as ``token_pieces=(head_size, 1)`` and moves a request's tokens
by slot maps between caches of 32- and 128-token blocks, at TP changes, with guard values
everywhere no token of the request lands; the oracle is each token's K and V written element
by element as the kernel lays them out (which tests/vllm_engine/test_cpu_kernel_layout.py
holds to vLLM's own kernel)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pdplan import ParallelLayout, PDTransferPlanner, PreparedTransfer, token_slots
from pdplan.runtimes import vllm

HEADS, HEAD_DIM, LAYERS, BLOCKS = 4, 8, 2, 24
GUARD = -7.0


def value(layer: int, token: int, head: int, plane: int, d: int) -> float:
    """The oracle's value of K (plane 0) or V (plane 1) element ``d`` of a token's head."""
    return float(layer * 100000 + token * 100 + head * 10 + plane * 5 + d % 5) + d / 64


def cache(heads: int, block: int) -> np.ndarray:
    """One layer of one rank: its cache as vLLM's CPU backend allocates it, all guard."""
    return np.full((BLOCKS, heads, block, 2 * HEAD_DIM), GUARD, np.float32)


def write(
    tensor: np.ndarray, slot: int, layer: int, token: int, heads: range, head_dim: int = HEAD_DIM
) -> None:
    """One token's K and V of ``heads`` (global) at ``slot``, as the "vec" kernel lays them."""
    block_size = tensor.shape[2]
    block, at = divmod(slot, block_size)
    for local, head in enumerate(heads):
        slab = tensor[block, local].reshape(-1)
        for d in range(head_dim):
            slab[d * block_size + at] = value(layer, token, head, 0, d)
            slab[block_size * head_dim + at * head_dim + d] = value(layer, token, head, 1, d)


def heads_of(rank: int, tp: int) -> range:
    share = HEADS // tp
    return range(rank * share, (rank + 1) * share)


def table(first_block: int, tokens: int, block: int) -> list[int]:
    """A request's blocks: every other block from ``first_block`` (never neighbours)."""
    return [first_block + 2 * i for i in range(-(-tokens // block))]


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(1, 1), (2, 1), (1, 2), (2, 4)])
@pytest.mark.parametrize(("prefill_block", "decode_block"), [(32, 128), (128, 32)])
def test_tokens_move_between_cpu_caches_of_other_block_sizes(
    prefill_tp: int, decode_tp: int, prefill_block: int, decode_block: int
) -> None:
    num_tokens = 150
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    prefill = [
        {n: cache(HEADS // prefill_tp, prefill_block) for n in names} for _ in range(prefill_tp)
    ]
    decode = [{n: cache(HEADS // decode_tp, decode_block) for n in names} for _ in range(decode_tp)]
    src_table, dst_table = table(1, num_tokens, prefill_block), table(3, num_tokens, decode_block)
    for rank, layers in enumerate(prefill):
        for layer, name in enumerate(names):
            for t in range(num_tokens):
                slot = src_table[t // prefill_block] * prefill_block + t % prefill_block
                write(layers[name], slot, layer, t, heads_of(rank, prefill_tp))

    def describe(layers: dict[str, np.ndarray], tp: int) -> object:
        return vllm.buffers(layers, backend="CPU_ATTN", tp_size=tp, num_kv_heads=HEADS,
                            isa=vllm.CPU_TOKEN_ISA)  # fmt: skip

    p_caches = [describe(c, prefill_tp) for c in prefill]
    d_caches = [describe(c, decode_tp) for c in decode]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_tp),
        decode_layout=ParallelLayout("decode", decode_tp),
        prefill_buffers=p_caches[0].buffers,  # type: ignore[attr-defined]
        decode_buffers=d_caches[0].buffers,  # type: ignore[attr-defined]
        decode_replicas="all",
        token_maps=True,
    )
    planner.verify()
    src_slots = token_slots(src_table, prefill_block, num_tokens)
    dst_slots = token_slots(dst_table, decode_block, num_tokens)
    for target in range(decode_tp):
        for source, fragments in planner.transfer_fragments(target).items():
            p, d = p_caches[source], d_caches[target]
            prepared = PreparedTransfer(
                fragments, p.base_ptrs, d.base_ptrs,  # type: ignore[attr-defined]
                src_limits=p.limits, dst_limits=d.limits,  # type: ignore[attr-defined]
            )  # fmt: skip
            moved = prepared.token_descriptors(src_slots, dst_slots)
            for s, t, n in moved.as_array().tolist():
                ctypes.memmove(t, s, n)
    for rank, layers in enumerate(decode):
        for layer, name in enumerate(names):
            want = cache(HEADS // decode_tp, decode_block)
            for t in range(num_tokens):
                slot = dst_table[t // decode_block] * decode_block + t % decode_block
                write(want, slot, layer, t, heads_of(rank, decode_tp))
            # Every token's K and V in place; the rest of the blocks (the last block's free
            # slots, the blocks not named) still guard.
            np.testing.assert_array_equal(layers[name], want)
