//! One transfer fragment: a byte range of every page of one buffer, from one prefill rank to
//! one decode rank, or for token-major pages one run per row. The unit the plan, the wire
//! format and descriptor building share.

use crate::error::{bail, PlanResult};
use crate::layout::{BufferKind, MAX_ROWS_PER_PAGE, MAX_VALUE};
use crate::page::RowRuns;

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
    /// Runs a page: each page moves `rows_per_page` runs of `bytes_per_page / rows_per_page`
    /// bytes, run `r` at `offset + r * row_stride` on each side. 1 (strides 0) is one span.
    pub rows_per_page: u64,
    pub src_row_stride_bytes: u64,
    pub dst_row_stride_bytes: u64,
}

/// Field names in wire order; also the dataclass field order.
pub const FIELD_NAMES: [&str; 13] = [
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
    "rows_per_page",
    "src_row_stride_bytes",
    "dst_row_stride_bytes",
];

/// The fields wire format v1 carries (the reference's); the rest need v2.
pub const V1_FIELD_COUNT: usize = 10;

impl Fragment {
    /// The integer fields with their names, in wire order (`buffer_kind` left out).
    pub fn integer_fields(&self) -> [(&'static str, u64); 11] {
        [
            ("buffer_index", self.buffer_index),
            ("src_rank", self.src_rank),
            ("dst_rank", self.dst_rank),
            ("src_page_stride_bytes", self.src_page_stride_bytes),
            ("dst_page_stride_bytes", self.dst_page_stride_bytes),
            ("src_byte_offset", self.src_byte_offset),
            ("dst_byte_offset", self.dst_byte_offset),
            ("bytes_per_page", self.bytes_per_page),
            ("rows_per_page", self.rows_per_page),
            ("src_row_stride_bytes", self.src_row_stride_bytes),
            ("dst_row_stride_bytes", self.dst_row_stride_bytes),
        ]
    }

    /// Whether the fragment moves more than one run a page (and so needs wire format v2).
    pub const fn is_row_fragment(&self) -> bool {
        self.rows_per_page != 1
    }

    /// Bytes of one run (a row's share of `bytes_per_page`).
    pub const fn run_bytes(&self) -> u64 {
        // `rows_per_page` is validated to be positive; 0 reads as no run at all.
        match self.bytes_per_page.checked_div(self.rows_per_page) {
            Some(run) => run,
            None => 0,
        }
    }

    /// The runs the fragment reads in a source page.
    pub const fn src_runs(&self) -> RowRuns {
        RowRuns {
            offset: self.src_byte_offset,
            rows: self.rows_per_page,
            row_stride: self.src_row_stride_bytes,
            run: self.run_bytes(),
        }
    }

    /// The runs the fragment writes in a destination page.
    pub const fn dst_runs(&self) -> RowRuns {
        RowRuns {
            offset: self.dst_byte_offset,
            rows: self.rows_per_page,
            row_stride: self.dst_row_stride_bytes,
            run: self.run_bytes(),
        }
    }

    /// Every integer lies in [0, 2^63), as the wire format requires.
    pub fn validate(&self) -> PlanResult<()> {
        // One test for the common case (every field in range); the loop names the culprit.
        let any = self
            .integer_fields()
            .iter()
            .fold(self.page_count.unwrap_or(0), |acc, (_, v)| acc | v);
        if any <= MAX_VALUE {
            return self.validate_rows();
        }
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
        self.validate_rows()
    }

    fn validate_rows(&self) -> PlanResult<()> {
        let rows = self.rows_per_page;
        if rows == 0 || rows > MAX_ROWS_PER_PAGE {
            bail!("rows_per_page={rows} must be between 1 and {MAX_ROWS_PER_PAGE}");
        }
        if rows == 1 {
            if self.src_row_stride_bytes != 0 || self.dst_row_stride_bytes != 0 {
                bail!(
                    "a fragment with rows_per_page=1 moves one span a page; its row strides must \
                     be 0, got src_row_stride_bytes={} dst_row_stride_bytes={}",
                    self.src_row_stride_bytes,
                    self.dst_row_stride_bytes
                );
            }
            return Ok(());
        }
        if self.bytes_per_page % rows != 0 {
            bail!(
                "bytes_per_page={} must be a whole number of rows_per_page={rows} runs",
                self.bytes_per_page
            );
        }
        let run = self.run_bytes();
        if self.src_row_stride_bytes < run || self.dst_row_stride_bytes < run {
            bail!(
                "row strides (src {}, dst {}) must be at least the {run}-byte run of a row, or \
                 the rows of one page would overlap",
                self.src_row_stride_bytes,
                self.dst_row_stride_bytes
            );
        }
        Ok(())
    }
}
