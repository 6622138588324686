//! Fragments decoded from a peer, with page lists and buffer limits: the descriptor builder must
//! refuse or build, never panic, and every descriptor it builds must lie inside the memory it
//! was given (`[base, base + limit)` of the buffer its fragment names, on both sides).
#![no_main]

mod common;

use common::{assert_inside, Input};
use libfuzzer_sys::fuzz_target;
use pdplan::descriptors::{build, Buffers};
use pdplan::{BufferKind, Fragment};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let buffers = 1 + input.int(1) % 4;
    let bases: Vec<u64> = (0..buffers).map(|_| input.int(8)).collect();
    let limits: Vec<u64> = (0..buffers).map(|_| input.int(3)).collect();
    let pages = input.int(1) % 16;
    let src_pages: Vec<u64> = (0..pages).map(|_| input.int(1)).collect();
    let dst_pages: Vec<u64> = (0..pages).map(|_| input.int(1)).collect();
    let fragments: Vec<Fragment> = (0..input.int(1) % 8)
        .map(|_| Fragment {
            buffer_index: input.int(1) % (buffers + 1),
            buffer_kind: BufferKind::TargetK,
            src_rank: 0,
            dst_rank: 0,
            src_page_stride_bytes: input.int(2),
            dst_page_stride_bytes: input.int(2),
            src_byte_offset: input.int(2),
            dst_byte_offset: input.int(2),
            bytes_per_page: input.int(2),
            page_count: match input.int(1) {
                0..=127 => None,
                n => Some(n % 20),
            },
            // Often one run a page; else a few rows (invalid combinations must be refused).
            rows_per_page: 1 + input.int(1) % 4,
            src_row_stride_bytes: input.int(2),
            dst_row_stride_bytes: input.int(2),
            // Fields added later keep their defaults until the target learns them.
            ..Fragment::default()
        })
        .collect();
    let coalesce = input.int(1) % 2 == 0;
    let buffers = Buffers {
        bases: bases.clone(),
        limits: Some(limits.clone()),
    };
    let pages = (src_pages.as_slice(), dst_pages.as_slice());
    let Ok(built) = build(&fragments, (&buffers, &buffers), pages, coalesce) else {
        return;
    };
    assert_inside(&built, &bases, &limits);
});
