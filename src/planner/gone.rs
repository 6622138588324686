//! Planning around prefill ranks that are gone: the failover planner, who serves each need
//! whose holder is gone, and what no available rank holds (`lost`).

use std::collections::HashSet;

use super::Planner;
use crate::error::PlanResult;
use crate::failover::{merge_lost, Failover, GoneRanks, LostRange, Rehoming};
use crate::ranks::Slot;
use crate::routing::Route;
use crate::routing::Units;
use crate::spread::{Need, NeedKey};

impl Planner {
    /// This planner with the prefill ranks `ranks` (and any this one already lacks)
    /// unavailable: every need an available rank of the read DP group and stage holds is read
    /// from one of them, needs whose holder is up keep it, and the rest are lost (`lost`).
    /// Built from the planner's own choices, so equal sets give equal plans whatever the order
    /// or the steps they were named in. Costs decode slots x classes for each distinct set of
    /// gone slots among the DP groups.
    pub fn without_prefill_ranks(&self, ranks: &[i128]) -> PlanResult<Self> {
        let mut gone = GoneRanks::of(self.prefill_ranks(), ranks)?;
        if let Some(failover) = &self.failover {
            gone = gone.union(failover.gone());
        }
        let mut planner = Self {
            failover: None,
            ..self.clone()
        };
        if gone.is_empty() {
            return Ok(planner);
        }
        let failover = Failover::build(gone, self.prefill_ranks(), |r| planner.rehome(r));
        planner.failover = Some(failover);
        Ok(planner)
    }

    /// The prefill ranks that are unavailable, ascending (empty for a planner of every rank).
    pub fn unavailable_prefill_ranks(&self) -> &[u64] {
        self.failover.as_ref().map_or(&[], |f| f.gone().ranks())
    }

    /// Whether prefill rank `rank` is unavailable.
    pub(super) fn is_gone(&self, rank: u64) -> bool {
        self.failover
            .as_ref()
            .is_some_and(|f| f.gone().contains(rank))
    }

    /// The rehoming of prefill DP group `group`, when some of its ranks are gone.
    pub(super) fn rehoming(&self, group: u64) -> Option<&Rehoming> {
        self.failover
            .as_ref()
            .and_then(|f| f.rehoming(group))
            .map(|(_, r)| r)
    }

    /// Chooses who serves, in one DP group whose slots `rehoming` marks gone, each need whose
    /// holder is gone, and counts the group's fanout.
    pub(super) fn rehome(&self, mut rehoming: Rehoming) -> Rehoming {
        let prefill = self.prefill_ranks();
        let gone = |slot: Slot| rehoming.is_gone(prefill.slot_index(slot));
        let mut orphaned: HashSet<NeedKey> = HashSet::new();
        let needs: Vec<Vec<Need>> = self
            .decode_ranks()
            .slots()
            .map(|at| {
                self.need_keys(at)
                    .into_iter()
                    .map(|(key, reader)| {
                        let (_, id, units, share) = key;
                        let kept = self.base_source(at, id, units, share);
                        let choices = if gone(kept) {
                            orphaned.insert(key);
                            self.holders
                                .every_holder(&self.class_of(id), units, at.tp_rank, share)
                                .into_iter()
                                .filter(|&slot| !gone(slot))
                                .collect()
                        } else {
                            vec![kept]
                        };
                        Need {
                            key,
                            choices,
                            reader,
                        }
                    })
                    .collect()
            })
            .collect();
        rehoming.choose(prefill, &needs, &orphaned);
        rehoming.fanout_per_slot = self.count_fanout(None, Some(&rehoming));
        rehoming
    }

    /// What decode rank `decode_rank` cannot receive because no available prefill rank of the
    /// DP group it reads (`prefill_group`, or the default) holds it, for a request of
    /// `num_tokens` tokens (None: any): buffer order, then token share, then unit.
    pub fn lost(
        &self,
        decode_rank: u64,
        prefill_group: Option<u64>,
        num_tokens: Option<u64>,
    ) -> PlanResult<Vec<LostRange>> {
        let target_dp_group = self.source_group(decode_rank, prefill_group)?;
        let Some(rehoming) = self.rehoming(target_dp_group) else {
            return Ok(Vec::new());
        };
        let at = self.decode_ranks().coord(decode_rank).slot();
        let shares = self.shares(at, num_tokens);
        let split = self.holders.prefill.deal.ways() > 1;
        let routes = self.routes_by_class(at);
        let mut lost = Vec::new();
        for (position, pair) in self.buffers.iter().enumerate() {
            let runs: Vec<(Units, u64, u64)> = match routes.get(pair.class) {
                Some(Some(Route::WholeItem)) => {
                    vec![(Units::Whole, 0, pair.decode.logical_size)]
                }
                Some(Some(Route::Units(overlaps))) => overlaps
                    .iter()
                    .map(|o| (o.units(), o.unit, o.unit + o.len))
                    .collect(),
                _ => Vec::new(),
            };
            for (units, unit_start, unit_end) in runs {
                for &share in &shares {
                    if self
                        .source(at, pair.class, units, share, Some(rehoming))
                        .is_none()
                    {
                        lost.push((
                            position,
                            LostRange {
                                buffer_index: pair.decode.buffer_index,
                                buffer_kind: pair.decode.buffer_kind,
                                layer: pair.decode.layer,
                                unit_start,
                                unit_end,
                                share: split.then_some(share),
                            },
                        ));
                    }
                }
            }
        }
        Ok(merge_lost(lost))
    }
}
