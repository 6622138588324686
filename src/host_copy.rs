//! Host-memory pack and unpack: a staging plan's gather (caches -> staging buffer) and scatter
//! (staging buffer -> caches) done on the CPU, for caches in host memory (CPU-memory engines,
//! CPU-offloaded caches). Large copies are split across threads at descriptor boundaries.
//!
//! The caches are reached through raw addresses, so a copy needs the limits the plan was built
//! with: every descriptor was checked to lie inside `[base, base + limit)` of a buffer the
//! caller declared, and that declaration (live host memory of this process, not written by
//! anyone else while the copy runs) is the caller's side of the contract.

use std::ops::Range;

use crate::error::{bail, PlanResult};
use crate::staging::StagingPlan;

/// Below this many bytes one thread copies (starting threads costs tens of microseconds).
const PARALLEL_FROM_BYTES: u64 = 1 << 22;
/// At most this many threads, however many cores there are: a copy is memory-bound.
const MAX_THREADS: usize = 8;

/// Copies prefetch the descriptor this many ahead: small scattered runs defeat the hardware
/// prefetcher, and a store that misses waits for its line (8 ahead measured best here, taking
/// a token-major scatter of 256-byte runs from 0.26-0.44x to 0.5-0.8x of a contiguous copy).
const PREFETCH_AHEAD: usize = 8;
/// At most this many bytes of that descriptor are prefetched: a long run streams by itself,
/// but a whole MLA latent (1,152 B) of a DCP gather, pages apart, does not (2,048 took that
/// gather from 0.43x to about 0.6-1x of a contiguous copy; 512 covered only its start).
const PREFETCH_BYTES: u64 = 2048;

/// Asks for the cache lines of `[address, address + len)`, up to `PREFETCH_BYTES`, for
/// writing (`WRITE`) or reading.
#[inline]
fn prefetch<const WRITE: bool>(address: u64, len: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        let mut line = address;
        let end = address.saturating_add(len.min(PREFETCH_BYTES));
        while line < end {
            let pointer = std::ptr::without_provenance::<i8>(usize::try_from(line).unwrap_or(0));
            // SAFETY: a prefetch is only a hint: it never faults, whatever the address, and
            // changes no memory. SSE, which it needs, is part of x86-64.
            unsafe {
                if WRITE {
                    _mm_prefetch::<_MM_HINT_ET0>(pointer);
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(pointer);
                }
            }
            let Some(next) = line.checked_add(64) else {
                break;
            };
            line = next;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (address, len);
}

/// How many threads copy `bytes` bytes.
fn threads_for(bytes: u64) -> usize {
    if bytes < PARALLEL_FROM_BYTES {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let by_size = usize::try_from(bytes / (PARALLEL_FROM_BYTES / 2)).unwrap_or(usize::MAX);
    cores.min(MAX_THREADS).min(by_size).max(1)
}

/// Splits descriptors of these lengths into `parts` runs of about equal bytes, at descriptor
/// boundaries.
fn split_by_bytes(lengths: &[u64], total: u64, parts: usize) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(parts);
    let (mut start, mut running) = (0, 0u64);
    let share = total / parts as u64;
    for (i, &len) in lengths.iter().enumerate() {
        running += len;
        if out.len() + 1 < parts && running >= share * (out.len() as u64 + 1) {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    out.push(start..lengths.len());
    out
}

/// Whether `[start, start + len)` meets any declared `[base, base + limit)`.
fn overlaps(memory: &[(u64, u64)], start: u64, len: u64) -> bool {
    let end = start.saturating_add(len);
    memory
        .iter()
        .any(|&(base, limit)| start < base.saturating_add(limit) && base < end && len > 0)
}

/// What both copies check: the staging buffer is large enough, the caches were declared
/// with limits, and the staging buffer is none of them.
fn check(
    plan: &StagingPlan,
    memory: Option<&[(u64, u64)]>,
    staging: (u64, usize),
    (verb, side): (&str, &str),
) -> PlanResult<()> {
    let (address, len) = staging;
    let need = plan.staging_bytes();
    if (len as u64) < need {
        bail!(
            "the staging array holds {len} bytes but this plan stages {need}; pass an array of \
             at least staging_bytes"
        );
    }
    let Some(memory) = memory else {
        bail!(
            "{verb} copies through the {side} caches' raw addresses, so it needs to know their \
             extent: build the PreparedTransfer with {side}_limits="
        );
    };
    if overlaps(memory, address, need) {
        bail!("the staging array overlaps a {side} cache buffer; give it memory of its own");
    }
    Ok(())
}

/// Copies the plan's gather: every source cache range into its place in `staging`.
pub fn pack(plan: &StagingPlan, staging: &mut [u8]) -> PlanResult<()> {
    let address = staging.as_ptr() as u64;
    check(
        plan,
        plan.src_memory(),
        (address, staging.len()),
        ("pack", "src"),
    )?;
    let gather = plan.gather();
    let total = plan.staging_bytes();
    let used = usize::try_from(total).unwrap_or(usize::MAX);
    let Some(staging) = staging.get_mut(..used) else {
        bail!("staging array too small");
    };
    let parts = split_by_bytes(&gather.lengths, total, threads_for(total));
    let copy_part = |range: Range<usize>, out: &mut [u8], first_offset: u64| {
        for i in range {
            if let Some(&ahead) = gather.src_addrs.get(i + PREFETCH_AHEAD) {
                prefetch::<false>(ahead, gather.lengths[i + PREFETCH_AHEAD]);
            }
            let (src, offset, len) = (gather.src_addrs[i], gather.dst_addrs[i], gather.lengths[i]);
            // Offsets and lengths partition [0, staging_bytes): in range of `out`.
            let at = usize::try_from(offset - first_offset).unwrap_or(usize::MAX);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let target = &mut out[at..at + len];
            let source = std::ptr::with_exposed_provenance::<u8>(usize::try_from(src).unwrap_or(0));
            // SAFETY: `src .. src + len` lies inside the source memory the caller declared:
            // plans are only made by `Prepared`, from direct descriptors it checked against
            // these limits (`check` refused a plan without them), and a gather descriptor is a
            // run of adjacent checked ones (in one buffer, or in neighbouring declared ones
            // a merge joined). `target` is a distinct slice of the staging array, which `check`
            // found outside every declared source buffer, so the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(source, target.as_mut_ptr(), len) };
        }
    };
    if parts.len() == 1 {
        copy_part(0..gather.len(), staging, 0);
        return Ok(());
    }
    std::thread::scope(|scope| {
        let mut rest = staging;
        let mut consumed = 0u64;
        for range in parts {
            // Each part's bytes are the staging range its descriptors fill, in order.
            let bytes: u64 = gather.lengths[range.clone()].iter().sum();
            let (head, tail) = rest.split_at_mut(usize::try_from(bytes).unwrap_or(0));
            rest = tail;
            let first = consumed;
            consumed += bytes;
            scope.spawn(move || copy_part(range, head, first));
        }
    });
    Ok(())
}

/// Copies the plan's scatter: every staging range into its destination cache range.
pub fn unpack(plan: &StagingPlan, staging: &[u8]) -> PlanResult<()> {
    let address = staging.as_ptr() as u64;
    check(
        plan,
        plan.dst_memory(),
        (address, staging.len()),
        ("unpack", "dst"),
    )?;
    let scatter = plan.scatter();
    let total = plan.staging_bytes();
    let copy_part = |range: Range<usize>| {
        for i in range {
            if let Some(&ahead) = scatter.dst_addrs.get(i + PREFETCH_AHEAD) {
                prefetch::<true>(ahead, scatter.lengths[i + PREFETCH_AHEAD]);
            }
            let (offset, dst, len) = (
                scatter.src_addrs[i],
                scatter.dst_addrs[i],
                scatter.lengths[i],
            );
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let source = &staging[at..at + len];
            let target =
                std::ptr::with_exposed_provenance_mut::<u8>(usize::try_from(dst).unwrap_or(0));
            // SAFETY: `dst .. dst + len` lies inside the destination memory the caller
            // declared (plans are only made by `Prepared`, from descriptors it checked against
            // these limits; `check` refused a plan without them). `source` is part of the
            // staging array, which `check` found outside every declared destination buffer.
            // Threads copy at once only when `scatter_disjoint` found that no two descriptors
            // write a common byte.
            unsafe { std::ptr::copy_nonoverlapping(source.as_ptr(), target, len) };
        }
    };
    let threads = if plan.scatter_disjoint() {
        threads_for(total)
    } else {
        1
    };
    let parts = split_by_bytes(&scatter.lengths, total, threads);
    if parts.len() == 1 {
        copy_part(0..scatter.len());
        return Ok(());
    }
    std::thread::scope(|scope| {
        for range in parts {
            scope.spawn(|| copy_part(range));
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Descriptors;

    #[test]
    fn parts_cover_every_descriptor_once() {
        let lengths = [5, 1, 1, 9, 2, 2, 8];
        for parts in 1..5 {
            let split = split_by_bytes(&lengths, 28, parts);
            assert!(split.len() <= parts);
            let covered: Vec<usize> = split.into_iter().flatten().collect();
            assert_eq!(covered, (0..lengths.len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_copy_needs_limits_and_room_and_memory_of_its_own() {
        let cache = [7u8; 64];
        let base = cache.as_ptr() as u64;
        let direct = Descriptors {
            src_addrs: vec![base + 8],
            dst_addrs: vec![0],
            lengths: vec![16],
        };
        let unlimited = StagingPlan::new(&direct, None, (None, None)).unwrap();
        let mut staging = vec![0u8; 16];
        let err = pack(&unlimited, &mut staging).unwrap_err();
        assert!(err.message().contains("src_limits"), "{err}");
        let declared = Some(vec![(base, 64)].into());
        let plan = StagingPlan::new(&direct, None, (declared, None)).unwrap();
        assert!(pack(&plan, &mut [0u8; 15]).is_err());
        pack(&plan, &mut staging).unwrap();
        assert_eq!(staging, vec![7u8; 16]);
    }
}
