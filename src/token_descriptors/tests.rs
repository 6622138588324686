use super::*;
use crate::layout::BufferKind;
use crate::page::TokenSpan;

fn buffers(bases: &[u64]) -> Buffers {
    Buffers {
        bases: bases.to_vec(),
        limits: None,
    }
}

/// Head-major: 2 units of 4 tokens x 8 bytes (32-byte units) at the source, pages of 8
/// tokens (64-byte units) at the destination.
fn head_major(buffer_index: u64) -> Fragment {
    Fragment {
        buffer_index,
        buffer_kind: BufferKind::TargetK,
        src_page_stride_bytes: 64,
        dst_page_stride_bytes: 256,
        src_byte_offset: 0,
        dst_byte_offset: 64,
        bytes_per_page: 64,
        ..Fragment::default()
    }
    .with_token_span(TokenSpan {
        src_page_size: 4,
        dst_page_size: 8,
        runs: 2,
        run_bytes: 8,
        src_token_stride: 8,
        dst_token_stride: 8,
        src_run_stride: 32,
        dst_run_stride: 64,
        pages_unpaired: false,
    })
}

fn build(fragments: &[Fragment], src: &[i64], dst: &[i64], coalesce: bool) -> Descriptors {
    let (s, d) = (buffers(&[0, 1 << 20]), buffers(&[1 << 30, 1 << 31]));
    for f in fragments {
        f.validate().unwrap();
    }
    let placed = place_all_tokens(fragments, &s, &d).unwrap();
    build_tokens(&placed, src, dst, coalesce).unwrap()
}

/// The descriptors written out token by token, one byte range per (token, run), merged
/// only where the rules say: the oracle the builder is held to.
fn brute_force(f: &Fragment, src: &[i64], dst: &[i64]) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        if s < 0 || d < 0 {
            continue;
        }
        let (s, d) = (s.unsigned_abs(), d.unsigned_abs());
        for run in 0..f.token_runs {
            let sa = (s / f.src_page_size) * f.src_page_stride_bytes
                + f.src_byte_offset
                + run * f.src_token_run_stride_bytes
                + (s % f.src_page_size) * f.src_token_stride_bytes;
            let da = (1 << 30)
                + (d / f.dst_page_size) * f.dst_page_stride_bytes
                + f.dst_byte_offset
                + run * f.dst_token_run_stride_bytes
                + (d % f.dst_page_size) * f.dst_token_stride_bytes;
            out.push((sa, da, f.token_run_bytes));
        }
    }
    out
}

/// `brute_force` of one slot map on both sides, as columns.
fn brute_force_columns(f: &Fragment, slots: &[i64]) -> Descriptors {
    let want = brute_force(f, slots, slots);
    Descriptors {
        src_addrs: want.iter().map(|d| d.0).collect(),
        dst_addrs: want.iter().map(|d| d.1).collect(),
        lengths: want.iter().map(|d| d.2).collect(),
    }
}

fn bytes(d: &Descriptors) -> Vec<(u64, u64)> {
    let mut pairs: Vec<(u64, u64)> = (0..d.len())
        .flat_map(|i| (0..d.lengths[i]).map(move |b| (d.src_addrs[i] + b, d.dst_addrs[i] + b)))
        .collect();
    pairs.sort_unstable();
    pairs
}

#[test]
fn a_chunk_moves_only_the_current_chunk_of_the_request() {
    // 20 tokens, chunks of 8: tokens 16..20 are the current chunk; at 16 tokens none is.
    let slots: Vec<i64> = (0..20).collect();
    let chunked = head_major(0).with_chunk(Some(8));
    let got = build(&[chunked], &slots, &slots, true);
    let mut outside: Vec<i64> = slots.clone();
    for slot in &mut outside[..16] {
        *slot = -1;
    }
    let want = brute_force_columns(&head_major(0), &outside);
    assert_eq!(bytes(&got), bytes(&want));
    assert_eq!(want.lengths.iter().sum::<u64>(), 4 * 2 * 8);
    let sixteen = build(&[chunked], &slots[..16], &slots[..16], true);
    assert!(sixteen.lengths.is_empty());
    let both = Fragment {
        sliding_window: Some(4),
        ..chunked
    };
    assert!(both.validate().unwrap_err().message().contains("not both"));
}

#[test]
fn a_window_moves_only_the_last_tokens_of_the_request() {
    // 20 tokens on consecutive slots; a window of 6 keeps tokens 14..20, whatever the slots.
    let slots: Vec<i64> = (0..20).collect();
    let windowed = head_major(0).with_window(Some(6));
    let got = build(&[windowed], &slots, &slots, true);
    let mut outside: Vec<i64> = slots.clone();
    for slot in &mut outside[..14] {
        *slot = -1;
    }
    let want = brute_force_columns(&head_major(0), &outside);
    assert_eq!(bytes(&got), bytes(&want));
    // A window longer than the request moves all of it; windows of two lengths in one
    // request each keep their own tokens.
    let all = build(&[head_major(0).with_window(Some(64))], &slots, &slots, true);
    assert_eq!(
        bytes(&all),
        bytes(&build(&[head_major(0)], &slots, &slots, true))
    );
    let both = build(
        &[
            head_major(0).with_window(Some(6)),
            head_major(1).with_window(Some(2)),
        ],
        &slots,
        &slots,
        false,
    );
    let moved: u64 = both.lengths.iter().sum();
    assert_eq!(moved, (6 + 2) * 2 * 8);
    // A window needs token geometry.
    let plain = Fragment {
        sliding_window: Some(4),
        ..Fragment {
            bytes_per_page: 64,
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 64,
            ..Fragment::default()
        }
    };
    assert!(plain
        .validate()
        .unwrap_err()
        .message()
        .contains("token geometry"));
}

#[test]
fn head_major_slots_merge_inside_pages_on_both_sides() {
    // Tokens 2..10 of a request, source pages [5, 1, 7], destination pages [3, 0].
    let (src_table, dst_table) = ([5i64, 1, 7], [3i64, 0]);
    let src: Vec<i64> = (0..10)
        .map(|t| {
            if t < 2 {
                -1
            } else {
                src_table[t / 4] * 4 + i64::try_from(t % 4).unwrap()
            }
        })
        .collect();
    let dst: Vec<i64> = (0..10)
        .map(|t| dst_table[t / 8] * 8 + i64::try_from(t % 8).unwrap())
        .collect();
    let f = head_major(0);
    let out = build(&[f], &src, &dst, false);
    // Segments: tokens 2-3 (src page 5), 4-7 (page 1), 8-9 (page 7 / dst page 0): 3 x 2 runs.
    assert_eq!(out.len(), 6);
    assert_eq!(out.lengths, vec![16, 16, 32, 32, 16, 16]);
    assert_eq!(out.src_addrs[0], 5 * 64 + 2 * 8);
    assert_eq!(out.dst_addrs[0], (1 << 30) + 3 * 256 + 64 + 2 * 8);
    let expected: Vec<(u64, u64, u64)> = brute_force(&f, &src, &dst);
    let mut want: Vec<(u64, u64)> = expected
        .iter()
        .flat_map(|&(s, d, l)| (0..l).map(move |b| (s + b, d + b)))
        .collect();
    want.sort_unstable();
    assert_eq!(bytes(&out), want);
}

#[test]
fn two_threads_and_coalescing_give_the_one_thread_bytes() {
    let src: Vec<i64> = (0..4000).collect();
    let dst: Vec<i64> = (0..4000)
        .map(|t| if t % 97 == 0 { -1 } else { 4000 - t })
        .collect();
    let fragments: Vec<Fragment> = (0..40).map(|i| head_major(i % 2)).collect();
    let split = build(&fragments, &src, &dst, true);
    let mut one = Descriptors::default();
    for f in &fragments {
        let part = build(std::slice::from_ref(f), &src, &dst, false);
        one.src_addrs.extend(part.src_addrs);
        one.dst_addrs.extend(part.dst_addrs);
        one.lengths.extend(part.lengths);
    }
    let total: u64 = split.lengths.iter().sum();
    assert_eq!(total, one.lengths.iter().sum::<u64>());
    assert!(split.len() <= one.len());
    let unmerged = build(&fragments, &src, &dst, false);
    assert_eq!(unmerged, one);
}

#[test]
fn refusals_name_the_fix() {
    let f = head_major(0);
    let placed = place_all_tokens(&[f], &buffers(&[0]), &buffers(&[0])).unwrap();
    let err = build_tokens(&placed, &[0, 1], &[0], true).unwrap_err();
    assert!(err.message().contains("request's length"), "{err}");
    let err = build_tokens(&placed, &[0, -2], &[0, 1], true).unwrap_err();
    assert!(err.message().contains("src_slots[1] is -2"), "{err}");
    // The largest slot is a slot (refused later, past any limit), not a bad value.
    assert!(check_slot_values(&[i64::MAX, -1], &[0, i64::MIN]).is_err());
    assert!(check_slot_values(&[i64::MAX, -1], &[0, 5]).is_ok());
    let err = build_tokens(&placed, &[i64::MAX], &[0], true).unwrap_err();
    assert!(
        err.message().contains("overflows") || err.message().contains("past"),
        "{err}"
    );
    let limited = Buffers {
        bases: vec![0],
        limits: Some(vec![64 * 3]),
    };
    let placed = place_all_tokens(&[f], &limited, &buffers(&[0])).unwrap();
    assert!(build_tokens(&placed, &[11], &[0], true).is_ok());
    let err = build_tokens(&placed, &[12], &[0], true).unwrap_err();
    assert!(err.message().contains("past its limit"), "{err}");
    // page_count limits page pairs: refused per request, not when placed.
    let counted = Fragment {
        page_count: Some(1),
        ..f
    };
    let placed = place_all_tokens(&[counted], &buffers(&[0]), &buffers(&[0])).unwrap();
    let err = build_tokens(&placed, &[0], &[0], true).unwrap_err();
    assert!(err.message().contains("page_count=1"), "{err}");
    let plain = Fragment::default();
    let err = place_all_tokens(&[plain], &buffers(&[0]), &buffers(&[0])).unwrap_err();
    assert!(err.message().contains("token_maps=True"), "{err}");
    let err = place_all_tokens(&[f, plain], &buffers(&[0]), &buffers(&[0])).unwrap_err();
    assert!(err.message().contains("state buffer"), "{err}");
}
