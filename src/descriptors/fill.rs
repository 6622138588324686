//! Writing the three columns: one job a fragment, split over two threads for large requests,
//! and coalescing of runs contiguous on both sides.

use std::mem::MaybeUninit;

use super::{Descriptors, Job, PARALLEL_FROM};

impl Job<'_> {
    /// Descriptors this job writes (checked against `MAX_DESCRIPTORS` before jobs are made).
    fn count(&self) -> usize {
        self.src_pages.len() * self.rows
    }
}

/// Where to split jobs of these descriptor counts between two threads: the first job index
/// of the second half (where the running count passes half) and the first half's count.
pub(crate) fn split_in_half(counts: impl Iterator<Item = usize> + Clone) -> (usize, usize) {
    let total: usize = counts.clone().sum();
    let (mut running, mut split) = (0, 0);
    for count in counts {
        running += count;
        split += 1;
        if running >= total / 2 {
            break;
        }
    }
    (split, running)
}

/// Writes every job's descriptors, in job order, into the (empty) columns of `out`.
pub(super) fn fill_columns(jobs: &[Job<'_>], out: &mut Descriptors, total: usize) {
    type Slots<'s> = &'s mut [MaybeUninit<u64>];
    /// One column: `start + page * stride + row * row_stride` for every page, then row.
    fn addresses(
        out: Slots<'_>,
        pages: &[u64],
        rows: usize,
        (start, stride, row_stride): (u64, u64, u64),
    ) {
        if rows == 1 {
            for (slot, &page) in out.iter_mut().zip(pages) {
                slot.write(start + page * stride);
            }
            return;
        }
        for (page_slots, &page) in out.chunks_exact_mut(rows).zip(pages) {
            let mut address = start + page * stride;
            for slot in page_slots {
                slot.write(address);
                // Every written address was checked to be in bounds, but the one after the
                // last row (computed, never written) may pass 2^64: it wraps, unused.
                address = address.wrapping_add(row_stride);
            }
        }
    }
    fn fill(jobs: &[Job<'_>], mut src: Slots<'_>, mut dst: Slots<'_>, mut len: Slots<'_>) {
        for job in jobs {
            let n = job.count();
            let (src_head, src_rest) = std::mem::take(&mut src).split_at_mut(n);
            let (dst_head, dst_rest) = std::mem::take(&mut dst).split_at_mut(n);
            let (len_head, len_rest) = std::mem::take(&mut len).split_at_mut(n);
            if job.rows == 1 {
                // One descriptor a page (head-major and whole pages): one pass.
                let pages = job.src_pages.iter().zip(job.dst_pages);
                let slots = src_head.iter_mut().zip(dst_head.iter_mut()).zip(len_head);
                for (((s, d), l), (&sp, &dp)) in slots.zip(pages) {
                    s.write(job.src_start + sp * job.src_stride);
                    d.write(job.dst_start + dp * job.dst_stride);
                    l.write(job.len);
                }
            } else {
                let src_layout = (job.src_start, job.src_stride, job.src_row_stride);
                let dst_layout = (job.dst_start, job.dst_stride, job.dst_row_stride);
                addresses(src_head, job.src_pages, job.rows, src_layout);
                addresses(dst_head, job.dst_pages, job.rows, dst_layout);
                for slot in len_head.iter_mut() {
                    slot.write(job.len);
                }
            }
            (src, dst, len) = (src_rest, dst_rest, len_rest);
        }
    }
    let src = &mut out.src_addrs.spare_capacity_mut()[..total];
    let dst = &mut out.dst_addrs.spare_capacity_mut()[..total];
    let len = &mut out.lengths.spare_capacity_mut()[..total];
    if total < PARALLEL_FROM || jobs.len() < 2 {
        fill(jobs, src, dst, len);
    } else {
        let (split, first) = split_in_half(jobs.iter().map(Job::count));
        let (jobs_a, jobs_b) = jobs.split_at(split);
        let (src_a, src_b) = src.split_at_mut(first);
        let (dst_a, dst_b) = dst.split_at_mut(first);
        let (len_a, len_b) = len.split_at_mut(first);
        std::thread::scope(|scope| {
            scope.spawn(|| fill(jobs_b, src_b, dst_b, len_b));
            fill(jobs_a, src_a, dst_a, len_a);
        });
    }
    // SAFETY: the jobs' counts (pages x rows) add up to `total` (the caller computed both from
    // the same fragments), and `fill` wrote every one of the first `total` slots of each column
    // exactly once (`addresses` writes one slot per page and row; `chunks_exact_mut(rows)` over
    // `pages.len() * rows` slots leaves no remainder); a panic in a thread would have
    // propagated out of `scope` before this point.
    unsafe {
        out.src_addrs.set_len(total);
        out.dst_addrs.set_len(total);
        out.lengths.set_len(total);
    }
}

impl Job<'_> {
    /// Whether coalescing can merge anything: some job's descriptors may continue each other,
    /// or a job follows another of the same buffer.
    pub(super) fn any_may_merge(jobs: &[Self]) -> bool {
        // A job that writes nothing sits between no two descriptors: the one before it that
        // writes is the neighbour.
        let mut previous_buffer = None;
        jobs.iter().filter(|job| job.count() > 0).any(|job| {
            let joins = previous_buffer == Some(job.buffer_index);
            previous_buffer = Some(job.buffer_index);
            joins || job.may_merge_within()
        })
    }

    /// Whether two of this job's own descriptors can ever continue each other. Pages only grow
    /// apart by whole strides: a run shorter than the stride to its next row (or page) on
    /// either side can never reach it, whatever the page indices.
    fn may_merge_within(&self) -> bool {
        let rows = self.rows as u64;
        let row_reach = self.len >= self.src_row_stride && self.len >= self.dst_row_stride;
        // From a page's last row to the next page's first row, at least one stride on.
        let src_tail = (rows - 1) * self.src_row_stride + self.len;
        let dst_tail = (rows - 1) * self.dst_row_stride + self.len;
        let page_reach = src_tail >= self.src_stride && dst_tail >= self.dst_stride;
        // Empty runs continue each other wherever they repeat an address.
        self.len == 0 || (rows > 1 && row_reach) || (self.src_pages.len() > 1 && page_reach)
    }
}

impl Descriptors {
    /// Whether descriptors `a` and `b` continue each other on both sides.
    fn continues(&self, a: usize, b: usize) -> bool {
        // Both ends were checked to stay inside 64 bits, so the sums cannot wrap.
        self.src_addrs[a] + self.lengths[a] == self.src_addrs[b]
            && self.dst_addrs[a] + self.lengths[a] == self.dst_addrs[b]
    }

    /// Merges, in place, each descriptor that continues the previous one on both sides
    /// (src end == next src and dst end == next dst) within one buffer; `jobs` wrote the
    /// descriptors, in order. Buffers are registered with an engine one by one, so a
    /// descriptor never spans two even where they touch. Jobs whose descriptors cannot
    /// continue each other (the common case: a head slice inside a page) cost nothing unless
    /// something before them merged.
    pub(super) fn coalesce(&mut self, jobs: &[Job<'_>]) {
        let mut kept = 0;
        let mut start = 0;
        let mut previous_buffer = None;
        for job in jobs {
            let count = job.count();
            let end = start + count;
            if count == 0 {
                continue; // writes nothing, so the descriptor before it stays the neighbour
            }
            let joins_previous = previous_buffer == Some(job.buffer_index);
            previous_buffer = Some(job.buffer_index);
            if kept == start && !job.may_merge_within() {
                // Nothing moved yet and nothing merges inside: only the first may join.
                if joins_previous && kept > 0 && self.continues(kept - 1, start) {
                    self.lengths[kept - 1] += self.lengths[start];
                    self.compact(start + 1..end, &mut kept, false);
                } else {
                    kept = end;
                }
            } else {
                self.compact(start..end, &mut kept, joins_previous);
            }
            start = end;
        }
        self.src_addrs.truncate(kept);
        self.dst_addrs.truncate(kept);
        self.lengths.truncate(kept);
    }

    /// Moves `range` down to `kept`, merging each descriptor into the one before it where it
    /// continues it (the first only when `join_first`).
    fn compact(&mut self, range: std::ops::Range<usize>, kept: &mut usize, join_first: bool) {
        let first = range.start;
        for i in range {
            if *kept > 0 && (i > first || join_first) && self.continues(*kept - 1, i) {
                self.lengths[*kept - 1] += self.lengths[i];
                continue;
            }
            self.src_addrs[*kept] = self.src_addrs[i];
            self.dst_addrs[*kept] = self.dst_addrs[i];
            self.lengths[*kept] = self.lengths[i];
            *kept += 1;
        }
    }
}
