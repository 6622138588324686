//! Failover: prefill ranks that are gone, who serves in their place, and what is lost.
//!
//! A need (`spread::NeedKey`) whose holder is gone moves to another available prefill rank
//! holding the same units and tokens (`Holders::every_holder`), chosen as `spread` chooses
//! (a rank the decode rank already reads from, else the least loaded). A need no available
//! rank holds is lost. Needs whose holder is up keep it, so a failover moves only what it must.
//!
//! Prefill DP groups are independent: a group with gone ranks gets the rehoming of its set of
//! gone slots, which groups with the same set share; the other groups plan as before.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::error::{bail, PlanResult};
use crate::layout::BufferKind;
use crate::ranks::{index_below, RankSpace, Slot};
use crate::spread::{Need, NeedKey, Spread};

/// The prefill ranks that are unavailable, ascending, each once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GoneRanks {
    ranks: Vec<u64>,
}

impl GoneRanks {
    /// The ranks a caller named (any integers), checked against the prefill side: each in
    /// range and named once.
    pub fn of(prefill: RankSpace, given: &[i128]) -> PlanResult<Self> {
        let world = prefill.world_size();
        let mut ranks = Vec::with_capacity(given.len());
        for &value in given {
            let Some(rank) = index_below(value, world) else {
                bail!(
                    "unavailable prefill rank {value} is out of range: the prefill world has \
                     {world} ranks (0..{world})"
                );
            };
            ranks.push(rank);
        }
        ranks.sort_unstable();
        if let Some(&[rank, _]) = ranks.windows(2).find(|pair| pair[0] == pair[1]) {
            bail!("unavailable prefill rank {rank} is named twice; name each rank once");
        }
        Ok(Self { ranks })
    }

    /// Both sets' ranks (failures add up).
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        let mut ranks: Vec<u64> = self.ranks.iter().chain(&other.ranks).copied().collect();
        ranks.sort_unstable();
        ranks.dedup();
        Self { ranks }
    }

    pub fn ranks(&self) -> &[u64] {
        &self.ranks
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    pub fn contains(&self, rank: u64) -> bool {
        self.ranks.binary_search(&rank).is_ok()
    }

    /// The gone slot indices of each prefill DP group that has any, ascending.
    fn by_group(&self, prefill: RankSpace) -> BTreeMap<u64, Vec<u64>> {
        let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &rank in &self.ranks {
            let coord = prefill.coord(rank);
            groups
                .entry(coord.dp_group)
                .or_default()
                .push(prefill.slot_index(coord.slot()));
        }
        groups
    }
}

/// Who serves one prefill DP group's needs while some of its ranks are gone.
#[derive(Debug, Clone, Default)]
pub struct Rehoming {
    /// By slot index in the group: whether the rank is gone.
    gone: Vec<bool>,
    /// The needs whose holder is gone: the holder chosen in its place, or `None` (lost).
    holders: HashMap<NeedKey, Option<Slot>>,
    /// Decode ranks of one DP group reading each prefill slot (as `Planner::fanout_per_slot`).
    pub fanout_per_slot: Vec<u64>,
}

impl Rehoming {
    /// A rehoming for the slots `gone` (by slot index), holders not yet chosen.
    fn empty(prefill: RankSpace, gone: &[u64]) -> Self {
        let mut marks = vec![false; usize::try_from(prefill.group_size()).unwrap_or(0)];
        for &index in gone {
            if let Some(mark) = usize::try_from(index).ok().and_then(|i| marks.get_mut(i)) {
                *mark = true;
            }
        }
        Self {
            gone: marks,
            ..Self::default()
        }
    }

    /// Whether the prefill rank at slot index `index` of the group is gone.
    pub fn is_gone(&self, index: u64) -> bool {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.gone.get(i))
            .copied()
            .unwrap_or(false)
    }

    /// For a need whose holder is gone: `Some(holder)` in its place or `Some(None)` (lost);
    /// `None` for a need that keeps its holder.
    pub fn holder(&self, key: &NeedKey) -> Option<Option<Slot>> {
        self.holders.get(key).copied()
    }

    /// Chooses holders for the `orphaned` needs of every decode rank of one DP group; each
    /// need's choices are its kept holder alone, or (orphaned) its available holders.
    pub fn choose(&mut self, prefill: RankSpace, needs: &[Vec<Need>], orphaned: &HashSet<NeedKey>) {
        let spread = Spread::choose(prefill, needs);
        self.holders = needs
            .iter()
            .flatten()
            .filter(|need| orphaned.contains(&need.key))
            .map(|need| {
                let chosen = spread
                    .holder(&need.key)
                    .or_else(|| need.choices.first().copied());
                (need.key, chosen)
            })
            .collect();
    }
}

/// The gone prefill ranks and a rehoming for each DP group that has some.
#[derive(Debug, Clone, Default)]
pub struct Failover {
    gone: GoneRanks,
    rehomings: Vec<Rehoming>,
    /// Prefill DP group -> index into `rehomings`.
    by_group: BTreeMap<u64, usize>,
}

impl Failover {
    /// The failover for `gone`: `rehome` makes the rehoming of one set of gone slot indices,
    /// once for each distinct set among the groups.
    pub fn build(
        gone: GoneRanks,
        prefill: RankSpace,
        mut rehome: impl FnMut(Rehoming) -> Rehoming,
    ) -> Self {
        let mut rehomings = Vec::new();
        let mut by_pattern: HashMap<Vec<u64>, usize> = HashMap::new();
        let mut by_group = BTreeMap::new();
        for (group, slots) in gone.by_group(prefill) {
            let index = *by_pattern.entry(slots).or_insert_with_key(|slots| {
                rehomings.push(rehome(Rehoming::empty(prefill, slots)));
                rehomings.len() - 1
            });
            by_group.insert(group, index);
        }
        Self {
            gone,
            rehomings,
            by_group,
        }
    }

    pub const fn gone(&self) -> &GoneRanks {
        &self.gone
    }

    /// The rehoming of prefill DP group `group`, with its index; `None` when none of its
    /// ranks is gone.
    pub fn rehoming(&self, group: u64) -> Option<(usize, &Rehoming)> {
        let index = *self.by_group.get(&group)?;
        self.rehomings.get(index).map(|r| (index, r))
    }
}

/// Units of one buffer that no available prefill rank holds, for one decode rank: half-open,
/// in the buffer's logical units, and under context parallelism the prefill token share they
/// belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LostRange {
    pub buffer_index: u64,
    /// The buffer's kind: an index names one buffer within its kind's space (KV or state).
    pub buffer_kind: BufferKind,
    pub layer: Option<u64>,
    pub unit_start: u64,
    pub unit_end: u64,
    pub share: Option<u64>,
}

/// `ranges` (each tagged with its buffer's position) in buffer order, then share, then unit,
/// neighbours of one buffer and share merged.
pub fn merge_lost(mut ranges: Vec<(usize, LostRange)>) -> Vec<LostRange> {
    ranges.sort_unstable_by_key(|&(position, r)| (position, r.share, r.unit_start));
    let mut out: Vec<(usize, LostRange)> = Vec::with_capacity(ranges.len());
    for (position, range) in ranges {
        match out.last_mut() {
            Some((at, last))
                if *at == position
                    && last.share == range.share
                    && last.unit_end >= range.unit_start =>
            {
                last.unit_end = last.unit_end.max(range.unit_end);
            }
            _ => out.push((position, range)),
        }
    }
    out.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(world: u64, dp: u64) -> RankSpace {
        RankSpace::from_world(world, dp, 1, 1).unwrap()
    }

    #[test]
    fn gone_ranks_are_checked_sorted_and_add_up() {
        let prefill = space(8, 2);
        let gone = GoneRanks::of(prefill, &[5, 1]).unwrap();
        assert_eq!(gone.ranks(), &[1, 5]);
        assert!(gone.contains(5) && !gone.contains(4));
        let err = GoneRanks::of(prefill, &[8]).unwrap_err();
        assert!(err.message().contains("out of range"), "{err}");
        let err = GoneRanks::of(prefill, &[-1]).unwrap_err();
        assert!(err.message().contains("out of range"), "{err}");
        let err = GoneRanks::of(prefill, &[3, 3]).unwrap_err();
        assert!(err.message().contains("named twice"), "{err}");
        let more = GoneRanks::of(prefill, &[5, 6]).unwrap();
        assert_eq!(gone.union(&more).ranks(), &[1, 5, 6]);
        // Rank 1 is slot 1 of group 0; ranks 5 and 6 slots 1 and 2 of group 1.
        let groups = gone.union(&more).by_group(prefill);
        assert_eq!(groups, BTreeMap::from([(0, vec![1]), (1, vec![1, 2])]));
    }

    #[test]
    fn groups_with_the_same_gone_slots_share_one_rehoming() {
        let prefill = space(12, 3);
        let gone = GoneRanks::of(prefill, &[1, 5, 11]).unwrap();
        let mut made = 0;
        let failover = Failover::build(gone, prefill, |r| {
            made += 1;
            r
        });
        // Slot 1 in groups 0 and 1, slot 3 in group 2.
        assert_eq!(made, 2);
        let (first, r) = failover.rehoming(0).unwrap();
        assert!(r.is_gone(1) && !r.is_gone(0));
        assert_eq!(failover.rehoming(1).unwrap().0, first);
        assert_ne!(failover.rehoming(2).unwrap().0, first);
    }

    #[test]
    fn lost_ranges_merge_per_buffer_and_share() {
        let range = |buffer_index, unit_start, unit_end, share| LostRange {
            buffer_index,
            buffer_kind: BufferKind::TargetK,
            layer: None,
            unit_start,
            unit_end,
            share,
        };
        let merged = merge_lost(vec![
            (1, range(1, 2, 4, None)),
            (0, range(0, 2, 4, None)),
            (0, range(0, 0, 2, None)),
            (0, range(0, 6, 8, None)),
            (0, range(0, 4, 6, Some(1))),
        ]);
        assert_eq!(
            merged,
            vec![
                range(0, 0, 4, None),
                range(0, 6, 8, None),
                range(0, 4, 6, Some(1)),
                range(1, 2, 4, None),
            ]
        );
    }
}
