"""Buffer layouts from a model's shape, a Hugging Face ``config.json``, a preset, or the byte
lengths a runtime knows. The derivation runs in Rust (src/model/)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout

__all__ = [
    "MODEL_PRESETS",
    "ItemLengths",
    "ModelShape",
    "buffer_layouts_from_item_lengths",
    "model_buffer_layouts",
    "vllm_layer_partition",
]

MODEL_PRESETS: tuple[str, ...] = tuple(_core.MODEL_PRESETS)


@dataclass(frozen=True)
class ModelShape:
    """What decides a model's cache buffers. Zero leaves an optional part out.

    Buffers, in order: per layer its K and V (``kv_head``, GQA replica groups where TP exceeds
    ``kv_heads``), or one replicated MLA latent buffer when ``mla_kv_lora_rank`` is set; then
    per Mamba layer its SSM state (``state_channel``: ``mamba_channels`` of
    ``mamba_bytes_per_channel`` bytes) and, when ``mamba_conv_x_channels`` is set, its conv
    state (channels ``x | B | C`` = ``mamba_conv_x_channels``, ``mamba_conv_bc_channels`` twice,
    each part sharded by TP on its own, ``mamba_conv_width`` inputs a channel); then
    ``draft_layers`` of draft K and V.
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    page_size: int = 16
    mla_kv_lora_rank: int = 0
    mla_rope_head_dim: int = 0
    mamba_layers: int = 0
    mamba_channels: int = 0
    mamba_bytes_per_channel: int = 0
    mamba_conv_x_channels: int = 0
    mamba_conv_bc_channels: int = 0
    mamba_conv_width: int = 0
    draft_layers: int = 0
    draft_kv_heads: int = 0
    draft_head_dim: int = 0

    @classmethod
    def preset(cls, name: str, page_size: int = 16) -> ModelShape:
        """A named shape (see ``MODEL_PRESETS``)."""
        return cls._from_fields(_core.model_shape_fields(preset=name, page_size=page_size))

    @classmethod
    def from_hf_config(cls, path: str | Path, page_size: int = 16) -> ModelShape:
        """Layers, KV heads, head dim, dtype and MLA ranks from a local ``config.json``.

        The dtype is the one the config names (``dtype`` or ``torch_dtype``: bfloat16, float16,
        float32, the float8 variants, int8), bfloat16 when it names none; an unknown one is
        refused."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UnsupportedPDLayoutError(f"cannot read {path}: {exc}") from None
        return cls._from_fields(_core.model_shape_fields(config_text=text, page_size=page_size))

    @classmethod
    def _from_fields(cls, fields: tuple[str, list[tuple[str, int]]]) -> ModelShape:
        dtype, pairs = fields
        return cls(dtype=dtype, **dict(pairs))

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class ItemLengths:
    """One buffer as a runtime knows it: per-rank item bytes on each side, unit bytes."""

    buffer_index: int
    buffer_kind: BufferKind
    prefill_item_bytes: int
    decode_item_bytes: int
    unit_bytes: int
    page_size: int = 16
    logical_size: int | None = None
    #: Rows a page on both sides (``page_size`` for token-major pages).
    rows_per_page: int = 1


def model_buffer_layouts(
    shape: ModelShape,
    prefill_tp: int,
    decode_tp: int,
    kv_layout: Literal["HND", "NHD"] = "HND",
    prefill_pp: int = 1,
    decode_pp: int = 1,
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]:
    """The matching prefill and decode ``BufferLayout`` tuples of a model at two TP sizes.

    ``kv_layout`` is how KV pages store tokens: ``"HND"`` (``[heads][page_size][head_dim]``,
    head-major, one row a page) or ``"NHD"`` (``[page_size][heads][head_dim]``, a row per token,
    as SGLang and vLLM keep them). With pipeline stages on either side (``prefill_pp`` or
    ``decode_pp`` above 1) every buffer names its layer: attention layer ``i`` is layer ``i``,
    Mamba layers follow the attention layers, and draft-model buffers sit on the last layer
    (the last stage)."""
    return _core.model_buffers(shape, prefill_tp, decode_tp, kv_layout, prefill_pp, decode_pp)


def buffer_layouts_from_item_lengths(
    items: Sequence[ItemLengths], prefill_tp: int, decode_tp: int
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]:
    """Both sides' layouts inferred from byte lengths: equal global units -> sharded; equal
    items -> replicated; more units on one side -> that side's TP runs above the logical size,
    in replica groups (pass ``logical_size`` when both sides do). Anything else is refused
    with the reason."""
    return _core.buffers_from_item_lengths(items, prefill_tp, decode_tp)


def vllm_layer_partition(layers: int, pp_size: int) -> tuple[int, ...]:
    """vLLM's default split of ``layers`` over ``pp_size`` stages (``VLLM_PP_LAYER_PARTITION``
    unset): as even as possible, the extra layers going to the stages just before the last.
    pdplan's own default gives them to the first stages; pass this as ``pp_layer_partition``
    to match a vLLM deployment."""
    return tuple(_core.vllm_layer_partition(layers, pp_size))
