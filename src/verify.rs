//! An independent check of a planner's output: every byte of every decode rank's shard of
//! every buffer is written exactly once per page, by a fragment from a prefill rank of the same
//! DP group that holds that same logical byte (same unit, same row of the page, same byte of
//! the unit's row), inside both items; and each prefill rank's fanout is the number of decode
//! ranks whose plans name it.
//!
//! It reads only the layouts and the plans (identity plans as their whole-item fragments), not
//! the planner's routing, so a routing bug shows up as a named gap or overlap. From the
//! planner it takes the two layouts and the buffer pairs as given, the options it was built
//! with (`decode_replicas`, token maps) and the plans and fanout it checks; each buffer's stage
//! and each rank's token share it derives from the layouts itself.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::context::shares_meet;
use crate::error::{bail, PlanError, PlanResult};
use crate::failover::LostRange;
use crate::fragment::Fragment;
use crate::holders::Holders;
use crate::interval::Interval;
use crate::layout::{BufferLayout, LogicalAxis};
use crate::page::{PageGeometry, TokenGeometry};
use crate::planner::{Planner, SourcePlan};
use crate::routing::DecodeReplicas;
use crate::stages::{buffer_stages, layer_count};

/// The logical units a rank holds, in its item's order, as runs `(first unit, count)`: its
/// shard of each part in turn (any rank of a replica group holds the group's), or everything.
fn held_units(buffer: &BufferLayout, tp_size: u64, tp_rank: u64) -> Vec<(u64, u64)> {
    match buffer.logical_axis {
        LogicalAxis::Replicated => vec![(0, buffer.logical_size)],
        LogicalAxis::KvHead | LogicalAxis::StateChannel => {
            let shards = tp_size / buffer.tp_replica_group_size;
            let shard = tp_rank / buffer.tp_replica_group_size;
            let mut part_start = 0;
            buffer
                .part_sizes()
                .map(|part| {
                    let len = part / shards;
                    let run = (part_start + shard * len, len);
                    part_start += part;
                    run
                })
                .collect()
        }
    }
}

/// The logical unit at position `local` of a rank's item.
fn unit_at(runs: &[(u64, u64)], mut local: u64) -> Option<u64> {
    for &(first, count) in runs {
        if local < count {
            return Some(first + local);
        }
        local -= count;
    }
    None
}

/// Units a decode rank must receive: as held, but under `DecodeReplicas::First` only the
/// first rank of a replica group receives a sharded buffer (the reference's semantics), or
/// with decode DCP the first `dcp` ranks, one for each token share.
fn received_units(
    buffer: &BufferLayout,
    tp_size: u64,
    tp_rank: u64,
    (replicas, dcp): (DecodeReplicas, u64),
) -> Vec<(u64, u64)> {
    let first_only = replicas == DecodeReplicas::First;
    if first_only
        && buffer.logical_axis.is_sharded()
        && tp_rank % buffer.tp_replica_group_size >= dcp
    {
        return Vec::new();
    }
    held_units(buffer, tp_size, tp_rank)
}

/// Token writes from sources holding every token.
const EVERY_TOKEN: u64 = u64::MAX;

fn unit_count(runs: &[(u64, u64)]) -> u64 {
    runs.iter().map(|&(_, count)| count).sum()
}

/// The bytes one run of a fragment writes: `row` of the page, `start..end` within the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Written {
    row: u64,
    start: u64,
    end: u64,
}

/// One verification pass: what the plans are checked against, derived from the layouts.
struct Check<'a> {
    planner: &'a Planner,
    /// The request's length, when checking the plans of one.
    num_tokens: Option<u64>,
    pairs: Vec<(&'a BufferLayout, &'a BufferLayout)>,
    /// The (prefill, decode) pipeline stages holding each buffer.
    stages: Vec<(u64, u64)>,
    /// Which tokens each rank of either side holds.
    holders: Holders,
    position_of: HashMap<u64, usize>,
    /// What the available prefill ranks hold, by DP group and kind of buffer (`available`).
    available: RefCell<HashMap<AvailableKey, std::rc::Rc<Held>>>,
}

/// (logical unit, token share tag) pairs some ranks hold.
type Held = HashSet<(u64, u64)>;

/// A DP group, a stage and the shape of a buffer's axis: what decides who holds its units.
type AvailableKey = (u64, u64, LogicalAxis, u64, Vec<u64>);

impl<'a> Check<'a> {
    fn of(planner: &'a Planner, num_tokens: Option<u64>) -> PlanResult<Self> {
        let pairs: Vec<_> = planner.buffer_pairs().collect();
        let (prefill, decode) = (planner.prefill(), planner.decode());
        let (prefill_buffers, decode_buffers): (Vec<BufferLayout>, Vec<BufferLayout>) =
            pairs.iter().map(|&(p, d)| (*p, *d)).unzip();
        // Stages and token shares from the layouts, not from the planner's routing.
        let layers = layer_count(prefill, decode, &prefill_buffers)?;
        let stages = buffer_stages(prefill, &prefill_buffers, layers)?
            .into_iter()
            .zip(buffer_stages(decode, &decode_buffers, layers)?)
            .collect();
        let holders = Holders::of((prefill, decode), (&prefill_buffers, &decode_buffers))?;
        let mut position_of = HashMap::new();
        for (position, (p, _)) in pairs.iter().enumerate() {
            if position_of.insert(p.buffer_index, position).is_some() {
                bail!(
                    "buffer_index={} is used by two buffers, so fragments cannot name one of \
                     them; give every buffer its own index",
                    p.buffer_index
                );
            }
        }
        Ok(Self {
            planner,
            num_tokens,
            pairs,
            stages,
            holders,
            position_of,
            available: RefCell::default(),
        })
    }

    /// Checks every fragment of one source and adds what each writes to its buffer's lists
    /// (bytes of each page, and with token maps (plane, bytes of each token)).
    fn add_source(
        &self,
        decode_rank: u64,
        source: &SourcePlan,
        written: &mut [BufferWrites],
    ) -> PlanResult<()> {
        // Which tokens the source holds: its share of the prefill side's deal.
        let holders = &self.holders;
        let share = holders.prefill.share(
            self.planner
                .prefill_ranks()
                .coord(source.prefill_rank)
                .slot(),
        );
        let tag = if share.is_whole() {
            EVERY_TOKEN
        } else {
            share.index
        };
        if self
            .planner
            .unavailable_prefill_ranks()
            .binary_search(&source.prefill_rank)
            .is_ok()
        {
            bail!(
                "decode rank {decode_rank} reads from prefill rank {}, which is unavailable",
                source.prefill_rank
            );
        }
        if !source.fragments.is_empty() {
            let mine = holders
                .decode
                .share(self.planner.decode_ranks().coord(decode_rank).slot());
            if !shares_meet(share, mine, self.num_tokens) {
                bail!(
                    "decode rank {decode_rank} reads from prefill rank {}, which holds none of \
                     its tokens",
                    source.prefill_rank
                );
            }
        }
        for f in &source.fragments {
            let (mut runs, mut token_runs) = (Vec::new(), Vec::new());
            let position = self.check_fragment(
                decode_rank,
                source.prefill_rank,
                f,
                (&mut runs, &mut token_runs),
            )?;
            if let Some(lists) = written.get_mut(position) {
                lists.pages.extend(runs);
                lists
                    .tokens
                    .extend(token_runs.into_iter().map(|w| (tag, w)));
            }
        }
        Ok(())
    }

    /// Whether the buffer at `position` moves token by token, and whether also page by page.
    fn token_mapped(&self, position: usize) -> (bool, bool) {
        let Some(&(p, d)) = self.pairs.get(position) else {
            return (false, true);
        };
        let tokens = self.planner.token_maps() && p.logical_axis.is_token_indexed();
        // Spread tokens move only by slot maps: pages of two ranks hold different tokens.
        let by_page = p.pages_pair(d) && !self.holders.any_context();
        (tokens, !tokens || by_page)
    }

    /// Every buffer of the decode rank (reading prefill DP group `group`) is written exactly
    /// once except what no available prefill rank holds, which is never written and is what
    /// the planner reports lost; nothing arrives for a buffer of another decode stage.
    fn check_rank_coverage(
        &self,
        decode_rank: u64,
        group: u64,
        written: &mut [BufferWrites],
    ) -> PlanResult<()> {
        let decode_ranks = self.planner.decode_ranks();
        let decode_at = decode_ranks.coord(decode_rank);
        let tags = self.read_tags(decode_rank);
        let mut lost_ranges = Vec::new();
        for (position, lists) in written.iter_mut().enumerate() {
            let (Some(&(_, d)), Some(&(_, stage))) =
                (self.pairs.get(position), self.stages.get(position))
            else {
                continue;
            };
            let wanted = if stage == decode_at.stage {
                received_units(
                    d,
                    decode_ranks.tp_size(),
                    decode_at.tp_rank,
                    self.receivers(),
                )
            } else {
                Vec::new()
            };
            let lost = self.lost_units(group, position, &wanted, &tags);
            lost_ranges.extend(lost_ranges_of(d, &wanted, &lost));
            let (tokens, pages) = self.token_mapped(position);
            if pages {
                // Bytes are lost by pages when no share of them is held.
                let none_held: Vec<bool> = (0..unit_count(&wanted))
                    .map(|unit| {
                        !lost.is_empty()
                            && lost
                                .iter()
                                .all(|(_, units)| units.get(to_index(unit)) == Some(&true))
                    })
                    .collect();
                let (rows, unit_bytes) = coverage_shape(d);
                let expected = kept_bytes(&none_held, unit_bytes);
                check_coverage(decode_rank, d, (rows, &expected), &mut lists.pages)?;
            }
            if tokens {
                let geometry = TokenGeometry::of(d)?;
                let sharded = d.logical_axis.is_sharded();
                let lost: Vec<(u64, Vec<(u64, u64)>)> = lost
                    .into_iter()
                    .map(|(tag, units)| {
                        // A replicated item's token slice is one unit, held whole or not at all.
                        let units = if sharded || units.is_empty() {
                            units
                        } else {
                            vec![units.iter().all(|&gone| gone)]
                        };
                        (tag, kept_bytes(&units, geometry.unit_bytes))
                    })
                    .collect();
                self.check_token_coverage(
                    decode_rank,
                    d,
                    geometry.planes,
                    &lost,
                    &mut lists.tokens,
                )?;
            }
        }
        self.check_lost(decode_rank, lost_ranges)
    }

    /// The planner reports lost exactly what no available rank holds.
    fn check_lost(&self, decode_rank: u64, derived: Vec<LostRange>) -> PlanResult<()> {
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
    fn receivers(&self) -> (DecodeReplicas, u64) {
        let dcp = self.planner.decode().context().dcp_size;
        (self.planner.decode_replicas(), dcp)
    }

    /// The prefill token shares (tags) whose tokens the decode rank reads: those meeting its
    /// own share, or `EVERY_TOKEN` when the prefill side holds every token on each rank (and
    /// none when the request holds none of its tokens).
    fn read_tags(&self, decode_rank: u64) -> Vec<u64> {
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
    fn lost_units(
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
    fn available(&self, group: u64, position: usize) -> std::rc::Rc<Held> {
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
            p.part_sizes().collect::<Vec<_>>(),
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

    /// Token slices are covered exactly once for each prefill token share that holds some of
    /// the decode rank's tokens, by the sources of that share and those holding every token,
    /// except the bytes `lost` says no available rank holds (by tag: the bytes of each plane
    /// expected written).
    fn check_token_coverage(
        &self,
        decode_rank: u64,
        d: &BufferLayout,
        planes: u64,
        expected: &[(u64, Vec<(u64, u64)>)],
        writes: &mut [(u64, Written)],
    ) -> PlanResult<()> {
        let shares = self.read_tags(decode_rank);
        if shares.is_empty() {
            let mut list: Vec<Written> = writes.iter().map(|&(_, w)| w).collect();
            return check_coverage(decode_rank, d, (planes, &[]), &mut list)
                .map_err(|e| PlanError::new(format!("{e} (it holds none of the tokens)")));
        }
        for share in shares {
            let mut list: Vec<Written> = writes
                .iter()
                .filter(|&&(tag, _)| tag == share || tag == EVERY_TOKEN)
                .map(|&(_, w)| w)
                .collect();
            let name = if share == EVERY_TOKEN {
                String::new()
            } else {
                format!(", tokens of prefill share {share}")
            };
            let bytes = expected
                .iter()
                .find(|(tag, _)| *tag == share)
                .map(|(_, bytes)| bytes.as_slice());
            check_coverage(decode_rank, d, (planes, bytes.unwrap_or(&[])), &mut list).map_err(
                |e| PlanError::new(format!("{e} (token slices: rows are planes{name})")),
            )?;
        }
        Ok(())
    }

    /// Checks one fragment and adds the bytes it writes inside the decode shard to `written`;
    /// returns the buffer position.
    fn check_fragment(
        &self,
        decode_rank: u64,
        prefill_rank: u64,
        f: &Fragment,
        (written, token_written): (&mut Vec<Written>, &mut Vec<Written>),
    ) -> PlanResult<usize> {
        // Made only for a message: building it for every fragment would be most of the cost.
        let where_ = || {
            format!(
                "decode rank {decode_rank}, fragment from prefill rank {prefill_rank} for \
                 buffer {}",
                f.buffer_index
            )
        };
        let (position, p, d) = self.locate(decode_rank, prefill_rank, f, &where_)?;
        f.validate()?;
        let (prefill_ranks, decode_ranks) =
            (self.planner.prefill_ranks(), self.planner.decode_ranks());
        let wanted = received_units(
            d,
            decode_ranks.tp_size(),
            decode_ranks.coord(decode_rank).tp_rank,
            self.receivers(),
        );
        let held = held_units(
            p,
            prefill_ranks.tp_size(),
            prefill_ranks.coord(prefill_rank).tp_rank,
        );
        let (tokens, pages) = self.token_mapped(position);
        if tokens != f.token_span().is_present() {
            bail!(
                "{}: {} token geometry, but the plan {} tokens for this buffer",
                where_(),
                if tokens { "lacks" } else { "carries" },
                if tokens { "maps" } else { "does not map" }
            );
        }
        if tokens {
            check_token_runs(&where_, f, (p, &held), (d, &wanted), token_written)?;
        }
        if !pages {
            return Ok(position);
        }
        check_inside_items(f, p, d, &where_)?;
        if !p.logical_axis.is_sharded() {
            return check_whole_item(&where_, f, d, &wanted, written).map(|()| position);
        }
        check_split_runs(&where_, f, (p, &held), (d, &wanted), written)?;
        Ok(position)
    }

    /// The buffer a fragment names (its position and both layouts), after checking that the
    /// fragment names its ranks, runs between the stages holding the buffer's layer, and
    /// matches the buffer's kind and page strides.
    fn locate(
        &self,
        decode_rank: u64,
        prefill_rank: u64,
        f: &Fragment,
        where_: &dyn Fn() -> String,
    ) -> PlanResult<(usize, &'a BufferLayout, &'a BufferLayout)> {
        if f.src_rank != prefill_rank || f.dst_rank != decode_rank {
            bail!(
                "{}: names src_rank={} dst_rank={}",
                where_(),
                f.src_rank,
                f.dst_rank
            );
        }
        let found = self.position_of.get(&f.buffer_index).and_then(|&position| {
            Some((
                position,
                self.pairs.get(position)?,
                self.stages.get(position)?,
            ))
        });
        let Some((position, &(p, d), &(prefill_stage, decode_stage))) = found else {
            bail!("{}: no such buffer", where_());
        };
        let src_stage = self.planner.prefill_ranks().coord(prefill_rank).stage;
        let dst_stage = self.planner.decode_ranks().coord(decode_rank).stage;
        if src_stage != prefill_stage || dst_stage != decode_stage {
            bail!(
                "{}: the buffer's layer is held by prefill stage {prefill_stage} and decode \
                 stage {decode_stage}, but the fragment runs from stage {src_stage} to stage \
                 {dst_stage}",
                where_()
            );
        }
        if f.buffer_kind != p.buffer_kind
            || f.src_page_stride_bytes != p.item_stride_bytes
            || f.dst_page_stride_bytes != d.item_stride_bytes
        {
            bail!(
                "{}: kind or page strides differ from the buffer layouts",
                where_()
            );
        }
        Ok((position, p, d))
    }
}

/// What one decode rank's fragments write into one buffer: bytes of each page, and (token
/// maps) bytes of each token slice, by plane.
#[derive(Debug, Clone, Default)]
struct BufferWrites {
    pages: Vec<Written>,
    /// Token writes tagged with the source's prefill token share (`EVERY_TOKEN`: all).
    tokens: Vec<(u64, Written)>,
}

/// A fragment's token runs: its page sizes and token strides are the buffers' own, its runs
/// lie inside both items, and piece by piece the run of slot 0 copies the same plane, the
/// same byte of a token slice and the same logical unit from what the prefill rank holds into
/// what the decode rank receives. Strides equal to the buffers' make slot `s` follow.
fn check_token_runs(
    where_: &dyn Fn() -> String,
    fragment: &Fragment,
    (prefill, held): (&BufferLayout, &[(u64, u64)]),
    (decode, wanted): (&BufferLayout, &[(u64, u64)]),
    written: &mut Vec<Written>,
) -> PlanResult<()> {
    let (src, dst) = (TokenGeometry::of(prefill)?, TokenGeometry::of(decode)?);
    let span = fragment.token_span();
    if span.src_page_size != src.page_size
        || span.dst_page_size != dst.page_size
        || span.src_token_stride != src.token_stride
        || span.dst_token_stride != dst.token_stride
    {
        bail!(
            "{}: token geometry (page sizes {} -> {}, token strides {} -> {}) differs from the \
             buffers' ({} -> {}, {} -> {})",
            where_(),
            span.src_page_size,
            span.dst_page_size,
            span.src_token_stride,
            span.dst_token_stride,
            src.page_size,
            dst.page_size,
            src.token_stride,
            dst.token_stride
        );
    }
    let inside = |reach: Option<u64>, item: u64| reach.is_some_and(|end| end <= item);
    if !inside(fragment.src_token_runs().reach(), prefill.page_extent())
        || !inside(fragment.dst_token_runs().reach(), decode.page_extent())
    {
        bail!("{}: token runs reach past an item", where_());
    }
    // A replicated item is one unit of token slices.
    let whole = [(0, 1)];
    let (held, wanted) = if prefill.logical_axis.is_sharded() {
        (held, wanted)
    } else {
        (
            &whole[..],
            if wanted.is_empty() {
                &[][..]
            } else {
                &whole[..]
            },
        )
    };
    for run in 0..span.runs {
        let mut src_at = fragment.src_byte_offset + run * span.src_run_stride;
        let mut dst_at = fragment.dst_byte_offset + run * span.dst_run_stride;
        let mut left = span.run_bytes;
        while left > 0 {
            let (Some(from), Some(to)) = (src.locate(src_at), dst.locate(dst_at)) else {
                bail!(
                    "{}: token run {run} starts outside the token slices of a page (bytes \
                     {src_at} -> {dst_at})",
                    where_()
                );
            };
            let piece = left
                .min(src.unit_bytes - from.byte)
                .min(dst.unit_bytes - to.byte);
            let same_unit =
                unit_at(wanted, to.unit).is_some_and(|u| unit_at(held, from.unit) == Some(u));
            if from.slot != 0
                || to.slot != 0
                || from.plane != to.plane
                || from.byte != to.byte
                || !same_unit
            {
                bail!(
                    "{}: token run {run} copies plane {} unit {} slot {} byte {} into plane {} \
                     unit {} slot {} byte {}; the source does not hold what the decode rank \
                     needs there",
                    where_(),
                    from.plane,
                    from.unit,
                    from.slot,
                    from.byte,
                    to.plane,
                    to.unit,
                    to.slot,
                    to.byte
                );
            }
            let start = to.unit * dst.unit_bytes + to.byte;
            written.push(Written {
                row: to.plane,
                start,
                end: start + piece,
            });
            (src_at, dst_at, left) = (src_at + piece, dst_at + piece, left - piece);
        }
    }
    Ok(())
}

/// A valid fragment whose every run lies inside both items.
fn check_inside_items(
    f: &Fragment,
    p: &BufferLayout,
    d: &BufferLayout,
    where_: &dyn Fn() -> String,
) -> PlanResult<()> {
    f.validate()?;
    let inside = |reach: Option<u64>, item: u64| reach.is_some_and(|end| end <= item);
    if !inside(f.src_runs().reach(), p.page_extent()) {
        bail!(
            "{}: reads bytes {}..+{} past the prefill item of {} bytes",
            where_(),
            f.src_byte_offset,
            f.bytes_per_page,
            p.page_extent()
        );
    }
    if !inside(f.dst_runs().reach(), d.page_extent()) {
        bail!(
            "{}: writes bytes {}..+{} past the decode item of {} bytes",
            where_(),
            f.dst_byte_offset,
            f.bytes_per_page,
            d.page_extent()
        );
    }
    Ok(())
}

/// A fragment of a split buffer, run by run and row piece by row piece: each piece copies
/// the same row, the same byte of a unit's row and, unit by unit, the same logical units from
/// what the prefill rank holds into what the decode rank receives.
fn check_split_runs(
    where_: &dyn Fn() -> String,
    f: &Fragment,
    (p, held): (&BufferLayout, &[(u64, u64)]),
    (d, wanted): (&BufferLayout, &[(u64, u64)]),
    written: &mut Vec<Written>,
) -> PlanResult<()> {
    let run = f.run_bytes();
    let (src_geometry, dst_geometry) = (PageGeometry::of(p), PageGeometry::of(d));
    let unit_row = dst_geometry.unit_row_bytes;
    let (wanted_end, held_end) = (unit_count(wanted) * unit_row, unit_count(held) * unit_row);
    {
        for r in 0..f.rows_per_page {
            let mut src = f.src_byte_offset + r * f.src_row_stride_bytes;
            let mut dst = f.dst_byte_offset + r * f.dst_row_stride_bytes;
            let mut left = run;
            // A run may cover whole rows (a whole-item copy); check it row piece by row piece.
            while left > 0 {
                let (src_row, src_in) =
                    (src / src_geometry.row_stride, src % src_geometry.row_stride);
                let (dst_row, dst_in) =
                    (dst / dst_geometry.row_stride, dst % dst_geometry.row_stride);
                let piece = left.min(dst_geometry.row_stride - dst_in);
                if src_in + piece > src_geometry.row_stride {
                    bail!(
                        "{}: copies across a row boundary of the prefill page where the \
                         decode page has none (row {src_row} byte {src_in}, {piece} bytes)",
                        where_()
                    );
                }
                // Only the bytes of the decode rank's units matter; padding may be copied over.
                let end = (dst_in + piece).min(wanted_end);
                if dst_in < end {
                    let len = end - dst_in;
                    if src_in + len > held_end {
                        bail!("{}: reads past the units the prefill rank holds", where_());
                    }
                    // Same row, same byte of a unit's row, and unit by unit the same units.
                    let same_units =
                        (0..(dst_in % unit_row + len).div_ceil(unit_row)).all(|step| {
                            let dst_unit = unit_at(wanted, dst_in / unit_row + step);
                            dst_unit.is_some()
                                && dst_unit == unit_at(held, src_in / unit_row + step)
                        });
                    if src_row != dst_row || src_in % unit_row != dst_in % unit_row || !same_units {
                        bail!(
                            "{}: copies row {src_row} byte {src_in} into row {dst_row} byte \
                             {dst_in}; the source does not hold the units the decode rank needs \
                             there",
                            where_()
                        );
                    }
                    written.push(Written {
                        row: dst_row,
                        start: dst_in,
                        end,
                    });
                } else if dst_in > wanted_end && f.is_row_fragment() {
                    bail!(
                        "{}: writes bytes {dst_in}..{} of row {dst_row}, past the \
                         {wanted_end} bytes of the units the decode rank holds there",
                        where_(),
                        dst_in + piece
                    );
                }
                (src, dst, left) = (src + piece, dst + piece, left - piece);
            }
        }
    }
    Ok(())
}

/// A replicated buffer moves as whole items: the same bytes on both sides.
fn check_whole_item(
    where_: &dyn Fn() -> String,
    f: &Fragment,
    d: &BufferLayout,
    wanted: &[(u64, u64)],
    written: &mut Vec<Written>,
) -> PlanResult<()> {
    if f.is_row_fragment() || f.src_byte_offset != f.dst_byte_offset {
        bail!(
            "{}: a replicated buffer must be copied byte for byte, whole",
            where_()
        );
    }
    let shard_end = unit_count(wanted) * d.bytes_per_logical_unit;
    if let Some(inside) = Interval::new(f.dst_byte_offset, f.dst_byte_offset + f.bytes_per_page)
        .intersect(Interval::new(0, shard_end))
    {
        written.push(Written {
            row: 0,
            start: inside.start,
            end: inside.end,
        });
    }
    Ok(())
}

/// Every byte of every row's `expected` ranges (ascending, apart) is written by exactly one
/// of `list` (sorted here), and no other byte is.
fn check_coverage(
    decode_rank: u64,
    d: &BufferLayout,
    (rows, expected): (u64, &[(u64, u64)]),
    list: &mut [Written],
) -> PlanResult<()> {
    list.sort_unstable();
    let name = || {
        format!(
            "decode rank {decode_rank}, buffer {} ({})",
            d.buffer_index,
            d.buffer_kind.as_str()
        )
    };
    let row_name = |row: u64| {
        if rows == 1 {
            String::new()
        } else {
            format!(" in row {row}")
        }
    };
    let mut written = list.iter().peekable();
    for row in 0..rows {
        // The row's writes as runs, refusing overlaps; then compared with `expected`.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut cursor = 0;
        while let Some(w) = written.next_if(|w| w.row == row) {
            if w.start < cursor {
                bail!(
                    "{}: bytes {}..{}{} of each page are written twice (overlap)",
                    name(),
                    w.start,
                    cursor.min(w.end),
                    row_name(row)
                );
            }
            match runs.last_mut() {
                Some(run) if run.1 == w.start => run.1 = w.end,
                _ if w.start == w.end => {}
                _ => runs.push((w.start, w.end)),
            }
            cursor = w.end;
        }
        if let Some((start, end, missing)) = first_difference(expected, &runs) {
            let (row, name) = (row_name(row), name());
            if missing {
                bail!("{name}: bytes {start}..{end}{row} of each page are never written (gap)");
            }
            bail!(
                "{name}: bytes {start}..{end}{row} of each page are written, but the decode rank \
                 receives none of them there (or no available prefill rank holds them: lost)"
            );
        }
    }
    if let Some(w) = written.next() {
        bail!("{}: writes row {} of a page that has {rows}", name(), w.row);
    }
    Ok(())
}

/// The first bytes where `runs` differ from `expected` (both ascending, apart): `(start, end,
/// true)` for bytes expected but not written, `false` for bytes written but not expected.
fn first_difference(expected: &[(u64, u64)], runs: &[(u64, u64)]) -> Option<(u64, u64, bool)> {
    for index in 0..expected.len().max(runs.len()) {
        match (expected.get(index), runs.get(index)) {
            (Some(&(a, b)), None) => return Some((a, b, true)),
            (None, Some(&(a, b))) => return Some((a, b, false)),
            (Some(&(a, b)), Some(&(x, y))) if (a, b) != (x, y) => {
                return Some(if x > a {
                    (a, b.min(x), true)
                } else if x < a {
                    (x, y.min(a), false)
                } else if y < b {
                    let next = runs.get(index + 1).map_or(b, |run| run.0.min(b));
                    (y, next, true)
                } else {
                    (b, y, false)
                });
            }
            _ => {}
        }
    }
    None
}

/// The rows of a decode page and the bytes a unit fills in each.
fn coverage_shape(d: &BufferLayout) -> (u64, u64) {
    if d.logical_axis.is_sharded() {
        let geometry = PageGeometry::of(d);
        (geometry.rows, geometry.unit_row_bytes)
    } else {
        (1, d.bytes_per_logical_unit)
    }
}

/// The byte ranges of the units `lost` marks kept (false), `unit_bytes` each, merged.
fn kept_bytes(lost: &[bool], unit_bytes: u64) -> Vec<(u64, u64)> {
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
fn lost_ranges_of(
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

fn to_index(unit: u64) -> usize {
    usize::try_from(unit).unwrap_or(usize::MAX)
}

/// Verifies every plan of `planner`; the error names the first gap, overlap or wrong source.
pub fn verify(planner: &Planner) -> PlanResult<()> {
    verify_at(planner, None)
}

/// Verifies every plan of `planner` for a request of `num_tokens` tokens (None: any).
pub fn verify_at(planner: &Planner, num_tokens: Option<u64>) -> PlanResult<()> {
    verify_plans(planner, num_tokens, |rank| {
        planner.transfer_fragments(rank, None, num_tokens)
    })
}

/// Verifies the plans `plans_for(decode_rank)` gives against `planner`'s layouts and fanout,
/// for a request of `num_tokens` tokens (None: any).
pub fn verify_plans(
    planner: &Planner,
    num_tokens: Option<u64>,
    mut plans_for: impl FnMut(u64) -> PlanResult<Vec<SourcePlan>>,
) -> PlanResult<()> {
    let check = Check::of(planner, num_tokens)?;
    let (prefill_ranks, decode_ranks) = (planner.prefill_ranks(), planner.decode_ranks());
    // Decode ranks of the current decode DP group reading each prefill rank (by its slot in
    // the group) of its source.
    let mut readers = vec![0u64; usize::try_from(prefill_ranks.group_size()).unwrap_or(0)];
    let mut written: Vec<BufferWrites> = vec![BufferWrites::default(); check.pairs.len()];
    for group in 0..decode_ranks.dp_size() {
        let source_group = planner.default_prefill_group(group);
        for decode_rank in decode_ranks.group_ranks(group) {
            for lists in &mut written {
                lists.pages.clear();
                lists.tokens.clear();
            }
            for source in plans_for(decode_rank)? {
                let at = prefill_ranks.coord(source.prefill_rank);
                if !prefill_ranks.contains(source.prefill_rank) || at.dp_group != source_group {
                    bail!(
                        "decode rank {decode_rank} (DP group {group}) reads from prefill rank \
                         {}, outside prefill DP group {source_group} it maps to",
                        source.prefill_rank
                    );
                }
                // A source that sends nothing serves nobody.
                if let Some(count) = usize::try_from(prefill_ranks.slot_index(at.slot()))
                    .ok()
                    .and_then(|r| readers.get_mut(r))
                    .filter(|_| !source.fragments.is_empty())
                {
                    *count += 1;
                }
                check.add_source(decode_rank, &source, &mut written)?;
            }
            check.check_rank_coverage(decode_rank, source_group, &mut written)?;
        }
        check_fanout(planner, (group, source_group), num_tokens, &mut readers)?;
    }
    Ok(())
}

/// One request of decode DP group `group` (reading prefill group `source_group`): each source
/// rank waits for the decode ranks that read it, by slot in `readers` (cleared for the next).
fn check_fanout(
    planner: &Planner,
    (group, source_group): (u64, u64),
    num_tokens: Option<u64>,
    readers: &mut [u64],
) -> PlanResult<()> {
    let first = planner.prefill_ranks().group_start(source_group);
    let fanouts = planner.request_fanouts(source_group, num_tokens);
    for ((rank, count), &fanout) in (first..).zip(readers.iter_mut()).zip(fanouts.iter()) {
        if *count != fanout {
            bail!(
                "prefill rank {rank} reports a fanout of {fanout} but {count} decode ranks of \
                 decode DP group {group} read from it"
            );
        }
        *count = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BufferKind, LogicalParts, ParallelLayout, Role};

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
            layer: None,
            rows_per_page: 1,
            page_bytes: None,
            logical_parts: LogicalParts::WHOLE,
            sliding_window: None,
            attention_chunk_size: None,
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

    #[test]
    fn failover_plans_are_held_to_what_is_left() {
        // Prefill TP 8 over 8 heads, decode TP 2: rank 5 alone holds head 5 (decode rank 1's).
        let planner = tp8_to_tp2();
        let failover = planner.without_prefill_ranks(&[5]).unwrap();
        verify(&failover).unwrap();
        // The plans of every rank read from rank 5, which is gone.
        let err = verify_plans(&failover, None, |rank| {
            planner.transfer_fragments(rank, None, None)
        })
        .unwrap_err();
        assert!(
            err.message()
                .contains("prefill rank 5, which is unavailable"),
            "{err}"
        );
        // A plan that drops a byte some rank still holds has a gap, not a loss.
        let err = verify_plans(&failover, None, |rank| {
            let mut sources = failover.transfer_fragments(rank, None, None)?;
            if rank == 1 {
                sources.remove(0); // rank 4, head 4
            }
            Ok(sources)
        })
        .unwrap_err();
        assert!(err.message().contains("never written (gap)"), "{err}");
    }

    fn broken(mutate: impl Fn(&mut Vec<SourcePlan>)) -> String {
        let planner = tp8_to_tp2();
        verify_plans(&planner, None, |rank| {
            let mut sources = planner.transfer_fragments(rank, None, None)?;
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
    fn a_wrong_fanout_alone_is_named() {
        // Prefill TP 4 over 2 heads: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1. Reading
        // head 0 from rank 1 instead of rank 0 moves the same bytes, so only the fanout the
        // planner reports (rank 0 serves one decode rank) no longer matches.
        let planner = Planner::new(
            ParallelLayout::new(Role::Prefill, 4, 1).unwrap(),
            ParallelLayout::new(Role::Decode, 1, 1).unwrap(),
            &[buffer(LogicalAxis::KvHead, 2, 4, 2)],
            &[buffer(LogicalAxis::KvHead, 2, 1, 1)],
        )
        .unwrap();
        verify(&planner).unwrap();
        let err = verify_plans(&planner, None, |rank| {
            let mut sources = planner.transfer_fragments(rank, None, None)?;
            let first = &mut sources[0];
            assert_eq!(first.prefill_rank, 0);
            first.prefill_rank = 1;
            first.fragments[0].src_rank = 1;
            Ok(sources)
        })
        .unwrap_err()
        .into_message();
        assert!(
            err.contains("prefill rank 0 reports a fanout of 1 but 0 decode ranks"),
            "{err}"
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

    /// A KV buffer of `heads` heads (`dim` bytes of each token) in pages of `page_size`
    /// tokens, `planes` planes token-major (0: head-major).
    fn token_buffer(heads: u64, tp: u64, page_size: u64, planes: u64) -> BufferLayout {
        let unit = page_size * planes.max(1) * 8;
        BufferLayout {
            page_size,
            bytes_per_logical_unit: unit,
            item_stride_bytes: heads / tp * unit,
            rows_per_page: if planes == 0 { 1 } else { planes * page_size },
            page_bytes: None,
            ..buffer(LogicalAxis::KvHead, heads, tp, 1)
        }
    }

    #[test]
    fn token_mapped_plans_verify_for_any_page_sizes() {
        use crate::planner::PlanOptions;
        for (ptp, dtp, heads) in [(8, 2, 8), (2, 8, 8), (4, 8, 2)] {
            for (ps, ds) in [(16, 64), (64, 16), (12, 20), (16, 16)] {
                for planes in [0, 1, 2] {
                    let (pr, dr) = (ptp / heads.min(ptp), dtp / heads.min(dtp));
                    let p = BufferLayout {
                        tp_replica_group_size: pr.max(1),
                        item_stride_bytes: heads / (ptp / pr.max(1)) * ps * planes.max(1) * 8,
                        ..token_buffer(heads, ptp, ps, planes)
                    };
                    let d = BufferLayout {
                        tp_replica_group_size: dr.max(1),
                        item_stride_bytes: heads / (dtp / dr.max(1)) * ds * planes.max(1) * 8,
                        ..token_buffer(heads, dtp, ds, planes)
                    };
                    let options = PlanOptions {
                        token_maps: true,
                        ..PlanOptions::default()
                    };
                    let planner = Planner::with_options(
                        ParallelLayout::new(Role::Prefill, ptp, 1).unwrap(),
                        ParallelLayout::new(Role::Decode, dtp, 1).unwrap(),
                        &[p],
                        &[d],
                        options,
                    )
                    .unwrap();
                    verify(&planner).unwrap();
                    // A token run moved one slot on is caught.
                    let shifted = |rank: u64| {
                        let mut plans = planner.transfer_fragments(rank, None, None)?;
                        if let Some(f) = plans.iter_mut().flat_map(|s| &mut s.fragments).next() {
                            f.dst_byte_offset += f.token_run_bytes;
                        }
                        Ok(plans)
                    };
                    assert!(
                        verify_plans(&planner, None, shifted).is_err(),
                        "{ptp}->{dtp} {ps}->{ds} planes {planes}"
                    );
                }
            }
        }
    }
}
