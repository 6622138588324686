//! How one side numbers its ranks. The one home of `group * tp + tp_rank`: planner, verifier
//! and routing table go through `RankSpace` instead of writing the arithmetic out.
//!
//! Ranks are numbered TP fastest, then DP group (`rank = dp_group * tp + tp_rank`); a pipeline
//! stage will sit between the two (`dp_group * (pp * tp) + stage * tp + tp_rank`), which is why
//! a coordinate carries a stage already (always 0 today).

use std::ops::Range;

use crate::layout::ParallelLayout;

/// One rank's place on its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RankCoord {
    pub dp_group: u64,
    pub stage: u64,
    pub tp_rank: u64,
}

/// The ranks of one side: `dp_size` DP groups of `tp_size` TP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RankSpace {
    dp_size: u64,
    tp_size: u64,
}

impl RankSpace {
    /// The rank space of a validated layout (world = dp x tp, both at most `MAX_WORLD_SIZE`).
    pub const fn of(layout: &ParallelLayout) -> Self {
        Self {
            dp_size: layout.dp_size,
            tp_size: layout.world_size / layout.dp_size,
        }
    }

    pub const fn dp_size(self) -> u64 {
        self.dp_size
    }

    pub const fn tp_size(self) -> u64 {
        self.tp_size
    }

    pub const fn world_size(self) -> u64 {
        self.dp_size * self.tp_size
    }

    /// The global rank of a coordinate (products stay below 2^40: both sizes are bounded).
    pub const fn rank(self, coord: RankCoord) -> u64 {
        coord.dp_group * self.tp_size + coord.tp_rank
    }

    /// The global rank of TP rank `tp_rank` of DP group `dp_group`.
    pub const fn rank_in_group(self, dp_group: u64, tp_rank: u64) -> u64 {
        self.rank(RankCoord {
            dp_group,
            stage: 0,
            tp_rank,
        })
    }

    /// Where global rank `rank` sits.
    pub const fn coord(self, rank: u64) -> RankCoord {
        RankCoord {
            dp_group: rank / self.tp_size,
            stage: 0,
            tp_rank: rank % self.tp_size,
        }
    }

    pub const fn contains(self, rank: u64) -> bool {
        rank < self.world_size()
    }

    /// The global ranks of one DP group, ascending.
    pub const fn group_ranks(self, dp_group: u64) -> Range<u64> {
        dp_group * self.tp_size..(dp_group + 1) * self.tp_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Role;

    #[test]
    fn ranks_and_coordinates_round_trip() {
        let space = RankSpace::of(&ParallelLayout::new(Role::Decode, 12, 3).unwrap());
        assert_eq!(
            (space.dp_size(), space.tp_size(), space.world_size()),
            (3, 4, 12)
        );
        for rank in 0..12 {
            let coord = space.coord(rank);
            assert_eq!(space.rank(coord), rank);
            assert!(space.group_ranks(coord.dp_group).contains(&rank));
        }
        assert_eq!(space.rank_in_group(2, 1), 9);
        assert!(space.contains(11) && !space.contains(12));
    }
}
