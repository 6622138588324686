//! One transfer fragment: a byte range of every page of one buffer, from one prefill rank to
//! one decode rank. The unit the plan, the wire format and descriptor building share.

use crate::error::{bail, PlanResult};
use crate::layout::{BufferKind, MAX_VALUE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fragment {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    pub src_rank: u64,
    pub dst_rank: u64,
    pub src_page_stride_bytes: u64,
    pub dst_page_stride_bytes: u64,
    pub src_byte_offset: u64,
    pub dst_byte_offset: u64,
    pub bytes_per_page: u64,
    /// Limits the fragment to the first `page_count` pages of a request; `None` means all.
    pub page_count: Option<u64>,
}

/// Field names in wire order; also the dataclass field order.
pub const FIELD_NAMES: [&str; 10] = [
    "buffer_index",
    "buffer_kind",
    "src_rank",
    "dst_rank",
    "src_page_stride_bytes",
    "dst_page_stride_bytes",
    "src_byte_offset",
    "dst_byte_offset",
    "bytes_per_page",
    "page_count",
];

impl Fragment {
    /// The integer fields with their names, in wire order (`buffer_kind` left out).
    pub fn integer_fields(&self) -> [(&'static str, u64); 8] {
        [
            ("buffer_index", self.buffer_index),
            ("src_rank", self.src_rank),
            ("dst_rank", self.dst_rank),
            ("src_page_stride_bytes", self.src_page_stride_bytes),
            ("dst_page_stride_bytes", self.dst_page_stride_bytes),
            ("src_byte_offset", self.src_byte_offset),
            ("dst_byte_offset", self.dst_byte_offset),
            ("bytes_per_page", self.bytes_per_page),
        ]
    }

    /// Every integer lies in [0, 2^63), as the wire format requires.
    pub fn validate(&self) -> PlanResult<()> {
        for (name, value) in self.integer_fields() {
            if value > MAX_VALUE {
                bail!("{name}={value} must be below 2^63");
            }
        }
        if let Some(pages) = self.page_count {
            if pages > MAX_VALUE {
                bail!("page_count={pages} must be below 2^63");
            }
        }
        Ok(())
    }
}
