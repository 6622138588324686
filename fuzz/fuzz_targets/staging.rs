//! Fragments from a peer, with page lists, over real host memory: the staging-plan builder
//! must refuse or build, never panic; every gather and scatter descriptor must lie inside the
//! memory it was given (caches on one side, `[0, staging_bytes)` on the other); the transfer
//! chunks must tile the staging buffers; and gather (host pack) -> transfer -> scatter (host
//! unpack) must leave the destination exactly as the direct descriptors do, copied byte by
//! byte. The copies go through raw addresses, so the sanitizer checks they stay in bounds.
#![no_main]

mod common;

use common::{assert_inside, Input};
use libfuzzer_sys::fuzz_target;
use pdplan::descriptors::{build, Buffers, Descriptors};
use pdplan::host_copy::{pack, unpack};
use pdplan::prepared::{Prepared, Selection};
use pdplan::staging::StagingCounts;
use pdplan::{BufferKind, Fragment};

/// Copies every descriptor's bytes, in order (the definition of a transfer), between
/// buffers found by address; a descriptor lies inside one buffer on each side (checked first).
fn apply(d: &Descriptors, src: &[Vec<u8>], dst: &mut [Vec<u8>]) {
    let find = |memory: &[Vec<u8>], address: u64| {
        memory
            .iter()
            .position(|v| {
                let base = v.as_ptr() as u64;
                address >= base && address < base + v.len() as u64
            })
            .map(|b| {
                (
                    b,
                    usize::try_from(address - memory[b].as_ptr() as u64).unwrap(),
                )
            })
    };
    for i in 0..d.len() {
        let len = usize::try_from(d.lengths[i]).unwrap();
        if len == 0 {
            continue;
        }
        let (sb, si) = find(src, d.src_addrs[i]).expect("a source inside some buffer");
        let bytes = src[sb][si..si + len].to_vec();
        let (db, di) = find(dst, d.dst_addrs[i]).expect("a destination inside some buffer");
        dst[db][di..di + len].copy_from_slice(&bytes);
    }
}

/// Offsets from 0 with no gap or overlap, in order, ending at `total`.
fn assert_partition(offsets: &[u64], lengths: &[u64], total: u64) {
    let mut next = 0;
    for (&offset, &len) in offsets.iter().zip(lengths) {
        assert_eq!(offset, next, "staging offsets must follow each other");
        next += len;
    }
    assert_eq!(next, total);
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let count = 1 + input.int(1) % 3;
    let limits: Vec<u64> = (0..count).map(|_| input.int(2) % 1024).collect();
    // Real memory on both sides; source bytes are their own position, mod 251.
    let mut src: Vec<Vec<u8>> = limits
        .iter()
        .enumerate()
        .map(|(b, &n)| (0..n).map(|i| ((i + 97 * b as u64) % 251) as u8).collect())
        .collect();
    let mut dst: Vec<Vec<u8>> = limits.iter().map(|&n| vec![0xA5; n as usize]).collect();
    let src_bases: Vec<u64> = src.iter_mut().map(|v| v.as_mut_ptr() as u64).collect();
    let dst_bases: Vec<u64> = dst.iter_mut().map(|v| v.as_mut_ptr() as u64).collect();
    let pages = input.int(1) % 12;
    let src_pages: Vec<u64> = (0..pages).map(|_| input.int(1) % 16).collect();
    let dst_pages: Vec<u64> = (0..pages).map(|_| input.int(1) % 16).collect();
    let fragments: Vec<Fragment> = (0..input.int(1) % 6)
        .map(|_| Fragment {
            buffer_index: input.int(1) % (count + 1),
            buffer_kind: BufferKind::TargetK,
            src_rank: 0,
            dst_rank: 0,
            src_page_stride_bytes: input.int(1),
            dst_page_stride_bytes: input.int(1),
            src_byte_offset: input.int(1),
            dst_byte_offset: input.int(1),
            bytes_per_page: input.int(1),
            page_count: match input.int(1) {
                0..=191 => None,
                n => Some(n % 8),
            },
            rows_per_page: 1 + input.int(1) % 4,
            src_row_stride_bytes: input.int(1),
            dst_row_stride_bytes: input.int(1),
            ..Fragment::default()
        })
        .collect();
    let chunk = match input.int(1) {
        0 => None,
        n => Some(n % 64),
    };
    let side = |bases: &[u64]| Buffers {
        bases: bases.to_vec(),
        limits: Some(limits.clone()),
    };
    let (src_buffers, dst_buffers) = (side(&src_bases), side(&dst_bases));
    let pages_pair = (src_pages.as_slice(), dst_pages.as_slice());
    // The direct descriptors, and the plan the public path makes from them.
    let Ok(direct) = build(&fragments, (&src_buffers, &dst_buffers), pages_pair, true) else {
        return;
    };
    let prepared = Prepared::new(fragments.into(), &src_buffers, &dst_buffers)
        .expect("fragments that build descriptors prepare");
    let Ok(plan) = prepared.staging_plan(pages_pair, &Selection::All, chunk) else {
        assert_eq!(chunk, Some(0), "only a zero chunk is refused");
        return;
    };
    let total = plan.staging_bytes();
    assert_eq!(total, direct.lengths.iter().sum::<u64>());
    assert_eq!(StagingCounts::of(&direct, chunk), Ok(plan.counts()));
    // Gather: cache -> offsets; scatter: offsets -> cache; each inside what it was given.
    let (g, s) = (plan.gather(), plan.scatter());
    let staged = [0u64];
    let whole = [total];
    let caches_only = |d: &Descriptors, cache_side_src: bool| {
        let (bases, own) = if cache_side_src {
            (&src_bases, &d.src_addrs)
        } else {
            (&dst_bases, &d.dst_addrs)
        };
        let view = Descriptors {
            src_addrs: own.clone(),
            dst_addrs: own.clone(),
            lengths: d.lengths.clone(),
        };
        assert_inside(&view, bases, &limits);
    };
    caches_only(g, true);
    caches_only(s, false);
    assert_partition(&g.dst_addrs, &g.lengths, total);
    assert_partition(&s.src_addrs, &s.lengths, total);
    let staging_view = |offsets: &[u64], lengths: &[u64]| Descriptors {
        src_addrs: offsets.to_vec(),
        dst_addrs: offsets.to_vec(),
        lengths: lengths.to_vec(),
    };
    assert_inside(&staging_view(&g.dst_addrs, &g.lengths), &staged, &whole);
    // Transfer chunks tile [base, base + total) on both sides.
    let t = plan
        .transfer((1 << 20, 1 << 30), (Some(total), Some(total)))
        .unwrap();
    assert_partition(
        &t.src_addrs
            .iter()
            .map(|a| a - (1 << 20))
            .collect::<Vec<_>>(),
        &t.lengths,
        total,
    );
    assert!(t
        .dst_addrs
        .iter()
        .zip(&t.src_addrs)
        .all(|(d, s)| d - (1 << 30) == s - (1 << 20)));
    assert!(
        plan.transfer((0, 0), (Some(total.saturating_sub(1)), None))
            .is_err()
            || total == 0
    );
    // The direct transfer in place, its result kept, then the destination put back (the
    // same allocations: the descriptors point at them).
    let before = dst.clone();
    apply(&direct, &src, &mut dst);
    let expected = dst.clone();
    for (now, was) in dst.iter_mut().zip(&before) {
        now.copy_from_slice(was);
    }
    // Staged, through the host copies.
    let mut staging_src = vec![0u8; usize::try_from(total).unwrap()];
    pack(&plan, &mut staging_src).unwrap();
    let staging_dst = staging_src.clone();
    unpack(&plan, &staging_dst).unwrap();
    assert_eq!(
        dst, expected,
        "staging must write exactly what the direct descriptors write"
    );
});
