"""Tiny random-weight models of the rest of vLLM 0.32's registry that its CPU build runs
(issue 58's walk: every text-generation architecture transformers 5 can write, and those vLLM
runs through its Transformers backend), written like ``families.FAMILIES`` (transformers' own
config and model classes, weights scaled up). Each builder takes the shared config (hidden
256, 2 layers, 4 heads, 2 KV heads of 64, intermediate 512, vocab 512, 1024 positions).

What did not run on vLLM 0.32's CPU build (its own errors, with no connector): DBRX (its
loader: ``KeyError 'blocks.0.ffn.experts.w13_weight'``), MiniMax-M2 as published (sigmoid
routing: the CPU router asserts softmax; a softmax variant runs, ``minimax-m2-softmax``),
OLMo-Hybrid (``triton`` has no ``set_allocator``), Mamba1, Jamba and Qwen3.5 (see the
serving guide); GPTBigCode runs at TP 1 only (at TP 2 a worker dies of a segfault)."""

from __future__ import annotations

from typing import Any

from families import WINDOW, Family, _family, _loud_attention

S, F = "sliding_attention", "full_attention"
#: MoE sizes: 4 experts, 2 a token, experts of 128.
MOE = {"num_experts_per_tok": 2}
EXPERT = 128


def _t() -> Any:
    import transformers

    return transformers


def _no_head_dim(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "head_dim"}


# --- the named families -------------------------------------------------------------


def _gpt_oss(config: dict[str, Any]) -> Any:
    t = _t()
    # vLLM's gpt_oss.py slides on even layers (layer_idx % 2 == 0) and reads the yarn keys.
    return t.GptOssForCausalLM(t.GptOssConfig(
        **{**config, "intermediate_size": EXPERT}, num_local_experts=4, **MOE,
        sliding_window=WINDOW, layer_types=[S, F],
    ))  # fmt: skip


def _cohere2(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Cohere2ForCausalLM(t.Cohere2Config(
        **config, sliding_window=WINDOW, layer_types=[S, F], logit_scale=1.0,
    ))  # fmt: skip


def _exaone4(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Exaone4ForCausalLM(t.Exaone4Config(
        **config, sliding_window=WINDOW, sliding_window_pattern=2, layer_types=[S, F],
    ))  # fmt: skip


def _olmo(config: dict[str, Any]) -> Any:
    t = _t()
    return t.OlmoForCausalLM(t.OlmoConfig(**config))


def _olmo2(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Olmo2ForCausalLM(t.Olmo2Config(**config))


def _olmo3(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Olmo3ForCausalLM(t.Olmo3Config(**config, sliding_window=WINDOW, layer_types=[S, F]))


def _phi3(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Phi3ForCausalLM(t.Phi3Config(**config, pad_token_id=0))


def _phi(config: dict[str, Any]) -> Any:
    t = _t()
    return t.PhiForCausalLM(t.PhiConfig(**config))


# --- MoE ------------------------------------------------------------------------------------


def _mixtral(config: dict[str, Any]) -> Any:
    t = _t()
    return t.MixtralForCausalLM(t.MixtralConfig(
        **{**config, "intermediate_size": EXPERT}, num_local_experts=4, **MOE,
    ))  # fmt: skip


def _qwen2_moe(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Qwen2MoeForCausalLM(t.Qwen2MoeConfig(
        **config, num_experts=4, **MOE, moe_intermediate_size=EXPERT,
        shared_expert_intermediate_size=EXPERT,
    ))  # fmt: skip


def _qwen3_moe(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(
        **config, num_experts=4, **MOE, moe_intermediate_size=EXPERT,
    ))  # fmt: skip


def _olmoe(config: dict[str, Any]) -> Any:
    t = _t()
    return t.OlmoeForCausalLM(t.OlmoeConfig(
        **{**config, "intermediate_size": EXPERT}, num_experts=4, **MOE,
    ))  # fmt: skip


def _granite_moe(config: dict[str, Any]) -> Any:
    t = _t()
    return t.GraniteMoeForCausalLM(t.GraniteMoeConfig(
        **{**config, "intermediate_size": EXPERT}, num_local_experts=4, **MOE,
    ))  # fmt: skip


def _glm4_moe(config: dict[str, Any]) -> Any:
    t = _t()
    # Layer 0 dense, layer 1 MoE (4 routed experts and one shared).
    return t.Glm4MoeForCausalLM(t.Glm4MoeConfig(
        **config, n_routed_experts=4, **MOE, moe_intermediate_size=EXPERT, n_shared_experts=1,
        first_k_dense_replace=1, num_nextn_predict_layers=0,
    ))  # fmt: skip


def _ernie45_moe(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Ernie4_5_MoeForCausalLM(t.Ernie4_5_MoeConfig(
        **config, moe_num_experts=4, moe_k=2, moe_intermediate_size=EXPERT,
        moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=1,
        tie_word_embeddings=False,
    ))  # fmt: skip


def _lfm2_moe(config: dict[str, Any]) -> Any:
    t = _t()
    # As families._lfm2: two convs and two attention layers; the first layer dense.
    return t.Lfm2MoeForCausalLM(t.Lfm2MoeConfig(
        **{**config, "num_hidden_layers": 4},
        layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3,
        num_dense_layers=1, num_experts=4, **MOE, moe_intermediate_size=EXPERT,
    ))  # fmt: skip


# --- the rest -------------------------------------------------------------------------------


def _simple(cls: str, cfg: str, **extra: Any) -> Any:
    def build(config: dict[str, Any]) -> Any:
        t = _t()
        return getattr(t, cls)(getattr(t, cfg)(**{**config, **extra}))

    build.__name__ = f"_{cls}"
    return build


_qwen2 = _simple("Qwen2ForCausalLM", "Qwen2Config")
_qwen3 = _simple("Qwen3ForCausalLM", "Qwen3Config")
_granite = _simple("GraniteForCausalLM", "GraniteConfig")
_stablelm = _simple("StableLmForCausalLM", "StableLmConfig")
_nemotron = _simple("NemotronForCausalLM", "NemotronConfig")
_glm4 = _simple("Glm4ForCausalLM", "Glm4Config", pad_token_id=0)
_glm = _simple("GlmForCausalLM", "GlmConfig", pad_token_id=0)
_ernie45 = _simple("Ernie4_5ForCausalLM", "Ernie4_5Config", tie_word_embeddings=False)
_apertus = _simple("ApertusForCausalLM", "ApertusConfig")
_seed_oss = _simple("SeedOssForCausalLM", "SeedOssConfig")
_smollm3 = _simple("SmolLM3ForCausalLM", "SmolLM3Config", tie_word_embeddings=False,
                   no_rope_layers=[1, 0], pad_token_id=0)  # fmt: skip
_starcoder2 = _simple("Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=WINDOW,
                      tie_word_embeddings=False)  # fmt: skip
# GPT-NeoX is MHA: a num_key_value_heads of 2 left in its config makes vLLM's Transformers
# backend size a 2-head cache for 4-head keys (segfault in cpu_attn reshape_and_cache).
_gpt_neox = _simple("GPTNeoXForCausalLM", "GPTNeoXConfig", num_key_value_heads=4)
_ministral3 = _simple("Ministral3ForCausalLM", "Ministral3Config", sliding_window=WINDOW)
_arcee = _simple("ArceeForCausalLM", "ArceeConfig")
_granite_swa = _simple("GraniteSWAForCausalLM", "GraniteSWAConfig", sliding_window=WINDOW,
                       layer_types=[S, F], layer_rope_theta=[10000.0, 10000.0],
                       tie_word_embeddings=False)  # fmt: skip
_granite_moe_shared = _simple("GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig",
                              intermediate_size=EXPERT, num_local_experts=4,
                              shared_intermediate_size=EXPERT, **MOE)  # fmt: skip
_cohere = _simple("CohereForCausalLM", "CohereConfig", logit_scale=1.0)


def _gemma(config: dict[str, Any]) -> Any:
    t = _t()
    return _loud_attention(t.GemmaForCausalLM(t.GemmaConfig(**config)))


def _gpt2(config: dict[str, Any]) -> Any:
    t = _t()
    return t.GPT2LMHeadModel(t.GPT2Config(
        vocab_size=config["vocab_size"], n_positions=config["max_position_embeddings"],
        n_embd=config["hidden_size"], n_layer=2, n_head=config["num_attention_heads"],
        n_inner=config["intermediate_size"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    ))  # fmt: skip


def _gpt_bigcode(config: dict[str, Any]) -> Any:
    t = _t()
    # multi_query=False: 4 KV heads (the MQA variant has 1).
    return t.GPTBigCodeForCausalLM(t.GPTBigCodeConfig(
        vocab_size=config["vocab_size"], n_positions=config["max_position_embeddings"],
        n_embd=config["hidden_size"], n_layer=2, n_head=config["num_attention_heads"],
        n_inner=config["intermediate_size"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        multi_query=False,
    ))  # fmt: skip


def _gptj(config: dict[str, Any]) -> Any:
    t = _t()
    return t.GPTJForCausalLM(t.GPTJConfig(
        vocab_size=config["vocab_size"], n_positions=config["max_position_embeddings"],
        n_embd=config["hidden_size"], n_layer=2, n_head=config["num_attention_heads"],
        rotary_dim=32, n_inner=config["intermediate_size"],
    ))  # fmt: skip


def _bloom(config: dict[str, Any]) -> Any:
    t = _t()
    return t.BloomForCausalLM(t.BloomConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], n_layer=2,
        n_head=config["num_attention_heads"],
    ))  # fmt: skip


def _opt(config: dict[str, Any]) -> Any:
    t = _t()
    return t.OPTForCausalLM(t.OPTConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_hidden_layers=2,
        ffn_dim=config["intermediate_size"],
        max_position_embeddings=config["max_position_embeddings"],
        num_attention_heads=config["num_attention_heads"],
        word_embed_proj_dim=config["hidden_size"], dropout=0.0,
    ))  # fmt: skip


def _falcon(config: dict[str, Any]) -> Any:
    t = _t()
    # The new decoder architecture (Falcon-40B/180B): grouped KV heads.
    return t.FalconForCausalLM(t.FalconConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_hidden_layers=2,
        num_attention_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"], new_decoder_architecture=True,
        multi_query=False, parallel_attn=True,
        # vLLM's falcon.py sizes its MLP 4 * hidden whatever ffn_hidden_size says.
        ffn_hidden_size=4 * config["hidden_size"],
        max_position_embeddings=config["max_position_embeddings"],
    ))  # fmt: skip


def _llama4(config: dict[str, Any]) -> Any:
    t = _t()
    # Chunked attention on layer 0, full (no RoPE) on layer 1; MoE on both. vLLM asks the
    # chunk to be a multiple of the block size (32): chunks of 64.
    return t.Llama4ForCausalLM(t.Llama4TextConfig(
        **{**config, "intermediate_size": EXPERT},
        intermediate_size_mlp=config["intermediate_size"], num_local_experts=4,
        num_experts_per_tok=1, moe_layers=[0, 1], interleave_moe_layer_step=1,
        attention_chunk_size=64, no_rope_layers=[1, 0],
        layer_types=["chunked_attention", "full_attention"],
    ))  # fmt: skip


def _gemma3n(config: dict[str, Any]) -> Any:
    t = _t()
    return _loud_attention(t.Gemma3nForCausalLM(t.Gemma3nTextConfig(
        **{**config, "num_hidden_layers": 4, "intermediate_size": [512] * 4},
        sliding_window=WINDOW, layer_types=[S, F, S, F], num_kv_shared_layers=2,
        vocab_size_per_layer_input=config["vocab_size"], hidden_size_per_layer_input=32,
        laurel_rank=16, activation_sparsity_pattern=[0.0] * 4, altup_num_inputs=2,
    )))  # fmt: skip


def _gemma4(config: dict[str, Any]) -> Any:
    t = _t()
    return _loud_attention(t.Gemma4ForCausalLM(t.Gemma4TextConfig(
        **config, sliding_window=WINDOW, layer_types=[S, F], per_layer_config={},
        vocab_size_per_layer_input=config["vocab_size"], hidden_size_per_layer_input=32,
    )))  # fmt: skip


def _minicpm3(config: dict[str, Any]) -> Any:
    t = _t()
    return t.MiniCPM3ForCausalLM(t.MiniCPM3Config(
        **{**config, "num_key_value_heads": 4, "head_dim": 96}, kv_lora_rank=128,
        q_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
    ))  # fmt: skip


def _minimax_m2_softmax(config: dict[str, Any]) -> Any:
    t = _t()
    # Not as published: softmax routing without a bias, which vLLM's CPU router takes
    # (published MiniMax-M2 routes by sigmoid with a correction bias: cpu_router asserts softmax).
    model = t.MiniMaxM2ForCausalLM(t.MiniMaxM2Config(
        **{**config, "intermediate_size": EXPERT}, num_local_experts=4, **MOE,
        rotary_dim=32, scoring_func="softmax", use_routing_bias=False,
    ))  # fmt: skip
    for layer in model.model.layers:  # vLLM has no bias parameter without use_routing_bias
        del layer.mlp._buffers["e_score_correction_bias"]
    return model


def _zamba2(config: dict[str, Any]) -> Any:
    t = _t()
    return t.Zamba2ForCausalLM(t.Zamba2Config(
        # vLLM's zamba2.py builds its shared attention with as many KV heads as heads
        # (published Zamba2 is MHA); its head dim is 2 * hidden / heads (128). vLLM names the
        # hybrid layers' attention model.attn.0, 1, 2 (layers 1, 2, 4) and every mixer
        # {3 + i}.mixer. One shared block: with two (as published), vLLM 0.32's CPU build
        # decodes 2 of 9 prompts otherwise at TP 2 than at TP 1 on its own, no connector
        # (other first tokens), so TP 1 is no oracle for a pair from TP 2.
        **{**_no_head_dim(config), "num_hidden_layers": 5, "num_key_value_heads": 4},
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid"], mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=8, chunk_size=64,
        num_mem_blocks=1, use_mem_rope=True,
    ))  # fmt: skip


BUILDERS: dict[str, tuple[Any, dict[str, Any]]] = {
    # name: (builder, Family kwargs)
    "gpt-oss": (_gpt_oss, {"kinds": ("window", "attention")}),
    "cohere2": (_cohere2, {"kinds": ("window", "attention")}),
    "exaone4": (_exaone4, {"kinds": ("window", "attention")}),
    "olmo": (_olmo, {}),
    "olmo2": (_olmo2, {}),
    "olmo3": (_olmo3, {"kinds": ("window", "attention")}),
    "phi3": (_phi3, {}),
    "phi": (_phi, {}),
    "mixtral": (_mixtral, {}),
    "qwen2-moe": (_qwen2_moe, {}),
    "qwen3-moe": (_qwen3_moe, {}),
    "olmoe": (_olmoe, {}),
    "granite-moe": (_granite_moe, {}),
    "glm4-moe": (_glm4_moe, {}),
    "ernie45-moe": (_ernie45_moe, {}),
    "minimax-m2-softmax": (_minimax_m2_softmax, {}),
    "lfm2-moe": (_lfm2_moe, {"kinds": ("state", "attention")}),
    "qwen2": (_qwen2, {}),
    "qwen3": (_qwen3, {}),
    "gemma": (_gemma, {"scale": 8.0}),
    "cohere": (_cohere, {}),
    "granite": (_granite, {}),
    "stablelm": (_stablelm, {}),
    "gpt2": (_gpt2, {}),
    "gptj": (_gptj, {}),
    "bloom": (_bloom, {}),
    "opt": (_opt, {}),
    "falcon": (_falcon, {}),
    "nemotron": (_nemotron, {}),
    "glm4": (_glm4, {}),
    "ernie45": (_ernie45, {}),
    "apertus": (_apertus, {}),
    "llama4": (_llama4, {"kinds": ("window", "attention")}),
    "gemma3n": (_gemma3n, {"kinds": ("window", "attention"), "scale": 8.0}),
    "gemma4": (_gemma4, {"kinds": ("window", "attention"), "scale": 8.0}),
    "minicpm3": (_minicpm3, {}),
    "granite-swa": (_granite_swa, {"kinds": ("window", "attention")}),
    "granite-moe-shared": (_granite_moe_shared, {}),
    "ministral3": (_ministral3, {"kinds": ("window",)}),
    "starcoder2": (_starcoder2, {"kinds": ("window",)}),
    "gpt-neox": (_gpt_neox, {}),
    "gpt-bigcode": (_gpt_bigcode, {}),
    "smollm3": (_smollm3, {}),
    "seed-oss": (_seed_oss, {}),
    "glm": (_glm, {}),
    "arcee": (_arcee, {}),
    # mamba_ngroups 1 below TP 2: B and C (2 x mamba_d_state channels) copied to each rank.
    "zamba2": (_zamba2, {"kinds": ("state", "attention"), "copied_channels": 2 * 16}),
}

REGISTRY: dict[str, Family] = {n: _family(n, b, **kw) for n, (b, kw) in BUILDERS.items()}
