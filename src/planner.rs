//! The planner: counts each prefill rank's fanout and plans the fragments of one decode rank,
//! for a pair `pairs` has validated.
//!
//! Construction routes each decode rank of one DP group once per *class* (a distinct sharding
//! held by one prefill stage and one decode stage), not once per buffer, and finds overlapping
//! prefill shards by arithmetic, so it costs ranks x classes, not ranks x buffers x TP.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::error::{bail, PlanResult};
use crate::failover::{merge_lost, Failover, GoneRanks, LostRange, Rehoming};
use crate::fragment::Fragment;
use crate::holders::{Holders, Units};
use crate::layout::{BufferLayout, ParallelLayout};
use crate::limits;
use crate::notify::{holdings, notify_ranks, Holding};
use crate::page::{Span, TokenGeometry};
use crate::pairs::{needs_token_maps, validate_alignment, validate_context, validate_pairs};
use crate::ranks::{index_below, RankSpace, Slot};
use crate::routing::{route, Class, DecodeReplicas, Route, Sharding};
use crate::spread::{Need, NeedKey, Spread};
use crate::stages::{buffer_stages, is_staged, layer_count};

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
    /// Prefill ranks of the group that hold some of the decode rank's bytes but send it none,
    /// ascending: they hear "done" by a notify-only message (`notify`).
    pub notify: Vec<u64>,
}

/// Whole-cluster routing, one row per (decode rank, prefill rank) pair that moves data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingTable {
    pub decode_rank: Vec<u64>,
    pub prefill_rank: Vec<u64>,
    pub fragment_count: Vec<u64>,
    pub bytes_per_page: Vec<u64>,
}

#[derive(Debug, Clone)]
struct BufferPair {
    prefill: BufferLayout,
    decode: BufferLayout,
    /// Index into `Planner::classes`.
    class: usize,
    /// Where tokens sit on each side, when the plan maps tokens.
    tokens: Option<(TokenGeometry, TokenGeometry)>,
}

impl BufferPair {
    /// `span` with the token runs of local units `units`, when the plan maps tokens.
    fn tokenized(&self, span: Span, units: (u64, u64, u64)) -> Span {
        match &self.tokens {
            Some((src, dst)) => {
                span.with_tokens(units, (src, dst), self.prefill.pages_pair(&self.decode))
            }
            None => span,
        }
    }
}

/// The version of the rules that turn two layouts into plans. Bump it with any change that
/// makes this build plan the same layouts differently from an earlier one, so that two sides
/// running such builds see different fingerprints (`layout_frame::fingerprint`).
pub const PLANNING_RULES_VERSION: u32 = 1;

/// Choices a planner is built with, beyond the two sides' layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanOptions {
    pub replicas: DecodeReplicas,
    /// Give fragments of token-indexed buffers token geometry, so requests can move tokens by
    /// slot maps. On by itself where a token-indexed buffer's page sizes differ.
    pub token_maps: bool,
}

#[derive(Debug, Clone)]
pub struct Planner {
    prefill: ParallelLayout,
    decode: ParallelLayout,
    buffers: Vec<BufferPair>,
    classes: Vec<Class>,
    replicas: DecodeReplicas,
    /// Who holds which units and tokens on the prefill side.
    holders: Holders,
    /// Which holder serves whom where there is a choice (`DecodeReplicas::All`, replicated CP).
    spread: Spread,
    identity: bool,
    token_maps: bool,
    /// Fanout of each prefill rank of a DP group that decode ranks read from, by its slot
    /// index in the group; groups beyond the decode side's DP count serve nobody.
    fanout_per_slot: Vec<u64>,
    /// The distinct kinds of holding of the buffer pairs (`notify::holdings`), found once: every
    /// plan asks who else holds its bytes.
    holdings: Vec<Holding>,
    /// Prefill ranks that are gone and who serves in their place (`without_prefill_ranks`).
    failover: Option<Failover>,
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
        let options = PlanOptions {
            replicas,
            token_maps: false,
        };
        Self::with_options(prefill, decode, prefill_buffers, decode_buffers, options)
    }

    /// A planner built with `options`.
    pub fn with_options(
        prefill: ParallelLayout,
        decode: ParallelLayout,
        prefill_buffers: &[BufferLayout],
        decode_buffers: &[BufferLayout],
        options: PlanOptions,
    ) -> PlanResult<Self> {
        let replicas = options.replicas;
        let holders = Holders::of((&prefill, &decode), (prefill_buffers, decode_buffers))?;
        // Slot maps are the only way to move tokens spread over ranks.
        let token_maps = options.token_maps
            || needs_token_maps(prefill_buffers, decode_buffers)
            || holders.any_context();
        validate_pairs(prefill_buffers, decode_buffers, token_maps)?;
        for (layout, buffers) in [(&prefill, prefill_buffers), (&decode, decode_buffers)] {
            for buffer in buffers {
                validate_alignment(layout, buffer)?;
                validate_context(layout, buffer)?;
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
                let tokens = if token_maps && p.logical_axis.is_token_indexed() {
                    Some((TokenGeometry::of(p)?, TokenGeometry::of(d)?))
                } else {
                    None
                };
                Ok(BufferPair {
                    prefill: *p,
                    decode: *d,
                    class: id,
                    tokens,
                })
            })
            .collect::<PlanResult<Vec<_>>>()?;
        // Whole items copy rank to rank when both sides hold the same units the same way: same
        // TP and stages, no replica groups, and token-major items of one size (else rows
        // would shift).
        let identity = !holders.any_context()
            && prefill.ranks().tp_size() == decode.ranks().tp_size()
            && prefill.pp_size() == decode.pp_size()
            && prefill_stages == decode_stages
            && prefill_buffers.iter().zip(decode_buffers).all(|(p, d)| {
                p.tp_replica_group_size == 1
                    && d.tp_replica_group_size == 1
                    && (!p.logical_axis.is_token_indexed() || p.page_size == d.page_size)
                    && (p.rows_per_page == 1 || p.page_extent() == d.page_extent())
            });
        let mut planner = Self {
            prefill,
            decode,
            buffers,
            classes,
            replicas,
            holders,
            spread: Spread::default(),
            identity,
            token_maps,
            fanout_per_slot: Vec::new(),
            holdings: Vec::new(),
            failover: None,
        };
        planner.holdings = holdings(planner.buffer_pairs().zip(planner.buffer_stages()));
        if replicas == DecodeReplicas::All || holders.prefill.context.cp_replicas() > 1 {
            let needs: Vec<Vec<Need>> = planner
                .decode_ranks()
                .slots()
                .map(|at| planner.needs(at))
                .collect();
            planner.spread = Spread::choose(planner.prefill_ranks(), &needs);
        }
        planner.fanout_per_slot = planner.count_fanout(None, None);
        Ok(planner)
    }

    /// This planner with the prefill ranks `ranks` (and any this one already lacks)
    /// unavailable: every need an available rank of the read DP group and stage holds is read
    /// from one of them, needs whose holder is up keep it, and the rest are lost (`lost`).
    /// Built from the planner's own choices, so equal sets give equal plans whatever the order
    /// or the steps they were named in. Costs decode slots x classes for each distinct set of
    /// gone slots among the DP groups.
    pub fn without_prefill_ranks(&self, ranks: &[i128]) -> PlanResult<Self> {
        let mut gone = GoneRanks::of(self.prefill_ranks(), ranks)?;
        if let Some(failover) = &self.failover {
            gone = gone.union(failover.gone());
        }
        let mut planner = Self {
            failover: None,
            ..self.clone()
        };
        if gone.is_empty() {
            return Ok(planner);
        }
        let failover = Failover::build(gone, self.prefill_ranks(), |r| planner.rehome(r));
        planner.failover = Some(failover);
        Ok(planner)
    }

    /// The prefill ranks that are unavailable, ascending (empty for a planner of every rank).
    pub fn unavailable_prefill_ranks(&self) -> &[u64] {
        self.failover.as_ref().map_or(&[], |f| f.gone().ranks())
    }

    /// Whether prefill rank `rank` is unavailable.
    fn is_gone(&self, rank: u64) -> bool {
        self.failover
            .as_ref()
            .is_some_and(|f| f.gone().contains(rank))
    }

    /// The rehoming of prefill DP group `group`, when some of its ranks are gone.
    fn rehoming(&self, group: u64) -> Option<&Rehoming> {
        self.failover
            .as_ref()
            .and_then(|f| f.rehoming(group))
            .map(|(_, r)| r)
    }

    /// Chooses who serves, in one DP group whose slots `rehoming` marks gone, each need whose
    /// holder is gone, and counts the group's fanout.
    fn rehome(&self, mut rehoming: Rehoming) -> Rehoming {
        let prefill = self.prefill_ranks();
        let gone = |slot: Slot| rehoming.is_gone(prefill.slot_index(slot));
        let mut orphaned: HashSet<NeedKey> = HashSet::new();
        let needs: Vec<Vec<Need>> = self
            .decode_ranks()
            .slots()
            .map(|at| {
                self.need_keys(at)
                    .into_iter()
                    .map(|(key, reader)| {
                        let (_, id, units, share) = key;
                        let kept = self.base_source(at, id, units, share);
                        let choices = if gone(kept) {
                            orphaned.insert(key);
                            self.holders
                                .every_holder(&self.class_of(id), units, at.tp_rank, share)
                                .into_iter()
                                .filter(|&slot| !gone(slot))
                                .collect()
                        } else {
                            vec![kept]
                        };
                        Need {
                            key,
                            choices,
                            reader,
                        }
                    })
                    .collect()
            })
            .collect();
        rehoming.choose(prefill, &needs, &orphaned);
        rehoming.fanout_per_slot = self.count_fanout(None, Some(&rehoming));
        rehoming
    }

    /// What decode rank `decode_rank` cannot receive because no available prefill rank of the
    /// DP group it reads (`prefill_group`, or the default) holds it, for a request of
    /// `num_tokens` tokens (None: any): buffer order, then token share, then unit.
    pub fn lost(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
        num_tokens: Option<u64>,
    ) -> PlanResult<Vec<LostRange>> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        let Some(rehoming) = self.rehoming(target_dp_group) else {
            return Ok(Vec::new());
        };
        let at = self.decode_ranks().coord(decode_rank).slot();
        let shares = self.shares(at, num_tokens);
        let split = self.holders.prefill.deal.ways() > 1;
        let routes = self.routes_by_class(at);
        let mut lost = Vec::new();
        for (position, pair) in self.buffers.iter().enumerate() {
            let runs: Vec<(Units, u64, u64)> = match routes.get(pair.class) {
                Some(Some(Route::WholeItem)) => {
                    vec![(Units::Whole, 0, pair.decode.logical_size)]
                }
                Some(Some(Route::Units(overlaps))) => overlaps
                    .iter()
                    .map(|o| (Units::Shard(o.src_shard), o.unit, o.unit + o.len))
                    .collect(),
                _ => Vec::new(),
            };
            for (units, unit_start, unit_end) in runs {
                for &share in &shares {
                    if self
                        .source(at, pair.class, units, share, Some(rehoming))
                        .is_none()
                    {
                        lost.push((
                            position,
                            LostRange {
                                buffer_index: pair.decode.buffer_index,
                                layer: pair.decode.layer,
                                unit_start,
                                unit_end,
                                share: split.then_some(share),
                            },
                        ));
                    }
                }
            }
        }
        Ok(merge_lost(lost))
    }

    pub const fn prefill(&self) -> &ParallelLayout {
        &self.prefill
    }

    pub const fn decode(&self) -> &ParallelLayout {
        &self.decode
    }

    pub const fn prefill_ranks(&self) -> RankSpace {
        self.prefill.ranks()
    }

    pub const fn decode_ranks(&self) -> RankSpace {
        self.decode.ranks()
    }

    /// The (prefill, decode) buffer pairs, in order.
    pub fn buffer_pairs(&self) -> impl Iterator<Item = (&BufferLayout, &BufferLayout)> {
        self.buffers
            .iter()
            .map(|pair| (&pair.prefill, &pair.decode))
    }

    /// The prefill ranks of `group` a decode rank must notify (see `notify::notify_ranks`).
    fn notify_ranks(
        &self,
        kinds: &[Holding],
        ranks: (u64, u64),
        num_tokens: Option<u64>,
        sources: &[u64],
    ) -> Vec<u64> {
        let spaces = (self.prefill_ranks(), self.decode_ranks());
        let mut notify = notify_ranks(spaces, &self.holders, kinds, ranks, num_tokens, sources);
        // A rank that is gone hears nothing.
        notify.retain(|&rank| !self.is_gone(rank));
        notify
    }

    /// The (prefill, decode) stages holding each buffer, in buffer order.
    pub fn buffer_stages(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buffers.iter().map(|pair| {
            let class = self.class(pair);
            (class.prefill_stage, class.decode_stage)
        })
    }

    fn class(&self, pair: &BufferPair) -> Class {
        self.class_of(pair.class)
    }

    fn class_of(&self, id: usize) -> Class {
        self.classes.get(id).copied().unwrap_or(Class {
            sharding: Sharding::Replicated,
            prefill_stage: 0,
            decode_stage: 0,
        })
    }

    pub const fn is_identity(&self) -> bool {
        self.identity
    }

    /// Whether either side runs pipeline stages.
    /// Whether fragments of token-indexed buffers carry token geometry.
    pub const fn token_maps(&self) -> bool {
        self.token_maps
    }

    pub const fn is_staged(&self) -> bool {
        is_staged(self.prefill.pp_size()) || is_staged(self.decode.pp_size())
    }

    pub const fn decode_replicas(&self) -> DecodeReplicas {
        self.replicas
    }

    /// Decode ranks that receive nothing at all under this planner's mode (non-first ranks of
    /// every decode replica group under `DecodeReplicas::First`, when no buffer is replicated):
    /// the runtime must copy inside the group for them.
    pub fn idle_decode_ranks(&self) -> u64 {
        let idle_per_group = self
            .decode_ranks()
            .slots()
            .filter(|&slot| self.fragment_count(slot, None, self.identity) == 0)
            .count() as u64;
        idle_per_group * self.decode.dp_size()
    }

    /// The prefill DP group decode DP group `decode_group` reads from by default: the same
    /// index, wrapped (`g mod prefill dp_size`) when the decode side has more groups.
    pub const fn default_prefill_group(&self, decode_group: u64) -> u64 {
        decode_group % self.prefill.dp_size()
    }

    /// Decode ranks one request makes `prefill_rank` wait for: those of the reading decode DP
    /// group that read from it. The same whichever decode group a request comes from.
    pub fn request_fanout(&self, prefill_rank: u64) -> u64 {
        let group = self.prefill_ranks().coord(prefill_rank).dp_group;
        let per_slot = self
            .rehoming(group)
            .map_or(self.fanout_per_slot.as_slice(), |r| &r.fanout_per_slot);
        fanout_in(per_slot, self.prefill_ranks(), prefill_rank)
    }

    /// A prefill rank's fanout under the default group mapping: its request fanout when some
    /// decode group reads from its DP group by default, else 0 (the reference's values wherever
    /// the reference plans).
    pub fn fanout(&self, prefill_rank: u64) -> u64 {
        let group = self.prefill_ranks().coord(prefill_rank).dp_group;
        let is_default_source = group < self.decode.dp_size();
        if is_default_source {
            self.request_fanout(prefill_rank)
        } else {
            0
        }
    }

    /// Fanout of every prefill rank, rank order.
    pub fn source_fanout(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.prefill.world_size()).map(|rank| (rank, self.fanout(rank)))
    }

    /// How the decode rank at `slot` is routed for each class its stage holds, with the class
    /// ids, in prefill shards.
    fn routes(&self, slot: Slot) -> impl Iterator<Item = (usize, Route)> + '_ {
        let (prefill_tp, decode_tp) = (
            self.prefill_ranks().tp_size(),
            self.decode_ranks().tp_size(),
        );
        self.classes
            .iter()
            .enumerate()
            .filter(move |(_, class)| class.decode_stage == slot.stage)
            .map(move |(id, class)| {
                let receivers = match class.sharding {
                    Sharding::Split { decode_replica, .. } => {
                        self.holders.first_receivers(decode_replica)
                    }
                    Sharding::Replicated => 1,
                };
                let routed = route(
                    class.sharding,
                    (prefill_tp, decode_tp),
                    slot.tp_rank,
                    self.replicas,
                    receivers,
                );
                (id, routed)
            })
    }

    /// The prefill token shares the decode rank at `at` reads, for a request of `num_tokens`
    /// tokens (None: any request); one share when neither side spreads tokens.
    fn shares(&self, at: Slot, num_tokens: Option<u64>) -> Vec<u64> {
        let num_tokens = num_tokens.filter(|_| self.holders.any_context());
        self.holders.shares(at, num_tokens).collect()
    }

    /// Every need of the decode rank at `at` that some prefill rank must serve, with the
    /// holders a spread may choose from.
    fn needs(&self, at: Slot) -> Vec<Need> {
        self.need_keys(at)
            .into_iter()
            .map(|(key, reader)| {
                let (_, id, units, share) = key;
                Need {
                    key,
                    choices: self.holders.choices(
                        &self.class_of(id),
                        units,
                        at.tp_rank,
                        share,
                        self.replicas,
                    ),
                    reader,
                }
            })
            .collect()
    }

    /// Every need of the decode rank at `at` that some prefill rank must serve (any request),
    /// with the decode rank's place among the need's readers.
    fn need_keys(&self, at: Slot) -> Vec<(NeedKey, u64)> {
        let shares = self.shares(at, None);
        let decode_tp = self.decode_ranks().tp_size();
        let mut out = Vec::new();
        for (id, routed) in self.routes(at) {
            let units: Vec<(Units, u64)> = match &routed {
                Route::Nothing => Vec::new(),
                Route::WholeItem => vec![(Units::Whole, at.tp_rank)],
                Route::Units(overlaps) => overlaps
                    .iter()
                    .map(|o| (Units::Shard(o.src_shard), o.reader))
                    .collect(),
            };
            for (units, reader) in units {
                for &share in &shares {
                    out.push(((at, id, units, share), reader + at.cp_rank * decode_tp));
                }
            }
        }
        out
    }

    /// The prefill slot serving `units` of class `id` and token share `share` to the decode
    /// rank at `at` while every rank is up.
    fn base_source(&self, at: Slot, id: usize, units: Units, share: u64) -> Slot {
        if let Some(chosen) = self.spread.holder(&(at, id, units, share)) {
            return chosen;
        }
        self.holders
            .default_holder(&self.class_of(id), units, at.tp_rank, share)
    }

    /// The prefill slot serving that need in a DP group `rehoming` describes (None: every
    /// rank of the group is up); `None` when it is lost.
    fn source(
        &self,
        at: Slot,
        id: usize,
        units: Units,
        share: u64,
        rehoming: Option<&Rehoming>,
    ) -> Option<Slot> {
        if let Some(chosen) = rehoming.and_then(|r| r.holder(&(at, id, units, share))) {
            return chosen;
        }
        Some(self.base_source(at, id, units, share))
    }

    /// The route of the decode rank at `at` for each class, by class id (None: not its stage).
    fn routes_by_class(&self, at: Slot) -> Vec<Option<Route>> {
        let mut routes: Vec<Option<Route>> = vec![None; self.classes.len()];
        for (id, routed) in self.routes(at) {
            if let Some(slot) = routes.get_mut(id) {
                *slot = Some(routed);
            }
        }
        routes
    }

    /// Decode ranks of one DP group reading each prefill slot of a DP group (`rehoming`: one
    /// with gone ranks), for a request of `num_tokens` tokens (None: any request).
    fn count_fanout(&self, num_tokens: Option<u64>, rehoming: Option<&Rehoming>) -> Vec<u64> {
        let prefill_ranks = self.prefill_ranks();
        let slots = usize::try_from(prefill_ranks.group_size()).unwrap_or(0);
        let mut counts = vec![0u64; slots];
        // `seen[p] == d + 1` marks prefill slot p as already counted for decode slot d.
        let mut seen = vec![0u64; slots];
        for (decode_slot, at) in (1u64..).zip(self.decode_ranks().slots()) {
            let shares = self.shares(at, num_tokens);
            for (id, routed) in self.routes(at) {
                let mut count = |units: Units| {
                    for &share in &shares {
                        let Some(source) = self.source(at, id, units, share, rehoming) else {
                            continue;
                        };
                        let slot = prefill_ranks.slot_index(source);
                        let slot = usize::try_from(slot).unwrap_or(usize::MAX);
                        if let (Some(mark), Some(count)) =
                            (seen.get_mut(slot), counts.get_mut(slot))
                        {
                            if *mark != decode_slot {
                                *mark = decode_slot;
                                *count += 1;
                            }
                        }
                    }
                };
                match routed {
                    Route::Nothing => {}
                    Route::WholeItem => count(Units::Whole),
                    Route::Units(overlaps) => {
                        for overlap in &overlaps {
                            count(Units::Shard(overlap.src_shard));
                        }
                    }
                }
            }
        }
        counts
    }

    /// A decode rank as a caller gave it (any integer), checked against the decode world.
    pub fn decode_rank(&self, value: i128) -> PlanResult<u64> {
        let world = self.decode.world_size();
        let Some(rank) = index_below(value, world) else {
            bail!(
                "decode_rank={value} is out of range: the decode world has {world} ranks \
                 (0..{world})"
            );
        };
        Ok(rank)
    }

    /// A prefill DP group as a router gave it (any integer), checked against the prefill side.
    pub fn prefill_group(&self, value: i128) -> PlanResult<u64> {
        let groups = self.prefill.dp_size();
        let Some(group) = index_below(value, groups) else {
            bail!(
                "prefill_dp_group={value} is out of range: the prefill side has {groups} DP \
                 groups (0..{groups})"
            );
        };
        Ok(group)
    }

    /// A request's token count as a caller gave it, checked.
    pub fn num_tokens(value: i128) -> PlanResult<u64> {
        let Ok(count) = u64::try_from(value) else {
            bail!("num_tokens={value} must not be negative");
        };
        limits::TOKENS.check("num_tokens", count)
    }

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

    /// Who holds which units and tokens, on both sides.
    pub const fn holders(&self) -> &Holders {
        &self.holders
    }

    /// Each prefill slot's request fanout (slot order of prefill DP group `group`) for a
    /// request of `num_tokens` tokens (None: any).
    pub fn request_fanouts(
        &self,
        group: u64,
        num_tokens: Option<u64>,
    ) -> std::borrow::Cow<'_, [u64]> {
        self.fanout_for(num_tokens, self.rehoming(group))
    }

    /// Per-slot fanouts for a request of `num_tokens` tokens read from a DP group `rehoming`
    /// describes: the counts made at construction unless the request's length changes who
    /// holds what.
    fn fanout_for<'a>(
        &'a self,
        num_tokens: Option<u64>,
        rehoming: Option<&'a Rehoming>,
    ) -> std::borrow::Cow<'a, [u64]> {
        match (num_tokens, rehoming) {
            (Some(n), _) if self.holders.any_context() => {
                self.count_fanout(Some(n), rehoming).into()
            }
            (_, Some(r)) => r.fanout_per_slot.as_slice().into(),
            _ => self.fanout_per_slot.as_slice().into(),
        }
    }

    /// How many fragments the decode rank at `at` receives, without building them.
    fn fragment_count(&self, at: Slot, num_tokens: Option<u64>, whole_items: bool) -> u64 {
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
    fn for_each_span(
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
                    pair.prefill.logical_size / self.prefill_ranks().tp_size()
                } else {
                    1
                };
                let span = pair.tokenized(Span::contiguous(0, 0, len), (0, 0, units));
                visit(at, pair, span);
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
                    let span = pair.tokenized(span, (0, 0, 1));
                    for &share in &shares {
                        let source = self.source(at, pair.class, Units::Whole, share, rehoming);
                        visit(source, pair, span);
                    }
                }
                Some(Some(Route::Units(overlaps))) => {
                    for overlap in overlaps {
                        let span = Span::of_units(overlap, &pair.prefill, &pair.decode);
                        let units = (overlap.src_local, overlap.dst_local, overlap.len);
                        let span = pair.tokenized(span, units);
                        for &share in &shares {
                            let units = Units::Shard(overlap.src_shard);
                            let source = self.source(at, pair.class, units, share, rehoming);
                            visit(source, pair, span);
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
    fn source_group(&self, decode_rank: u64, prefill_group: Option<u64>) -> PlanResult<u64> {
        let decode_rank = self.decode_rank(i128::from(decode_rank))?;
        match prefill_group {
            None => Ok(self.default_prefill_group(self.decode_ranks().coord(decode_rank).dp_group)),
            Some(group) => self.prefill_group(i128::from(group)),
        }
    }

    /// Every source of `decode_rank` reading prefill DP group `target_dp_group`, with its
    /// fragments (identity plans: whole items), prefill rank ascending.
    fn collect_sources(
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
type SlotRows = Vec<(Slot, u64, u64)>;

/// The fanout of `prefill_rank` in a per-slot table.
fn fanout_in(per_slot: &[u64], ranks: RankSpace, prefill_rank: u64) -> u64 {
    let slot = ranks.slot_index(ranks.coord(prefill_rank).slot());
    usize::try_from(slot)
        .ok()
        .and_then(|slot| per_slot.get(slot))
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BufferKind, LogicalAxis, LogicalParts, Role};

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
}
