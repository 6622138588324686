//! How one side numbers its ranks: the one home of rank arithmetic. Planner, spread, verifier,
//! routing table and the binding go through `RankSpace`; none of them multiplies a group by a
//! group size itself.
//!
//! A rank is a coordinate on axes, slowest first: DP group, pipeline stage, context-parallel
//! rank, TP rank (`rank = dp_group * (pp * cp * tp) + stage * (cp * tp) + cp_rank * tp +
//! tp_rank`, TRT-LLM's order; vLLM's without CP). Every other computation goes through `rank`
//! and `coord`.

use std::ops::Range;

use crate::error::{bail, PlanResult};
use crate::limits;

/// `value` as an index below `bound`, if it is one (callers pass whatever integer they got).
pub fn index_below(value: i128, bound: u64) -> Option<u64> {
    u64::try_from(value).ok().filter(|&index| index < bound)
}

/// One rank's place on its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RankCoord {
    pub dp_group: u64,
    pub stage: u64,
    pub cp_rank: u64,
    pub tp_rank: u64,
}

/// A rank's place inside its DP group: the coordinates below the DP axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub stage: u64,
    pub cp_rank: u64,
    pub tp_rank: u64,
}

impl Slot {
    /// TP rank `tp_rank` of CP rank 0 of stage `stage`.
    pub const fn at(stage: u64, tp_rank: u64) -> Self {
        Self {
            stage,
            cp_rank: 0,
            tp_rank,
        }
    }
}

impl RankCoord {
    pub const fn slot(self) -> Slot {
        Slot {
            stage: self.stage,
            cp_rank: self.cp_rank,
            tp_rank: self.tp_rank,
        }
    }
}

/// The ranks of one side: `dp_size` DP groups of `pp_size` stages of `cp_size` CP ranks of
/// `tp_size` TP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::struct_field_names)] // the sizes of the axes, named as the layouts name them
pub struct RankSpace {
    dp_size: u64,
    pp_size: u64,
    cp_size: u64,
    tp_size: u64,
}

impl RankSpace {
    /// The rank space of `world_size` ranks in `dp_size` DP groups of `pp_size` stages of
    /// `cp_size` CP ranks each, or the error saying which size to change.
    pub fn from_world(
        world_size: u64,
        dp_size: u64,
        pp_size: u64,
        cp_size: u64,
    ) -> PlanResult<Self> {
        limits::WORLD_SIZE.check("world_size", world_size)?;
        if dp_size == 0 {
            bail!("dp_size must be positive");
        }
        if world_size % dp_size != 0 {
            bail!("world_size={world_size} must be divisible by dp_size={dp_size}");
        }
        limits::STAGES.check("pp_size", pp_size)?;
        if (world_size / dp_size) % pp_size != 0 {
            bail!(
                "world_size={world_size} must be divisible by dp_size x pp_size = {} (each DP \
                 group holds pp_size stages of equal TP size)",
                dp_size * pp_size
            );
        }
        if cp_size == 0 || (world_size / dp_size / pp_size) % cp_size != 0 {
            bail!(
                "world_size={world_size} must be divisible by dp_size x pp_size x cp_size = {} \
                 (each stage holds cp_size CP ranks of equal TP size); cp_size must be positive",
                dp_size * pp_size * cp_size.max(1)
            );
        }
        Ok(Self {
            dp_size,
            pp_size,
            cp_size,
            tp_size: world_size / dp_size / pp_size / cp_size,
        })
    }

    pub const fn dp_size(self) -> u64 {
        self.dp_size
    }

    pub const fn pp_size(self) -> u64 {
        self.pp_size
    }

    pub const fn cp_size(self) -> u64 {
        self.cp_size
    }

    pub const fn tp_size(self) -> u64 {
        self.tp_size
    }

    /// Ranks in one DP group (all its stages).
    pub const fn group_size(self) -> u64 {
        self.pp_size * self.cp_size * self.tp_size
    }

    pub const fn world_size(self) -> u64 {
        self.dp_size * self.group_size()
    }

    /// The global rank of a coordinate (products stay below 2^40: every size is bounded).
    #[inline]
    pub const fn rank(self, coord: RankCoord) -> u64 {
        ((coord.dp_group * self.pp_size + coord.stage) * self.cp_size + coord.cp_rank)
            * self.tp_size
            + coord.tp_rank
    }

    /// The global rank of TP rank `tp_rank` of CP rank 0 of stage `stage` of DP group
    /// `dp_group`.
    pub const fn rank_at(self, dp_group: u64, stage: u64, tp_rank: u64) -> u64 {
        self.rank_in_group(dp_group, Slot::at(stage, tp_rank))
    }

    /// The global rank at `slot` of DP group `dp_group`.
    pub const fn rank_in_group(self, dp_group: u64, slot: Slot) -> u64 {
        self.rank(RankCoord {
            dp_group,
            stage: slot.stage,
            cp_rank: slot.cp_rank,
            tp_rank: slot.tp_rank,
        })
    }

    /// Where global rank `rank` sits (ranks past the world keep counting DP groups).
    #[inline]
    pub const fn coord(self, rank: u64) -> RankCoord {
        let (rest, tp_rank) = (rank / self.tp_size, rank % self.tp_size);
        let (rest, cp_rank) = (rest / self.cp_size, rest % self.cp_size);
        RankCoord {
            dp_group: rest / self.pp_size,
            stage: rest % self.pp_size,
            cp_rank,
            tp_rank,
        }
    }

    pub const fn contains(self, rank: u64) -> bool {
        rank < self.world_size()
    }

    /// A slot's index inside its DP group (`stage * tp + tp_rank`), for per-group tables.
    pub const fn slot_index(self, slot: Slot) -> u64 {
        self.rank_in_group(0, slot)
    }

    /// The slot at index `index` of a DP group (the inverse of `slot_index`).
    pub const fn slot_at(self, index: u64) -> Slot {
        self.coord(index % self.group_size()).slot()
    }

    /// Every slot of a DP group, in index order: stage by stage, then CP rank, TP rank
    /// fastest.
    pub fn slots(self) -> impl Iterator<Item = Slot> {
        (0..self.group_size()).map(move |index| self.slot_at(index))
    }

    /// The first global rank of DP group `dp_group`.
    pub const fn group_start(self, dp_group: u64) -> u64 {
        self.rank_at(dp_group, 0, 0)
    }

    /// The global ranks of one DP group, ascending.
    pub const fn group_ranks(self, dp_group: u64) -> Range<u64> {
        let start = self.group_start(dp_group);
        start..start + self.group_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_coordinates_round_trip() {
        let space = RankSpace::from_world(12, 3, 1, 1).unwrap();
        assert_eq!(
            (space.dp_size(), space.tp_size(), space.world_size()),
            (3, 4, 12)
        );
        for rank in 0..12 {
            let coord = space.coord(rank);
            assert_eq!(space.rank(coord), rank);
            assert!(space.group_ranks(coord.dp_group).contains(&rank));
            assert_eq!(space.rank_in_group(coord.dp_group, coord.slot()), rank);
        }
        assert_eq!(space.rank_at(2, 0, 1), 9);
        assert!(space.contains(11) && !space.contains(12));
        // DP 2 x PP 3 x TP 2: TP fastest, then the stage, then the DP group.
        let space = RankSpace::from_world(12, 2, 3, 1).unwrap();
        let last = RankCoord {
            dp_group: 1,
            stage: 2,
            cp_rank: 0,
            tp_rank: 1,
        };
        assert_eq!(space.coord(11), last);
        assert_eq!(space.rank_at(1, 0, 1), 7);
        assert_eq!((space.slot_index(last.slot()), space.group_size()), (5, 6));
        assert_eq!(space.group_start(1), 6);
        let slots: Vec<(u64, u64)> = space.slots().map(|s| (s.stage, s.tp_rank)).collect();
        assert_eq!(slots, vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
        for index in 0..6 {
            assert_eq!(space.slot_index(space.slot_at(index)), index);
        }
        // DP 2 x PP 2 x CP 2 x TP 3 (TRT-LLM's order): TP fastest, then CP, stage, DP group.
        let space = RankSpace::from_world(24, 2, 2, 2).unwrap();
        let coord = RankCoord {
            dp_group: 1,
            stage: 0,
            cp_rank: 1,
            tp_rank: 2,
        };
        assert_eq!(space.rank(coord), 12 + 3 + 2);
        assert_eq!(space.coord(17), coord);
        for rank in 0..24 {
            assert_eq!(space.rank(space.coord(rank)), rank);
        }
        assert_eq!(
            (space.tp_size(), space.cp_size(), space.group_size()),
            (3, 2, 12)
        );
        assert!(RankSpace::from_world(24, 2, 2, 5).is_err());
    }

    #[test]
    fn sizes_that_do_not_divide_are_refused() {
        assert!(RankSpace::from_world(0, 1, 1, 1).is_err());
        assert!(RankSpace::from_world(8, 0, 1, 1).is_err());
        assert!(RankSpace::from_world(8, 3, 1, 1).is_err());
        assert!(RankSpace::from_world(8, 2, 3, 1).is_err());
        assert!(RankSpace::from_world(8, 1, 0, 1).is_err());
        let err = RankSpace::from_world(1 << 31, 1, 1, 1).unwrap_err();
        assert!(err.message().contains("MAX_WORLD_SIZE"), "{err}");
    }
}
