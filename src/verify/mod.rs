//! An independent check of a planner's output: every byte of every decode rank's shard of
//! every buffer is written exactly once per page, by a fragment from a prefill rank of the same
//! DP group that holds that same logical byte (same unit, same row of the page, same byte of
//! the unit's row), inside both items; and each prefill rank's fanout is the number of decode
//! ranks whose plans name it.
//!
//! It reads only the layouts and the plans (identity plans as their whole-item fragments), not
//! the planner's routing, so a routing bug shows up as a named gap or overlap. From the
//! planner it takes the two layouts and the buffer pairs as given, the options it was built
//! with (`decode_replicas`, token maps) and the plans and fanout it checks; each buffer's stage
//! and each rank's token share it derives from the layouts itself.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::error::{bail, PlanResult};
use crate::holders::Holders;
use crate::layout::{BufferLayout, IndexSpace, LogicalAxis, LogicalParts};
use crate::planner::{Planner, SourcePlan};
use crate::routing::DecodeReplicas;
use crate::stages::{buffer_stages, layer_count};

mod coverage;
mod fragments;
mod lost;

/// The logical units a rank holds, in its item's order, as runs `(first unit, count)`: its
/// shard of each part in turn (any rank of a replica group holds the group's; a part of fewer
/// groups than shards, its group's copy), or everything.
fn held_units(buffer: &BufferLayout, tp_size: u64, tp_rank: u64) -> Vec<(u64, u64)> {
    match buffer.logical_axis {
        LogicalAxis::Replicated => vec![(0, buffer.logical_size)],
        LogicalAxis::KvHead | LogicalAxis::StateChannel => {
            let shards = tp_size / buffer.tp_replica_group_size;
            let shard = tp_rank / buffer.tp_replica_group_size;
            buffer
                .logical_parts
                .cuts(buffer.logical_size, shards)
                .map(|cut| cut.held(shard, shards))
                .collect()
        }
    }
}

/// The logical unit at position `local` of a rank's item.
fn unit_at(runs: &[(u64, u64)], mut local: u64) -> Option<u64> {
    for &(first, count) in runs {
        if local < count {
            return Some(first + local);
        }
        local -= count;
    }
    None
}

/// Units a decode rank must receive: as held, but under `DecodeReplicas::First` only the
/// first rank of a replica group receives a sharded buffer (the reference's semantics), or
/// with decode DCP the first `dcp` ranks, one for each token share.
fn received_units(
    buffer: &BufferLayout,
    tp_size: u64,
    tp_rank: u64,
    (replicas, dcp): (DecodeReplicas, u64),
) -> Vec<(u64, u64)> {
    let first_only = replicas == DecodeReplicas::First;
    if first_only
        && buffer.logical_axis.is_sharded()
        && tp_rank % buffer.tp_replica_group_size >= dcp
    {
        return Vec::new();
    }
    held_units(buffer, tp_size, tp_rank)
}

/// Token writes from sources holding every token.
const EVERY_TOKEN: u64 = u64::MAX;

fn unit_count(runs: &[(u64, u64)]) -> u64 {
    runs.iter().map(|&(_, count)| count).sum()
}

/// The bytes one run of a fragment writes: `row` of the page, `start..end` within the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Written {
    row: u64,
    start: u64,
    end: u64,
}

/// One verification pass: what the plans are checked against, derived from the layouts.
struct Check<'a> {
    planner: &'a Planner,
    /// The request's length, when checking the plans of one.
    num_tokens: Option<u64>,
    pairs: Vec<(&'a BufferLayout, &'a BufferLayout)>,
    /// The (prefill, decode) pipeline stages holding each buffer.
    stages: Vec<(u64, u64)>,
    /// Which tokens each rank of either side holds.
    holders: Holders,
    /// Each buffer's position by its index within its kind's space (KV or state).
    position_of: HashMap<(IndexSpace, u64), usize>,
    /// What the available prefill ranks hold, by DP group and kind of buffer (`available`).
    available: RefCell<HashMap<AvailableKey, std::rc::Rc<Held>>>,
}

/// (logical unit, token share tag) pairs some ranks hold.
type Held = HashSet<(u64, u64)>;

/// A DP group, a stage and the shape of a buffer's axis (its kind, replicas, size and parts):
/// what decides who holds its units.
type AvailableKey = (u64, u64, LogicalAxis, u64, u64, LogicalParts);

impl<'a> Check<'a> {
    fn of(planner: &'a Planner, num_tokens: Option<u64>) -> PlanResult<Self> {
        let pairs: Vec<_> = planner.buffer_pairs().collect();
        let (prefill, decode) = (planner.prefill(), planner.decode());
        let (prefill_buffers, decode_buffers): (Vec<BufferLayout>, Vec<BufferLayout>) =
            pairs.iter().map(|&(p, d)| (*p, *d)).unzip();
        // Stages and token shares from the layouts, not from the planner's routing.
        let layers = layer_count(prefill, decode, &prefill_buffers)?;
        let stages = buffer_stages(prefill, &prefill_buffers, layers)?
            .into_iter()
            .zip(buffer_stages(decode, &decode_buffers, layers)?)
            .collect();
        let holders = Holders::of((prefill, decode), (&prefill_buffers, &decode_buffers))?;
        let mut position_of = HashMap::new();
        for (position, (p, _)) in pairs.iter().enumerate() {
            let key = (p.buffer_kind.index_space(), p.buffer_index);
            if position_of.insert(key, position).is_some() {
                bail!(
                    "buffer_index={} is used by two {} buffers, so fragments cannot name one of \
                     them; give every buffer its own index within its kind's space",
                    p.buffer_index,
                    p.buffer_kind.index_space().as_str()
                );
            }
        }
        Ok(Self {
            planner,
            num_tokens,
            pairs,
            stages,
            holders,
            position_of,
            available: RefCell::default(),
        })
    }
}

/// What one decode rank's fragments write into one buffer: bytes of each page, and (token
/// maps) bytes of each token slice, by plane.
#[derive(Debug, Clone, Default)]
struct BufferWrites {
    pages: Vec<Written>,
    /// Token writes tagged with the source's prefill token share (`EVERY_TOKEN`: all).
    tokens: Vec<(u64, Written)>,
}

fn to_index(unit: u64) -> usize {
    usize::try_from(unit).unwrap_or(usize::MAX)
}

/// Verifies every plan of `planner`; the error names the first gap, overlap or wrong source.
pub fn verify(planner: &Planner) -> PlanResult<()> {
    verify_at(planner, None)
}

/// Verifies every plan of `planner` for a request of `num_tokens` tokens (None: any).
pub fn verify_at(planner: &Planner, num_tokens: Option<u64>) -> PlanResult<()> {
    verify_plans(planner, num_tokens, |rank| {
        planner.transfer_fragments(rank, None, num_tokens)
    })
}

/// Verifies the plans `plans_for(decode_rank)` gives against `planner`'s layouts and fanout,
/// for a request of `num_tokens` tokens (None: any).
pub fn verify_plans(
    planner: &Planner,
    num_tokens: Option<u64>,
    mut plans_for: impl FnMut(u64) -> PlanResult<Vec<SourcePlan>>,
) -> PlanResult<()> {
    let check = Check::of(planner, num_tokens)?;
    let (prefill_ranks, decode_ranks) = (planner.prefill_ranks(), planner.decode_ranks());
    // Decode ranks of the current decode DP group reading each prefill rank (by its slot in
    // the group) of its source.
    let mut readers = vec![0u64; usize::try_from(prefill_ranks.group_size()).unwrap_or(0)];
    let mut written: Vec<BufferWrites> = vec![BufferWrites::default(); check.pairs.len()];
    for group in 0..decode_ranks.dp_size() {
        let source_group = planner.default_prefill_group(group);
        for decode_rank in decode_ranks.group_ranks(group) {
            for lists in &mut written {
                lists.pages.clear();
                lists.tokens.clear();
            }
            for source in plans_for(decode_rank)? {
                let at = prefill_ranks.coord(source.prefill_rank);
                if !prefill_ranks.contains(source.prefill_rank) || at.dp_group != source_group {
                    bail!(
                        "decode rank {decode_rank} (DP group {group}) reads from prefill rank \
                         {}, outside prefill DP group {source_group} it maps to",
                        source.prefill_rank
                    );
                }
                // A source that sends nothing serves nobody.
                if let Some(count) = usize::try_from(prefill_ranks.slot_index(at.slot()))
                    .ok()
                    .and_then(|r| readers.get_mut(r))
                    .filter(|_| !source.fragments.is_empty())
                {
                    *count += 1;
                }
                check.add_source(decode_rank, &source, &mut written)?;
            }
            check.check_rank_coverage(decode_rank, source_group, &mut written)?;
        }
        check_fanout(planner, (group, source_group), num_tokens, &mut readers)?;
    }
    Ok(())
}

/// One request of decode DP group `group` (reading prefill group `source_group`): each source
/// rank waits for the decode ranks that read it, by slot in `readers` (cleared for the next).
fn check_fanout(
    planner: &Planner,
    (group, source_group): (u64, u64),
    num_tokens: Option<u64>,
    readers: &mut [u64],
) -> PlanResult<()> {
    let first = planner.prefill_ranks().group_start(source_group);
    let fanouts = planner.request_fanouts(source_group, num_tokens);
    for ((rank, count), &fanout) in (first..).zip(readers.iter_mut()).zip(fanouts.iter()) {
        if *count != fanout {
            bail!(
                "prefill rank {rank} reports a fanout of {fanout} but {count} decode ranks of \
                 decode DP group {group} read from it"
            );
        }
        *count = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
