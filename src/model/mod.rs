//! Buffer layouts derived from a model (its shape, a preset, a local `config.json`) or from the
//! byte lengths a runtime knows, so runtimes and the command line do not hand-build them.

mod buffers;
mod dtype;
mod item_lengths;
mod shape;

pub use buffers::{model_buffers, pair_buffers, tag_layers};
pub use dtype::{dtype_bytes, Dtype};
pub use item_lengths::{from_item_lengths, ItemLengths};
pub use shape::{
    preset, shape_from, shape_from_hf_config, ConvShape, DraftShape, KvLayout, MambaShape,
    MlaShape, ModelShape, MAX_PAGE_SIZE, PRESET_NAMES,
};
