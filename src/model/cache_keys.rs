//! Every `config.json` key that changes what a layer caches, in one table.
//!
//! A family's reader declares which of these it consumes (`families.rs`). A config that holds
//! one its family does not consume is refused, naming the key: pdplan never reads a model while
//! ignoring something that shapes its cache. Keys are looked up in the config's top level and
//! in its `text_config`; a `null` value counts as absent (configs write `null` for "unused").

/// The keys, grouped by what they change.
pub const CACHE_KEYS: &[&str] = &[
    // Layer kinds and their pattern.
    "layer_types",
    "layers_block_type",
    "layer_block_types",
    "block_types",
    "block_configs",
    "per_layer_config",
    "hybrid_override_pattern",
    "hybrid_layer_pattern",
    "hybrid_layer_ids",
    "full_attention_interval",
    "full_attn_idxs",
    "attn_layer_period",
    "attn_layer_offset",
    "attn_layer_indices",
    "attention_layer_indices",
    "attn_type_list",
    "layer_pattern",
    "linear_attn_config",
    "no_rope_layers",
    "no_rope_layer_interval",
    "dense_attention_every_n_layers",
    "new_decoder_architecture",
    // Windows and chunks.
    "sliding_window",
    "sliding_window_size",
    "sliding_window_pattern",
    "use_sliding_window",
    "max_window_layers",
    "attention_chunk_size",
    "attention_window",
    // KV heads, under any name.
    "num_key_value_heads",
    "num_kv_heads",
    "n_head_kv",
    "multi_query",
    "multi_query_attention",
    "multi_query_group_num",
    "num_attention_groups",
    "num_global_key_value_heads",
    "swa_num_key_value_heads",
    "attention_other_setting",
    "attention_k_eq_v",
    // Head dims, K and V.
    "head_dim",
    "attention_head_dim",
    "kv_channels",
    "global_head_dim",
    "swa_head_dim",
    "v_head_dim",
    "swa_v_head_dim",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    // KV shared between layers.
    "num_kv_shared_layers",
    "use_cla",
    "cla_share_factor",
    // Latent attention and its indexer.
    "kv_lora_rank",
    "index_head_dim",
    "index_topk_freq",
    "index_topk_pattern",
    "index_skip_topk_offset",
    "sparse_attention_config",
    "compress_ratios",
    // State sizes.
    "mamba_d_state",
    "ssm_state_size",
    "state_size",
    "mamba_num_heads",
    "mamba_n_heads",
    "n_mamba_heads",
    "mamba_head_dim",
    "mamba_d_head",
    "mamba_headdim",
    "mamba_d_ssm",
    "mamba_expand",
    "expand",
    "n_groups",
    "mamba_n_groups",
    "mamba_ngroups",
    "mamba_d_conv",
    "conv_kernel",
    "conv_L_cache",
    "conv_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    // State and cache dtypes.
    "mamba_ssm_cache_dtype",
    "mamba_ssm_dtype",
    "kv_cache_dtype",
];

/// Keys of the table every family's reader consumes: the cache's element type, where a config
/// names one, is the model's KV cache dtype whatever the family.
pub const UNIVERSAL_KEYS: &[&str] = &["kv_cache_dtype"];

/// Keys configs write under another name too, `(alias, twin)`: a family that reads the twin
/// reads the alias as the twin (`Config::get`), and a config holding both must give one value
/// (`families::check_keys`). Gemma 2's published configs hold `sliding_window_size` beside
/// `sliding_window`.
pub const ALIASES: &[(&str, &str)] = &[("sliding_window_size", "sliding_window")];

/// Whether `key` is in the table.
pub fn is_cache_key(key: &str) -> bool {
    CACHE_KEYS.contains(&key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_listed_once() {
        for (i, key) in CACHE_KEYS.iter().enumerate() {
            assert!(!CACHE_KEYS[..i].contains(key), "{key} is listed twice");
        }
    }
}
