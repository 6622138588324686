//! Staging plans: a request's direct descriptors, many of them tiny, turned into a gather (source
//! caches into one contiguous staging buffer), one transfer (or a few chunks) between the two
//! staging buffers, and a scatter (staging buffer into the destination caches).
//!
//! The staging buffer holds the request's bytes in the order of the direct descriptors, from
//! offset 0 with no gaps, so both sides compute the same layout from the same plan and pages.
//! A gather descriptor merges neighbours that continue each other in the source cache (the
//! staging side always continues); a scatter descriptor those that continue in the
//! destination cache. Gather then transfer then scatter writes exactly the bytes the direct
//! descriptors would, and nothing else.

use std::sync::{Arc, OnceLock};

use crate::descriptors::Descriptors;
use crate::error::{bail, PlanResult};
use crate::limits;

/// One side's memory as the caller declared it: `[base, base + limit)` per buffer, or `None`
/// when no limits were given (descriptors are then unchecked, and nothing may copy through
/// raw addresses).
pub type Declared = Option<Arc<[(u64, u64)]>>;

/// The counts a cost model weighs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingCounts {
    /// Descriptors an engine would get without staging (after coalescing).
    pub direct: u64,
    /// Staging-to-staging descriptors for the engine.
    pub transfer: u64,
    pub gather: u64,
    pub scatter: u64,
    /// Bytes the request moves (and the staging buffers hold).
    pub bytes: u64,
}

#[derive(Debug)]
pub struct StagingPlan {
    /// Source cache addresses -> offsets in the source staging buffer.
    gather: Descriptors,
    /// Offsets in the destination staging buffer -> destination cache addresses.
    scatter: Descriptors,
    staging_bytes: u64,
    direct: u64,
    chunk_bytes: Option<u64>,
    src_memory: Declared,
    dst_memory: Declared,
    /// Whether no two scatter descriptors write the same byte (computed on first unpack).
    scatter_disjoint: OnceLock<bool>,
}

/// One non-empty direct descriptor, in order, with where it lands in the staging buffer and
/// whether it continues the one before it on each side.
struct Run {
    src: u64,
    dst: u64,
    offset: u64,
    len: u64,
    continues_src: bool,
    continues_dst: bool,
}

/// Walks the direct descriptors once, in order (empty ones skipped), and returns the staging
/// bytes: the one definition of the staging layout, for plans and for counts.
fn walk(
    direct: &Descriptors,
    chunk_bytes: Option<u64>,
    mut each: impl FnMut(&Run),
) -> PlanResult<u64> {
    if chunk_bytes == Some(0) {
        bail!("chunk_bytes must be at least 1 (or None for one transfer descriptor)");
    }
    let mut offset = 0u64;
    // Where the previous run ended on each side (bounds-checked addresses: no overflow).
    let mut ends: Option<(Option<u64>, Option<u64>)> = None;
    for ((&src, &dst), &len) in direct
        .src_addrs
        .iter()
        .zip(&direct.dst_addrs)
        .zip(&direct.lengths)
    {
        if len == 0 {
            continue;
        }
        let (src_end, dst_end) = ends.unwrap_or((None, None));
        each(&Run {
            src,
            dst,
            offset,
            len,
            continues_src: src_end == Some(src),
            continues_dst: dst_end == Some(dst),
        });
        ends = Some((src.checked_add(len), dst.checked_add(len)));
        let Some(next) = offset.checked_add(len) else {
            bail!("the request moves more than 2^64 bytes; split it");
        };
        offset = next;
    }
    Ok(offset)
}

/// Staging-to-staging descriptors for `bytes` in chunks of `chunk_bytes` (one without).
fn transfer_count(bytes: u64, chunk_bytes: Option<u64>) -> u64 {
    match chunk_bytes {
        _ if bytes == 0 => 0,
        None => 1,
        Some(chunk) => bytes.div_ceil(chunk),
    }
}

/// Appends `(src, dst, len)`, or lengthens the last descriptor when `continues`.
fn push_merged(out: &mut Descriptors, (src, dst, len): (u64, u64, u64), continues: bool) {
    if continues {
        if let Some(last) = out.lengths.last_mut() {
            *last += len;
            return;
        }
    }
    out.src_addrs.push(src);
    out.dst_addrs.push(dst);
    out.lengths.push(len);
}

impl StagingCounts {
    /// These counts, of a request of `pages` pages, from `self`: the counts of the same
    /// request over `per` pages. Exact where no descriptor of one page run continues another's
    /// (scattered pages, whole transfers): every count but the one transfer grows with the
    /// pages.
    pub fn scaled(self, per: u64, pages: u64) -> PlanResult<Self> {
        let scale = |count: u64, name: &str| -> PlanResult<u64> {
            match count.checked_mul(pages) {
                Some(total) if per > 0 && total % per == 0 => Ok(total / per),
                _ => bail!("{name}: {count} over {per} pages does not scale to {pages} pages"),
            }
        };
        let bytes = scale(self.bytes, "bytes")?;
        Ok(Self {
            direct: scale(self.direct, "descriptors")?,
            transfer: transfer_count(bytes, None),
            gather: scale(self.gather, "gather descriptors")?,
            scatter: scale(self.scatter, "scatter descriptors")?,
            bytes,
        })
    }

    /// What a staging plan of these direct descriptors would count, without building it (the
    /// cost model's path: no gather or scatter columns).
    pub fn of(direct: &Descriptors, chunk_bytes: Option<u64>) -> PlanResult<Self> {
        let (mut gather, mut scatter) = (0, 0);
        let bytes = walk(direct, chunk_bytes, |run| {
            gather += u64::from(!run.continues_src);
            scatter += u64::from(!run.continues_dst);
        })?;
        Ok(Self {
            direct: direct.len() as u64,
            transfer: transfer_count(bytes, chunk_bytes),
            gather,
            scatter,
            bytes,
        })
    }
}

impl StagingPlan {
    /// The staging plan of a request's direct descriptors, with the caches' declared memory
    /// for host copies. Crate-private on purpose: `host_copy` trusts that every descriptor
    /// was built by this crate and checked against that same declared memory, which only
    /// `Prepared` (its `staging_plan` and `token_staging_plan`) guarantees.
    pub(crate) fn new(
        direct: &Descriptors,
        chunk_bytes: Option<u64>,
        (src_memory, dst_memory): (Declared, Declared),
    ) -> PlanResult<Self> {
        let mut gather = Descriptors::default();
        let mut scatter = Descriptors::default();
        let staging_bytes = walk(direct, chunk_bytes, |run| {
            push_merged(
                &mut gather,
                (run.src, run.offset, run.len),
                run.continues_src,
            );
            push_merged(
                &mut scatter,
                (run.offset, run.dst, run.len),
                run.continues_dst,
            );
        })?;
        Ok(Self {
            gather,
            scatter,
            staging_bytes,
            direct: direct.len() as u64,
            chunk_bytes,
            src_memory,
            dst_memory,
            scatter_disjoint: OnceLock::new(),
        })
    }

    pub fn gather(&self) -> &Descriptors {
        &self.gather
    }

    pub fn scatter(&self) -> &Descriptors {
        &self.scatter
    }

    pub fn staging_bytes(&self) -> u64 {
        self.staging_bytes
    }

    pub fn chunk_bytes(&self) -> Option<u64> {
        self.chunk_bytes
    }

    pub fn src_memory(&self) -> Option<&[(u64, u64)]> {
        self.src_memory.as_deref()
    }

    pub fn dst_memory(&self) -> Option<&[(u64, u64)]> {
        self.dst_memory.as_deref()
    }

    /// How many staging-to-staging descriptors `transfer` makes.
    pub fn transfer_count(&self) -> u64 {
        transfer_count(self.staging_bytes, self.chunk_bytes)
    }

    pub fn counts(&self) -> StagingCounts {
        StagingCounts {
            direct: self.direct,
            transfer: self.transfer_count(),
            gather: self.gather.len() as u64,
            scatter: self.scatter.len() as u64,
            bytes: self.staging_bytes,
        }
    }

    /// The engine's descriptors from the source staging buffer at `src_base` to the destination
    /// one at `dst_base`: one, or one per `chunk_bytes`. A buffer whose size is given and
    /// smaller than `staging_bytes` is refused.
    pub fn transfer(
        &self,
        (src_base, dst_base): (u64, u64),
        (src_size, dst_size): (Option<u64>, Option<u64>),
    ) -> PlanResult<Descriptors> {
        let need = self.staging_bytes;
        for (name, base, size) in [("src", src_base, src_size), ("dst", dst_base, dst_size)] {
            if let Some(size) = size.filter(|&size| size < need) {
                bail!(
                    "the {name} staging buffer holds {size} bytes but this request stages \
                     {need}; give a larger buffer or stage fewer pages (buffers=...)"
                );
            }
            if base.checked_add(need).is_none() {
                bail!(
                    "{name} staging base 0x{base:x} + {need} bytes overflows 64 bits; pass the \
                     buffer's real address"
                );
            }
        }
        let count = self.transfer_count();
        let what = format!(
            "{need} bytes in chunks of {}: descriptors",
            self.chunk_bytes.unwrap_or(need)
        );
        limits::DESCRIPTORS.check_advising(&what, count, "use larger chunks")?;
        let chunk = self.chunk_bytes.unwrap_or(need.max(1));
        let mut out = Descriptors::default();
        let mut offset = 0;
        while offset < need {
            let len = chunk.min(need - offset);
            // Below base + need, checked above.
            out.src_addrs.push(src_base + offset);
            out.dst_addrs.push(dst_base + offset);
            out.lengths.push(len);
            offset += len;
        }
        Ok(out)
    }

    /// Whether no two scatter descriptors write a common byte, so they may be copied by
    /// several threads at once. Computed once: in order when the destinations ascend (the
    /// common case), else sorted.
    pub fn scatter_disjoint(&self) -> bool {
        *self
            .scatter_disjoint
            .get_or_init(|| disjoint(&self.scatter.dst_addrs, &self.scatter.lengths))
    }
}

/// Whether the ranges `[starts[i], starts[i] + lengths[i])` share no byte. Every range was
/// checked to end inside 64 bits.
fn disjoint(starts: &[u64], lengths: &[u64]) -> bool {
    fn apart(mut ranges: impl Iterator<Item = (u64, u64)>) -> bool {
        let mut end = 0u64;
        ranges.all(|(start, len)| {
            let ok = start >= end;
            end = end.max(start.saturating_add(len));
            ok
        })
    }
    let ranges = || starts.iter().copied().zip(lengths.iter().copied());
    if apart(ranges()) {
        return true;
    }
    let mut sorted: Vec<(u64, u64)> = ranges().collect();
    sorted.sort_unstable();
    apart(sorted.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(rows: &[(u64, u64, u64)]) -> Descriptors {
        Descriptors {
            src_addrs: rows.iter().map(|r| r.0).collect(),
            dst_addrs: rows.iter().map(|r| r.1).collect(),
            lengths: rows.iter().map(|r| r.2).collect(),
        }
    }

    #[test]
    fn each_side_merges_where_only_it_continues() {
        // Source rows continue each other; destination rows sit 100 bytes apart.
        let plan = StagingPlan::new(
            &direct(&[(1000, 5000, 8), (1008, 5100, 8), (1016, 5200, 8), (0, 9, 0)]),
            None,
            (None, None),
        )
        .unwrap();
        assert_eq!(plan.gather(), &direct(&[(1000, 0, 24)]));
        assert_eq!(
            plan.scatter(),
            &direct(&[(0, 5000, 8), (8, 5100, 8), (16, 5200, 8)])
        );
        let counts = plan.counts();
        assert_eq!((counts.direct, counts.transfer, counts.bytes), (4, 1, 24));
    }

    #[test]
    fn counts_without_a_plan_agree_with_the_plan() {
        let rows = direct(&[
            (1000, 5000, 8),
            (1008, 5008, 8),
            (0, 9, 0),
            (1016, 5100, 8),
            (7, 5108, 4),
        ]);
        for chunk in [None, Some(5)] {
            let plan = StagingPlan::new(&rows, chunk, (None, None)).unwrap();
            assert_eq!(StagingCounts::of(&rows, chunk).unwrap(), plan.counts());
        }
        let counts = StagingCounts::of(&rows, Some(5)).unwrap();
        // Source runs: 1000..1024 then 7..11; destination runs: 5000..5016, 5100..5112.
        assert_eq!(
            (counts.gather, counts.scatter, counts.bytes, counts.transfer),
            (2, 2, 28, 6)
        );
    }

    #[test]
    fn transfers_come_in_chunks_inside_both_buffers() {
        let plan = StagingPlan::new(&direct(&[(0, 0, 10)]), Some(4), (None, None)).unwrap();
        let t = plan.transfer((100, 200), (Some(10), None)).unwrap();
        assert_eq!(t, direct(&[(100, 200, 4), (104, 204, 4), (108, 208, 2)]));
        let small = plan.transfer((100, 200), (None, Some(9))).unwrap_err();
        assert!(small.message().contains("holds 9 bytes"), "{small}");
        assert!(plan.transfer((u64::MAX - 5, 0), (None, None)).is_err());
        assert!(StagingPlan::new(&direct(&[]), Some(0), (None, None)).is_err());
    }

    #[test]
    fn disjointness_is_found_in_any_order() {
        assert!(disjoint(&[30, 0, 10], &[5, 10, 20]));
        assert!(!disjoint(&[30, 0, 10], &[5, 11, 20]));
        assert!(!disjoint(&[0, 0], &[1, 1]));
        assert!(disjoint(&[5, 5], &[0, 0]));
    }
}
