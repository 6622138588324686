//! The planner: counts each prefill rank's fanout and plans the fragments of one decode rank,
//! for a pair `pairs` has validated.
//!
//! Construction routes each decode rank of one DP group once per *class* (a distinct sharding
//! held by one prefill stage and one decode stage), not once per buffer, and finds overlapping
//! prefill shards by arithmetic, so it costs ranks x classes, not ranks x buffers x TP.

use std::collections::HashMap;

use crate::error::{bail, PlanResult};
use crate::failover::Failover;
use crate::fragment::Fragment;
use crate::holders::Holders;
use crate::layout::{BufferLayout, ParallelLayout};
use crate::limits;
use crate::notify::{holdings, notify_ranks, Holding};
use crate::page::{Span, TokenGeometry};
use crate::pairs::{needs_token_maps, validate_alignment, validate_context, validate_pairs};
use crate::ranks::{index_below, RankSpace};
use crate::routing::{Class, DecodeReplicas, Sharding};
use crate::spread::{Need, Spread};
use crate::stages::{buffer_stages, is_staged, layer_count};

mod fanout;
mod gone;
mod plans;
mod sources;

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
    /// `span` with the token runs of local units `units`, when the plan maps tokens: one span,
    /// or, where a unit's tokens lie in pieces, one a unit and plane (`Span::of_pieces`).
    fn tokenized(&self, span: Span, units: (u64, u64, u64)) -> Spans {
        match &self.tokens {
            Some((src, dst)) if src.piece_planes() > 0 => Spans::Many(
                Span::of_pieces(units, (src, dst), self.prefill.pages_pair(&self.decode))
                    .into_iter(),
            ),
            Some((src, dst)) => Spans::One(std::iter::once(span.with_tokens(
                units,
                (src, dst),
                self.prefill.pages_pair(&self.decode),
            ))),
            None => Spans::One(std::iter::once(span)),
        }
    }
}

/// The spans of one unit run: one (no allocation, the common case) or, where a unit's tokens
/// lie in pieces, one a unit and plane.
enum Spans {
    One(std::iter::Once<Span>),
    Many(std::vec::IntoIter<Span>),
}

impl Iterator for Spans {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        match self {
            Self::One(one) => one.next(),
            Self::Many(many) => many.next(),
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

    /// The prefill DP group decode DP group `decode_group` reads from by default: the same
    /// index, wrapped (`g mod prefill dp_size`) when the decode side has more groups.
    pub const fn default_prefill_group(&self, decode_group: u64) -> u64 {
        decode_group % self.prefill.dp_size()
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

    /// Who holds which units and tokens, on both sides.
    pub const fn holders(&self) -> &Holders {
        &self.holders
    }
}

#[cfg(test)]
mod tests;
