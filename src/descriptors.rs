//! Per-request transfer descriptors: fragments x page pairs -> (src address, dst address,
//! length), in one pass, bounds-checked before anything is written, optionally coalesced.
//!
//! Order: fragments as given, pages as given, then rows. Fragment `f`, page pair `i` and row `r`
//! give `src_bases[f.buffer_index] + src_pages[i] * f.src_page_stride_bytes +
//! f.src_byte_offset + r * f.src_row_stride_bytes` (and the same for dst),
//! `f.bytes_per_page / f.rows_per_page` long; a fragment's `page_count` limits it to the first
//! `page_count` pairs.

use std::borrow::Borrow;
use std::mem::MaybeUninit;

use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::Fragment;

use crate::limits::{self, MAX_DESCRIPTORS};

/// The one check of a call's descriptor count, before anything is allocated for it.
pub fn check_descriptor_count(total: u64) -> PlanResult<()> {
    limits::DESCRIPTORS
        .check("one call's descriptors", total)
        .map(drop)
}

/// One side's buffers, where descriptors point: per `buffer_index`, a base address and
/// optionally how many bytes from it may be touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buffers {
    pub bases: Vec<u64>,
    pub limits: Option<Vec<u64>>,
}

impl Buffers {
    /// Every buffer as `(base, limit)`, or `None` without limits.
    pub fn declared(&self) -> Option<std::sync::Arc<[(u64, u64)]>> {
        let limits = self.limits.as_ref()?;
        Some(
            self.bases
                .iter()
                .copied()
                .zip(limits.iter().copied())
                .collect(),
        )
    }

    /// The base and limit of buffer `index`, or the error naming what is missing.
    #[inline]
    pub(crate) fn base_and_limit(
        &self,
        name: &str,
        position: usize,
        index: u64,
    ) -> PlanResult<(u64, Option<u64>)> {
        let slot = usize::try_from(index).unwrap_or(usize::MAX);
        let Some(&base) = self.bases.get(slot) else {
            bail!(
                "fragment {position} names buffer_index={index}, but {name}_base_ptrs has {} \
                 entries; pass a base pointer for every buffer the fragments use",
                self.bases.len()
            );
        };
        match &self.limits {
            None => Ok((base, None)),
            Some(limits) => match limits.get(slot) {
                Some(&limit) => Ok((base, Some(limit))),
                None => bail!(
                    "{name}_limits has {} entries but fragment {position} uses \
                     buffer_index={index}; give a limit for every buffer",
                    limits.len()
                ),
            },
        }
    }
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
fn pages_used(page_count: Option<u64>, pairs: usize) -> usize {
    page_count.map_or(pairs, |count| {
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

/// Where one side of a fragment's descriptors lie, but for the page: checked once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) base: u64,
    pub(crate) offset: u64,
    pub(crate) stride: u64,
    pub(crate) row_stride: u64,
    /// Bytes from a page's start to the end of its last run.
    pub(crate) reach: u64,
    pub(crate) limit: Option<u64>,
    /// The largest page whose descriptors stay inside 64 bits and the limit (`None`: none
    /// does), so that a request's check is one comparison (`with_max_page`).
    pub(crate) max_page: Option<u64>,
}

/// A fragment placed in its two buffers: everything about its descriptors that does not
/// depend on a request's pages, checked once (`place`); per request only the largest page is
/// checked against the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    position: usize,
    buffer_index: u64,
    page_count: Option<u64>,
    rows: u64,
    run: u64,
    src: Placement,
    dst: Placement,
    /// Pages that do not pair (token counts, or head-major facing token-major): only slot
    /// maps can move it.
    page_sizes: Option<(u64, u64)>,
}

impl Placed {
    pub const fn buffer_index(&self) -> u64 {
        self.buffer_index
    }

    /// Descriptors this fragment makes for `pairs` page pairs.
    pub fn count(&self, pairs: usize) -> u64 {
        (self.pages_used(pairs) as u64).saturating_mul(self.rows)
    }

    /// Page pairs this fragment uses of `pairs`.
    pub fn pages_used(&self, pairs: usize) -> usize {
        pages_used(self.page_count, pairs)
    }

    pub const fn rows(&self) -> u64 {
        self.rows
    }

    /// One side's runs as strided rows `(address on page 0, length, device 0, page stride,
    /// pages)`, a row per page row; checked by `check` for the last of `pages` first.
    pub fn strided_rows(&self, dst: bool, pages: u64) -> impl Iterator<Item = [u64; 5]> + '_ {
        let side = if dst { &self.dst } else { &self.src };
        // base + reach does not overflow (placed), and every row starts before the reach.
        let start = side.base + side.offset;
        (0..self.rows).map(move |row| {
            [
                start + row * side.row_stride,
                self.run,
                0,
                side.stride,
                pages,
            ]
        })
    }
}

/// Places a validated fragment (the `position`-th of its list, for messages) on both sides.
pub fn place(position: usize, f: &Fragment, src: &Buffers, dst: &Buffers) -> PlanResult<Placed> {
    let (src_base, src_limit) = src.base_and_limit("src", position, f.buffer_index)?;
    let (dst_base, dst_limit) = dst.base_and_limit("dst", position, f.buffer_index)?;
    let (rows, run) = (f.rows_per_page, f.run_bytes());
    // Bytes from a page's start to the end of its last run, if the base plus that fits 64 bits.
    let inside_64_bits = |base: u64| move |reach: &u64| base.checked_add(*reach).is_some();
    let src_reach = f.src_runs().reach().filter(inside_64_bits(src_base));
    let dst_reach = f.dst_runs().reach().filter(inside_64_bits(dst_base));
    let (Some(src_reach), Some(dst_reach)) = (src_reach, dst_reach) else {
        bail!(
            "fragment {position}: base + offset + {} rows of {run} bytes overflows 64 bits on \
             the {} side",
            rows,
            if src_reach.is_none() { "src" } else { "dst" }
        );
    };
    Ok(Placed {
        position,
        page_sizes: f
            .needs_token_maps()
            .then_some((f.src_page_size, f.dst_page_size)),
        buffer_index: f.buffer_index,
        page_count: f.page_count,
        rows,
        run,
        src: Placement {
            base: src_base,
            offset: f.src_byte_offset,
            stride: f.src_page_stride_bytes,
            row_stride: f.src_row_stride_bytes,
            reach: src_reach,
            limit: src_limit,
            max_page: None,
        }
        .with_max_page(),
        dst: Placement {
            base: dst_base,
            offset: f.dst_byte_offset,
            stride: f.dst_page_stride_bytes,
            row_stride: f.dst_row_stride_bytes,
            reach: dst_reach,
            limit: dst_limit,
            max_page: None,
        }
        .with_max_page(),
    })
}

/// Places every fragment of a list.
pub fn place_all<F: Borrow<Fragment>>(
    fragments: &[F],
    src: &Buffers,
    dst: &Buffers,
) -> PlanResult<Vec<Placed>> {
    let mut placed = Vec::with_capacity(fragments.len());
    for (position, f) in fragments.iter().enumerate() {
        placed.push(place(position, f.borrow(), src, dst)?);
    }
    Ok(placed)
}

impl Placed {
    /// Refuses a fragment whose pages cannot be paired one to one.
    pub fn check_pages_pair(&self) -> PlanResult<()> {
        if let Some((src, dst)) = self.page_sizes {
            let how = if src == dst {
                "stored differently (head-major facing token-major)".to_owned()
            } else {
                format!("of {src} tokens into pages of {dst}")
            };
            bail!(
                "fragment {} (buffer_index={}) moves tokens between pages {how}, which do not \
                 pair one to one; build its descriptors from slot maps with \
                 PreparedTransfer.token_descriptors(src_slots, dst_slots)",
                self.position,
                self.buffer_index
            );
        }
        Ok(())
    }
}

impl Placement {
    /// This placement with `max_page` set: page `p` is inside when `p * stride + reach` stays
    /// below both `2^64 - base` and the limit, that is `p <= (bound - reach) / stride`.
    #[must_use]
    pub(crate) fn with_max_page(mut self) -> Self {
        let bound = self.limit.map_or(u64::MAX - self.base, |limit| {
            limit.min(u64::MAX - self.base)
        });
        self.max_page = bound
            .checked_sub(self.reach)
            .map(|room| room.checked_div(self.stride).unwrap_or(u64::MAX));
        self
    }

    /// Every descriptor up to `largest_page` stays inside 64 bits and the buffer's limit;
    /// since addresses grow with the page, checking the largest checks them all. `who` is
    /// the fragment's position, buffer index and run length, for the message.
    pub(crate) fn check(
        &self,
        name: &str,
        (position, index, run): (usize, u64, u64),
        largest_page: u64,
    ) -> PlanResult<()> {
        if self.max_page.is_some_and(|max| largest_page <= max) {
            return Ok(());
        }
        let stride = self.stride;
        let end = largest_page
            .checked_mul(stride)
            .and_then(|v| v.checked_add(self.reach))
            .filter(|end| self.base.checked_add(*end).is_some());
        let Some(end) = end else {
            bail!(
                "fragment {position} on the {name} side: page {largest_page} x stride {stride} + \
                 {} bytes from base 0x{:x} overflows 64 bits",
                self.reach,
                self.base
            );
        };
        if let Some(limit) = self.limit.filter(|&limit| end > limit) {
            bail!(
                "fragment {position} (buffer_index={index}) would reach byte {end} of the {name} \
                 buffer, past its limit of {limit} bytes (page {largest_page}, stride {stride}, \
                 offset {}, {run} bytes); check the page indices and the plan's strides",
                self.offset,
            );
        }
        Ok(())
    }
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

/// Pages are paired by position: both lists must be as long.
pub fn check_paired(src_pages: &[u64], dst_pages: &[u64]) -> PlanResult<()> {
    if src_pages.len() != dst_pages.len() {
        bail!(
            "src_pages has {} entries and dst_pages {}; pages are paired by position, so give \
             both the same length",
            src_pages.len(),
            dst_pages.len()
        );
    }
    Ok(())
}

/// Builds the descriptors of `fragments` x page pairs, or refuses before producing any.
pub fn build<F: Borrow<Fragment>>(
    fragments: &[F],
    (src, dst): (&Buffers, &Buffers),
    (src_pages, dst_pages): (&[u64], &[u64]),
    coalesce: bool,
) -> PlanResult<Descriptors> {
    validate_all(fragments)?;
    let placed = place_all(fragments, src, dst)?;
    build_placed(&placed, src_pages, dst_pages, coalesce)
}

/// Every fragment's fields, naming the first bad one by position.
pub fn validate_all<F: Borrow<Fragment>>(fragments: &[F]) -> PlanResult<()> {
    for (position, fragment) in fragments.iter().map(Borrow::borrow).enumerate() {
        fragment
            .validate()
            .map_err(|e| PlanError::new(format!("fragment {position}: {e}")))?;
    }
    Ok(())
}

/// Builds the descriptors of placed fragments for one request's page pairs, or refuses
/// before producing any.
pub fn build_placed<P: Borrow<Placed>>(
    placed: &[P],
    src_pages: &[u64],
    dst_pages: &[u64],
    coalesce: bool,
) -> PlanResult<Descriptors> {
    check_paired(src_pages, dst_pages)?;
    let pairs = src_pages.len();
    let (src_max, dst_max) = (prefix_max(src_pages), prefix_max(dst_pages));
    let mut total: u64 = 0;
    for p in placed.iter().map(Borrow::borrow) {
        p.check_pages_pair()?;
        total = total.saturating_add(p.count(pairs));
        let Some(last) = pages_used(p.page_count, pairs).checked_sub(1) else {
            continue;
        };
        let (Some(&src_page), Some(&dst_page)) = (src_max.get(last), dst_max.get(last)) else {
            bail!("page index out of range");
        };
        let who = (p.position, p.buffer_index, p.run);
        p.src.check("src", who, src_page)?;
        p.dst.check("dst", who, dst_page)?;
    }
    check_descriptor_count(total)?;
    let total = usize::try_from(total).unwrap_or(0);
    let jobs: Vec<Job<'_>> = placed
        .iter()
        .map(Borrow::borrow)
        .map(|p| {
            let used = pages_used(p.page_count, pairs);
            Job {
                buffer_index: p.buffer_index,
                src_pages: &src_pages[..used],
                dst_pages: &dst_pages[..used],
                // Every value was bounds-checked above, so this arithmetic cannot wrap.
                src_start: p.src.base + p.src.offset,
                src_stride: p.src.stride,
                dst_start: p.dst.base + p.dst.offset,
                dst_stride: p.dst.stride,
                // Validated to be at most MAX_ROWS_PER_PAGE (2^20).
                rows: usize::try_from(p.rows).unwrap_or(1),
                src_row_stride: p.src.row_stride,
                dst_row_stride: p.dst.row_stride,
                len: p.run,
            }
        })
        .collect();
    let mut out = Descriptors {
        src_addrs: Vec::with_capacity(total),
        dst_addrs: Vec::with_capacity(total),
        lengths: Vec::with_capacity(total),
    };
    fill_columns(&jobs, &mut out, total);
    if coalesce && Job::any_may_merge(&jobs) {
        out.coalesce(&jobs);
    }
    Ok(out)
}

/// One fragment of one run a page, every page of the request, pages that pair: where its
/// descriptor for page 0 starts on each side, and its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlatJob {
    src_start: u64,
    src_stride: u64,
    dst_start: u64,
    dst_stride: u64,
    len: u64,
}

/// A prepared list whose every fragment makes one descriptor a page of every page pair (the
/// common case: head-major pages, whole items), flattened once so that a request is one tight
/// pass and one bounds comparison a side: the fast path of `Prepared::descriptors`. Anything
/// else (rows, page counts, unpaired pages, descriptors that may coalesce, a page past some
/// limit, whose message the general path words) goes the general way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatPlan {
    jobs: Vec<FlatJob>,
    /// The largest page every fragment may reach on each side.
    src_max_page: u64,
    dst_max_page: u64,
    /// Whether coalescing could merge anything with more than one page pair (with one,
    /// whether it could at all).
    merges_across_pages: bool,
    merges_one_page: bool,
}

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

impl Job<'_> {
    /// Whether coalescing can merge anything: some job's descriptors may continue each other,
    /// or a job follows another of the same buffer.
    fn any_may_merge(jobs: &[Self]) -> bool {
        jobs.iter().enumerate().any(|(i, job)| {
            job.may_merge_within()
                || i.checked_sub(1)
                    .and_then(|previous| jobs.get(previous))
                    .is_some_and(|previous| previous.buffer_index == job.buffer_index)
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
    fn coalesce(&mut self, jobs: &[Job<'_>]) {
        let mut kept = 0;
        let mut start = 0;
        let mut previous_buffer = None;
        for job in jobs {
            let count = job.count();
            let end = start + count;
            let joins_previous = previous_buffer == Some(job.buffer_index);
            previous_buffer = Some(job.buffer_index);
            if count == 0 {
                continue;
            }
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
            ..Fragment::default()
        }
    }

    fn buffers(bases: &[u64]) -> Buffers {
        Buffers {
            bases: bases.to_vec(),
            limits: None,
        }
    }

    fn limited(bases: &[u64], limits: &[u64]) -> Buffers {
        Buffers {
            bases: bases.to_vec(),
            limits: Some(limits.to_vec()),
        }
    }

    #[test]
    fn one_descriptor_per_fragment_and_page_in_order() {
        let fragments = [fragment(0, 0, 64, 64), fragment(1, 0, 0, 32)];
        let out = build(
            &fragments,
            (&buffers(&[1000, 5000]), &buffers(&[9000, 20000])),
            (&[2, 0], &[1, 3]),
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
    fn the_flat_fast_path_builds_what_the_general_path_builds_or_defers() {
        // Head slices (never merge), whole items (merge across pages), a shared buffer (merge
        // across fragments); under limits that the largest page passes or not.
        let whole = Fragment {
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 64,
            ..fragment(0, 0, 0, 64)
        };
        let lists: [&[Fragment]; 3] = [
            &[fragment(0, 0, 64, 32), fragment(1, 32, 0, 32)],
            &[whole],
            &[fragment(0, 0, 0, 32), fragment(0, 32, 32, 32)],
        ];
        let pages: [(&[u64], &[u64]); 4] = [
            (&[3, 1, 2], &[0, 5, 6]),
            (&[4], &[4]),
            (&[], &[]),
            (&[9, 10], &[1, 2]),
        ];
        for fragments in lists {
            for limit in [10_000, 600] {
                let src = limited(&[1000, 5000], &[limit, limit]);
                let dst = limited(&[9000, 20000], &[limit, limit]);
                let placed = place_all(fragments, &src, &dst).unwrap();
                let flat = FlatPlan::of(&placed).unwrap();
                for (sp, dp) in pages {
                    for coalesce in [false, true] {
                        let general = build_placed(&placed, sp, dp, coalesce);
                        match flat.build(sp, dp, coalesce) {
                            Some(fast) => assert_eq!(Ok(fast), general),
                            // Deferred: a merge to make or a limit to word.
                            None => assert!(coalesce || general.is_err()),
                        }
                    }
                }
            }
        }
        let rows = Fragment {
            rows_per_page: 2,
            src_row_stride_bytes: 32,
            dst_row_stride_bytes: 64,
            ..fragment(0, 0, 0, 32)
        };
        let placed = place_all(&[rows], &buffers(&[0]), &buffers(&[0])).unwrap();
        assert!(FlatPlan::of(&placed).is_none());
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
            (&buffers(&[0]), &buffers(&[0])),
            (&[0, 1, 2, 5, 6], &[10, 11, 12, 13, 14]),
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
            (
                &buffers(&[0, 1 << 30, 1 << 31]),
                &buffers(&[5, 1 << 32, 1 << 33]),
            ),
            (&pages, &pages),
            false,
        )
        .unwrap();
        assert!(out.len() > PARALLEL_FROM);
        let mut expected = Descriptors::default();
        for f in &fragments {
            let used = pages_used(f.page_count, pages.len());
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
            (&buffers(&[1000]), &buffers(&[0])),
            (&[0, 3], &[1, 0]),
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
            (&buffers(&[0]), &buffers(&[0])),
            (&[0, 1], &[0, 1]),
            true,
        )
        .unwrap();
        assert_eq!((out.src_addrs, out.lengths), (vec![0, 32], vec![32, 32]));
        let pages: (&[u64], &[u64]) = (&[0, 3], &[1, 0]);
        let limited = limited(&[1000], &[1196 + 16 + 8 - 1000]);
        assert!(build(&[rows], (&limited, &buffers(&[0])), pages, false).is_ok());
        let short = self::limited(&[1000], &[1196 + 16 + 8 - 1000 - 1]);
        assert!(build(&[rows], (&short, &buffers(&[0])), pages, false).is_err());
    }

    #[test]
    fn rows_that_end_just_below_2_to_the_64_build() {
        // Two 8-byte rows 60 apart from a base 100 bytes below 2^64: both rows fit, the row
        // after them would not (the fuzz-found overflow, which debug builds panicked on).
        let base = u64::MAX - 100;
        let rows = Fragment {
            bytes_per_page: 16,
            rows_per_page: 2,
            src_row_stride_bytes: 60,
            dst_row_stride_bytes: 60,
            ..fragment(0, 0, 0, 16)
        };
        let out = build(
            &[rows],
            (&buffers(&[base]), &buffers(&[base])),
            (&[0], &[0]),
            false,
        )
        .unwrap();
        assert_eq!(out.src_addrs, vec![base, base + 60]);
        assert_eq!(out.lengths, vec![8, 8]);
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
            (&buffers(&[0, 128]), &buffers(&[1000, 1128])),
            (&[0, 1], &[0, 1]),
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
            (&buffers(&[0]), &buffers(&[0])),
            (&[4, 5], &[6, 7]),
            false,
        )
        .unwrap();
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn refusals() {
        let f = [fragment(1, 0, 0, 64)];
        let err = build(&f, (&buffers(&[0]), &buffers(&[0, 0])), (&[0], &[0]), false).unwrap_err();
        assert!(err.message().contains("src_base_ptrs has 1"), "{err}");
        let err = build(
            &f,
            (&buffers(&[0, 0]), &buffers(&[0, 0])),
            (&[0, 1], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("same length"), "{err}");
        let limited = limited(&[0, 0], &[0, 127]);
        let err = build(&f, (&limited, &buffers(&[0, 0])), (&[1], &[0]), false).unwrap_err();
        assert!(err.message().contains("past its limit"), "{err}");
        let err = build(
            &f,
            (&buffers(&[0, u64::MAX - 10]), &buffers(&[0, 0])),
            (&[0], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("overflows"), "{err}");
        let err = build(
            &f,
            (&buffers(&[0, 0]), &buffers(&[0, 0])),
            (&[u64::MAX / 2], &[0]),
            false,
        )
        .unwrap_err();
        assert!(err.message().contains("overflows"), "{err}");
    }
}
