//! Which prefill ranks hold what a decode rank needs: the units of a shard (`routing`) and the
//! tokens the decode rank holds (`context`), and which of those ranks serves by default.
//!
//! A prefill rank holds a unit shard and a token share. Under DCP, the TP ranks of a replica
//! group (or, for replicated buffers, all TP ranks) split into `dcp` token shares, TP rank `r`
//! holding share `r % dcp`; under sharded CP each CP rank holds its own share; under
//! replicated CP every CP rank holds every token, so CP ranks are replicas to choose from.

use crate::context::{shares_meet, CpSplit, TokenDeal, TokenShare};
use crate::error::{bail, PlanResult};
use crate::layout::{BufferLayout, ContextParallel, ParallelLayout};
use crate::ranks::Slot;
use crate::routing::{replicated_source, Class, DecodeReplicas, Sharding, Units};

/// One side's token dealing: its context fields and the deal they make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideTokens {
    pub context: ContextParallel,
    pub deal: TokenDeal,
}

impl SideTokens {
    /// The side's deal; a contiguous split deals blocks of its token-indexed buffers' one page
    /// size.
    fn of(layout: &ParallelLayout, buffers: &[BufferLayout]) -> PlanResult<Self> {
        let context = *layout.context();
        let mut sizes = buffers
            .iter()
            .filter(|b| b.logical_axis.is_token_indexed())
            .map(|b| b.page_size);
        let page_size = sizes.next().unwrap_or(1);
        if context.split == CpSplit::Contiguous
            && context.ways() > 1
            && sizes.any(|size| size != page_size)
        {
            bail!(
                "the {} side deals contiguous blocks of pages over its CP ranks, but its \
                 token-indexed buffers have pages of different sizes; give them one page size or \
                 use cp_split='interleave' with cp_interleave set",
                layout.role().as_str()
            );
        }
        Ok(Self {
            context,
            deal: context.deal(page_size)?,
        })
    }

    pub const fn share(&self, slot: Slot) -> TokenShare {
        self.context.share(self.deal, slot)
    }
}

/// Both sides' token dealing, and the prefill ranks that hold each need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holders {
    pub prefill: SideTokens,
    pub decode: SideTokens,
    prefill_tp: u64,
    decode_tp: u64,
}

impl Holders {
    pub fn of(
        (prefill, decode): (&ParallelLayout, &ParallelLayout),
        (prefill_buffers, decode_buffers): (&[BufferLayout], &[BufferLayout]),
    ) -> PlanResult<Self> {
        Ok(Self {
            prefill: SideTokens::of(prefill, prefill_buffers)?,
            decode: SideTokens::of(decode, decode_buffers)?,
            prefill_tp: prefill.ranks().tp_size(),
            decode_tp: decode.ranks().tp_size(),
        })
    }

    /// Whether either side spreads tokens over ranks (or holds them in CP replicas).
    pub const fn any_context(&self) -> bool {
        self.prefill.context.is_active() || self.decode.context.is_active()
    }

    /// The prefill token shares the decode rank at `at` reads from, in share order: those
    /// meeting its own share, for a request of `num_tokens` tokens or (None) any request.
    pub fn shares(&self, at: Slot, num_tokens: Option<u64>) -> impl Iterator<Item = u64> + '_ {
        let mine = self.decode.share(at);
        let deal = self.prefill.deal;
        (0..deal.ways())
            .filter(move |&index| shares_meet(TokenShare { deal, index }, mine, num_tokens))
    }

    /// Decode ranks of a replica group of `replica` that receive under `DecodeReplicas::First`:
    /// the first of each DCP share.
    pub const fn first_receivers(&self, replica: u64) -> u64 {
        let dcp = self.decode.context.dcp_size;
        if dcp < replica {
            dcp
        } else {
            replica
        }
    }

    /// The prefill TP ranks holding `units` of `class` and token share `share`, as `(first,
    /// count, step)`: the first serves by default.
    fn tp_holders(
        &self,
        class: &Class,
        units: Units,
        decode_tp_rank: u64,
        share: u64,
    ) -> (u64, u64, u64) {
        let dcp = self.prefill.context.dcp_size;
        let k = if dcp > 1 { share } else { 0 };
        if let (
            Units::Shard(src_shard)
            | Units::Copy {
                chosen: src_shard, ..
            },
            Sharding::Split {
                prefill_replica, ..
            },
        ) = (units, class.sharding)
        {
            return (src_shard * prefill_replica + k, prefill_replica / dcp, dcp);
        }
        // A replicated buffer: one holder of the share, spread over the decode ranks.
        let m = replicated_source(self.prefill_tp / dcp, self.decode_tp, decode_tp_rank);
        (m * dcp + k, 1, dcp)
    }

    /// The prefill CP ranks holding share `share`, as `(first, count)`.
    const fn cp_holders(&self, share: u64) -> (u64, u64) {
        let context = &self.prefill.context;
        if context.cp_replicas() > 1 {
            (0, context.cp_replicas())
        } else if context.cp_size > 1 {
            (share, 1)
        } else {
            (0, 1)
        }
    }

    /// The prefill slot that serves `units` and `share` unless a spread chose another.
    pub fn default_holder(
        &self,
        class: &Class,
        units: Units,
        decode_tp_rank: u64,
        share: u64,
    ) -> Slot {
        let (tp_rank, _, _) = self.tp_holders(class, units, decode_tp_rank, share);
        Slot {
            stage: class.prefill_stage,
            cp_rank: self.cp_holders(share).0,
            tp_rank,
        }
    }

    /// The prefill slots a spread may choose from for `units` and `share`, the default first:
    /// under `DecodeReplicas::All` every holder (of a copied slice, every copy), under `First`
    /// the CP replicas of the default TP rank (replicated CP), else only the default.
    pub fn choices(
        &self,
        class: &Class,
        units: Units,
        decode_tp_rank: u64,
        share: u64,
        replicas: DecodeReplicas,
    ) -> Vec<Slot> {
        if replicas == DecodeReplicas::All && matches!(units, Units::Copy { .. }) {
            // Any copy serves: a spread may even out the copies' readers.
            return self.every_holder(class, units, decode_tp_rank, share);
        }
        let (first_tp, tp_count, step) = self.tp_holders(class, units, decode_tp_rank, share);
        let tp_count = if replicas == DecodeReplicas::All {
            tp_count
        } else {
            1
        };
        let (cp_start, cp_count) = self.cp_holders(share);
        let mut out = Vec::with_capacity(usize::try_from(tp_count * cp_count).unwrap_or(0));
        for cp_rank in cp_start..cp_start + cp_count {
            for m in 0..tp_count {
                out.push(Slot {
                    stage: class.prefill_stage,
                    cp_rank,
                    tp_rank: first_tp + m * step,
                });
            }
        }
        out
    }

    /// Every prefill slot holding `units` of `class` and token share `share`, the default
    /// first: each rank of the shard's replica group (of a replicated buffer, every TP rank of
    /// the share) in each CP replica. A failover reads from any of them (`failover`).
    pub fn every_holder(
        &self,
        class: &Class,
        units: Units,
        decode_tp_rank: u64,
        share: u64,
    ) -> Vec<Slot> {
        let (first_tp, count, step) = self.tp_holders(class, units, decode_tp_rank, share);
        // A replicated buffer is held by every TP rank of its share, not only the default.
        let (start, count) = match (units, class.sharding) {
            (
                Units::Copy {
                    first, count: n, ..
                },
                Sharding::Split {
                    prefill_replica, ..
                },
            ) => (
                first * prefill_replica + first_tp % step,
                n * prefill_replica / step,
            ),
            (Units::Whole | Units::Copy { .. }, _) => (first_tp % step, self.prefill_tp / step),
            (Units::Shard(_), _) => (first_tp, count),
        };
        let (cp_start, cp_count) = self.cp_holders(share);
        let default = self.default_holder(class, units, decode_tp_rank, share);
        let mut out = Vec::with_capacity(usize::try_from(count * cp_count).unwrap_or(0));
        out.push(default);
        for cp_rank in cp_start..cp_start + cp_count {
            for m in 0..count {
                let slot = Slot {
                    stage: class.prefill_stage,
                    cp_rank,
                    tp_rank: start + m * step,
                };
                if slot != default {
                    out.push(slot);
                }
            }
        }
        out
    }
}
