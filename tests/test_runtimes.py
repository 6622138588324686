"""Caches as runtimes allocate them: ``buffer_from_array``, ``pdplan.runtimes.vllm`` and
``pdplan.runtimes.sglang`` on numpy tensors of exactly vLLM's and SGLang's shapes and strides,
against hand-written layouts and against real bytes moved between them."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from runtime_caches import guarded, sglang_mha, sglang_mla, vllm_kv, vllm_mla
from runtime_pairs import PAIRS, Mover, child_verdicts

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
            layer=i // 2,  # a list is in model order: entry k is layer k
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
            layer=0,
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
        BufferLayout(i, K, "replicated", 1, 16, 16 * 72 * item, 16 * 72 * item, layer=i)
        for i in range(3)
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
            i,
            K if i % 2 == 0 else V,
            "kv_head",
            8,
            64,
            64 * 8 * item,
            64 * 4 * 8 * item,
            1,
            64,
            layer=i // 2,  # k_buffer[k] is layer start_layer + k
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
        BufferLayout(i, K, "replicated", 1, 32, 32 * 72 * item, 32 * 72 * item, 1, 1, layer=i)
        for i in range(2)
    )
    with pytest.raises(UnsupportedPDLayoutError, match="not a pool pdplan reads"):
        sglang.buffers(SimpleNamespace(page_size=1), tp_size=1)
    # Objects that look half like a pool are refused, naming what is missing.
    half = SimpleNamespace(k_buffer=pool.k_buffer, v_buffer=pool.v_buffer[:1], head_num=4)
    with pytest.raises(UnsupportedPDLayoutError, match="no 'page_size'"):
        sglang.buffers(half, tp_size=2)
    half.page_size = 64
    with pytest.raises(UnsupportedPDLayoutError, match="2 K buffers but 1 V"):
        sglang.buffers(half, tp_size=2)
    with pytest.raises(UnsupportedPDLayoutError, match="no 'temporal'"):
        sglang.buffers(SimpleNamespace(mamba_cache=SimpleNamespace(conv=[])), tp_size=1)
    with pytest.raises(UnsupportedPDLayoutError, match="no 'shape'"):
        vllm.buffers([object()], backend="FLASH_ATTN", tp_size=1, num_kv_heads=1)


MAMBA = Mamba2Layer(heads=8, head_dim=4, state_size=4, groups=2, conv_kernel=4)


def test_state_specs_follow_the_model_code_and_tensors_find_their_channel_axis() -> None:
    conv, temporal = pdplan.state_specs(MAMBA)
    # x (heads x head_dim) | B (groups x state) | C (groups x state), then heads; x in its
    # heads, B and C in their groups.
    assert conv == StateSpec(32 + 8 + 8, (32, 8, 8), (8, 2, 2))
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
            layer=0,
            logical_part_groups=(8, 2, 2),
        ),
        BufferLayout(1, BufferKind.MAMBA_STATE, "state_channel", 8, 1, 16 * 8, 4 * 16 * 8, layer=0),
    )
    last = vllm.buffers(
        [[dim_last, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal)
    ).buffers[0]
    assert (last.rows_per_page, last.bytes_per_logical_unit) == (3, 3 * 8)
    with pytest.raises(UnsupportedPDLayoutError, match="pass states="):
        vllm.buffers([[dim_first, ssm]], backend="FLASH_ATTN", tp_size=2)


# ---------------------------------------------------------------------------------------------
# Real bytes between runtimes: in memory here, through the engines in a child process


@pytest.mark.parametrize("name", PAIRS)
def test_between_runtimes_in_memory(name: str) -> None:
    mover = Mover()
    PAIRS[name](mover)
    assert mover.moved > 0


class DropsOne(Mover):
    """Moves every descriptor but the last of each request."""

    def __call__(self, descriptors: Any) -> None:
        src, dst, lengths = descriptors
        super().__call__((src[:-1], dst[:-1], lengths[:-1]))


@pytest.mark.parametrize("name", PAIRS)
def test_a_missing_descriptor_is_caught_by_the_element_comparison(name: str) -> None:
    with pytest.raises(AssertionError):
        PAIRS[name](DropsOne())


def through(engine: str) -> None:
    """Every pair in one child process (fresh engines a pair), each reporting its verdict."""
    code, passed, printed = child_verdicts("runtime_pairs.py", engine)
    assert code == 0 and passed == list(PAIRS), printed


@pytest.mark.mooncake
def test_between_runtimes_through_mooncake(mooncake_engine: None) -> None:
    through("mooncake")


@pytest.mark.nixl
def test_between_runtimes_through_nixl(nixl_engine: None) -> None:
    through("nixl")


def vllm_side(tp: int, heads: int, hnd: bool = False) -> list[CacheBuffers]:
    sides = [
        vllm_kv(layers=2, blocks=12, block_size=16, heads=max(1, heads // tp), dim=4, hnd=hnd)
        for _ in range(tp)
    ]
    layout = "HND" if hnd else "NHD"
    return [
        vllm.buffers(
            s.tensors, backend="FLASH_ATTN", kv_layout=layout, tp_size=tp, num_kv_heads=heads
        )
        for s in sides
    ]


def test_the_page_path_refuses_head_major_into_token_major_and_names_slot_maps() -> None:
    p, d = vllm_side(2, 8, hnd=True), vllm_side(4, 8)
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


def test_state_layouts_that_differ_between_runtimes_are_refused_naming_the_rows() -> None:
    conv, temporal = pdplan.state_specs(MAMBA)
    dim_first, _ = guarded((9, 24, 3))
    dim_last, _ = guarded((9, 3, 24))
    ssm, _ = guarded((9, 4, 4, 4))
    p = vllm.buffers([[dim_last, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal))
    d = vllm.buffers([[dim_first, ssm]], backend="FLASH_ATTN", tp_size=2, states=(conv, temporal))
    with pytest.raises(UnsupportedPDLayoutError, match="rows differ: prefill"):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 2),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=p.buffers,
            decode_buffers=d.buffers,
        )


def sglang_hybrid(attention: tuple[int, ...], linear: tuple[int, ...]) -> tuple[Any, Any]:
    """A HybridLinearKVPool and a HybridReqToTokenPool as SGLang allocates them: the attention
    layers densely in the full pool, the recurrent ones in a MambaPool that counts them
    (num_mamba_layers; conv dim-first (layers, slots, channels, taps), temporal (layers, slots,
    heads, head_dim, state)), their model layers in the request pool's mamba_map."""
    specs = pdplan.state_specs(MAMBA)
    full, _ = sglang_mha(layers=len(attention), size=64, page_size=16, heads=4, dim=8)
    conv, _ = guarded((len(linear), 9, specs[0].logical_size, 3))
    temporal, _ = guarded((len(linear), 9, 8, 4, 4))
    mamba = SimpleNamespace(
        mamba_cache=SimpleNamespace(conv=[conv], temporal=temporal), num_mamba_layers=len(linear)
    )
    hybrid = SimpleNamespace(
        full_kv_pool=full,
        full_attention_layer_id_mapping={g: i for i, g in enumerate(attention)},
        mamba_pool=mamba,
        page_size=16,
    )
    requests = SimpleNamespace(mamba_pool=mamba, mamba_map={g: i for i, g in enumerate(linear)})
    return hybrid, requests


def test_sglang_s_recurrent_layers_are_named_by_the_request_pool_s_mamba_map() -> None:
    # Nemotron-H-like: MLP layers (2, 5) keep nothing, so the recurrent layers are not "every
    # layer the attention mapping leaves out"; mamba_map names them.
    attention, linear = (1, 4), (0, 3, 6)
    hybrid, requests = sglang_hybrid(attention, linear)
    specs = pdplan.state_specs(MAMBA)
    cache = sglang.buffers(hybrid, tp_size=1, req_to_token_pool=requests, states=specs)
    layers = [b.layer for b in cache.buffers]
    assert layers == [1, 1, 4, 4, 0, 0, 3, 3, 6, 6]
    # The MambaPool alone, or without the map, is refused naming the request pool.
    with pytest.raises(UnsupportedPDLayoutError, match=r"0\.\.2 among the recurrent.*mamba_map"):
        sglang.buffers(hybrid, tp_size=1, states=specs)
    with pytest.raises(UnsupportedPDLayoutError, match=r"req_to_token_pool="):
        sglang.buffers(hybrid.mamba_pool, tp_size=1, states=specs)
    # The full pool without its wrapper numbers its layers 0..1 among the attention layers:
    # refused naming the HybridLinearKVPool, whether or not its numbers meet the recurrent ones.
    with pytest.raises(UnsupportedPDLayoutError, match=r"pass the rank's HybridLinearKVPool"):
        sglang.buffers(hybrid.full_kv_pool, tp_size=1, req_to_token_pool=requests, states=specs)
    apart, apart_requests = sglang_hybrid((2, 5), (3, 4, 6))
    with pytest.raises(UnsupportedPDLayoutError, match=r"pass the rank's HybridLinearKVPool"):
        sglang.buffers(apart.full_kv_pool, tp_size=1, req_to_token_pool=apart_requests,
                       states=specs)  # fmt: skip
    # Falcon-H1: attention and a Mamba mixer in every layer, both read by model layer.
    both, both_requests = sglang_hybrid((0, 1, 2), (0, 1, 2))
    cache = sglang.buffers(both, tp_size=1, req_to_token_pool=both_requests, states=specs)
    assert [b.layer for b in cache.buffers] == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    # A map that does not cover the pool's layers is refused.
    wrong = SimpleNamespace(mamba_pool=requests.mamba_pool, mamba_map={0: 0, 3: 1})
    with pytest.raises(UnsupportedPDLayoutError, match=r"names MambaPool layers \[0, 1\]"):
        sglang.buffers(hybrid, tp_size=1, req_to_token_pool=wrong, states=specs)
