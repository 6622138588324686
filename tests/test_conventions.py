"""A runtime's rules in one call (``pdplan.runtimes.vllm.conventions``, ``sglang.conventions``):
vLLM's and SGLang's replica rule (every decode rank reads its own heads) and vLLM's kernel
blocks (a scheduler block of 64 tokens kept as four kernel blocks of 16), each held to the
bytes of arrays shaped as the runtime allocates them."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_caches import RankCache, move, prepared_between, sglang_mha, vllm_kv
from runtime_pairs import heads_of

from pdplan import ParallelLayout, UnsupportedPDLayoutError
from pdplan.runtimes import sglang, vllm

HEADS, DIM = 2, 4


def caches(tp: int, blocks: int, block_size: int) -> list:
    return [
        vllm_kv(layers=2, blocks=blocks, block_size=block_size, heads=max(1, HEADS // tp), dim=DIM)
        for _ in range(tp)
    ]


def test_scheduler_blocks_name_kernel_blocks_through_the_conventions() -> None:
    """The scheduler hands out 64-token blocks; FLASH_ATTN keeps 16-token kernel blocks. Block
    ``b`` is kernel pages ``4b .. 4b + 3``: given as pages, the scheduler's ids would move the
    wrong bytes."""
    rules = vllm.conventions(block_size=64, kernel_block_size=16)
    assert rules.kernel_blocks_per_block == 4 and rules.decode_replicas == "all"
    assert rules.pages([5, 2]).tolist() == [20, 21, 22, 23, 8, 9, 10, 11]
    n, src_blocks, dst_blocks = 100, [5, 2], [0, 3]
    prefill, decode = caches(1, 32, 16)[0], caches(1, 32, 16)[0]
    p = vllm.buffers(prefill.tensors, backend="FLASH_ATTN", tp_size=1, num_kv_heads=HEADS)
    d = vllm.buffers(decode.tensors, backend="FLASH_ATTN", tp_size=1, num_kv_heads=HEADS)
    src_slots, dst_slots = rules.slots(src_blocks, n), rules.slots(dst_blocks, n)
    # The oracle: token t at slot block * 64 + offset of the scheduler's blocks.
    assert src_slots[70] == 2 * 64 + 6 and dst_slots[70] == 3 * 64 + 6
    RankCache.of_vllm(prefill, "FLASH_ATTN", 16).fill(src_slots, heads_of(0, 1, HEADS))
    target = RankCache.of_vllm(decode, "FLASH_ATTN", 16)
    # Whole pages move: the request's tokens, and the rest of its last block (zeros on both).
    want = target.expected(dst_slots, heads_of(0, 1, HEADS), range(n))
    planner = rules.planner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p.buffers,
        decode_buffers=d.buffers,
    )
    prepared = prepared_between(planner.transfer_fragments(0)[0], p, d)
    wrong = prepared.descriptors(src_blocks, dst_blocks)  # the scheduler's ids as pages
    move(prepared.descriptors(rules.pages(src_blocks), rules.pages(dst_blocks)))
    got = target.actual()
    for layer_plane, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g, w, str(layer_plane))
    assert (
        wrong.total_bytes * 4
        == prepared.descriptors(rules.pages(src_blocks), rules.pages(dst_blocks)).total_bytes
    )  # a quarter of the bytes, from the wrong pages


def test_every_vllm_decode_rank_reads_its_own_heads() -> None:
    """2 KV heads, prefill TP 2, decode TP 4: each head is kept by two decode ranks (rank r
    holds head r // 2), and under vLLM's rule each reads it; the reference's rule leaves
    ranks 1 and 3 empty."""
    prefill = caches(2, 8, 16)
    decode = [vllm_kv(layers=2, blocks=8, block_size=16, heads=1, dim=DIM) for _ in range(4)]
    p = [vllm.buffers(s.tensors, backend="FLASH_ATTN", tp_size=2, num_kv_heads=HEADS)
         for s in prefill]  # fmt: skip
    d = [vllm.buffers(s.tensors, backend="FLASH_ATTN", tp_size=4, num_kv_heads=HEADS)
         for s in decode]  # fmt: skip
    layouts = dict(prefill_layout=ParallelLayout("prefill", 2),
                   decode_layout=ParallelLayout("decode", 4))  # fmt: skip
    rules = vllm.conventions(block_size=16)
    planner = rules.planner(**layouts, prefill_buffers=p[0].buffers, decode_buffers=d[0].buffers)
    n, src_pages, dst_pages = 32, [3, 1], [0, 5]
    slots = np.array([src_pages[t // 16] * 16 + t % 16 for t in range(n)])
    dst_slots = np.array([dst_pages[t // 16] * 16 + t % 16 for t in range(n)])
    for rank, side in enumerate(prefill):
        RankCache.of_vllm(side, "FLASH_ATTN", 16).fill(slots, heads_of(rank, 2, HEADS))
    for rank, side in enumerate(decode):
        target = RankCache.of_vllm(side, "FLASH_ATTN", 16)
        want = target.expected(dst_slots, heads_of(rank, 4, HEADS), range(n))
        for source, fragments in planner.transfer_fragments(rank).items():
            prepared = prepared_between(fragments, p[source], d[rank])
            move(prepared.descriptors(src_pages, dst_pages))
        for got, wanted in zip(target.actual(), want, strict=True):
            np.testing.assert_array_equal(got, wanted, f"decode rank {rank}")
    reference = type(planner)(**layouts, prefill_buffers=p[0].buffers, decode_buffers=d[0].buffers)
    assert [bool(reference.transfer_fragments(r)) for r in range(4)] == [True, False, True, False]


def test_sglang_s_conventions_are_its_pool_s_pages_and_every_rank_reads() -> None:
    pool, _ = sglang_mha(layers=1, size=128, page_size=32, heads=2, dim=4)
    rules = sglang.conventions(pool)
    assert (rules.decode_replicas, rules.block_size, rules.kernel_blocks_per_block) == (
        "all", 32, 1)  # fmt: skip
    assert rules.pages([3, 1]).tolist() == [3, 1]


@pytest.mark.parametrize(("block", "kernel"), [(64, 24), (0, 16), (16, 0)])
def test_kernel_blocks_that_do_not_divide_a_block_are_refused(block: int, kernel: int) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="block"):
        vllm.conventions(block_size=block, kernel_block_size=kernel)
