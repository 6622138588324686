use super::*;
use crate::layout::{BufferKind, LogicalAxis, LogicalParts, Role, TokenPieces};

const UNIT: u64 = 16 * 128 * 2;

fn kv(index: u64, kind: BufferKind, tp: u64, heads: u64) -> BufferLayout {
    let replica = if tp > heads { tp / heads } else { 1 };
    BufferLayout {
        buffer_index: index,
        buffer_kind: kind,
        logical_axis: LogicalAxis::KvHead,
        logical_size: heads,
        page_size: 16,
        bytes_per_logical_unit: UNIT,
        item_stride_bytes: heads / (tp / replica) * UNIT,
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

fn planner(prefill_tp: u64, decode_tp: u64, heads: u64) -> PlanResult<Planner> {
    let bufs = |tp| {
        vec![
            kv(0, BufferKind::TargetK, tp, heads),
            kv(1, BufferKind::TargetV, tp, heads),
        ]
    };
    Planner::new(
        ParallelLayout::new(Role::Prefill, prefill_tp, 1)?,
        ParallelLayout::new(Role::Decode, decode_tp, 1)?,
        &bufs(prefill_tp),
        &bufs(decode_tp),
    )
}

#[test]
fn tp8_to_tp2_gathers_four_sources_in_rank_then_buffer_order() {
    let plan = planner(8, 2, 8)
        .unwrap()
        .plan_for_decode_rank(1, None, None)
        .unwrap();
    assert_eq!(plan.kind, PlanKind::Fragmented);
    let ranks: Vec<u64> = plan.sources.iter().map(|s| s.prefill_rank).collect();
    assert_eq!(ranks, vec![4, 5, 6, 7]);
    let second = &plan.sources[1];
    assert_eq!(second.fanout, 1);
    let indexes: Vec<u64> = second.fragments.iter().map(|f| f.buffer_index).collect();
    assert_eq!(indexes, vec![0, 1]);
    let f = second.fragments[0];
    assert_eq!(
        (f.src_byte_offset, f.dst_byte_offset, f.bytes_per_page),
        (0, UNIT, UNIT)
    );
    assert_eq!(
        (f.src_page_stride_bytes, f.dst_page_stride_bytes),
        (UNIT, 4 * UNIT)
    );
}

#[test]
fn tp2_to_tp8_splits_each_source_over_four_decode_ranks() {
    let p = planner(2, 8, 8).unwrap();
    assert_eq!(p.source_fanout().collect::<Vec<_>>(), vec![(0, 4), (1, 4)]);
    let plan = p.plan_for_decode_rank(5, None, None).unwrap();
    let f = plan.sources[0].fragments[0];
    assert_eq!(plan.sources[0].prefill_rank, 1);
    assert_eq!(
        (f.src_byte_offset, f.dst_byte_offset, f.bytes_per_page),
        (UNIT, 0, UNIT)
    );
}

#[test]
fn gqa_replicas_send_from_the_first_rank_of_each_group() {
    // Prefill TP 4 over 2 KV heads: ranks 0 and 2 send, 1 and 3 hold copies.
    let p = planner(4, 1, 2).unwrap();
    let plan = p.plan_for_decode_rank(0, None, None).unwrap();
    let ranks: Vec<u64> = plan.sources.iter().map(|s| s.prefill_rank).collect();
    assert_eq!(ranks, vec![0, 2]);
    assert_eq!(
        p.source_fanout().collect::<Vec<_>>(),
        vec![(0, 1), (1, 0), (2, 1), (3, 0)]
    );
}

#[test]
fn equal_tp_without_replicas_is_an_identity_plan() {
    let p = planner(4, 4, 8).unwrap();
    assert!(p.is_identity());
    let plan = p.plan_for_decode_rank(2, None, None).unwrap();
    assert_eq!(plan.kind, PlanKind::Identity);
    assert_eq!(plan.sources.len(), 1);
    assert_eq!(plan.sources[0].prefill_rank, 2);
    assert!(plan.sources[0].fragments.is_empty());
}

#[test]
fn refusals_say_what_to_change() {
    let err = planner(3, 1, 8).unwrap_err();
    assert!(err.message().contains("non-aligned"), "{err}");
    let err = planner(8, 2, 8)
        .unwrap()
        .plan_for_decode_rank(2, None, None)
        .unwrap_err();
    assert!(err.message().contains("out of range"), "{err}");
}

#[test]
fn routing_table_rows_are_the_head_dealing() {
    // (decode rank, prefill rank, fragments, bytes a page) worked out by hand from which
    // heads each rank holds; K and V make two fragments of each source's heads.
    type Row = (u64, u64, u64, u64);
    let head = UNIT;
    let cases: [((u64, u64, u64), Vec<Row>); 4] = [
        // 8 heads, prefill TP 8 -> decode TP 2: decode r holds heads 4r..4r+4, one per source.
        (
            (8, 2, 8),
            (0..2)
                .flat_map(|d| (4 * d..4 * d + 4).map(move |p| (d, p, 2, 2 * head)))
                .collect(),
        ),
        // Prefill TP 2 -> decode TP 8: decode r holds head r, prefill rank r / 4 holds it.
        ((2, 8, 8), (0..8).map(|d| (d, d / 4, 2, 2 * head)).collect()),
        // 2 heads over prefill TP 4 (replica groups {0, 1}, {2, 3}) -> TP 1: the leaders,
        // and the other two holders as notify-only rows.
        (
            (4, 1, 2),
            vec![
                (0, 0, 2, 2 * head),
                (0, 1, 0, 0),
                (0, 2, 2, 2 * head),
                (0, 3, 0, 0),
            ],
        ),
        // Same TP: whole items (two heads each) rank to rank.
        ((4, 4, 8), (0..4).map(|r| (r, r, 2, 2 * 2 * head)).collect()),
    ];
    for ((prefill_tp, decode_tp, heads), rows) in cases {
        let table = planner(prefill_tp, decode_tp, heads)
            .unwrap()
            .routing_table();
        let expected = RoutingTable {
            decode_rank: rows.iter().map(|r| r.0).collect(),
            prefill_rank: rows.iter().map(|r| r.1).collect(),
            fragment_count: rows.iter().map(|r| r.2).collect(),
            bytes_per_page: rows.iter().map(|r| r.3).collect(),
        };
        assert_eq!(table, expected, "{prefill_tp}->{decode_tp}");
    }
}

#[test]
fn decode_groups_wrap_onto_prefill_groups_and_routers_may_choose() {
    let p = Planner::new(
        ParallelLayout::new(Role::Prefill, 4, 2).unwrap(),
        ParallelLayout::new(Role::Decode, 6, 3).unwrap(),
        &[kv(0, BufferKind::TargetK, 2, 8)],
        &[kv(0, BufferKind::TargetK, 2, 8)],
    )
    .unwrap();
    // Decode group 2 (ranks 4, 5) wraps onto prefill group 0.
    let plan = p.plan_for_decode_rank(5, None, None).unwrap();
    assert_eq!(plan.target_dp_group, 0);
    assert_eq!(plan.sources[0].prefill_rank, 1);
    let routed = p.plan_for_decode_rank(5, Some(1), None).unwrap();
    assert_eq!(routed.target_dp_group, 1);
    assert_eq!(routed.sources[0].prefill_rank, 3);
    assert_eq!(routed.sources[0].fanout, 1);
    let err = p.plan_for_decode_rank(5, Some(2), None).unwrap_err();
    assert!(
        err.message().contains("prefill_dp_group=2 is out of range"),
        "{err}"
    );
    assert_eq!(
        p.source_fanout().map(|(_, f)| f).collect::<Vec<_>>(),
        vec![1, 1, 1, 1]
    );
    crate::verify::verify(&p).unwrap();
}

#[test]
fn plans_too_large_to_build_are_refused_before_allocating() {
    let world = crate::limits::MAX_WORLD_SIZE;
    let buffer = |tp: u64, index| BufferLayout {
        buffer_index: index,
        item_stride_bytes: world / tp * 2,
        bytes_per_logical_unit: 2,
        logical_size: world,
        ..kv(index, BufferKind::TargetK, 1, 8)
    };
    let p = Planner::new(
        ParallelLayout::new(Role::Prefill, world, 1).unwrap(),
        ParallelLayout::new(Role::Decode, 1, 1).unwrap(),
        &(0..17).map(|i| buffer(world, i)).collect::<Vec<_>>(),
        &(0..17).map(|i| buffer(1, i)).collect::<Vec<_>>(),
    )
    .unwrap();
    let err = p.plan_for_decode_rank(0, None, None).unwrap_err();
    assert!(err.message().contains("MAX_PLAN_FRAGMENTS"), "{err}");
}

#[test]
fn context_parallel_plans_verify_and_list_only_ranks_sharing_tokens() {
    use crate::context::{CpKv, CpSplit};
    use crate::layout::ContextParallel;
    let side = |role, tp: u64, cp: u64, dcp: u64, split, kv| {
        let context = ContextParallel {
            cp_size: cp,
            dcp_size: dcp,
            kv,
            split,
            interleave: 1,
        };
        ParallelLayout::with_context(role, (tp * cp, 1, 1), None, context).unwrap()
    };
    let mla = BufferLayout {
        logical_axis: LogicalAxis::Replicated,
        logical_size: 1,
        item_stride_bytes: UNIT,
        ..kv(0, BufferKind::TargetK, 1, 1)
    };
    let (i, s) = (CpSplit::Interleave, CpKv::Sharded);
    // Prefill DCP 8 -> decode DCP 4 (vllm-project/vllm#50611): rank d reads d and d + 4.
    let p = Planner::new(
        side(Role::Prefill, 8, 1, 8, i, s),
        side(Role::Decode, 4, 1, 4, i, s),
        &[mla],
        &[mla],
    )
    .unwrap();
    assert!(p.token_maps() && !p.is_identity());
    for d in 0..4 {
        let plan = p.plan_for_decode_rank(d, None, None).unwrap();
        let ranks: Vec<u64> = plan.sources.iter().map(|s| s.prefill_rank).collect();
        assert_eq!(ranks, vec![d, d + 4]);
    }
    // Zigzag prefill CP 2 -> TP 1: a 1-token request reads from CP rank 0 only.
    let p = Planner::new(
        side(Role::Prefill, 1, 2, 1, CpSplit::Zigzag, s),
        side(Role::Decode, 1, 1, 1, i, s),
        &[mla],
        &[mla],
    )
    .unwrap();
    let short = p.plan_for_decode_rank(0, None, Some(1)).unwrap();
    assert_eq!(short.sources.len(), 1);
    assert_eq!(
        p.plan_for_decode_rank(0, None, None).unwrap().sources.len(),
        2
    );
    for n in [None, Some(0), Some(1), Some(3), Some(100)] {
        crate::verify::verify_at(&p, n).unwrap();
    }
    // State with CP is refused.
    let state = BufferLayout {
        logical_axis: LogicalAxis::StateChannel,
        ..kv(0, BufferKind::MambaState, 1, 8)
    };
    let err = Planner::new(
        side(Role::Prefill, 1, 2, 1, i, s),
        side(Role::Decode, 1, 1, 1, i, s),
        &[state],
        &[state],
    )
    .unwrap_err();
    assert!(err.message().contains("state with CP"), "{err}");
}

#[test]
fn buffers_of_one_shape_share_one_class() {
    let p = planner(8, 2, 8).unwrap();
    assert_eq!(p.classes.len(), 1);
    assert_eq!(p.buffers.len(), 2);
}
