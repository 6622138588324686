//! What decides a model's cache buffers (`ModelShape`): its layers in order, its dtypes and
//! page size; from a Hugging Face `config.json` (`hf_config`), a named preset, or fields.

use super::dtype::Dtype;
use super::layers::{AttentionShape, Layer, MlaShape};
use crate::error::{bail, quoted, PlanResult};
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
            other => bail!("kv_layout must be 'HND' or 'NHD', got {}", quoted(other)),
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

/// A shape is given as a uniform stack (`uniform` layers) or as its layers, not both.
pub fn described_once(uniform: u64, layers: usize) -> PlanResult<()> {
    if uniform > 0 && layers > 0 {
        bail!(
            "give the model either as layers=N (a uniform stack) or as layer_kinds, not both \
             (layers={uniform}, {layers} layer_kinds)"
        );
    }
    Ok(())
}

pub fn check_layer_count(layers: u64) -> PlanResult<()> {
    limits::LAYERS.check("num_hidden_layers", layers).map(drop)
}
