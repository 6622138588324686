//! Coverage: every byte a decode rank must receive written exactly once (by page, by row and
//! by token), and the first gap or overlap named.

use super::lost::{kept_bytes, lost_ranges_of};
use super::{received_units, to_index, unit_count, BufferWrites, Check, Written, EVERY_TOKEN};
use crate::error::{bail, PlanError, PlanResult};
use crate::layout::BufferLayout;
use crate::page::{PageGeometry, TokenGeometry};

impl Check<'_> {
    /// Every buffer of the decode rank (reading prefill DP group `group`) is written exactly
    /// once except what no available prefill rank holds, which is never written and is what
    /// the planner reports lost; nothing arrives for a buffer of another decode stage.
    pub(super) fn check_rank_coverage(
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

    /// Token slices are covered exactly once for each prefill token share that holds some of
    /// the decode rank's tokens, by the sources of that share and those holding every token,
    /// except the bytes `lost` says no available rank holds (by tag: the bytes of each plane
    /// expected written).
    pub(super) fn check_token_coverage(
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
}

/// Every byte of every row's `expected` ranges (ascending, apart) is written by exactly one
/// of `list` (sorted here), and no other byte is.
pub(super) fn check_coverage(
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
pub(super) fn first_difference(
    expected: &[(u64, u64)],
    runs: &[(u64, u64)],
) -> Option<(u64, u64, bool)> {
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
pub(super) fn coverage_shape(d: &BufferLayout) -> (u64, u64) {
    if d.logical_axis.is_sharded() {
        let geometry = PageGeometry::of(d);
        (geometry.rows, geometry.unit_row_bytes)
    } else {
        (1, d.bytes_per_logical_unit)
    }
}
