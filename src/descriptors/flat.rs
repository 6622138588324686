//! The fast path of a prepared list: fragments of one descriptor a page, flattened once.

use std::borrow::Borrow;

use super::{Descriptors, FlatJob, FlatPlan, Placed, PARALLEL_FROM};
use crate::limits::MAX_DESCRIPTORS;

impl FlatPlan {
    /// The flat plan of `placed`, or `None` when some fragment is not flat.
    pub fn of<P: Borrow<Placed>>(placed: &[P]) -> Option<Self> {
        let mut plan = Self {
            jobs: Vec::with_capacity(placed.len()),
            src_max_page: u64::MAX,
            dst_max_page: u64::MAX,
            ..Self::default()
        };
        let mut previous = None;
        for p in placed.iter().map(Borrow::borrow) {
            if p.rows != 1 || p.page_count.is_some() || p.page_sizes.is_some() {
                return None;
            }
            plan.src_max_page = plan.src_max_page.min(p.src.max_page?);
            plan.dst_max_page = plan.dst_max_page.min(p.dst.max_page?);
            let same_buffer = previous == Some(p.buffer_index);
            previous = Some(p.buffer_index);
            let reaches_next_page = p.run >= p.src.stride && p.run >= p.dst.stride;
            plan.merges_one_page |= same_buffer || p.run == 0;
            plan.merges_across_pages |= same_buffer || p.run == 0 || reaches_next_page;
            // Placed: base + offset + reach fits 64 bits.
            plan.jobs.push(FlatJob {
                src_start: p.src.base + p.src.offset,
                src_stride: p.src.stride,
                dst_start: p.dst.base + p.dst.offset,
                dst_stride: p.dst.stride,
                len: p.run,
            });
        }
        Some(plan)
    }

    /// Descriptors a request of `pairs` page pairs makes (before coalescing).
    pub fn count(&self, pairs: usize) -> u64 {
        (self.jobs.len() as u64).saturating_mul(pairs as u64)
    }

    /// The request's descriptors, equal to `build_placed` over the same fragments, or `None`
    /// for the general path to build (or refuse).
    pub fn build(
        &self,
        src_pages: &[u64],
        dst_pages: &[u64],
        coalesce: bool,
    ) -> Option<Descriptors> {
        let pairs = src_pages.len();
        if dst_pages.len() != pairs {
            return None;
        }
        let merges = if pairs > 1 {
            self.merges_across_pages
        } else {
            self.merges_one_page
        };
        if coalesce && merges {
            return None;
        }
        let largest = |pages: &[u64]| pages.iter().copied().max().unwrap_or(0);
        if largest(src_pages) > self.src_max_page || largest(dst_pages) > self.dst_max_page {
            return None;
        }
        let total = self.jobs.len().checked_mul(pairs)?;
        if total as u64 > MAX_DESCRIPTORS || total >= PARALLEL_FROM {
            return None;
        }
        let mut out = Descriptors {
            src_addrs: Vec::with_capacity(total),
            dst_addrs: Vec::with_capacity(total),
            lengths: Vec::with_capacity(total),
        };
        if pairs == 0 {
            return Some(out);
        }
        let columns = (
            out.src_addrs.spare_capacity_mut()[..total].chunks_exact_mut(pairs),
            out.dst_addrs.spare_capacity_mut()[..total].chunks_exact_mut(pairs),
            out.lengths.spare_capacity_mut()[..total].chunks_exact_mut(pairs),
        );
        let chunks = columns.0.zip(columns.1).zip(columns.2);
        // Every page is at most its side's max_page, so no sum or product can wrap.
        for (job, ((src, dst), len)) in self.jobs.iter().zip(chunks) {
            let slots = src.iter_mut().zip(dst.iter_mut()).zip(len.iter_mut());
            for (((s, d), l), (&sp, &dp)) in slots.zip(src_pages.iter().zip(dst_pages)) {
                s.write(job.src_start + sp * job.src_stride);
                d.write(job.dst_start + dp * job.dst_stride);
                l.write(job.len);
            }
        }
        // SAFETY: `total` is jobs x pairs, so the chunks of `pairs` slots cover the first
        // `total` slots of each column exactly, one chunk per job, and the inner loop wrote
        // every slot of its chunk (both page lists hold `pairs` entries, checked above).
        unsafe {
            out.src_addrs.set_len(total);
            out.dst_addrs.set_len(total);
            out.lengths.set_len(total);
        }
        Some(out)
    }
}
