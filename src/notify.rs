//! Who must hear "done": the prefill ranks of the DP group a decode rank reads that hold some
//! of the bytes its cache holds but send it none (MLA replicas, GQA replica groups under
//! `DecodeReplicas::First`, CP and DCP shares the plan reads elsewhere). A runtime sends them
//! notify-only messages so that they free their blocks, as vLLM does.

use std::collections::HashSet;

use crate::context::shares_meet;
use crate::holders::Holders;
use crate::layout::{BufferLayout, LogicalAxis, LogicalParts};
use crate::ranks::{RankSpace, Slot};

/// What decides whether two ranks hold common bytes of a buffer pair: the stages holding
/// it, how each side splits its units, and whether it is indexed by token. Buffers alike in
/// these behave alike, so each kind is checked once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holding {
    stages: (u64, u64),
    axis: LogicalAxis,
    logical_size: u64,
    parts: LogicalParts,
    replicas: (u64, u64),
}

impl Holding {
    fn of(p: &BufferLayout, d: &BufferLayout, stages: (u64, u64)) -> Self {
        Self {
            stages,
            axis: p.logical_axis,
            logical_size: p.logical_size,
            parts: p.logical_parts,
            replicas: (p.tp_replica_group_size, d.tp_replica_group_size),
        }
    }

    /// The units (by part, as `[start, end)` of the whole axis) TP rank `tp_rank` of a side
    /// of TP `tp` holds, its replica group being `replica` ranks.
    fn units(&self, tp: u64, replica: u64, tp_rank: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let shards = (tp / replica.max(1)).max(1);
        let shard = tp_rank / replica.max(1);
        self.parts.cuts(self.logical_size, shards).map(move |cut| {
            let (start, len) = cut.held(shard, shards);
            (start, start + len)
        })
    }

    /// Whether the prefill rank at `p` and the decode rank at `d` hold common units.
    fn units_meet(&self, (prefill_tp, decode_tp): (u64, u64), p: Slot, d: Slot) -> bool {
        if !self.axis.is_sharded() {
            return true;
        }
        self.units(prefill_tp, self.replicas.0, p.tp_rank)
            .zip(self.units(decode_tp, self.replicas.1, d.tp_rank))
            .any(|((a, b), (x, y))| a < y && x < b)
    }
}

/// The distinct kinds of holding of a planner's buffer pairs (with the stages holding each):
/// worked out once, then asked for every decode rank (the routing table asks for all of them).
pub fn holdings<'a>(
    pairs: impl IntoIterator<Item = ((&'a BufferLayout, &'a BufferLayout), (u64, u64))>,
) -> Vec<Holding> {
    let mut kinds: Vec<Holding> = Vec::new();
    let mut seen = HashSet::new();
    for ((p, d), stages) in pairs {
        let kind = Holding::of(p, d, stages);
        // Neighbouring buffers (K and V, layers of one stage) are mostly alike: the last kind
        // is checked before anything is hashed.
        if kinds.last() != Some(&kind) && seen.insert(kind.clone()) {
            kinds.push(kind);
        }
    }
    kinds
}

/// The prefill ranks of DP group `group` that hold some of decode rank `decode_rank`'s bytes
/// for a request of `num_tokens` tokens (None: any request), except `sources`, ascending;
/// `kinds` is `holdings` of the buffer pairs, `holders` who holds which tokens.
pub fn notify_ranks(
    (prefill_ranks, decode_ranks): (RankSpace, RankSpace),
    holders: &Holders,
    kinds: &[Holding],
    (decode_rank, group): (u64, u64),
    num_tokens: Option<u64>,
    sources: &[u64],
) -> Vec<u64> {
    let at = decode_ranks.coord(decode_rank).slot();
    let tps = (prefill_ranks.tp_size(), decode_ranks.tp_size());
    let tokens = num_tokens.filter(|_| holders.any_context());
    let mine = holders.decode.share(at);
    prefill_ranks
        .slots()
        .filter(|&slot| {
            let shares_meet = shares_meet(holders.prefill.share(slot), mine, tokens);
            kinds.iter().any(|kind| {
                kind.stages == (slot.stage, at.stage)
                    && kind.units_meet(tps, slot, at)
                    && (!kind.axis.is_token_indexed() || shares_meet)
                    && tokens != Some(0)
            })
        })
        .map(|slot| prefill_ranks.rank_in_group(group, slot))
        .filter(|rank| !sources.contains(rank))
        .collect()
}
