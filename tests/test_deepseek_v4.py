"""DeepSeek-V4 read from its published config file (tests/data/published_configs/
deepseek-v4-flash): what the reader defaults to as vLLM does, what it refuses and why, and
every cache's pages moved byte for byte between two TP sizes, page tables per cache (vLLM keeps
a block table per KV cache group), padding and guard bytes untouched. The caches' sizes are
held to the specs vLLM itself builds in tests/vllm_engine/test_deepseek_v4_caches.py; here the
oracle is the bytes of the arrays."""

from __future__ import annotations

import ctypes
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdplan import (
    DeepseekV4Layer,
    ModelShape,
    Pairing,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
)

FLASH = Path(__file__).parent / "data" / "published_configs" / "deepseek-v4-flash"
GUARD = 0xA5


def padded(items: int, item_bytes: int, align: int = 576) -> int:
    """A page of `items` items rounded up to vLLM's page alignment (576 for fp8_ds_mla)."""
    return -(-items * item_bytes // align) * align


def flash_with(tmp_path: Path, **changes: Any) -> Path:
    config = json.loads((FLASH / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_reader_pages_and_types_the_cache_as_vllm_does() -> None:
    shape = ModelShape.from_hf_config(FLASH)
    # vLLM pages DeepSeek-V4 at 256 tokens and resolves kv_cache_dtype="auto" to fp8_ds_mla.
    assert (shape.page_size, shape.kv_cache_dtype) == (256, "float8_e4m3fn")
    assert shape.model_layers[:4] == (
        DeepseekV4Layer(512, 128),
        DeepseekV4Layer(512, 128),
        DeepseekV4Layer(512, 128, compress_ratio=4, index_head_dim=128),
        DeepseekV4Layer(512, 128, compress_ratio=128),
    )
    # A page size the caller names is kept, and the caches refuse it naming the one to use.
    at16 = ModelShape.from_hf_config(FLASH, page_size=16)
    assert at16.page_size == 16
    with pytest.raises(UnsupportedPDLayoutError, match="page_size=256"):
        model_buffer_layouts(at16, 1, 1)


def test_the_summary_counts_compressed_entries_by_their_tokens() -> None:
    kinds = {k.compress_ratio: k for k in ModelShape.from_hf_config(FLASH).summary()}
    # Sliding latent: 64 tokens of 584 bytes a page; compressed: 256 / r entries a page, and at
    # r = 4 the indexer's 64 keys of 132 bytes a page beside them.
    assert {r: k.token_bytes for r, k in kinds.items()} == dict.fromkeys(
        (1, 4, 128), padded(64, 584) // 64
    )
    c4 = padded(64, 584) // 64 + padded(64, 128 + 4) // 64
    assert (kinds[4].entry_bytes, kinds[128].entry_bytes) == (c4, padded(2, 584) // 2)
    assert kinds[4].compressed_bytes(32_771) == 32_768 // 4 * c4
    assert kinds[128].compressed_bytes(127) == 0 and kinds[1].compressed_bytes(10**6) == 0
    assert len(kinds[4].layers) == 21 and len(kinds[128].layers) == 20


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"compress_ratios": [0, 0, 8] + [4] * 41}, "compress_ratio=8"),
        ({"compress_ratios": [0, 4]}, "compress_ratios lists 2 layers but the model has 43"),
        ({"kv_cache_dtype": "float16"}, "fp8_ds_mla"),
        ({"index_head_dim": 100}, "index_head_dim=100"),
    ],
)
def test_what_vllm_does_not_build_is_refused_by_name(
    tmp_path: Path, changes: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=refusal):
        model_buffer_layouts(ModelShape.from_hf_config(flash_with(tmp_path, **changes)), 1, 1)


def test_one_request_on_one_page_table_is_refused_where_each_cache_pages_its_own() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="page table per KV cache group"):
        Pairing(FLASH, ParallelLayout("prefill", 8), ParallelLayout("decode", 4))


def guarded_pages(pages: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    block = np.full(pages * stride + 128, GUARD, dtype=np.uint8)
    inner = block[64:-64]
    inner[:] = 0
    return inner, block


def test_every_cache_moves_byte_exact_page_table_by_page_table() -> None:
    # The first four layers of DeepSeek-V4-Flash: two sliding-only, one at ratio 4, one at 128.
    shape = ModelShape.from_hf_config(FLASH)
    shape = replace(shape, layer_kinds=shape.model_layers[:4])
    prefill_buffers, decode_buffers = model_buffer_layouts(shape, 8, 2)
    assert len(prefill_buffers) == 1 + 1 + 5 + 3
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=prefill_buffers,
        decode_buffers=decode_buffers,
    )
    rng = np.random.default_rng(4)
    pages = 12
    # Each cache its own page table, as vLLM gives each KV cache group its own block ids.
    tables = [(rng.permutation(pages)[:5], rng.permutation(pages)[:5]) for _ in prefill_buffers]
    # Replicated caches hold the same bytes on every prefill rank.
    contents = [
        rng.integers(0, 256, pages * b.item_stride_bytes, np.uint8) for b in prefill_buffers
    ]
    src = {}
    for rank in range(8):
        src[rank] = [guarded_pages(pages, b.item_stride_bytes) for b in prefill_buffers]
        for (inner, _), content in zip(src[rank], contents):
            inner[:] = content
    dst = {
        rank: [guarded_pages(pages, b.item_stride_bytes) for b in decode_buffers] for rank in (0, 1)
    }
    for decode_rank in (0, 1):
        for prefill_rank, fragments in planner.transfer_fragments(decode_rank).items():
            prepared = PreparedTransfer(
                fragments,
                [inner.ctypes.data for inner, _ in src[prefill_rank]],
                [inner.ctypes.data for inner, _ in dst[decode_rank]],
                src_limits=[inner.nbytes for inner, _ in src[prefill_rank]],
                dst_limits=[inner.nbytes for inner, _ in dst[decode_rank]],
            )
            for index, (src_pages, dst_pages) in enumerate(tables):
                moved = prepared.descriptors(src_pages, dst_pages, buffers=[index])
                for s, d, n in zip(
                    moved.src_addrs.tolist(), moved.dst_addrs.tolist(), moved.lengths.tolist()
                ):
                    ctypes.memmove(d, s, n)
    for decode_rank in (0, 1):
        for index, buffer in enumerate(decode_buffers):
            inner, block = dst[decode_rank][index]
            stride = buffer.item_stride_bytes
            content = buffer.page_bytes or stride
            want = np.zeros_like(inner)
            for s, d in zip(*tables[index]):
                want[d * stride : d * stride + content] = contents[index][
                    s * stride : s * stride + content
                ]
            assert np.array_equal(inner, want), f"decode rank {decode_rank}, buffer {index}"
            assert (block[:64] == GUARD).all() and (block[-64:] == GUARD).all()


def test_the_command_reads_the_file_at_vllm_s_page_size_and_says_what_it_cannot_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pdplan.cli import main

    code = main(["check", "--config", str(FLASH), "--prefill-tp", "8", "--decode-tp", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "21 x DeepSeek-V4 attention (window 128; compressed 1 entry per 4 tokens" in out
    assert f"{padded(64, 584) // 64} B a token" in out
    assert "a 32k-token request: not estimated here:" in out
    assert "verified" in out
