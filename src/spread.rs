//! Which prefill rank of a replica group serves each decode rank when every decode rank
//! receives directly (`DecodeReplicas::All`).
//!
//! A prefill shard held by a replica group of `r` ranks can be read from any of them; a prefill
//! rank's fanout is the number of distinct decode ranks it serves. The choice is made once per
//! planner, over the decode TP ranks of one group (every group repeats it). Sources that are no
//! choice (whole replicated items, shards held by one rank) are taken first; then each decode
//! rank takes, for each shard it still needs (smallest replica groups first), a holder it
//! already reads from if there is one (no new wait), else the least-loaded holder, ties going
//! round-robin over the shard's readers. That spreads readers evenly (prefill TP 16 -> decode
//! TP 32 over 8 KV heads: two decode ranks per prefill rank) and lines up the choices of
//! buffers that are sharded differently.

use std::collections::{BTreeSet, HashMap};

use crate::ranks::{RankSpace, Slot};
use crate::routing::{first_holder, replicated_source, Class, Sharding};

/// The holder chosen for each (decode slot, class, prefill shard): a prefill TP rank.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    holders: HashMap<(Slot, usize, u64), u64>,
}

/// One shard a decode rank reads: which class, which shard, the prefill slot indexes holding
/// it (a run of `replica` from `first`), and the holder index to prefer on a tie.
struct Need {
    class: usize,
    src_shard: u64,
    first: u64,
    replica: u64,
    preferred: u64,
}

/// The shards the decode rank at `at` reads, class by class.
fn needs(classes: &[Class], (prefill, decode): (RankSpace, RankSpace), at: Slot) -> Vec<Need> {
    let (prefill_tp, decode_tp) = (prefill.tp_size(), decode.tp_size());
    let mut out = Vec::new();
    for (class, kind) in classes.iter().enumerate() {
        if kind.decode_stage != at.stage {
            continue;
        }
        // The prefill slot index of TP rank `tp_rank` of the class's prefill stage.
        let slot_of = |tp_rank| {
            prefill.slot_index(Slot {
                stage: kind.prefill_stage,
                tp_rank,
            })
        };
        let Sharding::Split {
            prefill_replica,
            decode_replica,
            ..
        } = kind.sharding
        else {
            let source = replicated_source(prefill_tp, decode_tp, at.tp_rank);
            out.push(Need {
                class,
                src_shard: source,
                first: slot_of(source),
                replica: 1,
                preferred: 0,
            });
            continue;
        };
        let (src_shards, dst_shards) = (prefill_tp / prefill_replica, decode_tp / decode_replica);
        let dst_shard = at.tp_rank / decode_replica;
        let first = dst_shard * src_shards / dst_shards;
        let last = ((dst_shard + 1) * src_shards - 1) / dst_shards;
        for src_shard in first..=last {
            // Round-robin position of this decode rank among the shard's readers.
            let first_reader = src_shard * dst_shards / src_shards;
            let position =
                (dst_shard - first_reader) * decode_replica + at.tp_rank % decode_replica;
            out.push(Need {
                class,
                src_shard,
                first: slot_of(src_shard * prefill_replica),
                replica: prefill_replica,
                preferred: position % prefill_replica,
            });
        }
    }
    out
}

impl Spread {
    /// Chooses holders for every decode rank of one DP group; `classes` are the planner's,
    /// indexed as the planner indexes them.
    pub fn choose(classes: &[Class], prefill: RankSpace, decode: RankSpace) -> Self {
        let slots: Vec<Slot> = decode.slots().collect();
        let mut needs: Vec<Vec<Need>> = slots
            .iter()
            .map(|&at| needs(classes, (prefill, decode), at))
            .collect();
        // No choice first: every decode rank's single-holder sources.
        let mut reads: Vec<BTreeSet<u64>> = needs
            .iter()
            .map(|list| {
                list.iter()
                    .filter(|n| n.replica == 1)
                    .map(|n| n.first)
                    .collect()
            })
            .collect();
        let mut load = vec![0u64; usize::try_from(prefill.group_size()).unwrap_or(0)];
        let index = |slot: u64| usize::try_from(slot).unwrap_or(usize::MAX);
        for &source in reads.iter().flatten() {
            if let Some(count) = load.get_mut(index(source)) {
                *count += 1;
            }
        }
        let mut holders = HashMap::new();
        for ((&decode_slot, list), reading) in slots.iter().zip(&mut needs).zip(&mut reads) {
            list.sort_by_key(|n| n.replica);
            for need in list.iter() {
                let group = need.first..need.first + need.replica;
                let chosen = if let Some(&known) = reading.range(group.clone()).next() {
                    known
                } else {
                    let best = (0..need.replica)
                        .map(|step| group.start + (need.preferred + step) % need.replica)
                        .min_by_key(|&slot| load.get(index(slot)).copied().unwrap_or(0))
                        .unwrap_or(group.start);
                    if let Some(count) = load.get_mut(index(best)) {
                        *count += 1;
                    }
                    reading.insert(best);
                    best
                };
                if need.replica > 1 {
                    let tp_rank = prefill.slot_at(chosen).tp_rank;
                    holders.insert((decode_slot, need.class, need.src_shard), tp_rank);
                }
            }
        }
        Self { holders }
    }

    /// The prefill TP rank the decode rank at `decode_slot` reads shard `src_shard` of class
    /// `class` from (the group's first rank when no choice was recorded).
    pub fn holder(&self, decode_slot: Slot, class: usize, src_shard: u64, replica: u64) -> u64 {
        self.holders
            .get(&(decode_slot, class, src_shard))
            .copied()
            .unwrap_or_else(|| first_holder(src_shard, replica))
    }
}
