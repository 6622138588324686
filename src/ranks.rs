//! How one side numbers its ranks. The one home of `group * tp + tp_rank`: planner, verifier
//! and routing table go through `RankSpace` instead of writing the arithmetic out.
//!
//! Ranks are numbered TP fastest, then pipeline stage, then DP group:
//! `rank = dp_group * (pp * tp) + stage * tp + tp_rank` (vLLM's and TRT-LLM's order).

use std::ops::Range;

use crate::layout::ParallelLayout;

/// One rank's place on its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RankCoord {
    pub dp_group: u64,
    pub stage: u64,
    pub tp_rank: u64,
}

/// The ranks of one side: `dp_size` DP groups of `pp_size` stages of `tp_size` TP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::struct_field_names)] // the sizes of the three axes, named as the layouts name them
pub struct RankSpace {
    dp_size: u64,
    pp_size: u64,
    tp_size: u64,
}

impl RankSpace {
    /// The rank space of a validated layout (world = dp x pp x tp, at most `MAX_WORLD_SIZE`).
    pub const fn of(layout: &ParallelLayout) -> Self {
        Self {
            dp_size: layout.dp_size,
            pp_size: layout.pp_size,
            tp_size: layout.world_size / layout.dp_size / layout.pp_size,
        }
    }

    pub const fn pp_size(self) -> u64 {
        self.pp_size
    }

    /// Ranks in one DP group (all its stages).
    pub const fn group_size(self) -> u64 {
        self.pp_size * self.tp_size
    }

    /// A rank's place within its DP group: `stage * tp + tp_rank`.
    pub const fn slot(self, coord: RankCoord) -> u64 {
        coord.stage * self.tp_size + coord.tp_rank
    }

    pub const fn dp_size(self) -> u64 {
        self.dp_size
    }

    pub const fn tp_size(self) -> u64 {
        self.tp_size
    }

    pub const fn world_size(self) -> u64 {
        self.dp_size * self.group_size()
    }

    /// The global rank of a coordinate (products stay below 2^40: every size is bounded).
    pub const fn rank(self, coord: RankCoord) -> u64 {
        coord.dp_group * self.group_size() + self.slot(coord)
    }

    /// The global rank of TP rank `tp_rank` of stage `stage` of DP group `dp_group`.
    pub const fn rank_at(self, dp_group: u64, stage: u64, tp_rank: u64) -> u64 {
        self.rank(RankCoord {
            dp_group,
            stage,
            tp_rank,
        })
    }

    /// Where global rank `rank` sits.
    pub const fn coord(self, rank: u64) -> RankCoord {
        let slot = rank % self.group_size();
        RankCoord {
            dp_group: rank / self.group_size(),
            stage: slot / self.tp_size,
            tp_rank: slot % self.tp_size,
        }
    }

    pub const fn contains(self, rank: u64) -> bool {
        rank < self.world_size()
    }

    /// The global ranks of one DP group, ascending.
    pub const fn group_ranks(self, dp_group: u64) -> Range<u64> {
        dp_group * self.group_size()..(dp_group + 1) * self.group_size()
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
        assert_eq!(space.rank_at(2, 0, 1), 9);
        assert!(space.contains(11) && !space.contains(12));
        // DP 2 x PP 3 x TP 2: TP fastest, then the stage, then the DP group.
        let layout = ParallelLayout::with_stages(Role::Prefill, 12, 2, 3, None).unwrap();
        let space = RankSpace::of(&layout);
        let last = RankCoord {
            dp_group: 1,
            stage: 2,
            tp_rank: 1,
        };
        assert_eq!(space.coord(11), last);
        assert_eq!(space.rank_at(1, 0, 1), 7);
        assert_eq!((space.slot(last), space.group_size()), (5, 6));
    }
}
