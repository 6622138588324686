"""Models read from config.json files written here from the published values (awkward parts
included: bare Infinity, text_config, no head_dim), each layer pattern held to a count made by
hand, and cache sizes held to the bytes of numpy arrays shaped as runtimes allocate them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdplan import (
    MODEL_PRESETS,
    AttentionLayer,
    AttentionMamba2Layer,
    GatedDeltaNetLayer,
    Mamba1Layer,
    Mamba2Layer,
    MlaLayer,
    MlpLayer,
    ModelShape,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
)

NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def write(tmp_path: Path, config: dict[str, Any], infinity: bool = False) -> Path:
    """A config.json; with `infinity`, `time_step_limit` holds a bare Infinity, as Python's
    json writes it (and Nemotron-H's and Mamba2's published configs hold)."""
    text = json.dumps(config, indent=2)
    if infinity:
        text = text.replace('"time_step_limit": null', '"time_step_limit": [0.0, Infinity]')
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


def not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


CONFIGS: dict[str, tuple[dict[str, Any], bool]] = {
    "nemotron-h-8b": (
        {
            "model_type": "nemotron_h",
            "num_hidden_layers": 52,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attention_head_dim": 128,
            "mamba_num_heads": 128,
            "mamba_head_dim": 64,
            "ssm_state_size": 128,
            "n_groups": 8,
            "conv_kernel": 4,
            "expand": 2,
            "hybrid_override_pattern": NEMOTRON_H_8B,
            "time_step_limit": None,
            "torch_dtype": "bfloat16",
        },
        True,
    ),
    "jamba-1.5-mini": (
        {
            "model_type": "jamba",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "torch_dtype": "bfloat16",
        },
        False,
    ),
    "qwen3-next-80b-a3b": (
        {
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
        False,
    ),
    "gpt-oss-20b": (
        {
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
        False,
    ),
    "gemma-3-27b": (
        {
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "num_hidden_layers": 62,
                "hidden_size": 5376,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "head_dim": 128,
                "sliding_window": 1024,
            },
            "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
            "torch_dtype": "bfloat16",
        },
        False,
    ),
    "deepseek-v3.2": (
        {
            "model_type": "deepseek_v32",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "index_head_dim": 128,
            "index_n_heads": 64,
            "torch_dtype": "bfloat16",
        },
        False,
    ),
    "falcon-h1-7b": (
        {
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
        False,
    ),
    "mamba-codestral-7b": (
        {
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
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configs_written_from_published_values_read_as_their_presets(
    tmp_path: Path, name: str
) -> None:
    config, infinity = CONFIGS[name]
    path = write(tmp_path, config, infinity)
    if infinity:
        assert "Infinity]" in path.read_text()
        with pytest.raises(ValueError, match="Infinity"):  # not JSON: strict parsers refuse it
            json.loads(path.read_text(), parse_constant=not_json)
    assert ModelShape.from_hf_config(path) == ModelShape.preset(name)


def kinds(shape: ModelShape) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, layer in enumerate(shape.model_layers):
        window = getattr(layer, "sliding_window", None)
        chunk = getattr(layer, "attention_chunk_size", None)
        key = f"{layer.kind}:{window}" if window else layer.kind
        key = f"{key}:chunk{chunk}" if chunk else key
        out.setdefault(key, []).append(i)
    return out


#: Each preset's layers by kind, counted by hand from the published patterns.
HAND_COUNTS: dict[str, dict[str, list[int]]] = {
    "llama-3-8b": {"attention": list(range(32))},
    "llama-3-70b": {"attention": list(range(80))},
    "llama-3-70b-eagle": {"attention": list(range(80))},
    "qwen2.5-32b": {"attention": list(range(64))},  # sliding_window named, use_sliding_window off
    "qwen3-235b-a22b": {"attention": list(range(94))},
    # Every fourth layer (3, 7, ..., 47) is full attention: 12 of 48.
    "qwen3-next-80b-a3b": {
        "gated_deltanet": [i for i in range(48) if i % 4 != 3],
        "attention": [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47],
    },
    "deepseek-v3": {"mla": list(range(61))},
    "deepseek-v3.2": {"mla": list(range(61))},
    # M-M-M-M*-M-M-M-M-M*-...: attention at 7, 18, 29, 40; MLP at every '-'.
    "nemotron-h-8b": {
        "mamba2": [
            0,
            2,
            4,
            6,
            9,
            11,
            13,
            15,
            17,
            20,
            22,
            24,
            26,
            28,
            31,
            33,
            35,
            37,
            39,
            42,
            44,
            46,
            48,
            50,
        ],
        "mlp": [
            1,
            3,
            5,
            8,
            10,
            12,
            14,
            16,
            19,
            21,
            23,
            25,
            27,
            30,
            32,
            34,
            36,
            38,
            41,
            43,
            45,
            47,
            49,
            51,
        ],
        "attention": [7, 18, 29, 40],
    },
    # 118 layers: 54 Mamba2, 54 MLP, 10 attention (NVIDIA's counts).
    "nemotron-h-56b": {
        "attention": [7, 18, 29, 40, 51, 62, 73, 84, 95, 106],
    },
    # attn_layer_period 8, offset 4: layers 4, 12, 20, 28.
    "jamba-1.5-mini": {
        "mamba1": [i for i in range(32) if i not in (4, 12, 20, 28)],
        "attention": [4, 12, 20, 28],
    },
    "gpt-oss-20b": {"attention:128": list(range(0, 24, 2)), "attention": list(range(1, 24, 2))},
    "gpt-oss-120b": {"attention:128": list(range(0, 36, 2)), "attention": list(range(1, 36, 2))},
    # Five local layers, then a global one: 5, 11, ..., 59 (10 of 62).
    "gemma-3-27b": {
        "attention:1024": [i for i in range(62) if i % 6 != 5],
        "attention": [5, 11, 17, 23, 29, 35, 41, 47, 53, 59],
    },
    "falcon-h1-7b": {"attention_mamba2": list(range(44))},
    "mamba-codestral-7b": {"mamba2": list(range(64))},
    # 31 blocks without attention: 40-46, 48-54, 56-62, 64-70, 72, 74, 76.
    "llama-3.3-nemotron-super-49b": {
        "attention": [
            *range(40),
            47,
            55,
            63,
            71,
            73,
            75,
            77,
            78,
            79,
        ],
        "mlp": [*range(40, 47), *range(48, 55), *range(56, 63), *range(64, 71), 72, 74, 76],
    },
    # Every fourth layer (3, 7, ..., 47) NoPE and full; the rest chunked.
    "llama-4-scout": {
        "attention:chunk8192": [i for i in range(48) if i % 4 != 3],
        "attention": [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47],
    },
    "gemma-4-31b": {
        "attention:1024": [i for i in range(60) if i % 6 != 5],
        "attention": [5, 11, 17, 23, 29, 35, 41, 47, 53, 59],
    },
    # Layers 15-34 share KV with earlier layers.
    "gemma-4-e2b": {
        "attention:512": [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13],
        "attention": [4, 9, 14],
        "shared_kv": list(range(15, 35)),
    },
    "granite-4.0-h-small": {
        "mamba2": [i for i in range(40) if i not in (5, 15, 25, 35)],
        "attention": [5, 15, 25, 35],
    },
    "qwen3.5-27b": {
        "gated_deltanet": [i for i in range(64) if i % 4 != 3],
        "attention": list(range(3, 64, 4)),
    },
}


def test_every_preset_has_a_hand_count() -> None:
    assert set(HAND_COUNTS) == set(MODEL_PRESETS)


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_preset_layer_patterns_match_the_hand_count(name: str) -> None:
    shape = ModelShape.preset(name)
    got = kinds(shape)
    want = HAND_COUNTS[name]
    for kind, layers in want.items():
        assert got[kind] == layers, kind
    if name == "nemotron-h-56b":
        assert shape.num_layers == 118
        assert (len(got["mamba2"]), len(got["mlp"])) == (54, 54)
    else:
        assert got.keys() == want.keys()
    # The summary reads the same back, kind by kind.
    summary = {s.label: list(s.layers) for s in shape.summary()}
    assert sum(len(v) for k, v in summary.items() if not k.startswith("draft")) == shape.num_layers


def test_head_dim_absent_or_named_attention_head_dim(tmp_path: Path) -> None:
    jamba = ModelShape.from_hf_config(write(tmp_path, CONFIGS["jamba-1.5-mini"][0]))
    assert jamba.model_layers[4] == AttentionLayer(kv_heads=8, head_dim=4096 // 32)
    nemotron = ModelShape.preset("nemotron-h-8b")
    assert nemotron.model_layers[7] == AttentionLayer(kv_heads=8, head_dim=128)
    assert nemotron.model_layers[0] == Mamba2Layer(
        heads=128, head_dim=64, state_size=128, groups=8, conv_kernel=4
    )
    assert ModelShape.preset("falcon-h1-7b").model_layers[0] == AttentionMamba2Layer(
        AttentionLayer(2, 128), Mamba2Layer(24, 128, 256, 1, 4)
    )
    assert ModelShape.preset("jamba-1.5-mini").model_layers[0] == Mamba1Layer(8192, 16, 4)
    assert ModelShape.preset("qwen3-next-80b-a3b").model_layers[0] == GatedDeltaNetLayer(
        16, 32, 128, 128, 4
    )
    assert ModelShape.preset("deepseek-v3.2").model_layers[0] == MlaLayer(512, 64, 128)
    # As JSON (the command's header), each layer names its kind.
    written = json.loads(ModelShape.preset("falcon-h1-7b").to_json())["layer_kinds"]
    assert written[0]["kind"] == "attention_mamba2" and written[0]["mamba"]["heads"] == 24


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Keys of other families' layer patterns: refused by name, never read as a stack.
        ({"layers_block_type": ["mamba", "attention"]}, "config.json has layers_block_type, which"),
        ({"attn_layer_indices": [3, 7]}, "config.json has attn_layer_indices, which"),
        ({"attention_chunk_size": 8192}, "families that read it: llama4"),
        ({"hybrid_override_pattern": "*?"}, "config.json has hybrid_override_pattern"),
        ({"mamba_d_state": 16}, "config.json has mamba_d_state, which"),
        ({"full_attention_interval": 2}, "config.json has full_attention_interval"),
        ({"layer_types": ["full_attention", "mamba"]}, r'layer_types\[1\] is "mamba"'),
        ({"layer_types": ["full_attention"]}, "lists 1 layers but the model has 2"),
        ({"layer_types": ["sliding_attention"] * 2}, "no positive sliding_window"),
        ({"num_hidden_layers": "2"}, "non-negative integer"),
        (
            {
                "architectures": ["Mamba2ForCausalLM"],
                "num_heads": 4,
                "head_dim": 32,
                "state_size": 16,
                "conv_kernel": 4,
                "expand": 3,
            },
            r"inner size is 768 \(expand 3 x hidden_size 256\), but 4 heads x head dim 32 make 128",
        ),
    ],
)
def test_configs_pdplan_cannot_read_are_refused_by_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        **change,
    }
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        ModelShape.from_hf_config(write(tmp_path, config))


def test_a_sliding_window_pattern_key_makes_the_pattern_whatever_the_model_type(
    tmp_path: Path,
) -> None:
    # Cohere 2's published shape: three sliding layers, then a global one.
    config = {
        "architectures": ["Cohere2ForCausalLM"],
        "model_type": "cohere2",
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
    }
    got = kinds(ModelShape.from_hf_config(write(tmp_path, config)))
    # A sliding layer sees [pos - 4096, pos]: vLLM's commandr.py keeps 4097 tokens.
    assert got == {"attention:4097": [0, 1, 2, 4, 5, 6], "attention": [3, 7]}


def test_not_json_at_all_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 2,')
    with pytest.raises(UnsupportedPDLayoutError, match="not valid JSON"):
        ModelShape.from_hf_config(path)


def bf16(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float16)  # two bytes a value, as bfloat16


def layer_items(
    layer: Any, tp: int, kv_cache_dtype: str | None = None, state_dtype: str | None = None
) -> list[int]:
    shape = ModelShape(
        layer_kinds=(layer,), page_size=16, kv_cache_dtype=kv_cache_dtype, state_dtype=state_dtype
    )
    prefill, _ = model_buffer_layouts(shape, tp, tp)
    return [b.item_stride_bytes for b in prefill]


def test_state_sizes_are_the_arrays_runtimes_allocate() -> None:
    """One rank's per-request state as vLLM shapes it: SSM or recurrent state in the state
    dtype (float32 here), conv states `[channels, kernel - 1]` in the model's."""
    f32 = np.float32
    # Mamba2 at TP 2: heads 8, head dim 4, state 16, 2 groups, kernel 4.
    mamba2 = Mamba2Layer(heads=8, head_dim=4, state_size=16, groups=2, conv_kernel=4)
    ssm = np.zeros((8 // 2, 4, 16), dtype=f32)
    conv = bf16((8 * 4 + 2 * 2 * 16) // 2, 3)
    assert layer_items(mamba2, 2, state_dtype="float32") == [ssm.nbytes, conv.nbytes]
    # Mamba1 (Jamba) at TP 4: inner 64, state 16, kernel 4.
    ssm = np.zeros((64 // 4, 16), dtype=f32)
    assert layer_items(Mamba1Layer(64, 16, 4), 4, state_dtype="float32") == [
        ssm.nbytes,
        bf16(64 // 4, 3).nbytes,
    ]
    # Gated DeltaNet at TP 2: 4 key heads of 8, 8 value heads of 16, kernel 4.
    gdn = GatedDeltaNetLayer(4, 8, 8, 16, 4)
    recurrent = np.zeros((8 // 2, 8, 16), dtype=f32)
    conv = bf16((4 * 8 * 2 + 8 * 16) // 2, 3)
    assert layer_items(gdn, 2, state_dtype="float32") == [recurrent.nbytes, conv.nbytes]


def test_kv_cache_dtypes_size_values_in_bits() -> None:
    attention = AttentionLayer(kv_heads=4, head_dim=64)
    # fp8: a byte a value; K and V of 2 heads x 16 tokens x 64 values at TP 2.
    assert layer_items(attention, 2, kv_cache_dtype="fp8") == [2 * 16 * 64] * 2
    # NVFP4: two values a byte, then one fp8 scale per 16 values, as their own K and V buffers.
    assert layer_items(attention, 2, kv_cache_dtype="nvfp4") == [2 * 16 * 32] * 2 + [2 * 16 * 4] * 2
    with pytest.raises(UnsupportedPDLayoutError, match="scale blocks"):
        layer_items(AttentionLayer(4, 24), 2, kv_cache_dtype="nvfp4")
    with pytest.raises(UnsupportedPDLayoutError, match="whole bytes"):
        layer_items(AttentionLayer(4, 3), 2, kv_cache_dtype="nvfp4")
    # FlashMLA's FP8 latent is 656 bytes a token; the indexer's keys 128 fp8 + a fp32 scale.
    mla = MlaLayer(kv_lora_rank=512, rope_head_dim=64, index_head_dim=128)
    assert layer_items(mla, 8, kv_cache_dtype="fp8") == [16 * 656, 16 * 132]
    assert layer_items(mla, 8) == [16 * (512 + 64) * 2, 16 * 132]
    with pytest.raises(UnsupportedPDLayoutError, match="MLA has no nvfp4 cache layout"):
        layer_items(mla, 8, kv_cache_dtype="nvfp4")
    # vLLM's "auto" is the model's dtype; an unknown name is refused.
    assert layer_items(attention, 2, kv_cache_dtype="auto") == layer_items(attention, 2)
    with pytest.raises(UnsupportedPDLayoutError, match="kv_cache_dtype: unknown dtype"):
        layer_items(attention, 2, kv_cache_dtype="fp6")


def test_layer_objects_that_are_not_what_they_say_are_refused() -> None:
    from types import SimpleNamespace

    def shape(*layers: object) -> ModelShape:
        return ModelShape(layer_kinds=layers)  # type: ignore[arg-type]

    with pytest.raises(UnsupportedPDLayoutError, match='unknown layer kind "ssm"'):
        model_buffer_layouts(shape(SimpleNamespace(kind="ssm")), 1, 1)
    with pytest.raises(UnsupportedPDLayoutError, match='needs a "head_dim" field'):
        model_buffer_layouts(shape(SimpleNamespace(kind="attention", kv_heads=2)), 1, 1)
    # A parallel layer whose part is itself: refused by kind, not followed forever.
    odd = SimpleNamespace(kind="attention_mamba2")
    odd.attention = odd
    with pytest.raises(UnsupportedPDLayoutError, match="must be a attention layer"):
        model_buffer_layouts(shape(odd), 1, 1)
    wrong = AttentionMamba2Layer(AttentionLayer(2, 8), AttentionLayer(2, 8))  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="must be a mamba2 layer"):
        model_buffer_layouts(shape(wrong), 1, 1)
    # NVFP4 is a KV cache format only.
    nemotron = ModelShape.preset("nemotron-h-8b")
    for odd_dtypes in (replace(nemotron, dtype="nvfp4"), replace(nemotron, state_dtype="nvfp4")):
        with pytest.raises(UnsupportedPDLayoutError, match="give it as kv_cache_dtype"):
            model_buffer_layouts(odd_dtypes, 1, 1)


def test_layer_kinds_and_the_uniform_form_are_one_or_the_other() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="not both"):
        model_buffer_layouts(
            ModelShape(layers=2, kv_heads=4, head_dim=8, layer_kinds=(MlpLayer(),)), 1, 1
        )
    uniform = ModelShape(layers=3, kv_heads=4, head_dim=8)
    assert uniform.model_layers == (AttentionLayer(4, 8),) * 3
    listed = replace(uniform, layers=0, kv_heads=0, head_dim=0, layer_kinds=uniform.model_layers)
    assert model_buffer_layouts(listed, 2, 1) == model_buffer_layouts(uniform, 2, 1)


def test_sliding_windows_reach_the_buffers_and_turn_token_maps_on() -> None:
    from pdplan import ParallelLayout, PDTransferPlanner

    shape = ModelShape.preset("gpt-oss-20b")
    prefill, decode = model_buffer_layouts(shape, 8, 2)
    assert [b.sliding_window for b in prefill[:4]] == [128, 128, None, None]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    assert planner.token_maps
    fragments = planner.transfer_fragments(0)[0]
    assert {f.sliding_window for f in fragments} == {128, None}
    with pytest.raises(UnsupportedPDLayoutError, match="sliding windows differ"):
        PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", 8),
            decode_layout=ParallelLayout("decode", 2),
            prefill_buffers=prefill,
            decode_buffers=(replace(decode[0], sliding_window=64), *decode[1:]),
        )


LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("quantization", "side_file", "kv_cache_dtype"),
    [
        # ModelOpt 0.31 and later: the KV algorithm in config.json's quantization_config.
        ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, None,
         "float8_e4m3fn"),
        # ModelOpt's newer scheme form (8-bit float, static scales).
        ({"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 8,
          "type": "float"}}, None, "float8_e4m3fn"),
        # ModelOpt 0.29 and older: an hf_quant_config.json beside a config without one.
        (None, {"producer": {"name": "modelopt", "version": "0.19.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
         "float8_e4m3fn"),
        (None, {"producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None}}, None),
        # llm-compressor (compressed-tensors) with a KV scheme: vLLM's Attention caches fp8.
        ({"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8,
          "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}, None,
         "float8_e4m3fn"),
        ({"quant_method": "compressed-tensors", "kv_cache_scheme": None}, None, None),
        # FP8 weights alone leave vLLM's auto cache at the model's dtype.
        ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}, None, None),
    ],
)  # fmt: skip
def test_a_quantized_export_reports_its_cache_dtype_as_vllm_resolves_auto(
    tmp_path: Path,
    quantization: dict[str, Any] | None,
    side_file: dict[str, Any] | None,
    kv_cache_dtype: str | None,
) -> None:
    """vLLM 0.32: utils/torch_utils.py get_kv_cache_quant_algo_string and
    resolve_kv_cache_dtype_string (ModelOpt), transformers_utils/config.py (hf_quant_config.json
    when config.json has no quantization_config), model_executor/layers/attention/attention.py
    (compressed-tensors' kv_cache_scheme makes the cache fp8)."""
    config = dict(LLAMA_8B)
    if quantization is not None:
        config["quantization_config"] = quantization
    folder = tmp_path / "model"
    folder.mkdir()
    write(folder, config)
    if side_file is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(side_file))
    shape = ModelShape.from_hf_config(folder)
    assert shape.kv_cache_dtype == kv_cache_dtype
    assert shape.dtype == "bfloat16"
    # K and V of 8 KV heads x 128 a token: a byte a value in fp8, two in bf16.
    token = shape.summary()[0].token_bytes
    assert token == 2 * 8 * 128 * (1 if kv_cache_dtype else 2)
    # kv_cache_dtype= still overrides what the export implies.
    assert replace(shape, kv_cache_dtype="bfloat16").summary()[0].token_bytes == 4096


def test_a_config_file_given_directly_reads_the_quant_file_beside_it(tmp_path: Path) -> None:
    write(tmp_path, LLAMA_8B)
    side = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8",
            "kv_cache_quant_algo": "FP8"}}  # fmt: skip
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(side))
    assert ModelShape.from_hf_config(tmp_path / "config.json").kv_cache_dtype == "float8_e4m3fn"
    (tmp_path / "hf_quant_config.json").write_text("[1, 2]")
    with pytest.raises(UnsupportedPDLayoutError, match=r"hf_quant_config\.json"):
        ModelShape.from_hf_config(tmp_path / "config.json")


def read_layers(tmp_path: Path, config: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each layer as (kind, KV heads, head dim, window), from a config written to disk."""
    shape = ModelShape.from_hf_config(write(tmp_path, config))
    return [
        (layer.kind, getattr(layer, "kv_heads", None), getattr(layer, "head_dim", None),
         getattr(layer, "sliding_window", None))
        for layer in shape.model_layers
    ]  # fmt: skip


BASE = {"num_hidden_layers": 4, "num_attention_heads": 32, "hidden_size": 4096}


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        # transformers 5.19 configuration_mistral.py L68, L80: 8 KV heads and a 4096 window
        # when omitted; vLLM llama.py applies a model-wide window to every layer.
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
         [("attention", 8, 128, 4096)] * 4),
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
          "sliding_window": None, "num_key_value_heads": None},
         [("attention", 32, 128, None)] * 4),
        # configuration_mixtral.py L72, L83: 8 KV heads, no window.
        ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"},
         [("attention", 8, 128, None)] * 4),
        # A Mistral 3 wrapper: text_config's model_type mistral (configuration_mistral3.py).
        ({"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
          "text_config": {**BASE, "model_type": "mistral", "sliding_window": None,
                          "head_dim": 128, "num_key_value_heads": 8}},
         [("attention", 8, 128, None)] * 4),
        # configuration_ernie4_5.py L69, L81: 2 KV heads, head dim 128 when omitted.
        ({"architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5"},
         [("attention", 2, 128, None)] * 4),
        # configuration_ernie4_5_moe.py L99: 4 KV heads; vLLM ernie45_moe.py L322: head_dim or
        # hidden / heads.
        ({"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe"},
         [("attention", 4, 128, None)] * 4),
        # configuration_voxtral.py L96-107: text defaults of 8 KV heads, head dim 128.
        ({"architectures": ["VoxtralForConditionalGeneration"], "model_type": "voxtral",
          "text_config": {**BASE, "model_type": "llama", "hidden_size": 3072}},
         [("attention", 8, 128, None)] * 4),
        # configuration_dots1.py L89, L108-125: 32 KV heads; sliding (4096 by default) from
        # max_window_layers on.
        ({"architectures": ["Dots1ForCausalLM"], "model_type": "dots1",
          "max_window_layers": 2},
         [("attention", 32, 128, None)] * 2 + [("attention", 32, 128, 4096)] * 2),
        # vLLM step3_text.py L237: one KV head; configs/step3_vl.py L59: head_dim 256.
        ({"architectures": ["Step3TextForCausalLM"], "model_type": "step3_text"},
         [("attention", 1, 256, None)] * 4),
        # configuration_seed_oss.py L67, L84: 8 KV heads, head dim 128 when omitted.
        ({"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss",
          "hidden_size": 5120},
         [("attention", 8, 128, None)] * 4),
        # configuration_starcoder2.py L66: 2 KV heads; a model-wide window on every layer
        # (vLLM engine/arg_utils.py: CacheConfig.sliding_window without layer_types).
        ({"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2",
          "sliding_window": 4096},
         [("attention", 2, 128, 4096)] * 4),
        # configuration_smollm3.py L77, L100-113: 4 KV heads; NoPE layers (every 4th) slide
        # when use_sliding_window and a window are set.
        ({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
          "use_sliding_window": True, "sliding_window": 512},
         [("attention", 4, 128, None)] * 3 + [("attention", 4, 128, 512)]),
        # vLLM's RWConfig (transformers_utils/configs/falcon.py L71-79): hidden_size 8192 is
        # the new decoder architecture, n_head_kv KV heads.
        ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb", "n_layer": 4,
          "n_head": 128, "n_head_kv": 8, "hidden_size": 8192},
         [("attention", 8, 64, None)] * 4),
        # The same class below 8192: multi_query (default True), one KV head.
        ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel", "n_layer": 4,
          "n_head": 71, "hidden_size": 4544},
         [("attention", 1, 64, None)] * 4),
    ],
)  # fmt: skip
def test_keys_a_file_omits_take_its_config_class_defaults(
    tmp_path: Path, config: dict[str, Any], layers: list[tuple[Any, ...]]
) -> None:
    # Wrappers name their sizes in text_config; RefinedWeb files under their own names.
    whole = config if "text_config" in config or "n_head" in config else {**BASE, **config}
    assert read_layers(tmp_path, whole) == layers


@pytest.mark.parametrize(
    ("architecture", "reason"),
    [
        ("BaiChuanForCausalLM", "0.23"),
        ("MllamaForConditionalGeneration", "0.10.2"),
    ],
)
def test_architectures_no_runtime_pdplan_reads_serves_are_refused_saying_why(
    tmp_path: Path, architecture: str, reason: str
) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=f"{architecture} is refused: .*{reason}"):
        ModelShape.from_hf_config(write(tmp_path, {**BASE, "architectures": [architecture]}))


@pytest.mark.parametrize(
    "architectures",
    [["Qwen2ForCausalLM"], ["Qwen2Model"], ["Qwen2ForRewardModel"],
     ["Qwen2AudioForConditionalGeneration"], None],
)  # fmt: skip
def test_qwen2_models_take_hidden_size_over_heads(
    tmp_path: Path, architectures: list[str] | None
) -> None:
    # vLLM qwen2.py Qwen2Attention: head_dim = hidden_size // heads, config.head_dim unread,
    # for every architecture vLLM runs on it (and a file naming only model_type qwen2).
    config: dict[str, Any] = {
        "model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 256,
    }  # fmt: skip
    if architectures:
        config["architectures"] = architectures
    assert read_layers(tmp_path, config) == [("attention", 8, 128, None)] * 2
    qwen3 = {**config, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert read_layers(tmp_path, qwen3) == [("attention", 8, 256, None)] * 2


def test_minimax_m3_without_sparse_layers_keeps_no_index_keys(tmp_path: Path) -> None:
    # vLLM minimax_m3 _sparse_attention_layer_ids: an empty config, or one without
    # sparse_attention_freq, names no sparse layer.
    config = {
        "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3_text",
        "num_hidden_layers": 4, "num_key_value_heads": 4, "head_dim": 128,
    }  # fmt: skip
    for setting in ({}, {"sparse_index_dim": 128}):
        shape = ModelShape.from_hf_config(
            write(tmp_path, {**config, "sparse_attention_config": setting})
        )
        assert [layer.index_head_dim for layer in shape.model_layers] == [0] * 4
    named = {"sparse_attention_freq": [0, 1, 1, 0]}
    with pytest.raises(UnsupportedPDLayoutError, match="sparse_index_dim"):
        ModelShape.from_hf_config(write(tmp_path, {**config, "sparse_attention_config": named}))


def test_step3p5_layers_of_the_other_type_take_its_heads(tmp_path: Path) -> None:
    # vLLM step3p5.py: the other setting's groups and head dim where layer_types names its
    # attention_type; without layer_types, even layers slide; head_dim else hidden / heads.
    config = {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "num_hidden_layers": 4,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_attention_groups": 8,
        "sliding_window": 512,
        "layer_types": ["full_attention", "sliding_attention"] * 2 + ["sliding_attention"],
        "attention_other_setting": {
            "attention_type": "sliding_attention",
            "num_attention_heads": 64,
            "num_attention_groups": 2,
            "head_dim": 64,
        },
    }
    assert read_layers(tmp_path, config) == [
        ("attention", 8, 128, None),
        ("attention", 2, 64, 512),
        ("attention", 8, 128, None),
        ("attention", 2, 64, 512),
    ]
    plain = {k: v for k, v in config.items() if k not in ("layer_types", "attention_other_setting")}
    assert (
        read_layers(tmp_path, plain)
        == [("attention", 8, 128, 512), ("attention", 8, 128, None)] * 2
    )
    with pytest.raises(UnsupportedPDLayoutError, match="att_impl_type"):
        read_layers(tmp_path, {**config, "att_impl_type": "MLA"})
    with pytest.raises(UnsupportedPDLayoutError, match="attention_type"):
        read_layers(tmp_path, {**config, "attention_other_setting": {"num_attention_groups": 2}})


def test_an_indexer_pattern_says_which_layers_keep_one(tmp_path: Path) -> None:
    # vLLM deepseek_v32/attention.py: index_topk_pattern[l] == "S" skips layer l's indexer;
    # layers past the pattern keep theirs. DeepSeek-V3.2 reads the same keys.
    config = {
        **BASE,
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "index_topk_pattern": "FSS",
    }
    shape = ModelShape.from_hf_config(write(tmp_path, config))
    kept = [layer.index_head_dim for layer in shape.model_layers]
    assert kept == [128, 0, 0, 128]
    listed = ModelShape.from_hf_config(
        write(tmp_path, {**config, "index_topk_pattern": ["F", "S"]})
    )
    assert [layer.index_head_dim for layer in listed.model_layers] == [128, 0, 128, 128]
    for bad, says in (("FXS", "'X'"), (["F", "SS"], "SS"), (3, "string")):
        with pytest.raises(UnsupportedPDLayoutError, match=says):
            ModelShape.from_hf_config(write(tmp_path, {**config, "index_topk_pattern": bad}))
    freq = {**config, "index_topk_pattern": None, "index_topk_freq": 2, "index_skip_topk_offset": 1}
    shape = ModelShape.from_hf_config(write(tmp_path, freq))
    # max(l - 1 + 1, 0) % 2: layers 0 and 2 keep theirs.
    assert [layer.index_head_dim for layer in shape.model_layers] == [128, 0, 128, 0]


def test_hunyuan_cross_layer_attention_is_refused_and_off_is_read(tmp_path: Path) -> None:
    config = {
        **BASE,
        "architectures": ["HunYuanMoEV1ForCausalLM"],
        "model_type": "hunyuan",
        "num_key_value_heads": 8,
        "attention_head_dim": 128,
        "cla_share_factor": 2,
    }
    assert read_layers(tmp_path, {**config, "use_cla": False}) == [("attention", 8, 128, None)] * 4
    with pytest.raises(UnsupportedPDLayoutError, match="use_cla"):
        read_layers(tmp_path, {**config, "use_cla": True})
    with pytest.raises(UnsupportedPDLayoutError, match="attention_head_dim 64"):
        read_layers(tmp_path, {**config, "attention_head_dim": 64})
