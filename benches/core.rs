//! Criterion benchmarks of the Rust core alone (no Python): construction, planning every
//! decode rank, and wire coding, on the scale issue's large world.
//!
//!     cargo bench --bench core

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use pdplan::layout::{LogicalParts, TokenPieces};
use pdplan::{wire, BufferKind, BufferLayout, LogicalAxis, ParallelLayout, Planner, Role};

const LAYERS: u64 = 80;
const HEADS: u64 = 8;
const UNIT: u64 = 16 * 128 * 2;

fn kv_buffers(tp: u64) -> Vec<BufferLayout> {
    let replica = if tp > HEADS { tp / HEADS } else { 1 };
    (0..2 * LAYERS)
        .map(|i| BufferLayout {
            buffer_index: i,
            buffer_kind: if i % 2 == 0 {
                BufferKind::TargetK
            } else {
                BufferKind::TargetV
            },
            logical_axis: LogicalAxis::KvHead,
            logical_size: HEADS,
            page_size: 16,
            bytes_per_logical_unit: UNIT,
            item_stride_bytes: HEADS / (tp / replica) * UNIT,
            tp_replica_group_size: replica,
            layer: None,
            rows_per_page: 1,
            page_bytes: None,
            logical_parts: LogicalParts::WHOLE,
            sliding_window: None,
            attention_chunk_size: None,
            token_pieces: TokenPieces::NONE,
        })
        .collect()
}

fn large_world() -> Planner {
    Planner::new(
        ParallelLayout::new(Role::Prefill, 4096, 256).expect("prefill layout"),
        ParallelLayout::new(Role::Decode, 1024, 256).expect("decode layout"),
        &kv_buffers(16),
        &kv_buffers(4),
    )
    .expect("planner")
}

fn bench(c: &mut Criterion) {
    let (prefill, decode) = (kv_buffers(16), kv_buffers(4));
    c.bench_function("construct 4096->1024 ranks, 160 buffers", |b| {
        b.iter(|| {
            Planner::new(
                ParallelLayout::new(Role::Prefill, 4096, 256).expect("prefill layout"),
                ParallelLayout::new(Role::Decode, 1024, 256).expect("decode layout"),
                black_box(&prefill),
                black_box(&decode),
            )
        });
    });
    let planner = large_world();
    c.bench_function("plan all 1024 decode ranks", |b| {
        b.iter(|| {
            (0..1024)
                .map(|rank| {
                    planner
                        .plan_for_decode_rank(rank, None, None)
                        .map(|p| p.sources.len())
                })
                .sum::<Result<usize, _>>()
        });
    });
    let fragments: Vec<_> = planner
        .plan_for_decode_rank(0, None, None)
        .expect("plan")
        .sources
        .into_iter()
        .flat_map(|s| s.fragments)
        .collect();
    let (version, payload) = wire::encode(&fragments);
    c.bench_function("encode one rank's fragments", |b| {
        b.iter(|| wire::encode(black_box(&fragments)));
    });
    c.bench_function("decode one rank's fragments", |b| {
        b.iter(|| wire::decode(Some(&version), Some(black_box(&payload))));
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
