//! Which logical units each TP rank holds, and where they sit in the bytes of one page.
//!
//! Routing (which ranks overlap) works in logical units and knows nothing of bytes; the page
//! geometry then turns one unit overlap into byte spans of a page. Today pages are head-major
//! (a rank's units are contiguous in its item), one span per overlap; a token-major page
//! (rows of tokens, each row holding the rank's units) becomes a second `PageGeometry` variant
//! that yields one span per row, without touching routing or the planner.

use crate::interval::Interval;
use crate::layout::{BufferLayout, LogicalAxis};

/// How a buffer is spread over the TP ranks of both sides; buffers that share one (K and V of
/// every layer, typically) are routed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Each side's TP ranks hold the whole buffer.
    Replicated,
    /// Units split evenly over `tp / replica` shards; only the first rank of each replica
    /// group is a source or a destination.
    Split {
        logical_size: u64,
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
                prefill_replica: prefill.tp_replica_group_size,
                decode_replica: decode.tp_replica_group_size,
            },
        }
    }
}

/// The units held by `tp_rank`, or `None` when it is not the first rank of its replica group.
/// Requires `replica | tp_size` and `(tp_size / replica) | logical_size` (checked by the planner).
pub fn shard_of(logical_size: u64, tp_size: u64, replica: u64, tp_rank: u64) -> Option<Interval> {
    if tp_rank % replica != 0 {
        return None;
    }
    let shard_len = logical_size / (tp_size / replica);
    let start = (tp_rank / replica) * shard_len;
    Some(Interval::new(start, start + shard_len))
}

/// The prefill TP rank a decode TP rank copies a replicated buffer from.
pub const fn replicated_source(prefill_tp: u64, decode_tp: u64, decode_tp_rank: u64) -> u64 {
    // Both sides are at most MAX_WORLD_SIZE (2^20), so the product fits easily.
    (decode_tp_rank * prefill_tp) / decode_tp
}

/// One prefill TP rank's share of a decode TP rank's units, in logical units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitOverlap {
    pub prefill_tp_rank: u64,
    /// First unit of the source rank's shard (its byte 0 in each page).
    pub src_shard_start: u64,
    /// First unit of the destination rank's shard.
    pub dst_shard_start: u64,
    pub units: Interval,
}

/// What one decode TP rank needs of one sharding, prefill TP ranks ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not a destination for this sharding (a non-first rank of a decode replica group).
    Nothing,
    /// Copy the whole item from this prefill TP rank.
    WholeItem {
        prefill_tp_rank: u64,
    },
    Units(Vec<UnitOverlap>),
}

/// Routes `decode_tp_rank` for `sharding` by arithmetic: only the overlapping shards are visited.
pub fn route(sharding: Sharding, prefill_tp: u64, decode_tp: u64, decode_tp_rank: u64) -> Route {
    match sharding {
        Sharding::Replicated => Route::WholeItem {
            prefill_tp_rank: replicated_source(prefill_tp, decode_tp, decode_tp_rank),
        },
        Sharding::Split {
            logical_size,
            prefill_replica,
            decode_replica,
        } => {
            let Some(dst) = shard_of(logical_size, decode_tp, decode_replica, decode_tp_rank)
            else {
                return Route::Nothing;
            };
            let src_len = logical_size / (prefill_tp / prefill_replica);
            let first = dst.start / src_len;
            let last = (dst.end - 1) / src_len;
            let overlaps = (first..=last)
                .filter_map(|shard| {
                    let src = Interval::new(shard * src_len, (shard + 1) * src_len);
                    src.intersect(dst).map(|units| UnitOverlap {
                        prefill_tp_rank: shard * prefill_replica,
                        src_shard_start: src.start,
                        dst_shard_start: dst.start,
                        units,
                    })
                })
                .collect();
            Route::Units(overlaps)
        }
    }
}

/// A byte range of one page, on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSpan {
    pub src_offset: u64,
    pub dst_offset: u64,
    pub len: u64,
}

/// How a rank's units are laid out inside one page of its item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageGeometry {
    /// The rank's units one after another, each `bytes_per_logical_unit` long.
    #[default]
    HeadMajor,
}

impl PageGeometry {
    /// The byte spans that carry `overlap` from a prefill page to a decode page.
    pub fn unit_spans(
        self,
        overlap: &UnitOverlap,
        prefill: &BufferLayout,
        decode: &BufferLayout,
    ) -> impl Iterator<Item = ByteSpan> {
        match self {
            // Offsets stay below logical_size * bytes_per_logical_unit < 2^63 (validated).
            Self::HeadMajor => std::iter::once(ByteSpan {
                src_offset: (overlap.units.start - overlap.src_shard_start)
                    * prefill.bytes_per_logical_unit,
                dst_offset: (overlap.units.start - overlap.dst_shard_start)
                    * decode.bytes_per_logical_unit,
                len: overlap.units.len() * prefill.bytes_per_logical_unit,
            }),
        }
    }

    /// The span that copies a whole replicated item (the decode side's item length).
    pub fn whole_item_span(self, decode: &BufferLayout) -> ByteSpan {
        match self {
            Self::HeadMajor => ByteSpan {
                src_offset: 0,
                dst_offset: 0,
                len: decode.item_stride_bytes,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_skip_non_first_replicas() {
        assert_eq!(shard_of(8, 4, 1, 3), Some(Interval::new(6, 8)));
        assert_eq!(shard_of(2, 4, 2, 1), None);
        assert_eq!(shard_of(2, 4, 2, 2), Some(Interval::new(1, 2)));
    }

    #[test]
    fn route_finds_every_overlapping_shard() {
        let split = Sharding::Split {
            logical_size: 8,
            prefill_replica: 1,
            decode_replica: 1,
        };
        // Decode TP 2 rank 1 holds units 4..8; prefill TP 8 holds one unit each.
        let Route::Units(overlaps) = route(split, 8, 2, 1) else {
            panic!("expected units");
        };
        let ranks: Vec<u64> = overlaps.iter().map(|o| o.prefill_tp_rank).collect();
        assert_eq!(ranks, vec![4, 5, 6, 7]);
        assert_eq!(overlaps[1].units, Interval::new(5, 6));
        assert_eq!(overlaps[1].dst_shard_start, 4);
    }

    #[test]
    fn route_maps_gqa_replica_groups_to_their_first_rank() {
        let split = Sharding::Split {
            logical_size: 2,
            prefill_replica: 2,
            decode_replica: 1,
        };
        let Route::Units(overlaps) = route(split, 4, 1, 0) else {
            panic!("expected units");
        };
        let ranks: Vec<u64> = overlaps.iter().map(|o| o.prefill_tp_rank).collect();
        assert_eq!(ranks, vec![0, 2]);
        assert_eq!(
            route(Sharding::Replicated, 4, 2, 1),
            Route::WholeItem { prefill_tp_rank: 2 }
        );
    }
}
