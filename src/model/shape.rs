//! What decides a model's cache buffers (`ModelShape`): its layers in order, its dtypes and
//! page size; from a Hugging Face `config.json` (`hf_config`), a named preset, or fields.

use super::dtype::Dtype;
use super::hf_config::shape_from_hf_config;
use super::layers::{AttentionShape, Layer, MlaShape};
use crate::error::{bail, PlanResult};
use crate::limits;

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

/// A speculative-decoding draft model's attention layers, kept after the target model's and
/// run on its last layer's stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftShape {
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    /// Every model layer in order (MLP-only layers too: they count for pipeline stages).
    pub layers: Vec<Layer>,
    pub dtype: Dtype,
    /// The KV cache's element type; `None`: the model's dtype.
    pub kv_cache_dtype: Option<Dtype>,
    /// SSM and recurrent states' element type; `None`: the model's dtype.
    pub state_dtype: Option<Dtype>,
    pub page_size: u64,
    pub draft: Option<DraftShape>,
    /// The model family whose reader read the shape from a config (`None`: given by hand).
    pub family: Option<&'static str>,
}

impl ModelShape {
    /// `layers` uniform layers: attention of `kv_heads` x `head_dim`, or MLA when `mla` is set.
    pub fn uniform(
        layers: u64,
        (kv_heads, head_dim): (u64, u64),
        mla: Option<MlaShape>,
        dtype: Dtype,
        page_size: u64,
    ) -> PlanResult<Self> {
        check_layer_count(layers)?;
        let layer = mla.map_or(
            Layer::Attention(AttentionShape::full(kv_heads, head_dim)),
            Layer::Mla,
        );
        Ok(Self {
            layers: (0..layers).map(|_| layer).collect(),
            dtype,
            kv_cache_dtype: None,
            state_dtype: None,
            page_size,
            draft: None,
            family: None,
        })
    }

    pub fn kv_dtype(&self) -> Dtype {
        self.kv_cache_dtype.unwrap_or(self.dtype)
    }

    pub fn state_dtype(&self) -> Dtype {
        self.state_dtype.unwrap_or(self.dtype)
    }

    /// Block-scaled types (NVFP4) are KV cache formats only: they say nothing of where a
    /// model's or a state's scales would live.
    pub fn check_dtypes(&self) -> PlanResult<()> {
        for (name, dtype) in [("dtype", self.dtype), ("state_dtype", self.state_dtype())] {
            if dtype.scale_block().is_some() {
                bail!(
                    "{name}={} is a KV cache format, not a model or state dtype; give it as \
                     kv_cache_dtype",
                    dtype.as_str()
                );
            }
        }
        Ok(())
    }
}

pub fn check_layer_count(layers: u64) -> PlanResult<()> {
    limits::LAYERS.check("num_hidden_layers", layers).map(drop)
}

/// The shape of exactly one of a `config.json` text and a preset name.
pub fn shape_from(
    config_text: Option<&str>,
    preset_name: Option<&str>,
    page_size: u64,
    family: Option<&str>,
) -> PlanResult<ModelShape> {
    match (config_text, preset_name) {
        (Some(text), None) => shape_from_hf_config(text, page_size, family),
        (None, Some(name)) => preset(name, page_size),
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
            "unknown model preset {name:?}; choose one of {}",
            PRESET_NAMES.join(", ")
        );
    };
    Ok(ModelShape {
        draft: *draft,
        ..shape_from_hf_config(config, page_size, None)?
    })
}
