//! Cache element types: the names configs and runtimes give them, and their sizes.

use crate::error::{PlanError, PlanResult};

/// Cache element types, each with the name a model's config gives it and the names runtimes
/// use for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    BFloat16,
    Float16,
    Float32,
    Float8E4M3Fn,
    Float8E5M2,
    Float8E4M3Fnuz,
    Float8E5M2Fnuz,
    Int8,
    UInt8,
}

impl Dtype {
    pub const ALL: [Self; 9] = [
        Self::BFloat16,
        Self::Float16,
        Self::Float32,
        Self::Float8E4M3Fn,
        Self::Float8E5M2,
        Self::Float8E4M3Fnuz,
        Self::Float8E5M2Fnuz,
        Self::Int8,
        Self::UInt8,
    ];

    /// The name as `PyTorch` and Hugging Face configs spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BFloat16 => "bfloat16",
            Self::Float16 => "float16",
            Self::Float32 => "float32",
            Self::Float8E4M3Fn => "float8_e4m3fn",
            Self::Float8E5M2 => "float8_e5m2",
            Self::Float8E4M3Fnuz => "float8_e4m3fnuz",
            Self::Float8E5M2Fnuz => "float8_e5m2fnuz",
            Self::Int8 => "int8",
            Self::UInt8 => "uint8",
        }
    }

    const fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::BFloat16 => &["bf16"],
            Self::Float16 => &["fp16", "half"],
            Self::Float32 => &["fp32", "float"],
            Self::Float8E4M3Fn => &["fp8", "float8", "fp8_e4m3", "float8_e4m3"],
            Self::Float8E5M2 => &["fp8_e5m2"],
            Self::Float8E4M3Fnuz | Self::Float8E5M2Fnuz | Self::Int8 | Self::UInt8 => &[],
        }
    }

    pub const fn bytes(self) -> u64 {
        match self {
            Self::Float32 => 4,
            Self::BFloat16 | Self::Float16 => 2,
            Self::Float8E4M3Fn
            | Self::Float8E5M2
            | Self::Float8E4M3Fnuz
            | Self::Float8E5M2Fnuz
            | Self::Int8
            | Self::UInt8 => 1,
        }
    }

    /// A dtype by name, case-insensitive, with or without a `torch.` prefix.
    pub fn parse(name: &str) -> PlanResult<Self> {
        let lower = name.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("torch.").unwrap_or(&lower);
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == bare || d.aliases().contains(&bare))
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|d| d.as_str()).collect();
                PlanError::new(format!(
                    "unknown dtype {name:?}: use one of {} (or bf16, fp16, fp32, fp8)",
                    known.join(", ")
                ))
            })
    }
}

/// Bytes of one element of a cache dtype, by the names runtimes and Hugging Face use.
pub fn dtype_bytes(name: &str) -> PlanResult<u64> {
    Dtype::parse(name).map(Dtype::bytes)
}
