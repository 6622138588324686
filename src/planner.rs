//! The planner: validates a prefill/decode pair, counts each prefill rank's fanout and plans
//! the fragments of one decode rank.
//!
//! Construction routes each decode TP rank once per *distinct* sharding (not per buffer) and
//! finds overlapping prefill shards by arithmetic, so it costs ranks x shardings, not
//! ranks x buffers x TP.

use std::collections::{BTreeMap, HashMap};

use crate::error::{bail, PlanError, PlanResult};
use crate::fragment::Fragment;
use crate::geometry::{first_holder, route, DecodeReplicas, Route, Sharding, Span};
use crate::layout::{BufferLayout, LogicalAxis, ParallelLayout};
use crate::ranks::RankSpace;
use crate::spread::Spread;
use crate::stages::Stages;

/// Most fragments one decode rank's plan may hold (each becomes a Python object): a layout
/// past it is refused rather than exhausting memory.
pub const MAX_PLAN_FRAGMENTS: u64 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// Same TP on both sides and no replica groups: copy whole items rank to rank.
    Identity,
    Fragmented,
}

impl PlanKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Fragmented => "fragmented",
        }
    }
}

/// What one decode rank receives from one prefill rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePlan {
    pub prefill_rank: u64,
    /// Fragments in buffer order; empty for identity plans.
    pub fragments: Vec<Fragment>,
    /// How many decode ranks this prefill rank serves in all (its fanout).
    pub fanout: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    pub kind: PlanKind,
    pub target_dp_group: u64,
    /// Prefill ranks ascending.
    pub sources: Vec<SourcePlan>,
}

/// Whole-cluster routing, one row per (decode rank, prefill rank) pair that moves data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingTable {
    pub decode_rank: Vec<u64>,
    pub prefill_rank: Vec<u64>,
    pub fragment_count: Vec<u64>,
    pub bytes_per_page: Vec<u64>,
}

/// Buffers that route alike: one sharding, held by one prefill stage and one decode stage.
/// Construction routes each decode rank once per class, not once per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Class {
    pub sharding: Sharding,
    pub prefill_stage: u64,
    pub decode_stage: u64,
}

#[derive(Debug, Clone)]
struct BufferPair {
    prefill: BufferLayout,
    decode: BufferLayout,
    /// Index into `Planner::classes`.
    class: usize,
}

#[derive(Debug, Clone)]
pub struct Planner {
    prefill: ParallelLayout,
    decode: ParallelLayout,
    buffers: Vec<BufferPair>,
    classes: Vec<Class>,
    replicas: DecodeReplicas,
    /// Which replica serves whom under `DecodeReplicas::All`.
    spread: Spread,
    identity: bool,
    /// Fanout of each prefill rank of a DP group that decode ranks read from, by its slot in
    /// the group (`stage * tp + tp_rank`); groups beyond the decode side's DP count serve nobody.
    fanout_per_slot: Vec<u64>,
}

/// The stage of each buffer on one side: stage 0 without pipeline stages, else the stage
/// holding its layer (every buffer must name one).
fn buffer_stages(
    layout: &ParallelLayout,
    buffers: &[BufferLayout],
    layers: u64,
) -> PlanResult<Vec<u64>> {
    if layout.pp_size == 1 && layout.pp_layer_partition.is_none() {
        return Ok(vec![0; buffers.len()]);
    }
    let stages = Stages::of(layout, layers)?;
    Ok(buffers
        .iter()
        .map(|b| b.layer.map_or(0, |layer| stages.stage_of(layer)))
        .collect())
}

/// Layers the buffers name (one past the largest), requiring every buffer to name one when
/// either side has pipeline stages.
fn layer_count(
    prefill: &ParallelLayout,
    decode: &ParallelLayout,
    buffers: &[BufferLayout],
) -> PlanResult<u64> {
    let staged = prefill.pp_size > 1 || decode.pp_size > 1;
    let mut layers = 0;
    for (position, b) in buffers.iter().enumerate() {
        match b.layer {
            Some(layer) => layers = layers.max(layer + 1),
            None if staged => bail!(
                "buffer {} (position {position}, {}) names no layer, but pipeline stages hold \
                 layers: give every buffer its layer (BufferLayout.layer) when either side has \
                 pp_size > 1",
                b.buffer_index,
                b.buffer_kind.as_str()
            ),
            None => {}
        }
    }
    Ok(layers)
}

impl Planner {
    /// A planner with the reference's semantics (`DecodeReplicas::First`).
    pub fn new(
        prefill: ParallelLayout,
        decode: ParallelLayout,
        prefill_buffers: &[BufferLayout],
        decode_buffers: &[BufferLayout],
    ) -> PlanResult<Self> {
        Self::with_replicas(
            prefill,
            decode,
            prefill_buffers,
            decode_buffers,
            DecodeReplicas::First,
        )
    }

    /// A planner in which `replicas` says which decode ranks of a replica group receive.
    pub fn with_replicas(
        prefill: ParallelLayout,
        decode: ParallelLayout,
        prefill_buffers: &[BufferLayout],
        decode_buffers: &[BufferLayout],
        replicas: DecodeReplicas,
    ) -> PlanResult<Self> {
        validate_pairs(prefill_buffers, decode_buffers)?;
        for (layout, buffers) in [(&prefill, prefill_buffers), (&decode, decode_buffers)] {
            for buffer in buffers {
                validate_alignment(layout, buffer)?;
            }
        }
        let layers = layer_count(&prefill, &decode, prefill_buffers)?;
        let prefill_stages = buffer_stages(&prefill, prefill_buffers, layers)?;
        let decode_stages = buffer_stages(&decode, decode_buffers, layers)?;
        let mut classes: Vec<Class> = Vec::new();
        let mut class_ids: HashMap<Class, usize> = HashMap::new();
        let buffers = prefill_buffers
            .iter()
            .zip(decode_buffers)
            .zip(prefill_stages.iter().zip(&decode_stages))
            .map(|((p, d), (&prefill_stage, &decode_stage))| {
                let class = Class {
                    sharding: Sharding::of(p, d),
                    prefill_stage,
                    decode_stage,
                };
                let id = *class_ids.entry(class).or_insert_with(|| {
                    classes.push(class);
                    classes.len() - 1
                });
                BufferPair {
                    prefill: *p,
                    decode: *d,
                    class: id,
                }
            })
            .collect();
        // Whole items copy rank to rank when both sides hold the same units the same way: same
        // TP and stages, no replica groups, and token-major items of one size (else rows
        // would shift).
        let identity = prefill.tp_size() == decode.tp_size()
            && prefill.pp_size == decode.pp_size
            && prefill_stages == decode_stages
            && prefill_buffers.iter().zip(decode_buffers).all(|(p, d)| {
                p.tp_replica_group_size == 1
                    && d.tp_replica_group_size == 1
                    && (p.rows_per_page == 1 || p.item_stride_bytes == d.item_stride_bytes)
            });
        let spread = match replicas {
            DecodeReplicas::First => Spread::default(),
            DecodeReplicas::All => Spread::choose(
                &classes,
                (prefill.tp_size(), decode.tp_size()),
                decode.pp_size,
            ),
        };
        let mut planner = Self {
            prefill,
            decode,
            buffers,
            classes,
            replicas,
            spread,
            identity,
            fanout_per_slot: Vec::new(),
        };
        planner.fanout_per_slot = planner.count_fanout();
        Ok(planner)
    }

    pub const fn prefill(&self) -> &ParallelLayout {
        &self.prefill
    }

    pub const fn decode(&self) -> &ParallelLayout {
        &self.decode
    }

    pub const fn prefill_ranks(&self) -> RankSpace {
        RankSpace::of(&self.prefill)
    }

    pub const fn decode_ranks(&self) -> RankSpace {
        RankSpace::of(&self.decode)
    }

    /// The (prefill, decode) buffer pairs, in order.
    pub fn buffer_pairs(&self) -> impl Iterator<Item = (&BufferLayout, &BufferLayout)> {
        self.buffers
            .iter()
            .map(|pair| (&pair.prefill, &pair.decode))
    }

    /// The (prefill, decode) stages holding each buffer, in buffer order.
    pub fn buffer_stages(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buffers.iter().map(|pair| {
            let class = self.class(pair);
            (class.prefill_stage, class.decode_stage)
        })
    }

    fn class(&self, pair: &BufferPair) -> Class {
        self.classes.get(pair.class).copied().unwrap_or(Class {
            sharding: Sharding::Replicated,
            prefill_stage: 0,
            decode_stage: 0,
        })
    }

    pub const fn is_identity(&self) -> bool {
        self.identity
    }

    pub const fn decode_replicas(&self) -> DecodeReplicas {
        self.replicas
    }

    /// Every decode rank of one DP group, as (stage, TP rank), slot order.
    fn decode_slots(&self) -> impl Iterator<Item = (u64, u64)> {
        let decode = self.decode_ranks();
        (0..decode.pp_size()).flat_map(move |stage| (0..decode.tp_size()).map(move |t| (stage, t)))
    }

    /// Decode ranks that receive nothing at all under this planner's mode (non-first ranks of
    /// every decode replica group under `DecodeReplicas::First`, when no buffer is replicated):
    /// the runtime must copy inside the group for them.
    pub fn idle_decode_ranks(&self) -> u64 {
        let idle_per_group = self
            .decode_slots()
            .filter(|&slot| self.fragment_count(slot) == 0)
            .count() as u64;
        idle_per_group * self.decode.dp_size
    }

    /// The prefill DP group decode DP group `decode_group` reads from by default: the same
    /// index, wrapped (`g mod prefill dp_size`) when the decode side has more groups.
    pub const fn default_prefill_group(&self, decode_group: u64) -> u64 {
        decode_group % self.prefill.dp_size
    }

    /// Decode ranks one request makes `prefill_rank` wait for: those of the reading decode DP
    /// group that read from it. The same whichever decode group a request comes from.
    pub fn request_fanout(&self, prefill_rank: u64) -> u64 {
        let ranks = self.prefill_ranks();
        let slot = ranks.slot(ranks.coord(prefill_rank));
        usize::try_from(slot)
            .ok()
            .and_then(|slot| self.fanout_per_slot.get(slot))
            .copied()
            .unwrap_or(0)
    }

    /// A prefill rank's fanout under the default group mapping: its request fanout when some
    /// decode group reads from its DP group by default, else 0 (the reference's values wherever
    /// the reference plans).
    pub fn fanout(&self, prefill_rank: u64) -> u64 {
        let group = self.prefill_ranks().coord(prefill_rank).dp_group;
        let is_default_source = group < self.decode.dp_size;
        if is_default_source {
            self.request_fanout(prefill_rank)
        } else {
            0
        }
    }

    /// Fanout of every prefill rank, rank order.
    pub fn source_fanout(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.prefill.world_size).map(|rank| (rank, self.fanout(rank)))
    }

    /// How decode rank (`stage`, `tp_rank`) is routed for each class its stage holds, with
    /// the class ids: prefill TP ranks within the class's prefill stage.
    fn routes(
        &self,
        (stage, decode_tp_rank): (u64, u64),
    ) -> impl Iterator<Item = (usize, Route)> + '_ {
        let (prefill_tp, decode_tp) = (self.prefill.tp_size(), self.decode.tp_size());
        let slot = stage * decode_tp + decode_tp_rank;
        self.classes
            .iter()
            .enumerate()
            .filter(move |(_, class)| class.decode_stage == stage)
            .map(move |(id, class)| {
                let holder = |src_shard, replica| match self.replicas {
                    DecodeReplicas::First => first_holder(src_shard, replica),
                    DecodeReplicas::All => self.spread.holder(slot, id, src_shard, replica),
                };
                let routed = route(
                    class.sharding,
                    prefill_tp,
                    decode_tp,
                    decode_tp_rank,
                    self.replicas,
                    holder,
                );
                (id, routed)
            })
    }

    fn count_fanout(&self) -> Vec<u64> {
        let prefill_tp = self.prefill.tp_size();
        let slots = usize::try_from(self.prefill_ranks().group_size()).unwrap_or(0);
        let mut counts = vec![0u64; slots];
        // `seen[p] == d + 1` marks prefill slot p as already counted for decode slot d.
        let mut seen = vec![0u64; slots];
        for (decode_slot, at) in (1u64..).zip(self.decode_slots()) {
            for (id, routed) in self.routes(at) {
                let stage = self.classes.get(id).map_or(0, |c| c.prefill_stage);
                let mut count = |prefill_tp_rank: u64| {
                    let slot =
                        usize::try_from(stage * prefill_tp + prefill_tp_rank).unwrap_or(usize::MAX);
                    if let (Some(mark), Some(count)) = (seen.get_mut(slot), counts.get_mut(slot)) {
                        if *mark != decode_slot {
                            *mark = decode_slot;
                            *count += 1;
                        }
                    }
                };
                match routed {
                    Route::Nothing => {}
                    Route::WholeItem { prefill_tp_rank } => count(prefill_tp_rank),
                    Route::Units(overlaps) => {
                        for overlap in &overlaps {
                            count(overlap.prefill_tp_rank);
                        }
                    }
                }
            }
        }
        counts
    }

    fn check_decode_rank(&self, decode_rank: u64) -> PlanResult<()> {
        if decode_rank >= self.decode.world_size {
            bail!(
                "decode_rank={decode_rank} is out of range: the decode world has {} ranks \
                 (0..{})",
                self.decode.world_size,
                self.decode.world_size
            );
        }
        Ok(())
    }

    /// The fragments decode rank `decode_rank` receives, by prefill rank, for both plan kinds:
    /// a fragmented plan's own, or for an identity plan one whole-item fragment a buffer (the
    /// reference's identity plans carry none; the runtime copies whole items). One call path
    /// then builds descriptors for both.
    pub fn transfer_fragments(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
    ) -> PlanResult<Vec<SourcePlan>> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        self.collect_sources(decode_rank, target_dp_group)
    }

    /// How many fragments decode rank (`stage`, `tp_rank`) receives, without building them.
    fn fragment_count(&self, at: (u64, u64)) -> u64 {
        let in_stage = |pair: &&BufferPair| self.class(pair).decode_stage == at.0;
        if self.identity {
            return self.buffers.iter().filter(in_stage).count() as u64;
        }
        let mut per_class = vec![0u64; self.classes.len()];
        for (id, routed) in self.routes(at) {
            let count = match routed {
                Route::Nothing => 0,
                Route::WholeItem { .. } => 1,
                Route::Units(overlaps) => overlaps.len() as u64,
            };
            if let Some(slot) = per_class.get_mut(id) {
                *slot = count;
            }
        }
        self.buffers
            .iter()
            .map(|b| per_class.get(b.class).copied().unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    }

    /// Calls `visit((prefill stage, prefill TP rank), buffer, span)` for every byte span decode
    /// rank (`stage`, `tp_rank`) receives, buffer order, then prefill rank order. Identity
    /// plans visit one whole-item span a buffer. The one walk behind per-rank fragments and
    /// the whole-cluster routing table, so the two cannot disagree.
    fn for_each_span(&self, at: (u64, u64), mut visit: impl FnMut((u64, u64), &BufferPair, Span)) {
        if self.identity {
            for pair in self
                .buffers
                .iter()
                .filter(|p| self.class(p).decode_stage == at.0)
            {
                // Same TP and shards on both sides; the smaller item is what both hold.
                let len = pair
                    .prefill
                    .item_stride_bytes
                    .min(pair.decode.item_stride_bytes);
                visit(at, pair, Span::contiguous(0, 0, len));
            }
            return;
        }
        let mut routes: Vec<Option<Route>> = vec![None; self.classes.len()];
        for (id, routed) in self.routes(at) {
            if let Some(slot) = routes.get_mut(id) {
                *slot = Some(routed);
            }
        }
        for pair in &self.buffers {
            let stage = self.class(pair).prefill_stage;
            match routes.get(pair.class) {
                None | Some(None | Some(Route::Nothing)) => {}
                Some(Some(Route::WholeItem { prefill_tp_rank })) => {
                    // The decode item, whole (validated to be at most the prefill item).
                    let span = Span::contiguous(0, 0, pair.decode.item_stride_bytes);
                    visit((stage, *prefill_tp_rank), pair, span);
                }
                Some(Some(Route::Units(overlaps))) => {
                    for overlap in overlaps {
                        let span = Span::of_units(overlap, &pair.prefill, &pair.decode);
                        visit((stage, overlap.prefill_tp_rank), pair, span);
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
        // Per decode slot: (prefill slot, fragments, bytes per page), prefill slot ascending.
        let per_slot: Vec<Vec<(u64, u64, u64)>> = self
            .decode_slots()
            .map(|at| {
                let mut totals: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
                self.for_each_span(at, |(stage, tp_rank), _, span| {
                    let slot = stage * prefill_ranks.tp_size() + tp_rank;
                    let entry = totals.entry(slot).or_default();
                    entry.0 += 1;
                    entry.1 = entry.1.saturating_add(span.bytes_per_page);
                });
                totals
                    .into_iter()
                    .map(|(slot, (count, bytes))| (slot, count, bytes))
                    .collect()
            })
            .collect();
        let mut table = RoutingTable::default();
        for group in 0..decode_ranks.dp_size() {
            let source_base = self.default_prefill_group(group) * prefill_ranks.group_size();
            for (decode_rank, sources) in decode_ranks.group_ranks(group).zip(&per_slot) {
                for &(prefill_slot, count, bytes) in sources {
                    table.decode_rank.push(decode_rank);
                    table.prefill_rank.push(source_base + prefill_slot);
                    table.fragment_count.push(count);
                    table.bytes_per_page.push(bytes);
                }
            }
        }
        table
    }

    /// The prefill DP group a request of `decode_rank` reads from: `prefill_group` when a
    /// router chose one, else the default mapping.
    fn source_group(&self, decode_rank: u64, prefill_group: Option<u64>) -> PlanResult<u64> {
        self.check_decode_rank(decode_rank)?;
        match prefill_group {
            None => Ok(self.default_prefill_group(self.decode_ranks().coord(decode_rank).dp_group)),
            Some(group) if group < self.prefill.dp_size => Ok(group),
            Some(group) => bail!(
                "prefill_dp_group={group} is out of range: the prefill side has {} DP groups \
                 (0..{})",
                self.prefill.dp_size,
                self.prefill.dp_size
            ),
        }
    }

    /// Every source of `decode_rank` reading prefill DP group `target_dp_group`, with its
    /// fragments (identity plans: whole items), prefill rank ascending.
    fn collect_sources(
        &self,
        decode_rank: u64,
        target_dp_group: u64,
    ) -> PlanResult<Vec<SourcePlan>> {
        let coord = self.decode_ranks().coord(decode_rank);
        let at = (coord.stage, coord.tp_rank);
        let prefill_ranks = self.prefill_ranks();
        let fragments = self.fragment_count(at);
        if fragments > MAX_PLAN_FRAGMENTS {
            bail!(
                "decode rank {decode_rank} would receive {fragments} fragments (more than \
                 {MAX_PLAN_FRAGMENTS}); plan fewer buffers or a smaller prefill TP per call"
            );
        }
        // Sources kept sorted by rank; spans arrive buffer by buffer, so each source's
        // fragments stay in buffer order.
        let mut sources: Vec<SourcePlan> = Vec::new();
        self.for_each_span(at, |(stage, prefill_tp_rank), pair, span| {
            let prefill_rank = prefill_ranks.rank_at(target_dp_group, stage, prefill_tp_rank);
            let at = match sources.binary_search_by_key(&prefill_rank, |s| s.prefill_rank) {
                Ok(at) => at,
                Err(at) => {
                    sources.insert(
                        at,
                        SourcePlan {
                            prefill_rank,
                            fragments: Vec::with_capacity(self.buffers.len()),
                            fanout: self.request_fanout(prefill_rank),
                        },
                    );
                    at
                }
            };
            if let Some(source) = sources.get_mut(at) {
                source.fragments.push(Fragment {
                    buffer_index: pair.prefill.buffer_index,
                    buffer_kind: pair.prefill.buffer_kind,
                    src_rank: prefill_rank,
                    dst_rank: decode_rank,
                    src_page_stride_bytes: pair.prefill.item_stride_bytes,
                    dst_page_stride_bytes: pair.decode.item_stride_bytes,
                    src_byte_offset: span.src_offset,
                    dst_byte_offset: span.dst_offset,
                    bytes_per_page: span.bytes_per_page,
                    page_count: None,
                    rows_per_page: span.rows,
                    src_row_stride_bytes: span.src_row_stride,
                    dst_row_stride_bytes: span.dst_row_stride,
                });
            }
        });
        Ok(sources)
    }

    /// The plan for one decode rank: its prefill sources, fragments and their fanouts. It reads
    /// from `prefill_group` (a router's choice) or, when `None`, the default group.
    pub fn plan_for_decode_rank(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
    ) -> PlanResult<RankPlan> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        if self.identity {
            // The reference's identity plans name their one source and carry no fragments.
            let coord = self.decode_ranks().coord(decode_rank);
            let prefill_rank =
                self.prefill_ranks()
                    .rank_at(target_dp_group, coord.stage, coord.tp_rank);
            return Ok(RankPlan {
                kind: PlanKind::Identity,
                target_dp_group,
                sources: vec![SourcePlan {
                    prefill_rank,
                    fragments: Vec::new(),
                    fanout: self.request_fanout(prefill_rank),
                }],
            });
        }
        Ok(RankPlan {
            kind: PlanKind::Fragmented,
            target_dp_group,
            sources: self.collect_sources(decode_rank, target_dp_group)?,
        })
    }
}

fn validate_pairs(prefill: &[BufferLayout], decode: &[BufferLayout]) -> PlanResult<()> {
    if prefill.len() != decode.len() {
        bail!(
            "prefill/decode buffer counts differ: {} prefill buffers, {} decode buffers; pass \
             one decode buffer for each prefill buffer, in the same order",
            prefill.len(),
            decode.len()
        );
    }
    for (position, (p, d)) in prefill.iter().zip(decode).enumerate() {
        let differs = |what: &str, pv: &dyn std::fmt::Debug, dv: &dyn std::fmt::Debug| {
            PlanError::new(format!(
                "prefill/decode {what} differ at buffer position {position}: prefill {pv:?}, \
                 decode {dv:?}; both sides must describe the same buffers in the same order"
            ))
        };
        if p.buffer_index != d.buffer_index {
            return Err(differs("buffer indexes", &p.buffer_index, &d.buffer_index));
        }
        if p.buffer_kind != d.buffer_kind {
            return Err(differs(
                "buffer kinds",
                &p.buffer_kind.as_str(),
                &d.buffer_kind.as_str(),
            ));
        }
        if p.logical_axis != d.logical_axis {
            return Err(differs(
                "logical axes",
                &p.logical_axis.as_str(),
                &d.logical_axis.as_str(),
            ));
        }
        if p.logical_size != d.logical_size {
            return Err(differs("logical sizes", &p.logical_size, &d.logical_size));
        }
        if p.bytes_per_logical_unit != d.bytes_per_logical_unit {
            return Err(differs(
                "logical unit sizes",
                &p.bytes_per_logical_unit,
                &d.bytes_per_logical_unit,
            ));
        }
        if p.rows_per_page != d.rows_per_page {
            bail!(
                "prefill/decode rows_per_page differ at buffer position {position}: prefill {}, \
                 decode {}; both sides must store pages the same way (both head-major or both \
                 token-major)",
                p.rows_per_page,
                d.rows_per_page
            );
        }
        if p.logical_parts != d.logical_parts {
            return Err(differs(
                "logical parts",
                &p.logical_parts.given(),
                &d.logical_parts.given(),
            ));
        }
        let replicated = p.logical_axis == LogicalAxis::Replicated;
        if replicated && p.rows_per_page > 1 && p.item_stride_bytes != d.item_stride_bytes {
            bail!(
                "replicated buffer {} ({}) has {} rows a page but items of {} (prefill) and {} \
                 (decode) bytes: whole items are copied byte for byte, so token-major replicated \
                 items must be the same size on both sides",
                p.buffer_index,
                p.buffer_kind.as_str(),
                p.rows_per_page,
                p.item_stride_bytes,
                d.item_stride_bytes
            );
        }
        if replicated && d.item_stride_bytes > p.item_stride_bytes {
            bail!(
                "replicated buffer {} ({}): the decode item ({} bytes) is larger than the \
                 prefill item ({} bytes), so copying it would read past the prefill item; \
                 make the decode item_stride_bytes at most the prefill one",
                p.buffer_index,
                p.buffer_kind.as_str(),
                d.item_stride_bytes,
                p.item_stride_bytes
            );
        }
    }
    Ok(())
}

fn validate_alignment(layout: &ParallelLayout, buffer: &BufferLayout) -> PlanResult<()> {
    if !buffer.logical_axis.is_sharded() {
        return Ok(());
    }
    let role = layout.role.as_str();
    let kind = buffer.buffer_kind.as_str();
    let tp = layout.tp_size();
    let replica = buffer.tp_replica_group_size;
    if tp % replica != 0 {
        bail!(
            "tp replica group must divide TP size for buffer_kind={kind} on the {role} side: \
             tp_size_per_dp={tp}, tp_replica_group_size={replica}"
        );
    }
    let effective_tp = tp / replica;
    for part in buffer.part_sizes() {
        if part % effective_tp != 0 {
            let what = if buffer.logical_parts.given().is_empty() {
                "logical_size"
            } else {
                "a logical part of"
            };
            bail!(
                "non-aligned TP heterogeneous mapping for buffer_kind={kind} on the {role} side: \
                 {what}={part} is not divisible by effective_tp_size={effective_tp} \
                 (tp_size_per_dp={tp} / tp_replica_group_size={replica}); choose a TP size \
                 whose shard count divides {part}, or a replica group that makes it so"
            );
        }
    }
    let item_units = buffer.item_stride_bytes / buffer.bytes_per_logical_unit;
    let required_units = buffer.logical_size / effective_tp;
    if item_units < required_units {
        bail!(
            "buffer item is smaller than its logical shard for buffer_kind={kind} on the \
             {role} side: item_units={item_units}, required_units={required_units}; \
             item_stride_bytes must be at least {} bytes",
            required_units * buffer.bytes_per_logical_unit
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BufferKind, LogicalParts, Role};

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
            logical_parts: LogicalParts::WHOLE,
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
            .plan_for_decode_rank(1, None)
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
        let plan = p.plan_for_decode_rank(5, None).unwrap();
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
        let plan = p.plan_for_decode_rank(0, None).unwrap();
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
        let plan = p.plan_for_decode_rank(2, None).unwrap();
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
            .plan_for_decode_rank(2, None)
            .unwrap_err();
        assert!(err.message().contains("out of range"), "{err}");
    }

    #[test]
    fn routing_table_agrees_with_every_plan() {
        for (prefill_tp, decode_tp, heads) in [(8, 2, 8), (2, 8, 8), (4, 1, 2), (4, 4, 8)] {
            let p = planner(prefill_tp, decode_tp, heads).unwrap();
            let table = p.routing_table();
            let mut expected = RoutingTable::default();
            for rank in 0..decode_tp {
                let plan = p.plan_for_decode_rank(rank, None).unwrap();
                for source in plan.sources {
                    expected.decode_rank.push(rank);
                    expected.prefill_rank.push(source.prefill_rank);
                    if plan.kind == PlanKind::Identity {
                        expected.fragment_count.push(2);
                        expected.bytes_per_page.push(2 * heads / decode_tp * UNIT);
                    } else {
                        expected.fragment_count.push(source.fragments.len() as u64);
                        expected
                            .bytes_per_page
                            .push(source.fragments.iter().map(|f| f.bytes_per_page).sum());
                    }
                }
            }
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
        let plan = p.plan_for_decode_rank(5, None).unwrap();
        assert_eq!(plan.target_dp_group, 0);
        assert_eq!(plan.sources[0].prefill_rank, 1);
        let routed = p.plan_for_decode_rank(5, Some(1)).unwrap();
        assert_eq!(routed.target_dp_group, 1);
        assert_eq!(routed.sources[0].prefill_rank, 3);
        assert_eq!(routed.sources[0].fanout, 1);
        let err = p.plan_for_decode_rank(5, Some(2)).unwrap_err();
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
        let world = crate::layout::MAX_WORLD_SIZE;
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
        let err = p.plan_for_decode_rank(0, None).unwrap_err();
        assert!(err.message().contains("fragments (more than"), "{err}");
    }

    #[test]
    fn buffers_of_one_shape_share_one_class() {
        let p = planner(8, 2, 8).unwrap();
        assert_eq!(p.classes.len(), 1);
        assert_eq!(p.buffers.len(), 2);
    }
}
