"""vLLM 0.32's caches as it hands them a connector (``allocate_kv_cache``): one int8 backing
buffer, every layer a 4-D view into it, groups overlaying each other from byte 0; a recurrent
layer's states packed into one byte row a block (conv state then SSM state, the page padded to
the attention page), an MLA latent with one head. Filled through the layers' own typed views
(as ``MambaBase.bind_kv_cache`` unpacks the row), moved by pdplan's plan between TP sizes with
memmove, and checked byte for byte against the model's channels dealt to the ranks as vLLM
deals them (each part of a conv state split over TP on its own); the padding, the blocks not
named and a guard past the buffer stay untouched."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from runtime_pairs import global_channel

import pdplan
from pdplan import (
    GatedDeltaNetLayer,
    Mamba2Layer,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    ShortConvLayer,
    UnsupportedPDLayoutError,
)
from pdplan.runtimes import vllm

BLOCKS, GUARD = 6, 64


class Rank:
    """One rank's backing buffer (a guard after it) and its layers' connector views."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.raw = np.full(BLOCKS * page + GUARD, 0xA5, np.uint8)
        self.pages = self.raw[: BLOCKS * page].reshape(BLOCKS, page)

    def state_view(self, content: int) -> np.ndarray:
        """The connector's view of a recurrent layer: [blocks, 1, 1, content] int8."""
        return self.pages[:, None, None, :content].view(np.int8)

    def typed(self, offset: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A layer's own view of one state (bind_kv_cache's slice, viewed as its dtype)."""
        size = math.prod(shape) * np.dtype(dtype).itemsize
        return self.pages[:, offset : offset + size].view(dtype).reshape(BLOCKS, *shape)


def copied_groups(layer: object, tp: int) -> tuple[int, ...]:
    """A Mamba2 conv state's parts that every rank holds whole at TP ``tp``: B and C when
    n_groups is below TP (vLLM's ``mamba2_state_shape`` extends n_groups by
    ``extra_groups_for_head_shards``: ``tp - n_groups`` more, so each rank's share is
    ``intermediate / tp + 2 * state`` channels for one group)."""
    if isinstance(layer, Mamba2Layer) and layer.groups % tp:
        return (0, layer.groups, layer.groups)
    return ()


def conv_share(layer: object, spec: pdplan.StateSpec, tp: int) -> int:
    """A rank's channels of a conv state, as vLLM's ``MambaStateShapeCalculator`` gives them."""
    if isinstance(layer, Mamba2Layer):
        groups = layer.groups + (tp - layer.groups if layer.groups % tp else 0)
        return (layer.heads * layer.head_dim + 2 * groups * layer.state_size) // tp
    return spec.logical_size // tp


def states_of(
    layer: object, tp: int, dim_first: bool
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[type]]:
    """Each state's logical parts and its shape on a rank of TP ``tp`` as vLLM's
    ``MambaStateShapeCalculator`` gives it (conv: (taps, channels), or (channels, taps) with
    ``VLLM_SSM_CONV_STATE_LAYOUT=DS``), and its dtype."""
    specs = pdplan.state_specs(layer)  # type: ignore[arg-type]
    parts, shapes, dtypes = [], [], []
    for number, spec in enumerate(specs):
        parts.append(spec.logical_parts or (spec.logical_size,))
        share = conv_share(layer, spec, tp)
        if number < len(specs) - 1 or isinstance(layer, ShortConvLayer):
            taps = layer.conv_kernel - 1  # type: ignore[attr-defined]
            shapes.append((share, taps) if dim_first else (taps, share))
            dtypes.append(np.float16)
        else:
            recurrent = {
                Mamba2Layer: lambda m: (m.heads // tp, m.head_dim, m.state_size),
                GatedDeltaNetLayer: lambda g: (
                    g.value_heads // tp,
                    g.value_head_dim,
                    g.key_head_dim,
                ),
            }[type(layer)](layer)  # type: ignore[operator]
            shapes.append(recurrent)
            dtypes.append(np.float32)
    return parts, shapes, dtypes


def channel_axis(shape: tuple[int, ...], number: int, dim_first: bool, conv_states: int) -> int:
    return 0 if number >= conv_states or dim_first else 1


def fill(rank: Rank, tp: int, index: int, layer: object, dim_first: bool, block: int) -> None:
    """Writes every state of block ``block`` with its model channel numbers (each value the
    channel times 1000 plus its place inside the channel), through the layer's typed views."""
    parts, shapes, dtypes = states_of(layer, tp, dim_first)
    conv_states = len(shapes) - (0 if isinstance(layer, ShortConvLayer) else 1)
    offset = 0
    for number, (part, shape, dtype) in enumerate(zip(parts, shapes, dtypes)):
        view = rank.typed(offset, shape, dtype)
        axis = channel_axis(shape, number, dim_first, conv_states)
        moved = np.moveaxis(view[block], axis, 0)
        inner = math.prod(moved.shape[1:])
        for local in range(moved.shape[0]):
            copied = copied_groups(layer, tp) if number < conv_states else ()
            channel = global_channel(local, index, tp, part, copied)
            moved[local] = (channel * 1000 + np.arange(inner) % 997).reshape(moved.shape[1:])
        offset += math.prod(shape) * np.dtype(dtype).itemsize


def describe(rank: Rank, tp: int, layer: object, dim_first: bool) -> pdplan.CacheBuffers:
    _, shapes, dtypes = states_of(layer, tp, dim_first)
    content = sum(math.prod(s) * np.dtype(d).itemsize for s, d in zip(shapes, dtypes))
    view = rank.state_view(content)
    states = vllm.packed_states(view, shapes, [np.dtype(d).itemsize for d in dtypes])
    return vllm.buffers(
        {"model.layers.3.mixer": states}, backend=None, tp_size=tp,
        states={3: pdplan.state_specs(layer)},  # type: ignore[arg-type]
    )  # fmt: skip


LAYERS = [
    Mamba2Layer(heads=8, head_dim=4, state_size=4, groups=2, conv_kernel=4),
    # One B/C group (Granite-4.0-H, Falcon-H1, Mamba2-2.7B): copied onto both TP 2 ranks.
    Mamba2Layer(heads=8, head_dim=4, state_size=4, groups=1, conv_kernel=4),
    GatedDeltaNetLayer(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=4, conv_kernel=4),
    ShortConvLayer(channels=32, conv_kernel=3),
]


@pytest.mark.parametrize(
    "layer", LAYERS, ids=lambda layer: f"{type(layer).__name__}{getattr(layer, 'groups', '')}"
)
@pytest.mark.parametrize("dim_first", [False, True], ids=["SD", "DS"])
@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2), (2, 2)])
def test_packed_state_pages_move_every_channel_to_its_place(
    layer: object, dim_first: bool, prefill_tp: int, decode_tp: int
) -> None:
    page = 4096  # padded to an attention page, as vLLM unifies a hybrid model's pages
    prefill = [Rank(page) for _ in range(prefill_tp)]
    decode = [Rank(page) for _ in range(decode_tp)]
    for index, rank in enumerate(prefill):
        fill(rank, prefill_tp, index, layer, dim_first, block=4)
    p = [describe(r, prefill_tp, layer, dim_first) for r in prefill]
    d = [describe(r, decode_tp, layer, dim_first) for r in decode]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_tp),
        decode_layout=ParallelLayout("decode", decode_tp),
        prefill_buffers=p[0].buffers,
        decode_buffers=d[0].buffers,
    )
    planner.verify()
    before = [r.raw.copy() for r in decode]
    for target in range(decode_tp):
        for source, fragments in planner.transfer_fragments(target).items():
            prepared = PreparedTransfer(
                fragments, p[source].base_ptrs, d[target].base_ptrs,
                src_limits=p[source].limits, dst_limits=d[target].limits,
            )  # fmt: skip
            for s, t, n in prepared.descriptors([4], [1]).as_array().tolist():
                ctypes.memmove(t, s, n)
    for index, rank in enumerate(decode):
        want = Rank(page)
        fill(want, decode_tp, index, layer, dim_first, block=1)
        changed = np.flatnonzero(rank.raw != before[index])
        # Only block 1's state bytes were written, each as the oracle has it.
        assert changed.size and changed.min() >= page and changed.max() < 2 * page
        np.testing.assert_array_equal(rank.raw[changed], want.raw[changed])
        written = want.raw[page : 2 * page] != 0xA5
        np.testing.assert_array_equal(rank.raw[page : 2 * page][written],
                                      want.raw[page : 2 * page][written])  # fmt: skip
        assert (rank.raw[-GUARD:] == 0xA5).all()


def test_pages_that_do_not_hold_the_states_are_refused() -> None:
    rank = Rank(256)
    view = rank.pages[:, None, None, :96].view(np.int8)
    with pytest.raises(UnsupportedPDLayoutError, match="at least the states' 128 bytes"):
        vllm.packed_states(view, [(4, 8), (16,)], [2, 4])
    with pytest.raises(UnsupportedPDLayoutError, match="a shape and an element size each"):
        vllm.packed_states(view, [(4, 8)], [2, 4])
    with pytest.raises(UnsupportedPDLayoutError, match="one head and one row"):
        vllm.packed_states(rank.pages.reshape(BLOCKS, 1, 2, 128), [(8,)], [2])


def test_an_mla_latent_with_one_head_reads_as_the_latent() -> None:
    """vLLM 0.32 hands a connector an MLA layer as [blocks, 1, block_size, 576]: the same
    buffer as the backend's [blocks, block_size, 576], for CPU_MLA and AMX_MLA alike."""
    latent = np.zeros((BLOCKS, 16, 576), np.float32)
    for backend in ("CPU_MLA", "AMX_MLA"):
        four = vllm.buffers({"model.layers.0.self_attn.attn": latent[:, None]},
                            backend=backend, tp_size=2)  # fmt: skip
        three = vllm.buffers({"model.layers.0.self_attn.attn": latent}, backend=backend,
                             tp_size=2)  # fmt: skip
        assert four == three
        assert four.buffers[0].logical_axis == "replicated"
        assert four.buffers[0].page_size == 16
    with pytest.raises(UnsupportedPDLayoutError, match="with one head"):
        vllm.buffers({"model.layers.0.self_attn.attn": np.zeros((BLOCKS, 2, 16, 576))},
                     backend="CPU_MLA", tp_size=1)  # fmt: skip
