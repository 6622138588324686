"""Caches as runtimes allocate them: ``buffer_from_array``, ``pdplan.runtimes.vllm`` and
``pdplan.runtimes.sglang`` on numpy tensors of exactly vLLM's and SGLang's shapes and strides,
against hand-written layouts and against real bytes moved between them."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from runtime_caches import (
    RankCache,
    Side,
    guarded,
    guards_intact,
    move,
    sglang_mha,
    sglang_mla,
    vllm_kv,
    vllm_mla,
)

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    CacheBuffers,
    Mamba2Layer,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StateSpec,
    UnsupportedPDLayoutError,
    buffer_from_array,
)
from pdplan.runtimes import sglang, vllm

K, V = BufferKind.TARGET_K, BufferKind.TARGET_V


# ---------------------------------------------------------------------------------------------
# The array protocols


class OnlyDlpack:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)


class OnlyCuda:
    """Shaped like a CUDA tensor: only ``__cuda_array_interface__`` (numpy's own dict)."""

    def __init__(self, array: np.ndarray) -> None:
        self.__cuda_array_interface__ = dict(array.__array_interface__)
        self.shape = array.shape


class RefusesInterface(OnlyDlpack):
    """torch's bfloat16: the attribute exists but raises; DLPack still works."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise TypeError("bfloat16 is not supported by the CUDA array interface")


WRAPPERS: list[Any] = [lambda a: a, OnlyDlpack, OnlyCuda, RefusesInterface]
if importlib.util.find_spec("torch") is not None:  # a torch CPU tensor when torch is here
    import torch

    WRAPPERS.append(torch.from_numpy)


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("hnd", [False, True])
def test_every_protocol_reads_the_same_layout(wrap: Any, hnd: bool) -> None:
    side = vllm_kv(layers=1, blocks=10, block_size=16, heads=2, dim=8, hnd=hnd)
    k = side.tensors[0][0]  # (blocks, block_size, heads, dim), strides as allocated
    got = buffer_from_array(
        0, "target_k", wrap(k), ["page", "token", "head", "dim"], logical_size=8, tp_size=4
    )
    # Written from the memory order alone: 2 heads of 16 tokens x 8 int64 a page.
    want = BufferLayout(0, K, "kv_head", 8, 16, 16 * 8 * 8, 16 * 2 * 8 * 8, 1, 1 if hnd else 16)
    assert got == (want, k.ctypes.data, 10 * 16 * 2 * 8 * 8)


def test_what_no_layout_expresses_is_refused_naming_the_axis() -> None:
    axes = ["page", "token", "head", "dim"]
    base = np.zeros((10, 16, 2, 8), dtype=np.float16)
    with pytest.raises(UnsupportedPDLayoutError, match=r"axis 0 .*outermost"):
        buffer_from_array(0, "target_k", base.transpose(1, 0, 2, 3), axes, logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="axis 3"):
        buffer_from_array(0, "target_k", base.transpose(0, 1, 3, 2), axes, logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="backwards"):
        buffer_from_array(0, "target_k", base[:, ::-1], axes, logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="broadcast"):
        buffer_from_array(
            0, "target_k", np.broadcast_to(base[:, :, :1], base.shape), axes, logical_size=2
        )
    padded = np.zeros((10, 16, 3, 8), dtype=np.float16)[:, :, :2]  # rows of 3 heads, 2 used
    layout, _, _ = buffer_from_array(0, "target_k", padded, axes, logical_size=2)
    assert layout.rows_per_page == 16 and layout.item_stride_bytes == 16 * 3 * 8 * 2
    head_gap = np.zeros((10, 3, 16, 8), dtype=np.float16)[:, :2].transpose(0, 2, 1, 3)
    layout, _, _ = buffer_from_array(0, "target_k", head_gap, axes, logical_size=2)
    assert layout.rows_per_page == 1 and layout.page_bytes == 2 * 16 * 8 * 2
    gapped_heads = np.zeros((10, 2, 17, 8), dtype=np.float16)[:, :, :16].transpose(0, 2, 1, 3)
    with pytest.raises(
        UnsupportedPDLayoutError, match=r"axis 2 .*neither head-major .* nor token-major"
    ):
        buffer_from_array(0, "target_k", gapped_heads, axes, logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="no size pdplan knows"):
        buffer_from_array(0, "target_k", base.astype(object), axes, logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="logical_size"):
        buffer_from_array(0, "target_k", base, axes, logical_size=3, tp_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="unknown axis name"):
        buffer_from_array(0, "target_k", base, ["page", "tokens", "head", "dim"], logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="names 3 axes"):
        buffer_from_array(0, "target_k", base, ["page", "token", "head"], logical_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="expected an array"):
        buffer_from_array(0, "target_k", [1, 2, 3], ["page"])
    with pytest.raises(UnsupportedPDLayoutError, match="page_size="):
        buffer_from_array(0, "target_k", base[:, 0], ["slot", "head", "dim"], logical_size=2)


# ---------------------------------------------------------------------------------------------
# The runtimes' allocations against hand-written layouts


def test_vllm_backends_give_the_hand_written_layouts() -> None:
    item = 8  # int64 stand-ins: only the element size matters
    fa = vllm_kv(layers=2, blocks=6, block_size=16, heads=2, dim=8)
    got = vllm.buffers(fa.tensors, backend="FLASH_ATTN", tp_size=4, num_kv_heads=8)
    page = 16 * 2 * 8 * item
    nhd = dict(logical_axis="kv_head", logical_size=8, page_size=16, rows_per_page=16)
    assert got.buffers == tuple(
        BufferLayout(
            i,
            K if i % 2 == 0 else V,
            bytes_per_logical_unit=16 * 8 * item,
            item_stride_bytes=page,
            **nhd,
        )  # type: ignore[arg-type]
        for i in range(4)
    )
    # K of layer 0 at the tensor's start, V half a tensor (6 blocks) on; each view its own.
    assert got.base_ptrs == (
        fa.tensors[0].ctypes.data,
        fa.tensors[0].ctypes.data + 6 * page,
        fa.tensors[1].ctypes.data,
        fa.tensors[1].ctypes.data + 6 * page,
    )
    assert got.limits == (6 * page,) * 4
    fused = vllm_kv(layers=1, blocks=6, block_size=16, heads=2, dim=8, backend="FLASHINFER")
    got = vllm.buffers(fused.tensors, backend="FLASHINFER", tp_size=4, num_kv_heads=8)
    assert got.buffers == tuple(
        BufferLayout(
            i,
            K if i == 0 else V,
            bytes_per_logical_unit=16 * 8 * item,
            item_stride_bytes=2 * page,
            page_bytes=page,
            **nhd,
        )  # type: ignore[arg-type]
        for i in range(2)
    )
    assert got.base_ptrs[1] - got.base_ptrs[0] == page
    assert got.limits == (11 * page,) * 2  # each half's view ends a half page before the other's
    hnd = vllm_kv(layers=1, blocks=6, block_size=16, heads=2, dim=8, hnd=True)
    got = vllm.buffers(
        hnd.tensors, backend="FLASH_ATTN", kv_layout="HND", tp_size=4, num_kv_heads=8
    )
    assert {b.rows_per_page for b in got.buffers} == {1}
    with pytest.raises(UnsupportedPDLayoutError, match="kv_layout='NHD', but the tensor's strides"):
        vllm.buffers(hnd.tensors, backend="FLASH_ATTN", tp_size=4, num_kv_heads=8)
    mla = vllm_mla(layers=3, blocks=6, block_size=16, width=72)
    got = vllm.buffers(mla.tensors, backend="FLASHMLA", tp_size=8)
    assert got.buffers == tuple(
        BufferLayout(i, K, "replicated", 1, 16, 16 * 72 * item, 16 * 72 * item) for i in range(3)
    )
    with pytest.raises(UnsupportedPDLayoutError, match="backend='XFORMERS'"):
        vllm.buffers(mla.tensors, backend="XFORMERS", tp_size=8)
    with pytest.raises(UnsupportedPDLayoutError, match="logical shape"):
        vllm.buffers(fa.tensors, backend="FLASHINFER", tp_size=4, num_kv_heads=8)


def test_sglang_pools_give_the_hand_written_layouts() -> None:
    item = 8
    pool, _ = sglang_mha(layers=2, size=256, page_size=64, heads=4, dim=8)
    got = sglang.buffers(pool, tp_size=2)
    assert got.buffers == tuple(
        BufferLayout(
            i, K if i % 2 == 0 else V, "kv_head", 8, 64, 64 * 8 * item, 64 * 4 * 8 * item, 1, 64
        )
        for i in range(4)
    )
    assert got.base_ptrs == tuple(
        a.ctypes.data for pair in zip(pool.k_buffer, pool.v_buffer) for a in pair
    )
    assert got.limits == ((256 + 64) * 4 * 8 * item,) * 4
    one_head, _ = sglang_mha(layers=1, size=128, page_size=16, heads=1, dim=8)
    got = sglang.buffers(one_head, tp_size=4, num_kv_heads=2)
    assert {(b.logical_size, b.tp_replica_group_size) for b in got.buffers} == {(2, 2)}
    mla, _ = sglang_mla(layers=2, size=128, page_size=32, width=72)
    got = sglang.buffers(mla, tp_size=8)
    assert got.buffers == tuple(
        BufferLayout(i, K, "replicated", 1, 32, 32 * 72 * item, 32 * 72 * item, 1, 1)
        for i in range(2)
    )
    with pytest.raises(UnsupportedPDLayoutError, match="not a pool pdplan reads"):
        sglang.buffers(SimpleNamespace(page_size=1), tp_size=1)


MAMBA = Mamba2Layer(heads=8, head_dim=4, state_size=4, groups=2, conv_kernel=4)


def test_state_specs_follow_the_model_code_and_tensors_find_their_channel_axis() -> None:
    conv, temporal = pdplan.state_specs(MAMBA)
    # x (heads x head_dim) | B (groups x state) | C (groups x state), then heads.
    assert conv == StateSpec(32 + 8 + 8, (32, 8, 8))
    assert temporal == StateSpec(8)
    dim_first, _ = guarded((9, 24, 3))  # SGLang / vLLM dim-first: (slots, channels, taps)
    dim_last, _ = guarded((9, 3, 24))  # vLLM's default: (slots, taps, channels)
    ssm, _ = guarded((9, 4, 4, 4))  # (slots, heads, head_dim, state)
    got = vllm.buffers(
        [[dim_first, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal)
    ).buffers
    assert got == (
        BufferLayout(
            0,
            BufferKind.MAMBA_STATE,
            "state_channel",
            48,
            1,
            3 * 8,
            24 * 3 * 8,
            logical_parts=(32, 8, 8),
        ),
        BufferLayout(1, BufferKind.MAMBA_STATE, "state_channel", 8, 1, 16 * 8, 4 * 16 * 8),
    )
    last = vllm.buffers(
        [[dim_last, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal)
    ).buffers[0]
    assert (last.rows_per_page, last.bytes_per_logical_unit) == (3, 3 * 8)
    with pytest.raises(UnsupportedPDLayoutError, match="pass states="):
        vllm.buffers([[dim_first, ssm]], backend="FLASH_ATTN", tp_size=2)


# ---------------------------------------------------------------------------------------------
# Real bytes between runtimes


def heads_of(rank: int, tp: int, heads: int) -> Any:
    if tp <= heads:
        return lambda local: rank * (heads // tp) + local
    return lambda local: rank // (tp // heads)


def page_slots(table: list[int], page_size: int, n: int) -> np.ndarray:
    return np.array([table[t // page_size] * page_size + t % page_size for t in range(n)])


def run_pair(
    prefill: tuple[list[CacheBuffers], list[RankCache], list[Side]],
    decode: tuple[list[CacheBuffers], list[RankCache], list[Side]],
    heads: int,
    slots: tuple[np.ndarray, np.ndarray],
    *,
    decode_replicas: str = "first",
) -> PDTransferPlanner:
    """Plans from the runtimes' own buffers, moves the bytes by slot maps, checks them all."""
    (p_bufs, p_caches, _), (d_bufs, d_caches, d_sides) = prefill, decode
    ptp, dtp = len(p_bufs), len(d_bufs)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", ptp),
        decode_layout=ParallelLayout("decode", dtp),
        prefill_buffers=p_bufs[0].buffers,
        decode_buffers=d_bufs[0].buffers,
        decode_replicas=decode_replicas,  # type: ignore[arg-type]
        token_maps=True,
    )
    planner.verify()
    for rank, cache in enumerate(p_caches):
        cache.fill(slots[0], heads_of(rank, ptp, heads))
    for rank, cache in enumerate(d_caches):
        # Every decode rank needs a replicated (MLA) buffer; replica groups of a sharded one
        # receive at their first rank only, unless asked for all.
        replicated = p_bufs[0].buffers[0].logical_axis == "replicated"
        receives = replicated or decode_replicas == "all" or dtp <= heads
        receives = receives or rank % (dtp // heads) == 0
        tokens = range(len(slots[1])) if receives else range(0)
        want = cache.expected(slots[1], heads_of(rank, dtp, heads), tokens)
        for source, fragments in planner.transfer_fragments(rank).items():
            prepared = PreparedTransfer(
                fragments,
                p_bufs[source].base_ptrs,
                d_bufs[rank].base_ptrs,
                src_limits=p_bufs[source].limits,
                dst_limits=d_bufs[rank].limits,
            )
            move(prepared.token_descriptors(slots[0], slots[1]))
        for got, wanted in zip(cache.actual(), want, strict=True):
            np.testing.assert_array_equal(got, wanted)
        assert guards_intact(d_sides[rank])
    return planner


def vllm_side(
    tp: int, heads: int, backend: str = "FLASH_ATTN", hnd: bool = False, block_size: int = 16
) -> tuple[list[CacheBuffers], list[RankCache], list[Side]]:
    sides = [
        vllm_kv(
            layers=2,
            blocks=12,
            block_size=block_size,
            heads=max(1, heads // tp),
            dim=4,
            backend=backend,
            hnd=hnd,
        )
        for _ in range(tp)
    ]
    layout = "HND" if hnd else "NHD"
    bufs = [
        vllm.buffers(s.tensors, backend=backend, kv_layout=layout, tp_size=tp, num_kv_heads=heads)
        for s in sides
    ]
    return bufs, [RankCache.of_vllm(s, backend, block_size) for s in sides], sides


def sglang_side(
    tp: int, heads: int, page_size: int
) -> tuple[list[CacheBuffers], list[RankCache], list[Side]]:
    made = [
        sglang_mha(
            layers=2, size=4 * page_size, page_size=page_size, heads=max(1, heads // tp), dim=4
        )
        for _ in range(tp)
    ]
    bufs = [sglang.buffers(pool, tp_size=tp, num_kv_heads=heads) for pool, _ in made]
    return bufs, [RankCache.of_sglang(pool) for pool, _ in made], [s for _, s in made]


def test_vllm_flash_attention_tp4_into_an_sglang_pool_of_64_token_pages_tp2() -> None:
    n = 70
    src = page_slots([7, 2, 9, 0, 11], 16, n)
    dst = page_slots([3, 1], 64, n)  # SGLang pages from 1: page 0 is its padding page
    planner = run_pair(vllm_side(4, 8), sglang_side(2, 8, 64), 8, (src, dst))
    assert planner.token_maps


@pytest.mark.parametrize("replicas", ["first", "all"])
def test_vllm_hnd_tp2_into_vllm_nhd_tp4_at_equal_pages(replicas: str) -> None:
    n = 40
    src = page_slots([5, 0, 8], 16, n)
    dst = page_slots([1, 10, 4], 16, n)
    planner = run_pair(vllm_side(2, 8, hnd=True), vllm_side(4, 8), 8, (src, dst))
    assert planner.token_maps
    # And with more decode ranks than KV heads (GQA replica groups).
    run_pair(vllm_side(1, 2, hnd=True), vllm_side(4, 2), 2, (src, dst), decode_replicas=replicas)


def test_the_page_path_refuses_head_major_into_token_major_and_names_slot_maps() -> None:
    (p, _, _), (d, _, _) = vllm_side(2, 8, hnd=True), vllm_side(4, 8)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 4),
        prefill_buffers=p[0].buffers,
        decode_buffers=d[0].buffers,
    )
    assert planner.token_maps  # on by itself: such pages do not pair
    fragments = planner.transfer_fragments(0)[0]
    assert {f.pages_unpaired for f in fragments} == {1}
    version, payload = pdplan.encode_transfer_fragments(fragments)
    assert version == b"6"
    assert pdplan.decode_transfer_fragments(version, payload) == fragments
    prepared = PreparedTransfer(fragments, p[0].base_ptrs, d[0].base_ptrs)
    with pytest.raises(UnsupportedPDLayoutError, match=r"stored differently.*token_descriptors"):
        prepared.descriptors([0, 1], [2, 3])


def test_flashinfer_fused_pages_into_flash_attention_split_pages() -> None:
    n = 33
    src = page_slots([4, 6, 1], 16, n)
    dst = page_slots([9, 2, 5], 16, n)
    run_pair(vllm_side(2, 4, backend="FLASHINFER"), vllm_side(2, 4), 4, (src, dst))
    run_pair(vllm_side(1, 4, backend="FLASHINFER", hnd=True), vllm_side(2, 4), 4, (src, dst))


def test_vllm_mla_into_an_sglang_mla_pool() -> None:
    n = 50
    src = page_slots([3, 0, 5, 7], 16, n)
    dst = page_slots([2, 1], 32, n)
    p_sides = [vllm_mla(layers=2, blocks=9, block_size=16, width=12) for _ in range(2)]
    p = [vllm.buffers(s.tensors, backend="FLASHMLA", tp_size=2) for s in p_sides]
    made = [sglang_mla(layers=2, size=128, page_size=32, width=12) for _ in range(4)]
    d = [sglang.buffers(pool, tp_size=4) for pool, _ in made]
    run_pair(
        (p, [RankCache.of_vllm(s, "FLASHMLA", 16) for s in p_sides], p_sides),
        (d, [RankCache.of_sglang(pool) for pool, _ in made], [s for _, s in made]),
        1,
        (src, dst),
    )


def state_label(layer: int, tensor: int, channel: int, rest: int) -> int:
    return ((layer * 4 + tensor) * 4096 + channel) * 1024 + rest + 7


def global_channel(local: int, rank: int, tp: int, parts: tuple[int, ...]) -> int:
    """Which model channel a rank's local channel is: each part split over TP on its own."""
    offset = 0
    for part in parts:
        share = part // tp
        if local < share:
            return offset + rank * share + local
        local -= share
        offset += part
    raise AssertionError("local channel past the rank's share")


def test_a_hybrid_moves_vllm_state_tensors_into_sglang_s_mamba_pool() -> None:
    layer = Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=2, conv_kernel=4)
    specs = pdplan.state_specs(layer)
    conv_spec = specs[0]
    conv_parts = conv_spec.logical_parts
    assert conv_parts is not None
    ptp, dtp, slots_p, slots_d = 2, 1, 6, 5

    def vllm_rank(rank: int) -> tuple[list[Any], Side, list[list[np.ndarray]]]:
        kv = vllm_kv(layers=2, blocks=12, block_size=16, heads=4 // ptp, dim=4)
        states = []
        for _ in range(2):  # vLLM's dim-first conv layout, the same as SGLang's
            conv = kv.keep(guarded((slots_p, conv_spec.logical_size // ptp, 3)))
            ssm = kv.keep(guarded((slots_p, 4 // ptp, 2, 3)))
            states.append([conv, ssm])
        caches = [kv.tensors[0], states[0], kv.tensors[1], states[1]]
        return caches, kv, states

    prefill = [vllm_rank(r) for r in range(ptp)]
    p_bufs = [
        vllm.buffers(c, backend="FLASH_ATTN", tp_size=ptp, num_kv_heads=4, states=specs)
        for c, _, _ in prefill
    ]
    pool, d_side = sglang_mha(layers=2, size=128, page_size=64, heads=4, dim=4)
    conv_d = d_side.keep(guarded((2, slots_d, conv_spec.logical_size, 3)))
    temporal_d = d_side.keep(guarded((2, slots_d, 4, 2, 3)))
    mamba_pool = SimpleNamespace(mamba_cache=SimpleNamespace(conv=[conv_d], temporal=temporal_d))
    d_bufs = sglang.buffers(pool, tp_size=dtp, mamba_pool=mamba_pool, states=specs)
    assert [b.buffer_kind for b in d_bufs.buffers] == [K, V, K, V] + [BufferKind.MAMBA_STATE] * 4
    assert [b.buffer_kind for b in p_bufs[0].buffers] == [b.buffer_kind for b in d_bufs.buffers]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", ptp),
        decode_layout=ParallelLayout("decode", dtp),
        prefill_buffers=p_bufs[0].buffers,
        decode_buffers=d_bufs.buffers,
        token_maps=True,
    )
    planner.verify()
    n, src_state, dst_state = 21, 4, 2
    src = page_slots([3, 8], 16, n)
    dst = page_slots([1], 64, n)
    for rank, (_, kv, states) in enumerate(prefill):
        RankCache.of_vllm(kv, "FLASH_ATTN", 16).fill(src, heads_of(rank, ptp, 4))
        for li, (conv, ssm) in enumerate(states):
            for c in range(conv.shape[1]):
                channel = global_channel(c, rank, ptp, conv_parts)
                conv[src_state, c] = [state_label(li, 0, channel, x) for x in range(3)]
            for h in range(ssm.shape[1]):
                ssm[src_state, h] = np.array(
                    [state_label(li, 1, rank * ssm.shape[1] + h, x) for x in range(6)]
                ).reshape(2, 3)
    kv_cache = RankCache.of_sglang(pool)
    want = kv_cache.expected(dst, heads_of(0, dtp, 4), range(n))
    want_conv = conv_d.copy()
    want_temporal = temporal_d.copy()
    for li in range(2):
        for c in range(conv_d.shape[2]):
            want_conv[li, dst_state, c] = [state_label(li, 0, c, x) for x in range(3)]
        for h in range(4):
            want_temporal[li, dst_state, h] = np.array(
                [state_label(li, 1, h, x) for x in range(6)]
            ).reshape(2, 3)
    kv_buffers, state_range = range(4), range(4, 8)
    for source, fragments in planner.transfer_fragments(0).items():
        prepared = PreparedTransfer(
            fragments,
            p_bufs[source].base_ptrs,
            d_bufs.base_ptrs,
            src_limits=p_bufs[source].limits,
            dst_limits=d_bufs.limits,
        )
        move(prepared.token_descriptors(src, dst, buffers=kv_buffers))
        move(prepared.descriptors([src_state], [dst_state], buffers=state_range))
    for got, wanted in zip(kv_cache.actual(), want, strict=True):
        np.testing.assert_array_equal(got, wanted)
    np.testing.assert_array_equal(conv_d, want_conv)
    np.testing.assert_array_equal(temporal_d, want_temporal)
    assert guards_intact(d_side)


def test_state_layouts_that_differ_between_runtimes_are_refused_naming_the_rows() -> None:
    conv, temporal = pdplan.state_specs(MAMBA)
    dim_first, _ = guarded((9, 24, 3))
    dim_last, _ = guarded((9, 3, 24))
    ssm, _ = guarded((9, 4, 4, 4))
    p = vllm.buffers([[dim_last, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal))
    d = vllm.buffers([[dim_first, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal))
    with pytest.raises(UnsupportedPDLayoutError, match="rows_per_page differ"):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 2),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=p.buffers,
            decode_buffers=d.buffers,
        )
