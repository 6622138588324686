"""vLLM's KV cache tensors as pdplan buffers.

``kv_caches`` is what vLLM's model runner allocates per layer, in layer order (a list, or the
``{layer_name: tensor}`` dict): an attention layer's tensor in its backend's logical shape,
whose strides say how memory is ordered (an ``HND`` cache keeps the logical shape and permutes
its strides), and a recurrent layer's list of state tensors. vLLM's ``slot_mapping``
(``block * block_size + offset``) rows are pdplan slot maps as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pdplan._arrays import CacheBuffers, StateSpec, buffer_from_array
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout
from pdplan.runtimes._states import shape_of, state_buffers

__all__ = ["BACKENDS", "buffers"]

#: The logical shape of each backend's per-layer KV tensor, by vLLM's backend names.
BACKENDS: Mapping[str, str] = {
    "FLASH_ATTN": "(2, num_blocks, block_size, num_kv_heads, head_size)",
    "FLASHINFER": "(num_blocks, 2, block_size, num_kv_heads, head_size)",
    "FLASHMLA": "(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
    "TRITON_MLA": "(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)",
}

_MLA = ("FLASHMLA", "TRITON_MLA")
_KV_AXES = ("page", "token", "head", "dim")


def _layers(kv_caches: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    if isinstance(kv_caches, Mapping):
        return list(kv_caches.values())
    return list(kv_caches)


def _is_state(entry: Any) -> bool:
    return isinstance(entry, (list, tuple))


def _planes(tensor: Any, backend: str, position: int) -> tuple[Any, Any]:
    """K and V of one layer's tensor: two views, nothing copied."""
    shape = shape_of(tensor, f"layer {position}'s KV tensor")
    split = backend == "FLASH_ATTN"
    axis = 0 if split else 1
    if len(shape) != 5 or shape[axis] != 2:
        raise UnsupportedPDLayoutError(
            f"layer {position}: a {backend} KV tensor has the logical shape {BACKENDS[backend]}, "
            f"got {shape}"
        )
    return (tensor[0], tensor[1]) if split else (tensor[:, 0], tensor[:, 1])


def _check_layout(buffer: BufferLayout, kv_layout: str, position: int) -> None:
    head_major = buffer.rows_per_page == 1
    # One head a rank is the same bytes either way.
    one_head = (buffer.page_bytes or buffer.item_stride_bytes) == buffer.bytes_per_logical_unit
    if buffer.page_size > 1 and not one_head and head_major != (kv_layout == "HND"):
        found = "HND (head-major)" if head_major else "NHD (token-major)"
        raise UnsupportedPDLayoutError(
            f"layer {position}: kv_layout={kv_layout!r}, but the tensor's strides are {found}; "
            "pass the layout the backend was built with"
        )


def buffers(
    kv_caches: Sequence[Any] | Mapping[str, Any],
    *,
    backend: str,
    kv_layout: Literal["NHD", "HND"] = "NHD",
    tp_size: int,
    num_kv_heads: int | None = None,
    states: Sequence[StateSpec] | None = None,
    sliding_windows: Mapping[int, int] | None = None,
) -> CacheBuffers:
    """The buffers of one vLLM rank's KV cache.

    Buffers: K and V of the ``k``-th attention layer are ``2k`` and ``2k + 1`` (MLA: ``k``),
    states after them (``CacheBuffers``).

    :param kv_caches: What vLLM's model runner allocates per layer, in layer order (a list,
        or the ``{layer_name: tensor}`` dict): an attention layer's tensor, a recurrent
        layer's list of state tensors.
    :param backend: vLLM's attention backend name (``BACKENDS``).
    :param kv_layout: The layout the backend was built with, checked against the strides.
    :param tp_size: The rank's TP size.
    :param num_kv_heads: The model's KV heads (not the rank's), required except for MLA.
    :param states: Describes each state tensor of a recurrent layer
        (``pdplan.runtimes.state_specs(layer)``).
    :param sliding_windows: The window of the ``k``-th attention layer, by ``k``, where it has
        one.
    """
    if backend not in BACKENDS:
        raise UnsupportedPDLayoutError(
            f"backend={backend!r} is not one pdplan reads; known: {', '.join(BACKENDS)}"
        )
    if kv_layout not in ("NHD", "HND"):
        raise UnsupportedPDLayoutError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    layers = _layers(kv_caches)
    attention = [entry for entry in layers if not _is_state(entry)]
    windows = dict(sliding_windows or {})
    built: list[tuple[BufferLayout, int, int]] = []
    for position, tensor in enumerate(attention):
        window = windows.get(position)
        if backend in _MLA:
            built.append(
                buffer_from_array(
                    position,
                    BufferKind.TARGET_K,
                    tensor,
                    ("page", "token", "dim"),
                    tp_size=tp_size,
                    sliding_window=window,
                )
            )
            continue
        if num_kv_heads is None:
            raise UnsupportedPDLayoutError(
                "num_kv_heads= is needed: the model's KV heads across all TP ranks"
            )
        for plane, (kind, view) in enumerate(
            zip((BufferKind.TARGET_K, BufferKind.TARGET_V), _planes(tensor, backend, position))
        ):
            entry = buffer_from_array(
                2 * position + plane,
                kind,
                view,
                _KV_AXES,
                logical_size=num_kv_heads,
                tp_size=tp_size,
                sliding_window=window,
            )
            _check_layout(entry[0], kv_layout, position)
            built.append(entry)
    recurrent = [entry for entry in layers if _is_state(entry)]
    built += state_buffers(len(built), recurrent, states, tp_size)
    return CacheBuffers.of(built)
