//! Cache element types: the names configs and runtimes give them, and their sizes.

use crate::error::{quoted, PlanError, PlanResult};

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
    /// NVIDIA's 4-bit float (e2m1) in blocks of 16 values, each block with one fp8 (e4m3)
    /// scale; a cache keeps the scales as their own buffers.
    Nvfp4,
}

impl Dtype {
    pub const ALL: [Self; 10] = [
        Self::BFloat16,
        Self::Float16,
        Self::Float32,
        Self::Float8E4M3Fn,
        Self::Float8E5M2,
        Self::Float8E4M3Fnuz,
        Self::Float8E5M2Fnuz,
        Self::Int8,
        Self::UInt8,
        Self::Nvfp4,
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
            Self::Nvfp4 => "nvfp4",
        }
    }

    const fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::BFloat16 => &["bf16"],
            Self::Float16 => &["fp16", "half"],
            Self::Float32 => &["fp32", "float"],
            Self::Float8E4M3Fn => &["fp8", "float8", "fp8_e4m3", "float8_e4m3"],
            Self::Float8E5M2 => &["fp8_e5m2"],
            Self::Nvfp4 => &["fp4", "float4_e2m1"],
            Self::Float8E4M3Fnuz | Self::Float8E5M2Fnuz | Self::Int8 | Self::UInt8 => &[],
        }
    }

    /// Bits of one value.
    pub const fn bits(self) -> u64 {
        match self {
            Self::Float32 => 32,
            Self::BFloat16 | Self::Float16 => 16,
            Self::Float8E4M3Fn
            | Self::Float8E5M2
            | Self::Float8E4M3Fnuz
            | Self::Float8E5M2Fnuz
            | Self::Int8
            | Self::UInt8 => 8,
            Self::Nvfp4 => 4,
        }
    }

    /// Whether values are one byte of floating point (what FP8 caches store).
    pub const fn is_fp8(self) -> bool {
        matches!(
            self,
            Self::Float8E4M3Fn | Self::Float8E5M2 | Self::Float8E4M3Fnuz | Self::Float8E5M2Fnuz
        )
    }

    /// Values a block shares one scale over, for block-scaled types (NVFP4: 16, each block's
    /// scale one fp8 byte).
    pub const fn scale_block(self) -> Option<u64> {
        match self {
            Self::Nvfp4 => Some(16),
            _ => None,
        }
    }

    /// Bytes of `values` values, which must fill whole bytes (sizes count in bits).
    pub fn bytes_of(self, values: u64, what: &str) -> PlanResult<u64> {
        let bits = values
            .checked_mul(self.bits())
            .ok_or_else(|| PlanError::new(format!("{what}: {values} values overflow")))?;
        if bits % 8 != 0 {
            return Err(PlanError::new(format!(
                "{what}: {values} values of {} ({} bits each) do not fill whole bytes; use a \
                 size that does, or another cache dtype",
                self.as_str(),
                self.bits()
            )));
        }
        Ok(bits / 8)
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
                    "unknown dtype {}: use one of {} (or bf16, fp16, fp32, fp8)",
                    quoted(name),
                    known.join(", ")
                ))
            })
    }
}

/// Bytes of one element of a cache dtype, by the names runtimes and Hugging Face use; a dtype
/// of less than a byte a value has no such size.
pub fn dtype_bytes(name: &str) -> PlanResult<u64> {
    let dtype = Dtype::parse(name)?;
    if dtype.bits() % 8 != 0 {
        return Err(PlanError::new(format!(
            "{} holds {} bits a value, less than a byte: count its sizes in bits",
            dtype.as_str(),
            dtype.bits()
        )));
    }
    Ok(dtype.bits() / 8)
}
