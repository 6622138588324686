//! Buffer layouts derived from a model (its layers, a preset, a local `config.json`) or from the
//! byte lengths a runtime knows, so runtimes and the command line do not hand-build them.

mod buffers;
mod cache_keys;
mod config;
mod deepseek_v4;
mod dtype;
mod families;
mod hf_config;
mod item_lengths;
mod key_checks;
mod layer_kinds;
mod layers;
mod quantization;
mod readers;
mod shape;
mod summary;

pub use buffers::{model_buffers, pair_buffers};
pub use cache_keys::CACHE_KEYS;
pub use deepseek_v4::DeepseekV4Shape;
pub use dtype::{dtype_bytes, Dtype};
pub use families::{Family, FAMILIES};
pub use hf_config::{preset, shape_from, shape_from_hf_config, shape_from_hf_files, PRESET_NAMES};
pub use item_lengths::{from_item_lengths, ItemLengths};
pub use layer_kinds::{kind_of, KindField, KindType, KindValue, LayerKind, LAYER_KINDS};
pub use layers::{
    AttentionShape, GatedDeltaNetShape, KdaShape, Layer, LightningShape, Mamba1Shape, Mamba2Shape,
    MlaShape, ShortConvShape,
};
pub use quantization::SIDE_FILE as QUANT_CONFIG_NAME;
pub use shape::{described_once, DraftShape, KvLayout, ModelShape};
pub use summary::{summarize, KindSummary};
