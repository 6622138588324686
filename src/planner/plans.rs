//! One decode rank's plan and the routing table: the walk over every byte span a decode rank
//! receives, turned into per-source fragments or into routing rows.

use std::collections::{BTreeMap, HashMap};

use super::fanout::fanout_in;
use super::{BufferPair, PlanKind, Planner, RankPlan, RoutingTable, SourcePlan};
use crate::error::PlanResult;
use crate::failover::Rehoming;
use crate::fragment::Fragment;
use crate::limits;
use crate::page::Span;
use crate::ranks::Slot;
use crate::routing::Route;
use crate::routing::Units;

impl Planner {
    /// The fragments decode rank `decode_rank` receives, by prefill rank, for both plan kinds:
    /// a fragmented plan's own, or for an identity plan one whole-item fragment a buffer (the
    /// reference's identity plans carry none; the runtime copies whole items). One call path
    /// then builds descriptors for both. With `num_tokens`, only the sources holding some of
    /// a request of that many tokens (context parallelism).
    pub fn transfer_fragments(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
        num_tokens: Option<u64>,
    ) -> PlanResult<Vec<SourcePlan>> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        let rehoming = self.rehoming(target_dp_group);
        let fanout = self.fanout_for(num_tokens, rehoming);
        self.collect_sources(decode_rank, target_dp_group, num_tokens, &fanout)
    }

    /// How many fragments the decode rank at `at` receives, without building them.
    pub(super) fn fragment_count(
        &self,
        at: Slot,
        num_tokens: Option<u64>,
        whole_items: bool,
    ) -> u64 {
        let in_stage = |pair: &&BufferPair| self.class(pair).decode_stage == at.stage;
        if whole_items {
            return self.buffers.iter().filter(in_stage).count() as u64;
        }
        let shares = self.shares(at, num_tokens).len() as u64;
        let mut per_class = vec![0u64; self.classes.len()];
        for (id, routed) in self.routes(at) {
            let count = match routed {
                Route::Nothing => 0,
                Route::WholeItem => 1,
                Route::Units(overlaps) => overlaps.len() as u64,
            };
            if let Some(slot) = per_class.get_mut(id) {
                *slot = count.saturating_mul(shares);
            }
        }
        self.buffers
            .iter()
            .map(|b| per_class.get(b.class).copied().unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    }

    /// Calls `visit(prefill slot, buffer, span)` for every byte span the decode rank at `at`
    /// receives (for a request of `num_tokens` tokens, or any), buffer order, then unit run,
    /// then prefill token share. Identity plans visit one whole-item span a buffer (from the
    /// prefill rank at the same slot). The one walk behind per-rank fragments and the
    /// whole-cluster routing table.
    pub(super) fn for_each_span(
        &self,
        at: Slot,
        num_tokens: Option<u64>,
        rehoming: Option<&Rehoming>,
        mut visit: impl FnMut(Slot, &BufferPair, Span),
    ) {
        // A DP group with gone ranks is read unit by unit, from whoever holds each.
        if self.identity && rehoming.is_none() {
            for pair in self
                .buffers
                .iter()
                .filter(|p| self.class(p).decode_stage == at.stage)
            {
                // Same TP and shards on both sides; the smaller item is what both hold.
                let len = pair.prefill.page_extent().min(pair.decode.page_extent());
                // Token by token: every unit the rank holds (no replica groups here).
                let units = if pair.prefill.logical_axis.is_sharded() {
                    pair.prefill
                        .logical_parts
                        .shard_units(pair.prefill.logical_size, self.prefill_ranks().tp_size())
                } else {
                    1
                };
                for span in pair.tokenized(Span::contiguous(0, 0, len), (0, 0, units)) {
                    visit(at, pair, span);
                }
            }
            return;
        }
        let shares = self.shares(at, num_tokens);
        let routes = self.routes_by_class(at);
        let mut visit = |source: Option<Slot>, pair, span| {
            if let Some(source) = source {
                visit(source, pair, span);
            }
        };
        for pair in &self.buffers {
            match routes.get(pair.class) {
                None | Some(None | Some(Route::Nothing)) => {}
                Some(Some(Route::WholeItem)) => {
                    // The decode item, whole (validated to be at most the prefill item).
                    let span = Span::contiguous(0, 0, pair.decode.page_extent());
                    for span in pair.tokenized(span, (0, 0, 1)) {
                        for &share in &shares {
                            let source = self.source(at, pair.class, Units::Whole, share, rehoming);
                            visit(source, pair, span);
                        }
                    }
                }
                Some(Some(Route::Units(overlaps))) => {
                    for overlap in overlaps {
                        let span = Span::of_units(overlap, &pair.prefill, &pair.decode);
                        let units = (overlap.src_local, overlap.dst_local, overlap.len);
                        for span in pair.tokenized(span, units) {
                            for &share in &shares {
                                let units = overlap.units();
                                let source = self.source(at, pair.class, units, share, rehoming);
                                visit(source, pair, span);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every (decode rank, prefill rank) pair that moves data under the default DP-group
    /// mapping, with its fragment count and bytes per page as `transfer_fragments` gives them
    /// (identity pairs: one whole item per buffer), decode rank then prefill rank ascending.
    /// Work grows with the decode ranks of one group x buffers, plus the rows themselves.
    pub fn routing_table(&self) -> RoutingTable {
        let (prefill_ranks, decode_ranks) = (self.prefill_ranks(), self.decode_ranks());
        // Per decode slot: (prefill slot, fragments, bytes per page), prefill slot ascending;
        // once for groups of every rank and once for each rehoming read.
        let rows_of = |rehoming: Option<&Rehoming>| -> Vec<SlotRows> {
            decode_ranks
                .slots()
                .map(|at| {
                    let mut totals: BTreeMap<Slot, (u64, u64)> = BTreeMap::new();
                    self.for_each_span(at, None, rehoming, |source, _, span| {
                        let entry = totals.entry(source).or_default();
                        entry.0 += 1;
                        entry.1 = entry.1.saturating_add(span.bytes_per_page);
                    });
                    totals
                        .into_iter()
                        .map(|(slot, (count, bytes))| (slot, count, bytes))
                        .collect()
                })
                .collect()
        };
        let mut per_slot: HashMap<Option<usize>, Vec<SlotRows>> = HashMap::new();
        let mut table = RoutingTable::default();
        let kinds = &self.holdings;
        for group in 0..decode_ranks.dp_size() {
            let source_group = self.default_prefill_group(group);
            let rehoming = self
                .failover
                .as_ref()
                .and_then(|f| f.rehoming(source_group));
            let per_slot = per_slot
                .entry(rehoming.map(|(index, _)| index))
                .or_insert_with(|| rows_of(rehoming.map(|(_, r)| r)));
            for (decode_rank, sources) in decode_ranks.group_ranks(group).zip(per_slot.iter()) {
                let mut rows: Vec<(u64, u64, u64)> = sources
                    .iter()
                    .map(|&(slot, count, bytes)| {
                        (
                            prefill_ranks.rank_in_group(source_group, slot),
                            count,
                            bytes,
                        )
                    })
                    .collect();
                // Notify-only pairs: no fragment, no byte.
                let read: Vec<u64> = rows.iter().map(|row| row.0).collect();
                let notify = self.notify_ranks(kinds, (decode_rank, source_group), None, &read);
                rows.extend(notify.into_iter().map(|rank| (rank, 0, 0)));
                rows.sort_unstable();
                for (prefill_rank, count, bytes) in rows {
                    table.decode_rank.push(decode_rank);
                    table.prefill_rank.push(prefill_rank);
                    table.fragment_count.push(count);
                    table.bytes_per_page.push(bytes);
                }
            }
        }
        table
    }

    /// The prefill DP group a request of `decode_rank` reads from: `prefill_group` when a
    /// router chose one, else the default mapping.
    pub(super) fn source_group(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
    ) -> PlanResult<u64> {
        let decode_rank = self.decode_rank(i128::from(decode_rank))?;
        match prefill_group {
            None => Ok(self.default_prefill_group(self.decode_ranks().coord(decode_rank).dp_group)),
            Some(group) => self.prefill_group(i128::from(group)),
        }
    }

    /// Every source of `decode_rank` reading prefill DP group `target_dp_group`, with its
    /// fragments (identity plans: whole items), prefill rank ascending.
    pub(super) fn collect_sources(
        &self,
        decode_rank: u64,
        target_dp_group: u64,
        num_tokens: Option<u64>,
        fanout: &[u64],
    ) -> PlanResult<Vec<SourcePlan>> {
        let at = self.decode_ranks().coord(decode_rank).slot();
        let prefill_ranks = self.prefill_ranks();
        let rehoming = self.rehoming(target_dp_group);
        let whole_items = self.identity && rehoming.is_none();
        let fragments = self.fragment_count(at, num_tokens, whole_items);
        limits::PLAN_FRAGMENTS
            .check(&format!("decode rank {decode_rank}'s fragments"), fragments)?;
        // Sources kept sorted by rank; spans arrive buffer by buffer, so each source's
        // fragments stay in buffer order.
        let mut sources: Vec<SourcePlan> = Vec::new();
        self.for_each_span(at, num_tokens, rehoming, |source, pair, span| {
            let prefill_rank = prefill_ranks.rank_in_group(target_dp_group, source);
            let at = match sources.binary_search_by_key(&prefill_rank, |s| s.prefill_rank) {
                Ok(at) => at,
                Err(at) => {
                    sources.insert(
                        at,
                        SourcePlan {
                            prefill_rank,
                            fragments: Vec::with_capacity(self.buffers.len()),
                            fanout: fanout_in(fanout, prefill_ranks, prefill_rank),
                        },
                    );
                    at
                }
            };
            if let Some(source) = sources.get_mut(at) {
                source.fragments.push(
                    Fragment {
                        buffer_index: pair.prefill.buffer_index,
                        buffer_kind: pair.prefill.buffer_kind,
                        src_rank: prefill_rank,
                        dst_rank: decode_rank,
                        src_page_stride_bytes: pair.prefill.item_stride_bytes,
                        dst_page_stride_bytes: pair.decode.item_stride_bytes,
                        src_byte_offset: span.src_offset,
                        dst_byte_offset: span.dst_offset,
                        bytes_per_page: span.bytes_per_page,
                        rows_per_page: span.rows,
                        src_row_stride_bytes: span.src_row_stride,
                        dst_row_stride_bytes: span.dst_row_stride,
                        ..Fragment::default()
                    }
                    .with_token_span(span.tokens)
                    .with_window(pair.tokens.and(pair.prefill.sliding_window))
                    .with_chunk(pair.tokens.and(pair.prefill.attention_chunk_size)),
                );
            }
        });
        Ok(sources)
    }

    /// The plan for one decode rank: its prefill sources, fragments and their fanouts. It reads
    /// from `prefill_group` (a router's choice) or, when `None`, the default group. With
    /// `num_tokens`, the exact sources and fanouts of a request of that many tokens (they
    /// differ only where tokens are spread over ranks).
    pub fn plan_for_decode_rank(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
        num_tokens: Option<u64>,
    ) -> PlanResult<RankPlan> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        let rehoming = self.rehoming(target_dp_group);
        if self.identity && rehoming.is_none() {
            // The reference's identity plans name their one source and carry no fragments.
            let slot = self.decode_ranks().coord(decode_rank).slot();
            let prefill_rank = self.prefill_ranks().rank_in_group(target_dp_group, slot);
            return Ok(RankPlan {
                kind: PlanKind::Identity,
                target_dp_group,
                sources: vec![SourcePlan {
                    prefill_rank,
                    fragments: Vec::new(),
                    fanout: self.request_fanout(prefill_rank),
                }],
                notify: self.notify_ranks(
                    &self.holdings,
                    (decode_rank, target_dp_group),
                    num_tokens,
                    &[prefill_rank],
                ),
            });
        }
        let fanout = self.fanout_for(num_tokens, rehoming);
        let sources = self.collect_sources(decode_rank, target_dp_group, num_tokens, &fanout)?;
        let read: Vec<u64> = sources.iter().map(|s| s.prefill_rank).collect();
        Ok(RankPlan {
            kind: PlanKind::Fragmented,
            target_dp_group,
            notify: self.notify_ranks(
                &self.holdings,
                (decode_rank, target_dp_group),
                num_tokens,
                &read,
            ),
            sources,
        })
    }
}

/// One decode slot's routing rows: (prefill slot, fragments, bytes per page), slot ascending.
pub(super) type SlotRows = Vec<(Slot, u64, u64)>;
