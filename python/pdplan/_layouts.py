"""Buffer layouts from a model's shape, a Hugging Face ``config.json``, a preset, or the byte
lengths a runtime knows. The derivation runs in Rust (src/model/)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout

__all__ = [
    "CACHE_KEYS",
    "MODEL_PRESETS",
    "AttentionLayer",
    "AttentionMamba2Layer",
    "GatedDeltaNetLayer",
    "ItemLengths",
    "KdaLayer",
    "LayerKindSummary",
    "LightningAttentionLayer",
    "Mamba1Layer",
    "Mamba2Layer",
    "MlaLayer",
    "MlpLayer",
    "ModelFamily",
    "ModelLayer",
    "ModelShape",
    "SharedKvLayer",
    "ShortConvLayer",
    "buffer_layouts_from_item_lengths",
    "even_layer_partition",
    "model_buffer_layouts",
    "model_families",
    "vllm_layer_partition",
]

MODEL_PRESETS: tuple[str, ...] = tuple(_core.MODEL_PRESETS)

#: Every ``config.json`` key that changes what a layer caches. A config holding one that its
#: family's reader does not consume is refused, naming the key.
CACHE_KEYS: tuple[str, ...] = tuple(_core.CACHE_KEYS)


@dataclass(frozen=True)
class ModelFamily:
    """One family in the registry: the architectures and model types whose configs its reader
    reads, the cache keys (of ``CACHE_KEYS``) it consumes, and the modeling code its rule
    follows."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    keys: tuple[str, ...]
    source: str


def model_families() -> tuple[ModelFamily, ...]:
    """The registry of model families. A config is read by the family its ``architectures``
    names (then its ``model_type``), or refused; ``ModelShape.from_hf_config(..., family=)``
    chooses one."""
    return tuple(
        ModelFamily(name, tuple(archs), tuple(types), tuple(keys), source)
        for name, archs, types, keys, source in _core.model_families()
    )


@dataclass(frozen=True)
class AttentionLayer:
    """Attention with a paged KV cache: K and V of ``kv_heads`` x ``head_dim`` a token (GQA
    replica groups where TP exceeds the heads); a sliding-window layer keeps ``sliding_window``
    tokens, a chunked local-attention layer (Llama 4) its current ``attention_chunk_size``
    chunk. ``v_head_dim``: V's head dim where it differs from K's (MiMo-V2)."""

    kind: ClassVar[str] = "attention"
    kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    v_head_dim: int | None = None
    attention_chunk_size: int | None = None


@dataclass(frozen=True)
class MlaLayer:
    """Multi-head latent attention: one replicated latent of ``kv_lora_rank + rope_head_dim``
    values a token; with ``index_head_dim`` also the indexer's key cache (DeepSeek-V3.2)."""

    kind: ClassVar[str] = "mla"
    kv_lora_rank: int
    rope_head_dim: int = 0
    index_head_dim: int = 0


@dataclass(frozen=True)
class Mamba2Layer:
    """Mamba2: SSM state ``[heads, head_dim, state_size]`` (sharded by heads) and the conv
    state over ``x | B | C`` (``heads * head_dim``, ``groups * state_size`` twice)."""

    kind: ClassVar[str] = "mamba2"
    heads: int
    head_dim: int
    state_size: int
    groups: int = 1
    conv_kernel: int = 4


@dataclass(frozen=True)
class Mamba1Layer:
    """Mamba (Jamba's): SSM state ``[inner_size, state_size]`` and the conv state
    ``[inner_size, conv_kernel - 1]``, both sharded over ``inner_size``."""

    kind: ClassVar[str] = "mamba1"
    inner_size: int
    state_size: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class GatedDeltaNetLayer:
    """Gated DeltaNet linear attention (Qwen3-Next): recurrent state ``[value_heads,
    key_head_dim, value_head_dim]`` (sharded by value heads) and the conv state over
    ``q | k | v``."""

    kind: ClassVar[str] = "gated_deltanet"
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class KdaLayer:
    """Kimi Delta Attention (Kimi-Linear): recurrent state ``[heads, head_dim, head_dim]``
    (sharded by heads), then the conv states of q, k and v (``heads * head_dim`` channels
    each)."""

    kind: ClassVar[str] = "kda"
    heads: int
    head_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class LightningAttentionLayer:
    """MiniMax's lightning (linear) attention: state ``[heads, head_dim, head_dim]``, sharded
    by heads."""

    kind: ClassVar[str] = "lightning"
    heads: int
    head_dim: int


@dataclass(frozen=True)
class ShortConvLayer:
    """A short convolution (LFM2): conv state ``[channels, conv_kernel - 1]``, sharded by
    channels."""

    kind: ClassVar[str] = "short_conv"
    channels: int
    conv_kernel: int


@dataclass(frozen=True)
class SharedKvLayer:
    """Attention that reads layer ``source_layer``'s KV and keeps none of its own (Gemma 3n
    and 4's last ``num_kv_shared_layers``)."""

    kind: ClassVar[str] = "shared_kv"
    source_layer: int


@dataclass(frozen=True)
class AttentionMamba2Layer:
    """Attention and Mamba2 side by side in one layer (Falcon-H1; Zamba2's hybrid layers)."""

    kind: ClassVar[str] = "attention_mamba2"
    attention: AttentionLayer
    mamba: Mamba2Layer


@dataclass(frozen=True)
class MlpLayer:
    """A layer without a cache (MLP or MoE); it still counts for pipeline stages."""

    kind: ClassVar[str] = "mlp"


ModelLayer = (
    AttentionLayer
    | MlaLayer
    | Mamba2Layer
    | Mamba1Layer
    | GatedDeltaNetLayer
    | KdaLayer
    | LightningAttentionLayer
    | ShortConvLayer
    | AttentionMamba2Layer
    | SharedKvLayer
    | MlpLayer
)


@dataclass(frozen=True)
class ModelShape:
    """What decides a model's cache buffers: its layers in order, dtypes and page size.

    Configs and presets give ``layer_kinds``, one layer object per model layer. The flat
    fields are a shorthand for a uniform stack: ``layers`` attention layers of ``kv_heads`` x
    ``head_dim`` (MLA when ``mla_kv_lora_rank`` is set); give one form or the other.
    ``model_layers`` is the list either way.

    ``kv_cache_dtype`` (default: ``dtype``) is the KV cache's element type: a float8 variant,
    or ``"nvfp4"`` (4-bit values; one fp8 scale per 16 values, kept as their own K and V scale
    buffers). ``state_dtype`` (default: ``dtype``) is the SSM and recurrent states' (vLLM's
    ``mamba_ssm_cache_dtype``, often float32); conv states keep ``dtype``. ``draft_layers`` of
    draft K and V follow the model's buffers, on its last layer.
    """

    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "bfloat16"
    page_size: int = 16
    mla_kv_lora_rank: int = 0
    mla_rope_head_dim: int = 0
    draft_layers: int = 0
    draft_kv_heads: int = 0
    draft_head_dim: int = 0
    kv_cache_dtype: str | None = None
    state_dtype: str | None = None
    layer_kinds: tuple[ModelLayer, ...] = ()
    family: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layer_kinds, list):
            object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))

    @classmethod
    def preset(cls, name: str, page_size: int = 16) -> ModelShape:
        """A named model (see ``MODEL_PRESETS``), read from its published ``config.json``
        values by its family's reader."""
        return cls._from_parts(_core.model_shape_parts(preset=name, page_size=page_size), page_size)

    @classmethod
    def from_hf_config(
        cls, path: str | Path, page_size: int = 16, *, family: str | None = None
    ) -> ModelShape:
        """The model a local Hugging Face ``config.json`` describes, layer by layer, read by
        the reader of its family: the one its ``architectures`` (then ``model_type``) names, or
        ``family`` (a name from ``model_families()``) when given. A config of an architecture no
        family covers is refused, naming it and the families; so is a config holding a
        cache-shaping key (``CACHE_KEYS``) its family's reader does not consume.

        The dtype is the one the config names (``dtype`` or ``torch_dtype``), bfloat16 when it
        names none; the KV cache dtype the config's ``kv_cache_dtype`` where it names one; the
        state dtype the config's ``mamba_ssm_cache_dtype`` or ``mamba_ssm_dtype`` where its
        family keeps state. Pass ``kv_cache_dtype``/
        ``state_dtype`` with ``dataclasses.replace``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UnsupportedPDLayoutError(f"cannot read {path}: {exc}") from None
        parts = _core.model_shape_parts(config_text=text, page_size=page_size, family=family)
        return cls._from_parts(parts, page_size)

    @classmethod
    def _from_parts(
        cls,
        parts: tuple[
            str,
            tuple[ModelLayer, ...],
            tuple[int, int, int],
            tuple[str | None, str | None],
            str | None,
        ],
        page_size: int,
    ) -> ModelShape:
        dtype, layers, draft, (kv, state), family = parts
        draft_layers, draft_kv_heads, draft_head_dim = draft
        return cls(
            dtype=dtype,
            page_size=page_size,
            layer_kinds=layers,
            draft_layers=draft_layers,
            draft_kv_heads=draft_kv_heads,
            draft_head_dim=draft_head_dim,
            kv_cache_dtype=kv,
            state_dtype=state,
            family=family,
        )

    @property
    def model_layers(self) -> tuple[ModelLayer, ...]:
        """Every model layer in order (the uniform shorthand expanded)."""
        return self.layer_kinds or _core.model_layers(self)

    @property
    def num_layers(self) -> int:
        """Model layers, MLP-only ones included: what pipeline stages split."""
        return len(self.model_layers)

    def summary(self) -> tuple[LayerKindSummary, ...]:
        """The model per layer kind, in order of first appearance (then its draft model)."""
        return tuple(
            LayerKindSummary(label, tuple(layers), token, state, window, chunk)
            for label, layers, token, state, window, chunk in _core.model_summary(self)
        )

    def to_dict(self) -> dict[str, object]:
        """The fields as JSON values, each layer with its ``kind``."""
        layers = [{"kind": layer.kind, **asdict(layer)} for layer in self.layer_kinds]
        return {**asdict(self), "layer_kinds": layers}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass(frozen=True)
class LayerKindSummary:
    """One kind of layer in a model: where it is and what one such layer keeps."""

    label: str
    layers: tuple[int, ...]
    #: Bytes one token takes in one such layer, over all TP ranks.
    token_bytes: int
    #: Bytes of state one request keeps in one such layer, over all TP ranks.
    state_bytes: int
    sliding_window: int | None
    attention_chunk_size: int | None = None

    def kept_tokens(self, tokens: int) -> int:
        """Tokens of a ``tokens``-token request one such layer keeps: the window, the current
        chunk, or all."""
        first = _core.first_kept_token(tokens, self.sliding_window, self.attention_chunk_size)
        return tokens - first

    def where(self) -> str:
        """The layers as ranges: ``3, 7-9, 12``."""
        spans: list[list[int]] = []
        for layer in self.layers:
            if spans and spans[-1][1] + 1 == layer:
                spans[-1][1] = layer
            else:
                spans.append([layer, layer])
        return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


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
    *,
    prefill_cp: int = 1,
    decode_cp: int = 1,
    prefill_dcp: int = 1,
    decode_dcp: int = 1,
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]:
    """The matching prefill and decode ``BufferLayout`` tuples of a model at two TP sizes.

    ``kv_layout`` is how KV pages store tokens: ``"HND"`` (``[heads][page_size][head_dim]``,
    head-major, one row a page) or ``"NHD"`` (``[page_size][heads][head_dim]``, a row per token,
    as SGLang and vLLM keep them). Buffers follow the model's layers in order, each naming its
    layer (``BufferLayout.layer``); draft-model buffers sit on the last layer (the last stage).
    Pipeline stages split ``shape.num_layers`` layers: when the model's last layers keep no
    cache (an MLP layer ends Nemotron-H), give the layouts a ``pp_layer_partition`` of that
    many layers (``vllm_layer_partition(shape.num_layers, pp)`` for vLLM's).

    With context parallelism (``*_cp`` CP ranks of their own, ``*_dcp`` DCP ranks inside TP, as
    in ``ParallelLayout``) the buffers are the same (each CP rank is a TP group of its own),
    but a side with CP cannot hold state layers (refused, naming the layer) and its DCP size
    must divide every attention layer's KV-head replica group."""
    return _core.model_buffers(
        shape,
        prefill_tp,
        decode_tp,
        kv_layout,
        prefill_pp,
        decode_pp,
        prefill_cp,
        prefill_dcp,
        decode_cp,
        decode_dcp,
    )


def buffer_layouts_from_item_lengths(
    items: Sequence[ItemLengths], prefill_tp: int, decode_tp: int
) -> tuple[tuple[BufferLayout, ...], tuple[BufferLayout, ...]]:
    """Both sides' layouts inferred from byte lengths: equal global units -> sharded; equal
    items -> replicated; more units on one side -> that side's TP runs above the logical size,
    in replica groups (pass ``logical_size`` when both sides do). Anything else is refused
    with the reason."""
    return _core.buffers_from_item_lengths(items, prefill_tp, decode_tp)


def even_layer_partition(layers: int, pp_size: int) -> tuple[int, ...]:
    """pdplan's default split of ``layers`` over ``pp_size`` stages (``pp_layer_partition``
    left None): as even as possible, the first stages taking one more (5 over 2: ``(3, 2)``).
    Give it the model's ``num_layers`` to split layers that keep no cache too."""
    return tuple(_core.even_layer_partition(layers, pp_size))


def vllm_layer_partition(layers: int, pp_size: int) -> tuple[int, ...]:
    """vLLM's default split of ``layers`` over ``pp_size`` stages (``VLLM_PP_LAYER_PARTITION``
    unset): as even as possible, the extra layers going to the stages just before the last.
    pdplan's own default gives them to the first stages; pass this as ``pp_layer_partition``
    to match a vLLM deployment."""
    return tuple(_core.vllm_layer_partition(layers, pp_size))
