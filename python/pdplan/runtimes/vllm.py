"""vLLM's KV cache tensors as pdplan buffers.

``kv_caches`` is what vLLM's model runner allocates per layer, in layer order (a list, or the
``{layer_name: tensor}`` dict): an attention layer's tensor in its backend's logical shape,
whose strides say how memory is ordered (an ``HND`` cache keeps the logical shape and permutes
its strides), and a recurrent layer's list of state tensors. vLLM's ``slot_mapping``
(``block * block_size + offset``) rows are pdplan slot maps as they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pdplan._arrays import CacheBuffers, buffer_from_array
from pdplan._bounded import bounded_tuple, shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout
from pdplan.runtimes._conventions import RuntimeConventions
from pdplan.runtimes._indexer import indexer_buffers, indexer_parts
from pdplan.runtimes._numbering import NUMBERINGS, LayerNumbering, layer_index
from pdplan.runtimes._states import StateSpecs, shape_of, state_buffers

__all__ = [
    "BACKENDS",
    "CONNECTOR_VIEW",
    "CPU_TOKEN_ISA",
    "NUMBERINGS",
    "REFUSED",
    "LayerNumbering",
    "buffers",
    "conventions",
    "indexer_parts",
    "layer_index",
    "packed_states",
    "whole_pages",
]

#: How each attention backend's per-layer KV tensor holds K and V, by vLLM's backend names:
#: its logical shape and how pdplan reads it. The tensor's strides say how memory is ordered
#: (an HND cache keeps the logical shape and permutes its strides). vLLM releases up to 0.27
#: give GPU backends K and V as planes (``"planes"``); later ones pack K and V of a head on the
#: last axis (``"packed"``, one buffer a layer whose unit is a head's K and V). Either is read
#: by the tensor's dimensions.
BACKENDS: Mapping[str, str] = {
    "FLASH_ATTN": "(2, blocks, block_size, kv_heads, head_size) or (blocks, kv_heads, "
    "block_size, 2 * head_size)",
    "FLEX_ATTENTION": "(2, blocks, block_size, kv_heads, head_size) or (blocks, kv_heads, "
    "block_size, 2 * head_size)",
    "FLASHINFER": "(blocks, 2, block_size, kv_heads, head_size) or (blocks, kv_heads, "
    "block_size, 2 * head_size)",
    "TRITON_ATTN": "(blocks, 2, block_size, kv_heads, head_size) or (blocks, kv_heads, "
    "block_size, 2 * head_size)",
    "ROCM_AITER_FA": "(blocks, kv_heads, block_size, 2 * head_size)",
    "ROCM_AITER_UNIFIED_ATTN": "(blocks, kv_heads, block_size, 2 * head_size)",
    "CPU_ATTN": "(blocks, kv_heads, block_size, 2 * head_size), K transposed then V inside "
    "each (block, head)",
    "FLASHMLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "TRITON_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "CUTLASS_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "FLASHINFER_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "FLASH_ATTN_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "FLASHMLA_SPARSE": "(blocks, block_size, 656) for fp8_ds_mla, else (blocks, block_size, "
    "kv_lora_rank + qk_rope_head_dim)",
    "ROCM_AITER_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "CPU_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim), any dtype, 16-token blocks",
    "AMX_MLA": "(blocks, block_size, kv_lora_rank + qk_rope_head_dim), bfloat16, blocks a "
    "multiple of 32 tokens",
}

#: How vLLM 0.32 and later hand a connector every layer (``allocate_kv_cache`` in
#: ``v1/worker/utils.py``): one 4-D ``[blocks, heads, block_size, bytes or elements]`` view a
#: layer, an MLA latent with one head, a recurrent layer's states packed into one int8 row a
#: block (``packed_states``).
CONNECTOR_VIEW = "[blocks, heads, block_size, width]"

#: The ISA of vLLM's CPU attention kernel (its attention layers' ``isa``) whose pages pdplan
#: reads token by token: ``"vec"`` keeps each head's K transposed, a row of the block's tokens
#: a head dim, then its V token by token (``cpu_attn_reshape_and_cache``; a head's page is
#: ``TokenPieces`` ``(head_size, 1)``). Others (``"amx"``'s bf16 tiles of 16 tokens, ``"vec16"``)
#: interleave tokens otherwise: their pages move whole only.
CPU_TOKEN_ISA = "vec"


def whole_pages(backend: str | None, isa: str | None = None) -> str:
    """Why a backend's pages move only whole, never token by token (so a pair whose blocks
    hold other token counts is refused); empty where tokens move between any block sizes.

    :param backend: vLLM's attention backend name.
    :param isa: With ``CPU_ATTN``, its kernel's ISA (the attention layers' ``isa``).
    """
    if backend == "CPU_ATTN" and isa != CPU_TOKEN_ISA:
        return (
            f"vLLM's CPU backend with the {shown(isa)} kernel interleaves a block's tokens "
            f"(pdplan reads its {CPU_TOKEN_ISA!r} kernel's blocks token by token), so where a "
            "token's bytes lie depends on the block size"
        )
    return ""


#: Backends whose tensors pdplan refuses, and why: their pages are not what their shape says.
REFUSED: Mapping[str, str] = {
    "ROCM_ATTN": "its K block is packed as (kv_heads, head_size / x, block_size, x) inside a "
    "(2, blocks, block_size, kv_heads, head_size) shape",
}

_MLA = frozenset(name for name in BACKENDS if name.endswith("MLA") or "MLA_" in name)
_PLANES_FIRST = frozenset({"FLASH_ATTN", "FLEX_ATTENTION"})
_KV_AXES = ("page", "token", "head", "dim")


def _entries(
    kv_caches: Sequence[Any] | Mapping[str, Any], numbering: Callable[[str], int] = layer_index
) -> list[tuple[int, str | None, Any]]:
    """``(model layer, name, tensor or state list)`` of every layer, in model order. A dict is
    ordered by each name's layer (vLLM fills it cache group by cache group, so a hybrid
    model's dict is not in model order); a list is taken as given, entry ``i`` being layer
    ``i``."""
    if isinstance(kv_caches, Mapping):
        named = bounded_tuple(kv_caches.items(), "kv_caches", "MAX_LAYOUT_BUFFERS")
        found: list[tuple[int, str | None, Any]] = [
            (numbering(name), str(name), entry) for name, entry in named
        ]
        found.sort(key=lambda item: (item[0], item[1] or ""))
        return found
    listed = bounded_tuple(kv_caches, "kv_caches", "MAX_LAYOUT_BUFFERS")
    return [(layer, None, entry) for layer, entry in enumerate(listed)]


def _is_indexer(name: str | None) -> bool:
    """Whether a ``kv_caches`` entry is an MLA indexer's key cache
    (``model.layers.7.self_attn.indexer.k_cache``, DeepSeek-V3.2)."""
    return name is not None and "indexer" in name.split(".")


def _is_state(entry: Any) -> bool:
    return isinstance(entry, (list, tuple))


def _planes(tensor: Any, backend: str, label: str) -> tuple[Any, Any]:
    """K and V of one layer's 5-D tensor (planes): two views, nothing copied."""
    shape = shape_of(tensor, f"{label}'s KV tensor")
    axis = 0 if backend in _PLANES_FIRST else 1
    if len(shape) != 5 or shape[axis] != 2:
        raise UnsupportedPDLayoutError(
            f"{label}: a {backend} KV tensor has the logical shape {BACKENDS[backend]}, got {shape}"
        )
    return (tensor[0], tensor[1]) if axis == 0 else (tensor[:, 0], tensor[:, 1])


def _cpu_slabs(
    tensor: Any, label: str, first: int, layer: int, tp_size: int, heads: int, isa: str | None
) -> tuple[BufferLayout, int, int]:
    """vLLM's CPU cache: per (block, head) a slab of K transposed (``[head_size][block_size]``),
    then V; a token has no place of its own in it, so the buffer moves whole slabs: one
    buffer a layer, its heads split over TP, pages of ``block_size`` tokens (a pair at other
    block sizes is refused)."""
    shape = shape_of(tensor, f"{label}'s KV tensor")
    if len(shape) != 4:
        raise UnsupportedPDLayoutError(
            f"{label}: a CPU_ATTN KV tensor has the logical shape {BACKENDS['CPU_ATTN']}, got "
            f"{shape}"
        )
    # More TP ranks than KV heads: each head is kept whole by tp / heads ranks (vLLM's
    # replication), a replica group the planner reads any one of.
    replica = tp_size // heads if 0 < heads < tp_size else 1
    if 0 < heads < tp_size and tp_size % heads:
        raise UnsupportedPDLayoutError(
            f"{label}: tp_size={tp_size} is above the {heads} KV heads but not a multiple of "
            "them: the heads cannot be replicated evenly"
        )
    layout, base, limit = buffer_from_array(
        first,
        BufferKind.MAMBA_STATE,  # read as whole units (heads) a page, then named as K and V
        tensor,
        ("page", "head", "dim", "dim"),
        logical_size=heads,
        tp_size=tp_size // replica,
        layer=layer,
    )
    # With the "vec" kernel a head's page is K transposed (a piece a head dim, the block's
    # tokens inside), then V token by token: tokens move between blocks of any size.
    by_token = isa == CPU_TOKEN_ISA
    kv = dataclasses.replace(
        layout, buffer_kind=BufferKind.TARGET_K, page_size=shape[2], tp_replica_group_size=replica,
        logical_axis="kv_head" if by_token else layout.logical_axis,
        token_pieces=(shape[3] // 2, 1) if by_token else None,
    )  # fmt: skip
    return kv, base, limit


def _latent(tensor: Any, backend: str, label: str) -> Any:
    """An MLA layer's latent cache as ``(blocks, block_size, width)``: as the backend shapes
    it, or as vLLM 0.32 hands it a connector (``CONNECTOR_VIEW``, its one head dropped)."""
    shape = shape_of(tensor, f"{label}'s KV tensor")
    if len(shape) == 4 and shape[1] == 1:
        return tensor[:, 0]
    if len(shape) != 3:
        raise UnsupportedPDLayoutError(
            f"{label}: a {backend} KV tensor has the logical shape {BACKENDS[backend]} (or "
            f"{CONNECTOR_VIEW} with one head), got {shape}"
        )
    return tensor


def packed_states(
    pages: Any, shapes: Sequence[Sequence[int]], itemsizes: Sequence[int]
) -> list[Any]:
    """A recurrent layer's state tensors, out of the one view vLLM 0.32 and later hand a
    connector for it (``CONNECTOR_VIEW``: ``[blocks, 1, 1, bytes]``, int8): each block's bytes
    hold the states one after another, state ``i`` ``prod(shapes[i]) * itemsizes[i]`` bytes
    (``MambaBase.bind_kv_cache`` in ``model_executor/layers/mamba/abstract.py`` unpacks it
    so; ``MambaSpec.shapes`` and ``dtypes`` give both, conv state first). State ``i`` comes
    back as a view ``(blocks, *shapes[i], itemsizes[i])`` of bytes, nothing copied: its
    element's bytes as the innermost axis, so no dtype is needed to describe it.

    :param pages: The layer's view, ``[blocks, 1, 1, bytes]`` (or ``[blocks, bytes]``), int8.
    :param shapes: Each state's shape on this rank (``MambaSpec.shapes``).
    :param itemsizes: Each state's element size in bytes (of ``MambaSpec.dtypes``).
    """
    shape = shape_of(pages, "a recurrent layer's state pages")
    if len(shapes) != len(itemsizes) or not shapes:
        raise UnsupportedPDLayoutError(
            f"a recurrent layer's states need a shape and an element size each, got "
            f"{len(shapes)} shapes and {len(itemsizes)} sizes"
        )
    sizes = [math.prod(int(n) for n in s) * int(b) for s, b in zip(shapes, itemsizes)]
    if (
        len(shape) not in (2, 4)
        or math.prod(shape[1:]) < sum(sizes)
        or any(n != 1 for n in shape[1:-1])
    ):
        raise UnsupportedPDLayoutError(
            f"a recurrent layer's state pages are {CONNECTOR_VIEW} with one head and one row "
            f"of at least the states' {sum(sizes)} bytes, got {shape}"
        )
    rows = pages if len(shape) == 2 else pages[:, 0, 0]
    views, start = [], 0
    for size, state, itemsize in zip(sizes, shapes, itemsizes):
        part = rows[:, start : start + size]
        # Splitting one axis into several is always a view (torch and numpy): never a copy.
        views.append(part.reshape(shape[0], *(int(n) for n in state), int(itemsize)))
        start += size
    return views


def _check_backend(backend: str | None) -> str:
    """The backend, or a refusal of one pdplan does not read, naming the way forward."""
    if backend is None:
        raise UnsupportedPDLayoutError(
            "backend= is needed: the cache holds attention layers (only a model of recurrent "
            "layers alone needs none)"
        )
    if backend in REFUSED:
        raise UnsupportedPDLayoutError(
            f"backend={shown(backend)} is refused: {REFUSED[backend]}; pdplan does not move such "
            "pages yet"
        )
    if backend not in BACKENDS:
        raise UnsupportedPDLayoutError(
            f"backend={shown(backend)} is not one pdplan reads; known: {', '.join(BACKENDS)}. For "
            "another layout describe each tensor by its axes with pdplan.buffer_from_array "
            "(page, token, head, dim; see the runtime-tensors guide)"
        )
    return backend


def _check_layout(buffer: BufferLayout, kv_layout: str, label: str) -> None:
    head_major = buffer.rows_per_page == 1
    # One head a rank is the same bytes either way.
    one_head = (buffer.page_bytes or buffer.item_stride_bytes) == buffer.bytes_per_logical_unit
    if buffer.page_size > 1 and not one_head and head_major != (kv_layout == "HND"):
        found = "HND (head-major)" if head_major else "NHD (token-major)"
        raise UnsupportedPDLayoutError(
            f"{label}: kv_layout={shown(kv_layout)}, but the tensor's strides are {found}; "
            "pass the layout the backend was built with"
        )


def _heads_of(heads: int | Mapping[int, int] | None, layer: int, label: str) -> int | None:
    """The model's KV heads of one layer: the one count, or the layer's in a mapping."""
    if heads is None or isinstance(heads, int):
        return heads
    if layer not in heads:
        raise UnsupportedPDLayoutError(
            f"num_kv_heads names no count for {label} (model layer {layer}); give every "
            "attention layer's"
        )
    count = heads[layer]
    if isinstance(count, bool) or not isinstance(count, int):
        raise UnsupportedPDLayoutError(
            f"num_kv_heads for {label} must be an int, got {type(count).__name__}"
        )
    return count


def buffers(
    kv_caches: Sequence[Any] | Mapping[str, Any],
    *,
    backend: str | None,
    kv_layout: Literal["NHD", "HND"] = "NHD",
    tp_size: int,
    num_kv_heads: int | Mapping[int, int] | None = None,
    states: StateSpecs | None = None,
    sliding_windows: Mapping[int, int] | None = None,
    numbering: Callable[[str], int] = layer_index,
    isa: str | None = None,
) -> CacheBuffers:
    """The buffers of one vLLM rank's KV cache.

    Buffers follow the model's layers, whatever order ``kv_caches`` hands them over in: K and
    V of the ``k``-th attention layer in model order are ``2k`` and ``2k + 1`` (MLA: ``k``),
    states after them layer by layer (``CacheBuffers``), then each MLA indexer cache
    (DeepSeek-V3.2's ``...indexer.k_cache``) as two buffers, its keys and its scales
    (``indexer_parts``: a page holds every token's keys, then every token's scale), each
    buffer with its model layer as ``BufferLayout.layer``. A layer whose tensor is another's
    (KV sharing) is described once and listed in ``CacheBuffers.shared``.

    :param kv_caches: What vLLM's model runner allocates per layer: the ``{layer_name:
        tensor}`` dict it keeps, each layer known by its name (``layer_index``; vLLM fills
        it cache group by cache group, so a hybrid model's dict is not in model order), or a
        list in model order. An attention layer's value is its tensor, a recurrent layer's
        its list of state tensors.
    :param backend: vLLM's attention backend name (``BACKENDS``); None only for a cache of
        recurrent layers alone (pure Mamba2).
    :param kv_layout: The layout the backend was built with, checked against the strides.
    :param tp_size: The rank's TP size.
    :param num_kv_heads: The model's KV heads (not the rank's), required except for MLA; a
        mapping gives each attention layer's own, by its model layer, where they differ
        (Gemma 3n and 4).
    :param states: Describes each state tensor of a recurrent layer
        (``pdplan.runtimes.state_specs(layer)``): the same for every recurrent layer, or a
        mapping giving each its own by its model layer. A recurrent layer's value in
        ``kv_caches`` is its list of state tensors (``packed_states`` unpacks the one view
        vLLM 0.32 hands a connector).
    :param sliding_windows: The window of each sliding-window attention layer, by its model
        layer (``layer_index`` of its name; its position in a list).
    :param numbering: The model layer of a ``kv_caches`` key: ``layer_index``, or the model's
        ``LayerNumbering`` (``LayerNumbering.of(config)``), which also reads Falcon-H1's and
        Zamba2's names back (``NUMBERINGS``) and refuses a draft model's layers.
    :param isa: With ``CPU_ATTN``, its kernel's ISA (the attention layers' ``isa``): the
        ``"vec"`` kernel's pages are described token by token (``CPU_TOKEN_ISA``).
    """
    if kv_layout not in ("NHD", "HND"):
        raise UnsupportedPDLayoutError(f"kv_layout must be 'NHD' or 'HND', got {shown(kv_layout)}")
    entries = _entries(kv_caches, numbering)
    windows = dict(sliding_windows or {})
    built: list[tuple[BufferLayout, int, int]] = []
    # A layer sharing another's cache (KV sharing) is handed the same tensor object: described
    # once. Layers of different cache groups may view the same memory (vLLM 0.32 on starts
    # every group at byte 0) yet are different layers, reading other blocks: never merged.
    owner_of: dict[int, str] = {}
    shared: list[tuple[str, str]] = []
    attention = [(layer, name, entry) for layer, name, entry in entries if not _is_state(entry)]
    indexers = [(layer, name, tensor) for layer, name, tensor in attention if _is_indexer(name)]
    attention = [entry for entry in attention if not _is_indexer(entry[1])]
    # A cache of recurrent layers alone names no backend.
    named = _check_backend(backend) if attention or indexers or backend is not None else ""
    all_heads = num_kv_heads
    for layer, name, tensor in attention:
        label = name if name is not None else f"layer {layer}"
        num_kv_heads = _heads_of(all_heads, layer, label)
        window = windows.get(layer)
        first = len(built)
        if named == "CPU_ATTN" or (named not in _MLA and len(shape_of(tensor, label)) == 4):
            if num_kv_heads is None:
                raise UnsupportedPDLayoutError(
                    "num_kv_heads= is needed: the model's KV heads across all TP ranks"
                )
            if named == "CPU_ATTN":
                views = [_cpu_slabs(tensor, label, first, layer, tp_size, num_kv_heads, isa)]
            else:  # K and V of a head packed on the last axis: a unit is both
                packed = buffer_from_array(
                    first,
                    BufferKind.TARGET_K,
                    tensor,
                    ("page", "head", "token", "dim"),
                    logical_size=num_kv_heads,
                    tp_size=tp_size,
                    layer=layer,
                    sliding_window=window,
                )
                _check_layout(packed[0], kv_layout, label)
                views = [packed]
        elif named in _MLA:
            layout = buffer_from_array(
                first,
                BufferKind.TARGET_K,
                _latent(tensor, named, label),
                ("page", "token", "dim"),
                tp_size=tp_size,
                layer=layer,
                sliding_window=window,
            )
            views = [layout]
        else:
            if num_kv_heads is None:
                raise UnsupportedPDLayoutError(
                    "num_kv_heads= is needed: the model's KV heads across all TP ranks"
                )
            views = []
            for plane, (kind, view) in enumerate(
                zip((BufferKind.TARGET_K, BufferKind.TARGET_V), _planes(tensor, named, label))
            ):
                entry = buffer_from_array(
                    first + plane,
                    kind,
                    view,
                    _KV_AXES,
                    logical_size=num_kv_heads,
                    tp_size=tp_size,
                    layer=layer,
                    sliding_window=window,
                )
                _check_layout(entry[0], kv_layout, label)
                views.append(entry)
        memory = id(tensor)
        if memory in owner_of:
            shared.append((label, owner_of[memory]))
            continue
        owner_of[memory] = label
        built += views
    recurrent = [(layer, entry) for layer, _, entry in entries if _is_state(entry)]
    built += state_buffers(
        len(built),
        [entry for _, entry in recurrent],
        states,
        tp_size,
        [layer for layer, _ in recurrent],
    )
    for layer, name, tensor in indexers:
        shape = shape_of(tensor, f"{name}'s indexer cache")
        if len(shape) != 3:
            raise UnsupportedPDLayoutError(
                f"{name}: an MLA indexer cache is (blocks, block_size, bytes a token), got {shape}"
            )
        built += indexer_buffers(len(built), tensor, shape[1], shape[2], tp_size, layer)
    return CacheBuffers.of(built, shared)


def conventions(*, block_size: int, kernel_block_size: int | None = None) -> RuntimeConventions:
    """vLLM's rules for its planner: every decode rank of a replica group reads its own heads
    (NixlConnector's rule: ``decode_replicas="all"``), and the scheduler's blocks of
    ``block_size`` tokens are ``block_size / kernel_block_size`` kernel blocks of the cache
    tensors where the attention backend takes smaller blocks than the scheduler.

    :param block_size: The scheduler's block size (``cache_config.block_size``).
    :param kernel_block_size: The cache tensors' block (their ``block_size`` axis); None: the
        scheduler's.
    """
    kernel = block_size if kernel_block_size is None else kernel_block_size
    return RuntimeConventions("vllm", "all", block_size, kernel)
