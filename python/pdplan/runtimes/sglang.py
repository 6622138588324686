"""SGLang's memory pools as pdplan buffers.

Read from the pools' own attributes: ``MHATokenToKVPool`` (``k_buffer[layer]``,
``v_buffer[layer]`` of ``(size + page_size, head_num, head_dim)``), ``MLATokenToKVPool``
(``kv_buffer[layer]`` of ``(size + page_size, 1, kv_lora_rank + qk_rope_head_dim)``), both
token-major flat pools whose page is ``page_size`` consecutive slots, and ``MambaPool``
(``mamba_cache.conv`` and ``mamba_cache.temporal``, ``(layers, slots, ...)``). Rows of
SGLang's ``req_to_token`` are pdplan slot maps as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdplan._arrays import CacheBuffers, StateSpec, buffer_from_array
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout
from pdplan.runtimes._states import attribute, shape_of, state_buffers

__all__ = ["buffers"]


def _kv_buffers(
    pool: Any, tp_size: int, num_kv_heads: int | None, windows: dict[int, int]
) -> list[tuple[BufferLayout, int, int]]:
    built: list[tuple[BufferLayout, int, int]] = []
    if hasattr(pool, "k_buffer") and hasattr(pool, "v_buffer"):
        page_size = int(attribute(pool, "page_size", "the KV pool"))
        heads = num_kv_heads
        if heads is None:
            heads = int(attribute(pool, "head_num", "the KV pool")) * tp_size
        keys, values = list(pool.k_buffer), list(pool.v_buffer)
        if len(keys) != len(values):
            raise UnsupportedPDLayoutError(
                f"the KV pool holds {len(keys)} K buffers but {len(values)} V buffers"
            )
        for position, (k, v) in enumerate(zip(keys, values)):
            for plane, (kind, array) in enumerate(
                ((BufferKind.TARGET_K, k), (BufferKind.TARGET_V, v))
            ):
                built.append(
                    buffer_from_array(
                        2 * position + plane,
                        kind,
                        array,
                        ("slot", "head", "dim"),
                        logical_size=heads,
                        tp_size=tp_size,
                        page_size=page_size,
                        sliding_window=windows.get(position),
                    )
                )
        return built
    if hasattr(pool, "kv_buffer"):
        page_size = int(attribute(pool, "page_size", "the MLA pool"))
        for position, array in enumerate(pool.kv_buffer):
            built.append(
                buffer_from_array(
                    position,
                    BufferKind.TARGET_K,
                    array,
                    ("slot", "dim", "dim"),
                    tp_size=tp_size,
                    page_size=page_size,
                    sliding_window=windows.get(position),
                )
            )
        return built
    raise UnsupportedPDLayoutError(
        f"{type(pool).__name__} is not a pool pdplan reads: expected k_buffer and v_buffer "
        "(MHATokenToKVPool), kv_buffer (MLATokenToKVPool) or mamba_cache (MambaPool)"
    )


def _state_layers(mamba_pool: Any) -> list[list[Any]]:
    """Each recurrent layer's state tensors, conv first: views of the pool's tensors."""
    cache = attribute(mamba_pool, "mamba_cache", "the Mamba pool")
    conv = attribute(cache, "conv", "the Mamba pool's mamba_cache")
    conv = conv if isinstance(conv, (list, tuple)) else [conv]
    tensors = [*conv, attribute(cache, "temporal", "the Mamba pool's mamba_cache")]
    layers = {(shape_of(t, "a Mamba pool state tensor") or (0,))[0] for t in tensors}
    if len(layers) != 1:
        raise UnsupportedPDLayoutError(
            f"the MambaPool's state tensors hold different layer counts {sorted(layers)}"
        )
    return [[t[layer] for t in tensors] for layer in range(layers.pop())]


def buffers(
    pool: Any,
    *,
    tp_size: int,
    num_kv_heads: int | None = None,
    mamba_pool: Any = None,
    states: Sequence[StateSpec] | None = None,
    sliding_windows: dict[int, int] | None = None,
) -> CacheBuffers:
    """The buffers of one SGLang rank's pool: a KV pool (MHA or MLA), a ``MambaPool``, or a KV
    pool with its ``mamba_pool`` (hybrid models). Buffers are numbered as on every runtime
    (``CacheBuffers``).

    :param pool: The rank's ``MHATokenToKVPool``, ``MLATokenToKVPool`` or ``MambaPool``.
    :param tp_size: The rank's TP size.
    :param num_kv_heads: The model's KV heads when they are fewer than ``tp_size`` (SGLang then
        keeps one replicated head a rank); None: ``head_num * tp_size``.
    :param mamba_pool: A hybrid model's ``MambaPool``, beside its KV ``pool``.
    :param states: Describes each state tensor of a recurrent layer
        (``pdplan.runtimes.state_specs(layer)``).
    :param sliding_windows: The window of the ``k``-th layer of the KV pool, by ``k``, where it
        has one.
    """
    windows = dict(sliding_windows or {})
    built: list[tuple[BufferLayout, int, int]] = []
    if hasattr(pool, "mamba_cache") and mamba_pool is None:
        mamba_pool = pool
    else:
        built = _kv_buffers(pool, tp_size, num_kv_heads, windows)
    if mamba_pool is not None:
        built += state_buffers(len(built), _state_layers(mamba_pool), states, tp_size)
    return CacheBuffers.of(built)
