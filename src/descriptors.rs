//! Per-request transfer descriptors: fragments x page pairs -> (src address, dst address,
//! length), in one pass, bounds-checked before anything is written, optionally coalesced.
//!
//! Order: fragments as given, pages as given, then rows. Fragment `f`, page pair `i` and row `r`
//! give `src_bases[f.buffer_index] + src_pages[i] * f.src_page_stride_bytes +
//! f.src_byte_offset + r * f.src_row_stride_bytes` (and the same for dst),
//! `f.bytes_per_page / f.rows_per_page` long; a fragment's `page_count` limits it to the first
//! `page_count` pairs.

use std::mem::MaybeUninit;

use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::Fragment;

/// Most descriptors one call may produce (24 bytes each: 6 GiB); a larger request is refused
/// before anything is allocated for it, rather than exhausting memory.
pub const MAX_DESCRIPTORS: u64 = 1 << 28;

/// Where descriptors point: per `buffer_index`, the buffer's base address and optionally how
/// many bytes from the base may be touched.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    pub name: &'static str,
    pub bases: &'a [u64],
    pub pages: &'a [u64],
    pub limits: Option<&'a [u64]>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptors {
    pub src_addrs: Vec<u64>,
    pub dst_addrs: Vec<u64>,
    pub lengths: Vec<u64>,
}

impl Descriptors {
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }
}

/// Pages a fragment uses: all pairs, or the first `page_count` of them.
fn pages_used(fragment: &Fragment, pairs: usize) -> usize {
    fragment.page_count.map_or(pairs, |count| {
        usize::try_from(count).unwrap_or(usize::MAX).min(pairs)
    })
}

/// `prefix_max[i]` = the largest page among the first `i + 1`.
fn prefix_max(pages: &[u64]) -> Vec<u64> {
    pages
        .iter()
        .scan(0u64, |max, &page| {
            *max = (*max).max(page);
            Some(*max)
        })
        .collect()
}

/// Checks that every descriptor of `fragment` on `side` stays inside 64 bits and inside the
/// buffer's limit; since offsets grow with the page and the row, checking the last row of the
/// largest page checks them all.
fn check_side(
    side: &Side<'_>,
    position: usize,
    fragment: &Fragment,
    largest_page: u64,
    (stride, offset, row_stride): (u64, u64, u64),
) -> PlanResult<u64> {
    let name = side.name;
    let index = fragment.buffer_index;
    let base = usize::try_from(index)
        .ok()
        .and_then(|i| side.bases.get(i))
        .copied();
    let Some(base) = base else {
        bail!(
            "fragment {position} names buffer_index={index}, but {name}_base_ptrs has {} \
             entries; pass a base pointer for every buffer the fragments use",
            side.bases.len()
        );
    };
    let last_row = (fragment.rows_per_page - 1).checked_mul(row_stride);
    let end = largest_page
        .checked_mul(stride)
        .and_then(|v| v.checked_add(offset))
        .and_then(|v| v.checked_add(last_row?))
        .and_then(|v| v.checked_add(fragment.run_bytes()));
    let Some(end) = end else {
        bail!(
            "fragment {position} on the {name} side: page {largest_page} x stride {stride} + \
             offset {offset} + {} rows x {row_stride} + {} bytes overflows 64 bits",
            fragment.rows_per_page - 1,
            fragment.run_bytes()
        );
    };
    if base.checked_add(end).is_none() {
        bail!(
            "fragment {position} on the {name} side: base 0x{base:x} + {end} bytes overflows \
             64 bits"
        );
    }
    if let Some(limits) = side.limits {
        let limit = usize::try_from(index)
            .ok()
            .and_then(|i| limits.get(i))
            .copied();
        let Some(limit) = limit else {
            bail!(
                "{name}_limits has {} entries but fragment {position} uses buffer_index={index}; \
                 give a limit for every buffer",
                limits.len()
            );
        };
        if end > limit {
            bail!(
                "fragment {position} (buffer_index={index}) would reach byte {end} of the {name} \
                 buffer, past its limit of {limit} bytes (page {largest_page}, stride {stride}, \
                 offset {offset}, {} bytes); check the page indices and the plan's strides",
                fragment.run_bytes()
            );
        }
    }
    Ok(base)
}

/// One fragment's share of the output: its pages, rows and where its bytes start on each side.
struct Job<'a> {
    buffer_index: u64,
    src_pages: &'a [u64],
    dst_pages: &'a [u64],
    src_start: u64,
    src_stride: u64,
    dst_start: u64,
    dst_stride: u64,
    rows: usize,
    src_row_stride: u64,
    dst_row_stride: u64,
    len: u64,
}

impl Job<'_> {
    /// Descriptors this job writes (checked against `MAX_DESCRIPTORS` before jobs are made).
    fn count(&self) -> usize {
        self.src_pages.len() * self.rows
    }
}

/// Below this many descriptors one thread fills the columns; above it, two (the columns are
/// memory-bound, and a second core's bandwidth roughly halves the time).
const PARALLEL_FROM: usize = 1 << 16;

/// Writes every job's descriptors, in job order, into the (empty) columns of `out`.
fn fill_columns(jobs: &[Job<'_>], out: &mut Descriptors, total: usize) {
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
                address += row_stride;
            }
        }
    }
    fn fill(jobs: &[Job<'_>], mut src: Slots<'_>, mut dst: Slots<'_>, mut len: Slots<'_>) {
        for job in jobs {
            let n = job.count();
            let (src_head, src_rest) = std::mem::take(&mut src).split_at_mut(n);
            let (dst_head, dst_rest) = std::mem::take(&mut dst).split_at_mut(n);
            let (len_head, len_rest) = std::mem::take(&mut len).split_at_mut(n);
            let src_layout = (job.src_start, job.src_stride, job.src_row_stride);
            let dst_layout = (job.dst_start, job.dst_stride, job.dst_row_stride);
            addresses(src_head, job.src_pages, job.rows, src_layout);
            addresses(dst_head, job.dst_pages, job.rows, dst_layout);
            for slot in len_head.iter_mut() {
                slot.write(job.len);
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
        // Split the jobs where the running descriptor count passes half.
        let mut running = 0;
        let split = jobs
            .iter()
            .position(|job| {
                running += job.count();
                running >= total / 2
            })
            .map_or(jobs.len(), |i| i + 1);
        let first: usize = jobs[..split].iter().map(Job::count).sum();
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

/// Builds the descriptors, or refuses before producing any.
pub fn build(
    fragments: &[Fragment],
    src: &Side<'_>,
    dst: &Side<'_>,
    coalesce: bool,
) -> PlanResult<Descriptors> {
    if src.pages.len() != dst.pages.len() {
        bail!(
            "src_pages has {} entries and dst_pages {}; pages are paired by position, so give \
             both the same length",
            src.pages.len(),
            dst.pages.len()
        );
    }
    let pairs = src.pages.len();
    let (src_max, dst_max) = (prefix_max(src.pages), prefix_max(dst.pages));
    let mut bases = Vec::with_capacity(fragments.len());
    let mut total: u64 = 0;
    for (position, fragment) in fragments.iter().enumerate() {
        fragment
            .validate()
            .map_err(|e| PlanError::new(format!("fragment {position}: {e}")))?;
        let used = pages_used(fragment, pairs);
        total = total.saturating_add((used as u64).saturating_mul(fragment.rows_per_page));
        let Some(last) = used.checked_sub(1) else {
            bases.push((0, 0));
            continue;
        };
        let (Some(&src_page), Some(&dst_page)) = (src_max.get(last), dst_max.get(last)) else {
            bail!("page index out of range");
        };
        let src_layout = (
            fragment.src_page_stride_bytes,
            fragment.src_byte_offset,
            fragment.src_row_stride_bytes,
        );
        let dst_layout = (
            fragment.dst_page_stride_bytes,
            fragment.dst_byte_offset,
            fragment.dst_row_stride_bytes,
        );
        let src_base = check_side(src, position, fragment, src_page, src_layout)?;
        let dst_base = check_side(dst, position, fragment, dst_page, dst_layout)?;
        bases.push((src_base, dst_base));
    }
    if total > MAX_DESCRIPTORS {
        bail!(
            "{total} descriptors exceed the limit of {MAX_DESCRIPTORS} for one call; split the \
             request's pages or fragments"
        );
    }
    let total = usize::try_from(total).unwrap_or(0);
    let jobs: Vec<Job<'_>> = fragments
        .iter()
        .zip(bases)
        .map(|(fragment, (src_base, dst_base))| {
            let used = pages_used(fragment, pairs);
            Job {
                buffer_index: fragment.buffer_index,
                src_pages: &src.pages[..used],
                dst_pages: &dst.pages[..used],
                // Every value was bounds-checked above, so this arithmetic cannot wrap.
                src_start: src_base + fragment.src_byte_offset,
                src_stride: fragment.src_page_stride_bytes,
                dst_start: dst_base + fragment.dst_byte_offset,
                dst_stride: fragment.dst_page_stride_bytes,
                // Validated to be at most MAX_ROWS_PER_PAGE (2^20).
                rows: usize::try_from(fragment.rows_per_page).unwrap_or(1),
                src_row_stride: fragment.src_row_stride_bytes,
                dst_row_stride: fragment.dst_row_stride_bytes,
                len: fragment.run_bytes(),
            }
        })
        .collect();
    let mut out = Descriptors {
        src_addrs: Vec::with_capacity(total),
        dst_addrs: Vec::with_capacity(total),
        lengths: Vec::with_capacity(total),
    };
    fill_columns(&jobs, &mut out, total);
    if coalesce {
        out.coalesce(jobs.iter().map(|job| (job.count(), job.buffer_index)));
    }
    Ok(out)
}

impl Descriptors {
    /// Merges, in place, each descriptor that continues the previous one on both sides
    /// (src end == next src and dst end == next dst) within one buffer: `runs` gives, in
    /// order, how many descriptors each fragment wrote and its buffer. Buffers are registered
    /// with an engine one by one, so a descriptor never spans two even where they touch.
    fn coalesce(&mut self, runs: impl Iterator<Item = (usize, u64)>) {
        let buffer_of = runs.flat_map(|(count, buffer)| std::iter::repeat_n(buffer, count));
        let mut kept = 0;
        let mut last_buffer = None;
        for (i, buffer) in buffer_of.enumerate() {
            let (src, dst, len) = (self.src_addrs[i], self.dst_addrs[i], self.lengths[i]);
            let same_buffer = last_buffer.replace(buffer) == Some(buffer);
            if kept > 0 && same_buffer {
                let last = kept - 1;
                let end = self.lengths[last];
                // Both ends were checked to stay inside 64 bits, so the sums cannot wrap.
                if self.src_addrs[last] + end == src && self.dst_addrs[last] + end == dst {
                    self.lengths[last] += len;
                    continue;
                }
            }
            self.src_addrs[kept] = src;
            self.dst_addrs[kept] = dst;
            self.lengths[kept] = len;
            kept += 1;
        }
        self.src_addrs.truncate(kept);
        self.dst_addrs.truncate(kept);
        self.lengths.truncate(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::BufferKind;

    fn fragment(buffer_index: u64, src_off: u64, dst_off: u64, len: u64) -> Fragment {
        Fragment {
            buffer_index,
            buffer_kind: BufferKind::TargetK,
            src_rank: 0,
            dst_rank: 0,
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 128,
            src_byte_offset: src_off,
            dst_byte_offset: dst_off,
            bytes_per_page: len,
            page_count: None,
            rows_per_page: 1,
            src_row_stride_bytes: 0,
            dst_row_stride_bytes: 0,
        }
    }

    fn side<'a>(name: &'static str, bases: &'a [u64], pages: &'a [u64]) -> Side<'a> {
        Side {
            name,
            bases,
            pages,
            limits: None,
        }
    }

    #[test]
    fn one_descriptor_per_fragment_and_page_in_order() {
        let fragments = [fragment(0, 0, 64, 64), fragment(1, 0, 0, 32)];
        let out = build(
            &fragments,
            &side("src", &[1000, 5000], &[2, 0]),
            &side("dst", &[9000, 20000], &[1, 3]),
            false,
        )
        .unwrap();
        assert_eq!(out.src_addrs, vec![1000 + 128, 1000, 5000 + 128, 5000]);
        assert_eq!(
            out.dst_addrs,
            vec![9000 + 128 + 64, 9000 + 384 + 64, 20000 + 128, 20000 + 384]
        );
        assert_eq!(out.lengths, vec![64, 64, 32, 32]);
    }

    #[test]
    fn contiguous_runs_coalesce_on_both_sides_only() {
        // Whole items: stride == length on both sides, so consecutive pages continue each other.
        let whole = Fragment {
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 64,
            ..fragment(0, 0, 0, 64)
        };
        let out = build(
            &[whole],
            &side("src", &[0], &[0, 1, 2, 5, 6]),
            &side("dst", &[0], &[10, 11, 12, 13, 14]),
            true,
        )
        .unwrap();
        assert_eq!(out.src_addrs, vec![0, 320]);
        assert_eq!(out.dst_addrs, vec![640, 832]);
        assert_eq!(out.lengths, vec![192, 128]);
    }

    #[test]
    fn large_requests_split_over_two_threads_give_the_same_columns() {
        let pages: Vec<u64> = (0..3000).rev().collect();
        let fragments: Vec<Fragment> = (0..50)
            .map(|i| Fragment {
                page_count: (i % 7 == 0).then_some(1000),
                ..fragment(i % 3, i, 2 * i, 8)
            })
            .collect();
        let out = build(
            &fragments,
            &side("src", &[0, 1 << 30, 1 << 31], &pages),
            &side("dst", &[5, 1 << 32, 1 << 33], &pages),
            false,
        )
        .unwrap();
        assert!(out.len() > PARALLEL_FROM);
        let mut expected = Descriptors::default();
        for f in &fragments {
            let used = pages_used(f, pages.len());
            let (sb, db) = (
                [0, 1 << 30, 1 << 31][usize::try_from(f.buffer_index).unwrap()],
                [5, 1 << 32, 1 << 33][usize::try_from(f.buffer_index).unwrap()],
            );
            for &p in &pages[..used] {
                expected.src_addrs.push(sb + p * 64 + f.src_byte_offset);
                expected.dst_addrs.push(db + p * 128 + f.dst_byte_offset);
                expected.lengths.push(8);
            }
        }
        assert_eq!(out, expected);
    }

    #[test]
    fn row_fragments_give_one_descriptor_per_page_and_row() {
        // Two rows a page: 8-byte runs 16 bytes apart at the source, 32 at the destination.
        let rows = Fragment {
            bytes_per_page: 16,
            rows_per_page: 2,
            src_row_stride_bytes: 16,
            dst_row_stride_bytes: 32,
            ..fragment(0, 4, 8, 16)
        };
        let out = build(
            &[rows],
            &side("src", &[1000], &[0, 3]),
            &side("dst", &[0], &[1, 0]),
            false,
        )
        .unwrap();
        assert_eq!(out.src_addrs, vec![1004, 1020, 1196, 1212]);
        assert_eq!(out.dst_addrs, vec![136, 168, 8, 40]);
        assert_eq!(out.lengths, vec![8; 4]);
        // Dense rows (run == row stride on both sides) merge into one descriptor a page.
        let dense = Fragment {
            bytes_per_page: 32,
            rows_per_page: 4,
            src_row_stride_bytes: 8,
            dst_row_stride_bytes: 8,
            src_page_stride_bytes: 32,
            dst_page_stride_bytes: 64,
            ..fragment(0, 0, 0, 32)
        };
        let out = build(
            &[dense],
            &side("src", &[0], &[0, 1]),
            &side("dst", &[0], &[0, 1]),
            true,
        )
        .unwrap();
        assert_eq!((out.src_addrs, out.lengths), (vec![0, 32], vec![32, 32]));
        let limited = Side {
            limits: Some(&[1196 + 16 + 8 - 1000]),
            ..side("src", &[1000], &[0, 3])
        };
        assert!(build(&[rows], &limited, &side("dst", &[0], &[1, 0]), false).is_ok());
        let short = Side {
            limits: Some(&[1196 + 16 + 8 - 1000 - 1]),
            ..side("src", &[1000], &[0, 3])
        };
        assert!(build(&[rows], &short, &side("dst", &[0], &[1, 0]), false).is_err());
    }

    #[test]
    fn touching_buffers_never_merge_into_one_descriptor() {
        // Buffer 1 starts where buffer 0 ends, on both sides: the last page of the first
        // fragment and the first page of the second continue each other in memory.
        let whole = |buffer_index| Fragment {
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 64,
            ..fragment(buffer_index, 0, 0, 64)
        };
        let out = build(
            &[whole(0), whole(1)],
            &side("src", &[0, 128], &[0, 1]),
            &side("dst", &[1000, 1128], &[0, 1]),
            true,
        )
        .unwrap();
        assert_eq!(out.src_addrs, vec![0, 128]);
        assert_eq!(out.lengths, vec![128, 128]);
    }

    #[test]
    fn page_count_limits_the_pages() {
        let limited = Fragment {
            page_count: Some(1),
            ..fragment(0, 0, 0, 8)
        };
        let out = build(
            &[limited],
            &side("src", &[0], &[4, 5]),
            &side("dst", &[0], &[6, 7]),
            false,
        )
        .unwrap();
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn refusals() {
        let f = [fragment(1, 0, 0, 64)];
        let err = build(
            &f,
            &side("src", &[0], &[0]),
            &side("dst", &[0, 0], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("src_base_ptrs has 1"), "{err}");
        let err = build(
            &f,
            &side("src", &[0, 0], &[0, 1]),
            &side("dst", &[0, 0], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("same length"), "{err}");
        let limited = Side {
            limits: Some(&[0, 127]),
            ..side("src", &[0, 0], &[1])
        };
        let err = build(&f, &limited, &side("dst", &[0, 0], &[0]), false).unwrap_err();
        assert!(err.message().contains("past its limit"), "{err}");
        let err = build(
            &f,
            &side("src", &[0, u64::MAX - 10], &[0]),
            &side("dst", &[0, 0], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("overflows"), "{err}");
        let err = build(
            &f,
            &side("src", &[0, 0], &[u64::MAX / 2]),
            &side("dst", &[0, 0], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("overflows"), "{err}");
    }
}
