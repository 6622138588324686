//! A model's layers from a Hugging Face `config.json`, read locally (nothing is fetched) by the
//! reader of its family (`families.rs`): the family is chosen by the config's architecture,
//! every cache-shaping key it holds must be one that reader consumes, and the reader follows
//! its modeling code's rule.

use serde_json::Value;

use super::config::{lenient_json, Config, Parts};
use super::deepseek_v4::COMPRESSED_BLOCK_TOKENS;
use super::dtype::Dtype;
use super::families::{select, Family};
use super::key_checks::check_keys;
use super::quantization::{self, SIDE_FILE};
use super::shape::{check_layer_count, DraftShape, ModelShape};
use crate::error::{bail, quoted, PlanError, PlanResult};
use crate::limits;

/// Tokens a page where the caller names none and the runtime does not fix one.
pub const DEFAULT_PAGE_SIZE: u64 = 16;

/// The page size a family's runtime fixes whatever is asked, else `DEFAULT_PAGE_SIZE`: vLLM
/// pages `DeepSeek`-V4 at 256 tokens (`platforms/cpu.py` overrides any other; on GPUs its
/// sparse MLA kernel takes no other block size).
fn family_page_size(family: &Family) -> u64 {
    if family.name == "deepseek-v4" {
        COMPRESSED_BLOCK_TOKENS
    } else {
        DEFAULT_PAGE_SIZE
    }
}

/// `DeepSeek`-V4's cache under `kv_cache_dtype="auto"`: vLLM resolves it to `fp8_ds_mla` on
/// its default (`FlashMLA`) layout (`models/deepseek_v4/attention.py`,
/// `_resolve_dsv4_kv_cache_dtype`), whatever the model's dtype.
const DEEPSEEK_V4_AUTO_KV: Dtype = Dtype::Float8E4M3Fn;

/// Keys a layer count goes by.
const LAYER_COUNT: [&str; 3] = ["num_hidden_layers", "n_layer", "num_layers"];

/// A model shape from a Hugging Face `config.json` text, read by `family` when given (else by
/// the family its architecture names).
pub fn shape_from_hf_config(
    text: &str,
    page_size: u64,
    family: Option<&str>,
) -> PlanResult<ModelShape> {
    shape_from_hf_files(text, None, Some(page_size), family)
}

/// `shape_from_hf_config`, with the text of `ModelOpt`'s `hf_quant_config.json` where the
/// model's folder holds one (read for the KV cache dtype when `config.json` has no
/// quantization config). `page_size` `None`: the one the runtime fixes for the family
/// (`family_page_size`), else `DEFAULT_PAGE_SIZE`.
pub fn shape_from_hf_files(
    text: &str,
    quant_text: Option<&str>,
    page_size: Option<u64>,
    family: Option<&str>,
) -> PlanResult<ModelShape> {
    if let Some(size) = page_size {
        limits::PAGE_SIZE.check("page_size", size)?;
    }
    let parsed = lenient_json(text)?;
    let parts = Parts::of(&parsed)?;
    let side = quant_text
        .map(|t| lenient_json(t).map_err(|e| PlanError::new(format!("{SIDE_FILE}: {e}"))))
        .transpose()?;
    let family = select(parts, family)?;
    let page_size = page_size.unwrap_or_else(|| family_page_size(family));
    read(parts, side.as_ref(), family, page_size)
        .map_err(|e| PlanError::new(format!("{e} (read as family {})", family.name)))
}

fn read(
    parts: Parts<'_>,
    side: Option<&Value>,
    family: &'static Family,
    page_size: u64,
) -> PlanResult<ModelShape> {
    check_keys(parts, family)?;
    let config = Config {
        parts,
        reader: family.name,
        keys: family.keys,
    };
    let count = match family
        .counted_by
        .map(|key| config.list(key))
        .transpose()?
        .flatten()
    {
        // The family's config class counts its layers by this list (num_hidden_layers, where
        // a config still names one, is ignored by it).
        Some(list) => list.len() as u64,
        None => config.require(&LAYER_COUNT, "a decoder model")?,
    };
    check_layer_count(count)?;
    let layers = (family.read)(&config, count)?;
    // The SSM state's dtype, where the config names one and the runtime applies it (vLLM's
    // mamba_ssm_cache_dtype; Qwen3.5 says mamba_ssm_dtype).
    let mut state_dtype = None;
    for key in ["mamba_ssm_cache_dtype", "mamba_ssm_dtype"] {
        if family.consumes(key) && state_dtype.is_none() {
            state_dtype = config.dtype_key(key)?;
        }
    }
    Ok(ModelShape {
        layers,
        dtype: config.dtype()?,
        // A config's own kv_cache_dtype, else what a quantized export implies (vLLM's auto).
        kv_cache_dtype: match config.dtype_key("kv_cache_dtype")? {
            Some(named) => Some(named),
            None => quantization::kv_cache_dtype(parts, side)?
                .or_else(|| (family.name == "deepseek-v4").then_some(DEEPSEEK_V4_AUTO_KV)),
        },
        state_dtype,
        page_size,
        draft: None,
        family: Some(family.name),
    })
}

/// The shape of exactly one of a `config.json` text (with its `hf_quant_config.json` text,
/// where there is one) and a preset name.
pub fn shape_from(
    config_text: Option<&str>,
    quant_text: Option<&str>,
    preset_name: Option<&str>,
    page_size: Option<u64>,
    family: Option<&str>,
) -> PlanResult<ModelShape> {
    if quant_text.is_some() && config_text.is_none() {
        bail!("{SIDE_FILE}'s text goes with a config_text");
    }
    match (config_text, preset_name) {
        (Some(text), None) => shape_from_hf_files(text, quant_text, page_size, family),
        (None, Some(name)) => preset(name, page_size.unwrap_or(DEFAULT_PAGE_SIZE)),
        _ => bail!("give exactly one of config_text and preset"),
    }
}

/// Named models: each the published `config.json` values its shape is read from
/// (`src/model/presets/`), and a draft model for the EAGLE preset.
const PRESETS: [(&str, &str, Option<DraftShape>); 22] = [
    ("llama-3-8b", include_str!("presets/llama-3-8b.json"), None),
    (
        "llama-3-70b",
        include_str!("presets/llama-3-70b.json"),
        None,
    ),
    (
        "llama-3-70b-eagle",
        include_str!("presets/llama-3-70b.json"),
        Some(DraftShape {
            layers: 1,
            kv_heads: 8,
            head_dim: 128,
        }),
    ),
    (
        "qwen2.5-32b",
        include_str!("presets/qwen2.5-32b.json"),
        None,
    ),
    (
        "qwen3-235b-a22b",
        include_str!("presets/qwen3-235b-a22b.json"),
        None,
    ),
    (
        "qwen3-next-80b-a3b",
        include_str!("presets/qwen3-next-80b-a3b.json"),
        None,
    ),
    (
        "deepseek-v3",
        include_str!("presets/deepseek-v3.json"),
        None,
    ),
    (
        "deepseek-v3.2",
        include_str!("presets/deepseek-v3.2.json"),
        None,
    ),
    (
        "nemotron-h-8b",
        include_str!("presets/nemotron-h-8b.json"),
        None,
    ),
    (
        "nemotron-h-56b",
        include_str!("presets/nemotron-h-56b.json"),
        None,
    ),
    (
        "jamba-1.5-mini",
        include_str!("presets/jamba-1.5-mini.json"),
        None,
    ),
    (
        "gpt-oss-20b",
        include_str!("presets/gpt-oss-20b.json"),
        None,
    ),
    (
        "gpt-oss-120b",
        include_str!("presets/gpt-oss-120b.json"),
        None,
    ),
    (
        "gemma-3-27b",
        include_str!("presets/gemma-3-27b.json"),
        None,
    ),
    (
        "falcon-h1-7b",
        include_str!("presets/falcon-h1-7b.json"),
        None,
    ),
    (
        "mamba-codestral-7b",
        include_str!("presets/mamba-codestral-7b.json"),
        None,
    ),
    (
        "llama-3.3-nemotron-super-49b",
        include_str!("presets/llama-3.3-nemotron-super-49b.json"),
        None,
    ),
    (
        "llama-4-scout",
        include_str!("presets/llama-4-scout.json"),
        None,
    ),
    (
        "gemma-4-31b",
        include_str!("presets/gemma-4-31b.json"),
        None,
    ),
    (
        "gemma-4-e2b",
        include_str!("presets/gemma-4-e2b.json"),
        None,
    ),
    (
        "granite-4.0-h-small",
        include_str!("presets/granite-4.0-h-small.json"),
        None,
    ),
    (
        "qwen3.5-27b",
        include_str!("presets/qwen3.5-27b.json"),
        None,
    ),
];

/// The preset names, in the order `PRESETS` lists them.
pub const PRESET_NAMES: [&str; PRESETS.len()] = {
    let mut names = [""; PRESETS.len()];
    let mut i = 0;
    while i < PRESETS.len() {
        names[i] = PRESETS[i].0;
        i += 1;
    }
    names
};

pub fn preset(name: &str, page_size: u64) -> PlanResult<ModelShape> {
    let Some((_, config, draft)) = PRESETS.iter().find(|(n, _, _)| *n == name) else {
        bail!(
            "unknown model preset {}; choose one of {}",
            quoted(name),
            PRESET_NAMES.join(", ")
        );
    };
    Ok(ModelShape {
        draft: *draft,
        ..shape_from_hf_config(config, page_size, None)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::{AttentionShape, Layer, MlaShape};

    #[test]
    fn llama_and_deepseek_configs() {
        let llama = r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
            "torch_dtype": "bfloat16"}"#;
        let shape = shape_from_hf_config(llama, 16, None).unwrap();
        assert_eq!(shape.layers.len(), 80);
        assert_eq!(shape.family, Some("llama"));
        assert_eq!(
            shape.layers[79],
            Layer::Attention(AttentionShape::full(8, 128))
        );
        let ds = r#"{"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61,
            "num_attention_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}"#;
        assert!(matches!(
            shape_from_hf_config(ds, 64, None).unwrap().layers[0],
            Layer::Mla(MlaShape {
                kv_lora_rank: 512,
                ..
            })
        ));
    }

    #[test]
    fn unknown_architectures_and_unread_keys_are_refused_by_name() {
        let unknown = r#"{"architectures": ["NewModelForCausalLM"], "num_hidden_layers": 2}"#;
        let err = shape_from_hf_config(unknown, 16, None).unwrap_err();
        assert!(err.message().contains("NewModelForCausalLM"), "{err}");
        assert!(err.message().contains("llama"), "{err}");
        let chosen = r#"{"architectures": ["NewModelForCausalLM"], "num_hidden_layers": 2,
            "num_attention_heads": 4, "hidden_size": 64}"#;
        assert_eq!(
            shape_from_hf_config(chosen, 16, Some("llama"))
                .unwrap()
                .layers
                .len(),
            2
        );
        let unread = r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
            "num_attention_heads": 4, "hidden_size": 64, "attention_chunk_size": 8192}"#;
        let err = shape_from_hf_config(unread, 16, None).unwrap_err();
        assert!(err.message().contains("attention_chunk_size"), "{err}");
        assert!(err.message().contains("llama4"), "{err}");
        assert!(shape_from_hf_config("{}", 16, None).is_err());
        assert!(shape_from_hf_config(
            r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": "80"}"#,
            16,
            None
        )
        .is_err());
    }

    #[test]
    fn values_meaning_off_are_accepted_aliases_must_agree_and_ignored_keys_are_declared() {
        let base = r#""num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
            "num_key_value_heads": 2, "max_position_embeddings": 4096"#;
        let read = |extra: &str| {
            shape_from_hf_config(
                &format!(
                    r#"{{"architectures": ["Qwen3NextForCausalLM"], {base},
                    "layer_types": ["linear_attention", "full_attention"],
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_conv_kernel_dim": 4{extra}}}"#
                ),
                16,
                None,
            )
        };
        // Qwen3-Next's reader does not read use_sliding_window: false is off, true refused.
        assert_eq!(
            read(r#", "use_sliding_window": false"#)
                .unwrap()
                .layers
                .len(),
            2
        );
        let on = read(r#", "use_sliding_window": true"#).unwrap_err();
        assert!(on.message().contains("use_sliding_window"), "{on}");
        // An empty list and a window as long as the context are off too; a shorter one is not.
        assert!(read(r#", "hybrid_layer_ids": []"#).is_ok());
        assert!(read(r#", "sliding_window": 4096"#).is_ok());
        let window = read(r#", "sliding_window": 4095"#).unwrap_err();
        assert!(window.message().contains("sliding_window"), "{window}");

        // Gemma 2 reads sliding_window; sliding_window_size is its other name.
        let gemma2 = |extra: &str| {
            shape_from_hf_config(
                &format!(
                    r#"{{"architectures": ["Gemma2ForCausalLM"], {base}, "head_dim": 16{extra}}}"#
                ),
                16,
                None,
            )
        };
        let both = gemma2(r#", "sliding_window": 64, "sliding_window_size": 64"#).unwrap();
        let alone = gemma2(r#", "sliding_window_size": 64"#).unwrap();
        assert_eq!(both.layers, alone.layers);
        assert_eq!(
            both.layers,
            gemma2(r#", "sliding_window": 64"#).unwrap().layers
        );
        let apart = gemma2(r#", "sliding_window": 64, "sliding_window_size": 32"#).unwrap_err();
        assert!(
            apart.message().contains("sliding_window_size") && apart.message().contains("agree"),
            "{apart}"
        );

        // MiMo-V2 declares attention_chunk_size ignored (its modeling code never reads it).
        let family = super::super::families::by_name("mimo-v2").unwrap();
        assert!(family.ignores("attention_chunk_size"));
        assert!(!family.consumes("attention_chunk_size"));
    }

    #[test]
    fn nemotron_3_configs_count_their_layers_by_layers_block_type() {
        let mamba = r#""mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16,
            "n_groups": 2, "conv_kernel": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32"#;
        let listed = format!(
            r#"{{"architectures": ["NemotronHForCausalLM"], {mamba},
                "layers_block_type": ["mamba", "moe", "full_attention", "linear_attention", "mlp"]}}"#
        );
        let by_list = shape_from_hf_config(&listed, 16, None).unwrap();
        let pattern = format!(
            r#"{{"architectures": ["NemotronHForCausalLM"], {mamba}, "num_hidden_layers": 5,
                "hybrid_override_pattern": "ME*M-"}}"#
        );
        assert_eq!(
            by_list.layers,
            shape_from_hf_config(&pattern, 16, None).unwrap().layers
        );
        assert!(matches!(by_list.layers[2], Layer::Attention(_)));
        assert!(matches!(by_list.layers[3], Layer::Mamba2(_)));
        let odd = listed.replace("\"mlp\"", "\"cross_attention\"");
        let err = shape_from_hf_config(&odd, 16, None).unwrap_err();
        assert!(err.message().contains("layers_block_type[4]"), "{err}");
    }
}
