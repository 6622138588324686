//! The registry of model families: which reader a `config.json` is read by.
//!
//! A config's `architectures` (then its `model_type`, each also under `text_config`) selects
//! exactly one family, written for it from its modeling code (`readers/`); an architecture no
//! family covers is refused, naming it and the families that exist, unless the caller chooses
//! a family. Each family declares the cache keys (`cache_keys.rs`) it consumes: a config that
//! holds another is refused, naming the key.

use super::cache_keys::UNIVERSAL_KEYS;
use super::config::{Config, Parts};
use super::layers::Layer;
use super::readers::{attention as a, deepseek_v4, defaults as d, state as s};
use crate::error::{bail, quoted, PlanResult};

impl Family {
    /// Whether the family's reader consumes `key`: one it declares, or one every reader does.
    pub fn consumes(&self, key: &str) -> bool {
        self.keys.contains(&key) || UNIVERSAL_KEYS.contains(&key)
    }

    /// Whether the family declares `key` ignored by its modeling code.
    pub fn ignores(&self, key: &str) -> bool {
        self.ignored.iter().any(|(k, _)| *k == key)
    }

    /// Every cache key it consumes: its own, then the universal ones.
    pub fn consumed_keys(&self) -> Vec<&'static str> {
        self.keys.iter().chain(UNIVERSAL_KEYS).copied().collect()
    }
}

/// A family's reader: every layer of a model of `count` layers, in order.
pub type Reader = fn(&Config, u64) -> PlanResult<Vec<Layer>>;

/// One family of models that share a config format and a cache layout rule.
pub struct Family {
    pub name: &'static str,
    /// `architectures` entries it covers, exactly as configs spell them.
    pub architectures: &'static [&'static str],
    /// `model_type` values it covers (checked when no architecture matches).
    pub model_types: &'static [&'static str],
    /// The cache keys it consumes.
    pub keys: &'static [&'static str],
    /// Where its rule comes from.
    pub source: &'static str,
    pub read: Reader,
    /// Cache keys its configs hold that its modeling code never reads, each with the source
    /// that shows it: accepted, never read.
    pub ignored: &'static [(&'static str, &'static str)],
    /// The key whose list's length is the layer count, where the family's config class counts
    /// its layers by it (transformers' `NemotronHConfig.num_hidden_layers`).
    pub counted_by: Option<&'static str>,
}

const STATE_DTYPES: [&str; 2] = ["mamba_ssm_cache_dtype", "mamba_ssm_dtype"];

/// Keys of the standard attention layer.
macro_rules! keys {
    ($($key:expr),* $(,)?) => { &["num_key_value_heads", "head_dim", $($key),*] };
}

/// Keys without the standard attention pair.
macro_rules! own_keys {
    ($($key:expr),* $(,)?) => { &[$($key),*] };
}

pub const FAMILIES: &[Family] = &[
    Family {
        name: "llama",
        architectures: &[
            "LlamaForCausalLM",
            "LLaMAForCausalLM",
            "AquilaForCausalLM",
            "AquilaModel",
            "InternLMForCausalLM",
            "InternLM2ForCausalLM",
            "InternLM3ForCausalLM",
            "XverseForCausalLM",
            "GraniteForCausalLM",
            "GraniteMoeForCausalLM",
            "GraniteMoeSharedForCausalLM",
            "ArceeForCausalLM",
            "ApertusForCausalLM",
        ],
        model_types: &["llama", "aquila", "internlm", "internlm2", "internlm3", "xverse", "granite", "granitemoe", "granitemoeshared", "arcee", "apertus"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/llama.py LlamaAttention",
        read: a::llama,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "mistral",
        architectures: &["MistralForCausalLM", "MixtralForCausalLM", "Ministral3ForCausalLM", "Mistral3ForConditionalGeneration"],
        model_types: &["mistral", "mixtral", "ministral3", "mistral3"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/llama.py LlamaAttention (Mistral runs as Llama), models/mixtral.py, models/mistral3.py (text_config); transformers MistralConfig (8 KV heads and a 4096 window when omitted), MixtralConfig, Ministral3Config",
        read: d::mistral,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "phi3",
        architectures: &["Phi3ForCausalLM", "PhiMoEForCausalLM"],
        model_types: &["phi3", "phimoe"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/phi3.py (a Llama subclass), models/phimoe.py",
        read: a::llama,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "qwen",
        architectures: &[
            "Qwen2ForCausalLM",
            "Qwen2MoeForCausalLM",
            "Qwen3ForCausalLM",
            "Qwen3MoeForCausalLM",
            "Qwen2VLForConditionalGeneration",
            "Qwen2_5_VLForConditionalGeneration",
            "Qwen3VLForConditionalGeneration",
            "Qwen3VLMoeForConditionalGeneration",
        ],
        model_types: &["qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"],
        keys: keys!["sliding_window", "use_sliding_window", "max_window_layers", "layer_types"],
        source: "transformers models/qwen2/configuration_qwen2.py Qwen2Config (layer_types from use_sliding_window and max_window_layers)",
        read: a::qwen,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gemma",
        architectures: &["GemmaForCausalLM"],
        model_types: &["gemma"],
        keys: keys![],
        source: "vLLM models/gemma.py GemmaAttention",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gemma2",
        architectures: &["Gemma2ForCausalLM"],
        model_types: &["gemma2"],
        keys: keys!["sliding_window", "layer_types"],
        source: "transformers models/gemma2/configuration_gemma2.py Gemma2Config (odd layers global)",
        read: a::gemma2,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gemma3",
        architectures: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
        model_types: &["gemma3", "gemma3_text"],
        keys: keys!["sliding_window", "sliding_window_pattern", "layer_types"],
        source: "transformers models/gemma3/configuration_gemma3.py Gemma3TextConfig (every sliding_window_pattern-th layer global)",
        read: d::gemma3,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gemma3n",
        architectures: &["Gemma3nForConditionalGeneration", "Gemma3nForCausalLM"],
        model_types: &["gemma3n", "gemma3n_text"],
        keys: keys!["sliding_window", "sliding_window_pattern", "layer_types", "num_kv_shared_layers"],
        source: "vLLM models/gemma3n.py Gemma3nAttention (kv_sharing_target_layer_name)",
        read: a::gemma3n,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gemma4",
        architectures: &["Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"],
        model_types: &["gemma4", "gemma4_text"],
        keys: keys!["sliding_window", "sliding_window_pattern", "layer_types", "num_kv_shared_layers", "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v"],
        source: "vLLM models/gemma4.py Gemma4DecoderLayer and Gemma4Attention; transformers models/gemma4/configuration_gemma4.py Gemma4TextConfig",
        read: a::gemma4,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "cohere",
        architectures: &["CohereForCausalLM"],
        model_types: &["cohere"],
        keys: keys![],
        source: "vLLM models/commandr.py CohereAttention",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "cohere2",
        architectures: &["Cohere2ForCausalLM"],
        model_types: &["cohere2"],
        keys: keys!["sliding_window", "sliding_window_pattern", "layer_types"],
        source: "transformers models/cohere2/configuration_cohere2.py Cohere2Config (every fourth layer global)",
        read: a::cohere2,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "olmo",
        architectures: &["OlmoForCausalLM", "Olmo2ForCausalLM", "OlmoeForCausalLM"],
        model_types: &["olmo", "olmo2", "olmoe"],
        keys: keys![],
        source: "vLLM models/olmo.py, olmo2.py, olmoe.py",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "olmo3",
        architectures: &["Olmo3ForCausalLM"],
        model_types: &["olmo3"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/olmo2.py Olmo2Attention (per-layer window from layer_types)",
        read: a::olmo3,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "exaone",
        architectures: &["ExaoneForCausalLM"],
        model_types: &["exaone"],
        keys: keys![],
        source: "vLLM models/exaone.py ExaoneAttention",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "exaone4",
        architectures: &["Exaone4ForCausalLM"],
        model_types: &["exaone4"],
        keys: keys!["sliding_window", "sliding_window_pattern", "layer_types"],
        source: "transformers models/exaone4/configuration_exaone4.py Exaone4Config",
        read: a::exaone4,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "glm",
        architectures: &["GlmForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM"],
        model_types: &["glm", "glm4", "glm4_moe"],
        keys: keys![],
        source: "vLLM models/glm.py, glm4.py, glm4_moe.py",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "chatglm",
        architectures: &["ChatGLMModel", "ChatGLMForConditionalGeneration"],
        model_types: &["chatglm"],
        keys: own_keys!["multi_query_attention", "multi_query_group_num", "kv_channels"],
        source: "vLLM models/chatglm.py GLMAttention",
        read: a::chatglm,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "deepseek",
        architectures: &["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Glm4MoeLiteForCausalLM"],
        model_types: &["deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe_lite"],
        keys: keys!["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim", "index_topk_freq", "index_topk_pattern", "index_skip_topk_offset"],
        source: "vLLM models/deepseek_v2.py DeepseekV2MLAAttention (Kimi K2 is DeepseekV3ForCausalLM); V3.2's indexer skipped by models/deepseek_v32/attention.py",
        read: a::deepseek,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "deepseek-v4",
        architectures: &["DeepseekV4ForCausalLM"],
        model_types: &["deepseek_v4"],
        keys: keys!["qk_rope_head_dim", "sliding_window", "compress_ratios", "index_head_dim"],
        source: "vLLM models/deepseek_v4/attention.py DeepseekV4Attention (sliding latent, compressed latent and compressor state by compress_ratios[l], indexer at ratio 4); its caches' pages from each layer's get_kv_cache_spec",
        read: deepseek_v4::deepseek_v4,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "glm-5",
        architectures: &["GlmMoeDsaForCausalLM"],
        model_types: &["glm_moe_dsa"],
        keys: keys!["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim", "index_topk_freq", "index_topk_pattern", "index_skip_topk_offset"],
        source: "vLLM models/registry.py runs GlmMoeDsaForCausalLM as models/deepseek_v32 (MLA, indexer skipped by index_topk_pattern / index_topk_freq / index_skip_topk_offset); transformers models/glm_moe_dsa/configuration_glm_moe_dsa.py GlmMoeDsaConfig defaults",
        read: a::glm_dsa,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "minimax-m2",
        architectures: &["MiniMaxM2ForCausalLM"],
        model_types: &["minimax_m2"],
        keys: keys!["attn_type_list"],
        source: "vLLM models/minimax_m2.py MiniMaxM2Attention",
        read: a::minimax_m2,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "falcon",
        architectures: &["FalconForCausalLM", "RWForCausalLM"],
        model_types: &["falcon", "RefinedWeb", "RefinedWebModel"],
        keys: own_keys!["multi_query", "num_kv_heads", "n_head_kv", "new_decoder_architecture"],
        source: "vLLM models/falcon.py FalconAttention",
        read: a::falcon,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "gpt-bigcode",
        architectures: &["GPTBigCodeForCausalLM"],
        model_types: &["gpt_bigcode"],
        keys: own_keys!["multi_query"],
        source: "vLLM models/gpt_bigcode.py GPTBigCodeAttention",
        read: a::gpt_bigcode,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "llama4",
        architectures: &["Llama4ForConditionalGeneration", "Llama4ForCausalLM"],
        model_types: &["llama4", "llama4_text"],
        keys: keys!["attention_chunk_size", "no_rope_layers", "no_rope_layer_interval"],
        source: "vLLM models/llama4.py Llama4Attention (nope, ChunkedLocalAttention); transformers models/llama4/configuration_llama4.py Llama4TextConfig",
        read: a::llama4,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "nemotron-nas",
        architectures: &["DeciLMForCausalLM"],
        model_types: &["nemotron-nas", "deci"],
        keys: keys!["block_configs"],
        source: "vLLM models/nemotron_nas.py DeciLMDecoderLayer",
        read: a::nemotron_nas,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "mimo-v2",
        architectures: &["MiMoV2FlashForCausalLM"],
        model_types: &["mimo_v2_flash"],
        keys: keys!["v_head_dim", "hybrid_layer_pattern", "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim", "sliding_window", "sliding_window_size"],
        source: "vLLM models/mimo_v2_flash.py MiMoV2Attention and its decoder layer (hybrid_layer_pattern[i] == 1 is sliding)",
        read: a::mimo_v2,
        ignored: &[(
            "attention_chunk_size",
            "vLLM models/mimo_v2.py builds its layers from sliding_window_size and \
             hybrid_layer_pattern alone; only ChunkedLocalAttention layers (models/llama4.py) \
             cache by attention_chunk_size",
        )],
        counted_by: None,
    },
    Family {
        name: "gpt-oss",
        architectures: &["GptOssForCausalLM"],
        model_types: &["gpt_oss"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/gpt_oss.py OAIAttention (sliding on layer_types' sliding_attention)",
        read: a::llama,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "nemotron-h",
        architectures: &["NemotronHForCausalLM"],
        model_types: &["nemotron_h"],
        keys: keys!["attention_head_dim", "hybrid_override_pattern", "layers_block_type", "layer_types", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "mamba_n_groups", "conv_kernel", "mamba_d_conv", "expand", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/nemotron_h.py NemotronHMambaDecoderLayer and NemotronHAttention; transformers models/nemotron_h/configuration_nemotron_h.py NemotronHConfig (layers_block_type, else hybrid_override_pattern; the layer count is its length)",
        read: s::nemotron_h,
        ignored: &[],
        counted_by: Some("layers_block_type"),
    },
    Family {
        name: "jamba",
        architectures: &["JambaForCausalLM"],
        model_types: &["jamba"],
        keys: keys!["attn_layer_period", "attn_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "transformers models/jamba/configuration_jamba.py JambaConfig.layers_block_type; vLLM models/jamba.py",
        read: s::jamba,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "bamba",
        architectures: &["BambaForCausalLM"],
        model_types: &["bamba"],
        keys: keys!["attn_layer_indices", "layers_block_type", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "transformers models/bamba/configuration_bamba.py BambaConfig.layers_block_type; vLLM models/bamba.py",
        read: s::bamba,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "granite-hybrid",
        architectures: &["GraniteMoeHybridForCausalLM"],
        model_types: &["granitemoehybrid"],
        keys: keys!["layer_types", "layers_block_type", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/granitemoehybrid.py GraniteMoeHybridModel (layer_types mamba and attention)",
        read: s::granite_hybrid,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "falcon-h1",
        architectures: &["FalconH1ForCausalLM"],
        model_types: &["falcon_h1"],
        keys: keys!["mamba_n_heads", "mamba_d_head", "mamba_d_ssm", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/falcon_h1.py FalconH1ParallelHybrid",
        read: s::falcon_h1,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "mamba",
        architectures: &["MambaForCausalLM", "FalconMambaForCausalLM"],
        model_types: &["mamba", "falcon_mamba"],
        keys: own_keys!["state_size", "conv_kernel", "expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/mamba.py MambaDecoderLayer",
        read: s::mamba,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "mamba2",
        architectures: &["Mamba2ForCausalLM"],
        model_types: &["mamba2"],
        keys: own_keys!["head_dim", "state_size", "n_groups", "conv_kernel", "expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/mamba2.py Mamba2DecoderLayer",
        read: s::mamba2_stack,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "zamba2",
        architectures: &["Zamba2ForCausalLM"],
        model_types: &["zamba2"],
        keys: own_keys!["num_key_value_heads", "attention_head_dim", "layers_block_type", "hybrid_layer_ids", "n_mamba_heads", "mamba_headdim", "mamba_d_state", "mamba_ngroups", "mamba_d_conv", "mamba_expand", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "transformers models/zamba2/configuration_zamba2.py Zamba2Config; vLLM models/zamba2.py Zamba2HybridLayer",
        read: s::zamba2,
        ignored: &[(
            "kv_channels",
            "transformers Zamba2Config writes kv_channels = hidden_size / num_attention_heads; \
             vLLM models/zamba2.py sizes its KV by attention_head_dim and never reads it",
        )],
        counted_by: None,
    },
    Family {
        name: "lfm2",
        architectures: &["Lfm2ForCausalLM", "Lfm2MoeForCausalLM"],
        model_types: &["lfm2", "lfm2_moe"],
        keys: keys!["layer_types", "full_attn_idxs", "conv_L_cache", "conv_dim"],
        source: "vLLM models/lfm2.py Lfm2ShortConvDecoderLayer; vLLM mamba_utils.py short_conv_state_shape",
        read: s::lfm2,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "qwen3-next",
        architectures: &["Qwen3NextForCausalLM"],
        model_types: &["qwen3_next"],
        keys: keys!["layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/qwen3_next.py Qwen3NextDecoderLayer",
        read: s::qwen3_next,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "qwen3.5",
        architectures: &["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"],
        model_types: &["qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"],
        keys: keys!["layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/qwen3_5.py (the Qwen3-Next layers; mamba_ssm_dtype for the recurrent state)",
        read: s::qwen3_next,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "kimi-linear",
        architectures: &["KimiLinearForCausalLM"],
        model_types: &["kimi_linear"],
        keys: keys!["linear_attn_config", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/kimi_linear.py KimiDecoderLayer; vLLM mamba_utils.py kda_state_shape",
        read: s::kimi_linear,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "minimax-text-01",
        architectures: &["MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM"],
        model_types: &["minimax", "minimax_text_01", "minimax_m1"],
        keys: keys!["attn_type_list", STATE_DTYPES[0], STATE_DTYPES[1]],
        source: "vLLM models/minimax_text_01.py MiniMaxText01DecoderLayer (attn_type_list 0: lightning attention)",
        read: s::minimax_text01,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "phi",
        architectures: &["PhiForCausalLM"],
        model_types: &["phi"],
        keys: keys!["layer_types", "sliding_window"],
        source: "transformers models/phi/configuration_phi.py PhiConfig; vLLM models/transformers/base.py _create_attention_instances (vLLM 0.32 runs it through its Transformers backend)",
        read: d::phi,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "seed-oss",
        architectures: &["SeedOssForCausalLM"],
        model_types: &["seed_oss"],
        keys: keys!["layer_types", "sliding_window"],
        source: "transformers models/seed_oss/configuration_seed_oss.py SeedOssConfig (num_key_value_heads 8, head_dim 128 when absent); vLLM models/transformers/base.py _create_attention_instances",
        read: d::seed_oss,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "starcoder2",
        architectures: &["Starcoder2ForCausalLM"],
        model_types: &["starcoder2"],
        keys: keys!["layer_types", "sliding_window"],
        source: "transformers models/starcoder2/configuration_starcoder2.py Starcoder2Config (num_key_value_heads 2 when absent); vLLM models/transformers/base.py _create_attention_instances, engine/arg_utils.py (a model-wide sliding_window)",
        read: d::starcoder2,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "smollm3",
        architectures: &["SmolLM3ForCausalLM"],
        model_types: &["smollm3"],
        keys: keys!["layer_types", "sliding_window", "use_sliding_window", "no_rope_layers", "no_rope_layer_interval"],
        source: "transformers models/smollm3/configuration_smollm3.py SmolLM3Config.__post_init__ (layer_types from use_sliding_window, sliding_window and no_rope_layers); vLLM models/transformers/base.py _create_attention_instances",
        read: d::smollm3,
        ignored: &[(
            "max_window_layers",
            "transformers SmolLM3Config and modeling_smollm3.py never read it; vLLM's \
             Transformers backend reads layer_types and sliding_window",
        )],
        counted_by: None,
    },
    Family {
        name: "hunyuan",
        architectures: &["HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM"],
        model_types: &["hunyuan_v1_dense", "hunyuan_v1_moe", "hunyuan"],
        keys: keys!["attention_head_dim", "use_cla", "cla_share_factor", "layer_types", "sliding_window"],
        source: "transformers models/hunyuan_v1_dense and hunyuan_v1_moe configuration classes; vLLM models/registry.py (Transformers backend) and transformers/base.py _create_attention_instances; cross-layer attention (use_cla) refused",
        read: d::hunyuan,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "ernie4.5",
        architectures: &["Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM"],
        model_types: &["ernie4_5", "ernie4_5_moe"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/ernie45.py (a LlamaForCausalLM) and models/ernie45_moe.py; transformers Ernie4_5Config (2 KV heads, head_dim 128 when omitted), Ernie4_5_MoeConfig (4 KV heads)",
        read: d::ernie45,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "voxtral",
        architectures: &["VoxtralForConditionalGeneration"],
        model_types: &["voxtral"],
        keys: keys!["sliding_window", "layer_types"],
        source: "vLLM models/voxtral.py (text_config on llama.py; the Whisper audio encoder keeps no paged cache); transformers VoxtralConfig._default_text_config_kwargs",
        read: d::voxtral,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "dots1",
        architectures: &["Dots1ForCausalLM"],
        model_types: &["dots1"],
        keys: keys!["sliding_window", "layer_types", "max_window_layers"],
        source: "transformers models/dots1/configuration_dots1.py Dots1Config.__post_init__ (layer_types from sliding_window and max_window_layers); vLLM models/transformers/base.py _create_attention_instances (vLLM 0.32 runs it through its Transformers backend)",
        read: d::dots1,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "step3",
        architectures: &["Step3TextForCausalLM", "Step3VLForConditionalGeneration"],
        model_types: &["step3_text", "step3_vl"],
        keys: keys!["num_attention_groups"],
        source: "vLLM models/step3_text.py Step3TextAttention (one KV head, replicated; head_dim 256 when omitted)",
        read: d::step3,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "baichuan",
        architectures: &["BaichuanForCausalLM"],
        model_types: &["baichuan"],
        keys: keys![],
        source: "SGLang models/baichuan.py (Baichuan 13B and Baichuan 2; vLLM served it up to 0.23): multi-head attention, the KV pool of the config's KV heads (the query heads) x hidden_size / heads",
        read: a::dense,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "minimax-m3",
        architectures: &["MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"],
        model_types: &["minimax_m3_text", "minimax_m3_vl"],
        keys: keys!["sparse_attention_config"],
        source: "vLLM models/minimax_m3/nvidia/model.py (every layer K and V of num_key_value_heads x head_dim; a layer whose sparse_attention_config.sparse_attention_freq entry is not 0 keeps a MiniMaxM3IndexerCache of sparse_index_dim, common/indexer.py) on transformers_utils/configs/minimax_m3.py MiniMaxM3TextConfig",
        read: d::minimax_m3,
        ignored: &[],
        counted_by: None,
    },
    Family {
        name: "step3.5",
        architectures: &["Step3p5ForCausalLM"],
        model_types: &["step3p5"],
        keys: keys!["num_attention_groups", "layer_types", "sliding_window", "attention_other_setting"],
        source: "vLLM models/step3p5.py Step3p5DecoderLayer (attention_other_setting's heads where layer_types names its type; sliding_attention layers by sliding_window) on transformers_utils/configs/step3p5.py Step3p5Config",
        read: d::step3p5,
        ignored: &[],
        counted_by: None,
    },
];

/// Architectures no family reads, each with why: refused naming the reason, not only "no
/// family".
pub const REFUSED: &[(&str, &str)] = &[
    ("BaiChuanForCausalLM", "Baichuan-7B (v1): vLLM serves it only up to 0.23 (models/registry.py _PREVIOUSLY_SUPPORTED_MODELS) and SGLang registers BaichuanForCausalLM (Baichuan 13B and Baichuan 2), not this name"),
    ("MllamaForConditionalGeneration", "vLLM removed Mllama in 0.10.2 (encoder-decoder models); SGLang serves it, its image tokens ahead of the text in every layer's pool (num_images x max_num_tiles x ((image_size / patch_size)^2 + 1) tokens, 6404 an image for Llama-3.2-11B-Vision), but its PD disaggregation sends those slots with no encoder bookkeeping on the decode side (disaggregation/decode.py prepare_for_prebuilt sets no encoder_lens), so no runtime serves it disaggregated"),
];

/// The names, for messages.
pub fn names() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.name).collect()
}

pub fn by_name(name: &str) -> PlanResult<&'static Family> {
    match FAMILIES.iter().find(|f| f.name == name) {
        Some(family) => Ok(family),
        None => bail!(
            "unknown model family {}; the families are {} (pdplan models lists what each \
             covers)",
            quoted(name),
            names().join(", ")
        ),
    }
}

/// The family a config is read by: `chosen`, or the one covering its architecture, else its
/// model type.
pub fn select(parts: Parts<'_>, chosen: Option<&str>) -> PlanResult<&'static Family> {
    if let Some(name) = chosen {
        return by_name(name);
    }
    let architectures = parts.names("architectures")?;
    for arch in &architectures {
        if let Some(family) = FAMILIES.iter().find(|f| f.architectures.contains(arch)) {
            return Ok(family);
        }
    }
    for arch in &architectures {
        if let Some((_, why)) = REFUSED.iter().find(|(name, _)| name == arch) {
            bail!(
                "config.json's architecture {arch} is refused: {why}; describe its layers with \
                 ModelShape(layer_kinds=...)"
            );
        }
    }
    let model_types = parts.names("model_type")?;
    for model_type in &model_types {
        if let Some(family) = FAMILIES.iter().find(|f| f.model_types.contains(model_type)) {
            return Ok(family);
        }
    }
    let named = match (architectures.is_empty(), model_types.is_empty()) {
        (true, true) => "config.json names no architectures and no model_type".to_owned(),
        _ => format!(
            "config.json's architectures {architectures:?} (model_type {model_types:?}) are no \
             model family pdplan reads"
        ),
    };
    bail!(
        "{named}: the families are {}. If the model is laid out exactly like one of them, choose \
         it with family= (--family on the command); else describe its layers with \
         ModelShape(layer_kinds=...)",
        names().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cache_keys::is_cache_key;

    #[test]
    fn names_architectures_and_model_types_are_unique_and_keys_are_cache_keys() {
        for (i, f) in FAMILIES.iter().enumerate() {
            for g in &FAMILIES[..i] {
                assert_ne!(f.name, g.name);
                for arch in f.architectures {
                    assert!(
                        !g.architectures.contains(arch),
                        "{arch} in {} and {}",
                        f.name,
                        g.name
                    );
                }
                for t in f.model_types {
                    assert!(
                        !g.model_types.contains(t),
                        "{t} in {} and {}",
                        f.name,
                        g.name
                    );
                }
            }
            for key in f.keys {
                assert!(
                    is_cache_key(key),
                    "{}: {key} is not in the cache-key table",
                    f.name
                );
            }
        }
    }
}
