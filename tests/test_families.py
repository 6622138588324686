"""Every model family in the registry, read from a config.json written here from a published
model's values (awkward parts included: nulls, `text_config`, string patterns, empty lists,
bare Infinity). Each case states its expected layers per kind, the bytes a token and the state
bytes a request, derived here by hand from the modeling code's rule (cited per case) with numpy
arrays shaped as the runtime allocates them: never from pdplan's reader.

Then the registry's promises: an unknown architecture is refused, and a cache-shaping key that
a family does not consume is refused for every family, one key at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdplan import (
    CACHE_KEYS,
    MODEL_PRESETS,
    ModelShape,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
    model_families,
)

BF16 = np.float16  # two bytes a value, as bfloat16
F32 = np.float32


def nbytes(shape: tuple[int, ...], dtype: type = BF16) -> int:
    return np.zeros(shape, dtype=dtype).nbytes


def kv(heads: int, k_dim: int, v_dim: int | None = None) -> int:
    """One token's K and V over all heads, bfloat16."""
    return nbytes((heads, k_dim)) + nbytes((heads, v_dim or k_dim))


def padded_share(items: int, item_bytes: int, align: int) -> int:
    """An item's share of a page of `items` items padded up to `align` bytes (vLLM
    v1/kv_cache_interface.py _apply_alignment_padding)."""
    return -(-items * item_bytes // align) * align // items


#: DeepSeek-V4 in vLLM (models/deepseek_v4/attention.py, compressor.py,
#: v1/attention/backends/mla/sparse_swa.py): fp8_ds_mla latents of 584 bytes (448 fp8 + 64 bf16
#: rope values + 8 scale bytes) in 576-byte-aligned pages; the sliding latent in 64-token pages;
#: fp32 compressor states of 2 * coff * dim a token (coff 2 at ratio 4), 4-token pages at ratio
#: 4 and 8 at 128, kept for coff * ratio tokens; the indexer's keys 128 + 4 bytes.
V4_LATENT = padded_share(64, 584, 576)
V4_C4_STATES = 8 * padded_share(4, 2 * 2 * 512 * 4, 576) + 8 * padded_share(4, 2 * 2 * 128 * 4, 576)
V4_C128_STATE = 128 * padded_share(8, 2 * 1 * 512 * 4, 576)


def mamba2_state(
    heads: int, head_dim: int, state: int, groups: int, kernel: int, ssm: type = BF16
) -> int:
    """vLLM's Mamba2 state a request: SSM `[heads, head_dim, state]` in the SSM dtype, conv
    `[heads * head_dim + 2 * groups * state, kernel - 1]` in the model's."""
    return nbytes((heads, head_dim, state), ssm) + nbytes(
        (heads * head_dim + 2 * groups * state, kernel - 1)
    )


def layers(*spans: tuple[int, int] | int) -> list[int]:
    """Layer indices from ints and half-open (start, stop) spans."""
    out: list[int] = []
    for span in spans:
        out.extend(range(*span) if isinstance(span, tuple) else [span])
    return out


@dataclass(frozen=True)
class Case:
    family: str
    config: dict[str, Any]
    #: (label, layers, bytes a token, state bytes a request) per kind, in order of appearance.
    rows: list[tuple[str, list[int], int, int]]
    #: Where the rule is written.
    source: str
    state_dtype: str | None = None
    preset: str | None = None
    infinity: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def every(n: int) -> list[int]:
    return list(range(n))


NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
GEMMA3N_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 6
GEMMA4_E2B_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 7
GEMMA4_31B_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 10
MIMO_PATTERN = [0] + ([1] * 4 + [0]) + ([1] * 5 + [0]) * 7
# 49 attention blocks, 31 without attention (NVIDIA's counts; the positions are written here).
SUPER_49B_ATTENTION = set(range(80)) - set(
    layers((40, 47), (48, 55), (56, 63), (64, 71), 72, 74, 76)
)
LFM2_FULL = [2, 5, 8, 10, 12, 14]
GRANITE_H_ATTENTION = [5, 15, 25, 35]
KIMI_FULL = [4, 8, 12, 16, 20, 24, 27]  # counted from 1, as the config does
MINIMAX_TYPES = ([0] * 7 + [1]) * 10


def super_49b_blocks() -> list[dict[str, Any]]:
    attention = {
        "n_heads_in_group": 8,
        "no_op": False,
        "num_sink_tokens": None,
        "replace_with_linear": False,
        "sparsify": None,
        "unshifted_sink": False,
        "use_prefill_window_in_sink_attention": False,
        "window_length": None,
    }
    no_op = {**attention, "n_heads_in_group": None, "no_op": True}
    ffn = {"ffn_mult": 5.25, "no_op": False, "replace_with_linear": False, "sparsify": None}
    return [
        {"attention": attention if i in SUPER_49B_ATTENTION else no_op, "ffn": ffn}
        for i in range(80)
    ]


CASES: dict[str, Case] = {
    "llama-3.2-1b": Case(
        "llama",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 16,
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "rope_scaling": {"factor": 32.0, "rope_type": "llama3"},
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(16), kv(8, 64), 0)],
        "vLLM models/llama.py LlamaAttention: num_key_value_heads x head_dim",
    ),
    "granite-3.1-8b": Case(
        "llama",
        {
            "architectures": ["GraniteForCausalLM"],
            "model_type": "granite",
            "num_hidden_layers": 40,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(40), kv(8, 128), 0)],
        "vLLM models/granite.py GraniteAttention: head dim hidden_size / heads",
    ),
    "mistral-7b-v0.1": Case(
        "mistral",
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "sliding_window": 4096,
            "torch_dtype": "bfloat16",
        },
        [("sliding-window attention (window 4096)", every(32), kv(8, 128), 0)],
        "vLLM models/llama.py (Mistral runs as Llama): a model-wide sliding_window",
    ),
    "mixtral-8x7b": Case(
        "mistral",
        {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "sliding_window": None,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(32), kv(8, 128), 0)],
        "vLLM models/mixtral.py MixtralAttention",
    ),
    "phi-3-mini-4k": Case(
        "phi3",
        {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "num_hidden_layers": 32,
            "hidden_size": 3072,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "sliding_window": 2047,
            "torch_dtype": "bfloat16",
        },
        [("sliding-window attention (window 2047)", every(32), kv(32, 96), 0)],
        "vLLM models/phi3.py (a Llama subclass): a model-wide sliding_window",
    ),
    "qwen2.5-7b": Case(
        "qwen",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_hidden_layers": 28,
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_window_layers": 28,
            "sliding_window": 131072,
            "use_sliding_window": False,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(28), kv(4, 128), 0)],
        "transformers Qwen2Config: the window counts only with use_sliding_window",
    ),
    "qwen2.5-7b-windowed": Case(
        "qwen",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_hidden_layers": 28,
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_window_layers": 20,
            "sliding_window": 32768,
            "use_sliding_window": True,
            "torch_dtype": "bfloat16",
        },
        [
            ("full attention", every(20), kv(4, 128), 0),
            ("sliding-window attention (window 32768)", layers((20, 28)), kv(4, 128), 0),
        ],
        "transformers Qwen2Config: layers i >= max_window_layers slide",
    ),
    "qwen2.5-vl-7b": Case(
        "qwen",
        {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            "num_hidden_layers": 28,
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_window_layers": 28,
            "sliding_window": 32768,
            "use_sliding_window": False,
            "vision_config": {"depth": 32, "hidden_size": 1280, "num_heads": 16},
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(28), kv(4, 128), 0)],
        "transformers Qwen2_5_VLConfig: the text keys at the top level, Qwen2's window rule",
    ),
    "qwen3-vl-8b": Case(
        "qwen",
        {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "text_config": {
                "model_type": "qwen3_vl_text",
                "num_hidden_layers": 36,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "dtype": "bfloat16",
            },
            "vision_config": {"depth": 27, "hidden_size": 1152, "num_heads": 16},
        },
        [("full attention", every(36), kv(8, 128), 0)],
        "vLLM models/qwen3_vl.py: the text model is Qwen3's",
    ),
    "gemma-7b": Case(
        "gemma",
        {
            "architectures": ["GemmaForCausalLM"],
            "model_type": "gemma",
            "num_hidden_layers": 28,
            "hidden_size": 3072,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(28), kv(16, 256), 0)],
        "vLLM models/gemma.py GemmaAttention",
    ),
    "gemma-2-9b": Case(
        "gemma2",
        {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "num_hidden_layers": 42,
            "hidden_size": 3584,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "sliding_window": 4096,
            "torch_dtype": "float32",
        },
        [
            # float32 weights, served in bfloat16 (vLLM config/model.py _resolve_auto_dtype).
            ("sliding-window attention (window 4096)", list(range(0, 42, 2)), kv(8, 256), 0),
            ("full attention", list(range(1, 42, 2)), kv(8, 256), 0),
        ],
        "transformers Gemma2Config: layer i slides when (i + 1) % 2 (float32 weights)",
    ),
    "gemma-3-1b": Case(
        "gemma3",
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "num_hidden_layers": 26,
            "hidden_size": 1152,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "sliding-window attention (window 512)",
                [i for i in range(26) if i % 6 != 5],
                kv(1, 256),
                0,
            ),
            ("full attention", [5, 11, 17, 23], kv(1, 256), 0),
        ],
        "transformers Gemma3TextConfig: every sliding_window_pattern-th layer global",
    ),
    "gemma-3n-e2b": Case(
        "gemma3n",
        {
            "architectures": ["Gemma3nForConditionalGeneration"],
            "model_type": "gemma3n",
            "text_config": {
                "model_type": "gemma3n_text",
                "num_hidden_layers": 30,
                "hidden_size": 2048,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 256,
                "sliding_window": 512,
                "layer_types": GEMMA3N_TYPES,
                "num_kv_shared_layers": 10,
                "laurel_rank": 64,
            },
            "audio_config": {"model_type": "gemma3n_audio"},
            "torch_dtype": "bfloat16",
        },
        # Layers 20-29 share: a sliding one reads 18 (the last sliding layer before 20), a full
        # one 19.
        [
            (
                "sliding-window attention (window 512)",
                layers((0, 4), (5, 9), (10, 14), (15, 19)),
                kv(2, 256),
                0,
            ),
            ("full attention", [4, 9, 14, 19], kv(2, 256), 0),
            ("attention reusing layer 18's KV (no cache)", [20, 21, 22, 23, 25, 26, 27, 28], 0, 0),
            ("attention reusing layer 19's KV (no cache)", [24, 29], 0, 0),
        ],
        "vLLM models/gemma3n.py: the last num_kv_shared_layers read the last earlier layer of "
        "their type",
    ),
    "gemma-4-e2b": Case(
        "gemma4",
        {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": {
                "model_type": "gemma4_text",
                "num_hidden_layers": 35,
                "hidden_size": 1536,
                "num_attention_heads": 8,
                "num_key_value_heads": 1,
                "head_dim": 256,
                "global_head_dim": 512,
                "num_global_key_value_heads": None,
                "hidden_size_per_layer_input": 256,
                "num_kv_shared_layers": 20,
                "sliding_window": 512,
                "layer_types": GEMMA4_E2B_TYPES,
            },
            "dtype": "bfloat16",
        },
        # Layers 15-34 share: sliding ones read 13, full ones (19, 24, 29, 34) read 14.
        [
            (
                "sliding-window attention (window 512)",
                layers((0, 4), (5, 9), (10, 14)),
                kv(1, 256),
                0,
            ),
            ("full attention", [4, 9, 14], kv(1, 512), 0),
            (
                "attention reusing layer 13's KV (no cache)",
                [i for i in range(15, 35) if i % 5 != 4],
                0,
                0,
            ),
            ("attention reusing layer 14's KV (no cache)", [19, 24, 29, 34], 0, 0),
        ],
        "vLLM models/gemma4.py Gemma4DecoderLayer: full layers use global_head_dim",
        preset="gemma-4-e2b",
    ),
    "gemma-4-31b": Case(
        "gemma4",
        {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": {
                "model_type": "gemma4_text",
                "num_hidden_layers": 60,
                "hidden_size": 5376,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "num_global_key_value_heads": 4,
                "head_dim": 256,
                "global_head_dim": 512,
                "attention_k_eq_v": True,
                "num_kv_shared_layers": 0,
                "sliding_window": 1024,
                "layer_types": GEMMA4_31B_TYPES,
                "final_logit_softcapping": 30.0,
            },
            "dtype": "bfloat16",
        },
        [
            (
                "sliding-window attention (window 1024)",
                [i for i in range(60) if i % 6 != 5],
                kv(16, 256),
                0,
            ),
            ("full attention", list(range(5, 60, 6)), kv(4, 512), 0),
        ],
        "vLLM models/gemma4.py: with attention_k_eq_v, full layers have "
        "num_global_key_value_heads (K and V both cached)",
        preset="gemma-4-31b",
    ),
    "command-r": Case(
        "cohere",
        {
            "architectures": ["CohereForCausalLM"],
            "model_type": "cohere",
            "num_hidden_layers": 40,
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "torch_dtype": "float16",
        },
        [("full attention", every(40), kv(64, 128), 0)],
        "vLLM models/commandr.py CohereAttention",
    ),
    "command-r7b": Case(
        "cohere2",
        {
            "architectures": ["Cohere2ForCausalLM"],
            "model_type": "cohere2",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "sliding_window": 4096,
            "sliding_window_pattern": 4,
            "torch_dtype": "bfloat16",
        },
        [
            (
                # A sliding layer sees [pos - 4096, pos]: 4097 tokens (vLLM commandr.py
                # CohereAttention passes sliding_window + 1).
                "sliding-window attention (window 4097)",
                [i for i in range(32) if i % 4 != 3],
                kv(8, 128),
                0,
            ),
            ("full attention", list(range(3, 32, 4)), kv(8, 128), 0),
        ],
        "transformers Cohere2Config: every fourth layer global; vLLM 0.32 "
        "models/commandr.py L237-244: sliding layers keep sliding_window + 1 tokens",
    ),
    "olmo-2-7b": Case(
        "olmo",
        {
            "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "torch_dtype": "float32",
        },
        [("full attention", every(32), kv(32, 128), 0)],  # float32 served in bfloat16
        "vLLM models/olmo2.py Olmo2Attention",
    ),
    "olmo-3-7b": Case(
        "olmo3",
        {
            "architectures": ["Olmo3ForCausalLM"],
            "model_type": "olmo3",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "sliding_window": 4096,
            "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 8,
            "dtype": "bfloat16",
        },
        [
            (
                "sliding-window attention (window 4096)",
                [i for i in range(32) if i % 4 != 3],
                kv(32, 128),
                0,
            ),
            ("full attention", list(range(3, 32, 4)), kv(32, 128), 0),
        ],
        "vLLM models/olmo2.py: the window on layer_types' sliding layers",
    ),
    "exaone-3.5-7.8b": Case(
        "exaone",
        {
            "architectures": ["ExaoneForCausalLM"],
            "model_type": "exaone",
            "num_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(32), kv(8, 128), 0)],
        "vLLM models/exaone.py ExaoneAttention (num_layers)",
    ),
    "exaone-4.0-32b": Case(
        "exaone4",
        {
            "architectures": ["Exaone4ForCausalLM"],
            "model_type": "exaone4",
            "num_hidden_layers": 64,
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "sliding_window": 4096,
            "sliding_window_pattern": "LLLG",
            "torch_dtype": "bfloat16",
        },
        [
            (
                "sliding-window attention (window 4096)",
                [i for i in range(64) if i % 4 != 3],
                kv(8, 128),
                0,
            ),
            ("full attention", list(range(3, 64, 4)), kv(8, 128), 0),
        ],
        "transformers Exaone4Config: sliding_window_pattern LLLG (three local, one global)",
    ),
    "glm-4.5-air": Case(
        "glm",
        {
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "num_hidden_layers": 46,
            "hidden_size": 4096,
            "num_attention_heads": 96,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(46), kv(8, 128), 0)],
        "vLLM models/glm4_moe.py Glm4MoeAttention",
    ),
    "chatglm3-6b": Case(
        "chatglm",
        {
            "architectures": ["ChatGLMModel"],
            "model_type": "chatglm",
            "num_layers": 28,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "kv_channels": 128,
            "multi_query_attention": True,
            "multi_query_group_num": 2,
            "torch_dtype": "float16",
        },
        [("full attention", every(28), kv(2, 128), 0)],
        "vLLM models/chatglm.py GLMAttention: multi_query_group_num KV heads",
    ),
    "kimi-k2": Case(
        "deepseek",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "torch_dtype": "bfloat16",
        },
        [("MLA", every(61), nbytes((512 + 64,)), 0)],
        "vLLM models/deepseek_v2.py DeepseekV2MLAAttention: one latent of kv_lora_rank + "
        "qk_rope_head_dim",
    ),
    "deepseek-v4": Case(
        "deepseek-v4",
        {
            # DeepSeek-V4-Flash's cache keys on 8 layers; compress_ratios' last entry is MTP's.
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "num_hidden_layers": 8,
            "hidden_size": 4096,
            "num_attention_heads": 64,
            "num_key_value_heads": 1,
            "head_dim": 512,
            "qk_rope_head_dim": 64,
            "sliding_window": 128,
            "index_head_dim": 128,
            "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 0, 4],
            "torch_dtype": "bfloat16",
        },
        [
            ("DeepSeek-V4 attention (window 128)", [0, 1, 7], V4_LATENT, 0),
            (
                "DeepSeek-V4 attention (window 128; compressed 1 entry per 4 tokens + indexer)",
                [2, 4, 6],
                V4_LATENT,
                V4_C4_STATES,
            ),
            (
                "DeepSeek-V4 attention (window 128; compressed 1 entry per 128 tokens)",
                [3, 5],
                V4_LATENT,
                V4_C128_STATE,
            ),
        ],
        "vLLM models/deepseek_v4/attention.py DeepseekV4Attention (compress_ratio = max(1, "
        "compress_ratios[l]) below num_hidden_layers; the indexer at 4), compressor.py "
        "CompressorStateCache, sparse_swa.py DeepseekV4SWACache",
    ),
    "glm-5": Case(
        "glm-5",
        {
            # GLM-5.2's indexer spacing; the sizes left to GlmMoeDsaConfig's defaults.
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "num_hidden_layers": 78,
            "hidden_size": 6144,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "index_topk_freq": 4,
            "index_skip_topk_offset": 3,
            "torch_dtype": "bfloat16",
        },
        [
            # vLLM deepseek_v32/attention.py: layer l skips its indexer where
            # max(l - offset + 1, 0) % freq != 0; the indexer keeps 128 fp8 keys and a 4-byte
            # scale a token; the latent is kv_lora_rank 512 + qk_rope_head_dim 64 (defaults).
            (
                "MLA + indexer",
                [i for i in every(78) if max(i - 3 + 1, 0) % 4 == 0],
                nbytes((512 + 64,)) + 128 + 4,
                0,
            ),
            ("MLA", [i for i in every(78) if max(i - 3 + 1, 0) % 4 != 0], nbytes((512 + 64,)), 0),
        ],
        "vLLM models/deepseek_v32/attention.py (index_topk_freq, index_skip_topk_offset); "
        "transformers configuration_glm_moe_dsa.py GlmMoeDsaConfig defaults",
    ),
    "minimax-m2": Case(
        "minimax-m2",
        {
            "architectures": ["MiniMaxM2ForCausalLM"],
            "model_type": "minimax_m2",
            "num_hidden_layers": 62,
            "hidden_size": 3072,
            "num_attention_heads": 48,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(62), kv(8, 128), 0)],
        "vLLM models/minimax_m2.py MiniMaxM2Attention",
    ),
    "falcon-40b": Case(
        "falcon",
        {
            "architectures": ["FalconForCausalLM"],
            "model_type": "falcon",
            "num_hidden_layers": 60,
            "hidden_size": 8192,
            "num_attention_heads": 128,
            "num_kv_heads": 8,
            "multi_query": True,
            "new_decoder_architecture": True,
            "parallel_attn": True,
            "alibi": False,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(60), kv(8, 64), 0)],
        "vLLM models/falcon.py FalconAttention: num_kv_heads with the new decoder architecture",
    ),
    "falcon-7b": Case(
        "falcon",
        {
            "architectures": ["FalconForCausalLM"],
            "model_type": "falcon",
            "num_hidden_layers": 32,
            "hidden_size": 4544,
            "num_attention_heads": 71,
            "multi_query": True,
            "new_decoder_architecture": False,
            "torch_dtype": "bfloat16",
        },
        [("full attention", every(32), kv(1, 64), 0)],
        "vLLM models/falcon.py FalconAttention: one KV head with multi_query",
    ),
    "starcoder": Case(
        "gpt-bigcode",
        {
            "architectures": ["GPTBigCodeForCausalLM"],
            "model_type": "gpt_bigcode",
            "n_layer": 40,
            "n_embd": 6144,
            "n_head": 48,
            "multi_query": True,
            "torch_dtype": "float32",
        },
        [("full attention", every(40), kv(1, 128), 0)],  # float32 served in bfloat16
        "vLLM models/gpt_bigcode.py GPTBigCodeAttention: one KV head with multi_query",
    ),
    "llama-4-scout": Case(
        "llama4",
        {
            "architectures": ["Llama4ForConditionalGeneration"],
            "model_type": "llama4",
            "text_config": {
                "model_type": "llama4_text",
                "num_hidden_layers": 48,
                "hidden_size": 5120,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "attention_chunk_size": 8192,
                "no_rope_layers": [],
                "interleave_moe_layer_step": 1,
            },
            "vision_config": {"model_type": "llama4_vision_model"},
            "torch_dtype": "bfloat16",
        },
        # no_rope_layers empty: transformers' default, every fourth layer (3, 7, ...) NoPE.
        [
            (
                "chunked local attention (chunk 8192)",
                [i for i in range(48) if i % 4 != 3],
                kv(8, 128),
                0,
            ),
            ("full attention", list(range(3, 48, 4)), kv(8, 128), 0),
        ],
        "vLLM models/llama4.py Llama4Attention: NoPE layers full, the others ChunkedLocalAttention",
        preset="llama-4-scout",
    ),
    "llama-3.3-nemotron-super-49b": Case(
        "nemotron-nas",
        {
            "architectures": ["DeciLMForCausalLM"],
            "model_type": "nemotron-nas",
            "num_hidden_layers": 80,
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_key_value_heads": None,
            "block_configs": super_49b_blocks(),
            "torch_dtype": "bfloat16",
        },
        [
            ("full attention", sorted(SUPER_49B_ATTENTION), kv(8, 128), 0),
            ("MLP only (no cache)", sorted(set(range(80)) - SUPER_49B_ATTENTION), 0, 0),
        ],
        "vLLM models/nemotron_nas.py DeciLMDecoderLayer: num_attention_heads / "
        "n_heads_in_group KV heads, none on no_op blocks",
        preset="llama-3.3-nemotron-super-49b",
    ),
    "mimo-v2-flash": Case(
        "mimo-v2",
        {
            "architectures": ["MiMoV2FlashForCausalLM"],
            "model_type": "mimo_v2_flash",
            "num_hidden_layers": 48,
            "hidden_size": 4096,
            "num_attention_heads": 64,
            "num_key_value_heads": 4,
            "head_dim": 192,
            "v_head_dim": 128,
            "swa_num_attention_heads": 64,
            "swa_num_key_value_heads": 8,
            "swa_head_dim": 192,
            "swa_v_head_dim": 128,
            "sliding_window": 128,
            "hybrid_layer_pattern": MIMO_PATTERN,
            "moe_layer_freq": [0] + [1] * 47,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "full attention, 4 KV heads, K dim 192 / V dim 128",
                [0, 5, 11, 17, 23, 29, 35, 41, 47],
                kv(4, 192, 128),
                0,
            ),
            (
                "sliding-window attention (window 128), 8 KV heads, K dim 192 / V dim 128",
                [i for i in range(48) if i not in (0, 5, 11, 17, 23, 29, 35, 41, 47)],
                kv(8, 192, 128),
                0,
            ),
        ],
        "vLLM models/mimo_v2_flash.py: hybrid_layer_pattern[i] == 1 slides with the swa_* "
        "shapes; V heads of v_head_dim",
    ),
    "nemotron-3-nano-30b": Case(
        "nemotron-h",
        {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "num_hidden_layers": 52,
            "hidden_size": 2688,
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "mamba_num_heads": 64,
            "mamba_head_dim": 64,
            "ssm_state_size": 128,
            "n_groups": 8,
            "conv_kernel": 4,
            "expand": 2,
            "hybrid_override_pattern": NANO_PATTERN,
            "mamba_ssm_cache_dtype": "float32",
            "time_step_limit": None,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "Mamba2",
                [i for i, c in enumerate(NANO_PATTERN) if c == "M"],
                0,
                mamba2_state(64, 64, 128, 8, 4, ssm=F32),
            ),
            ("MLP only (no cache)", [i for i, c in enumerate(NANO_PATTERN) if c == "E"], 0, 0),
            ("full attention", [i for i, c in enumerate(NANO_PATTERN) if c == "*"], kv(2, 128), 0),
        ],
        "vLLM models/nemotron_h.py: the mixer is mamba_num_heads x mamba_head_dim (expand x "
        "hidden_size is not read); the SSM state in mamba_ssm_cache_dtype",
        state_dtype="float32",
        infinity=True,
    ),
    "bamba-9b": Case(
        "bamba",
        {
            "architectures": ["BambaForCausalLM"],
            "model_type": "bamba",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attn_layer_indices": [9, 18, 27],
            "mamba_n_heads": 128,
            "mamba_d_head": 64,
            "mamba_d_state": 128,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "Mamba2",
                [i for i in range(32) if i not in (9, 18, 27)],
                0,
                mamba2_state(128, 64, 128, 1, 4),
            ),
            ("full attention", [9, 18, 27], kv(8, 128), 0),
        ],
        "transformers BambaConfig.layers_block_type: attention at attn_layer_indices",
    ),
    "granite-4.0-h-small": Case(
        "granite-hybrid",
        {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "num_hidden_layers": 40,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "layer_types": [
                "attention" if i in GRANITE_H_ATTENTION else "mamba" for i in range(40)
            ],
            "mamba_n_heads": 128,
            "mamba_d_head": 64,
            "mamba_d_state": 128,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "Mamba2",
                [i for i in range(40) if i not in GRANITE_H_ATTENTION],
                0,
                mamba2_state(128, 64, 128, 1, 4),
            ),
            ("full attention", GRANITE_H_ATTENTION, kv(8, 128), 0),
        ],
        "vLLM models/granitemoehybrid.py: layer_types mamba and attention",
        preset="granite-4.0-h-small",
    ),
    "mamba-2.8b": Case(
        "mamba",
        {
            "architectures": ["MambaForCausalLM"],
            "model_type": "mamba",
            "num_hidden_layers": 64,
            "hidden_size": 2560,
            "intermediate_size": 5120,
            "state_size": 16,
            "conv_kernel": 4,
            "expand": 2,
            "torch_dtype": "float32",
        },
        # float32 weights served in bfloat16, the states too (no mamba_ssm_cache_dtype).
        [("Mamba1", every(64), 0, nbytes((5120, 16)) + nbytes((5120, 3)))],
        "vLLM models/mamba.py: SSM [intermediate_size, state_size], conv [intermediate_size, "
        "conv_kernel - 1]",
    ),
    "zamba2-2.7b": Case(
        "zamba2",
        {
            "architectures": ["Zamba2ForCausalLM"],
            "model_type": "zamba2",
            "num_hidden_layers": 54,
            "hidden_size": 2560,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "n_mamba_heads": 80,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_ngroups": 1,
            "hybrid_layer_ids": [6, 12, 18, 24, 30, 36, 42, 47, 51],
            "num_mem_blocks": 2,
            "torch_dtype": "bfloat16",
        },
        # The shared block attends over [hidden, embedding]: head dim 2 * 2560 / 32 = 160.
        [
            (
                "Mamba2",
                [i for i in range(54) if i not in (6, 12, 18, 24, 30, 36, 42, 47, 51)],
                0,
                mamba2_state(80, 64, 64, 1, 4),
            ),
            (
                "full attention + Mamba2",
                [6, 12, 18, 24, 30, 36, 42, 47, 51],
                kv(32, 160),
                mamba2_state(80, 64, 64, 1, 4),
            ),
        ],
        "transformers Zamba2Config (attention_head_dim = 2 hidden / heads, mamba_headdim = "
        "expand hidden / n_mamba_heads); vLLM models/zamba2.py Zamba2HybridLayer",
    ),
    "lfm2-1.2b": Case(
        "lfm2",
        {
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            "num_hidden_layers": 16,
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "conv_L_cache": 3,
            "conv_bias": False,
            "layer_types": ["full_attention" if i in LFM2_FULL else "conv" for i in range(16)],
            "torch_dtype": "bfloat16",
        },
        [
            ("short conv", [i for i in range(16) if i not in LFM2_FULL], 0, nbytes((2048, 2))),
            ("full attention", LFM2_FULL, kv(8, 64), 0),
        ],
        "vLLM mamba_utils.py short_conv_state_shape: [conv_dim, conv_L_cache - 1]",
    ),
    "qwen3.5-27b": Case(
        "qwen3.5",
        {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": {
                "model_type": "qwen3_5_text",
                "num_hidden_layers": 64,
                "hidden_size": 5120,
                "num_attention_heads": 24,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "full_attention_interval": 4,
                "layer_types": [
                    "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)
                ],
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 48,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "mamba_ssm_dtype": "float32",
                "dtype": "bfloat16",
            },
            "vision_config": {"depth": 27, "hidden_size": 1152},
        },
        [
            (
                "Gated DeltaNet",
                [i for i in range(64) if i % 4 != 3],
                0,
                nbytes((48, 128, 128), F32) + nbytes((2 * 16 * 128 + 48 * 128, 3)),
            ),
            ("full attention", list(range(3, 64, 4)), kv(4, 256), 0),
        ],
        "vLLM models/qwen3_5.py: the recurrent state in mamba_ssm_dtype, conv states in the "
        "model's dtype",
        state_dtype="float32",
        preset="qwen3.5-27b",
    ),
    "kimi-linear-48b-a3b": Case(
        "kimi-linear",
        {
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "num_hidden_layers": 27,
            "hidden_size": 2304,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "linear_attn_config": {
                "full_attn_layers": KIMI_FULL,
                "kda_layers": [i for i in range(1, 28) if i not in KIMI_FULL],
                "num_heads": 32,
                "head_dim": 128,
                "short_conv_kernel_size": 4,
            },
            "torch_dtype": "bfloat16",
        },
        # Counted from 1 in the config: full (MLA) layers 4, 8, ... are indices 3, 7, ...
        [
            (
                "Kimi Delta Attention",
                [i for i in range(27) if i + 1 not in KIMI_FULL],
                0,
                nbytes((32, 128, 128)) + 3 * nbytes((32 * 128, 3)),
            ),
            ("MLA", [i - 1 for i in KIMI_FULL], nbytes((512 + 64,)), 0),
        ],
        "vLLM mamba_utils.py kda_state_shape (recurrent [heads, dim, dim], conv q, k, v); "
        "KimiLinearConfig.is_kda_layer counts from 1",
    ),
    "minimax-text-01": Case(
        "minimax-text-01",
        {
            "architectures": ["MiniMaxText01ForCausalLM"],
            "model_type": "minimax_text_01",
            "num_hidden_layers": 80,
            "hidden_size": 6144,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attn_type_list": MINIMAX_TYPES,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "lightning attention",
                [i for i in range(80) if i % 8 != 7],
                0,
                nbytes((64, 128, 128)),
            ),
            ("full attention", list(range(7, 80, 8)), kv(8, 128), 0),
        ],
        "vLLM models/minimax_text_01.py: attn_type_list 0 is lightning attention (state [heads, "
        "head_dim, head_dim])",
    ),
    "jamba-1.5-mini": Case(
        "jamba",
        {
            "architectures": ["JambaForCausalLM"],
            "model_type": "jamba",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "sliding_window": None,
            "torch_dtype": "bfloat16",
        },
        # Mamba (v1) of 2 x 4096 channels: SSM [8192, 16], conv [8192, 3].
        [
            (
                "Mamba1",
                [i for i in range(32) if i % 8 != 4],
                0,
                nbytes((8192, 16)) + nbytes((8192, 3)),
            ),
            ("full attention", [4, 12, 20, 28], kv(8, 128), 0),
        ],
        "transformers JambaConfig.layers_block_type: attention where i % period == offset",
        preset="jamba-1.5-mini",
    ),
    "qwen3-next-80b-a3b": Case(
        "qwen3-next",
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "num_hidden_layers": 48,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "Gated DeltaNet",
                [i for i in range(48) if i % 4 != 3],
                0,
                nbytes((32, 128, 128)) + nbytes((2 * 16 * 128 + 32 * 128, 3)),
            ),
            ("full attention", list(range(3, 48, 4)), kv(2, 256), 0),
        ],
        "vLLM models/qwen3_next.py: every full_attention_interval-th layer full, Gated "
        "DeltaNet elsewhere (mamba_utils.py gated_delta_net_state_shape)",
        preset="qwen3-next-80b-a3b",
    ),
    "gpt-oss-20b": Case(
        "gpt-oss",
        {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "num_hidden_layers": 24,
            "hidden_size": 2880,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 12,
            "torch_dtype": "bfloat16",
        },
        [
            ("sliding-window attention (window 128)", list(range(0, 24, 2)), kv(8, 64), 0),
            ("full attention", list(range(1, 24, 2)), kv(8, 64), 0),
        ],
        "vLLM models/gpt_oss.py: sliding on layer_types' sliding_attention",
        preset="gpt-oss-20b",
    ),
    "falcon-h1-7b": Case(
        "falcon-h1",
        {
            "architectures": ["FalconH1ForCausalLM"],
            "model_type": "falcon_h1",
            "num_hidden_layers": 44,
            "hidden_size": 3072,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "mamba_n_heads": 24,
            "mamba_d_head": 128,
            "mamba_d_ssm": 3072,
            "mamba_d_state": 256,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "torch_dtype": "bfloat16",
        },
        [
            (
                "full attention + Mamba2",
                every(44),
                kv(2, 128),
                mamba2_state(24, 128, 256, 1, 4),
            )
        ],
        "vLLM models/falcon_h1.py FalconH1ParallelHybrid: attention and Mamba2 in every layer",
        preset="falcon-h1-7b",
    ),
    "mamba-codestral-7b": Case(
        "mamba2",
        {
            "architectures": ["Mamba2ForCausalLM"],
            "model_type": "mamba2",
            "num_hidden_layers": 64,
            "hidden_size": 4096,
            "num_heads": 128,
            "head_dim": 64,
            "state_size": 128,
            "n_groups": 8,
            "conv_kernel": 4,
            "expand": 2,
            "time_step_limit": None,
            "torch_dtype": "bfloat16",
        },
        [("Mamba2", every(64), 0, mamba2_state(128, 64, 128, 8, 4))],
        "vLLM models/mamba2.py: num_heads x head_dim channels (= expand x hidden_size)",
        preset="mamba-codestral-7b",
        infinity=True,
    ),
}


def published(name: str) -> dict[str, Any]:
    """A config of the published corpus (tests/data/published_configs), as JSON values."""
    text = (Path(__file__).parent / "data" / "published_configs" / name / "config.json").read_text()
    config: dict[str, Any] = json.loads(text)
    return config


#: Families vLLM 0.32 runs through its Transformers backend, and the class-default readers.
#: Where no published file was found through the index the values are the model's published
#: ones as recalled here (heads, dims, layers), said so per case; the rule is cited.
CASES.update({
    "phi-2": Case(
        "phi",
        {"architectures": ["PhiForCausalLM"], "model_type": "phi", "num_hidden_layers": 32,
         "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": None,
         "torch_dtype": "float16"},
        [("full attention", every(32), kv(32, 80), 0)],
        "transformers PhiConfig (KV heads default to the heads) and vLLM transformers/base.py: "
        "hidden 2560 / 32 heads = head dim 80 (microsoft/phi-2's values, recalled)",
    ),
    "seed-oss-36b": Case(
        "seed-oss",
        {"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss",
         "num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 80,
         "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"},
        [("full attention", every(64), kv(8, 128), 0)],
        "transformers SeedOssConfig; vLLM transformers/base.py (ByteDance-Seed/Seed-OSS-36B's "
        "values, recalled)",
    ),
    "starcoder2-15b": Case(
        "starcoder2",
        {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2",
         "num_hidden_layers": 40, "hidden_size": 6144, "num_attention_heads": 48,
         "num_key_value_heads": 4, "sliding_window": 4096, "torch_dtype": "bfloat16"},
        [("sliding-window attention (window 4096)", every(40), kv(4, 128), 0)],
        "transformers Starcoder2Config; vLLM engine/arg_utils.py: a model-wide sliding_window "
        "on every layer without layer_types (bigcode/starcoder2-15b's values, recalled)",
    ),
    "smollm3-3b": Case(
        "smollm3",
        published("smollm3-3b"),
        [("full attention", every(36), kv(4, 128), 0)],
        "transformers SmolLM3Config (layer_types as published: every layer full); "
        "HuggingFaceTB/SmolLM3-3B's published file",
    ),
    "hunyuan-a13b": Case(
        "hunyuan",
        published("hunyuan-a13b-instruct"),
        [("full attention", every(32), kv(8, 128), 0)],
        "vLLM 0.32 models/registry.py: the Transformers backend; use_cla false (its "
        "cla_share_factor 2 unread); attention_head_dim 128 = 4096 / 32 heads; Tencent's "
        "published Hunyuan-A13B file",
    ),
    "ernie-4.5-0.3b": Case(
        "ernie4.5",
        {"architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5",
         "num_hidden_layers": 18, "hidden_size": 1024, "num_attention_heads": 16,
         "num_key_value_heads": 2, "head_dim": 128, "torch_dtype": "bfloat16"},
        [("full attention", every(18), kv(2, 128), 0)],
        "vLLM models/ernie45.py (a LlamaForCausalLM) (baidu/ERNIE-4.5-0.3B's values, recalled)",
    ),
    "voxtral-mini-3b": Case(
        "voxtral",
        {"architectures": ["VoxtralForConditionalGeneration"], "model_type": "voxtral",
         "text_config": {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 3072,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
         "audio_config": {"model_type": "voxtral_encoder", "num_hidden_layers": 32},
         "torch_dtype": "bfloat16"},
        [("full attention", every(30), kv(8, 128), 0)],
        "vLLM models/voxtral.py: text_config on llama.py; the audio encoder keeps no paged "
        "cache (mistralai/Voxtral-Mini-3B-2507's values, recalled)",
    ),
    "dots-llm1": Case(
        "dots1",
        {"architectures": ["Dots1ForCausalLM"], "model_type": "dots1",
         "num_hidden_layers": 62, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 32, "head_dim": 128, "sliding_window": None,
         "max_window_layers": 62, "torch_dtype": "bfloat16"},
        [("full attention", every(62), kv(32, 128), 0)],
        "transformers Dots1Config.__post_init__: no window, so every layer full "
        "(rednote-hilab/dots.llm1.inst's values, recalled)",
    ),
    "step-3": Case(
        "step3",
        {"architectures": ["Step3TextForCausalLM"], "model_type": "step3_text",
         "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64,
         "num_attention_groups": 1, "head_dim": 256, "torch_dtype": "bfloat16"},
        [("full attention", every(61), kv(1, 256), 0)],
        "vLLM models/step3_text.py: one KV head, replicated (stepfun-ai/step3's text values, "
        "recalled)",
    ),
    "baichuan2-13b": Case(
        "baichuan",
        # baichuan-inc/Baichuan2-13B-Chat's sizes (recalled): multi-head attention.
        {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan",
         "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
         "intermediate_size": 13696, "vocab_size": 125696, "model_max_length": 4096,
         "torch_dtype": "bfloat16"},
        # SGLang baichuan.py: head_dim = hidden_size // heads (128); the pool holds the
        # config's KV heads, which default to the 40 query heads.
        [("full attention", every(40), kv(40, 128), 0)],
        "SGLang models/baichuan.py BaiChuanAttention (head_dim hidden_size // heads); the KV "
        "pool of model_config's KV heads",
    ),
    "minimax-m3": Case(
        "minimax-m3",
        {"architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3_text",
         "num_hidden_layers": 60, "hidden_size": 6144, "num_attention_heads": 64,
         "num_key_value_heads": 4, "head_dim": 128,
         "sparse_attention_config": {"use_sparse_attention": True, "sparse_index_dim": 128,
                                     "sparse_num_index_heads": 4,
                                     "sparse_attention_freq": [0] * 3 + [1] * 57},
         "torch_dtype": "bfloat16"},
        # vLLM minimax_m3/nvidia/model.py: K and V on every layer; a layer whose
        # sparse_attention_freq is not 0 also keeps one bf16 index key of sparse_index_dim
        # (common/indexer.py MiniMaxM3IndexerCache).
        [("full attention", [0, 1, 2], kv(4, 128), 0),
         ("full attention + index keys", list(range(3, 60)), kv(4, 128) + nbytes((128,)), 0)],
        "vLLM models/minimax_m3/nvidia/model.py _sparse_attention_layer_ids; "
        "common/indexer.py MiniMaxM3IndexerCache",
    ),
    "step-3.5-flash": Case(
        "step3.5",
        # Values as Megatron-Bridge's Step-3.5 provider gives them (no published file was
        # found): a full layer every fourth, 96 query heads on the sliding ones; layer_types
        # runs 3 entries past the layers (MTP), as the checkpoint's does.
        {"architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5",
         "num_hidden_layers": 45, "hidden_size": 4096, "num_attention_heads": 64,
         "num_attention_groups": 8, "head_dim": 128, "sliding_window": 512,
         "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention"
                         for i in range(45)] + ["sliding_attention"] * 3,
         "attention_other_setting": {"attention_type": "sliding_attention",
                                     "num_attention_heads": 96, "num_attention_groups": 8,
                                     "head_dim": 128},
         "torch_dtype": "bfloat16"},
        [("full attention", list(range(0, 45, 4)), kv(8, 128), 0),
         ("sliding-window attention (window 512)", [i for i in every(45) if i % 4], kv(8, 128),
          0)],
        "vLLM models/step3p5.py Step3p5DecoderLayer: attention_other_setting where layer_types "
        "names its type; sliding_attention layers by sliding_window",
    ),
})  # fmt: skip


def write(tmp_path: Path, config: dict[str, Any], infinity: bool = False) -> Path:
    text = json.dumps(config, indent=2)
    if infinity:
        text = text.replace('"time_step_limit": null', '"time_step_limit": [0.0, Infinity]')
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


def rows(shape: ModelShape) -> list[tuple[str, list[int], int, int]]:
    return [(s.label, list(s.layers), s.token_bytes, s.state_bytes) for s in shape.summary()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_reads_its_config_by_its_modeling_rule(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    shape = ModelShape.from_hf_config(write(tmp_path, case.config, case.infinity))
    assert shape.family == case.family, case.source
    assert rows(shape) == case.rows, case.source
    assert shape.state_dtype == case.state_dtype
    if case.preset:
        assert ModelShape.preset(case.preset) == shape


def test_every_family_has_a_case_and_every_case_cites_its_rule() -> None:
    assert len(SUPER_49B_ATTENTION) == 49
    covered = {case.family for case in CASES.values()}
    assert covered == {f.name for f in model_families()}
    assert all(case.source for case in CASES.values())


#: The layer-kind names transformers 5 writes in place of older ones whenever it loads a config
#: (and so whenever a model is saved again): ``_LEGACY_LAYER_TYPE_REMAP`` in transformers 5.19's
#: ``configuration_utils.py``, applied to every config's ``layer_types`` at ``__init__``.
TRANSFORMERS_5_LAYER_TYPES = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}


def resaved(config: dict[str, Any]) -> dict[str, Any] | None:
    """``config`` as transformers 5 saves it again (its ``layer_types`` renamed), or None when
    nothing in it is renamed."""
    out = json.loads(json.dumps(config))
    holder = out.get("text_config") or out
    types = holder.get("layer_types")
    if not isinstance(types, list) or not set(types) & set(TRANSFORMERS_5_LAYER_TYPES):
        return None
    holder["layer_types"] = [TRANSFORMERS_5_LAYER_TYPES.get(t, t) for t in types]
    return out


RESAVED = sorted(name for name, case in CASES.items() if resaved(case.config) is not None)


def test_some_published_configs_use_names_transformers_5_renames() -> None:
    assert "granite-4.0-h-small" in RESAVED, RESAVED


@pytest.mark.parametrize("name", RESAVED)
def test_a_config_transformers_5_saved_again_reads_as_the_published_one(
    tmp_path: Path, name: str
) -> None:
    """vLLM reads a model whichever names its ``layer_types`` hold (Granite 4.0-H's
    ``granitemoehybrid.py`` matches ``linear_attention`` / ``full_attention``, which
    transformers 5 gives a published file's ``mamba`` / ``attention``), so pdplan does too."""
    case = CASES[name]
    config = resaved(case.config)
    assert config is not None
    shape = ModelShape.from_hf_config(write(tmp_path, config, case.infinity))
    assert (shape.family, rows(shape)) == (case.family, case.rows), case.source


def test_zamba2_as_transformers_5_saves_it_reads_as_published(tmp_path: Path) -> None:
    """transformers 5's ``Zamba2Config`` renames ``layers_block_type``'s ``mamba`` (it aliases
    ``layer_types``) and writes ``kv_channels = hidden_size / num_attention_heads`` and
    ``hybrid_layer_ids``; vLLM's ``zamba2.py`` matches ``"hybrid"`` and sizes its KV by
    ``attention_head_dim``, never ``kv_channels``: the same rows as the published file."""
    case = CASES["zamba2-2.7b"]
    hybrid = case.config["hybrid_layer_ids"]
    kinds = ["hybrid" if i in hybrid else "linear_attention" for i in range(54)]
    config = {**case.config, "layers_block_type": kinds, "kv_channels": 2560 // 32}
    shape = ModelShape.from_hf_config(write(tmp_path, config, case.infinity))
    assert (shape.family, rows(shape)) == (case.family, case.rows), case.source


#: Keys a family's serving code reads under another name too (transformers' config classes
#: rename them at load, or alias them): each case's config with ``renames`` applied reads as
#: its published form. NemotronHConfig reads ``mamba_n_groups``, ``mamba_d_conv`` and
#: ``mamba_expand`` first (its ``__post_init__``), and both it and GraniteMoeHybridConfig alias
#: the layer list (``attribute_map``: ``layer_types`` <-> ``layers_block_type``).
ALIASES = [
    ("nemotron-3-nano-30b", {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv",
                             "expand": "mamba_expand"}),
    ("granite-4.0-h-small", {"layer_types": "layers_block_type"}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "renames"), ALIASES)
def test_a_key_the_serving_code_reads_under_another_name_reads_alike(
    tmp_path: Path, name: str, renames: dict[str, str]
) -> None:
    case = CASES[name]
    config = {renames.get(k, k): v for k, v in case.config.items()}
    shape = ModelShape.from_hf_config(write(tmp_path, config, case.infinity))
    assert (shape.family, rows(shape)) == (case.family, case.rows), case.source


def test_nemotron_h_s_layer_list_under_either_name_reads_alike(tmp_path: Path) -> None:
    """transformers 5 saves Nemotron-H's layers as ``layers_block_type`` (its
    ``hybrid_override_pattern`` turned into a list, legacy names renamed) and reads
    ``layer_types`` as the same list."""
    case = CASES["nemotron-3-nano-30b"]
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    listed = [names[c] for c in case.config["hybrid_override_pattern"]]
    for key in ("layers_block_type", "layer_types"):
        config = {k: v for k, v in case.config.items() if k != "hybrid_override_pattern"}
        config[key] = listed
        shape = ModelShape.from_hf_config(write(tmp_path, config, case.infinity))
        assert rows(shape) == case.rows, key


def test_the_registry_names_its_families_architectures_and_keys() -> None:
    families = model_families()
    for family in families:
        assert family.architectures and family.model_types and family.source
        assert set(family.keys) <= set(CACHE_KEYS)
    covered = [a for f in families for a in f.architectures]
    assert len(covered) == len(set(covered))
    for arch in ("LlamaForCausalLM", "DeciLMForCausalLM", "Gemma4ForConditionalGeneration"):
        assert arch in covered


#: Another name a config may give a key, and the key (src/model/cache_keys.rs ALIASES): Gemma
#: 2's published configs hold sliding_window_size beside sliding_window.
ALIASES = {"sliding_window_size": "sliding_window"}


def check_alias(tmp_path: Path, config: dict[str, Any], alias: str, twin: str) -> None:
    """Another name of a key the family reads: beside its twin it must agree (then it changes
    nothing), alone it is read as the twin."""

    def read(changes: dict[str, Any]) -> ModelShape:
        changed = json.loads(json.dumps(config))
        (changed.get("text_config") or changed).update(changes)
        return ModelShape.from_hf_config(write(tmp_path, changed))

    given = (config.get("text_config") or config).get(twin)
    if given is not None:
        assert read({alias: given}) == read({}), alias
        with pytest.raises(UnsupportedPDLayoutError, match=f"{alias} .* must agree"):
            read({alias: given + 1})
    else:
        assert read({alias: 64}) == read({twin: 64}), alias


def family_configs() -> list[tuple[str, dict[str, Any]]]:
    """One config of every family: its first case's."""
    by_family: dict[str, dict[str, Any]] = {}
    for case in CASES.values():
        by_family.setdefault(case.family, case.config)
    return sorted(by_family.items())


@pytest.mark.parametrize(("family", "config"), family_configs(), ids=lambda v: str(v)[:20])
def test_every_cache_key_a_family_does_not_consume_is_refused(
    tmp_path: Path, family: str, config: dict[str, Any]
) -> None:
    """The property: add each key of the table, one at a time, to a config the family reads,
    and the config is refused, naming the key (wherever the family keeps its text part)."""
    chosen = next(f for f in model_families() if f.name == family)
    consumed, ignored = chosen.keys, {key for key, _ in chosen.ignored}
    ModelShape.from_hf_config(write(tmp_path, config))  # reads as it is
    for key in CACHE_KEYS:
        if key in consumed:
            continue
        if key in ignored:
            # Declared ignored by the family's modeling code: accepted, read as if absent.
            changed = json.loads(json.dumps(config))
            (changed.get("text_config") or changed)[key] = 64
            assert ModelShape.from_hf_config(write(tmp_path, changed)) == ModelShape.from_hf_config(
                write(tmp_path, config)
            ), key
            continue
        if ALIASES.get(key) in consumed:
            check_alias(tmp_path, config, key, ALIASES[key])
            continue
        changed = json.loads(json.dumps(config))
        part = changed.get("text_config") or changed
        part[key] = 2
        with pytest.raises(UnsupportedPDLayoutError, match=f"config.json has {key}, which shapes"):
            ModelShape.from_hf_config(write(tmp_path, changed))
        # At the top level of a nested config too.
        if "text_config" in changed:
            changed = json.loads(json.dumps(config))
            changed[key] = 2
            with pytest.raises(UnsupportedPDLayoutError, match=f"config.json has {key},"):
                ModelShape.from_hf_config(write(tmp_path, changed))


def test_a_null_cache_key_counts_as_absent(tmp_path: Path) -> None:
    config = {**CASES["llama-3.2-1b"].config, "attention_chunk_size": None, "v_head_dim": None}
    assert ModelShape.from_hf_config(write(tmp_path, config)).family == "llama"


def test_an_unknown_architecture_is_refused_naming_it_and_the_families(tmp_path: Path) -> None:
    config = {**CASES["llama-3.2-1b"].config, "architectures": ["Phi3SmallForCausalLM"]}
    config["model_type"] = "phi3small"
    path = write(tmp_path, config)
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        ModelShape.from_hf_config(path)
    message = str(refused.value)
    assert "Phi3SmallForCausalLM" in message and "phi3small" in message
    for family in model_families():
        assert family.name in message
    assert "family=" in message
    # Chosen by hand, it reads; a family name that does not exist is refused.
    assert ModelShape.from_hf_config(path, family="llama").num_layers == 16
    with pytest.raises(UnsupportedPDLayoutError, match='unknown model family "lama"'):
        ModelShape.from_hf_config(path, family="lama")
    # No architecture at all, no model type: refused the same way.
    bare = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    with pytest.raises(UnsupportedPDLayoutError, match="names no architectures"):
        ModelShape.from_hf_config(write(tmp_path, bare))


def test_the_model_type_selects_a_family_when_no_architecture_does(tmp_path: Path) -> None:
    config = {**CASES["mistral-7b-v0.1"].config}
    del config["architectures"]
    assert ModelShape.from_hf_config(write(tmp_path, config)).family == "mistral"


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        # A layer kind no reader of the family knows is refused by the kind, never misread.
        (
            "qwen2.5-7b",
            {"layer_types": ["full_attention", "mamba"] * 14},
            r'layer_types\[1\] is "mamba"',
        ),
        (
            "granite-4.0-h-small",
            {"layer_types": ["mamba", "conv"] * 20},
            r'layer_types\[1\] is "conv"',
        ),
        ("lfm2-1.2b", {"layer_types": ["conv"] * 15}, "lists 15 layers but the model has 16"),
        (
            "nemotron-3-nano-30b",
            {"hybrid_override_pattern": "X" * 52},
            r"hybrid_override_pattern\[0\] is 'X'",
        ),
        ("mimo-v2-flash", {"hybrid_layer_pattern": [2] * 48}, r"hybrid_layer_pattern\[0\] is 2"),
        ("minimax-text-01", {"attn_type_list": [3] * 80}, r"attn_type_list\[0\] is 3"),
        ("exaone-4.0-32b", {"sliding_window_pattern": "LLXG"}, "letters L"),
        ("gemma-4-31b", {"global_head_dim": None}, "no global_head_dim"),
        (
            "llama-3.3-nemotron-super-49b",
            {"block_configs": [{"attention": {"no_op": False}}] * 80},
            "names no n_heads_in_group",
        ),
        (
            "kimi-linear-48b-a3b",
            {
                "linear_attn_config": {
                    "kda_layers": [1],
                    "full_attn_layers": [2],
                    "num_heads": 32,
                    "head_dim": 128,
                    "short_conv_kernel_size": 4,
                }
            },
            "exactly one of",
        ),
        ("zamba2-2.7b", {"hybrid_layer_ids": [99]}, "outside the model's 54 layers"),
        ("falcon-40b", {"num_attention_heads": 100}, "not a multiple"),
        ("llama-4-scout", {"no_rope_layers": [1, 0]}, "no_rope_layers lists 2 layers"),
        ("gemma-3n-e2b", {"num_kv_shared_layers": 30}, "leaves none"),
        ("bamba-9b", {"mamba_expand": 3}, "inner size is 12288"),
        ("llama-3.2-1b", {"num_key_value_heads": "8"}, "non-negative integer"),
        ("llama-3.2-1b", {"num_key_value_heads": -1}, "non-negative integer"),
        ("llama-3.2-1b", {"layer_types": "full_attention"}, "must be a list"),
        ("qwen2.5-7b", {"use_sliding_window": "yes"}, "must be true or false"),
        ("qwen3.5-27b", {"mamba_ssm_dtype": "float6"}, "mamba_ssm_dtype: unknown dtype"),
        ("qwen3.5-27b", {"full_attention_interval": 3}, "disagrees with full_attention_interval"),
    ],
)
def test_wrong_types_and_values_in_the_readers_keys_are_clear_errors(
    tmp_path: Path, name: str, change: dict[str, Any], message: str
) -> None:
    config = json.loads(json.dumps(CASES[name].config))
    (config.get("text_config") or config).update(change)
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        ModelShape.from_hf_config(write(tmp_path, config))


def test_a_chunked_layer_moves_only_the_current_chunk_by_slot_maps() -> None:
    """Llama 4's chunked layers carry their chunk to the buffers and fragments (wire format
    v5); by slot maps a request moves only tokens t >= (n // C) * C of those layers, every
    token of the NoPE ones. Checked on real memory against a first-principles copy."""
    from dataclasses import replace

    from pdplan import ParallelLayout, PDTransferPlanner, PreparedTransfer

    shape = ModelShape.preset("llama-4-scout", page_size=4)
    # Two layers keep the test small: a chunked one (0) and a NoPE one (3).
    small = ModelShape(layer_kinds=(shape.model_layers[0], shape.model_layers[3]), page_size=4)
    prefill, decode = model_buffer_layouts(small, 2, 1)
    assert [b.attention_chunk_size for b in prefill] == [8192, 8192, None, None]

    def chunk_of_8(buffers: tuple[Any, ...]) -> list[Any]:
        return [
            replace(b, attention_chunk_size=8) if b.attention_chunk_size else b for b in buffers
        ]

    chunked, dchunked = chunk_of_8(prefill), chunk_of_8(decode)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=chunked,
        decode_buffers=dchunked,
    )
    assert planner.token_maps
    fragments_by_rank = planner.transfer_fragments(0)
    frags = [f for fs in fragments_by_rank.values() for f in fs]
    assert {f.attention_chunk_size for f in frags} == {8, None}
    from pdplan import decode_transfer_fragments, encode_transfer_fragments

    version, payload = encode_transfer_fragments(frags)
    assert version == b"5" and decode_transfer_fragments(version, payload) == tuple(frags)

    n = 21  # three chunks of 8 begun: the current chunk is tokens 16..20
    pages = 6
    for src_rank in sorted(fragments_by_rank):
        src = [np.arange(b.item_stride_bytes * pages, dtype=np.uint8) % 251 for b in chunked]
        dst = [np.zeros(b.item_stride_bytes * pages, dtype=np.uint8) for b in dchunked]
        slots = np.arange(n, dtype=np.int64)
        prepared = PreparedTransfer(
            fragments_by_rank[src_rank],
            [a.ctypes.data for a in src],
            [a.ctypes.data for a in dst],
            src_limits=[a.nbytes for a in src],
            dst_limits=[a.nbytes for a in dst],
        )
        d = prepared.token_descriptors(slots, slots)
        for s_addr, d_addr, length in zip(d.src_addrs, d.dst_addrs, d.lengths):
            for buf_s, buf_d in zip(src, dst):
                if buf_s.ctypes.data <= s_addr < buf_s.ctypes.data + buf_s.nbytes:
                    o_s, o_d = s_addr - buf_s.ctypes.data, d_addr - buf_d.ctypes.data
                    buf_d[o_d : o_d + length] = buf_s[o_s : o_s + length]
        # First principles: in head-major pages [head][token][dim], token t of page p sits at
        # p * item + head * page_size * dim_bytes + (t % page_size) * dim_bytes.
        for b_index, (bs, bd) in enumerate(zip(chunked, dchunked)):
            heads_src = bs.item_stride_bytes // bs.bytes_per_logical_unit
            dim_bytes = bs.bytes_per_logical_unit // bs.page_size
            first = 16 if bs.attention_chunk_size else 0
            want = np.zeros_like(dst[b_index])
            for t in range(first, n):
                page, offset = divmod(t, 4)
                for h in range(heads_src):
                    head = src_rank * heads_src + h
                    s0 = page * bs.item_stride_bytes + h * 4 * dim_bytes + offset * dim_bytes
                    d0 = page * bd.item_stride_bytes + head * 4 * dim_bytes + offset * dim_bytes
                    want[d0 : d0 + dim_bytes] = src[b_index][s0 : s0 + dim_bytes]
            np.testing.assert_array_equal(dst[b_index], want, err_msg=f"buffer {b_index}")


def test_presets_of_the_new_families_are_listed() -> None:
    for name in (
        "llama-3.3-nemotron-super-49b",
        "gemma-4-31b",
        "gemma-4-e2b",
        "llama-4-scout",
        "granite-4.0-h-small",
        "qwen3.5-27b",
    ):
        assert name in MODEL_PRESETS


GARBAGE: list[Any] = ["8", -1, 2.5, 1 << 70, [], {}, True, [None], "auto", 0]


@pytest.mark.parametrize(("family", "config"), family_configs(), ids=lambda v: str(v)[:20])
def test_garbage_in_every_key_a_family_reads_is_a_clear_error(
    tmp_path: Path, family: str, config: dict[str, Any]
) -> None:
    """Every consumed key (and the shape keys beside them), set to each wrong type or value:
    the config reads and lays out, or is refused with UnsupportedPDLayoutError; nothing else
    escapes (no KeyError, no TypeError, no panic)."""
    consumed = next(f.keys for f in model_families() if f.name == family)
    part_of = (lambda c: c.get("text_config") or c) if "text_config" in config else (lambda c: c)
    keys = [k for k in part_of(config) if k in consumed or not isinstance(part_of(config)[k], dict)]
    for key in keys:
        for value in GARBAGE:
            changed = json.loads(json.dumps(config))
            part_of(changed)[key] = value
            try:
                shape = ModelShape.from_hf_config(write(tmp_path, changed))
                model_buffer_layouts(shape, 1, 1)
            except UnsupportedPDLayoutError:
                pass


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_case_plans_and_verifies(tmp_path: Path, name: str) -> None:
    """What each reader reads lays out and plans: at TP 1 always; at higher TP wherever the
    heads and channels split (else refused naming the layer), verified byte by byte."""
    from pdplan import ParallelLayout, PDTransferPlanner

    case = CASES[name]
    shape = ModelShape.from_hf_config(write(tmp_path, case.config, case.infinity))
    planned = []
    for prefill_tp, decode_tp in ((1, 1), (2, 1), (4, 2)):
        try:
            prefill, decode = model_buffer_layouts(shape, prefill_tp, decode_tp)
        except UnsupportedPDLayoutError as refused:
            assert prefill_tp > 1 and "layer " in str(refused)
            continue
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", prefill_tp),
            decode_layout=ParallelLayout("decode", decode_tp),
            prefill_buffers=prefill,
            decode_buffers=decode,
        ).verify()
        planned.append(prefill_tp)
    assert planned[0] == 1


def test_a_kv_cache_dtype_the_config_names_is_read_by_every_family(tmp_path: Path) -> None:
    for name in ("llama-3.2-1b", "gemma-4-31b", "kimi-k2"):
        config = json.loads(json.dumps(CASES[name].config))
        (config.get("text_config") or config)["kv_cache_dtype"] = "fp8"
        shape = ModelShape.from_hf_config(write(tmp_path, config))
        assert shape.kv_cache_dtype == "float8_e4m3fn"
        prefill, _ = model_buffer_layouts(shape, 1, 1)
        plain, _ = model_buffer_layouts(replace(shape, kv_cache_dtype=None), 1, 1)
        # One byte a value instead of two (FlashMLA's FP8 latent: 656 bytes, not 1,152).
        assert prefill[0].bytes_per_logical_unit < plain[0].bytes_per_logical_unit
    config = {**CASES["llama-3.2-1b"].config, "kv_cache_dtype": "auto"}
    assert ModelShape.from_hf_config(write(tmp_path, config)).kv_cache_dtype is None
    assert all("kv_cache_dtype" in f.keys for f in model_families())


def test_a_top_level_key_that_contradicts_text_config_is_refused(tmp_path: Path) -> None:
    """Readers read the language model's part; a top-level copy of one of its keys must agree
    (some converters keep both), else the config is refused rather than half read."""
    config = json.loads(json.dumps(CASES["gemma-4-e2b"].config))
    config["sliding_window"] = 512  # the same as text_config's: fine
    assert ModelShape.from_hf_config(write(tmp_path, config)).family == "gemma4"
    config["sliding_window"] = 4096
    with pytest.raises(UnsupportedPDLayoutError, match="sliding_window at its top level"):
        ModelShape.from_hf_config(write(tmp_path, config))
    del config["sliding_window"]
    config["num_key_value_heads"] = 8  # text_config names 1
    with pytest.raises(UnsupportedPDLayoutError, match="num_key_value_heads at its top level"):
        ModelShape.from_hf_config(write(tmp_path, config))
