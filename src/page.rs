//! Page geometry: where a rank's units sit in the bytes of one page of its item, and the byte
//! runs one fragment moves in each page. Head-major pages hold a rank's units one after another
//! (one row); token-major pages hold them row by row (a row per token, or per token and plane).
//! Token geometry says where each token's bytes sit, so that slot maps can move tokens between
//! pages of different sizes.

use crate::error::{bail, PlanError, PlanResult};
use crate::layout::{BufferLayout, LogicalAxis, TokenPieces};
use crate::limits;
use crate::routing::UnitOverlap;

/// How a rank's units lie in one page of its item: `rows` rows `row_stride` bytes apart, each
/// holding every unit's `unit_row_bytes` bytes in the rank's unit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    pub rows: u64,
    pub row_stride: u64,
    pub unit_row_bytes: u64,
}

impl PageGeometry {
    /// The geometry of a validated buffer (`rows_per_page` divides both sizes).
    pub const fn of(buffer: &BufferLayout) -> Self {
        Self {
            rows: buffer.rows_per_page,
            row_stride: buffer.page_extent() / buffer.rows_per_page,
            unit_row_bytes: buffer.bytes_per_logical_unit / buffer.rows_per_page,
        }
    }
}

/// The bytes one fragment moves in each page: `rows` runs of `bytes_per_page / rows` bytes,
/// run `r` at `offset + r * row_stride` on each side (one run when `rows == 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub src_offset: u64,
    pub dst_offset: u64,
    pub bytes_per_page: u64,
    pub rows: u64,
    pub src_row_stride: u64,
    pub dst_row_stride: u64,
    /// The same bytes token by token, when the plan carries token geometry.
    pub tokens: TokenSpan,
}

impl Span {
    /// One contiguous run per page.
    pub const fn contiguous(src_offset: u64, dst_offset: u64, len: u64) -> Self {
        Self {
            src_offset,
            dst_offset,
            bytes_per_page: len,
            rows: 1,
            src_row_stride: 0,
            dst_row_stride: 0,
            tokens: TokenSpan::NONE,
        }
    }

    /// This span with the token runs of local units `units` (`(src first, dst first, count)`)
    /// between the two token geometries. Where pages do not pair (`pages_pair` false: page
    /// sizes or rows differ) the page fields only say where the runs start and what a source
    /// page moves.
    #[must_use]
    pub fn with_tokens(
        self,
        units: (u64, u64, u64),
        (src, dst): (&TokenGeometry, &TokenGeometry),
        pages_pair: bool,
    ) -> Self {
        let (mut tokens, src_offset, dst_offset) = TokenSpan::of_units(units, src, dst);
        // Pages of different sizes say so by their sizes (wire format v3).
        tokens.pages_unpaired = !pages_pair && src.page_size == dst.page_size;
        if pages_pair {
            return Self { tokens, ..self };
        }
        let source_page_bytes = src.page_size * tokens.runs * tokens.run_bytes;
        Self {
            tokens,
            ..Self::contiguous(src_offset, dst_offset, source_page_bytes)
        }
    }

    /// The spans that carry local units `units` (`(src first, dst first, count)`) token by
    /// token where a unit's tokens lie in pieces (`TokenPieces`): one a unit and plane, its
    /// runs the plane's pieces. A unit's plane is whole bytes of a page too, so pages that
    /// pair move it as it lies.
    pub fn of_pieces(
        (src_local, dst_local, len): (u64, u64, u64),
        (src, dst): (&TokenGeometry, &TokenGeometry),
        pages_pair: bool,
    ) -> Vec<Self> {
        let mut out = Vec::new();
        for unit in 0..len {
            for plane in 0..src.piece_planes() {
                let (Some(from), Some(to)) = (src.piece_of(plane), dst.piece_of(plane)) else {
                    continue;
                };
                let (src_offset, dst_offset) = (
                    (src_local + unit) * src.unit_stride + from.0,
                    (dst_local + unit) * dst.unit_stride + to.0,
                );
                let mut tokens = TokenSpan {
                    src_page_size: src.page_size,
                    dst_page_size: dst.page_size,
                    runs: from.1,
                    run_bytes: from.3,
                    src_token_stride: from.3,
                    dst_token_stride: to.3,
                    src_run_stride: from.2,
                    dst_run_stride: to.2,
                    pages_unpaired: !pages_pair && src.page_size == dst.page_size,
                };
                if tokens.runs <= 1 {
                    (tokens.src_run_stride, tokens.dst_run_stride) = (0, 0);
                }
                // Pages that pair move the unit's plane whole; others, a source page's pieces.
                let bytes = if pages_pair {
                    from.1 * from.2
                } else {
                    src.page_size * from.1 * from.3
                };
                out.push(Self {
                    tokens,
                    ..Self::contiguous(src_offset, dst_offset, bytes)
                });
            }
        }
        out
    }

    /// The span that carries `overlap` from a prefill page to a decode page. Rows that are
    /// whole and dense on both sides collapse to one run, so head-major pages (one row) keep
    /// the reference's fragments.
    pub fn of_units(overlap: &UnitOverlap, prefill: &BufferLayout, decode: &BufferLayout) -> Self {
        let (src, dst) = (PageGeometry::of(prefill), PageGeometry::of(decode));
        // Offsets stay below logical_size * bytes_per_logical_unit < 2^63 (validated).
        let run = overlap.len * src.unit_row_bytes;
        let src_offset = overlap.src_local * src.unit_row_bytes;
        let dst_offset = overlap.dst_local * dst.unit_row_bytes;
        let dense = run == src.row_stride && run == dst.row_stride;
        if src.rows == 1 || dense {
            return Self::contiguous(src_offset, dst_offset, run * src.rows);
        }
        Self {
            src_offset,
            dst_offset,
            bytes_per_page: run * src.rows,
            rows: src.rows,
            src_row_stride: src.row_stride,
            dst_row_stride: dst.row_stride,
            tokens: TokenSpan::NONE,
        }
    }
}

/// One side of a fragment's runs in a page: `rows` runs of `run` bytes, run `r` at
/// `offset + r * row_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRuns {
    pub offset: u64,
    pub rows: u64,
    pub row_stride: u64,
    pub run: u64,
}

impl RowRuns {
    /// Bytes from a page's start to the end of its last run, `None` past 2^64.
    pub fn reach(self) -> Option<u64> {
        self.rows
            .checked_sub(1)?
            .checked_mul(self.row_stride)?
            .checked_add(self.offset)?
            .checked_add(self.run)
    }
}

/// Where each token's bytes lie in one page of a token-indexed buffer (`kv_head`,
/// `replicated`): a layout with strides, as `CuTe` writes them. Byte `x` of local unit `u` of
/// slot `s` in plane `q` sits at `q * plane_stride + u * unit_stride + s * token_stride + x`, for
/// `x < unit_bytes`. Head-major, token-major, fused K/V pages and any page size are values of
/// these fields, not branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGeometry {
    /// Tokens a page holds.
    pub page_size: u64,
    /// Planes a page holds each token in (2 for `FlashInfer`'s fused K/V page, else 1).
    pub planes: u64,
    /// Bytes of one unit of one token in one plane (a replicated buffer is one unit).
    pub unit_bytes: u64,
    pub unit_stride: u64,
    pub token_stride: u64,
    pub plane_stride: u64,
    /// Local units one plane of one slot has room for.
    pub units: u64,
    /// A head-major unit's planes and their pieces, where its tokens lie in pieces: a token's
    /// slice is then its bytes of each piece, plane after plane (`piece_of`).
    pub pieces: TokenPieces,
}

impl TokenGeometry {
    /// The token geometry of a validated buffer, or why it has none.
    pub fn of(buffer: &BufferLayout) -> PlanResult<Self> {
        let (size, rows, unit) = (
            buffer.page_size,
            buffer.rows_per_page,
            buffer.bytes_per_logical_unit,
        );
        let name = || {
            format!(
                "buffer {} ({}, {})",
                buffer.buffer_index,
                buffer.buffer_kind.as_str(),
                buffer.logical_axis.as_str()
            )
        };
        if buffer.logical_axis == LogicalAxis::StateChannel {
            bail!(
                "{} is not indexed by token: state moves whole, with descriptors(..., \
                 buffers=...)",
                name()
            );
        }
        limits::PAGE_SIZE
            .check("page_size", size)
            .map_err(|e| PlanError::new(format!("{}: {e}", name())))?;
        // Bytes one token takes of the whole item's units (a replicated item is one unit).
        let replicated = buffer.logical_axis == LogicalAxis::Replicated;
        let token_unit = if replicated {
            buffer.logical_size * unit
        } else {
            unit
        };
        if rows == 1 {
            if token_unit % size != 0 {
                bail!(
                    "{}: a head-major page of {size} tokens needs {} bytes a unit divisible by \
                     page_size, so that each token has a slice of its own; check page_size and \
                     bytes_per_logical_unit",
                    name(),
                    token_unit
                );
            }
            let unit_bytes = token_unit / size;
            return Ok(if replicated {
                Self {
                    page_size: size,
                    planes: 1,
                    unit_bytes,
                    unit_stride: unit_bytes,
                    token_stride: unit_bytes,
                    plane_stride: 0,
                    units: 1,
                    pieces: TokenPieces::NONE,
                }
            } else {
                let pieces = buffer.token_pieces;
                Self {
                    page_size: size,
                    planes: 1,
                    unit_bytes,
                    unit_stride: unit,
                    // Of the first piece where a unit's tokens lie in pieces (`piece_of`).
                    token_stride: pieces.given().first().map_or(unit_bytes, |&n| {
                        unit / pieces.given().len() as u64 / n / size
                    }),
                    plane_stride: 0,
                    units: buffer.page_extent() / unit,
                    pieces,
                }
            });
        }
        if rows % size != 0 {
            bail!(
                "{}: rows_per_page={rows} is neither 1 (head-major) nor a multiple of \
                 page_size={size} (token-major, one row per token and plane), so a token's \
                 place in the page is not known; use one of those layouts",
                name()
            );
        }
        let row_stride = buffer.page_extent() / rows;
        // rows divides bytes_per_logical_unit (validated), so a unit's row share is whole.
        let unit_bytes = token_unit / rows;
        Ok(Self {
            page_size: size,
            planes: rows / size,
            unit_bytes,
            unit_stride: unit_bytes,
            token_stride: row_stride,
            plane_stride: size * row_stride,
            units: if replicated {
                1
            } else {
                row_stride / unit_bytes
            },
            pieces: TokenPieces::NONE,
        })
    }

    /// Where plane `plane` of a unit whose tokens lie in pieces (`TokenPieces`) holds them:
    /// `(offset in the unit, pieces, piece stride, bytes a token takes of a piece)`; `None`
    /// for a unit whose tokens lie one after another.
    pub fn piece_of(&self, plane: usize) -> Option<(u64, u64, u64, u64)> {
        let given = self.pieces.given();
        let &pieces = given.get(plane)?;
        // Validated: the unit cuts into equal planes, each into whole pieces of page_size.
        let plane_bytes = self.unit_stride / given.len() as u64;
        let stride = plane_bytes / pieces;
        Some((
            plane as u64 * plane_bytes,
            pieces,
            stride,
            stride / self.page_size,
        ))
    }

    /// Planes a unit is cut into where its tokens lie in pieces; 0 otherwise.
    pub fn piece_planes(&self) -> usize {
        self.pieces.given().len()
    }

    /// The token stride at byte `offset` of a page: of the piece there, or the geometry's.
    pub fn token_stride_at(&self, offset: u64) -> u64 {
        let planes = self.piece_planes() as u64;
        if planes == 0 || self.unit_stride == 0 {
            return self.token_stride;
        }
        let plane = (offset % self.unit_stride) / (self.unit_stride / planes);
        let at = usize::try_from(plane).unwrap_or(usize::MAX);
        self.piece_of(at)
            .map_or(self.token_stride, |(_, _, _, bytes)| bytes)
    }

    /// Bytes one token of one unit takes in all its planes: what both sides must agree on.
    pub const fn token_bytes(&self) -> u64 {
        self.planes * self.unit_bytes
    }

    /// Whether a token's units lie one after another in each plane (token-major rows).
    pub const fn units_contiguous(&self) -> bool {
        self.unit_stride == self.unit_bytes
    }

    /// The element at byte `offset` of a page, or `None` for a byte no element owns.
    pub fn locate(&self, offset: u64) -> Option<TokenCoord> {
        if self.piece_planes() > 0 {
            return self.locate_in_pieces(offset);
        }
        // Modes from the widest stride in: each index is the quotient by its stride.
        let mut modes = [
            (self.plane_stride, self.planes, 0),
            (self.unit_stride, self.units, 1),
            (self.token_stride, self.page_size, 2),
        ];
        modes.sort_by_key(|&(stride, _, _)| std::cmp::Reverse(stride));
        let mut index = [0u64; 3];
        let mut rest = offset;
        for (stride, extent, which) in modes {
            if extent <= 1 {
                continue;
            }
            let at = rest.checked_div(stride)?;
            if at >= extent {
                return None;
            }
            index[which] = at;
            rest %= stride;
        }
        if rest >= self.unit_bytes {
            return None;
        }
        Some(TokenCoord {
            plane: index[0],
            unit: index[1],
            slot: index[2],
            byte: rest,
        })
    }
}

impl TokenGeometry {
    /// `locate` in a unit whose tokens lie in pieces: a token slice's bytes are its bytes of
    /// each piece of each plane, in order.
    fn locate_in_pieces(&self, offset: u64) -> Option<TokenCoord> {
        let unit = offset.checked_div(self.unit_stride)?;
        if unit >= self.units {
            return None;
        }
        let within = offset % self.unit_stride;
        let planes = self.piece_planes() as u64;
        let plane = within / (self.unit_stride / planes);
        let (start, _, stride, bytes) = self.piece_of(usize::try_from(plane).ok()?)?;
        let in_plane = within - start;
        let (piece, in_piece) = (in_plane / stride, in_plane % stride);
        // A token takes the same bytes of every plane: the slice over planes.
        let plane_slice = self.unit_bytes / planes;
        Some(TokenCoord {
            plane: 0,
            unit,
            slot: in_piece / bytes,
            byte: plane * plane_slice + piece * bytes + in_piece % bytes,
        })
    }
}

/// Where a byte of a page sits: plane, local unit, slot and byte of that unit's token slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCoord {
    pub plane: u64,
    pub unit: u64,
    pub slot: u64,
    pub byte: u64,
}

/// The bytes one fragment moves of each token: `runs` runs of `run_bytes` bytes, run `i` of
/// slot `s` at `offset + i * run_stride + s * token_stride` in that side's page of
/// `page_size` tokens. `page_size == 0`: the fragment carries no token geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenSpan {
    pub src_page_size: u64,
    pub dst_page_size: u64,
    pub runs: u64,
    pub run_bytes: u64,
    pub src_token_stride: u64,
    pub dst_token_stride: u64,
    pub src_run_stride: u64,
    pub dst_run_stride: u64,
    /// Pages do not pair one to one though they may hold as many tokens (head-major facing
    /// token-major): only slot maps move the fragment.
    pub pages_unpaired: bool,
}

impl TokenSpan {
    /// No token geometry.
    pub const NONE: Self = Self {
        src_page_size: 0,
        dst_page_size: 0,
        runs: 0,
        run_bytes: 0,
        src_token_stride: 0,
        dst_token_stride: 0,
        src_run_stride: 0,
        dst_run_stride: 0,
        pages_unpaired: false,
    };

    /// The token runs of local units `src_local..+len` of a prefill page into `dst_local..+len`
    /// of a decode page, with the page offsets of their first run; both geometries have the
    /// same planes and unit bytes (checked by `pairs`).
    pub fn of_units(
        (src_local, dst_local, len): (u64, u64, u64),
        src: &TokenGeometry,
        dst: &TokenGeometry,
    ) -> (Self, u64, u64) {
        let offsets = (src_local * src.unit_stride, dst_local * dst.unit_stride);
        let mut span = Self {
            src_page_size: src.page_size,
            dst_page_size: dst.page_size,
            ..Self::default()
        };
        if src.units_contiguous() && dst.units_contiguous() {
            // One run of the units a plane, a run per plane.
            (span.runs, span.run_bytes) = (src.planes, len * src.unit_bytes);
            (span.src_run_stride, span.dst_run_stride) = (src.plane_stride, dst.plane_stride);
        } else {
            // Head-major (one plane): a run per unit.
            (span.runs, span.run_bytes) = (len, src.unit_bytes);
            (span.src_run_stride, span.dst_run_stride) = (src.unit_stride, dst.unit_stride);
        }
        (span.src_token_stride, span.dst_token_stride) = (src.token_stride, dst.token_stride);
        let runs_touch =
            span.src_run_stride == span.run_bytes && span.dst_run_stride == span.run_bytes;
        if span.runs > 1 && runs_touch {
            (span.run_bytes, span.runs) = (span.runs * span.run_bytes, 1);
        }
        if span.runs <= 1 {
            (span.src_run_stride, span.dst_run_stride) = (0, 0);
        }
        (span, offsets.0, offsets.1)
    }

    pub const fn is_present(&self) -> bool {
        self.src_page_size != 0
    }

    /// Whether the two sides' pages do not pair one to one (different token counts, or rows
    /// stored differently): no page-to-page copy.
    pub const fn pages_unpaired(&self) -> bool {
        self.src_page_size != self.dst_page_size || self.pages_unpaired
    }
}

/// One side of a fragment's token runs in a page: `runs` runs `run_stride` apart, each
/// `page_size` token pieces of `run_bytes` bytes `token_stride` apart, from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRuns {
    pub offset: u64,
    pub page_size: u64,
    pub runs: u64,
    pub run_bytes: u64,
    pub token_stride: u64,
    pub run_stride: u64,
}

impl TokenRuns {
    /// Bytes from a page's start to the end of its last token's last run, `None` past 2^64
    /// (or for no runs).
    pub fn reach(self) -> Option<u64> {
        let last_run = self.runs.checked_sub(1)?.checked_mul(self.run_stride)?;
        let last_token = self
            .page_size
            .checked_sub(1)?
            .checked_mul(self.token_stride)?;
        last_run
            .checked_add(last_token)?
            .checked_add(self.offset)?
            .checked_add(self.run_bytes)
    }

    /// Whether no two of a page's pieces (run `i`, slot `s`) overlap: the pieces nest one way
    /// or the other, runs outside tokens (head-major units, token-major planes) or tokens
    /// outside runs (a head-major side facing a token-major one, unit by unit).
    pub fn pieces_disjoint(self) -> bool {
        // Bytes `count` pieces `stride` apart span, when they are each `inner` long.
        let span = |count: u64, stride: u64, inner: u64| {
            count
                .checked_sub(1)
                .and_then(|n| n.checked_mul(stride))
                .and_then(|n| n.checked_add(inner))
        };
        let fits = |count: u64, stride: u64, inner: Option<u64>| {
            count <= 1 || inner.is_some_and(|inner| stride >= inner)
        };
        let (b, runs, tokens) = (self.run_bytes, self.runs, self.page_size);
        let runs_outside = fits(tokens, self.token_stride, Some(b))
            && fits(runs, self.run_stride, span(tokens, self.token_stride, b));
        let tokens_outside = fits(runs, self.run_stride, Some(b))
            && fits(tokens, self.token_stride, span(runs, self.run_stride, b));
        runs_outside || tokens_outside
    }

    /// Whether a run's token pieces lie one after another (one descriptor per run of slots).
    pub const fn tokens_contiguous(self) -> bool {
        self.token_stride == self.run_bytes || self.page_size == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LogicalAxis, LogicalParts, TokenPieces};

    #[test]
    fn token_major_rows_become_runs_unless_dense() {
        let buffer = |heads_held: u64| BufferLayout {
            buffer_index: 0,
            buffer_kind: crate::layout::BufferKind::TargetK,
            logical_axis: LogicalAxis::KvHead,
            logical_size: 8,
            page_size: 16,
            bytes_per_logical_unit: 16 * 256,
            item_stride_bytes: heads_held * 16 * 256,
            tp_replica_group_size: 1,
            layer: None,
            rows_per_page: 16,
            page_bytes: None,
            logical_parts: LogicalParts::WHOLE,
            sliding_window: None,
            attention_chunk_size: None,
            token_pieces: TokenPieces::NONE,
        };
        let one_head = UnitOverlap {
            src_shard: 5,
            reader: 0,
            unit: 5,
            src_local: 0,
            dst_local: 1,
            len: 1,
            copies: None,
        };
        let span = Span::of_units(&one_head, &buffer(1), &buffer(4));
        assert_eq!(
            span,
            Span {
                src_offset: 0,
                dst_offset: 256,
                bytes_per_page: 16 * 256,
                rows: 16,
                src_row_stride: 256,
                dst_row_stride: 1024,
                tokens: TokenSpan::NONE,
            }
        );
        let whole = UnitOverlap {
            len: 4,
            dst_local: 0,
            ..one_head
        };
        assert_eq!(
            Span::of_units(&whole, &buffer(4), &buffer(4)),
            Span::contiguous(0, 0, 4 * 16 * 256)
        );
    }

    #[test]
    fn token_pieces_must_nest_one_way_or_the_other() {
        // Two 8-byte units of 4 tokens: head-major (units outside tokens), token-major rows
        // (tokens outside units), and strides that interleave them.
        let runs = |run_stride, token_stride| TokenRuns {
            offset: 0,
            page_size: 4,
            runs: 2,
            run_bytes: 8,
            token_stride,
            run_stride,
        };
        // Byte-level brute force: does any byte belong to two pieces?
        let overlap = |r: TokenRuns| {
            let mut seen = std::collections::HashSet::new();
            (0..r.runs).any(|i| {
                (0..r.page_size).any(|s| {
                    let start = i * r.run_stride + s * r.token_stride;
                    (start..start + r.run_bytes).any(|byte| !seen.insert(byte))
                })
            })
        };
        for (run_stride, token_stride) in [
            (32, 8),
            (8, 16),
            (8, 24),
            (16, 8),
            (24, 8),
            (12, 24),
            (32, 4),
        ] {
            let r = runs(run_stride, token_stride);
            if r.pieces_disjoint() {
                assert!(
                    !overlap(r),
                    "{run_stride} {token_stride} accepted but overlaps"
                );
            }
        }
        assert!(runs(32, 8).pieces_disjoint() && runs(8, 16).pieces_disjoint());
        assert!(!runs(16, 8).pieces_disjoint() && !runs(32, 4).pieces_disjoint());
    }

    #[test]
    fn reach_ends_at_the_last_run() {
        let runs = RowRuns {
            offset: 8,
            rows: 3,
            row_stride: 100,
            run: 10,
        };
        assert_eq!(runs.reach(), Some(218));
        assert_eq!(RowRuns { rows: 1, ..runs }.reach(), Some(18));
        assert_eq!(RowRuns { rows: 0, ..runs }.reach(), None);
        let huge = RowRuns {
            row_stride: u64::MAX,
            ..runs
        };
        assert_eq!(huge.reach(), None);
    }
}
