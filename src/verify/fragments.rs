//! Each fragment of a plan checked against the two layouts (its ranks, stages, kind, strides,
//! and that it stays inside both items) and read into the bytes it writes.

use super::{
    held_units, received_units, unit_at, unit_count, BufferWrites, Check, Written, EVERY_TOKEN,
};
use crate::context::shares_meet;
use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::interval::Interval;
use crate::layout::BufferLayout;
use crate::page::{PageGeometry, TokenGeometry};
use crate::planner::SourcePlan;

impl<'a> Check<'a> {
    /// Checks every fragment of one source and adds what each writes to its buffer's lists
    /// (bytes of each page, and with token maps (plane, bytes of each token)).
    pub(super) fn add_source(
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
    pub(super) fn token_mapped(&self, position: usize) -> (bool, bool) {
        let Some(&(p, d)) = self.pairs.get(position) else {
            return (false, true);
        };
        let tokens = self.planner.token_maps() && p.logical_axis.is_token_indexed();
        // Spread tokens move only by slot maps: pages of two ranks hold different tokens.
        let by_page = p.pages_pair(d) && !self.holders.any_context();
        (tokens, !tokens || by_page)
    }

    /// Checks one fragment and adds the bytes it writes inside the decode shard to `written`;
    /// returns the buffer position.
    pub(super) fn check_fragment(
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
    pub(super) fn locate(
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
        let found = self
            .position_of
            .get(&(f.buffer_kind.index_space(), f.buffer_index))
            .and_then(|&position| {
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

/// A fragment's token runs: its page sizes and token strides are the buffers' own, its runs
/// lie inside both items, and piece by piece the run of slot 0 copies the same plane, the
/// same byte of a token slice and the same logical unit from what the prefill rank holds into
/// what the decode rank receives. Strides equal to the buffers' make slot `s` follow.
pub(super) fn check_token_runs(
    where_: &dyn Fn() -> String,
    fragment: &Fragment,
    (prefill, held): (&BufferLayout, &[(u64, u64)]),
    (decode, wanted): (&BufferLayout, &[(u64, u64)]),
    written: &mut Vec<Written>,
) -> PlanResult<()> {
    let (src, dst) = (TokenGeometry::of(prefill)?, TokenGeometry::of(decode)?);
    let span = fragment.token_span();
    let (src_stride, dst_stride) = (
        src.token_stride_at(fragment.src_byte_offset),
        dst.token_stride_at(fragment.dst_byte_offset),
    );
    if span.src_page_size != src.page_size
        || span.dst_page_size != dst.page_size
        || span.src_token_stride != src_stride
        || span.dst_token_stride != dst_stride
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
            src_stride,
            dst_stride
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
pub(super) fn check_inside_items(
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
pub(super) fn check_split_runs(
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
pub(super) fn check_whole_item(
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
