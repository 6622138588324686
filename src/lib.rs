//! pdplan: plans how a KV cache moves from prefill to decode ranks in a disaggregated LLM
//! server. The core (everything but `python`) knows nothing of Python.

pub mod array_interface;
pub mod array_layout;
pub mod canonical_frames;
pub mod context;
pub mod cost;
pub mod descriptors;
pub mod error;
pub mod failover;
pub mod fragment;
pub mod frame_cache;
pub mod holders;
pub mod host_copy;
pub mod interval;
pub mod json_refusal;
pub mod layer_groups;
pub mod layout;
pub mod layout_frame;
pub mod limits;
pub mod lru;
pub mod model;
pub mod notify;
pub mod page;
pub mod pairs;
pub mod parts;
pub mod planner;
pub mod posting;
pub mod prepared;
pub mod ranks;
pub mod routing;
pub mod slices;
pub mod spread;
pub mod stages;
pub mod staging;
pub mod token_descriptors;
pub mod token_scan;
pub mod verify;
pub mod wire;

#[cfg(feature = "python")]
mod python;

pub use error::{PlanError, PlanResult};
pub use fragment::Fragment;
pub use layout::{BufferKind, BufferLayout, LogicalAxis, ParallelLayout, Role};
pub use planner::{PlanKind, Planner, RankPlan, SourcePlan};
