"""vLLM's attention backends as their current code allocates them, moved byte for byte: the
CPU backend's (block, head) slabs (K transposed, then V) whole, and the packed layout of later
releases (K and V of a head on the last axis) by slot maps between NHD and HND at different
block sizes. Unknown and refused backends are named with the way forward."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from runtime_caches import prepared_between

from pdplan import (
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    token_slots,
)
from pdplan.runtimes import vllm

HEADS, HS = 2, 8


def cpu_cache(blocks: int, block: int, heads: int, layers: int = 2) -> dict[str, np.ndarray]:
    """vLLM CPU_ATTN: per layer (blocks, kv_heads, block_size, 2 * head_size) fp16."""
    return {
        f"model.layers.{i}.self_attn.attn": np.zeros((blocks, heads, block, 2 * HS), np.float16)
        for i in range(layers)
    }


def move(prepared: PreparedTransfer, src: list[int], dst: list[int]) -> None:
    for s, d, n in prepared.descriptors(src, dst).as_array().tolist():
        ctypes.memmove(d, s, n)


def test_cpu_slabs_move_whole_from_tp_2_to_tp_1() -> None:
    """Each prefill rank holds one head; inside a (block, head) slab the K area is K
    transposed ([head_size][block_size]) and the V area [block_size][head_size], so a token
    has no place of its own: whole slabs move, by block id, each to its head's place."""
    block = 32
    prefill = [cpu_cache(6, block, 1) for _ in range(2)]
    decode = cpu_cache(6, block, HEADS)
    rng = np.random.default_rng(5)
    for rank in prefill:
        for tensor in rank.values():
            tensor[:] = rng.standard_normal(tensor.shape).astype(np.float16)
    p = [vllm.buffers(c, backend="CPU_ATTN", tp_size=2, num_kv_heads=HEADS) for c in prefill]
    d = vllm.buffers(decode, backend="CPU_ATTN", tp_size=1, num_kv_heads=HEADS)
    assert [b.layer for b in d.buffers] == [0, 1] and {b.page_size for b in d.buffers} == {block}
    planner = vllm.conventions(block_size=block).planner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p[0].buffers,
        decode_buffers=d.buffers,
    )
    planner.verify()
    src_blocks, dst_blocks = [4, 1], [0, 5]
    for source, fragments in planner.transfer_fragments(0).items():
        move(prepared_between(fragments, p[source], d),
             src_blocks, dst_blocks)  # fmt: skip
    for name, tensor in decode.items():
        for s, t in zip(src_blocks, dst_blocks):
            for head in range(HEADS):
                np.testing.assert_array_equal(tensor[t, head], prefill[head][name][s, 0])
        untouched = [b for b in range(6) if b not in dst_blocks]
        assert not tensor[untouched].any()


def test_cpu_slabs_of_heads_replicated_over_tp_reach_every_decode_rank() -> None:
    """One KV head at decode TP 2: vLLM keeps it whole on both ranks and each reads its own
    (the vLLM rule), so both decode ranks end with the prefill slab of every block moved."""
    block = 32
    prefill = cpu_cache(6, block, 1)
    decode = [cpu_cache(6, block, 1) for _ in range(2)]
    rng = np.random.default_rng(8)
    for tensor in prefill.values():
        tensor[:] = rng.standard_normal(tensor.shape).astype(np.float16)
    p = vllm.buffers(prefill, backend="CPU_ATTN", tp_size=1, num_kv_heads=1)
    d = [vllm.buffers(c, backend="CPU_ATTN", tp_size=2, num_kv_heads=1) for c in decode]
    assert {b.tp_replica_group_size for b in d[0].buffers} == {2}
    planner = vllm.conventions(block_size=block).planner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=p.buffers,
        decode_buffers=d[0].buffers,
    )
    planner.verify()
    src_blocks, dst_blocks = [4, 1], [0, 5]
    for rank in range(2):
        for fragments in planner.transfer_fragments(rank).values():
            move(prepared_between(fragments, p, d[rank]), src_blocks, dst_blocks)
        for name, tensor in decode[rank].items():
            np.testing.assert_array_equal(tensor[dst_blocks], prefill[name][src_blocks])
            assert not tensor[[b for b in range(6) if b not in dst_blocks]].any()
    with pytest.raises(UnsupportedPDLayoutError, match=r"tp_size=3 is above the 2 KV heads"):
        vllm.buffers(cpu_cache(6, block, 1), backend="CPU_ATTN", tp_size=3, num_kv_heads=2)


def test_cpu_slabs_at_other_block_sizes_are_refused_naming_why() -> None:
    p = vllm.buffers(cpu_cache(4, 32, HEADS), backend="CPU_ATTN", tp_size=1, num_kv_heads=HEADS)
    d = vllm.buffers(cpu_cache(8, 16, HEADS), backend="CPU_ATTN", tp_size=1, num_kv_heads=HEADS)
    with pytest.raises(UnsupportedPDLayoutError, match=r"moves whole pages .* 32 tokens .* 16"):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 1),
            decode_layout=ParallelLayout("decode", 1),
            prefill_buffers=p.buffers,
            decode_buffers=d.buffers,
        )


def packed(blocks: int, block: int, heads: int, hnd: bool) -> np.ndarray:
    """vLLM 0.26 and later: logical (blocks, kv_heads, block_size, 2 * head_size), K then V of
    each head on the last axis; NHD memory is (blocks, block_size, kv_heads, 2 * head_size)."""
    if hnd:
        return np.zeros((blocks, heads, block, 2 * HS), np.float16)
    return np.zeros((blocks, block, heads, 2 * HS), np.float16).transpose(0, 2, 1, 3)


def test_packed_heads_move_by_slot_maps_between_nhd_and_hnd_at_other_block_sizes() -> None:
    n = 40
    src = {"model.layers.0.self_attn.attn": packed(8, 16, HEADS, hnd=False)}
    dst = {"model.layers.0.self_attn.attn": packed(4, 64, HEADS, hnd=True)}
    rng = np.random.default_rng(9)
    src_tensor = src["model.layers.0.self_attn.attn"]
    src_tensor[:] = rng.standard_normal(src_tensor.shape).astype(np.float16)
    p = vllm.buffers(src, backend="FLASH_ATTN", tp_size=1, num_kv_heads=HEADS)
    d = vllm.buffers(dst, backend="FLASH_ATTN", kv_layout="HND", tp_size=1, num_kv_heads=HEADS)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p.buffers,
        decode_buffers=d.buffers,
    )
    assert planner.token_maps
    src_slots, dst_slots = token_slots([5, 2, 7], 16, n), token_slots([3], 64, n)
    prepared = prepared_between(planner.transfer_fragments(0)[0], p, d)
    for s, t, length in prepared.token_descriptors(src_slots, dst_slots).as_array().tolist():
        ctypes.memmove(t, s, length)
    dst_tensor = dst["model.layers.0.self_attn.attn"]
    for token, (s, t) in enumerate(zip(src_slots.tolist(), dst_slots.tolist())):
        for head in range(HEADS):  # K and V of the head: 2 * head_size values
            np.testing.assert_array_equal(
                dst_tensor[t // 64, head, t % 64], src_tensor[s // 16, head, s % 16], str(token)
            )


def test_unknown_and_refused_backends_name_the_way_forward() -> None:
    cache = cpu_cache(2, 16, HEADS)
    with pytest.raises(UnsupportedPDLayoutError, match=r"known: FLASH_ATTN.*buffer_from_array"):
        vllm.buffers(cache, backend="XFORMERS", tp_size=1, num_kv_heads=HEADS)
    with pytest.raises(UnsupportedPDLayoutError, match=r"ROCM_ATTN.*packed"):
        vllm.buffers(cache, backend="ROCM_ATTN", tp_size=1, num_kv_heads=HEADS)
    assert set(vllm.REFUSED).isdisjoint(vllm.BACKENDS)


def test_the_vllm_guide_tables_every_backend() -> None:
    from pathlib import Path

    guide = Path(__file__).resolve().parent.parent / "docs/guides/integrating-vllm.md"
    table = guide.read_text(encoding="utf-8")
    missing = [name for name in [*vllm.BACKENDS, *vllm.REFUSED] if f"`{name}`" not in table]
    assert not missing, missing


def test_conv_states_with_speculative_taps_pair_only_with_as_many() -> None:
    """vLLM keeps a conv state's kernel taps plus one a speculative token: (slots, taps,
    channels). Equal taps on both sides move; other taps are refused naming the rows."""
    import pdplan
    from pdplan import Mamba2Layer

    specs = pdplan.state_specs(Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=2))
    channels = specs[0].logical_size

    def caches(taps: int, tp: int) -> dict[str, list[np.ndarray]]:
        conv = np.zeros((6, taps, channels // tp), np.float16)
        ssm = np.zeros((6, 4 // tp, 2, 3), np.float32)
        return {"model.layers.0.mixer": [conv, ssm]}

    p = vllm.buffers(caches(3 + 2, 1), backend="FLASH_ATTN", tp_size=1, states=specs)
    sides = dict(prefill_layout=ParallelLayout("prefill", 1),
                 decode_layout=ParallelLayout("decode", 2))  # fmt: skip
    same = vllm.buffers(caches(3 + 2, 2), backend="FLASH_ATTN", tp_size=2, states=specs)
    PDTransferPlanner(**sides, prefill_buffers=p.buffers, decode_buffers=same.buffers).verify()
    fewer = vllm.buffers(caches(3, 2), backend="FLASH_ATTN", tp_size=2, states=specs)
    with pytest.raises(UnsupportedPDLayoutError, match=r"rows differ: prefill 5, decode 3"):
        PDTransferPlanner(**sides, prefill_buffers=p.buffers, decode_buffers=fewer.buffers)


def test_dim_first_conv_states_of_other_taps_are_refused_naming_the_taps() -> None:
    """Dim-first (vLLM's layout when NIXL is configured, VLLM_SSM_CONV_STATE_LAYOUT=DS): a
    channel's taps lie together, (slots, channels, taps), so other taps are other channel
    sizes; the refusal names the taps and num_speculative_tokens, not "unit sizes"."""
    import pdplan
    from pdplan import Mamba2Layer

    specs = pdplan.state_specs(Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=2))
    channels = specs[0].logical_size

    def caches(taps: int) -> dict[str, list[np.ndarray]]:
        conv = np.zeros((6, channels, taps), np.float16).transpose(0, 2, 1)
        ssm = np.zeros((6, 4, 2, 3), np.float32)
        return {"model.layers.0.mixer": [conv, ssm]}

    sides = dict(prefill_layout=ParallelLayout("prefill", 1),
                 decode_layout=ParallelLayout("decode", 1))  # fmt: skip
    spec = vllm.buffers(caches(3 + 1), backend="FLASH_ATTN", tp_size=1, states=specs)
    plain = vllm.buffers(caches(3), backend="FLASH_ATTN", tp_size=1, states=specs)
    PDTransferPlanner(**sides, prefill_buffers=plain.buffers, decode_buffers=plain.buffers)
    with pytest.raises(UnsupportedPDLayoutError, match=r"taps.*num_speculative_tokens") as refused:
        PDTransferPlanner(**sides, prefill_buffers=spec.buffers, decode_buffers=plain.buffers)
    assert "8 bytes on the prefill side and 6 on the decode side" in str(refused.value)


def test_mamba2_groups_copied_to_every_rank_need_the_specs_groups() -> None:
    """Below n_groups ranks vLLM copies B and C's groups onto every rank
    (``extra_groups_for_head_shards``: n_groups=1 at TP 2 holds 2 groups, one per rank), so a
    rank's conv holds x/TP + 2 * state_size channels, more than its share. ``state_specs``
    names the groups and the tensor reads (test_vllm_packed_states moves its bytes); a spec
    without them is refused naming them, never planned as if B and C were split."""
    import pdplan
    from pdplan import Mamba2Layer, StateSpec

    heads, head_dim, state, tp = 4, 2, 3, 2
    specs = pdplan.state_specs(Mamba2Layer(heads=heads, head_dim=head_dim, state_size=state))
    assert specs[0].part_groups == (heads, 1, 1)
    copied = heads * head_dim // tp + 2 * state  # x's share, B and C whole
    cache = {
        "model.layers.0.mixer": [
            np.zeros((6, 3, copied), np.float16),
            np.zeros((6, heads // tp, head_dim, state), np.float32),
        ]
    }
    conv = vllm.buffers(cache, backend="FLASH_ATTN", tp_size=tp, states=specs).buffers[0]
    assert conv.item_stride_bytes == copied * 3 * 2
    ungrouped = (StateSpec(specs[0].logical_size, specs[0].logical_parts), specs[1])
    with pytest.raises(UnsupportedPDLayoutError, match=r"copied to every rank.*part_groups"):
        vllm.buffers(cache, backend="FLASH_ATTN", tp_size=tp, states=ungrouped)


def test_kda_s_fused_conv_moves_each_of_q_k_v_by_its_own_split() -> None:
    """Kimi Delta Attention keeps q, k and v's conv states as one tensor, (slots, taps,
    q | k | v) with each part split over TP on its own: state_specs(..., fused_conv=True)
    describes it, and TP 2 -> TP 1 puts every channel at its model place (the oracle: each
    part's channels dealt to the ranks, runtime_pairs.global_channel)."""
    from runtime_pairs import global_channel

    import pdplan
    from pdplan import KdaLayer

    layer = KdaLayer(heads=4, head_dim=8, conv_kernel=4)
    conv, recurrent = pdplan.state_specs(layer, fused_conv=True)
    assert conv.logical_parts == (32, 32, 32) and recurrent.logical_size == 4
    parts = conv.logical_parts

    def caches(tp: int) -> dict[str, list[np.ndarray]]:
        return {
            "model.layers.0.self_attn": [
                np.zeros((5, 3, 96 // tp), np.float32),  # vLLM's conv: (slots, taps, channels)
                np.zeros((5, 4 // tp, 8, 8), np.float32),
            ]
        }

    prefill, decode = [caches(2) for _ in range(2)], caches(1)
    for rank, side in enumerate(prefill):
        conv_state = side["model.layers.0.self_attn"][0]
        for local in range(conv_state.shape[2]):
            channel = global_channel(local, rank, 2, parts)
            conv_state[3, :, local] = [channel * 10 + tap for tap in range(3)]
    p = [vllm.buffers(c, backend="FLASH_ATTN", tp_size=2, states=(conv, recurrent))
         for c in prefill]  # fmt: skip
    d = vllm.buffers(decode, backend="FLASH_ATTN", tp_size=1, states=(conv, recurrent))
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p[0].buffers,
        decode_buffers=d.buffers,
    )
    planner.verify()
    for source, fragments in planner.transfer_fragments(0).items():
        prepared = prepared_between(fragments, p[source], d)
        move(prepared, [3], [1])
    got = decode["model.layers.0.self_attn"][0]
    want = np.array([[channel * 10 + tap for channel in range(96)] for tap in range(3)])
    np.testing.assert_array_equal(got[1], want)
    assert not got[[0, 2, 3, 4]].any()


def test_layers_with_their_own_kv_head_counts() -> None:
    """Gemma 3n and 4 give layers different KV-head counts: num_kv_heads by model layer. TP 2
    -> TP 1, layer 0 of 8 heads and layer 1 of 2, every head lands at its model place (the
    oracle: a head's value is its layer, head and plane)."""
    heads = {0: 8, 1: 2}

    def caches(tp: int, rank: int) -> dict[str, np.ndarray]:
        out = {}
        for layer, count in heads.items():
            tensor = np.zeros((2, 4, 16, count // tp, HS), np.float32)
            for local in range(count // tp):
                for plane in range(2):
                    tensor[plane, :, :, local] = (
                        layer * 1000 + (rank * count // tp + local) * 10 + plane
                    )
            out[f"model.layers.{layer}.self_attn.attn"] = tensor
        return out

    prefill = [caches(2, rank) for rank in range(2)]
    decode = {name: np.zeros_like(np.concatenate([prefill[0][name], prefill[1][name]], axis=3))
              for name in prefill[0]}  # fmt: skip
    p = [vllm.buffers(c, backend="FLASH_ATTN", tp_size=2, num_kv_heads=heads) for c in prefill]
    d = vllm.buffers(decode, backend="FLASH_ATTN", tp_size=1, num_kv_heads=heads)
    assert [b.logical_size for b in d.buffers] == [8, 8, 2, 2]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p[0].buffers,
        decode_buffers=d.buffers,
    )
    for source, fragments in planner.transfer_fragments(0).items():
        prepared = prepared_between(fragments, p[source], d)
        # One head a rank reads as head-major, two as token-major: tokens move by slot maps.
        moved = prepared.token_descriptors(token_slots([2], 16, 16), token_slots([1], 16, 16))
        for s, t, length in moved.as_array().tolist():
            ctypes.memmove(t, s, length)
    for layer, count in heads.items():
        got = decode[f"model.layers.{layer}.self_attn.attn"]
        for head in range(count):
            for plane in range(2):
                assert (got[plane, 1, :, head] == layer * 1000 + head * 10 + plane).all()
        assert not got[:, [0, 2, 3]].any()
    with pytest.raises(UnsupportedPDLayoutError, match="names no count for"):
        vllm.buffers(decode, backend="FLASH_ATTN", tp_size=1, num_kv_heads={0: 8})


def test_a_cross_layer_cache_moves_each_layer_s_pages() -> None:
    """vLLM's block-first layouts (BLHNC) keep every layer's page of a block together: a
    layer's view strides over all layers' pages. Into per-layer caches (LBHNC), by block id,
    each layer's page lands in that layer's tensor (the oracle: numpy's own indexing)."""
    layers = 3
    memory = np.random.default_rng(1).standard_normal((6, layers, HEADS, 16, 2 * HS))
    memory = memory.astype(np.float16)  # (blocks, layers, heads, tokens, K | V)
    src = {f"model.layers.{i}.self_attn.attn": memory[:, i] for i in range(layers)}
    dst = {name: np.zeros((6, HEADS, 16, 2 * HS), np.float16) for name in src}
    p = vllm.buffers(src, backend="FLASH_ATTN", kv_layout="HND", tp_size=1, num_kv_heads=HEADS)
    d = vllm.buffers(dst, backend="FLASH_ATTN", kv_layout="HND", tp_size=1, num_kv_heads=HEADS)
    assert {b.item_stride_bytes for b in p.buffers} == {layers * HEADS * 16 * 2 * HS * 2}
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p.buffers,
        decode_buffers=d.buffers,
    )
    prepared = prepared_between(planner.transfer_fragments(0)[0], p, d)
    move(prepared, [5, 0], [2, 3])
    for i, name in enumerate(src):
        np.testing.assert_array_equal(dst[name][[2, 3]], memory[[5, 0], i])
        assert not dst[name][[0, 1, 4, 5]].any()


def bhlnc(blocks: int, heads: int, layers: int, block: int, width: int) -> tuple[Any, list[Any]]:
    """vLLM 0.32's cross-layer BHLNC allocation (``kv_cache_interface.compute_layout_strides``
    with ``KVCacheLayout.BHLNC``): one raw buffer, physical [blocks, heads, layers, block,
    width], between guard bytes, and the per-layer [blocks, heads, block, width] view each
    layer is handed (``create_kv_cache_views``: layer l starts l pages into each head)."""
    item = 2  # float16
    size = blocks * heads * layers * block * width * item
    raw = np.full(size + 128, 0x5A, dtype=np.uint8)
    body = raw[64:-64]
    strides = (heads * layers * block * width * item, layers * block * width * item,
               width * item, item)  # fmt: skip
    views = [
        np.lib.stride_tricks.as_strided(
            body[layer * block * width * item :].view(np.float16),
            shape=(blocks, heads, block, width), strides=strides,
        )
        for layer in range(layers)
    ]  # fmt: skip
    return raw, views


def test_a_cross_layer_bhlnc_cache_is_refused_with_its_way_forward_which_moves_exactly() -> None:
    from pdplan import BufferKind, buffer_from_array, transfer_descriptors

    blocks, heads, layers, block, width = 6, 4, 3, 8, 16
    _raw, views = bhlnc(blocks, heads, layers, block, width)
    caches = {f"model.layers.{i}.self_attn.attn": v for i, v in enumerate(views)}
    with pytest.raises(UnsupportedPDLayoutError, match=r"BHLNC.*one buffer.*LBHNC") as refused:
        vllm.buffers(caches, backend="FLASH_ATTN", kv_layout="HND", tp_size=1, num_kv_heads=4)
    assert "room for 2 more" in str(refused.value)  # the other two layers' pages of a head

    # The way forward: the whole block is one head-major buffer, a head holding every layer.
    def whole(raw_: Any, local_heads: int, tp: int) -> Any:
        # (page, head, token, dim): the token axis runs through every layer's tokens.
        body = raw_[64:-64].view(np.float16).reshape(blocks, local_heads, layers * block, width)
        return buffer_from_array(0, BufferKind.TARGET_K, body, ("page", "head", "token", "dim"),
                                 logical_size=heads, tp_size=tp)  # fmt: skip

    rng = np.random.default_rng(7)
    prefill = [bhlnc(blocks, heads // 2, layers, block, width) for _ in range(2)]
    for raw_p, _ in prefill:
        raw_p[64:-64] = rng.integers(0, 255, raw_p.size - 128, dtype=np.uint8)
    raw_d, views_d = bhlnc(blocks, heads, layers, block, width)
    p_bufs = [whole(r, heads // 2, 2) for r, _ in prefill]
    d_buf = whole(raw_d, heads, 1)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2), decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=[p_bufs[0][0]], decode_buffers=[d_buf[0]],
    )  # fmt: skip
    planner.verify()
    src_pages, dst_pages = [1, 4], [5, 0]
    for source, fragments in planner.transfer_fragments(0).items():
        (base, limit) = (p_bufs[source][1], p_bufs[source][2])
        moves = transfer_descriptors(fragments, [base], [d_buf[1]], src_pages, dst_pages,
                                     src_limits=[limit], dst_limits=[d_buf[2]])  # fmt: skip
        for s, t, length in moves.as_array().tolist():
            ctypes.memmove(t, s, length)
    for raw_ in [raw_d] + [r for r, _ in prefill]:
        assert (raw_[:64] == 0x5A).all() and (raw_[-64:] == 0x5A).all()
    for layer in range(layers):
        for head in range(heads):
            source_views = prefill[head // 2][1]
            for s, t in zip(src_pages, dst_pages):
                np.testing.assert_array_equal(
                    views_d[layer][t, head], source_views[layer][s, head % 2], f"{layer} {head}"
                )
    untouched = [b for b in range(blocks) if b not in dst_pages]
    assert (raw_d[64:-64].reshape(blocks, -1)[untouched] == 0x5A).all()
