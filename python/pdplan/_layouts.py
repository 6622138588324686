"""Buffer layouts from a model's shape, a Hugging Face ``config.json``, a preset, or the byte
lengths a runtime knows. The derivation runs in Rust (src/model/)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar, Literal

from pdplan import _core
from pdplan._bounded import shown
from pdplan._config_files import QUANT_CONFIG_NAME, config_file, named, read_config_text
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout

__all__ = [
    "CACHE_KEYS",
    "MODEL_PRESETS",
    "AttentionLayer",
    "AttentionMamba2Layer",
    "DeepseekV4Layer",
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

#: The names ``ModelShape.preset`` knows, each a model's published ``config.json``.
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
    """The family's name (``family=`` of ``ModelShape.from_hf_config``)."""
    architectures: tuple[str, ...]
    """The config ``architectures`` entries it reads."""
    model_types: tuple[str, ...]
    """The config ``model_type`` values it reads."""
    keys: tuple[str, ...]
    """The cache keys (of ``CACHE_KEYS``) its reader consumes."""
    source: str
    """The modeling code its rule follows."""
    ignored: tuple[tuple[str, str], ...] = ()
    """Cache keys its configs hold that its modeling code never reads, each with the source
    that shows it: accepted, never read."""
    presets: tuple[str, ...] = ()
    """The presets (``MODEL_PRESETS``) it reads."""


def model_families() -> tuple[ModelFamily, ...]:
    """The registry of model families. A config is read by the family its ``architectures``
    names (then its ``model_type``), or refused; ``ModelShape.from_hf_config(..., family=)``
    chooses one."""
    presets: dict[str, list[str]] = {}
    for preset in MODEL_PRESETS:
        family = _core.model_shape_parts(preset=preset)[4]
        presets.setdefault(family or "", []).append(preset)
    return tuple(
        ModelFamily(
            name,
            tuple(archs),
            tuple(types),
            tuple(keys),
            source,
            tuple((key, why) for key, why in ignored),
            tuple(presets.get(name, ())),
        )
        for name, archs, types, keys, source, ignored in _core.model_families()
    )


@dataclass(frozen=True)
class AttentionLayer:
    """Attention with a paged KV cache: K and V of ``kv_heads`` x ``head_dim`` a token (GQA
    replica groups where TP exceeds the heads); a sliding-window layer keeps ``sliding_window``
    tokens, a chunked local-attention layer (Llama 4) its current ``attention_chunk_size``
    chunk. ``v_head_dim``: V's head dim where it differs from K's (MiMo-V2). ``index_head_dim``:
    a sparse layer's index keys (MiniMax-M3)."""

    kind: ClassVar[str] = "attention"
    """The layer kind's name, ``"attention"``, as ``ModelShape.to_dict`` writes it."""
    kv_heads: int
    """KV heads, the model's (across all TP ranks)."""
    head_dim: int
    """K's head dim (and V's)."""
    sliding_window: int | None = None
    """Tokens a sliding-window layer keeps; None: every token."""
    v_head_dim: int | None = None
    """V's head dim where it differs from K's; None: ``head_dim``."""
    attention_chunk_size: int | None = None
    """A chunked local-attention layer's chunk (tokens); None: none."""
    index_head_dim: int = 0
    """A sparse layer's index key dim (MiniMax-M3; 0: none): one bfloat16 key a token, the
    same on every rank, beside K and V."""


@dataclass(frozen=True)
class MlaLayer:
    """Multi-head latent attention: one replicated latent of ``kv_lora_rank + rope_head_dim``
    values a token; with ``index_head_dim`` also the indexer's key cache (DeepSeek-V3.2)."""

    kind: ClassVar[str] = "mla"
    """The layer kind's name, ``"mla"``, as ``ModelShape.to_dict`` writes it."""
    kv_lora_rank: int
    """The latent's rank."""
    rope_head_dim: int = 0
    """The rope part's dim."""
    index_head_dim: int = 0
    """The indexer's key dim (0: none)."""


@dataclass(frozen=True)
class Mamba2Layer:
    """Mamba2: SSM state ``[heads, head_dim, state_size]`` (sharded by heads) and the conv
    state over ``x | B | C`` (``heads * head_dim``, ``groups * state_size`` twice)."""

    kind: ClassVar[str] = "mamba2"
    """The layer kind's name, ``"mamba2"``, as ``ModelShape.to_dict`` writes it."""
    heads: int
    """SSM heads."""
    head_dim: int
    """A head's dim."""
    state_size: int
    """The SSM state's size."""
    groups: int = 1
    """B and C groups."""
    conv_kernel: int = 4
    """The convolution's width."""


@dataclass(frozen=True)
class Mamba1Layer:
    """Mamba (Jamba's): SSM state ``[inner_size, state_size]`` and the conv state
    ``[inner_size, conv_kernel - 1]``, both sharded over ``inner_size``."""

    kind: ClassVar[str] = "mamba1"
    """The layer kind's name, ``"mamba1"``, as ``ModelShape.to_dict`` writes it."""
    inner_size: int
    """The mixer's channels."""
    state_size: int
    """The SSM state's size."""
    conv_kernel: int = 4
    """The convolution's width."""


@dataclass(frozen=True)
class GatedDeltaNetLayer:
    """Gated DeltaNet linear attention (Qwen3-Next): recurrent state ``[value_heads,
    key_head_dim, value_head_dim]`` (sharded by value heads) and the conv state over
    ``q | k | v``."""

    kind: ClassVar[str] = "gated_deltanet"
    """The layer kind's name, ``"gated_deltanet"``, as ``ModelShape.to_dict`` writes it."""
    key_heads: int
    """Key heads."""
    value_heads: int
    """Value heads."""
    key_head_dim: int
    """A key head's dim."""
    value_head_dim: int
    """A value head's dim."""
    conv_kernel: int = 4
    """The convolution's width."""


@dataclass(frozen=True)
class KdaLayer:
    """Kimi Delta Attention (Kimi-Linear): recurrent state ``[heads, head_dim, head_dim]``
    (sharded by heads), then the conv states of q, k and v (``heads * head_dim`` channels
    each)."""

    kind: ClassVar[str] = "kda"
    """The layer kind's name, ``"kda"``, as ``ModelShape.to_dict`` writes it."""
    heads: int
    """Heads; the state is sharded by them."""
    head_dim: int
    """A head's dim."""
    conv_kernel: int = 4
    """The convolution's width."""


@dataclass(frozen=True)
class LightningAttentionLayer:
    """MiniMax's lightning (linear) attention: state ``[heads, head_dim, head_dim]``, sharded
    by heads."""

    kind: ClassVar[str] = "lightning"
    """The layer kind's name, ``"lightning"``, as ``ModelShape.to_dict`` writes it."""
    heads: int
    """Heads; the state is sharded by them."""
    head_dim: int
    """A head's dim."""


@dataclass(frozen=True)
class ShortConvLayer:
    """A short convolution (LFM2): conv state ``[channels, conv_kernel - 1]``, sharded by
    channels."""

    kind: ClassVar[str] = "short_conv"
    """The layer kind's name, ``"short_conv"``, as ``ModelShape.to_dict`` writes it."""
    channels: int
    """Conv channels."""
    conv_kernel: int
    """The convolution's width."""


@dataclass(frozen=True)
class SharedKvLayer:
    """Attention that reads layer ``source_layer``'s KV and keeps none of its own (Gemma 3n
    and 4's last ``num_kv_shared_layers``)."""

    kind: ClassVar[str] = "shared_kv"
    """The layer kind's name, ``"shared_kv"``, as ``ModelShape.to_dict`` writes it."""
    source_layer: int
    """The layer whose KV it reads."""


@dataclass(frozen=True)
class AttentionMamba2Layer:
    """Attention and Mamba2 side by side in one layer (Falcon-H1; Zamba2's hybrid layers)."""

    kind: ClassVar[str] = "attention_mamba2"
    """The layer kind's name, ``"attention_mamba2"``, as ``ModelShape.to_dict`` writes it."""
    attention: AttentionLayer
    """The attention half."""
    mamba: Mamba2Layer
    """The Mamba2 half."""


@dataclass(frozen=True)
class DeepseekV4Layer:
    """DeepSeek-V4 attention, as vLLM allocates it: a sliding latent of ``head_dim`` (64-token
    pages); with ``compress_ratio`` 4 or 128 a compressed latent of one entry per that many
    tokens (256-token blocks, so ``256 // compress_ratio`` entries a page) and the
    compressor's state (a window of raw tokens); at 4 also the indexer's keys and its
    compressor's state. Every cache is replicated across TP; each cache's buffer counts its
    own items (a compressed cache's ``page_size`` is its entries a page)."""

    kind: ClassVar[str] = "deepseek_v4"
    """The layer kind's name, ``"deepseek_v4"``, as ``ModelShape.to_dict`` writes it."""
    head_dim: int
    """The latent's dim."""
    sliding_window: int
    """Tokens the sliding latent keeps."""
    rope_head_dim: int = 64
    """The latent's rope dims."""
    compress_ratio: int = 1
    """Tokens a compressed entry covers (1: none, 4, 128)."""
    index_head_dim: int = 0
    """The indexer's key dim (at ratio 4)."""


@dataclass(frozen=True)
class MlpLayer:
    """A layer without a cache (MLP or MoE); it still counts for pipeline stages."""

    kind: ClassVar[str] = "mlp"
    """The layer kind's name, ``"mlp"``, as ``ModelShape.to_dict`` writes it."""


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
    | DeepseekV4Layer
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
    """The uniform shorthand's layer count; 0 when the layers are ``layer_kinds`` (use
    ``num_layers`` for the count either way)."""
    kv_heads: int = 0
    """The uniform shorthand: each layer's KV heads."""
    head_dim: int = 0
    """The uniform shorthand: each KV head's dim."""
    dtype: str = "bfloat16"
    """The model's dtype (``"bfloat16"``, ``"float16"``, ``"float32"``, a float8 variant):
    the KV cache's and the states' unless ``kv_cache_dtype`` or ``state_dtype`` says
    otherwise; conv states always keep it."""
    page_size: int = 16
    """Tokens a KV cache page holds."""
    mla_kv_lora_rank: int = 0
    """The uniform shorthand: MLA layers of this latent rank instead of attention (0:
    attention)."""
    mla_rope_head_dim: int = 0
    """The uniform shorthand: the MLA layers' rope part's dim."""
    draft_layers: int = 0
    """Layers of the draft model (speculative decoding) whose K and V follow the model's
    buffers, on its last layer; 0: no draft."""
    draft_kv_heads: int = 0
    """The draft model's KV heads."""
    draft_head_dim: int = 0
    """The draft model's head dim."""
    kv_cache_dtype: str | None = None
    """The KV cache's element type; None: ``dtype``."""
    state_dtype: str | None = None
    """The SSM and recurrent states' element type; None: ``dtype``."""
    layer_kinds: tuple[ModelLayer, ...] = ()
    """The model's layers in order, one layer object each; empty with the uniform shorthand."""
    family: str | None = None
    """The family whose reader read the shape from a config or preset (``model_families``);
    None: given by hand."""

    def __post_init__(self) -> None:
        if isinstance(self.layer_kinds, list):
            object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))

    @classmethod
    def preset(cls, name: str, page_size: int = 16) -> ModelShape:
        """A named model (see ``MODEL_PRESETS``), read from its published ``config.json``
        values by its family's reader.

        :param name: One of ``MODEL_PRESETS``.
        :param page_size: Tokens a KV cache page holds.
        """
        return cls._from_parts(_core.model_shape_parts(preset=name, page_size=page_size))

    @classmethod
    def from_hf_config(
        cls,
        path: str | os.PathLike[str],
        page_size: int | None = None,
        *,
        family: str | None = None,
    ) -> ModelShape:
        """The model a local Hugging Face ``config.json`` (or a model's folder) describes,
        layer by layer, read by the reader of its family. A config of an architecture no
        family covers is refused, naming it and the families; so is a config holding a
        cache-shaping key (``CACHE_KEYS``) its family's reader does not consume.

        The dtype is the one the config names (``dtype`` or ``torch_dtype``), bfloat16 when it
        names none; the KV cache dtype the config's ``kv_cache_dtype`` where it names one, else
        the one a quantized export implies as vLLM resolves ``kv_cache_dtype="auto"`` (ModelOpt's
        ``kv_cache_quant_algo``/``kv_cache_scheme`` in ``quantization_config`` or in an
        ``hf_quant_config.json`` beside the config, compressed-tensors' ``kv_cache_scheme``);
        the
        state dtype the config's ``mamba_ssm_cache_dtype`` or ``mamba_ssm_dtype`` where its
        family keeps state. Pass ``kv_cache_dtype``/``state_dtype`` with
        ``dataclasses.replace``.

        :param path: The ``config.json`` file, or the model's folder holding it. Refusals name
            it as given; it is read to at most ``pdplan.limits.MAX_CONFIG_BYTES``.
        :param page_size: Tokens a KV cache page holds; None: 16, or the size the runtime
            fixes for the family whatever is asked (DeepSeek-V4: 256, as vLLM pages it).
        :param family: The family to read it with (a name from ``model_families()``); None:
            the one its ``architectures`` (then ``model_type``) names.
        """
        file = config_file(path)
        shown = os.fspath(path) if file == Path(path) else str(file)
        text = read_config_text(file, shown)
        quant_text = None
        beside = file.parent / QUANT_CONFIG_NAME
        if beside.is_file():
            quant_text = read_config_text(beside, str(beside))
        try:
            parts = _core.model_shape_parts(
                config_text=text, page_size=page_size, family=family, quant_config_text=quant_text
            )
        except UnsupportedPDLayoutError as error:
            raise named(error, shown) from None
        return cls._from_parts(parts)

    @classmethod
    def _from_parts(
        cls,
        parts: tuple[
            str,
            tuple[ModelLayer, ...],
            tuple[int, int, int],
            tuple[str | None, str | None],
            str | None,
            int,
        ],
    ) -> ModelShape:
        dtype, layers, draft, (kv, state), family, page_size = parts
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
            LayerKindSummary(label, tuple(layers), token, state, window, chunk, ratio, entry)
            for label, layers, token, state, window, chunk, ratio, entry in _core.model_summary(
                self
            )
        )

    def to_dict(self) -> dict[str, object]:
        """The shape as JSON values, in the ``layer_kinds`` form whichever form it was given in:
        ``num_layers``, then the fields but the uniform shorthand's (``layers``, ``kv_heads``,
        ``head_dim``, ``mla_kv_lora_rank``, ``mla_rope_head_dim``), ``layer_kinds`` listing
        every model layer, each with its ``kind``."""
        layers = self.model_layers
        out: dict[str, object] = {"num_layers": len(layers)}
        for field in fields(self):
            if field.name == "layer_kinds":
                out[field.name] = [{"kind": layer.kind, **asdict(layer)} for layer in layers]
            elif field.name not in _UNIFORM:
                out[field.name] = getattr(self, field.name)
        return out

    def to_json(self) -> str:
        """``to_dict`` as a JSON string."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        """The model in one line: its layers by kind (``summary``), draft, dtypes and page
        size. A shape the core refuses shows the fields it was given instead."""
        try:
            kinds = self.summary()
            count = self.num_layers
        except UnsupportedPDLayoutError:
            given = [
                f"{f.name}={shown(getattr(self, f.name))}"
                for f in fields(self)
                if f.name != "layer_kinds" and getattr(self, f.name) != f.default
            ]
            if self.layer_kinds:
                given.append(f"layer_kinds=<{len(self.layer_kinds)} layers>")
            return f"ModelShape({', '.join(given)})"
        if self.draft_layers > 0:
            kinds = kinds[:-1]  # the draft's entry, shown from its fields below
        parts = [f"{len(kind.layers)} {kind.label}" for kind in kinds]
        if len(kinds) > _REPR_KINDS:
            rest = kinds[_REPR_KINDS - 1 :]
            parts[_REPR_KINDS - 1 :] = [
                f"{sum(len(kind.layers) for kind in rest)} of {len(rest)} other kinds"
            ]
        if self.draft_layers > 0:
            parts.append(
                f"{_count(self.draft_layers, 'draft layer')} ({self.draft_kv_heads} KV heads x "
                f"{self.draft_head_dim})"
            )
        layers = _count(count, "layer") + (": " + ", ".join(parts) if parts else "")
        details = [self.dtype]
        if self.kv_cache_dtype is not None:
            details.append(f"kv_cache_dtype={shown(self.kv_cache_dtype)}")
        if self.state_dtype is not None:
            details.append(f"state_dtype={shown(self.state_dtype)}")
        details.append(f"page_size={self.page_size}")
        if self.family is not None:
            details.append(f"family={shown(self.family)}")
        return f"ModelShape({layers}; {', '.join(details)})"


#: The uniform shorthand's fields, which ``ModelShape.to_dict`` writes as ``layer_kinds``.
_UNIFORM = ("layers", "kv_heads", "head_dim", "mla_kv_lora_rank", "mla_rope_head_dim")
#: Layer kinds a ``ModelShape`` repr names (more are counted together).
_REPR_KINDS = 3


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class LayerKindSummary:
    """One kind of layer in a model: where it is and what one such layer keeps."""

    label: str
    """The kind in words (``"sliding-window attention (window 128)"``, ``"Mamba2"``)."""
    layers: tuple[int, ...]
    """The model layers of this kind, ascending (a draft model's: the last layer)."""
    token_bytes: int
    """Bytes one token takes in one such layer, over all TP ranks."""
    state_bytes: int
    """Bytes of state one request keeps in one such layer, over all TP ranks."""
    sliding_window: int | None
    """The kind's sliding window (tokens), or None."""
    attention_chunk_size: int | None = None
    """The kind's attention chunk (tokens), or None."""
    compress_ratio: int = 1
    """Tokens an entry of the kind's compressed caches covers (DeepSeek-V4); 1: none."""
    entry_bytes: int = 0
    """Bytes one compressed entry takes in one such layer, over all TP ranks."""

    def compressed_bytes(self, tokens: int) -> int:
        """Bytes the compressed caches of one such layer keep for a ``tokens``-token request:
        one entry per ``compress_ratio`` tokens that are all in (the rest wait in the
        compressor's state).

        :param tokens: The request's length.
        """
        return tokens // self.compress_ratio * self.entry_bytes if self.entry_bytes else 0

    def kept_tokens(self, tokens: int) -> int:
        """Tokens of a ``tokens``-token request one such layer keeps: the window, the current
        chunk, or all.

        :param tokens: The request's length.
        """
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
    """The buffer's number (``BufferLayout.buffer_index``)."""
    buffer_kind: BufferKind
    """What it holds; ``MAMBA_STATE`` is split by state channels, the others by KV heads."""
    prefill_item_bytes: int
    """Bytes of one page of a prefill rank's buffer."""
    decode_item_bytes: int
    """Bytes of one page of a decode rank's buffer."""
    unit_bytes: int
    """Bytes of one logical unit (a head, a channel) in a page."""
    page_size: int = 16
    """Tokens a page holds."""
    logical_size: int | None = None
    """Logical units in the whole buffer (the KV heads), when known: needed where both sides
    run replica groups."""
    rows_per_page: int = 1
    """Rows a page on both sides (``page_size`` for token-major pages)."""


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

    KV pages store tokens ``"HND"`` (``[heads][page_size][head_dim]``, head-major, one row a
    page) or ``"NHD"`` (``[page_size][heads][head_dim]``, a row per token, as SGLang and vLLM
    keep them). Buffers follow the model's layers in order, each naming its
    layer (``BufferLayout.layer``); draft-model buffers sit on the last layer (the last stage).
    Pipeline stages split ``shape.num_layers`` layers: when the model's last layers keep no
    cache (an MLP layer ends Nemotron-H), give the layouts a ``pp_layer_partition`` of that
    many layers (``vllm_layer_partition(shape.num_layers, pp)`` for vLLM's).

    With context parallelism (``*_cp`` CP ranks of their own, ``*_dcp`` DCP ranks inside TP, as
    in ``ParallelLayout``) the buffers are the same (each CP rank is a TP group of its own),
    but a side with CP cannot hold state layers (refused, naming the layer) and its DCP size
    must divide every attention layer's KV-head replica group.

    :param shape: The model.
    :param prefill_tp: The prefill side's TP size.
    :param decode_tp: The decode side's TP size.
    :param kv_layout: How KV pages store tokens, ``"HND"`` or ``"NHD"``.
    :param prefill_pp: The prefill side's pipeline stages.
    :param decode_pp: The decode side's pipeline stages.
    :param prefill_cp: The prefill side's CP ranks of their own.
    :param decode_cp: The decode side's CP ranks of their own.
    :param prefill_dcp: The prefill side's DCP ranks inside TP.
    :param decode_dcp: The decode side's DCP ranks inside TP.
    """
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
    with the reason.

    :param items: Each buffer's lengths, in buffer order.
    :param prefill_tp: The prefill side's TP size.
    :param decode_tp: The decode side's TP size.
    """
    return _core.buffers_from_item_lengths(items, prefill_tp, decode_tp)


def even_layer_partition(layers: int, pp_size: int) -> tuple[int, ...]:
    """pdplan's default split of ``layers`` over ``pp_size`` stages (``pp_layer_partition``
    left None): as even as possible, the first stages taking one more (5 over 2: ``(3, 2)``).
    Give it the model's ``num_layers`` to split layers that keep no cache too.

    :param layers: The layers to split.
    :param pp_size: The stages.
    """
    return tuple(_core.even_layer_partition(layers, pp_size))


def vllm_layer_partition(layers: int, pp_size: int) -> tuple[int, ...]:
    """vLLM's default split of ``layers`` over ``pp_size`` stages (``VLLM_PP_LAYER_PARTITION``
    unset): as even as possible, the extra layers going to the stages just before the last.
    pdplan's own default gives them to the first stages; pass this as ``pp_layer_partition``
    to match a vLLM deployment.

    :param layers: The layers to split.
    :param pp_size: The stages.
    """
    return tuple(_core.vllm_layer_partition(layers, pp_size))
