"""Runtimes' caches by identity, never by order: vLLM's layers by their names, SGLang's by their
layer ids and wrapper tables, a layer sharing another's cache described once, and every tensor
of a pool described or refused by name (never left out)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from runtime_caches import guarded, prepared_between, sglang_mha, vllm_kv, vllm_mla

from pdplan import (
    BufferKind,
    CacheBuffers,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    token_slots,
)
from pdplan.runtimes import sglang, vllm


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("model.layers.7.self_attn.attn", 7),
        ("language_model.model.layers.12.mixer", 12),
        ("model.decoder.layers.0.encoder_attn.attn", 0),
    ],
)
def test_a_vllm_layer_is_known_by_the_one_integer_of_its_name(name: str, layer: int) -> None:
    assert vllm.layer_index(name) == layer


@pytest.mark.parametrize("name", ["lm_head", "model.layers.1.experts.2.attn", "layers.x.attn"])
def test_a_name_without_one_layer_number_is_refused_naming_it(name: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=r"names no layer pdplan can read"):
        vllm.layer_index(name)
    with pytest.raises(UnsupportedPDLayoutError, match="names no layer"):
        vllm.buffers({name: vllm_mla(layers=1, blocks=2, block_size=4, width=8).tensors[0]},
                     backend="FLASHMLA", tp_size=1)  # fmt: skip


def test_falcon_h1_s_mixers_numbered_past_the_layers_are_read_as_their_layers() -> None:
    """vLLM's ``falcon_h1.py`` names layer ``i``'s attention ``model.layers.{i}.attn`` and its
    Mamba mixer ``model.{num_hidden_layers + i}.mixer``: each layer's state is that layer's,
    and a name numbered past the model otherwise (a draft model's layer) is refused."""
    from pdplan import StateSpec

    layers = 2
    kv = vllm_kv(layers=layers, blocks=4, block_size=16, heads=2, dim=4)
    states = [[guarded((4, 3, 24))[0], guarded((4, 4, 4, 4))[0]] for _ in range(layers)]
    caches: dict[str, object] = {}
    for i in range(layers):
        caches[f"model.layers.{i}.attn"] = kv.tensors[i]
        caches[f"model.{layers + i}.mixer"] = states[i]
    numbering = vllm.LayerNumbering.of(
        {"architectures": ["FalconH1ForCausalLM"], "num_hidden_layers": layers}
    )
    specs = (StateSpec(48, (32, 8, 8)), StateSpec(8))
    cache = vllm.buffers(caches, backend="FLASH_ATTN", tp_size=2, num_kv_heads=4,
                         states=specs, numbering=numbering)  # fmt: skip
    assert [(b.layer, b.buffer_kind.value) for b in cache.buffers] == [
        (0, "target_k"), (0, "target_v"), (1, "target_k"), (1, "target_v"),
        (0, "mamba_state"), (0, "mamba_state"), (1, "mamba_state"), (1, "mamba_state"),
    ]  # fmt: skip
    # Layer 1's states are the tensors named model.3.mixer.
    assert cache.base_ptrs[6] == states[1][0].ctypes.data
    # Other models' names past their layers are no layer of theirs.
    llama = vllm.LayerNumbering.of({"num_hidden_layers": layers}, "LlamaForCausalLM")
    with pytest.raises(
        UnsupportedPDLayoutError,
        match=r"numbered 2 \(its number is its layer\), past the model's 2 layers",
    ):
        vllm.buffers(caches, backend="FLASH_ATTN", tp_size=2, num_kv_heads=4, states=specs,
                     numbering=llama)  # fmt: skip
    draft = {**caches, "model.layers.4.self_attn.attn": kv.tensors[0]}
    with pytest.raises(UnsupportedPDLayoutError, match="draft model's layer"):
        vllm.buffers(draft, backend="FLASH_ATTN", tp_size=2, num_kv_heads=4, states=specs,
                     numbering=numbering)  # fmt: skip


def test_zamba2_s_names_are_read_as_vllm_s_zamba2_py_numbers_them() -> None:
    """vLLM's ``zamba2.py``: layer ``i``'s mixer is ``{H + i}.mixer`` (``H`` hybrid layers);
    the ``k``-th hybrid layer's attention is ``model.attn.{j}`` in shared block ``k % M``,
    ``j`` counting from ``b * (H + M - 1) // M`` in that block. Worked by hand for hybrid
    layers 1, 3, 4, 6 over two blocks: block 0 holds k = 0, 2 (layers 1, 4) as j = 0, 1;
    block 1 starts at 1 * 5 // 2 = 2 and holds k = 1, 3 (layers 3, 6) as j = 2, 3."""
    kinds = ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba", "hybrid"]
    config = {"architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": 7,
              "layers_block_type": kinds, "num_mem_blocks": 2}  # fmt: skip
    numbering = vllm.LayerNumbering.of(config)
    assert [numbering(f"model.attn.{j}") for j in range(4)] == [1, 4, 3, 6]
    assert [numbering(f"{4 + i}.mixer") for i in range(7)] == list(range(7))
    with pytest.raises(
        UnsupportedPDLayoutError, match=r"numbered 4 \(.*attention j is .*\), past the model's 7"
    ):
        numbering("model.attn.4")
    with pytest.raises(
        UnsupportedPDLayoutError, match=r"numbered 11 \(a mixer numbered n is layer n - 4"
    ):
        numbering("11.mixer")
    with pytest.raises(UnsupportedPDLayoutError, match="layers_block_type and num_mem_blocks"):
        vllm.LayerNumbering.of({**config, "num_mem_blocks": 0})


def test_a_dict_in_any_order_gives_the_buffers_of_model_order() -> None:
    kv = vllm_kv(layers=3, blocks=4, block_size=16, heads=2, dim=4)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(3)]
    forward = vllm.buffers(dict(zip(names, kv.tensors)), backend="FLASH_ATTN", tp_size=1,
                           num_kv_heads=2)  # fmt: skip
    backward = vllm.buffers(dict(reversed(list(zip(names, kv.tensors)))), backend="FLASH_ATTN",
                            tp_size=1, num_kv_heads=2)  # fmt: skip
    assert forward == backward
    # Layer k's K is at layer k's tensor, wherever the dict put it.
    assert forward.base_ptrs[::2] == tuple(t.ctypes.data for t in kv.tensors)
    assert [b.layer for b in forward.buffers] == [0, 0, 1, 1, 2, 2]


def test_a_layer_sharing_another_s_cache_is_described_once() -> None:
    kv = vllm_kv(layers=2, blocks=4, block_size=16, heads=2, dim=4)
    caches = {
        "model.layers.0.self_attn.attn": kv.tensors[0],
        "model.layers.1.self_attn.attn": kv.tensors[1],
        # Gemma 3n's last layers read the cache of an earlier one: the same tensor.
        "model.layers.2.self_attn.attn": kv.tensors[0],
    }
    got = vllm.buffers(caches, backend="FLASH_ATTN", tp_size=1, num_kv_heads=2)
    assert len(got.buffers) == 4 and [b.layer for b in got.buffers] == [0, 0, 1, 1]
    assert got.shared == (("model.layers.2.self_attn.attn", "model.layers.0.self_attn.attn"),)
    # Layers of two cache groups viewing the same memory (vLLM starts every group at byte 0)
    # are two layers, each described: they read other blocks of it.
    views = {
        "model.layers.0.self_attn.attn": kv.tensors[0],
        "model.layers.1.self_attn.attn": kv.tensors[0][:],  # another view of the same bytes
    }
    both = vllm.buffers(views, backend="FLASH_ATTN", tp_size=1, num_kv_heads=2)
    assert [b.layer for b in both.buffers] == [0, 0, 1, 1] and both.shared == ()


def test_an_mla_indexer_page_moves_each_token_s_keys_and_its_scale() -> None:
    """DeepSeek-V3.2's indexer cache, vLLM's (blocks of 16 tokens, ``(blocks, 16, 132)``
    uint8) into SGLang's DSA pool (pages of 64, ``(pages, 64 * 132)``): in both a page holds
    every token's 128 fp8 keys, then every token's fp32 scale. By slot maps, each token's keys
    and its scale arrive at its slot's place in both parts (the oracle: byte offsets from that
    page layout, not from pdplan)."""
    n, layers = 25, 2
    rng = np.random.default_rng(7)
    latents = vllm_mla(layers=layers, blocks=8, block_size=16, width=72)
    index = [rng.integers(1, 255, (8, 16, 132), dtype=np.uint8) for _ in range(layers)]
    caches = {}
    for layer in range(layers):
        caches[f"model.layers.{layer}.self_attn.attn"] = latents.tensors[layer]
        caches[f"model.layers.{layer}.self_attn.indexer.k_cache"] = index[layer]
    src = vllm.buffers(caches, backend="FLASHMLA", tp_size=1)
    assert vllm.indexer_parts(132) == (128, 4)
    # Latents first, then each layer's indexer keys and scales.
    assert [b.layer for b in src.buffers] == [0, 1, 0, 0, 1, 1]
    rows = 128 + 64
    pool = SimpleNamespace(
        kv_buffer=[np.zeros((rows, 1, 72), dtype=np.int64) for _ in range(layers)],
        index_k_with_scale_buffer=[np.zeros((3, 64 * 132), np.uint8) for _ in range(layers)],
        page_size=64,
    )
    dst = sglang.buffers(pool, tp_size=1)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=src.buffers,
        decode_buffers=dst.buffers,
    )
    assert planner.token_maps  # page sizes differ: tokens move by slot maps
    src_slots, dst_slots = token_slots([3, 6], 16, n), token_slots([1], 64, n)
    prepared = prepared_between(planner.transfer_fragments(0)[0], src, dst)
    for s, d, length in prepared.token_descriptors(src_slots, dst_slots).as_array().tolist():
        ctypes.memmove(d, s, length)
    for layer in range(layers):
        flat_src = index[layer].reshape(8, -1)
        flat_dst = pool.index_k_with_scale_buffer[layer]
        for token, (s, d) in enumerate(zip(src_slots.tolist(), dst_slots.tolist())):
            (sp, so), (dp, do) = divmod(s, 16), divmod(d, 64)
            keys = flat_src[sp, so * 128 : (so + 1) * 128]
            scale = flat_src[sp, 16 * 128 + so * 4 : 16 * 128 + (so + 1) * 4]
            np.testing.assert_array_equal(flat_dst[dp, do * 128 : (do + 1) * 128], keys)
            np.testing.assert_array_equal(
                flat_dst[dp, 64 * 128 + do * 4 : 64 * 128 + (do + 1) * 4], scale, str(token)
            )
        # Nothing else of the page was written: the slots of tokens not moved stay zero.
        untouched = np.ones(64, dtype=bool)
        untouched[[d % 64 for d in dst_slots.tolist()]] = False
        assert not flat_dst[1, : 64 * 128].reshape(64, 128)[untouched].any()
        assert not flat_dst[1, 64 * 128 :].reshape(64, 4)[untouched].any()
        assert not flat_dst[[0, 2]].any()


def test_an_swa_pool_is_unwrapped_by_its_layer_table() -> None:
    full, _ = sglang_mha(layers=2, size=64, page_size=16, heads=2, dim=4)
    swa, _ = sglang_mha(layers=2, size=32, page_size=16, heads=2, dim=4)
    pool = SimpleNamespace(
        full_kv_pool=full,
        swa_kv_pool=swa,
        # global layer -> (index in its sub-pool, is SWA): layers 1 and 3 slide.
        layers_mapping={0: (0, False), 1: (0, True), 2: (1, False), 3: (1, True)},
        page_size=16,
    )
    got = sglang.buffers(pool, tp_size=1)
    assert [b.layer for b in got.buffers] == [0, 0, 1, 1, 2, 2, 3, 3]
    want = [full.k_buffer[0], full.v_buffer[0], swa.k_buffer[0], swa.v_buffer[0],
            full.k_buffer[1], full.v_buffer[1], swa.k_buffer[1], swa.v_buffer[1]]  # fmt: skip
    assert got.base_ptrs == tuple(a.ctypes.data for a in want)


GUARD = 0xA5


def guarded_bytes(shape: tuple[int, ...], blocks: list[np.ndarray]) -> np.ndarray:
    """Zeroed uint8 memory of ``shape`` with 32 guard bytes either side (kept in ``blocks``)."""
    count = int(np.prod(shape))
    block = np.full(count + 64, GUARD, dtype=np.uint8)
    block[32 : 32 + count] = 0
    blocks.append(block)
    return block[32 : 32 + count].reshape(shape)


def guards_hold(blocks: list[np.ndarray]) -> bool:
    """Whether the 32 guard bytes either side of every block are untouched."""
    return all((b[:32] == GUARD).all() and (b[-32:] == GUARD).all() for b in blocks)


def one_to_one(src: CacheBuffers, dst: CacheBuffers) -> PreparedTransfer:
    """TP 1 to TP 1 with token maps: rank 0's transfer between two caches."""
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=src.buffers,
        decode_buffers=dst.buffers,
        token_maps=True,
    )
    return prepared_between(planner.transfer_fragments(0)[0], src, dst)


def fp4_pool(*, layers: int, size: int, page_size: int, heads: int, dim: int) -> tuple:
    """SGLang's FP4 MHA pool: packed K/V of (slots, heads, dim / 2) bytes, and a scale byte for
    every 16 values of a token, kept as (slots, heads * dim / 16) (``k_scale_buffer``,
    ``v_scale_buffer``)."""
    blocks: list[np.ndarray] = []
    rows = size + page_size
    k = [guarded_bytes((rows, heads, dim // 2), blocks) for _ in range(layers)]
    v = [guarded_bytes((rows, heads, dim // 2), blocks) for _ in range(layers)]
    pool = SimpleNamespace(
        k_buffer=k,
        v_buffer=v,
        head_num=heads,
        page_size=page_size,
        k_scale_buffer=[guarded_bytes((rows, heads * dim // 16), blocks) for _ in range(layers)],
        v_scale_buffer=[guarded_bytes((rows, heads * dim // 16), blocks) for _ in range(layers)],
    )
    return pool, blocks


def test_fp4_scales_are_buffers_and_move_with_their_tokens() -> None:
    """Prefill TP 1 -> decode TP 2: each decode rank's K/V bytes and scales are its heads' of
    the same tokens (the oracle: the prefill arrays, sliced by head)."""
    heads, dim, n = 4, 32, 21
    per_head = dim // 16  # scale bytes a head and token
    src_pool, _ = fp4_pool(layers=2, size=64, page_size=16, heads=heads, dim=dim)
    rng = np.random.default_rng(3)
    every = [*src_pool.k_buffer, *src_pool.v_buffer, *src_pool.k_scale_buffer,
             *src_pool.v_scale_buffer]  # fmt: skip
    for array in every:
        array[:] = rng.integers(1, 250, array.shape, dtype=np.uint8)
    src = sglang.buffers(src_pool, tp_size=1)
    # K and V layer by layer, then the scales layer by layer, K's then V's.
    k, v = BufferKind.TARGET_K, BufferKind.TARGET_V
    assert [b.buffer_kind for b in src.buffers] == [k, v, k, v, k, v, k, v]
    scales = [a for pair in zip(src_pool.k_scale_buffer, src_pool.v_scale_buffer) for a in pair]
    assert src.base_ptrs[4:] == tuple(a.ctypes.data for a in scales)
    decode = [fp4_pool(layers=2, size=64, page_size=16, heads=heads // 2, dim=dim) for _ in "ab"]
    dst = [sglang.buffers(pool, tp_size=2, num_kv_heads=heads) for pool, _ in decode]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=src.buffers,
        decode_buffers=dst[0].buffers,
        token_maps=True,
    )
    src_slots = token_slots([2, 3], 16, n)
    dst_slots = token_slots([1, 4], 16, n)
    for rank, (pool, blocks) in enumerate(decode):
        for fragments in planner.transfer_fragments(rank).values():
            prepared = prepared_between(fragments, src, dst[rank])
            for s, t, length in (
                prepared.token_descriptors(src_slots, dst_slots).as_array().tolist()
            ):
                ctypes.memmove(t, s, length)
        held = slice(rank * heads // 2, (rank + 1) * heads // 2)
        scale_bytes = slice(held.start * per_head, held.stop * per_head)
        for layer in range(2):
            parts = {"k_buffer": held, "v_buffer": held}
            parts |= {"k_scale_buffer": scale_bytes, "v_scale_buffer": scale_bytes}
            for name, part in parts.items():
                got = getattr(pool, name)[layer][dst_slots]
                want = getattr(src_pool, name)[layer][src_slots][:, part]
                np.testing.assert_array_equal(got, want, err_msg=f"{name}[{layer}] rank {rank}")
        assert guards_hold(blocks)


def swa_pool(size: int, swa_size: int, page: int, mapping: np.ndarray) -> SimpleNamespace:
    """SGLang's SWAKVPool of layer 0 full and layer 1 sliding, with its allocator's
    full_to_swa_index_mapping (int64, size + page_size + 1 long, a -1 sentinel last)."""
    full, _ = sglang_mha(layers=1, size=size, page_size=page, heads=2, dim=4)
    swa, _ = sglang_mha(layers=1, size=swa_size, page_size=page, heads=2, dim=4)
    return SimpleNamespace(
        full_kv_pool=full,
        swa_kv_pool=swa,
        layers_mapping={0: (0, False), 1: (0, True)},
        page_size=page,
        full_to_swa_index_mapping=mapping,
    )


def test_an_swa_pool_s_window_moves_by_its_own_slots() -> None:
    """A 40-token request, window 16: SGLang keeps SWA slots for its last 16 tokens only
    (full_to_swa_index_mapping; 0 for the rest). The full layer moves by the request's slots,
    the sliding layer by swa_slots on each side: its window lands at the decode side's SWA
    slots, nothing else of the SWA pool is written (the oracle: the mappings themselves)."""
    n, window, page = 40, 16, 16
    rng = np.random.default_rng(11)

    def side(first_slot: int, first_swa: int) -> tuple[SimpleNamespace, np.ndarray]:
        slots = np.arange(first_slot, first_slot + n)
        mapping = np.zeros(128 + page + 1, dtype=np.int64)
        mapping[-1] = -1
        mapping[slots[n - window :]] = np.arange(first_swa, first_swa + window)
        return swa_pool(128, 64, page, mapping), slots

    (src_pool, src_full), (dst_pool, dst_full) = side(16, 17), side(48, 33)
    for array in [*src_pool.full_kv_pool.k_buffer, *src_pool.swa_kv_pool.k_buffer,
                  *src_pool.full_kv_pool.v_buffer, *src_pool.swa_kv_pool.v_buffer]:  # fmt: skip
        array[:] = rng.integers(1, 1 << 30, array.shape)
    src = sglang.buffers(src_pool, tp_size=1)
    dst = sglang.buffers(dst_pool, tp_size=1)
    assert sglang.swa_buffers(src_pool, src) == (2, 3)
    src_swa, dst_swa = sglang.swa_slots(src_pool, src_full), sglang.swa_slots(dst_pool, dst_full)
    assert (src_swa[: n - window] == -1).all() and src_swa[-1] == 17 + window - 1
    prepared = one_to_one(src, dst)
    for src_slots, dst_slots, chosen in ((src_full, dst_full, (0, 1)),
                                         (src_swa, dst_swa, (2, 3))):  # fmt: skip
        moved = prepared.token_descriptors(src_slots, dst_slots, buffers=chosen)
        for s, d, length in moved.as_array().tolist():
            ctypes.memmove(d, s, length)
    for name in ("k_buffer", "v_buffer"):
        full_got = getattr(dst_pool.full_kv_pool, name)[0]
        full_src = getattr(src_pool.full_kv_pool, name)[0]
        np.testing.assert_array_equal(full_got[dst_full], full_src[src_full])
        swa_got = getattr(dst_pool.swa_kv_pool, name)[0]
        swa_src = getattr(src_pool.swa_kv_pool, name)[0]
        held = dst_swa >= 0
        np.testing.assert_array_equal(swa_got[dst_swa[held]], swa_src[src_swa[held]])
        others = np.ones(swa_got.shape[0], dtype=bool)
        others[dst_swa[held]] = False
        assert not swa_got[others].any()


def test_nvfp4_native_scales_are_refused_by_name() -> None:
    pool, _ = fp4_pool(layers=1, size=32, page_size=16, heads=2, dim=32)
    pool.native_k_scale_buffer = [np.zeros((3, 2, 16, 2), np.uint8)]
    with pytest.raises(UnsupportedPDLayoutError, match=r"native_k_scale_buffer"):
        sglang.buffers(pool, tp_size=1)


def minimax_sparse_pool(size: int, page: int, blocks: list[np.ndarray]) -> SimpleNamespace:
    """SGLang's MiniMaxSparseKVPool of four layers, as its __init__ builds it: layers 0 and 2
    dense, 1 and 3 sparse, layer 3 in disable_value_sparse_layer_ids. ``main_pool`` holds K
    and V of all four (bf16 as bytes, (size + page, heads, 2 * dim)); layer 1's index K and V sit in
    ``index_kv_pool``, layer 3's index K alone in ``index_k_pool`` (head_num=1,
    idx_head_dim, the index dtype fp8)."""
    heads, dim, idx_dim, rows = 2, 8, 16, size + page

    def main_planes() -> list[np.ndarray]:
        return [guarded_bytes((rows, heads, dim * 2), blocks) for _ in range(4)]

    main = SimpleNamespace(k_buffer=main_planes(), v_buffer=main_planes(), head_num=heads,
                           page_size=page, start_layer=0)  # fmt: skip
    index = [guarded_bytes((rows, 1, idx_dim), blocks) for _ in range(3)]
    return SimpleNamespace(
        main_pool=main,
        index_kv_pool=SimpleNamespace(k_buffer=[index[0]], v_buffer=[index[1]], page_size=page),
        index_k_pool=SimpleNamespace(k_buffer=[index[2]], page_size=page),
        index_kv_layer_id_mapping={1: 0},
        index_k_layer_id_mapping={3: 0},
        sparse_layer_id_mapping={1: 0, 3: 1},
        page_size=page,
    )


def test_a_minimax_sparse_pool_moves_its_main_kv_and_index_caches() -> None:
    """The wrapper is unwrapped, nothing left out: K and V of the four layers, then the index
    caches layer by layer (layer 1's K and V, layer 3's K). Page size 16 -> 32 by slot maps:
    every decode slot holds the prefill slot's bytes of the same tensor (the oracle: the
    arrays themselves), and nothing else is written."""
    n = 37
    src_blocks: list[np.ndarray] = []
    dst_blocks: list[np.ndarray] = []
    src_pool = minimax_sparse_pool(128, 16, src_blocks)
    dst_pool = minimax_sparse_pool(128, 32, dst_blocks)
    rng = np.random.default_rng(5)

    def tensors(pool: SimpleNamespace) -> list[np.ndarray]:
        main = [a for pair in zip(pool.main_pool.k_buffer, pool.main_pool.v_buffer) for a in pair]
        return [*main, pool.index_kv_pool.k_buffer[0], pool.index_kv_pool.v_buffer[0],
                pool.index_k_pool.k_buffer[0]]  # fmt: skip

    for array in tensors(src_pool):
        array[:] = rng.integers(1, 250, array.shape, dtype=np.uint8)
    src, dst = sglang.buffers(src_pool, tp_size=1), sglang.buffers(dst_pool, tp_size=1)
    assert [b.layer for b in src.buffers] == [0, 0, 1, 1, 2, 2, 3, 3, 1, 1, 3]
    assert src.base_ptrs == tuple(a.ctypes.data for a in tensors(src_pool))
    src_slots, dst_slots = token_slots([3, 5, 6], 16, n), token_slots([1, 3], 32, n)
    prepared = one_to_one(src, dst)
    for s, d, length in prepared.token_descriptors(src_slots, dst_slots).as_array().tolist():
        ctypes.memmove(d, s, length)
    for i, (got, want) in enumerate(zip(tensors(dst_pool), tensors(src_pool))):
        np.testing.assert_array_equal(got[dst_slots], want[src_slots], err_msg=f"tensor {i}")
        others = np.ones(got.shape[0], dtype=bool)
        others[dst_slots] = False
        assert not got[others].any(), f"tensor {i} written outside the request's slots"
    assert guards_hold(dst_blocks)


def test_a_minimax_sparse_pool_with_a_hisparse_dense_pool_is_refused_by_name() -> None:
    pool = minimax_sparse_pool(32, 16, [])
    pool.dense_pool = SimpleNamespace(k_buffer=[], v_buffer=[])
    with pytest.raises(UnsupportedPDLayoutError, match=r"dense_pool"):
        sglang.buffers(pool, tp_size=1)
