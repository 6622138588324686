use super::*;
use crate::layout::{BufferKind, LogicalParts, ParallelLayout, Role, TokenPieces};

fn buffer(axis: LogicalAxis, heads: u64, tp: u64, replica: u64) -> BufferLayout {
    BufferLayout {
        buffer_index: 0,
        buffer_kind: BufferKind::TargetK,
        logical_axis: axis,
        logical_size: heads,
        page_size: 16,
        bytes_per_logical_unit: 64,
        item_stride_bytes: if axis == LogicalAxis::Replicated {
            heads * 64
        } else {
            heads / (tp / replica) * 64
        },
        tp_replica_group_size: replica,
        layer: None,
        rows_per_page: 1,
        page_bytes: None,
        logical_parts: LogicalParts::WHOLE,
        sliding_window: None,
        attention_chunk_size: None,
        token_pieces: TokenPieces::NONE,
    }
}

#[test]
fn planner_output_verifies_across_layouts() {
    for (ptp, dtp, heads, pr, dr, axis) in [
        (8, 2, 8, 1, 1, LogicalAxis::KvHead),
        (2, 8, 8, 1, 1, LogicalAxis::KvHead),
        (4, 1, 2, 2, 1, LogicalAxis::KvHead),
        (4, 4, 8, 1, 1, LogicalAxis::StateChannel),
        (4, 8, 2, 2, 4, LogicalAxis::KvHead),
        (8, 2, 1, 1, 1, LogicalAxis::Replicated),
    ] {
        let planner = Planner::new(
            ParallelLayout::new(Role::Prefill, ptp * 2, 2).unwrap(),
            ParallelLayout::new(Role::Decode, dtp * 2, 2).unwrap(),
            &[buffer(axis, heads, ptp, pr)],
            &[buffer(axis, heads, dtp, dr)],
        )
        .unwrap();
        verify(&planner).unwrap();
    }
}

fn tp8_to_tp2() -> Planner {
    Planner::new(
        ParallelLayout::new(Role::Prefill, 8, 1).unwrap(),
        ParallelLayout::new(Role::Decode, 2, 1).unwrap(),
        &[buffer(LogicalAxis::KvHead, 8, 8, 1)],
        &[buffer(LogicalAxis::KvHead, 8, 2, 1)],
    )
    .unwrap()
}

#[test]
fn failover_plans_are_held_to_what_is_left() {
    // Prefill TP 8 over 8 heads, decode TP 2: rank 5 alone holds head 5 (decode rank 1's).
    let planner = tp8_to_tp2();
    let failover = planner.without_prefill_ranks(&[5]).unwrap();
    verify(&failover).unwrap();
    // The plans of every rank read from rank 5, which is gone.
    let err = verify_plans(&failover, None, |rank| {
        planner.transfer_fragments(rank, None, None)
    })
    .unwrap_err();
    assert!(
        err.message()
            .contains("prefill rank 5, which is unavailable"),
        "{err}"
    );
    // A plan that drops a byte some rank still holds has a gap, not a loss.
    let err = verify_plans(&failover, None, |rank| {
        let mut sources = failover.transfer_fragments(rank, None, None)?;
        if rank == 1 {
            sources.remove(0); // rank 4, head 4
        }
        Ok(sources)
    })
    .unwrap_err();
    assert!(err.message().contains("never written (gap)"), "{err}");
}

fn broken(mutate: impl Fn(&mut Vec<SourcePlan>)) -> String {
    let planner = tp8_to_tp2();
    verify_plans(&planner, None, |rank| {
        let mut sources = planner.transfer_fragments(rank, None, None)?;
        if rank == 1 {
            mutate(&mut sources);
        }
        Ok(sources)
    })
    .unwrap_err()
    .into_message()
}

#[test]
fn broken_plans_are_named() {
    let gap = broken(|s| {
        s.remove(1);
    });
    assert!(
        gap.contains("decode rank 1") && gap.contains("64..128") && gap.contains("gap"),
        "{gap}"
    );
    let overlap = broken(|s| {
        let again = s[1].fragments[0];
        s[1].fragments.push(again);
    });
    assert!(overlap.contains("written twice"), "{overlap}");
    let wrong_units = broken(|s| s[1].fragments[0].dst_byte_offset = 0);
    assert!(wrong_units.contains("does not hold"), "{wrong_units}");
    let past_source = broken(|s| s[0].fragments[0].bytes_per_page = 128);
    assert!(
        past_source.contains("past the prefill item"),
        "{past_source}"
    );
    let shifted = broken(|s| {
        s[2].fragments[0].src_rank = 3;
        s[2].prefill_rank = 3;
    });
    assert!(shifted.contains("does not hold"), "{shifted}");
    let past_item = broken(|s| s[0].fragments[0].dst_byte_offset = 250);
    assert!(past_item.contains("past the decode item"), "{past_item}");
    let fanout = broken(|s| {
        let extra = s[0].clone();
        s.push(extra);
    });
    assert!(
        fanout.contains("written twice") || fanout.contains("fanout"),
        "{fanout}"
    );
}

#[test]
fn a_wrong_fanout_alone_is_named() {
    // Prefill TP 4 over 2 heads: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1. Reading
    // head 0 from rank 1 instead of rank 0 moves the same bytes, so only the fanout the
    // planner reports (rank 0 serves one decode rank) no longer matches.
    let planner = Planner::new(
        ParallelLayout::new(Role::Prefill, 4, 1).unwrap(),
        ParallelLayout::new(Role::Decode, 1, 1).unwrap(),
        &[buffer(LogicalAxis::KvHead, 2, 4, 2)],
        &[buffer(LogicalAxis::KvHead, 2, 1, 1)],
    )
    .unwrap();
    verify(&planner).unwrap();
    let err = verify_plans(&planner, None, |rank| {
        let mut sources = planner.transfer_fragments(rank, None, None)?;
        let first = &mut sources[0];
        assert_eq!(first.prefill_rank, 0);
        first.prefill_rank = 1;
        first.fragments[0].src_rank = 1;
        Ok(sources)
    })
    .unwrap_err()
    .into_message();
    assert!(
        err.contains("prefill rank 0 reports a fanout of 1 but 0 decode ranks"),
        "{err}"
    );
}

#[test]
fn decode_items_too_small_for_a_replicated_buffer_are_a_gap() {
    let mut small = buffer(LogicalAxis::Replicated, 4, 1, 1);
    small.item_stride_bytes = 100;
    let planner = Planner::new(
        ParallelLayout::new(Role::Prefill, 2, 1).unwrap(),
        ParallelLayout::new(Role::Decode, 1, 1).unwrap(),
        &[buffer(LogicalAxis::Replicated, 4, 2, 1)],
        &[small],
    )
    .unwrap();
    let err = verify(&planner).unwrap_err();
    assert!(err.message().contains("100..256"), "{err}");
    assert!(err.message().contains("gap"), "{err}");
}

/// A KV buffer of `heads` heads (`dim` bytes of each token) in pages of `page_size`
/// tokens, `planes` planes token-major (0: head-major).
fn token_buffer(heads: u64, tp: u64, page_size: u64, planes: u64) -> BufferLayout {
    let unit = page_size * planes.max(1) * 8;
    BufferLayout {
        page_size,
        bytes_per_logical_unit: unit,
        item_stride_bytes: heads / tp * unit,
        rows_per_page: if planes == 0 { 1 } else { planes * page_size },
        page_bytes: None,
        ..buffer(LogicalAxis::KvHead, heads, tp, 1)
    }
}

#[test]
fn token_mapped_plans_verify_for_any_page_sizes() {
    use crate::planner::PlanOptions;
    for (ptp, dtp, heads) in [(8, 2, 8), (2, 8, 8), (4, 8, 2)] {
        for (ps, ds) in [(16, 64), (64, 16), (12, 20), (16, 16)] {
            for planes in [0, 1, 2] {
                let (pr, dr) = (ptp / heads.min(ptp), dtp / heads.min(dtp));
                let p = BufferLayout {
                    tp_replica_group_size: pr.max(1),
                    item_stride_bytes: heads / (ptp / pr.max(1)) * ps * planes.max(1) * 8,
                    ..token_buffer(heads, ptp, ps, planes)
                };
                let d = BufferLayout {
                    tp_replica_group_size: dr.max(1),
                    item_stride_bytes: heads / (dtp / dr.max(1)) * ds * planes.max(1) * 8,
                    ..token_buffer(heads, dtp, ds, planes)
                };
                let options = PlanOptions {
                    token_maps: true,
                    ..PlanOptions::default()
                };
                let planner = Planner::with_options(
                    ParallelLayout::new(Role::Prefill, ptp, 1).unwrap(),
                    ParallelLayout::new(Role::Decode, dtp, 1).unwrap(),
                    &[p],
                    &[d],
                    options,
                )
                .unwrap();
                verify(&planner).unwrap();
                // A token run moved one slot on is caught.
                let shifted = |rank: u64| {
                    let mut plans = planner.transfer_fragments(rank, None, None)?;
                    if let Some(f) = plans.iter_mut().flat_map(|s| &mut s.fragments).next() {
                        f.dst_byte_offset += f.token_run_bytes;
                    }
                    Ok(plans)
                };
                assert!(
                    verify_plans(&planner, None, shifted).is_err(),
                    "{ptp}->{dtp} {ps}->{ds} planes {planes}"
                );
            }
        }
    }
}
