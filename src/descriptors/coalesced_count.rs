//! How many descriptors the flat, coalesced path writes for a request, without writing them: a
//! strided list standing for more rows than that is no compression, and is written flat instead.
//!
//! Coalescing merges each descriptor that continues the one before it on both sides, within one
//! buffer; so the count is every descriptor less each such pair. Within a run of page pairs of
//! constant steps every page continues its predecessor or none does, so the pairs are counted
//! a run at a time, and the pairs between runs and between jobs one by one.

use super::strided::PageRun;
use super::Job;

/// Whether `(src, dst)` ends (a descriptor of `len` bytes there) where `next` starts.
fn continues((src, dst): (u64, u64), len: u64, next: (u64, u64)) -> bool {
    src.checked_add(len) == Some(next.0) && dst.checked_add(len) == Some(next.1)
}

impl Job<'_> {
    /// Where row `row` of page pair `i` starts on each side (a written, bounds-checked
    /// descriptor's address, so nothing wraps).
    fn start_of(&self, i: usize, row: usize) -> (u64, u64) {
        let row = row as u64;
        (
            self.src_start + self.src_pages[i] * self.src_stride + row * self.src_row_stride,
            self.dst_start + self.dst_pages[i] * self.dst_stride + row * self.dst_row_stride,
        )
    }

    /// Pairs of this job's own descriptors that continue each other, over `runs` of its pages.
    fn joins_within(&self, runs: &[PageRun]) -> usize {
        let used = self.src_pages.len();
        let rows = self.rows;
        let mut joins = 0;
        if rows > 1 && self.len == self.src_row_stride && self.len == self.dst_row_stride {
            joins += used * (rows - 1);
        }
        // From a page's last row's end to the next page's first row.
        let last_row = rows as u64 - 1;
        let tail = (
            last_row * self.src_row_stride + self.len,
            last_row * self.dst_row_stride + self.len,
        );
        for run in runs.iter().take_while(|run| run.start < used) {
            let count = run.count.min(used - run.start);
            let step = (
                run.steps.0.checked_mul(self.src_stride),
                run.steps.1.checked_mul(self.dst_stride),
            );
            if count > 1 && step == (Some(tail.0), Some(tail.1)) {
                joins += count - 1;
            }
            if run.start > 0 {
                let end = self.start_of(run.start - 1, rows - 1);
                joins += usize::from(continues(end, self.len, self.start_of(run.start, 0)));
            }
        }
        joins
    }
}

/// The descriptors `build_placed` writes for `jobs` with coalescing, `runs` being the runs of
/// the request's page pairs.
pub(super) fn coalesced_count(jobs: &[Job<'_>], runs: &[PageRun]) -> usize {
    let mut count = 0;
    // The last descriptor written so far: its buffer and where it starts.
    let mut last: Option<(u64, (u64, u64), u64)> = None;
    for job in jobs
        .iter()
        .filter(|job| !job.src_pages.is_empty() && job.rows > 0)
    {
        let used = job.src_pages.len();
        count += used * job.rows - job.joins_within(runs);
        if let Some((buffer, end, len)) = last {
            if buffer == job.buffer_index && continues(end, len, job.start_of(0, 0)) {
                count -= 1;
            }
        }
        last = Some((
            job.buffer_index,
            job.start_of(used - 1, job.rows - 1),
            job.len,
        ));
    }
    count
}
