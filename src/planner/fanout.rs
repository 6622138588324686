//! Fanout: how many decode ranks of one DP group read each prefill rank, counted at
//! construction, per rehoming and per request length.

use super::Planner;
use crate::failover::Rehoming;
use crate::ranks::RankSpace;
use crate::routing::Route;
use crate::routing::Units;

impl Planner {
    /// Decode ranks that receive nothing at all under this planner's mode (non-first ranks of
    /// every decode replica group under `DecodeReplicas::First`, when no buffer is replicated):
    /// the runtime must copy inside the group for them.
    pub fn idle_decode_ranks(&self) -> u64 {
        let idle_per_group = self
            .decode_ranks()
            .slots()
            .filter(|&slot| self.fragment_count(slot, None, self.identity) == 0)
            .count() as u64;
        idle_per_group * self.decode.dp_size()
    }

    /// Decode ranks one request makes `prefill_rank` wait for: those of the reading decode DP
    /// group that read from it. The same whichever decode group a request comes from.
    pub fn request_fanout(&self, prefill_rank: u64) -> u64 {
        let group = self.prefill_ranks().coord(prefill_rank).dp_group;
        let per_slot = self
            .rehoming(group)
            .map_or(self.fanout_per_slot.as_slice(), |r| &r.fanout_per_slot);
        fanout_in(per_slot, self.prefill_ranks(), prefill_rank)
    }

    /// A prefill rank's fanout under the default group mapping: its request fanout when some
    /// decode group reads from its DP group by default, else 0 (the reference's values wherever
    /// the reference plans).
    pub fn fanout(&self, prefill_rank: u64) -> u64 {
        let group = self.prefill_ranks().coord(prefill_rank).dp_group;
        let is_default_source = group < self.decode.dp_size();
        if is_default_source {
            self.request_fanout(prefill_rank)
        } else {
            0
        }
    }

    /// Fanout of every prefill rank, rank order.
    pub fn source_fanout(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.prefill.world_size()).map(|rank| (rank, self.fanout(rank)))
    }

    /// Decode ranks of one DP group reading each prefill slot of a DP group (`rehoming`: one
    /// with gone ranks), for a request of `num_tokens` tokens (None: any request).
    pub(super) fn count_fanout(
        &self,
        num_tokens: Option<u64>,
        rehoming: Option<&Rehoming>,
    ) -> Vec<u64> {
        let prefill_ranks = self.prefill_ranks();
        let slots = usize::try_from(prefill_ranks.group_size()).unwrap_or(0);
        let mut counts = vec![0u64; slots];
        // `seen[p] == d + 1` marks prefill slot p as already counted for decode slot d.
        let mut seen = vec![0u64; slots];
        for (decode_slot, at) in (1u64..).zip(self.decode_ranks().slots()) {
            let shares = self.shares(at, num_tokens);
            for (id, routed) in self.routes(at) {
                let mut count = |units: Units| {
                    for &share in &shares {
                        let Some(source) = self.source(at, id, units, share, rehoming) else {
                            continue;
                        };
                        let slot = prefill_ranks.slot_index(source);
                        let slot = usize::try_from(slot).unwrap_or(usize::MAX);
                        if let (Some(mark), Some(count)) =
                            (seen.get_mut(slot), counts.get_mut(slot))
                        {
                            if *mark != decode_slot {
                                *mark = decode_slot;
                                *count += 1;
                            }
                        }
                    }
                };
                match routed {
                    Route::Nothing => {}
                    Route::WholeItem => count(Units::Whole),
                    Route::Units(overlaps) => {
                        for overlap in &overlaps {
                            count(overlap.units());
                        }
                    }
                }
            }
        }
        counts
    }

    /// Each prefill slot's request fanout (slot order of prefill DP group `group`) for a
    /// request of `num_tokens` tokens (None: any).
    pub fn request_fanouts(
        &self,
        group: u64,
        num_tokens: Option<u64>,
    ) -> std::borrow::Cow<'_, [u64]> {
        self.fanout_for(num_tokens, self.rehoming(group))
    }

    /// Per-slot fanouts for a request of `num_tokens` tokens read from a DP group `rehoming`
    /// describes: the counts made at construction unless the request's length changes who
    /// holds what.
    pub(super) fn fanout_for<'a>(
        &'a self,
        num_tokens: Option<u64>,
        rehoming: Option<&'a Rehoming>,
    ) -> std::borrow::Cow<'a, [u64]> {
        match (num_tokens, rehoming) {
            (Some(n), _) if self.holders.any_context() => {
                self.count_fanout(Some(n), rehoming).into()
            }
            (_, Some(r)) => r.fanout_per_slot.as_slice().into(),
            _ => self.fanout_per_slot.as_slice().into(),
        }
    }
}

/// The fanout of `prefill_rank` in a per-slot table.
pub(super) fn fanout_in(per_slot: &[u64], ranks: RankSpace, prefill_rank: u64) -> u64 {
    let slot = ranks.slot_index(ranks.coord(prefill_rank).slot());
    usize::try_from(slot)
        .ok()
        .and_then(|slot| per_slot.get(slot))
        .copied()
        .unwrap_or(0)
}
