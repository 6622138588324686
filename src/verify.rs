//! An independent check of a planner's output: every byte of every decode rank's shard of
//! every buffer is written exactly once per page, by a fragment from a prefill rank of the same
//! DP group that holds that same logical unit, inside both items; and each prefill rank's
//! fanout is the number of decode ranks whose plans name it.
//!
//! It reads only the layouts and the plans (identity plans as their whole-item fragments), not
//! the planner's routing, so a routing bug shows up as a named gap or overlap.

use std::collections::HashMap;

use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::interval::Interval;
use crate::layout::{BufferLayout, LogicalAxis};
use crate::planner::{Planner, SourcePlan};

/// Units a prefill rank holds: its shard (any rank of a replica group holds it), or everything.
fn held_units(buffer: &BufferLayout, tp_size: u64, tp_rank: u64) -> Interval {
    match buffer.logical_axis {
        LogicalAxis::Replicated => Interval::new(0, buffer.logical_size),
        LogicalAxis::KvHead | LogicalAxis::StateChannel => {
            let replica = buffer.tp_replica_group_size;
            let shard_len = buffer.logical_size / (tp_size / replica);
            let shard = tp_rank / replica;
            Interval::new(shard * shard_len, (shard + 1) * shard_len)
        }
    }
}

/// Units a decode rank must receive: as held, but only the first rank of a replica group
/// receives a sharded buffer (the reference's semantics).
fn received_units(buffer: &BufferLayout, tp_size: u64, tp_rank: u64) -> Interval {
    if buffer.logical_axis.is_sharded() && tp_rank % buffer.tp_replica_group_size != 0 {
        return Interval::new(0, 0);
    }
    held_units(buffer, tp_size, tp_rank)
}

struct Context<'a> {
    planner: &'a Planner,
    pairs: Vec<(&'a BufferLayout, &'a BufferLayout)>,
    position_of: HashMap<u64, usize>,
}

impl Context<'_> {
    /// Checks one fragment and returns (buffer position, dst bytes it writes inside the shard).
    fn check_fragment(
        &self,
        decode_rank: u64,
        prefill_rank: u64,
        f: &Fragment,
    ) -> PlanResult<(usize, Option<Interval>)> {
        let (prefill_ranks, decode_ranks) =
            (self.planner.prefill_ranks(), self.planner.decode_ranks());
        let where_ = format!(
            "decode rank {decode_rank}, fragment from prefill rank {prefill_rank} for buffer {}",
            f.buffer_index
        );
        if f.src_rank != prefill_rank || f.dst_rank != decode_rank {
            bail!(
                "{where_}: names src_rank={} dst_rank={}",
                f.src_rank,
                f.dst_rank
            );
        }
        let Some(&position) = self.position_of.get(&f.buffer_index) else {
            bail!("{where_}: no such buffer");
        };
        let Some(&(p, d)) = self.pairs.get(position) else {
            bail!("{where_}: no such buffer");
        };
        if f.buffer_kind != p.buffer_kind
            || f.src_page_stride_bytes != p.item_stride_bytes
            || f.dst_page_stride_bytes != d.item_stride_bytes
        {
            bail!("{where_}: kind or page strides differ from the buffer layouts");
        }
        let inside = |offset: u64, item: u64| {
            offset
                .checked_add(f.bytes_per_page)
                .is_some_and(|end| end <= item)
        };
        if !inside(f.src_byte_offset, p.item_stride_bytes) {
            bail!(
                "{where_}: reads bytes {}..+{} past the prefill item of {} bytes",
                f.src_byte_offset,
                f.bytes_per_page,
                p.item_stride_bytes
            );
        }
        if !inside(f.dst_byte_offset, d.item_stride_bytes) {
            bail!(
                "{where_}: writes bytes {}..+{} past the decode item of {} bytes",
                f.dst_byte_offset,
                f.bytes_per_page,
                d.item_stride_bytes
            );
        }
        let unit = d.bytes_per_logical_unit;
        let wanted = received_units(
            d,
            decode_ranks.tp_size(),
            decode_ranks.coord(decode_rank).tp_rank,
        );
        let held = held_units(
            p,
            prefill_ranks.tp_size(),
            prefill_ranks.coord(prefill_rank).tp_rank,
        );
        // The part of the fragment that lands inside the decode rank's shard.
        let shard_bytes = Interval::new(0, wanted.len() * unit);
        let Some(written) = Interval::new(f.dst_byte_offset, f.dst_byte_offset + f.bytes_per_page)
            .intersect(shard_bytes)
        else {
            return Ok((position, None));
        };
        // Same logical byte on both sides: global positions agree at the start (the mapping is
        // a shift), and the source holds every byte it reads.
        let src_start = f.src_byte_offset + (written.start - f.dst_byte_offset);
        if held.start * unit + src_start != wanted.start * unit + written.start {
            bail!(
                "{where_}: copies logical byte {} of the buffer into logical byte {}; the \
                 source does not hold the units the decode rank needs there",
                held.start * unit + src_start,
                wanted.start * unit + written.start
            );
        }
        if src_start + written.len() > held.len() * unit {
            bail!("{where_}: reads past the units prefill rank {prefill_rank} holds");
        }
        Ok((position, Some(written)))
    }
}

/// Every byte of `0..shard_end` is written by exactly one of `list` (sorted here).
fn check_coverage(
    decode_rank: u64,
    d: &BufferLayout,
    shard_end: u64,
    list: &mut [Interval],
) -> PlanResult<()> {
    list.sort_unstable_by_key(|i| (i.start, i.end));
    let name = || {
        format!(
            "decode rank {decode_rank}, buffer {} ({})",
            d.buffer_index,
            d.buffer_kind.as_str()
        )
    };
    let mut cursor = 0;
    for interval in list.iter() {
        if interval.start < cursor {
            bail!(
                "{}: bytes {}..{} of each page are written twice (overlap)",
                name(),
                interval.start,
                cursor.min(interval.end)
            );
        }
        if interval.start > cursor {
            bail!(
                "{}: bytes {cursor}..{} of each page are never written (gap)",
                name(),
                interval.start
            );
        }
        cursor = interval.end;
    }
    if cursor < shard_end {
        bail!(
            "{}: bytes {cursor}..{shard_end} of each page are never written (gap)",
            name()
        );
    }
    Ok(())
}

/// Verifies every plan of `planner`; the error names the first gap, overlap or wrong source.
pub fn verify(planner: &Planner) -> PlanResult<()> {
    verify_plans(planner, |rank| planner.transfer_fragments(rank, None))
}

/// Verifies the plans `plans_for(decode_rank)` gives against `planner`'s layouts and fanout.
pub fn verify_plans(
    planner: &Planner,
    mut plans_for: impl FnMut(u64) -> PlanResult<Vec<SourcePlan>>,
) -> PlanResult<()> {
    let pairs: Vec<_> = planner.buffer_pairs().collect();
    let mut position_of = HashMap::new();
    for (position, (p, _)) in pairs.iter().enumerate() {
        if position_of.insert(p.buffer_index, position).is_some() {
            bail!(
                "buffer_index={} is used by two buffers, so fragments cannot name one of them; \
                 give every buffer its own index",
                p.buffer_index
            );
        }
    }
    let context = Context {
        planner,
        pairs,
        position_of,
    };
    let (prefill_ranks, decode_ranks) = (planner.prefill_ranks(), planner.decode_ranks());
    // Decode ranks of the current decode DP group reading each prefill TP rank of its source.
    let mut readers = vec![0u64; usize::try_from(prefill_ranks.tp_size()).unwrap_or(0)];
    let mut written: Vec<Vec<Interval>> = vec![Vec::new(); context.pairs.len()];
    for group in 0..decode_ranks.dp_size() {
        let source_group = planner.default_prefill_group(group);
        for decode_rank in decode_ranks.group_ranks(group) {
            let decode_tp_rank = decode_ranks.coord(decode_rank).tp_rank;
            written.iter_mut().for_each(Vec::clear);
            for source in plans_for(decode_rank)? {
                let prefill_rank = source.prefill_rank;
                let at = prefill_ranks.coord(prefill_rank);
                if !prefill_ranks.contains(prefill_rank) || at.dp_group != source_group {
                    bail!(
                        "decode rank {decode_rank} (DP group {group}) reads from prefill rank \
                         {prefill_rank}, outside prefill DP group {source_group} it maps to"
                    );
                }
                // A source that sends nothing serves nobody.
                if let Some(count) = usize::try_from(at.tp_rank)
                    .ok()
                    .and_then(|r| readers.get_mut(r))
                    .filter(|_| !source.fragments.is_empty())
                {
                    *count += 1;
                }
                for f in &source.fragments {
                    let (position, bytes) = context.check_fragment(decode_rank, prefill_rank, f)?;
                    if let (Some(bytes), Some(list)) = (bytes, written.get_mut(position)) {
                        list.push(bytes);
                    }
                }
            }
            for (position, list) in written.iter_mut().enumerate() {
                if let Some(&(_, d)) = context.pairs.get(position) {
                    let wanted = received_units(d, decode_ranks.tp_size(), decode_tp_rank);
                    check_coverage(
                        decode_rank,
                        d,
                        wanted.len() * d.bytes_per_logical_unit,
                        list,
                    )?;
                }
            }
        }
        // One request of this decode group: each source rank waits for its fanout.
        for (tp_rank, count) in (0u64..).zip(readers.iter_mut()) {
            let rank = prefill_ranks.rank_in_group(source_group, tp_rank);
            let fanout = planner.request_fanout(rank);
            if *count != fanout {
                bail!(
                    "prefill rank {rank} reports a fanout of {fanout} but {count} decode \
                     ranks of decode DP group {group} read from it"
                );
            }
            *count = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BufferKind, ParallelLayout, Role};

    fn buffer(axis: LogicalAxis, heads: u64, tp: u64, replica: u64) -> BufferLayout {
        BufferLayout {
            buffer_index: 0,
            buffer_kind: BufferKind::TargetK,
            logical_axis: axis,
            logical_size: heads,
            page_size: 16,
            bytes_per_logical_unit: 64,
            item_stride_bytes: if axis == LogicalAxis::Replicated {
                heads * 64
            } else {
                heads / (tp / replica) * 64
            },
            tp_replica_group_size: replica,
        }
    }

    #[test]
    fn planner_output_verifies_across_layouts() {
        for (ptp, dtp, heads, pr, dr, axis) in [
            (8, 2, 8, 1, 1, LogicalAxis::KvHead),
            (2, 8, 8, 1, 1, LogicalAxis::KvHead),
            (4, 1, 2, 2, 1, LogicalAxis::KvHead),
            (4, 4, 8, 1, 1, LogicalAxis::StateChannel),
            (4, 8, 2, 2, 4, LogicalAxis::KvHead),
            (8, 2, 1, 1, 1, LogicalAxis::Replicated),
        ] {
            let planner = Planner::new(
                ParallelLayout::new(Role::Prefill, ptp * 2, 2).unwrap(),
                ParallelLayout::new(Role::Decode, dtp * 2, 2).unwrap(),
                &[buffer(axis, heads, ptp, pr)],
                &[buffer(axis, heads, dtp, dr)],
            )
            .unwrap();
            verify(&planner).unwrap();
        }
    }

    fn tp8_to_tp2() -> Planner {
        Planner::new(
            ParallelLayout::new(Role::Prefill, 8, 1).unwrap(),
            ParallelLayout::new(Role::Decode, 2, 1).unwrap(),
            &[buffer(LogicalAxis::KvHead, 8, 8, 1)],
            &[buffer(LogicalAxis::KvHead, 8, 2, 1)],
        )
        .unwrap()
    }

    fn broken(mutate: impl Fn(&mut Vec<SourcePlan>)) -> String {
        let planner = tp8_to_tp2();
        verify_plans(&planner, |rank| {
            let mut sources = planner.transfer_fragments(rank, None)?;
            if rank == 1 {
                mutate(&mut sources);
            }
            Ok(sources)
        })
        .unwrap_err()
        .into_message()
    }

    #[test]
    fn broken_plans_are_named() {
        let gap = broken(|s| {
            s.remove(1);
        });
        assert!(
            gap.contains("decode rank 1") && gap.contains("64..128") && gap.contains("gap"),
            "{gap}"
        );
        let overlap = broken(|s| {
            let again = s[1].fragments[0];
            s[1].fragments.push(again);
        });
        assert!(overlap.contains("written twice"), "{overlap}");
        let wrong_units = broken(|s| s[1].fragments[0].dst_byte_offset = 0);
        assert!(wrong_units.contains("does not hold"), "{wrong_units}");
        let past_source = broken(|s| s[0].fragments[0].bytes_per_page = 128);
        assert!(
            past_source.contains("past the prefill item"),
            "{past_source}"
        );
        let shifted = broken(|s| {
            s[2].fragments[0].src_rank = 3;
            s[2].prefill_rank = 3;
        });
        assert!(shifted.contains("does not hold"), "{shifted}");
        let past_item = broken(|s| s[0].fragments[0].dst_byte_offset = 250);
        assert!(past_item.contains("past the decode item"), "{past_item}");
        let fanout = broken(|s| {
            let extra = s[0].clone();
            s.push(extra);
        });
        assert!(
            fanout.contains("written twice") || fanout.contains("fanout"),
            "{fanout}"
        );
    }

    #[test]
    fn decode_items_too_small_for_a_replicated_buffer_are_a_gap() {
        let mut small = buffer(LogicalAxis::Replicated, 4, 1, 1);
        small.item_stride_bytes = 100;
        let planner = Planner::new(
            ParallelLayout::new(Role::Prefill, 2, 1).unwrap(),
            ParallelLayout::new(Role::Decode, 1, 1).unwrap(),
            &[buffer(LogicalAxis::Replicated, 4, 2, 1)],
            &[small],
        )
        .unwrap();
        let err = verify(&planner).unwrap_err();
        assert!(err.message().contains("100..256"), "{err}");
        assert!(err.message().contains("gap"), "{err}");
    }
}
