//! What each side looks like: its parallel layout (world, DP groups, TP per group) and the
//! buffers it caches, each validated on construction.

use crate::error::{bail, PlanError, PlanResult};

/// Largest accepted world size. Fanout and routing tables hold one entry per rank, so the
/// bound keeps every per-rank allocation finite (and rank products inside 64 bits).
pub const MAX_WORLD_SIZE: u64 = 1 << 20;

/// Every size, offset and index is below 2^63, so it survives any signed 64-bit consumer
/// (Python's C API, numpy int64, the wire format) and byte arithmetic cannot wrap.
pub const MAX_VALUE: u64 = i64::MAX as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "prefill" => Ok(Self::Prefill),
            "decode" => Ok(Self::Decode),
            other => bail!("role must be 'prefill' or 'decode', got {other:?}"),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicalAxis {
    /// Sharded by KV head across TP ranks (possibly in GQA replica groups).
    KvHead,
    /// Sharded by state channel across TP ranks (Mamba / linear attention state).
    StateChannel,
    /// Every TP rank holds the whole buffer (MLA latent cache).
    Replicated,
}

impl LogicalAxis {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "kv_head" => Ok(Self::KvHead),
            "state_channel" => Ok(Self::StateChannel),
            "replicated" => Ok(Self::Replicated),
            other => bail!(
                "logical_axis must be 'kv_head', 'state_channel' or 'replicated', got {other:?}"
            ),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KvHead => "kv_head",
            Self::StateChannel => "state_channel",
            Self::Replicated => "replicated",
        }
    }

    pub const fn is_sharded(self) -> bool {
        !matches!(self, Self::Replicated)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufferKind {
    TargetK,
    TargetV,
    DraftK,
    DraftV,
    MambaState,
}

impl BufferKind {
    pub const ALL: [Self; 5] = [
        Self::TargetK,
        Self::TargetV,
        Self::DraftK,
        Self::DraftV,
        Self::MambaState,
    ];

    pub fn parse(text: &str) -> PlanResult<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| {
                PlanError::new(format!(
                    "buffer_kind must be one of target_k, target_v, draft_k, draft_v, \
                     mamba_state; got {text:?}"
                ))
            })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TargetK => "target_k",
            Self::TargetV => "target_v",
            Self::DraftK => "draft_k",
            Self::DraftV => "draft_v",
            Self::MambaState => "mamba_state",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParallelLayout {
    pub role: Role,
    pub world_size: u64,
    pub dp_size: u64,
}

impl ParallelLayout {
    pub fn new(role: Role, world_size: u64, dp_size: u64) -> PlanResult<Self> {
        if world_size == 0 {
            bail!("world_size must be positive");
        }
        if dp_size == 0 {
            bail!("dp_size must be positive");
        }
        if world_size > MAX_WORLD_SIZE {
            bail!(
                "world_size={world_size} is above the supported maximum of {MAX_WORLD_SIZE} \
                 ranks; plan one slice of the cluster at a time"
            );
        }
        if world_size % dp_size != 0 {
            bail!("world_size={world_size} must be divisible by dp_size={dp_size}");
        }
        Ok(Self {
            role,
            world_size,
            dp_size,
        })
    }

    /// TP ranks in one DP group.
    pub const fn tp_size(&self) -> u64 {
        self.world_size / self.dp_size
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferLayout {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    pub logical_axis: LogicalAxis,
    /// Logical units (heads, channels) in the whole buffer, across all TP ranks.
    pub logical_size: u64,
    pub page_size: u64,
    /// Bytes one logical unit takes in one page of this rank's item.
    pub bytes_per_logical_unit: u64,
    /// Bytes between consecutive pages of this rank's buffer.
    pub item_stride_bytes: u64,
    /// TP ranks that hold the same shard (GQA heads replicated when TP exceeds them).
    pub tp_replica_group_size: u64,
}

impl BufferLayout {
    /// Checks the buffer on its own, as the dataclass does at construction.
    pub fn validate(&self) -> PlanResult<()> {
        let positive = [
            ("logical_size", self.logical_size),
            ("page_size", self.page_size),
            ("bytes_per_logical_unit", self.bytes_per_logical_unit),
            ("item_stride_bytes", self.item_stride_bytes),
            ("tp_replica_group_size", self.tp_replica_group_size),
        ];
        for (name, value) in positive {
            if value == 0 {
                bail!("{name} must be positive");
            }
            if value > MAX_VALUE {
                bail!("{name}={value} must be below 2^63");
            }
        }
        if self.buffer_index > MAX_VALUE {
            bail!("buffer_index={} must be below 2^63", self.buffer_index);
        }
        if self.tp_replica_group_size > MAX_WORLD_SIZE {
            bail!(
                "tp_replica_group_size={} is above the largest world size {MAX_WORLD_SIZE}",
                self.tp_replica_group_size
            );
        }
        match self.logical_size.checked_mul(self.bytes_per_logical_unit) {
            Some(total) if total <= MAX_VALUE => Ok(()),
            _ => bail!(
                "logical_size={} x bytes_per_logical_unit={} must stay below 2^63 bytes",
                self.logical_size,
                self.bytes_per_logical_unit
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer() -> BufferLayout {
        BufferLayout {
            buffer_index: 0,
            buffer_kind: BufferKind::TargetK,
            logical_axis: LogicalAxis::KvHead,
            logical_size: 8,
            page_size: 16,
            bytes_per_logical_unit: 4096,
            item_stride_bytes: 8 * 4096,
            tp_replica_group_size: 1,
        }
    }

    #[test]
    fn parallel_layout_rules() {
        assert_eq!(
            ParallelLayout::new(Role::Prefill, 8, 2).unwrap().tp_size(),
            4
        );
        assert!(ParallelLayout::new(Role::Prefill, 0, 1).is_err());
        assert!(ParallelLayout::new(Role::Prefill, 8, 0).is_err());
        assert!(ParallelLayout::new(Role::Prefill, 8, 3).is_err());
        let err = ParallelLayout::new(Role::Decode, 1 << 31, 1).unwrap_err();
        assert!(err.message().contains("maximum"), "{err}");
    }

    #[test]
    fn names_round_trip() {
        for kind in BufferKind::ALL {
            assert_eq!(BufferKind::parse(kind.as_str()).unwrap(), kind);
        }
        assert!(BufferKind::parse("target_q").is_err());
        assert_eq!(LogicalAxis::parse("kv_head").unwrap(), LogicalAxis::KvHead);
        assert!(LogicalAxis::parse("kv_heads").is_err());
        assert_eq!(Role::parse("decode").unwrap().as_str(), "decode");
        assert!(Role::parse("Decode").is_err());
    }

    #[test]
    fn buffer_rules() {
        assert!(buffer().validate().is_ok());
        for broken in [
            BufferLayout {
                logical_size: 0,
                ..buffer()
            },
            BufferLayout {
                page_size: 0,
                ..buffer()
            },
            BufferLayout {
                bytes_per_logical_unit: 0,
                ..buffer()
            },
            BufferLayout {
                item_stride_bytes: 0,
                ..buffer()
            },
            BufferLayout {
                tp_replica_group_size: 0,
                ..buffer()
            },
            BufferLayout {
                item_stride_bytes: 1 << 63,
                ..buffer()
            },
            BufferLayout {
                logical_size: 1 << 40,
                bytes_per_logical_unit: 1 << 40,
                ..buffer()
            },
        ] {
            assert!(broken.validate().is_err(), "{broken:?}");
        }
    }
}
