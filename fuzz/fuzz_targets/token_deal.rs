//! Token dealing for context parallelism: for any deal and request length, every token has one
//! owner, owners' local indexes count their tokens in order, `shares_meet` agrees with brute
//! force, and a CP rank's slot map (`token_slots`) refuses or holds exactly its own tokens in
//! its own pages; nothing panics.
#![no_main]

#[allow(dead_code)] // only the input reader; this target builds no descriptors
mod common;

use common::Input;
use libfuzzer_sys::fuzz_target;
use pdplan::context::{shares_meet, CpSplit, TokenDeal, TokenShare};
use pdplan::context::token_slots;

fn deal(input: &mut Input<'_>) -> Option<TokenDeal> {
    let split = match input.int(1) % 3 {
        0 => CpSplit::Interleave,
        1 => CpSplit::Contiguous,
        _ => CpSplit::Zigzag,
    };
    // Zero sizes too: they must be refused, not panic.
    TokenDeal::new(
        input.int(1) % 12,
        split,
        input.int(1) % 40,
        input.int(1) % 40,
    )
    .ok()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (Some(a), Some(b)) = (deal(&mut input), deal(&mut input)) else {
        return;
    };
    let n = input.int(2) % 400;
    let (ra, rb) = (input.int(1) % a.ways(), input.int(1) % b.ways());
    let (sa, sb) = (
        TokenShare { deal: a, index: ra },
        TokenShare { deal: b, index: rb },
    );
    let mut counts = vec![0u64; usize::try_from(a.ways()).unwrap_or(0)];
    for t in 0..n {
        let owner = a.owner(t, n);
        assert!(
            owner < a.ways(),
            "token {t} of {n}: owner {owner} of {}",
            a.ways()
        );
        let count = &mut counts[usize::try_from(owner).unwrap_or(0)];
        assert_eq!(a.local_index(t, n), *count, "token {t} of {n}");
        *count += 1;
    }
    let brute = (0..n).any(|t| sa.holds(t, n) && sb.holds(t, n));
    assert_eq!(shares_meet(sa, sb, Some(n)), brute, "{sa:?} {sb:?} {n}");
    // Without a length the answer covers this length.
    assert!(!brute || shares_meet(sa, sb, None), "{sa:?} {sb:?}");
    // A slot map of rank `ra`: a page table of random pages (some -1).
    let page_size = 1 + input.int(1) % 20;
    let table: Vec<i64> = (0..input.int(1) % 40)
        .map(|_| i64::try_from(input.int(1)).unwrap_or(0) - 8)
        .collect();
    if let Ok(slots) = token_slots(&table, page_size, n, None, sa) {
        assert_eq!(slots.len() as u64, n);
        let size = i64::try_from(page_size).unwrap_or(1);
        for (t, &slot) in (0..n).zip(&slots) {
            if !sa.holds(t, n) {
                assert_eq!(slot, -1, "token {t} is not rank {ra}'s");
                continue;
            }
            let local = i64::try_from(a.local_index(t, n)).unwrap_or(0);
            let page = table[usize::try_from(local / size).unwrap_or(0)];
            assert_eq!(slot, page * size + local % size, "token {t}");
        }
    }
});
