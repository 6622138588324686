//! Who serves each need of a decode rank: its routes by class, its token shares, and the
//! prefill slot that serves each (units, share), by default, by a spread or by a rehoming.

use super::Planner;
use crate::failover::Rehoming;
use crate::ranks::Slot;
use crate::routing::Units;
use crate::routing::{route, Route, Sharding};
use crate::spread::{Need, NeedKey};

impl Planner {
    /// How the decode rank at `slot` is routed for each class its stage holds, with the class
    /// ids, in prefill shards.
    pub(super) fn routes(&self, slot: Slot) -> impl Iterator<Item = (usize, Route)> + '_ {
        let (prefill_tp, decode_tp) = (
            self.prefill_ranks().tp_size(),
            self.decode_ranks().tp_size(),
        );
        self.classes
            .iter()
            .enumerate()
            .filter(move |(_, class)| class.decode_stage == slot.stage)
            .map(move |(id, class)| {
                let receivers = match class.sharding {
                    Sharding::Split { decode_replica, .. } => {
                        self.holders.first_receivers(decode_replica)
                    }
                    Sharding::Replicated => 1,
                };
                let routed = route(
                    class.sharding,
                    (prefill_tp, decode_tp),
                    slot.tp_rank,
                    self.replicas,
                    receivers,
                );
                (id, routed)
            })
    }

    /// The prefill token shares the decode rank at `at` reads, for a request of `num_tokens`
    /// tokens (None: any request); one share when neither side spreads tokens.
    pub(super) fn shares(&self, at: Slot, num_tokens: Option<u64>) -> Vec<u64> {
        let num_tokens = num_tokens.filter(|_| self.holders.any_context());
        self.holders.shares(at, num_tokens).collect()
    }

    /// Every need of the decode rank at `at` that some prefill rank must serve, with the
    /// holders a spread may choose from.
    pub(super) fn needs(&self, at: Slot) -> Vec<Need> {
        self.need_keys(at)
            .into_iter()
            .map(|(key, reader)| {
                let (_, id, units, share) = key;
                Need {
                    key,
                    choices: self.holders.choices(
                        &self.class_of(id),
                        units,
                        at.tp_rank,
                        share,
                        self.replicas,
                    ),
                    reader,
                }
            })
            .collect()
    }

    /// Every need of the decode rank at `at` that some prefill rank must serve (any request),
    /// with the decode rank's place among the need's readers.
    pub(super) fn need_keys(&self, at: Slot) -> Vec<(NeedKey, u64)> {
        let shares = self.shares(at, None);
        let decode_tp = self.decode_ranks().tp_size();
        let mut out = Vec::new();
        for (id, routed) in self.routes(at) {
            let units: Vec<(Units, u64)> = match &routed {
                Route::Nothing => Vec::new(),
                Route::WholeItem => vec![(Units::Whole, at.tp_rank)],
                Route::Units(overlaps) => overlaps.iter().map(|o| (o.units(), o.reader)).collect(),
            };
            for (units, reader) in units {
                for &share in &shares {
                    out.push(((at, id, units, share), reader + at.cp_rank * decode_tp));
                }
            }
        }
        out
    }

    /// The prefill slot serving `units` of class `id` and token share `share` to the decode
    /// rank at `at` while every rank is up.
    pub(super) fn base_source(&self, at: Slot, id: usize, units: Units, share: u64) -> Slot {
        if let Some(chosen) = self.spread.holder(&(at, id, units, share)) {
            return chosen;
        }
        self.holders
            .default_holder(&self.class_of(id), units, at.tp_rank, share)
    }

    /// The prefill slot serving that need in a DP group `rehoming` describes (None: every
    /// rank of the group is up); `None` when it is lost.
    pub(super) fn source(
        &self,
        at: Slot,
        id: usize,
        units: Units,
        share: u64,
        rehoming: Option<&Rehoming>,
    ) -> Option<Slot> {
        if let Some(chosen) = rehoming.and_then(|r| r.holder(&(at, id, units, share))) {
            return chosen;
        }
        Some(self.base_source(at, id, units, share))
    }

    /// The route of the decode rank at `at` for each class, by class id (None: not its stage).
    pub(super) fn routes_by_class(&self, at: Slot) -> Vec<Option<Route>> {
        let mut routes: Vec<Option<Route>> = vec![None; self.classes.len()];
        for (id, routed) in self.routes(at) {
            if let Some(slot) = routes.get_mut(id) {
                *slot = Some(routed);
            }
        }
        routes
    }
}
