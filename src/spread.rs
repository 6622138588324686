//! Which prefill rank serves each need that several prefill ranks could serve: a shard held by
//! a GQA replica group when every decode rank receives directly (`DecodeReplicas::All`), or
//! tokens held by every rank of a replicated-CP prefill side.
//!
//! A prefill rank's fanout is the number of distinct decode ranks it serves. The choice is made
//! once per planner, over the decode ranks of one DP group (every group repeats it). Needs that
//! are no choice are taken first; then the group's other needs, fewest choices first (decode
//! slot order among equals), each take a holder its decode rank already reads from if there is
//! one (no new wait), else the least-loaded holder, ties going round-robin over the need's
//! readers. That spreads
//! readers evenly (prefill TP 16 -> decode TP 32 over 8 KV heads: two decode ranks per prefill
//! rank) and lines up the choices of buffers that are sharded differently.

use std::collections::{BTreeSet, HashMap};

use crate::ranks::{RankSpace, Slot};
use crate::routing::Units;

/// One need of one decode rank: (decode slot, class, units, prefill token share).
pub type NeedKey = (Slot, usize, Units, u64);

/// One need and the prefill slots that could serve it (the default first).
#[derive(Debug, Clone)]
pub struct Need {
    pub key: NeedKey,
    pub choices: Vec<Slot>,
    /// The decode rank's place among the need's readers: where its round-robin starts.
    pub reader: u64,
}

/// The holder chosen for each need that had a choice.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    holders: HashMap<NeedKey, Slot>,
}

impl Spread {
    /// Chooses holders for the needs of every decode rank of one DP group, decode slot order.
    pub fn choose(prefill: RankSpace, needs: &[Vec<Need>]) -> Self {
        let index = |slot: Slot| usize::try_from(prefill.slot_index(slot)).unwrap_or(usize::MAX);
        // No choice first: every decode rank's single-holder sources.
        let mut reads: Vec<BTreeSet<usize>> = needs
            .iter()
            .map(|list| {
                list.iter()
                    .filter(|n| n.choices.len() == 1)
                    .filter_map(|n| n.choices.first().map(|&slot| index(slot)))
                    .collect()
            })
            .collect();
        let mut load = vec![0u64; usize::try_from(prefill.group_size()).unwrap_or(0)];
        for &source in reads.iter().flatten() {
            if let Some(count) = load.get_mut(source) {
                *count += 1;
            }
        }
        let mut holders = HashMap::new();
        // Fewest choices first across the whole group, so that a need with two holders is
        // not crowded out by a decode rank that could have read anywhere; decode slot order
        // within a choice count.
        let mut order: Vec<(usize, &Need)> = needs
            .iter()
            .enumerate()
            .flat_map(|(decode, list)| list.iter().map(move |need| (decode, need)))
            .filter(|(_, need)| need.choices.len() > 1)
            .collect();
        order.sort_by_key(|(decode, need)| (need.choices.len(), *decode));
        for (decode, need) in order {
            let Some(reading) = reads.get_mut(decode) else {
                continue;
            };
            let known = need
                .choices
                .iter()
                .find(|&&slot| reading.contains(&index(slot)));
            let chosen = if let Some(&known) = known {
                known
            } else {
                let count = need.choices.len();
                let start = usize::try_from(need.reader).unwrap_or(0) % count;
                let best = (0..count)
                    .filter_map(|step| need.choices.get((start + step) % count))
                    .min_by_key(|&&slot| load.get(index(slot)).copied().unwrap_or(0))
                    .copied()
                    .unwrap_or(need.choices[0]);
                if let Some(count) = load.get_mut(index(best)) {
                    *count += 1;
                }
                reading.insert(index(best));
                best
            };
            holders.insert(need.key, chosen);
        }
        Self { holders }
    }

    /// The prefill slot chosen for `key`, if it had a choice.
    pub fn holder(&self, key: &NeedKey) -> Option<Slot> {
        self.holders.get(key).copied()
    }
}
