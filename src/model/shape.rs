//! What decides a model's cache buffers (`ModelShape`), from a Hugging Face `config.json` or a
//! named preset, each validated where it is made.

use serde_json::Value;

use super::dtype::Dtype;
use crate::error::{bail, PlanError, PlanResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MlaShape {
    pub kv_lora_rank: u64,
    pub rope_head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MambaShape {
    pub layers: u64,
    /// SSM state channels across all TP ranks (sharded by TP).
    pub channels: u64,
    /// Bytes of one channel's SSM state.
    pub bytes_per_channel: u64,
    /// The conv state, when the model keeps one (Mamba2 does).
    pub conv: Option<ConvShape>,
}

/// Mamba2's conv state: channels `x | B | C` (each sharded by TP on its own), each holding the
/// last `width` inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConvShape {
    /// Channels of `x` (the SSM's inner size).
    pub x_channels: u64,
    /// Channels of `B`, and again of `C` (groups x state size).
    pub bc_channels: u64,
    /// Inputs kept per channel (the conv kernel size minus one).
    pub width: u64,
}

/// How a KV page stores its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLayout {
    /// `[heads][page_size][head_dim]`: a rank's heads one after another (one row a page).
    #[default]
    Hnd,
    /// `[page_size][heads][head_dim]`: a row per token (`rows_per_page = page_size`).
    Nhd,
}

impl KvLayout {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "HND" => Ok(Self::Hnd),
            "NHD" => Ok(Self::Nhd),
            other => bail!("kv_layout must be 'HND' or 'NHD', got {other:?}"),
        }
    }

    /// Rows of a page of `page_size` tokens.
    pub const fn rows(self, page_size: u64) -> u64 {
        match self {
            Self::Hnd => 1,
            Self::Nhd => page_size,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftShape {
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Attention layers with a KV cache (0 for a pure state-space model).
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub dtype: Dtype,
    pub page_size: u64,
    pub mla: Option<MlaShape>,
    pub mamba: Option<MambaShape>,
    pub draft: Option<DraftShape>,
}

fn config_u64(config: &Value, keys: &[&str]) -> PlanResult<Option<u64>> {
    for key in keys {
        match config.get(*key) {
            None | Some(Value::Null) => {}
            Some(value) => {
                return value.as_u64().map(Some).ok_or_else(|| {
                    PlanError::new(format!(
                        "config.json: {key} must be a non-negative integer, got {value}"
                    ))
                })
            }
        }
    }
    Ok(None)
}

/// A model shape from a Hugging Face `config.json` (read locally; nothing is fetched).
pub fn shape_from_hf_config(text: &str, page_size: u64) -> PlanResult<ModelShape> {
    check_page_size(page_size)?;
    let parsed: Value = serde_json::from_str(text)
        .map_err(|e| PlanError::new(format!("config.json is not valid JSON: {e}")))?;
    // Multimodal configs nest the language model.
    let config = parsed
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(&parsed);
    if !config.is_object() {
        bail!("config.json must hold a JSON object");
    }
    let require = |keys: &[&str]| -> PlanResult<u64> {
        config_u64(config, keys)?.ok_or_else(|| {
            PlanError::new(format!(
                "config.json has no {}; is it a decoder model's config?",
                keys.join(" or ")
            ))
        })
    };
    let layers = require(&["num_hidden_layers", "n_layer", "num_layers"])?;
    let attention_heads = require(&["num_attention_heads", "n_head"])?;
    let kv_heads = config_u64(config, &["num_key_value_heads", "multi_query_group_num"])?
        .unwrap_or(attention_heads);
    let head_dim = if let Some(dim) = config_u64(config, &["head_dim"])? {
        dim
    } else {
        let hidden = require(&["hidden_size", "n_embd"])?;
        if attention_heads == 0 || hidden % attention_heads != 0 {
            bail!(
                "config.json: hidden_size={hidden} is not a multiple of \
                 num_attention_heads={attention_heads}"
            );
        }
        hidden / attention_heads
    };
    // Newer configs say `dtype`, older ones `torch_dtype`; multimodal ones may keep it outside
    // `text_config`. A config that names none is taken as bfloat16, the common cache type.
    let named = ["dtype", "torch_dtype"]
        .iter()
        .find_map(|k| config.get(*k).filter(|v| !v.is_null()))
        .or_else(|| {
            ["dtype", "torch_dtype"]
                .iter()
                .find_map(|k| parsed.get(*k).filter(|v| !v.is_null()))
        });
    let dtype = match named {
        None => Dtype::BFloat16,
        Some(Value::String(name)) => {
            Dtype::parse(name).map_err(|e| PlanError::new(format!("config.json: {e}")))?
        }
        Some(other) => {
            bail!("config.json: dtype must be a string such as \"bfloat16\", got {other}")
        }
    };
    let mla = match config_u64(config, &["kv_lora_rank"])? {
        Some(rank) if rank > 0 => Some(MlaShape {
            kv_lora_rank: rank,
            rope_head_dim: config_u64(config, &["qk_rope_head_dim"])?.unwrap_or(0),
        }),
        _ => None,
    };
    Ok(ModelShape {
        layers,
        kv_heads,
        head_dim,
        dtype,
        page_size,
        mla,
        mamba: None,
        draft: None,
    })
}

/// Tokens a page: positive, and small enough that a page's bytes stay countable.
fn check_page_size(page_size: u64) -> PlanResult<()> {
    if page_size == 0 || page_size > MAX_PAGE_SIZE {
        bail!("page_size={page_size} must be between 1 and {MAX_PAGE_SIZE} tokens");
    }
    Ok(())
}

pub use crate::layout::MAX_PAGE_SIZE;

/// The shape of exactly one of a `config.json` text and a preset name.
pub fn shape_from(
    config_text: Option<&str>,
    preset_name: Option<&str>,
    page_size: u64,
) -> PlanResult<ModelShape> {
    match (config_text, preset_name) {
        (Some(text), None) => shape_from_hf_config(text, page_size),
        (None, Some(name)) => preset(name, page_size),
        _ => bail!("give exactly one of config_text and preset"),
    }
}

/// Named shapes for the command line and examples.
pub const PRESET_NAMES: [&str; 6] = [
    "llama-3-8b",
    "llama-3-70b",
    "llama-3-70b-eagle",
    "qwen2.5-32b",
    "deepseek-v3",
    "mamba2-hybrid-8b",
];

pub fn preset(name: &str, page_size: u64) -> PlanResult<ModelShape> {
    check_page_size(page_size)?;
    let base = ModelShape {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        dtype: Dtype::BFloat16,
        page_size,
        mla: None,
        mamba: None,
        draft: None,
    };
    Ok(match name {
        "llama-3-8b" => base,
        "llama-3-70b" => ModelShape { layers: 80, ..base },
        "llama-3-70b-eagle" => ModelShape {
            layers: 80,
            draft: Some(DraftShape {
                layers: 1,
                kv_heads: 8,
                head_dim: 128,
            }),
            ..base
        },
        "qwen2.5-32b" => ModelShape { layers: 64, ..base },
        "deepseek-v3" => ModelShape {
            layers: 61,
            kv_heads: 1,
            head_dim: 576,
            mla: Some(MlaShape {
                kv_lora_rank: 512,
                rope_head_dim: 64,
            }),
            ..base
        },
        "mamba2-hybrid-8b" => ModelShape {
            layers: 4,
            mamba: Some(MambaShape {
                layers: 24,
                channels: 8192,
                bytes_per_channel: 128 * 2,
                // d_inner 8192, 8 groups x 128 state, kernel 4.
                conv: Some(ConvShape {
                    x_channels: 8192,
                    bc_channels: 1024,
                    width: 3,
                }),
            }),
            ..base
        },
        other => bail!(
            "unknown model preset {other:?}; choose one of {}",
            PRESET_NAMES.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_config() {
        let llama = r#"{"num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}"#;
        let shape = shape_from_hf_config(llama, 16).unwrap();
        assert_eq!(
            (
                shape.layers,
                shape.kv_heads,
                shape.head_dim,
                shape.dtype.bytes()
            ),
            (80, 8, 128, 2)
        );
        let ds = r#"{"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}"#;
        assert_eq!(
            shape_from_hf_config(ds, 64)
                .unwrap()
                .mla
                .unwrap()
                .kv_lora_rank,
            512
        );
        assert!(shape_from_hf_config("{}", 16)
            .unwrap_err()
            .message()
            .contains("num_hidden_layers"));
        assert!(shape_from_hf_config("[", 16).is_err());
        assert!(shape_from_hf_config(r#"{"num_hidden_layers": "80"}"#, 16).is_err());
    }
}
