//! Placing a fragment in its two buffers once: every address term but the page, checked against
//! 64 bits and the buffers' limits, so a request checks only its largest page.

use super::{pages_used, Buffers, Placed, Placement};
use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::layout::IndexSpace;
use std::borrow::Borrow;

impl Placed {
    pub const fn buffer_index(&self) -> u64 {
        self.buffer_index
    }

    /// Descriptors this fragment makes for `pairs` page pairs.
    pub fn count(&self, pairs: usize) -> u64 {
        (self.pages_used(pairs) as u64).saturating_mul(self.rows)
    }

    /// Page pairs this fragment uses of `pairs`.
    pub fn pages_used(&self, pairs: usize) -> usize {
        pages_used(self.page_count, pairs)
    }

    pub const fn rows(&self) -> u64 {
        self.rows
    }

    /// One side's runs as strided rows `(address on page 0, length, device 0, page stride,
    /// pages)`, a row per page row; checked by `check` for the last of `pages` first.
    pub fn strided_rows(&self, dst: bool, pages: u64) -> impl Iterator<Item = [u64; 5]> + '_ {
        let side = if dst { &self.dst } else { &self.src };
        // base + reach does not overflow (placed), and every row starts before the reach.
        let start = side.base + side.offset;
        (0..self.rows).map(move |row| {
            [
                start + row * side.row_stride,
                self.run,
                0,
                side.stride,
                pages,
            ]
        })
    }
}

/// Places a validated fragment (the `position`-th of its list, for messages) on both sides.
pub fn place(position: usize, f: &Fragment, src: &Buffers, dst: &Buffers) -> PlanResult<Placed> {
    let (src_base, src_limit) = src.base_and_limit("src", position, f.buffer_index)?;
    let (dst_base, dst_limit) = dst.base_and_limit("dst", position, f.buffer_index)?;
    let (rows, run) = (f.rows_per_page, f.run_bytes());
    // Bytes from a page's start to the end of its last run, if the base plus that fits 64 bits.
    let inside_64_bits = |base: u64| move |reach: &u64| base.checked_add(*reach).is_some();
    let src_reach = f.src_runs().reach().filter(inside_64_bits(src_base));
    let dst_reach = f.dst_runs().reach().filter(inside_64_bits(dst_base));
    let (Some(src_reach), Some(dst_reach)) = (src_reach, dst_reach) else {
        bail!(
            "fragment {position}: base + offset + {} rows of {run} bytes overflows 64 bits on \
             the {} side",
            rows,
            if src_reach.is_none() { "src" } else { "dst" }
        );
    };
    Ok(Placed {
        position,
        page_sizes: f
            .needs_token_maps()
            .then_some((f.src_page_size, f.dst_page_size)),
        buffer_index: f.buffer_index,
        page_count: f.page_count,
        rows,
        run,
        src: Placement {
            base: src_base,
            offset: f.src_byte_offset,
            stride: f.src_page_stride_bytes,
            row_stride: f.src_row_stride_bytes,
            reach: src_reach,
            limit: src_limit,
            max_page: None,
        }
        .with_max_page(),
        dst: Placement {
            base: dst_base,
            offset: f.dst_byte_offset,
            stride: f.dst_page_stride_bytes,
            row_stride: f.dst_row_stride_bytes,
            reach: dst_reach,
            limit: dst_limit,
            max_page: None,
        }
        .with_max_page(),
    })
}

/// Places every fragment of a list.
pub fn place_all<F: Borrow<Fragment>>(
    fragments: &[F],
    src: &Buffers,
    dst: &Buffers,
) -> PlanResult<Vec<Placed>> {
    check_one_reading(fragments)?;
    let mut placed = Vec::with_capacity(fragments.len());
    for (position, f) in fragments.iter().enumerate() {
        placed.push(place(position, f.borrow(), src, dst)?);
    }
    Ok(placed)
}

impl Placed {
    /// Refuses a fragment whose pages cannot be paired one to one.
    pub fn check_pages_pair(&self) -> PlanResult<()> {
        if let Some((src, dst)) = self.page_sizes {
            let how = if src == dst {
                "stored differently (head-major facing token-major)".to_owned()
            } else {
                format!("of {src} tokens into pages of {dst}")
            };
            bail!(
                "fragment {} (buffer_index={}) moves tokens between pages {how}, which do not \
                 pair one to one; build its descriptors from slot maps with \
                 PreparedTransfer.token_descriptors(src_slots, dst_slots)",
                self.position,
                self.buffer_index
            );
        }
        Ok(())
    }
}

impl Placement {
    /// This placement with `max_page` set: page `p` is inside when `p * stride + reach` stays
    /// below both `2^64 - base` and the limit, that is `p <= (bound - reach) / stride`.
    #[must_use]
    pub(crate) fn with_max_page(mut self) -> Self {
        let bound = self.limit.map_or(u64::MAX - self.base, |limit| {
            limit.min(u64::MAX - self.base)
        });
        self.max_page = bound
            .checked_sub(self.reach)
            .map(|room| room.checked_div(self.stride).unwrap_or(u64::MAX));
        self
    }

    /// Every descriptor up to `largest_page` stays inside 64 bits and the buffer's limit;
    /// since addresses grow with the page, checking the largest checks them all. `who` is
    /// the fragment's position, buffer index and run length, for the message.
    pub(crate) fn check(
        &self,
        name: &str,
        (position, index, run): (usize, u64, u64),
        largest_page: u64,
    ) -> PlanResult<()> {
        if self.max_page.is_some_and(|max| largest_page <= max) {
            return Ok(());
        }
        let stride = self.stride;
        let end = largest_page
            .checked_mul(stride)
            .and_then(|v| v.checked_add(self.reach))
            .filter(|end| self.base.checked_add(*end).is_some());
        let Some(end) = end else {
            bail!(
                "fragment {position} on the {name} side: page {largest_page} x stride {stride} + \
                 {} bytes from base 0x{:x} overflows 64 bits",
                self.reach,
                self.base
            );
        };
        if let Some(limit) = self.limit.filter(|&limit| end > limit) {
            bail!(
                "fragment {position} (buffer_index={index}) would reach byte {end} of the {name} \
                 buffer, past its limit of {limit} bytes (page {largest_page}, stride {stride}, \
                 offset {}, {run} bytes); check the page indices and the plan's strides",
                self.offset,
            );
        }
        Ok(())
    }
}

/// Refuses fragments naming one `buffer_index` in both index spaces (a KV buffer's and a state
/// buffer's, as a runtime numbering its KV and state pointers apart names them): one array of
/// base pointers a side cannot say which buffer such an index means.
pub fn check_one_reading<F: Borrow<Fragment>>(fragments: &[F]) -> PlanResult<()> {
    let is_state = |f: &Fragment| f.buffer_kind.index_space() == IndexSpace::State;
    let mut state: Vec<u64> = fragments
        .iter()
        .map(Borrow::borrow)
        .filter(|f| is_state(f))
        .map(|f| f.buffer_index)
        .collect();
    if state.is_empty() {
        return Ok(()); // the common case: no state, nothing to tell apart
    }
    state.sort_unstable();
    state.dedup();
    let clash = fragments
        .iter()
        .map(Borrow::borrow)
        .enumerate()
        .find(|(_, f)| !is_state(f) && state.binary_search(&f.buffer_index).is_ok());
    if let Some((position, f)) = clash {
        bail!(
            "fragment {position} ({}) and a mamba_state fragment both name buffer_index={}: \
             the KV and state buffers are numbered apart (as the reference runtime numbers \
             them), and one array of base pointers a side cannot say which buffer an index \
             means. Number a side's buffers once (the state buffers after the KV ones, their \
             bases in that order), or resolve each fragment by its kind as that runtime does \
             (its KV pointers for KV kinds, its state pointers for mamba_state)",
            f.buffer_kind.as_str(),
            f.buffer_index
        );
    }
    Ok(())
}
