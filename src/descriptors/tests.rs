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
