//! Routing in logical units: which units each TP rank holds and which prefill TP rank serves
//! each decode TP rank. It knows nothing of bytes (`page` turns a unit overlap into the bytes of
//! a page) nor of global ranks (`ranks` numbers them).
//!
//! A split axis is cut into `tp / replica` equal shards per part (a rank holds its shard of
//! every part, part after part), and every rank of a replica group holds its group's shard.

use crate::interval::Interval;
use crate::layout::{BufferLayout, LogicalAxis, LogicalParts, PartCut};

/// Which decode ranks of a replica group receive a sharded buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecodeReplicas {
    /// Only the first rank of each decode replica group (the reference's semantics; the runtime
    /// copies inside the group).
    #[default]
    First,
    /// Every decode rank receives its whole shard, spread over the prefill ranks that hold it.
    All,
}

impl DecodeReplicas {
    pub fn parse(text: &str) -> crate::error::PlanResult<Self> {
        match text {
            "first" => Ok(Self::First),
            "all" => Ok(Self::All),
            other => crate::error::bail!(
                "decode_replicas must be 'first' or 'all', got {}",
                crate::error::quoted(other)
            ),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::All => "all",
        }
    }
}

/// How a buffer is spread over the TP ranks of both sides; buffers that share one (K and V of
/// every layer, typically) are routed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Each side's TP ranks hold the whole buffer.
    Replicated,
    /// Units split evenly over `tp / replica` shards, part by part.
    Split {
        logical_size: u64,
        parts: LogicalParts,
        prefill_replica: u64,
        decode_replica: u64,
    },
}

impl Sharding {
    pub fn of(prefill: &BufferLayout, decode: &BufferLayout) -> Self {
        match prefill.logical_axis {
            LogicalAxis::Replicated => Self::Replicated,
            LogicalAxis::KvHead | LogicalAxis::StateChannel => Self::Split {
                logical_size: prefill.logical_size,
                parts: prefill.logical_parts,
                prefill_replica: prefill.tp_replica_group_size,
                decode_replica: decode.tp_replica_group_size,
            },
        }
    }
}

/// Buffers that route alike: one sharding, held by one prefill stage and one decode stage.
/// The planner routes each decode rank once per class, not once per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Class {
    pub sharding: Sharding,
    pub prefill_stage: u64,
    pub decode_stage: u64,
}

/// The prefill TP rank a decode TP rank copies a replicated buffer from.
pub const fn replicated_source(prefill_tp: u64, decode_tp: u64, decode_tp_rank: u64) -> u64 {
    // Both sides are at most MAX_WORLD_SIZE (2^20), so the product fits easily.
    (decode_tp_rank * prefill_tp) / decode_tp
}

/// Which units of a class a need is for: a shard of a split axis, a slice several shards hold
/// (copies), or a replicated buffer whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Units {
    Shard(u64),
    /// A slice of a part that prefill shards `first..first + count` all hold (a part of fewer
    /// groups than shards, copied), read by default from shard `chosen` among them.
    Copy {
        first: u64,
        count: u64,
        chosen: u64,
    },
    Whole,
}

/// A run of units a source shard and a destination both hold, placed in each rank's own unit
/// order (a rank's item holds its shard of part 0, then of part 1, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitOverlap {
    /// The prefill shard holding the run (`holders` says which ranks hold it).
    pub src_shard: u64,
    /// The decode rank's place among the decode ranks reading this shard (round-robin key).
    pub reader: u64,
    /// The run's first unit in the buffer's logical units (of the whole axis, parts in turn).
    pub unit: u64,
    /// Index of the run's first unit among the units the source rank holds.
    pub src_local: u64,
    /// Index of the run's first unit among the units the destination rank holds.
    pub dst_local: u64,
    pub len: u64,
    /// For a slice of a part several prefill shards hold (copies): those shards, `(first,
    /// count)`, any of which could serve it. `None`: only `src_shard` holds these units.
    pub copies: Option<(u64, u64)>,
}

impl UnitOverlap {
    /// The need this run is: the units of one prefill shard, or a copied slice.
    pub const fn units(&self) -> Units {
        match self.copies {
            None => Units::Shard(self.src_shard),
            Some((first, count)) => Units::Copy {
                first,
                count,
                chosen: self.src_shard,
            },
        }
    }
}

/// A shard index as a position (shards are at most `MAX_WORLD_SIZE`, 2^20).
fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What one decode TP rank needs of one sharding, prefill shards ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not a destination for this sharding (a non-first rank of a decode replica group).
    Nothing,
    /// Copy the whole (replicated) item.
    WholeItem,
    Units(Vec<UnitOverlap>),
}

/// Routes `decode_tp_rank` for `sharding` by arithmetic: only the overlapping shards are
/// visited. Under `DecodeReplicas::First` only the first `first_receivers` ranks of a decode
/// replica group receive. Requires the alignment the planner validates (`replica | tp`, every
/// part divisible by both sides' shard counts).
pub fn route(
    sharding: Sharding,
    (prefill_tp, decode_tp): (u64, u64),
    decode_tp_rank: u64,
    replicas: DecodeReplicas,
    first_receivers: u64,
) -> Route {
    let Sharding::Split {
        logical_size,
        parts,
        prefill_replica,
        decode_replica,
    } = sharding
    else {
        return Route::WholeItem;
    };
    let (src_shards, dst_shards) = (prefill_tp / prefill_replica, decode_tp / decode_replica);
    let (dst_shard, replica_index) = (
        decode_tp_rank / decode_replica,
        decode_tp_rank % decode_replica,
    );
    if replicas == DecodeReplicas::First && replica_index >= first_receivers {
        return Route::Nothing;
    }
    // Shard s of S covers the fraction [s/S, (s+1)/S) of every part, so which shards overlap
    // is the same for every part; a part copied onto several of them (fewer groups than
    // shards) is read from the first that holds the slice needed.
    let first = dst_shard * src_shards / dst_shards;
    let last = ((dst_shard + 1) * src_shards - 1) / dst_shards;
    let src_cuts: Vec<PartCut> = parts.cuts(logical_size, src_shards).collect();
    let dst_cuts = parts.cuts(logical_size, dst_shards);
    let mut by_shard: Vec<Vec<UnitOverlap>> = vec![Vec::new(); usize_of(last - first + 1)];
    let (mut src_base, mut dst_base) = (0, 0);
    for (src_cut, dst_cut) in src_cuts.iter().zip(dst_cuts) {
        let (dst_first, dst_len) = dst_cut.held(dst_shard, dst_shards);
        let dst = Interval::new(dst_first, dst_first + dst_len);
        for src_shard in first..=last {
            let slice = src_cut.slice_of(src_shard, src_shards);
            if src_shard > first && src_cut.slice_of(src_shard - 1, src_shards) == slice {
                continue; // a copy of the slice a shard before it serves
            }
            let (src_first, src_len) = src_cut.held(src_shard, src_shards);
            let src = Interval::new(src_first, src_first + src_len);
            if let Some(common) = src.intersect(dst) {
                // Round-robin position of this decode rank among the shard's readers.
                let first_reader = src_shard * dst_shards / src_shards;
                // Shards holding one slice are consecutive: slices divide the shards.
                let per_slice = src_shards / src_cut.slices;
                let copies = src_cut
                    .copied(src_shards)
                    .then_some((slice * per_slice, per_slice));
                by_shard[usize_of(src_shard - first)].push(UnitOverlap {
                    src_shard,
                    reader: dst_shard.saturating_sub(first_reader) * decode_replica + replica_index,
                    unit: common.start,
                    src_local: src_base + (common.start - src.start),
                    dst_local: dst_base + (common.start - dst.start),
                    len: common.len(),
                    copies,
                });
            }
        }
        src_base += src_cut.slice_len();
        dst_base += dst_len;
    }
    let overlaps: Vec<UnitOverlap> = by_shard.into_iter().flatten().collect();
    Route::Units(overlaps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(logical_size: u64, prefill_replica: u64, decode_replica: u64) -> Sharding {
        Sharding::Split {
            logical_size,
            parts: LogicalParts::WHOLE,
            prefill_replica,
            decode_replica,
        }
    }

    fn units(route: &Route) -> Vec<(u64, u64, u64, u64)> {
        let Route::Units(overlaps) = route else {
            panic!("expected units, got {route:?}");
        };
        overlaps
            .iter()
            .map(|o| (o.src_shard, o.src_local, o.dst_local, o.len))
            .collect()
    }

    #[test]
    fn route_finds_every_overlapping_shard() {
        let route = |s, p, d, rank| route(s, (p, d), rank, DecodeReplicas::First, 1);
        // Decode TP 2 rank 1 holds units 4..8; prefill TP 8 holds one unit each.
        let r = route(split(8, 1, 1), 8, 2, 1);
        assert_eq!(
            units(&r),
            vec![(4, 0, 0, 1), (5, 0, 1, 1), (6, 0, 2, 1), (7, 0, 3, 1)]
        );
        // Prefill TP 2 -> decode TP 8: rank 5 takes unit 5, the second of prefill rank 1's.
        let r = route(split(8, 1, 1), 2, 8, 5);
        assert_eq!(units(&r), vec![(1, 1, 0, 1)]);
    }

    #[test]
    fn gqa_replica_groups_first_or_all() {
        let first = |s, p, d, rank| route(s, (p, d), rank, DecodeReplicas::First, 1);
        // Prefill TP 4 over 2 heads: shards 0 and 1 (replica groups {0, 1}, {2, 3}).
        let r = first(split(2, 2, 1), 4, 1, 0);
        assert_eq!(units(&r), vec![(0, 0, 0, 1), (1, 0, 1, 1)]);
        // Decode TP 4 over 2 heads: rank 1 copies from rank 0 inside its group under "first".
        assert_eq!(first(split(2, 1, 2), 2, 4, 1), Route::Nothing);
        // ... unless the group's first two ranks receive (two DCP shares of its tokens).
        let r = route(split(2, 1, 2), (2, 4), 1, DecodeReplicas::First, 2);
        assert_eq!(units(&r), vec![(0, 0, 0, 1)]);
        // Under "all" it is routed; it is the second reader of shard 0.
        let Route::Units(overlaps) = route(split(2, 1, 2), (2, 4), 1, DecodeReplicas::All, 1)
        else {
            panic!("routed");
        };
        assert_eq!((overlaps[0].src_shard, overlaps[0].reader), (0, 1));
        assert_eq!(first(Sharding::Replicated, 4, 2, 1), Route::WholeItem);
    }

    #[test]
    fn parts_are_sharded_one_by_one() {
        // x | B | C = 8 | 4 | 4 channels; prefill TP 1 holds all 16, decode TP 2 rank 1 holds
        // x[4..8], B[2..4], C[2..4] at local units 0..4, 4..6, 6..8.
        let sharding = Sharding::Split {
            logical_size: 16,
            parts: LogicalParts::new(&[8, 4, 4]).unwrap(),
            prefill_replica: 1,
            decode_replica: 1,
        };
        let r = route(sharding, (1, 2), 1, DecodeReplicas::First, 1);
        assert_eq!(units(&r), vec![(0, 4, 0, 4), (0, 10, 4, 2), (0, 14, 6, 2)]);
    }

    fn one_group() -> Sharding {
        // x | B | C = 8 | 4 | 4 channels, B and C one group each (Mamba2 with n_groups 1).
        Sharding::Split {
            logical_size: 16,
            parts: LogicalParts::new(&[8, 4, 4])
                .and_then(|p| p.with_groups(&[8, 1, 1]))
                .unwrap(),
            prefill_replica: 1,
            decode_replica: 1,
        }
    }

    #[test]
    fn a_copied_part_is_written_on_every_decode_rank_from_one_prefill_copy() {
        let first = |p, d, rank| route(one_group(), (p, d), rank, DecodeReplicas::First, 1);
        // TP 1 -> 2: decode rank 1 holds x[4..8], then B and C whole (local 4..8, 8..12).
        assert_eq!(
            units(&first(1, 2, 1)),
            vec![(0, 4, 0, 4), (0, 8, 4, 4), (0, 12, 8, 4)]
        );
        // TP 2 -> 1: x from both prefill ranks, B and C once, from the first (its copy at
        // local 4..12 after its half of x), none from the second.
        assert_eq!(
            units(&first(2, 1, 0)),
            vec![(0, 0, 0, 4), (0, 4, 8, 4), (0, 8, 12, 4), (1, 0, 4, 4)]
        );
        // TP 4 -> 2: decode rank 1 reads prefill ranks 2 and 3 only, its copy from rank 2.
        let r = first(4, 2, 1);
        assert_eq!(
            units(&r),
            vec![(2, 0, 0, 2), (2, 2, 4, 4), (2, 6, 8, 4), (3, 0, 2, 2)]
        );
        let Route::Units(overlaps) = r else {
            panic!("routed");
        };
        // The copies are any of the four prefill shards; x is shard 2's alone.
        assert_eq!(
            overlaps[1].units(),
            Units::Copy {
                first: 0,
                count: 4,
                chosen: 2
            }
        );
        assert_eq!(overlaps[0].units(), Units::Shard(2));
    }
}
