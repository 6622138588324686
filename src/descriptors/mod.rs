//! Per-request transfer descriptors: fragments x page pairs -> (src address, dst address,
//! length), in one pass, bounds-checked before anything is written, optionally coalesced.
//!
//! Order: fragments as given, pages as given, then rows. Fragment `f`, page pair `i` and row `r`
//! give `src_bases[f.buffer_index] + src_pages[i] * f.src_page_stride_bytes +
//! f.src_byte_offset + r * f.src_row_stride_bytes` (and the same for dst),
//! `f.bytes_per_page / f.rows_per_page` long; a fragment's `page_count` limits it to the first
//! `page_count` pairs.

use std::borrow::Borrow;

use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::Fragment;

use crate::limits::{self};

mod coalesced_count;
mod fill;
mod flat;
mod placement;
mod strided;

use coalesced_count::coalesced_count;
use fill::fill_columns;
pub(crate) use fill::split_in_half;
pub use placement::{check_one_reading, place, place_all};
pub use strided::{RequestPages, Strided};

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

/// Below this many descriptors one thread fills the columns; above it, two (the columns are
/// memory-bound, and a second core's bandwidth roughly halves the time).
const PARALLEL_FROM: usize = 1 << 16;

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
    let total = check_request(placed, src_pages, dst_pages)?;
    let jobs = jobs_of(placed, src_pages, dst_pages);
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

/// Checks one request's page pairs against every placed fragment (pages that pair, the
/// largest page inside the limits, the descriptor count): the flat descriptors it makes.
fn check_request<P: Borrow<Placed>>(
    placed: &[P],
    src_pages: &[u64],
    dst_pages: &[u64],
) -> PlanResult<usize> {
    check_request_knowing(placed, src_pages, dst_pages, None)
}

/// `check_request`, given each side's largest page where the caller knows it (from page
/// runs, without a pass over the pages).
fn check_request_knowing<P: Borrow<Placed>>(
    placed: &[P],
    src_pages: &[u64],
    dst_pages: &[u64],
    largest: Option<(u64, u64)>,
) -> PlanResult<usize> {
    check_paired(src_pages, dst_pages)?;
    let pairs = src_pages.len();
    // Only fragments limited to their first pages need the largest page of each prefix.
    let limited = placed.iter().any(|p| p.borrow().page_count.is_some());
    let (src_max, dst_max) = match (limited, largest) {
        (true, _) => (prefix_max(src_pages), prefix_max(dst_pages)),
        (false, Some((src, dst))) if pairs > 0 => (vec![src], vec![dst]),
        (false, _) => {
            let largest = |pages: &[u64]| pages.iter().copied().max().into_iter().collect();
            (largest(src_pages), largest(dst_pages))
        }
    };
    let mut total: u64 = 0;
    for p in placed.iter().map(Borrow::borrow) {
        p.check_pages_pair()?;
        total = total.saturating_add(p.count(pairs));
        let Some(last) = pages_used(p.page_count, pairs).checked_sub(1) else {
            continue;
        };
        let at = if limited { last } else { 0 };
        let (Some(&src_page), Some(&dst_page)) = (src_max.get(at), dst_max.get(at)) else {
            bail!("page index out of range");
        };
        let who = (p.position, p.buffer_index, p.run);
        p.src.check("src", who, src_page)?;
        p.dst.check("dst", who, dst_page)?;
    }
    check_descriptor_count(total)?;
    Ok(usize::try_from(total).unwrap_or(0))
}

/// One job a placed fragment, over the page pairs it uses (checked by `check_request`).
fn jobs_of<'a, P: Borrow<Placed>>(
    placed: &[P],
    src_pages: &'a [u64],
    dst_pages: &'a [u64],
) -> Vec<Job<'a>> {
    let pairs = src_pages.len();
    placed
        .iter()
        .map(Borrow::borrow)
        .map(|p| {
            let used = pages_used(p.page_count, pairs);
            Job {
                buffer_index: p.buffer_index,
                src_pages: &src_pages[..used],
                dst_pages: &dst_pages[..used],
                // Every value was bounds-checked, so this arithmetic cannot wrap.
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
        .collect()
}

/// A request's descriptors as strided pairs (`Strided`), from the same checks and in the same
/// fragment order as `build_placed`, or refused as it refuses.
pub fn build_placed_strided<P: Borrow<Placed>>(
    placed: &[P],
    src_pages: &[u64],
    dst_pages: &[u64],
) -> PlanResult<Strided> {
    check_paired(src_pages, dst_pages)?;
    build_placed_strided_in(
        placed,
        &RequestPages::new(src_pages.into(), dst_pages.into()),
    )
}

/// `build_placed_strided` of a request's pages, their runs found once (`RequestPages`).
pub fn build_placed_strided_in<P: Borrow<Placed>>(
    placed: &[P],
    pages: &RequestPages<'_>,
) -> PlanResult<Strided> {
    let (src_pages, dst_pages) = (pages.src(), pages.dst());
    check_paired(src_pages, dst_pages)?;
    let total = check_request_knowing(placed, src_pages, dst_pages, pages.largest())?;
    let jobs = jobs_of(placed, src_pages, dst_pages);
    // At most a row a run of each job's (and never more than the flat descriptors).
    let rows: usize = jobs.iter().map(|j| j.rows).sum();
    let mut out = Strided::with_capacity(total.min(rows.saturating_mul(pages.run_count())));
    // Entries merge within a buffer (across jobs too, as coalescing merges), never across one.
    let (mut floor, mut buffer) = (0, None);
    for job in jobs.iter().filter(|job| !job.src_pages.is_empty()) {
        if buffer != Some(job.buffer_index) {
            (floor, buffer) = (out.len(), Some(job.buffer_index));
        }
        job.write_strided(pages.runs(), floor, &mut out);
    }
    // Never more rows than the flat descriptors they stand for: else those, a row each. No
    // two buffers' descriptors merge, so a row a buffer or fewer needs no count (the common
    // case: a fragment a buffer, a run of pages each).
    let written = jobs.iter().filter(|job| !job.src_pages.is_empty());
    let buffers = written
        .clone()
        .zip(written.skip(1))
        .filter(|(a, b)| a.buffer_index != b.buffer_index)
        .count()
        + 1;
    // Nor where coalescing merges nothing: a run's rows never outnumber its descriptors.
    if out.len() > buffers
        && Job::any_may_merge(&jobs)
        && out.len() > coalesced_count(&jobs, pages.runs())
    {
        return Ok(Strided::one_row_each(&build_placed(
            placed, src_pages, dst_pages, true,
        )?));
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

#[cfg(test)]
mod tests;
