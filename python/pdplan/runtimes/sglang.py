"""SGLang's memory pools as pdplan buffers.

Read from the pools' own attributes (SGLang's ``python/sglang/srt/mem_cache/memory_pool.py``
and ``swa_memory_pool.py``):

- ``MHATokenToKVPool``: ``k_buffer[i]`` and ``v_buffer[i]`` of ``(size + page_size, head_num,
  head_dim)`` for layer ``start_layer + i``, token-major flat pools whose page is ``page_size``
  consecutive slots; with a quantized KV cache also ``k_scale_buffer[i]`` and
  ``v_scale_buffer[i]`` (a scale per token, head and block of the head's dims);
- ``MLATokenToKVPool``: ``kv_buffer[i]`` of ``(size + page_size, 1, kv_cache_dim)``;
- ``SWAKVPool``: its ``full_kv_pool`` and ``swa_kv_pool``, each layer found by
  ``layers_mapping`` (global layer -> (index in its sub-pool, whether SWA));
- ``HybridLinearKVPool``: its ``full_kv_pool`` (layers by ``full_attention_layer_id_mapping``)
  and its ``mamba_pool``;
- ``MiniMaxSparseKVPool``: its ``main_pool`` (every layer's K and V) and its sparse layers'
  index caches, ``index_kv_pool`` (K and V) and ``index_k_pool`` (K only), one head a rank,
  layers by ``index_kv_layer_id_mapping`` and ``index_k_layer_id_mapping``;
- ``MambaPool``: ``mamba_cache.conv`` and ``mamba_cache.temporal`` of ``(layers, slots, ...)``,
  its layers numbered 0..n-1 among the recurrent layers; ``HybridReqToTokenPool.mamba_map``
  (model layer -> pool layer) names each one's model layer.

Rows of SGLang's ``req_to_token`` are pdplan slot maps as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pdplan._arrays import CacheBuffers, StateSpec, buffer_from_array
from pdplan._bounded import int_ids
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout
from pdplan.runtimes._conventions import RuntimeConventions
from pdplan.runtimes._indexer import indexer_buffers
from pdplan.runtimes._sglang_sparse import is_sparse_pool, sparse_pool_tensors
from pdplan.runtimes._states import attribute, shape_of, state_buffers

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["buffers", "conventions", "swa_buffers", "swa_slots"]

Built = list[tuple[BufferLayout, int, int]]


def _layer_ids(pool: Any, count: int) -> list[int]:
    """The model layer of each of a pool's ``count`` per-layer buffers: its ``model_layer_ids``
    where a hybrid parent set them, else ``start_layer + i`` (pipeline stages)."""
    ids = getattr(pool, "model_layer_ids", None)
    if ids is not None:
        ids = [int(i) for i in ids]
        if len(ids) != count:
            raise UnsupportedPDLayoutError(
                f"{type(pool).__name__}.model_layer_ids names {len(ids)} layers for {count} "
                "per-layer buffers"
            )
        return ids
    start = int(getattr(pool, "start_layer", 0) or 0)
    return [start + i for i in range(count)]


def _indexer(pool: Any, layers: list[int]) -> list[tuple[int, str, Any]]:
    """A DSA pool's ``index_k_with_scale_buffer`` (DeepSeek-V3.2's indexer keys): per layer
    ``(pages, page_size * (128 + 4))`` bytes, each page every token's 128 fp8 keys, then every
    token's fp32 scale; its parts, by layer. A layer whose indexer SGLang elides (0 pages)
    has none."""
    index = getattr(pool, "index_k_with_scale_buffer", None)
    if index is None:
        return []
    index = list(index)
    if len(index) != len(layers):
        raise UnsupportedPDLayoutError(
            f"{type(pool).__name__}.index_k_with_scale_buffer holds {len(index)} layers for "
            f"{len(layers)} of kv_buffer"
        )
    page_size = int(attribute(pool, "page_size", "the DSA pool"))
    found = []
    for layer, array in zip(layers, index):
        pages, row = shape_of(array, "an index_k_with_scale_buffer entry")[:2]
        if pages == 0:
            continue
        found.append((layer, "indexer", (array, page_size, row // page_size)))
    return found


def _scale(array: Any, name: str, heads: int) -> Any:
    """A scale buffer as ``(slots, heads, blocks)``: SGLang keeps some as ``(slots, heads *
    blocks)``, the same bytes."""
    shape = shape_of(array, name)
    if len(shape) == 3:
        return array
    if len(shape) == 2 and heads > 0 and shape[1] % heads == 0:
        return array.reshape(shape[0], heads, shape[1] // heads)
    raise UnsupportedPDLayoutError(
        f"{name} has the shape {shape}: pdplan reads a scale buffer of (slots, heads, blocks) "
        "or (slots, heads * blocks); a page-interleaved scale layout (MXFP8 at page_size 128) "
        "is not described yet"
    )


def _mha(pool: Any) -> list[tuple[int, str, Any]]:
    """``(layer, what, array)`` of an MHA pool's K, V and scale buffers, layer by layer."""
    keys, values = list(pool.k_buffer), list(pool.v_buffer)
    if len(keys) != len(values):
        raise UnsupportedPDLayoutError(
            f"the KV pool holds {len(keys)} K buffers but {len(values)} V buffers"
        )
    for native in ("native_k_scale_buffer", "native_v_scale_buffer"):
        if getattr(pool, native, None) is not None:
            raise UnsupportedPDLayoutError(
                f"{type(pool).__name__}.{native} (NVFP4 block scales in TRT-LLM's paged layout) "
                "is not described yet; the pool's K and V alone would move without it"
            )
    layers = _layer_ids(pool, len(keys))
    out = [(layer, "kv", (k, v)) for layer, k, v in zip(layers, keys, values)]
    heads = int(attribute(pool, "head_num", "the KV pool"))
    for name in ("k_scale_buffer", "v_scale_buffer"):
        scales = getattr(pool, name, None)
        if scales is None:
            continue
        scales = list(scales)
        if len(scales) != len(keys):
            raise UnsupportedPDLayoutError(
                f"the KV pool holds {len(scales)} {name} entries for {len(keys)} layers"
            )
        out += [
            (layer, name, _scale(s, f"{name}[{i}]", heads))
            for i, (layer, s) in enumerate(zip(layers, scales))
        ]
    return out


def _attention(pool: Any, tp_size: int, num_kv_heads: int | None) -> list[tuple[int, str, Any]]:
    """Every per-layer tensor of a KV pool or of the sub-pools of a wrapper, by model layer."""
    if hasattr(pool, "full_kv_pool") and hasattr(pool, "swa_kv_pool"):  # SWAKVPool
        mapping = attribute(pool, "layers_mapping", "SWAKVPool")
        return [
            *_sub_pool(pool.full_kv_pool, _local_to_global(mapping, False), tp_size, num_kv_heads),
            *_sub_pool(pool.swa_kv_pool, _local_to_global(mapping, True), tp_size, num_kv_heads),
        ]
    if is_sparse_pool(pool):  # MiniMaxSparseKVPool: its main pool and index caches
        return sparse_pool_tensors(pool, lambda main: _attention(main, tp_size, num_kv_heads))
    if hasattr(pool, "full_kv_pool"):  # HybridLinearKVPool: its full attention layers
        mapping = attribute(pool, "full_attention_layer_id_mapping", "HybridLinearKVPool")
        dense_to_global = {int(dense): int(layer) for layer, dense in mapping.items()}
        return _sub_pool(pool.full_kv_pool, dense_to_global, tp_size, num_kv_heads)
    if hasattr(pool, "k_buffer") and hasattr(pool, "v_buffer"):
        attribute(pool, "page_size", "the KV pool")
        return _mha(pool)
    if hasattr(pool, "kv_buffer"):
        attribute(pool, "page_size", "the MLA pool")
        if getattr(pool, "kv_scale_buffer", None) is not None:
            raise UnsupportedPDLayoutError(
                f"{type(pool).__name__}.kv_scale_buffer (FP4 MLA scales) is not described yet; "
                "the pool's kv_buffer alone would move without it"
            )
        arrays = list(pool.kv_buffer)
        layers = _layer_ids(pool, len(arrays))
        return [(layer, "mla", a) for layer, a in zip(layers, arrays)] + _indexer(pool, layers)
    raise UnsupportedPDLayoutError(
        f"{type(pool).__name__} is not a pool pdplan reads: expected k_buffer and v_buffer "
        "(MHATokenToKVPool), kv_buffer (MLATokenToKVPool), full_kv_pool and swa_kv_pool "
        "(SWAKVPool), full_kv_pool (HybridLinearKVPool), main_pool (MiniMaxSparseKVPool) or "
        "mamba_cache (MambaPool)"
    )


def _local_to_global(mapping: Mapping[int, tuple[int, bool]], swa: bool) -> dict[int, int]:
    """An ``SWAKVPool``'s ``layers_mapping`` (global layer -> (index in its sub-pool, is SWA))
    turned around for one sub-pool: index -> global layer."""
    return {int(index): int(layer) for layer, (index, is_swa) in mapping.items() if is_swa == swa}


def _sub_pool(
    pool: Any, local_to_global: Mapping[int, int], tp_size: int, num_kv_heads: int | None
) -> list[tuple[int, str, Any]]:
    """A wrapper's sub-pool by global layer: its ``model_layer_ids`` where SGLang set them to
    the global layers, else its local layer ``i`` (its ``start_layer`` is 0) mapped by the
    wrapper's table."""
    found = _attention(pool, tp_size, num_kv_heads)
    if getattr(pool, "model_layer_ids", None) is not None:
        return found
    missing = sorted({layer for layer, _, _ in found} - set(local_to_global))
    if missing:
        raise UnsupportedPDLayoutError(
            f"{type(pool).__name__} holds layers {missing} that its wrapper's layer table "
            "does not name"
        )
    return [(local_to_global[layer], what, array) for layer, what, array in found]


def _state_layers(mamba_pool: Any, mamba_map: Any) -> tuple[list[int], list[list[Any]]]:
    """Each recurrent layer's model layer and state tensors, conv first: views of the pool's
    tensors (``(layers, slots, ...)``). A ``MambaPool`` numbers its layers 0..n-1 among the
    recurrent layers alone; their model layers are ``HybridReqToTokenPool.mamba_map``'s
    (model layer -> the pool's layer)."""
    cache = attribute(mamba_pool, "mamba_cache", "the Mamba pool")
    conv = attribute(cache, "conv", "the Mamba pool's mamba_cache")
    conv = conv if isinstance(conv, (list, tuple)) else [conv]
    tensors = [*conv, attribute(cache, "temporal", "the Mamba pool's mamba_cache")]
    counts = {(shape_of(t, "a Mamba pool state tensor") or (0,))[0] for t in tensors}
    if len(counts) != 1:
        raise UnsupportedPDLayoutError(
            f"the MambaPool's state tensors hold different layer counts {sorted(counts)}"
        )
    count = counts.pop()
    if mamba_map is None:
        raise UnsupportedPDLayoutError(
            f"{type(mamba_pool).__name__} numbers its {count} layers 0..{count - 1} among the "
            "recurrent layers alone, not by model layer: pass the rank's req_to_token_pool "
            "(SGLang's HybridReqToTokenPool, whose mamba_map names each one's model layer) as "
            "req_to_token_pool="
        )
    try:
        by_index = {int(index): int(layer) for layer, index in dict(mamba_map).items()}
    except (TypeError, ValueError):
        raise UnsupportedPDLayoutError(
            "mamba_map must map each model layer to its MambaPool layer, as SGLang's "
            "HybridReqToTokenPool.mamba_map does"
        ) from None
    if sorted(by_index) != list(range(count)) or len(by_index) != len(dict(mamba_map)):
        raise UnsupportedPDLayoutError(
            f"mamba_map names MambaPool layers {sorted(by_index)[:16]} for the {count} the pool "
            "holds; pass the HybridReqToTokenPool that owns this MambaPool"
        )
    layers = [by_index[i] for i in range(count)]
    return layers, [[t[layer] for t in tensors] for layer in range(count)]


def _mamba_map(pool: Any, req_to_token_pool: Any) -> Any:
    """The recurrent layers' model layers: the request pool's ``mamba_map`` (or a wrapper's,
    where an SGLang version keeps one there), else None."""
    for holder in (req_to_token_pool, pool):
        found = getattr(holder, "mamba_map", None)
        if found is not None:
            return found
    return None


def _check_wrapped(pool: Any, tensors: list[tuple[int, str, Any]]) -> None:
    """A model keeping state keeps its KV in a ``HybridLinearKVPool``, whose table names each
    attention layer's model layer; its ``full_kv_pool`` alone numbers them 0..k-1 among the
    attention layers (layers a recurrent one may hold too: Falcon-H1 has both in every layer),
    so a KV pool handed over without the wrapper, and naming no model layers, is refused."""
    wrapped = hasattr(pool, "full_attention_layer_id_mapping")
    named = getattr(pool, "model_layer_ids", None) is not None
    if tensors and not wrapped and not named:
        raise UnsupportedPDLayoutError(
            f"{type(pool).__name__} numbers its layers 0..k-1 among the attention layers of a "
            "model that keeps state: pass the rank's HybridLinearKVPool (its token_to_kv_pool), "
            "whose full_attention_layer_id_mapping names each one's model layer"
        )


def buffers(
    pool: Any,
    *,
    tp_size: int,
    num_kv_heads: int | None = None,
    mamba_pool: Any = None,
    req_to_token_pool: Any = None,
    states: Sequence[StateSpec] | None = None,
    sliding_windows: Mapping[int, int] | None = None,
) -> CacheBuffers:
    """The buffers of one SGLang rank's pool: a KV pool (MHA or MLA), a wrapper of them
    (``SWAKVPool``, ``HybridLinearKVPool``), a ``MambaPool``, or a KV pool with its
    ``mamba_pool`` (hybrid models).

    Buffers follow the model's layers, each with its model layer as ``BufferLayout.layer``,
    numbered as on every runtime (``CacheBuffers``): K and V of the ``k``-th attention layer
    in model order are ``2k`` and ``2k + 1`` (MLA: ``k``), then the states layer by layer,
    conv first, then a quantized cache's scales layer by layer, K's then V's, then a DSA
    pool's indexer keys layer by layer as two buffers, its keys and its scales (a page of
    every token's keys, then every token's scale), then a ``MiniMaxSparseKVPool``'s index
    caches layer by layer (index K, then index V where the layer keeps one). A tensor of the
    pool that pdplan does not describe (FP4 MLA scales) is refused, naming it, never left out.

    :param pool: The rank's ``token_to_kv_pool`` (or its ``MambaPool``).
    :param tp_size: The rank's attention TP size.
    :param num_kv_heads: The model's KV heads when they are fewer than ``tp_size`` (SGLang
        then keeps one replicated head a rank); otherwise ``head_num * tp_size``.
    :param mamba_pool: The ``MambaPool`` of a hybrid model, when ``pool`` is its KV pool
        (a ``HybridLinearKVPool`` brings its own, and so does ``req_to_token_pool``).
    :param req_to_token_pool: The rank's ``HybridReqToTokenPool`` when the model keeps state:
        its ``mamba_map`` names each recurrent layer's model layer (a ``MambaPool`` numbers
        them 0..n-1 among themselves), and it holds the ``mamba_pool``.
    :param states: Describes each state tensor of a recurrent layer
        (``pdplan.runtimes.state_specs(layer)``).
    :param sliding_windows: The window of each sliding-window attention layer, by its model
        layer.
    """
    windows = dict(sliding_windows or {})
    tensors: list[tuple[int, str, Any]] = []
    if hasattr(pool, "mamba_cache") and mamba_pool is None:
        mamba_pool = pool
    else:
        tensors = _attention(pool, tp_size, num_kv_heads)
        if mamba_pool is None:
            mamba_pool = getattr(pool, "mamba_pool", None)
    if mamba_pool is None:
        mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    page_size = _page_size(pool)
    built: Built = []

    def token_plane(
        kind: BufferKind, array: Any, heads: int | None, layer: int, window: int | None = None
    ) -> None:
        """A flat token pool's ``(slots, heads, dim)`` tensor as the next buffer."""
        built.append(
            buffer_from_array(
                len(built),
                kind,
                array,
                ("slot", "head", "dim"),
                logical_size=heads,
                tp_size=tp_size,
                page_size=page_size,
                layer=layer,
                sliding_window=window,
            )
        )

    heads_of: dict[int, int] = {}
    kv = sorted((t for t in tensors if t[1] in ("kv", "mla")), key=lambda t: t[0])
    for layer, what, array in kv:
        window = windows.get(layer)
        if what == "mla":
            built.append(
                buffer_from_array(
                    len(built),
                    BufferKind.TARGET_K,
                    array,
                    ("slot", "dim", "dim"),
                    tp_size=tp_size,
                    page_size=page_size,
                    layer=layer,
                    sliding_window=window,
                )
            )
            continue
        # A layer's heads: the model's given, else its pool's (an SWA sub-pool keeps its own).
        heads = num_kv_heads or shape_of(array[0], "a K buffer")[1] * tp_size
        heads_of[layer] = heads
        for kind, plane in zip((BufferKind.TARGET_K, BufferKind.TARGET_V), array):
            token_plane(kind, plane, heads, layer, window)
    if mamba_pool is not None:
        layers, recurrent = _state_layers(mamba_pool, _mamba_map(pool, req_to_token_pool))
        _check_wrapped(pool, tensors)
        built += state_buffers(len(built), recurrent, states, tp_size, layers)
    scales = sorted(
        (t for t in tensors if t[1] in ("k_scale_buffer", "v_scale_buffer")),
        key=lambda t: (t[0], t[1]),
    )
    for layer, what, array in scales:
        kind = BufferKind.TARGET_K if what == "k_scale_buffer" else BufferKind.TARGET_V
        token_plane(kind, array, heads_of.get(layer, num_kv_heads), layer, windows.get(layer))
    for layer, _, (array, pages_of, token_bytes) in sorted(
        (t for t in tensors if t[1] == "indexer"), key=lambda t: t[0]
    ):
        built += indexer_buffers(len(built), array, pages_of, token_bytes, tp_size, layer)
    index = sorted((t for t in tensors if t[1] in ("index_kv", "index_k")), key=lambda t: t[0])
    for layer, _, planes in index:
        # One index head a rank, as SGLang allocates it (head_num=1).
        for kind, plane in zip((BufferKind.TARGET_K, BufferKind.TARGET_V), planes):
            token_plane(kind, plane, shape_of(plane, "an index cache")[1] * tp_size, layer)
    return CacheBuffers.of(built)


def _page_size(pool: Any) -> int:
    """The pool's page size (a wrapper's, or its full sub-pool's)."""
    for candidate in (pool, getattr(pool, "full_kv_pool", None)):
        if candidate is not None and getattr(candidate, "page_size", None) is not None:
            return int(candidate.page_size)
    return 1


def conventions(pool: Any) -> RuntimeConventions:
    """SGLang's rules for its planner: every decode rank reads its own heads
    (``decode_replicas="all"``: its transfer slices heads for each decode rank), and pages
    are the pool's ``page_size`` slots, the scheduler's own (``req_to_token`` rows are slot
    maps, ``slot // page_size`` page ids).

    :param pool: The rank's ``token_to_kv_pool`` (or a wrapper of it).
    """
    page_size = _page_size(pool)
    return RuntimeConventions("sglang", "all", page_size, page_size)


def swa_slots(pool: Any, slots: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The slot map of an ``SWAKVPool``'s sliding-window layers for a request whose slot map in
    the full pool is ``slots`` (its ``req_to_token`` row): ``full_to_swa_index_mapping`` of
    each slot, -1 where the token holds no SWA slot (SGLang maps it to 0, its padding slot,
    once the token has left the window). Give it, with ``swa_buffers``, to
    ``PreparedTransfer.token_descriptors`` for the SWA layers' buffers.

    :param pool: The rank's ``SWAKVPool``.
    :param slots: The request's slots in the full pool (-1: a token not held).
    """
    import numpy as np

    mapping = np.asarray(attribute(pool, "full_to_swa_index_mapping", "SWAKVPool"))
    full = int_ids(slots, "slots")
    if full.size and (full.max() >= mapping.shape[0] - 1 or full.min() < -1):
        raise UnsupportedPDLayoutError(
            f"slots must be -1 or below the full pool's {mapping.shape[0] - 1} slots"
        )
    swa = np.where(full >= 0, mapping[np.maximum(full, 0)], -1).astype(np.int64)
    swa[swa == 0] = -1
    return swa


def swa_buffers(pool: Any, cache: CacheBuffers) -> tuple[int, ...]:
    """The buffers of ``cache`` (``buffers(pool, ...)``) that an ``SWAKVPool`` keeps in its
    sliding-window sub-pool, by ``layers_mapping``: their tokens move by ``swa_slots``.

    :param pool: The rank's ``SWAKVPool``.
    :param cache: What ``buffers`` read of it.
    """
    mapping = attribute(pool, "layers_mapping", "SWAKVPool")
    sliding = {int(layer) for layer, (_, is_swa) in mapping.items() if is_swa}
    return tuple(b.buffer_index for b in cache.buffers if b.layer in sliding)
