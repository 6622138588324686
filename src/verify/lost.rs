//! What the available prefill ranks of a DP group hold, derived rank by rank from the layouts,
//! and so what no available rank holds: the lost bytes the planner must report.

use std::collections::HashSet;

use super::{held_units, unit_at, Check, Held, EVERY_TOKEN};
use crate::context::shares_meet;
use crate::error::{bail, PlanResult};
use crate::failover::LostRange;
use crate::layout::BufferLayout;
use crate::routing::DecodeReplicas;

impl Check<'_> {
    /// The planner reports lost exactly what no available rank holds.
    pub(super) fn check_lost(&self, decode_rank: u64, derived: Vec<LostRange>) -> PlanResult<()> {
        if self.planner.unavailable_prefill_ranks().is_empty() && derived.is_empty() {
            return Ok(());
        }
        let mut derived = derived;
        derived.sort_unstable();
        let mut reported = self.planner.lost(decode_rank, None, self.num_tokens)?;
        reported.sort_unstable();
        if reported != derived {
            bail!(
                "decode rank {decode_rank}: the planner reports {reported:?} lost, but no \
                 available prefill rank holds {derived:?}"
            );
        }
        Ok(())
    }

    /// Who receives under `DecodeReplicas::First`: the decode mode and its DCP size.
    pub(super) fn receivers(&self) -> (DecodeReplicas, u64) {
        let dcp = self.planner.decode().context().dcp_size;
        (self.planner.decode_replicas(), dcp)
    }

    /// The prefill token shares (tags) whose tokens the decode rank reads: those meeting its
    /// own share, or `EVERY_TOKEN` when the prefill side holds every token on each rank (and
    /// none when the request holds none of its tokens).
    pub(super) fn read_tags(&self, decode_rank: u64) -> Vec<u64> {
        let holders = &self.holders;
        let at = self.planner.decode_ranks().coord(decode_rank).slot();
        let mine = holders.decode.share(at);
        let deal = holders.prefill.deal;
        if deal.ways() == 1 {
            let any = self
                .num_tokens
                .is_none_or(|n| shares_meet(crate::context::TokenShare::WHOLE, mine, Some(n)));
            return if any { vec![EVERY_TOKEN] } else { Vec::new() };
        }
        (0..deal.ways())
            .filter(|&index| {
                shares_meet(
                    crate::context::TokenShare { deal, index },
                    mine,
                    self.num_tokens,
                )
            })
            .collect()
    }

    /// For each tag of `tags`, which of the units `wanted` (in the decode rank's order) no
    /// available prefill rank of DP group `group` holds: found from the layouts, rank by rank.
    /// Empty when every rank of the group is up.
    pub(super) fn lost_units(
        &self,
        group: u64,
        position: usize,
        wanted: &[(u64, u64)],
        tags: &[u64],
    ) -> Vec<(u64, Vec<bool>)> {
        let gone = self.planner.unavailable_prefill_ranks();
        let prefill_ranks = self.planner.prefill_ranks();
        let units: Vec<u64> = wanted
            .iter()
            .flat_map(|&(first, count)| first..first + count)
            .collect();
        if !gone
            .iter()
            .any(|&rank| prefill_ranks.coord(rank).dp_group == group)
        {
            return tags
                .iter()
                .map(|&tag| (tag, vec![false; units.len()]))
                .collect();
        }
        let available = self.available(group, position);
        tags.iter()
            .map(|&tag| {
                let lost = units
                    .iter()
                    .map(|&unit| {
                        !available.contains(&(unit, tag))
                            && !available.contains(&(unit, EVERY_TOKEN))
                    })
                    .collect();
                (tag, lost)
            })
            .collect()
    }

    /// The (logical unit, token share tag) pairs the available prefill ranks of DP group
    /// `group` hold of the buffer at `position`: each rank of the buffer's stage that is not
    /// gone, its held units and its share. Buffers alike share one answer.
    pub(super) fn available(&self, group: u64, position: usize) -> std::rc::Rc<Held> {
        let (Some(&(p, _)), Some(&(stage, _))) =
            (self.pairs.get(position), self.stages.get(position))
        else {
            return std::rc::Rc::default();
        };
        let key = (
            group,
            stage,
            p.logical_axis,
            p.tp_replica_group_size,
            p.logical_size,
            p.logical_parts,
        );
        if let Some(found) = self.available.borrow().get(&key) {
            return found.clone();
        }
        let prefill_ranks = self.planner.prefill_ranks();
        let gone = self.planner.unavailable_prefill_ranks();
        let mut held = HashSet::new();
        for rank in prefill_ranks.group_ranks(group) {
            let at = prefill_ranks.coord(rank);
            if at.stage != stage || gone.contains(&rank) {
                continue;
            }
            let share = self.holders.prefill.share(at.slot());
            let tag = if share.is_whole() {
                EVERY_TOKEN
            } else {
                share.index
            };
            for (first, count) in held_units(p, prefill_ranks.tp_size(), at.tp_rank) {
                held.extend((first..first + count).map(|unit| (unit, tag)));
            }
        }
        let held = std::rc::Rc::new(held);
        self.available.borrow_mut().insert(key, held.clone());
        held
    }
}

/// The byte ranges of the units `lost` marks kept (false), `unit_bytes` each, merged.
pub(super) fn kept_bytes(lost: &[bool], unit_bytes: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (unit, _) in (0u64..).zip(lost).filter(|(_, &gone)| !gone) {
        let (start, end) = (unit * unit_bytes, (unit + 1) * unit_bytes);
        match out.last_mut() {
            Some(run) if run.1 == start => run.1 = end,
            _ if start == end => {}
            _ => out.push((start, end)),
        }
    }
    out
}

/// `lost` (by tag, over the units `wanted` in the decode rank's order) as the planner reports
/// it: logical unit ranges of `d`, merged, with the share under context parallelism.
pub(super) fn lost_ranges_of(
    d: &BufferLayout,
    wanted: &[(u64, u64)],
    lost: &[(u64, Vec<bool>)],
) -> Vec<LostRange> {
    let mut out: Vec<LostRange> = Vec::new();
    for (tag, units) in lost {
        let share = (*tag != EVERY_TOKEN).then_some(*tag);
        let mut open: Option<LostRange> = None;
        for (local, _) in (0u64..).zip(units).filter(|(_, &gone)| gone) {
            let Some(unit) = unit_at(wanted, local) else {
                continue;
            };
            match &mut open {
                Some(range) if range.unit_end == unit => range.unit_end += 1,
                _ => {
                    out.extend(open.take());
                    open = Some(LostRange {
                        buffer_index: d.buffer_index,
                        buffer_kind: d.buffer_kind,
                        layer: d.layer,
                        unit_start: unit,
                        unit_end: unit + 1,
                        share,
                    });
                }
            }
        }
        out.extend(open);
    }
    out
}
