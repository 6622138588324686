//! A transfer prepared once per (prefill rank, decode rank) pair: the fragments checked against
//! both sides' buffers, held in Rust, so each request only names its pages (and, for a layer
//! range, its buffers) and gets descriptors back, or indices into descriptor lists a transfer
//! engine prepared once (NIXL's prepped lists).

use std::ops::Range;
use std::sync::Arc;

pub use crate::descriptors::Buffers;
use crate::descriptors::{
    self, place_all, validate_all, Descriptors, FlatPlan, Placed, RequestPages, Strided,
};
use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::layout::BufferKind;
use crate::slices::TokenSlice;
use crate::staging::{Declared, StagingCounts, StagingPlan};
use crate::token_descriptors::{
    place_tokens, plan_tokens_of, untokenized, PlannedTokens, TokenPlaced,
};

/// Which buffers a request moves: all, a range of buffer indexes, or a list of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    /// A Python `range(start, stop, step)`: `step` is never 0.
    Range {
        start: i64,
        stop: i64,
        step: i64,
    },
    /// Built by `Selection::indices`.
    Indices(BufferSet),
}

/// A set of buffer indexes, asked once a fragment per request: a bit each below
/// `BITS_BELOW` (a layout's bound on buffers), sorted beyond it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferSet {
    bits: Vec<u64>,
    beyond: Vec<u64>,
}

/// Buffer indexes below this are bits (a layout holds at most this many buffers).
const BITS_BELOW: u64 = 1 << 16;

impl BufferSet {
    /// An empty set with room for bits below `bound` (at most `BITS_BELOW`).
    fn below(bound: u64) -> Self {
        let words = bound.min(BITS_BELOW).div_ceil(64);
        Self {
            bits: vec![0; usize::try_from(words).unwrap_or(0)],
            beyond: Vec::new(),
        }
    }

    fn insert(&mut self, i: u64) {
        if i >= BITS_BELOW {
            self.beyond.push(i);
            return;
        }
        let word = usize::try_from(i / 64).unwrap_or(usize::MAX);
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        if let Some(w) = self.bits.get_mut(word) {
            *w |= 1 << (i % 64);
        }
    }

    /// Sorted past the bits, so that `contains` may search them.
    fn finished(mut self) -> Self {
        self.beyond.sort_unstable();
        self.beyond.dedup();
        self
    }
}

impl Selection {
    /// The buffers `list` names, in any order, repeats allowed.
    pub fn indices(list: Vec<u64>) -> Self {
        let bound = list.iter().copied().filter(|&i| i < BITS_BELOW).max();
        let mut set = BufferSet::below(bound.map_or(0, |i| i + 1));
        for i in list {
            set.insert(i);
        }
        Self::Indices(set.finished())
    }

    /// The smallest and largest index the set may hold, and whether it holds every index
    /// between them (a range of step 1 or -1).
    fn span(&self) -> ((u64, u64), bool) {
        let clamp = |v: i64| u64::try_from(v).unwrap_or(0);
        match *self {
            Self::Range { start, stop, step } if step > 0 && start < stop && stop > 0 => {
                ((clamp(start), clamp(stop - 1)), step == 1)
            }
            // Here stop < start, so stop + 1 does not overflow.
            Self::Range { start, stop, step } if step < 0 && start > stop && start >= 0 => {
                ((clamp(stop + 1), clamp(start)), step == -1)
            }
            // Empty, or wholly below 0: nothing to hold.
            Self::Range { .. } => ((1, 0), true),
            Self::All | Self::Indices(_) => ((0, u64::MAX), false),
        }
    }

    #[inline]
    pub fn contains(&self, buffer_index: u64) -> bool {
        match self {
            Self::All => true,
            Self::Indices(set) => {
                if buffer_index < BITS_BELOW {
                    let word = usize::try_from(buffer_index / 64).unwrap_or(usize::MAX);
                    set.bits
                        .get(word)
                        .is_some_and(|w| w & (1 << (buffer_index % 64)) != 0)
                } else {
                    set.beyond.binary_search(&buffer_index).is_ok()
                }
            }
            &Self::Range { start, stop, step } => {
                let index = i128::from(buffer_index);
                let (first, end) = (i128::from(start), i128::from(stop));
                let inside = if step > 0 {
                    first <= index && index < end
                } else {
                    end < index && index <= first
                };
                // Inside, the distance from the first is under 2^64: the remainder in 64 bits
                // (a 128-bit one costs a call each, and a layer group asks a buffer each).
                let from_first = u64::try_from((index - first).unsigned_abs()).unwrap_or(0);
                inside && (step.unsigned_abs() == 1 || from_first % step.unsigned_abs() == 0)
            }
        }
    }
}

/// The strided descriptor lists a NIXL agent prepares once per peer (`prep_xfer_dlist` with
/// N x 5 rows `(address, length, device, page stride, page count)`): one row per fragment and
/// page row, each covering every page the buffer holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreppedLists {
    pub src: Vec<[u64; 5]>,
    pub dst: Vec<[u64; 5]>,
}

/// What a slice needs of one buffer beyond its fragments: its model layer (a layer group
/// selects by it) and its page size (fragments of page plans carry none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferFacts {
    pub buffer_index: u64,
    pub layer: Option<u64>,
    pub page_size: u64,
}

#[derive(Debug, Clone)]
pub struct Prepared {
    fragments: Arc<[Fragment]>,
    placed: Vec<Placed>,
    /// The placed fragments flattened for the fast path, when every one is flat.
    flat: Option<FlatPlan>,
    /// Per fragment, placed for slot maps when it carries token geometry.
    tokens: Vec<Option<TokenPlaced>>,
    /// Each side's buffers as declared, for host copies through a staging plan.
    memory: (Declared, Declared),
    /// Each buffer's layer and page size, where the caller named them (`with_buffers`).
    facts: Option<Arc<[BufferFacts]>>,
    /// (layer, buffer index) of every buffer with a layer, by layer: a layer group's buffers
    /// are one span of it.
    by_layer: Arc<[(u64, u64)]>,
}

impl Prepared {
    /// Checks every fragment once: valid fields, and a base (and a limit, when limits are given)
    /// for its buffer on both sides, its runs inside 64 bits.
    pub fn new(fragments: Arc<[Fragment]>, src: &Buffers, dst: &Buffers) -> PlanResult<Self> {
        validate_all(&fragments)?;
        Self::from_valid(fragments, src, dst)
    }

    /// As `new`, for fragments already validated (the wire decoder validates what it returns).
    pub fn from_valid(
        fragments: Arc<[Fragment]>,
        src: &Buffers,
        dst: &Buffers,
    ) -> PlanResult<Self> {
        let placed = place_all(&fragments, src, dst)?;
        // Empty when no fragment carries token geometry (the common case): none is placed.
        let mut tokens = Vec::new();
        if fragments.iter().any(|f| f.token_span().is_present()) {
            tokens.reserve_exact(fragments.len());
            for (position, f) in fragments.iter().enumerate() {
                let present = f.token_span().is_present();
                tokens.push(
                    present
                        .then(|| place_tokens(position, f, (src, dst), true))
                        .transpose()?,
                );
            }
        }
        Ok(Self {
            fragments,
            flat: FlatPlan::of(&placed),
            placed,
            tokens,
            memory: (src.declared(), dst.declared()),
            facts: None,
            by_layer: Arc::new([]),
        })
    }

    /// The same transfer, knowing each buffer's layer and page size, so that requests may
    /// select buffers by layer group and slice page plans by tokens.
    #[must_use]
    pub fn with_buffers(mut self, facts: Vec<BufferFacts>) -> Self {
        let mut by_layer: Vec<(u64, u64)> = facts
            .iter()
            .filter_map(|f| Some((f.layer?, f.buffer_index)))
            .collect();
        by_layer.sort_unstable();
        self.by_layer = by_layer.into();
        self.facts = Some(facts.into());
        self
    }

    fn facts_of(&self, buffer_index: u64) -> Option<&BufferFacts> {
        self.facts
            .as_deref()?
            .iter()
            .find(|f| f.buffer_index == buffer_index)
    }

    /// The buffers of `within` whose model layer is one of `layers`.
    pub fn select_layers(&self, layers: &Selection, within: &Selection) -> PlanResult<Selection> {
        let Some(known) = self.facts.as_deref() else {
            bail!(
                "layers= selects buffers by model layer, and this transfer knows none: prepare \
                 it with buffer_layouts= (the prefill side's BufferLayouts; from_layouts knows \
                 them) or select with buffers="
            );
        };
        // Written straight into bits from the span of layers the group may name: a layer
        // group is asked once a slice.
        let bound = known.iter().map(|f| f.buffer_index.saturating_add(1)).max();
        let mut chosen = BufferSet::below(bound.unwrap_or(0));
        let ((low, high), exact) = layers.span();
        let from = self.by_layer.partition_point(|&(l, _)| l < low);
        let to = self.by_layer.partition_point(|&(l, _)| l <= high);
        let all_within = *within == Selection::All;
        for &(layer, buffer) in self.by_layer.get(from..to).unwrap_or_default() {
            if (exact || layers.contains(layer)) && (all_within || within.contains(buffer)) {
                chosen.insert(buffer);
            }
        }
        Ok(Selection::Indices(chosen.finished()))
    }

    /// One request's staging plan from its page pairs: the coalesced `descriptors` regrouped
    /// into gather, transfer and scatter (`staging` module).
    pub fn staging_plan(
        &self,
        (src_pages, dst_pages): (&[u64], &[u64]),
        selection: &Selection,
        chunk_bytes: Option<u64>,
    ) -> PlanResult<StagingPlan> {
        let direct = self.descriptors(src_pages, dst_pages, selection, true)?;
        self.stage(&direct, chunk_bytes)
    }

    /// The staging plan of direct descriptors this transfer built (and bounds-checked) for
    /// one request; only this crate may call it, with descriptors from `descriptors` or
    /// `token_descriptors` of the same transfer (`StagingPlan::new` says why).
    pub(crate) fn stage(
        &self,
        direct: &Descriptors,
        chunk_bytes: Option<u64>,
    ) -> PlanResult<StagingPlan> {
        StagingPlan::new(direct, chunk_bytes, self.memory.clone())
    }

    /// What `staging_plan` would count, without building it.
    pub fn staging_counts(
        &self,
        (src_pages, dst_pages): (&[u64], &[u64]),
        selection: &Selection,
        chunk_bytes: Option<u64>,
    ) -> PlanResult<StagingCounts> {
        let direct = self.descriptors(src_pages, dst_pages, selection, true)?;
        StagingCounts::of(&direct, chunk_bytes)
    }

    /// What `staging_counts` counts for a request of `pages` pages scattered on both sides
    /// (no page beside the one before it, so no run continues across pages), in one transfer,
    /// in constant time: two such pages are counted and the counts scaled. Fragment-major
    /// order keeps the descriptors of two fragments of one page apart once there are two
    /// pages, so one page is counted as itself.
    pub fn scattered_page_counts(
        &self,
        pages: u64,
        selection: &Selection,
    ) -> PlanResult<StagingCounts> {
        let counted = pages.min(2);
        // Pages 2k-2, ..., 2, 0: backwards and a page apart.
        let table: Vec<u64> = (0..counted).rev().map(|page| 2 * page).collect();
        let counts = self.staging_counts((&table, &table), selection, None)?;
        if pages <= 2 {
            return Ok(counts);
        }
        counts.scaled(2, pages)
    }

    /// One request's staging plan from its slot maps (`token_descriptors`, coalesced).
    pub fn token_staging_plan(
        &self,
        (src_slots, dst_slots): (&[i64], &[i64]),
        selection: &Selection,
        chunk_bytes: Option<u64>,
    ) -> PlanResult<StagingPlan> {
        let direct = self.token_descriptors(src_slots, dst_slots, selection, true)?;
        self.stage(&direct, chunk_bytes)
    }

    /// One request's descriptors from its slot maps (`tokens` module), over the selected
    /// fragments; every one of them must carry token geometry.
    pub fn token_descriptors(
        &self,
        src_slots: &[i64],
        dst_slots: &[i64],
        selection: &Selection,
        coalesce: bool,
    ) -> PlanResult<Descriptors> {
        let whole = TokenSlice::default();
        Ok(self
            .plan_token_descriptors(src_slots, dst_slots, selection, coalesce, &whole)?
            .write())
    }

    /// `token_descriptors` of one slice of the request, checked and planned, not yet written
    /// (`PlannedTokens::write`).
    pub fn plan_token_descriptors(
        &self,
        src_slots: &[i64],
        dst_slots: &[i64],
        selection: &Selection,
        coalesce: bool,
        slice: &TokenSlice,
    ) -> PlanResult<PlannedTokens<'_>> {
        let any_tokenized = self.tokens.iter().any(Option::is_some);
        let mut chosen = Vec::with_capacity(self.tokens.len());
        for (position, _) in self.selected(selection) {
            if let Some(Some(placed)) = self.tokens.get(position) {
                chosen.push(placed);
            } else {
                let f = self.fragments.get(position).copied().unwrap_or_default();
                return untokenized(position, &f, any_tokenized);
            }
        }
        plan_tokens_of(chosen, src_slots, dst_slots, coalesce, slice)
    }

    /// `token_descriptors` of one slice as strided entries (`Strided`).
    pub fn token_strided_descriptors(
        &self,
        src_slots: &[i64],
        dst_slots: &[i64],
        selection: &Selection,
        slice: &TokenSlice,
    ) -> PlanResult<Strided> {
        let planned = self.plan_token_descriptors(src_slots, dst_slots, selection, true, slice)?;
        Ok(planned.write_strided())
    }

    pub fn fragments(&self) -> &[Fragment] {
        &self.fragments
    }

    /// Whether two prepared transfers share one parsed fragment list (a frame-cache hit).
    pub fn shares_fragments(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fragments, &other.fragments)
    }

    /// How many descriptors a request of `pages` page pairs would produce before coalescing.
    pub fn descriptor_count(&self, pages: usize, selection: &Selection) -> u64 {
        if let Some(flat) = self.flat.as_ref().filter(|_| *selection == Selection::All) {
            return flat.count(pages);
        }
        self.selected(selection)
            .map(|(_, p)| p.count(pages))
            .fold(0, u64::saturating_add)
    }

    /// The placed fragments a selection moves, with their positions, in fragment order.
    fn selected<'a>(
        &'a self,
        selection: &'a Selection,
    ) -> impl Iterator<Item = (usize, &'a Placed)> + 'a {
        self.placed
            .iter()
            .enumerate()
            .filter(move |(_, p)| selection.contains(p.buffer_index()))
    }

    /// One request's descriptors: the same values as `descriptors::build` over the selected
    /// fragments, bounds-checked against the limits for these pages.
    pub fn descriptors(
        &self,
        src_pages: &[u64],
        dst_pages: &[u64],
        selection: &Selection,
        coalesce: bool,
    ) -> PlanResult<Descriptors> {
        if *selection == Selection::All {
            let fast = self.flat.as_ref();
            if let Some(built) = fast.and_then(|f| f.build(src_pages, dst_pages, coalesce)) {
                return Ok(built);
            }
            return descriptors::build_placed(&self.placed, src_pages, dst_pages, coalesce);
        }
        let chosen: Vec<&Placed> = self.selected(selection).map(|(_, p)| p).collect();
        descriptors::build_placed(&chosen, src_pages, dst_pages, coalesce)
    }

    /// One slice of a request's descriptors by pages (`slices` module): each selected
    /// fragment over the page pairs whose last token becomes final in the slice (state in the
    /// slice that ends the prompt), fragments in order. The whole request is `descriptors`.
    pub fn slice_descriptors(
        &self,
        src_pages: &[u64],
        dst_pages: &[u64],
        selection: &Selection,
        coalesce: bool,
        slice: &TokenSlice,
    ) -> PlanResult<Descriptors> {
        if slice.is_whole() {
            return self.descriptors(src_pages, dst_pages, selection, coalesce);
        }
        let mut out = Descriptors::default();
        for (pairs, list) in self.slice_parts(src_pages.len(), dst_pages.len(), selection, slice)? {
            let (src, dst) = (&src_pages[pairs.clone()], &dst_pages[pairs]);
            let part = descriptors::build_placed(&list, src, dst, coalesce)?;
            out.src_addrs.extend(part.src_addrs);
            out.dst_addrs.extend(part.dst_addrs);
            out.lengths.extend(part.lengths);
        }
        Ok(out)
    }

    /// `slice_descriptors` as strided entries (`Strided`): the same blocks, runs of pages
    /// whose ids step evenly on both sides written as one entry a fragment row.
    pub fn strided_descriptors(
        &self,
        src_pages: &[u64],
        dst_pages: &[u64],
        selection: &Selection,
        slice: &TokenSlice,
    ) -> PlanResult<Strided> {
        let pages = RequestPages::new(src_pages.into(), dst_pages.into());
        self.request_strided(&pages, selection, slice)
    }

    /// `strided_descriptors` of a request's pages read once (`RequestPages`): a layer group's
    /// slice reuses the pages' runs; a slice of tokens finds its own pages' runs.
    pub fn request_strided(
        &self,
        pages: &RequestPages<'_>,
        selection: &Selection,
        slice: &TokenSlice,
    ) -> PlanResult<Strided> {
        let (src_pages, dst_pages) = (pages.src(), pages.dst());
        if slice.is_whole() {
            let chosen: Vec<&Placed> = self.selected(selection).map(|(_, p)| p).collect();
            return descriptors::build_placed_strided_in(&chosen, pages);
        }
        let mut out = Strided::default();
        for (pairs, list) in self.slice_parts(src_pages.len(), dst_pages.len(), selection, slice)? {
            let (src, dst) = (&src_pages[pairs.clone()], &dst_pages[pairs]);
            out.append(descriptors::build_placed_strided(&list, src, dst)?);
        }
        Ok(out)
    }

    /// The selected fragments of one slice, each with the page pairs it moves; consecutive
    /// fragments that move the same pairs go together, so that they coalesce. Empty ranges
    /// are left out.
    fn slice_parts<'a>(
        &'a self,
        src_pairs: usize,
        dst_pairs: usize,
        selection: &'a Selection,
        slice: &TokenSlice,
    ) -> PlanResult<Vec<(Range<usize>, Vec<&'a Placed>)>> {
        // A prefill still running holds fewer pages than the decode side it streams to: pages
        // pair from the first, and a slice past the shorter table is refused (`page_range`).
        let pairs = src_pairs.min(dst_pairs);
        let mut runs: Vec<(Range<usize>, Vec<&Placed>)> = Vec::new();
        for (position, placed) in self.selected(selection) {
            let f = self.fragments.get(position).copied().unwrap_or_default();
            if f.page_count.is_some() || f.src_page_size != f.dst_page_size {
                bail!(
                    "fragment {position} (buffer_index={}) limits itself to page_count pages or \
                     pairs pages of different sizes, which slices by pages do not split; move \
                     its slices by slot maps (token_descriptors)",
                    f.buffer_index
                );
            }
            let moved = if f.buffer_kind != BufferKind::MambaState {
                let at = |t: u64| usize::try_from(t).map_or(pairs, |t| t.min(pairs));
                // Page plans' fragments carry no page size: the buffer's, where known.
                let page_size = match (f.src_page_size, self.facts_of(f.buffer_index)) {
                    (0, Some(facts)) => facts.page_size,
                    (size, _) => size,
                };
                let (first, stop) = slice.page_range(
                    pairs as u64,
                    page_size,
                    f.sliding_window,
                    f.attention_chunk_size,
                )?;
                at(first)..at(stop)
            } else if slice.ends_prompt() {
                0..pairs
            } else {
                0..0
            };
            match runs.last_mut() {
                Some((same, list)) if *same == moved => list.push(placed),
                _ => runs.push((moved, vec![placed])),
            }
        }
        runs.retain(|(moved, _)| !moved.is_empty());
        Ok(runs)
    }

    /// The lists to prepare once per peer: every fragment row over `src_capacity` and
    /// `dst_capacity` pages, checked against the limits; device id 0 (host memory).
    pub fn prepped_lists(&self, src_capacity: u64, dst_capacity: u64) -> PlanResult<PreppedLists> {
        let rows: u64 = self.placed.iter().map(Placed::rows).sum();
        for capacity in [src_capacity, dst_capacity] {
            if capacity == 0 {
                bail!("prepared lists need at least one page on each side, got 0");
            }
            if rows
                .checked_mul(capacity)
                .is_none_or(|n| n > i32::MAX as u64)
            {
                bail!(
                    "prepared lists of {rows} rows x {capacity} pages do not fit NIXL's 32-bit \
                     descriptor indices; prepare fewer fragments or pages per list"
                );
            }
        }
        // The last page of every row must stay inside the buffers: build one descriptor each.
        descriptors::build_placed(
            &self.placed,
            &[src_capacity - 1],
            &[dst_capacity - 1],
            false,
        )?;
        Ok(PreppedLists {
            src: self
                .placed
                .iter()
                .flat_map(|p| p.strided_rows(false, src_capacity))
                .collect(),
            dst: self
                .placed
                .iter()
                .flat_map(|p| p.strided_rows(true, dst_capacity))
                .collect(),
        })
    }

    /// One request as indices into `prepped_lists(src_capacity, dst_capacity)`: local (src)
    /// and remote (dst) index arrays, in `descriptors(.., coalesce=false)` order.
    pub fn prepped_indices(
        &self,
        src_pages: &[u64],
        dst_pages: &[u64],
        selection: &Selection,
        (src_capacity, dst_capacity): (u64, u64),
    ) -> PlanResult<(Vec<i32>, Vec<i32>)> {
        descriptors::check_paired(src_pages, dst_pages)?;
        for (_, placed) in self.selected(selection) {
            placed.check_pages_pair()?;
        }
        for (name, pages, capacity) in [
            ("src", src_pages, src_capacity),
            ("dst", dst_pages, dst_capacity),
        ] {
            if let Some(page) = pages.iter().find(|&&p| p >= capacity) {
                bail!("{name} page {page} is past the {capacity} pages the prepared lists cover");
            }
        }
        let total = self.descriptor_count(src_pages.len(), selection);
        descriptors::check_descriptor_count(total)?;
        let total = usize::try_from(total).unwrap_or(0);
        let (mut src, mut dst) = (Vec::with_capacity(total), Vec::with_capacity(total));
        let mut first_row = 0u64;
        let mut row_of = Vec::with_capacity(self.placed.len());
        for p in &self.placed {
            row_of.push(first_row);
            first_row += p.rows();
        }
        for (position, placed) in self.selected(selection) {
            let base_row = row_of.get(position).copied().unwrap_or(0);
            let used = placed.pages_used(src_pages.len());
            for (&sp, &dp) in src_pages.iter().zip(dst_pages).take(used) {
                for row in base_row..base_row + placed.rows() {
                    // Below i32::MAX: rows x capacity was checked when the lists were made, and
                    // every page is below its capacity.
                    src.push(i32::try_from(row * src_capacity + sp).unwrap_or(i32::MAX));
                    dst.push(i32::try_from(row * dst_capacity + dp).unwrap_or(i32::MAX));
                }
            }
        }
        Ok((src, dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BufferKind;

    #[test]
    fn a_range_holds_what_python_s_range_names() {
        let edges = [
            i64::MIN,
            i64::MIN + 1,
            -70,
            -3,
            -1,
            0,
            1,
            2,
            5,
            64,
            70,
            i64::MAX - 1,
            i64::MAX,
        ];
        let steps = [1, 2, 3, 7, -1, -2, -5, i64::MAX, i64::MIN];
        let probes = [
            0,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            63,
            64,
            65,
            69,
            70,
            1 << 62,
            (1 << 63) - 1,
            u64::MAX,
        ];
        let ranges = edges
            .iter()
            .flat_map(|&a| edges.iter().map(move |&b| (a, b)))
            .flat_map(|(a, b)| steps.iter().map(move |&c| (a, b, c)));
        for (start, stop, step) in ranges {
            let set = Selection::Range { start, stop, step };
            for &probe in &probes {
                // Python's rule, in exact arithmetic: start + k * step for some k >= 0, before stop.
                let (at, first, end, stride) = (
                    i128::from(probe),
                    i128::from(start),
                    i128::from(stop),
                    i128::from(step),
                );
                let steps_in = (at - first) / stride;
                let before_stop = if stride > 0 { at < end } else { at > end };
                let named = (at - first) % stride == 0 && steps_in >= 0 && before_stop;
                assert_eq!(
                    set.contains(probe),
                    named,
                    "range({start}, {stop}, {step}) {probe}"
                );
                // Its span holds every member, and exactly its members where it says so.
                let ((low, high), exact) = set.span();
                let inside = low <= probe && probe <= high;
                assert!(
                    !named || inside,
                    "range({start}, {stop}, {step}) spans {low}..={high}"
                );
                assert!(
                    !exact || named == inside,
                    "range({start}, {stop}, {step}) {probe}"
                );
            }
        }
    }

    fn fragment(buffer_index: u64, rows: u64) -> Fragment {
        Fragment {
            buffer_index,
            buffer_kind: BufferKind::TargetK,
            src_rank: 0,
            dst_rank: 0,
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 128,
            src_byte_offset: 8,
            dst_byte_offset: 16,
            bytes_per_page: 8 * rows,
            rows_per_page: rows,
            src_row_stride_bytes: if rows > 1 { 16 } else { 0 },
            dst_row_stride_bytes: if rows > 1 { 32 } else { 0 },
            ..Fragment::default()
        }
    }

    fn prepared(fragments: Vec<Fragment>) -> Prepared {
        let buffers = |base: u64| Buffers {
            bases: vec![base, base + 100_000, base + 200_000],
            limits: Some(vec![64 * 100; 3]),
        };
        Prepared::new(fragments.into(), &buffers(1 << 20), &buffers(1 << 30)).unwrap()
    }

    #[test]
    fn a_selection_moves_its_buffers_in_fragment_order() {
        let p = prepared(vec![fragment(0, 1), fragment(1, 2), fragment(2, 1)]);
        let all = p.descriptors(&[3], &[4], &Selection::All, false).unwrap();
        assert_eq!(all.len(), 4);
        // range(2, -1, -2) == [2, 0]
        let range = Selection::Range {
            start: 2,
            stop: -1,
            step: -2,
        };
        assert!(range.contains(2) && range.contains(0) && !range.contains(1));
        let some = p.descriptors(&[3], &[4], &range, false).unwrap();
        assert_eq!(some.src_addrs, vec![all.src_addrs[0], all.src_addrs[3]]);
        let listed = p
            .descriptors(&[3], &[4], &Selection::indices(vec![1]), false)
            .unwrap();
        assert_eq!(listed.src_addrs, all.src_addrs[1..3].to_vec());
    }

    #[test]
    fn missing_bases_are_refused_once() {
        let buffers = Buffers {
            bases: vec![0],
            limits: None,
        };
        let err = Prepared::new(vec![fragment(1, 1)].into(), &buffers, &buffers).unwrap_err();
        assert!(err.message().contains("src_base_ptrs has 1"), "{err}");
    }

    #[test]
    fn prepped_indices_address_the_same_descriptors() {
        let p = prepared(vec![fragment(0, 1), fragment(2, 2)]);
        let (src_cap, dst_cap) = (50, 40);
        let lists = p.prepped_lists(src_cap, dst_cap).unwrap();
        assert_eq!(lists.src.len(), 3);
        let (pages_src, pages_dst) = ([7, 1], [0, 39]);
        let (si, di) = p
            .prepped_indices(&pages_src, &pages_dst, &Selection::All, (src_cap, dst_cap))
            .unwrap();
        let direct = p
            .descriptors(&pages_src, &pages_dst, &Selection::All, false)
            .unwrap();
        // Row `index / count` of a strided list, page `index % count`.
        let expand = |list: &[[u64; 5]], index: i32| {
            let index = u64::try_from(index).unwrap();
            let count = list[0][4];
            let [address, len, _, stride, _] = list[usize::try_from(index / count).unwrap()];
            (address + (index % count) * stride, len)
        };
        for i in 0..direct.len() {
            assert_eq!(
                expand(&lists.src, si[i]),
                (direct.src_addrs[i], direct.lengths[i])
            );
            assert_eq!(
                expand(&lists.dst, di[i]),
                (direct.dst_addrs[i], direct.lengths[i])
            );
        }
        assert!(p
            .prepped_indices(&[50], &[0], &Selection::All, (src_cap, dst_cap))
            .is_err());
        assert!(p.prepped_lists(101, 40).is_err()); // past the 6,400-byte limits
    }
}
