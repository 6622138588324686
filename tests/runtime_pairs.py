"""Byte-exact transfers between runtimes' own cache allocations (numpy stand-ins of vLLM's and
SGLang's tensors, `runtime_caches`), through memmove or a transfer engine: each pair plans from
the buffers `pdplan.runtimes` reads, moves the bytes by the descriptors pdplan builds, and
checks every element of every decode rank's cache and the guard bytes around it.

    python tests/runtime_pairs.py CASE|all ENGINE    # ENGINE: memory, mooncake or nixl

run as a child process by the engine tests. The child leaves with os._exit once its verdict is
printed: a child that failed half-way may hold engines in any state, and on a host with
libibverbs but no InfiniBand device UCX's IB module crashes at exit unless UCX_MODULES=^ib
(which examples/pd_transfer.py's NIXL engine sets there).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

import pdplan
from pdplan import (
    BufferKind,
    CacheBuffers,
    Mamba2Layer,
    ParallelLayout,
    PDTransferPlanner,
)
from pdplan.runtimes import sglang, vllm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from runtime_caches import (
    RankCache,
    Side,
    guarded,
    guards_intact,
    prepared_between,
    sglang_mha,
    sglang_mla,
    vllm_kv,
    vllm_mla,
)

K, V = BufferKind.TARGET_K, BufferKind.TARGET_V


class Mover:
    """Moves descriptors' bytes: by memmove in this process, or from a prefill-side engine to
    a decode-side engine that registered each side's memory."""

    def __init__(self, engine: str = "memory") -> None:
        self.engine = engine
        self.sides: tuple[Any, Any] | None = None
        self.moved = 0

    def register(self, prefill: Sequence[Side], decode: Sequence[Side]) -> None:
        """Registers each side's memory with fresh engines, one a side: memory a case freed may
        come back at the same addresses, which an engine would refuse to register twice."""
        if self.engine == "memory":
            return
        from pd_transfer import make_engine

        self.sides = (make_engine(self.engine, "prefill", 0), make_engine(self.engine, "decode", 0))
        for engine, sides in zip(self.sides, (prefill, decode)):
            for side in sides:
                for block in side.blocks:
                    engine.register(block.ctypes.data, block.nbytes)

    def __call__(self, descriptors: Any) -> None:
        src, dst, lengths = descriptors
        self.moved += int(lengths.sum())
        if self.sides is None:
            for s, d, n in zip(src.tolist(), dst.tolist(), lengths.tolist()):
                ctypes.memmove(d, s, n)
            return
        source, target = self.sides
        if len(lengths):
            assert source.write(target.address, src, dst, lengths) == 0


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
    mover: Mover,
    *,
    decode_replicas: str = "first",
) -> PDTransferPlanner:
    """Plans from the runtimes' own buffers, moves the bytes by slot maps through `mover`,
    checks them all."""
    (p_bufs, p_caches, p_sides), (d_bufs, d_caches, d_sides) = prefill, decode
    mover.register(p_sides, d_sides)
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
            prepared = prepared_between(fragments, p_bufs[source], d_bufs[rank])
            mover(prepared.token_descriptors(slots[0], slots[1]))
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


def vllm_flash_attention_tp4_into_an_sglang_pool_of_64_token_pages_tp2(mover: Mover) -> None:
    n = 70
    src = page_slots([7, 2, 9, 0, 11], 16, n)
    dst = page_slots([3, 1], 64, n)  # SGLang pages from 1: page 0 is its padding page
    planner = run_pair(vllm_side(4, 8), sglang_side(2, 8, 64), 8, (src, dst), mover)
    assert planner.token_maps


def vllm_hnd_tp2_into_vllm_nhd_tp4_at_equal_pages(mover: Mover) -> None:
    n = 40
    src = page_slots([5, 0, 8], 16, n)
    dst = page_slots([1, 10, 4], 16, n)
    planner = run_pair(vllm_side(2, 8, hnd=True), vllm_side(4, 8), 8, (src, dst), mover)
    assert planner.token_maps
    # And with more decode ranks than KV heads (GQA replica groups), in both modes.
    for replicas in ("first", "all"):
        two_heads = (vllm_side(1, 2, hnd=True), vllm_side(4, 2))
        run_pair(*two_heads, 2, (src, dst), mover, decode_replicas=replicas)


def flashinfer_fused_pages_into_flash_attention_split_pages(mover: Mover) -> None:
    n = 33
    src = page_slots([4, 6, 1], 16, n)
    dst = page_slots([9, 2, 5], 16, n)
    run_pair(vllm_side(2, 4, backend="FLASHINFER"), vllm_side(2, 4), 4, (src, dst), mover)
    fused_hnd = vllm_side(1, 4, backend="FLASHINFER", hnd=True)
    run_pair(fused_hnd, vllm_side(2, 4), 4, (src, dst), mover)


def vllm_mla_into_an_sglang_mla_pool(mover: Mover) -> None:
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
        mover,
    )


def state_label(layer: int, tensor: int, channel: int, rest: int) -> int:
    return ((layer * 4 + tensor) * 4096 + channel) * 1024 + rest + 7


def global_channel(
    local: int, rank: int, tp: int, parts: tuple[int, ...], copied: tuple[int, ...] = ()
) -> int:
    """Which model channel a rank's local channel is: each part split over TP on its own, but
    a part of ``copied[i]`` groups below TP (Mamba2's B and C, n_groups 1) is held whole by
    every rank, as vLLM's ``extra_groups_for_head_shards`` extends n_groups to TP (rank ``r``
    holding group ``r * groups // tp``, all of group 0 for one group)."""
    offset = 0
    for number, part in enumerate(parts):
        groups = copied[number] if number < len(copied) else 0
        if groups and groups < tp:
            share, start = part // groups, rank * groups // tp * (part // groups)
        else:
            share, start = part // tp, rank * (part // tp)
        if local < share:
            return offset + start + local
        local -= share
        offset += part
    raise AssertionError("local channel past the rank's share")


def hybrid_moves(
    mover: Mover,
    planner: PDTransferPlanner,
    caches: tuple[Sequence[CacheBuffers], CacheBuffers],
    slots: tuple[np.ndarray, np.ndarray],
    states: tuple[int, int],
) -> None:
    """Decode rank 0's request of a hybrid model: its KV buffers (the first four) by slot maps,
    its state buffers (the rest) by the request's state slot on each side."""
    prefill, decode = caches
    kv_buffers = range(4)
    state_buffers = range(4, len(decode.buffers))
    for source, fragments in planner.transfer_fragments(0).items():
        prepared = prepared_between(fragments, prefill[source], decode)
        mover(prepared.token_descriptors(*slots, buffers=kv_buffers))
        mover(prepared.descriptors([states[0]], [states[1]], buffers=state_buffers))


def a_hybrid_moves_vllm_state_tensors_into_sglang_s_mamba_pool(
    mover: Mover, groups: int = 2
) -> None:
    """With ``groups=1`` each vLLM TP 2 rank holds a copy of B and C (its conv state is
    ``x / 2 + 2 * state`` channels, vLLM's ``extra_groups_for_head_shards``), and SGLang's TP 1
    pool one: each channel must arrive once, from one copy."""
    layer = Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=groups, conv_kernel=4)
    specs = pdplan.state_specs(layer)
    conv_spec = specs[0]
    conv_parts = conv_spec.logical_parts
    assert conv_parts is not None
    ptp, dtp, slots_p, slots_d = 2, 1, 6, 5
    copied = (0, groups, groups) if groups % ptp else ()
    # vLLM's mamba2_state_shape: n_groups extended to a multiple of TP, conv channels / TP.
    extended = groups + (ptp - groups if groups % ptp else 0)
    conv_share = (4 * 2 + 2 * extended * 3) // ptp

    def vllm_rank(rank: int) -> tuple[list[Any], Side, list[list[np.ndarray]]]:
        kv = vllm_kv(layers=2, blocks=12, block_size=16, heads=4 // ptp, dim=4)
        states = []
        for _ in range(2):  # vLLM's dim-first conv layout, the same as SGLang's
            conv = kv.keep(guarded((slots_p, conv_share, 3)))
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
    # The model's layers 0 and 2 attend, 1 and 3 are Mamba2 (vLLM's list is in model order).
    pool.model_layer_ids = (0, 2)
    conv_d = d_side.keep(guarded((2, slots_d, conv_spec.logical_size, 3)))
    temporal_d = d_side.keep(guarded((2, slots_d, 4, 2, 3)))
    # SGLang's MambaPool counts its layers (num_mamba_layers); HybridReqToTokenPool.mamba_map
    # names their model layers (model layer -> pool layer).
    mamba_pool = SimpleNamespace(
        mamba_cache=SimpleNamespace(conv=[conv_d], temporal=temporal_d), num_mamba_layers=2
    )
    requests = SimpleNamespace(mamba_pool=mamba_pool, mamba_map={1: 0, 3: 1})
    d_bufs = sglang.buffers(pool, tp_size=dtp, req_to_token_pool=requests, states=specs)
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
                channel = global_channel(c, rank, ptp, conv_parts, copied)
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
    mover.register([kv for _, kv, _ in prefill], [d_side])
    hybrid_moves(mover, planner, (p_bufs, d_bufs), (src, dst), (src_state, dst_state))
    for got, wanted in zip(kv_cache.actual(), want, strict=True):
        np.testing.assert_array_equal(got, wanted)
    np.testing.assert_array_equal(conv_d, want_conv)
    np.testing.assert_array_equal(temporal_d, want_temporal)
    assert guards_intact(d_side)


# A hybrid of 8 layers, linear attention (Mamba2) except layers 3 and 7 (full attention): what
# vLLM's kv_cache_utils makes of it is one cache group of the attention layers and the linear
# layers split into groups of as many, strided (``layers[i::num_groups]``), and the model
# runner fills ``kv_caches`` group by group. SGLang keeps the same model in a
# HybridLinearKVPool: the attention layers densely in its full_kv_pool (global ids in
# ``full_attention_layer_id_mapping``), the linear layers in its MambaPool (their model layers
# in HybridReqToTokenPool.mamba_map).
HYBRID_ATTENTION = (3, 7)
HYBRID_LINEAR = (0, 1, 2, 4, 5, 6)


def vllm_group_order() -> list[int]:
    """The model layers in the order vLLM's kv_caches dict holds them: the attention group,
    then the linear layers' groups, each ``layers[i::num_groups]``."""
    groups = len(HYBRID_LINEAR) // len(HYBRID_ATTENTION)
    linear = [layer for i in range(groups) for layer in HYBRID_LINEAR[i::groups]]
    return [*HYBRID_ATTENTION, *linear]


def vllm_hybrid_groups_into_sglang_s_hybrid_pool_by_layer(mover: Mover) -> None:
    layer = Mamba2Layer(heads=4, head_dim=2, state_size=3, groups=2, conv_kernel=4)
    specs = pdplan.state_specs(layer)
    conv_size = specs[0].logical_size
    assert vllm_group_order() == [3, 7, 0, 4, 1, 5, 2, 6]
    kv = vllm_kv(layers=len(HYBRID_ATTENTION), blocks=12, block_size=16, heads=4, dim=4)
    states = {}
    for model_layer in HYBRID_LINEAR:
        conv = kv.keep(guarded((6, conv_size, 3)))
        ssm = kv.keep(guarded((6, 4, 2, 3)))
        states[model_layer] = [conv, ssm]
    attention = dict(zip(HYBRID_ATTENTION, kv.tensors))
    caches = {
        f"model.layers.{i}.self_attn.attn" if i in attention else f"model.layers.{i}.linear_attn": (
            attention[i] if i in attention else states[i]
        )
        for i in vllm_group_order()
    }
    p_bufs = vllm.buffers(caches, backend="FLASH_ATTN", tp_size=1, num_kv_heads=4, states=specs)
    full, d_side = sglang_mha(layers=len(HYBRID_ATTENTION), size=128, page_size=64, heads=4, dim=4)
    full.model_layer_ids = HYBRID_ATTENTION
    conv_d = d_side.keep(guarded((len(HYBRID_LINEAR), 5, conv_size, 3)))
    temporal_d = d_side.keep(guarded((len(HYBRID_LINEAR), 5, 4, 2, 3)))
    mamba_pool = SimpleNamespace(
        mamba_cache=SimpleNamespace(conv=[conv_d], temporal=temporal_d),
        num_mamba_layers=len(HYBRID_LINEAR),
    )
    hybrid = SimpleNamespace(
        full_kv_pool=full,
        full_attention_layer_id_mapping={g: i for i, g in enumerate(HYBRID_ATTENTION)},
        mamba_pool=mamba_pool,
        page_size=64,
    )
    requests = SimpleNamespace(
        mamba_pool=mamba_pool, mamba_map={g: i for i, g in enumerate(HYBRID_LINEAR)}
    )
    d_bufs = sglang.buffers(hybrid, tp_size=1, req_to_token_pool=requests, states=specs)
    # Both sides name every buffer's model layer: the attention layers, then the states.
    layers = [3, 3, 7, 7] + [i for i in HYBRID_LINEAR for _ in range(2)]
    assert [b.layer for b in p_bufs.buffers] == layers == [b.layer for b in d_bufs.buffers]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 1),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=p_bufs.buffers,
        decode_buffers=d_bufs.buffers,
        token_maps=True,
    )
    planner.verify()
    n, src_state, dst_state = 21, 4, 2
    src = page_slots([3, 8], 16, n)
    dst = page_slots([1], 64, n)
    RankCache.of_vllm(kv, "FLASH_ATTN", 16).fill(src, heads_of(0, 1, 4))
    for model_layer, (conv, ssm) in states.items():  # each state says which layer it is
        for c in range(conv_size):
            conv[src_state, c] = [state_label(model_layer, 0, c, x) for x in range(3)]
        for h in range(4):
            ssm[src_state, h] = np.array(
                [state_label(model_layer, 1, h, x) for x in range(6)]
            ).reshape(2, 3)
    kv_cache = RankCache.of_sglang(full)
    want = kv_cache.expected(dst, heads_of(0, 1, 4), range(n))
    want_conv, want_temporal = conv_d.copy(), temporal_d.copy()
    for index, model_layer in enumerate(HYBRID_LINEAR):
        for c in range(conv_size):
            want_conv[index, dst_state, c] = [state_label(model_layer, 0, c, x) for x in range(3)]
        for h in range(4):
            want_temporal[index, dst_state, h] = np.array(
                [state_label(model_layer, 1, h, x) for x in range(6)]
            ).reshape(2, 3)
    mover.register([kv], [d_side])
    hybrid_moves(mover, planner, ([p_bufs], d_bufs), (src, dst), (src_state, dst_state))
    for got, wanted in zip(kv_cache.actual(), want, strict=True):
        np.testing.assert_array_equal(got, wanted)
    np.testing.assert_array_equal(conv_d, want_conv)
    np.testing.assert_array_equal(temporal_d, want_temporal)
    assert guards_intact(d_side)


#: Every pair, by name.
PAIRS: dict[str, Callable[[Mover], None]] = {
    "vllm_flash_attention_tp4_to_sglang_mha_pool_64_tp2": (
        vllm_flash_attention_tp4_into_an_sglang_pool_of_64_token_pages_tp2
    ),
    "vllm_hnd_tp2_to_vllm_nhd_tp4_equal_pages": vllm_hnd_tp2_into_vllm_nhd_tp4_at_equal_pages,
    "flashinfer_fused_to_flash_attention_split": (
        flashinfer_fused_pages_into_flash_attention_split_pages
    ),
    "vllm_mla_to_sglang_mla_pool": vllm_mla_into_an_sglang_mla_pool,
    "vllm_one_group_mamba_hybrid_to_sglang_mamba_pool": (
        lambda mover: a_hybrid_moves_vllm_state_tensors_into_sglang_s_mamba_pool(mover, 1)
    ),
    "vllm_mamba_hybrid_to_sglang_mamba_pool": (
        a_hybrid_moves_vllm_state_tensors_into_sglang_s_mamba_pool
    ),
    "vllm_hybrid_groups_to_sglang_hybrid_pool": (
        vllm_hybrid_groups_into_sglang_s_hybrid_pool_by_layer
    ),
}


def main(cases: Mapping[str, Callable[[Mover], None]] | None = None) -> None:
    """Runs `cases` (these pairs by default) as the command line names them, printing an ok
    line a case, and leaves with the verdict as its exit code."""
    cases = PAIRS if cases is None else cases
    chosen, engine = sys.argv[1], sys.argv[2]
    try:
        for name in cases if chosen == "all" else [chosen]:
            mover = Mover(engine)
            cases[name](mover)
            print(f"ok {name} through {engine}: {mover.moved} bytes", flush=True)
        code = 0
    except BaseException:  # the verdict, whatever went wrong
        traceback.print_exc()
        sys.stdout.flush()
        code = 1
    sys.stderr.flush()
    os._exit(code)


def child_verdicts(script: str, engine: str) -> tuple[int, list[str], str]:
    """Runs every case of `script` (a file beside this one) through `engine` in one child
    process: its exit code, the cases that passed, and what it printed."""
    path = Path(__file__).resolve().parent / script
    done = subprocess.run(
        [sys.executable, str(path), "all", engine],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    passed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("ok ")]
    return done.returncode, passed, done.stdout + done.stderr


if __name__ == "__main__":
    main()
