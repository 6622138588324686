//! Page geometry: where a rank's units sit in the bytes of one page of its item, and the byte
//! runs one fragment moves in each page. Head-major pages hold a rank's units one after another
//! (one row); token-major pages hold them row by row (a row per token, or per token and plane).

use crate::layout::BufferLayout;
use crate::routing::UnitOverlap;

/// How a rank's units lie in one page of its item: `rows` rows `row_stride` bytes apart, each
/// holding every unit's `unit_row_bytes` bytes in the rank's unit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    pub rows: u64,
    pub row_stride: u64,
    pub unit_row_bytes: u64,
}

impl PageGeometry {
    /// The geometry of a validated buffer (`rows_per_page` divides both sizes).
    pub const fn of(buffer: &BufferLayout) -> Self {
        Self {
            rows: buffer.rows_per_page,
            row_stride: buffer.item_stride_bytes / buffer.rows_per_page,
            unit_row_bytes: buffer.bytes_per_logical_unit / buffer.rows_per_page,
        }
    }

    /// The byte within row `row` where local unit `unit` starts.
    pub const fn unit_byte(self, row: u64, unit: u64) -> u64 {
        row * self.row_stride + unit * self.unit_row_bytes
    }
}

/// The bytes one fragment moves in each page: `rows` runs of `bytes_per_page / rows` bytes,
/// run `r` at `offset + r * row_stride` on each side (one run when `rows == 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub src_offset: u64,
    pub dst_offset: u64,
    pub bytes_per_page: u64,
    pub rows: u64,
    pub src_row_stride: u64,
    pub dst_row_stride: u64,
}

impl Span {
    /// One contiguous run per page.
    pub const fn contiguous(src_offset: u64, dst_offset: u64, len: u64) -> Self {
        Self {
            src_offset,
            dst_offset,
            bytes_per_page: len,
            rows: 1,
            src_row_stride: 0,
            dst_row_stride: 0,
        }
    }

    /// The span that carries `overlap` from a prefill page to a decode page. Rows that are
    /// whole and dense on both sides collapse to one run, so head-major pages (one row) keep
    /// the reference's fragments.
    pub fn of_units(overlap: &UnitOverlap, prefill: &BufferLayout, decode: &BufferLayout) -> Self {
        let (src, dst) = (PageGeometry::of(prefill), PageGeometry::of(decode));
        // Offsets stay below logical_size * bytes_per_logical_unit < 2^63 (validated).
        let run = overlap.len * src.unit_row_bytes;
        let src_offset = overlap.src_local * src.unit_row_bytes;
        let dst_offset = overlap.dst_local * dst.unit_row_bytes;
        let dense = run == src.row_stride && run == dst.row_stride;
        if src.rows == 1 || dense {
            return Self::contiguous(src_offset, dst_offset, run * src.rows);
        }
        Self {
            src_offset,
            dst_offset,
            bytes_per_page: run * src.rows,
            rows: src.rows,
            src_row_stride: src.row_stride,
            dst_row_stride: dst.row_stride,
        }
    }
}

/// One side of a fragment's runs in a page: `rows` runs of `run` bytes, run `r` at
/// `offset + r * row_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRuns {
    pub offset: u64,
    pub rows: u64,
    pub row_stride: u64,
    pub run: u64,
}

impl RowRuns {
    /// Bytes from a page's start to the end of its last run, `None` past 2^64.
    pub fn reach(self) -> Option<u64> {
        self.rows
            .checked_sub(1)?
            .checked_mul(self.row_stride)?
            .checked_add(self.offset)?
            .checked_add(self.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LogicalAxis, LogicalParts};

    #[test]
    fn token_major_rows_become_runs_unless_dense() {
        let buffer = |heads_held: u64| BufferLayout {
            buffer_index: 0,
            buffer_kind: crate::layout::BufferKind::TargetK,
            logical_axis: LogicalAxis::KvHead,
            logical_size: 8,
            page_size: 16,
            bytes_per_logical_unit: 16 * 256,
            item_stride_bytes: heads_held * 16 * 256,
            tp_replica_group_size: 1,
            layer: None,
            rows_per_page: 16,
            logical_parts: LogicalParts::WHOLE,
        };
        let one_head = UnitOverlap {
            prefill_tp_rank: 5,
            src_local: 0,
            dst_local: 1,
            len: 1,
        };
        let span = Span::of_units(&one_head, &buffer(1), &buffer(4));
        assert_eq!(
            span,
            Span {
                src_offset: 0,
                dst_offset: 256,
                bytes_per_page: 16 * 256,
                rows: 16,
                src_row_stride: 256,
                dst_row_stride: 1024,
            }
        );
        let whole = UnitOverlap {
            len: 4,
            dst_local: 0,
            ..one_head
        };
        assert_eq!(
            Span::of_units(&whole, &buffer(4), &buffer(4)),
            Span::contiguous(0, 0, 4 * 16 * 256)
        );
    }

    #[test]
    fn reach_ends_at_the_last_run() {
        let runs = RowRuns {
            offset: 8,
            rows: 3,
            row_stride: 100,
            run: 10,
        };
        assert_eq!(runs.reach(), Some(218));
        assert_eq!(RowRuns { rows: 1, ..runs }.reach(), Some(18));
        assert_eq!(RowRuns { rows: 0, ..runs }.reach(), None);
        let huge = RowRuns {
            row_stride: u64::MAX,
            ..runs
        };
        assert_eq!(huge.reach(), None);
    }
}
