//! Fragments with token geometry from a peer, with slot maps and buffer limits: the slot-map
//! builder must refuse or build, never panic, and every descriptor it builds must lie inside
//! the memory it was given (`[base, base + limit)` of the buffer its fragment names).
#![no_main]

mod common;

use common::{assert_inside, Input};
use libfuzzer_sys::fuzz_target;
use pdplan::descriptors::Buffers;
use pdplan::token_descriptors::{build_tokens, place_all_tokens};
use pdplan::{BufferKind, Fragment};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let buffers = 1 + input.int(1) % 4;
    let bases: Vec<u64> = (0..buffers).map(|_| input.int(8)).collect();
    let limits: Vec<u64> = (0..buffers).map(|_| input.int(3)).collect();
    let tokens = input.int(1) % 64;
    // Slots: -1 (a token the rank holds no slot for), or small, often consecutive.
    let slot = |input: &mut Input<'_>, previous: &mut i64| {
        let v = match input.int(1) {
            0..=15 => -1,
            16..=159 => *previous + 1,
            n => i64::try_from(n).unwrap_or(0) - 160 + input.int(1).cast_signed() - 2,
        };
        if v >= 0 {
            *previous = v;
        }
        v
    };
    let (mut last_src, mut last_dst) = (0i64, 0i64);
    let mut src_slots = Vec::new();
    let mut dst_slots = Vec::new();
    for _ in 0..tokens {
        src_slots.push(slot(&mut input, &mut last_src));
        dst_slots.push(slot(&mut input, &mut last_dst));
    }
    let fragments: Vec<Fragment> = (0..input.int(1) % 6)
        .map(|_| {
            Fragment {
                buffer_index: input.int(1) % (buffers + 1),
                buffer_kind: BufferKind::TargetK,
                src_page_stride_bytes: input.int(2),
                dst_page_stride_bytes: input.int(2),
                src_byte_offset: input.int(2),
                dst_byte_offset: input.int(2),
                bytes_per_page: input.int(2),
                src_page_size: input.int(1) % 20,
                dst_page_size: input.int(1) % 20,
                token_runs: input.int(1) % 5,
                token_run_bytes: input.int(1),
                src_token_stride_bytes: input.int(2),
                dst_token_stride_bytes: input.int(2),
                src_token_run_stride_bytes: input.int(2),
                dst_token_run_stride_bytes: input.int(2),
                // A sliding window now and then (0 is refused by validation, as it should be).
                sliding_window: match input.int(1) {
                    0..=191 => None,
                    n => Some((n - 192) % 70),
                },
                ..Fragment::default()
            }
        })
        .collect();
    let coalesce = input.int(1) % 2 == 0;
    // As a peer's fragments arrive: validated first (the wire decoder does it).
    if fragments.iter().any(|f| f.validate().is_err()) {
        return;
    }
    let buffers = Buffers {
        bases: bases.clone(),
        limits: Some(limits.clone()),
    };
    let Ok(placed) = place_all_tokens(&fragments, &buffers, &buffers) else {
        return;
    };
    let Ok(built) = build_tokens(&placed, &src_slots, &dst_slots, coalesce) else {
        return;
    };
    assert_inside(&built, &bases, &limits);
});
