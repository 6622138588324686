//! Per-request descriptors by token: fragments with token geometry x a request's slot maps ->
//! (src address, dst address, length), bounds-checked before anything is written.
//!
//! A slot map gives, for each token of the request in order, its slot on one rank
//! (`page * page_size + position in page`) or -1 where that rank holds no slot for it. Token
//! `t` moves iff both its slots are >= 0 and, for a fragment with a sliding window `w` of a
//! request of `n` tokens, `t >= n - w` (with an attention chunk `c`, `t >= (n / c) * c`); a
//! slice of the request (`slices` module) moves only its tokens of those. The tokens that move
//! split into *segments*: runs of
//! consecutive tokens whose slots both advance by one inside one page on each side.
//!
//! Order: fragments as given, then segments in token order, then a fragment's runs (a unit,
//! or a plane), then tokens. Within one (fragment, segment) neighbours that continue each
//! other on both sides always merge (a unit's slots inside a page, rows that are whole on both
//! sides); with `coalesce`, neighbours across segments and fragments of one buffer merge too.

use std::borrow::Borrow;
use std::mem::MaybeUninit;

use crate::descriptors::{
    check_descriptor_count, split_in_half, Buffers, Descriptors, Placement, Strided,
};
use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::slices::TokenSlice;
use crate::token_scan::{check_slot_lengths, check_slot_values, segments, Segment, Segments};

/// One side of a placed token fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TokenSide {
    placement: Placement,
    token_stride: u64,
    run_stride: u64,
}

/// A fragment with token geometry placed in its two buffers, checked once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPlaced {
    position: usize,
    buffer_index: u64,
    page_sizes: (u64, u64),
    runs: u64,
    run_bytes: u64,
    /// A run's tokens lie one after another on both sides: one descriptor per segment.
    contiguous: bool,
    /// Refused per request (slot maps select tokens), not when placed, so that the page path
    /// of the same prepared transfer keeps working.
    page_count: Option<u64>,
    /// A sliding-window buffer's window, a chunked buffer's chunk: which of a request's
    /// tokens move (`layout::first_kept_token`).
    window: Option<u64>,
    chunk: Option<u64>,
    src: TokenSide,
    dst: TokenSide,
}

impl TokenPlaced {
    pub const fn buffer_index(&self) -> u64 {
        self.buffer_index
    }
}

/// What a fragment without token geometry is, for the refusal.
pub fn untokenized<T>(position: usize, f: &Fragment, any_tokenized: bool) -> PlanResult<T> {
    if any_tokenized {
        bail!(
            "fragment {position} (buffer_index={}) carries no token geometry: it is a state \
             buffer, which is not indexed by token; leave it out with buffers= and move it with \
             descriptors(src_pages, dst_pages, buffers=...)",
            f.buffer_index
        );
    }
    bail!(
        "fragment {position} (buffer_index={}) carries no token geometry; plan with \
         PDTransferPlanner(..., token_maps=True) to move tokens by slot maps",
        f.buffer_index
    );
}

/// Places a validated fragment for slot maps (`any_tokenized`: whether its list has token
/// geometry at all, for the message when this one has none).
pub fn place_tokens(
    position: usize,
    f: &Fragment,
    (src, dst): (&Buffers, &Buffers),
    any_tokenized: bool,
) -> PlanResult<TokenPlaced> {
    if !f.token_span().is_present() {
        return untokenized(position, f, any_tokenized);
    }
    let (src_runs, dst_runs) = (f.src_token_runs(), f.dst_token_runs());
    let side = |buffers: &Buffers, name: &str, runs: crate::page::TokenRuns, stride| {
        let (base, limit) = buffers.base_and_limit(name, position, f.buffer_index)?;
        let Some(reach) = runs.reach().filter(|r| base.checked_add(*r).is_some()) else {
            bail!("fragment {position}: base + the token runs of a page overflow 64 bits on the {name} side");
        };
        Ok(TokenSide {
            placement: Placement {
                base,
                offset: runs.offset,
                stride,
                row_stride: 0,
                reach,
                limit,
                max_page: None,
            }
            .with_max_page(),
            token_stride: runs.token_stride,
            run_stride: runs.run_stride,
        })
    };
    Ok(TokenPlaced {
        position,
        buffer_index: f.buffer_index,
        page_sizes: (f.src_page_size, f.dst_page_size),
        runs: f.token_runs,
        run_bytes: f.token_run_bytes,
        contiguous: src_runs.tokens_contiguous() && dst_runs.tokens_contiguous(),
        page_count: f.page_count,
        window: f.sliding_window,
        chunk: f.attention_chunk_size,
        src: side(src, "src", src_runs, f.src_page_stride_bytes)?,
        dst: side(dst, "dst", dst_runs, f.dst_page_stride_bytes)?,
    })
}

/// Places every fragment of a validated list for slot maps.
pub fn place_all_tokens<F: Borrow<Fragment>>(
    fragments: &[F],
    src: &Buffers,
    dst: &Buffers,
) -> PlanResult<Vec<TokenPlaced>> {
    crate::descriptors::check_one_reading(fragments)?;
    let any = fragments
        .iter()
        .any(|f| f.borrow().token_span().is_present());
    fragments
        .iter()
        .enumerate()
        .map(|(position, f)| place_tokens(position, f.borrow(), (src, dst), any))
        .collect()
}

/// What a fragment's descriptors look like apart from where its bytes start: its page sizes,
/// runs and strides. Fragments of one shape (K and V of every layer, as a rule) share one
/// template per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    page_sizes: (u64, u64),
    runs: u64,
    run_bytes: u64,
    contiguous: bool,
    /// Per side: page stride, token stride, run stride.
    src: (u64, u64, u64),
    dst: (u64, u64, u64),
}

impl TokenPlaced {
    fn shape(&self) -> Shape {
        let side = |s: &TokenSide| (s.placement.stride, s.token_stride, s.run_stride);
        Shape {
            page_sizes: self.page_sizes,
            runs: self.runs,
            run_bytes: self.run_bytes,
            contiguous: self.contiguous,
            src: side(&self.src),
            dst: side(&self.dst),
        }
    }

    /// Where the fragment's bytes start on each side: added to a template's offsets.
    const fn starts(&self) -> (u64, u64) {
        (
            self.src.placement.base + self.src.placement.offset,
            self.dst.placement.base + self.dst.placement.offset,
        )
    }
}

/// One shape's descriptors for one request, as offsets from where a fragment's bytes start,
/// merged inside segments (and across them with `coalesce`): a fragment's descriptors are the
/// template plus its starts, because adding one start to both ends keeps every continuation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Template {
    src: Vec<u64>,
    dst: Vec<u64>,
    len: Vec<u64>,
}

impl Template {
    fn push(&mut self, (src, dst, len): (u64, u64, u64), may_join: bool) {
        if let (Some(s), Some(d), Some(l)) = (self.src.last(), self.dst.last(), self.len.last_mut())
        {
            // Offsets stay inside one page's reach, checked against 64 bits when placed.
            if may_join && s + *l == src && d + *l == dst {
                *l += len;
                return;
            }
        }
        self.src.push(src);
        self.dst.push(dst);
        self.len.push(len);
    }

    /// The descriptors of `shape` over a request's segments, in order: segments, then runs,
    /// then tokens.
    fn of(shape: &Shape, segments: &[Segment], coalesce: bool) -> Self {
        let mut out = Self::default();
        let (src, dst) = (shape.src, shape.dst);
        for (k, seg) in segments.iter().enumerate() {
            let s0 = seg.src_page * src.0 + seg.src_position * src.1;
            let d0 = seg.dst_page * dst.0 + seg.dst_position * dst.1;
            for run in 0..shape.runs {
                let (s, d) = (s0 + run * src.2, d0 + run * dst.2);
                // Inside a segment neighbours always merge; across segments with `coalesce`.
                let may_join = run > 0 || (k > 0 && coalesce);
                if shape.contiguous {
                    out.push((s, d, seg.tokens * shape.run_bytes), may_join);
                    continue;
                }
                for token in 0..seg.tokens {
                    let at = (s + token * src.1, d + token * dst.1, shape.run_bytes);
                    out.push(at, may_join || token > 0);
                }
            }
        }
        out
    }

    fn count(&self) -> usize {
        self.len.len()
    }
}

/// Writes descriptors into three columns: each fragment's template plus its starts, its first
/// descriptor merged into the one before it where allowed and it continues it.
struct Emitter<'a> {
    src: &'a mut [MaybeUninit<u64>],
    dst: &'a mut [MaybeUninit<u64>],
    len: &'a mut [MaybeUninit<u64>],
    written: usize,
    /// The last descriptor written, its buffer, and the first one's buffer.
    last: Option<(u64, u64, u64)>,
    last_buffer: Option<u64>,
    first_buffer: Option<u64>,
}

impl<'a> Emitter<'a> {
    fn new(
        src: &'a mut [MaybeUninit<u64>],
        dst: &'a mut [MaybeUninit<u64>],
        len: &'a mut [MaybeUninit<u64>],
    ) -> Self {
        Self {
            src,
            dst,
            len,
            written: 0,
            last: None,
            last_buffer: None,
            first_buffer: None,
        }
    }

    /// One fragment's descriptors: `template` plus the fragment's starts.
    fn fragment(&mut self, f: &TokenPlaced, template: &Template, coalesce: bool) {
        let (src_start, dst_start) = f.starts();
        let (Some(&s), Some(&d), Some(&l)) = (
            template.src.first(),
            template.dst.first(),
            template.len.first(),
        ) else {
            return;
        };
        let (s, d) = (src_start + s, dst_start + d);
        let mut at = self.written;
        let joins = coalesce && self.last_buffer == Some(f.buffer_index);
        match self.last {
            // Both ends were bounds-checked inside 64 bits, so the sums cannot wrap.
            Some((ls, ld, ll)) if joins && ls + ll == s && ld + ll == d && at > 0 => {
                if let Some(slot) = self.len.get_mut(at - 1) {
                    slot.write(ll + l);
                }
                self.last = Some((ls, ld, ll + l));
            }
            _ => {
                if let (Some(a), Some(b), Some(c)) = (
                    self.src.get_mut(at),
                    self.dst.get_mut(at),
                    self.len.get_mut(at),
                ) {
                    a.write(s);
                    b.write(d);
                    c.write(l);
                    at += 1;
                }
                self.last = Some((s, d, l));
            }
        }
        let end = at + (template.count() - 1);
        if let (Some(src), Some(dst), Some(len)) = (
            self.src.get_mut(at..end),
            self.dst.get_mut(at..end),
            self.len.get_mut(at..end),
        ) {
            // Column by column, as the page path fills them: one stream at a time.
            for (out, &offset) in src.iter_mut().zip(&template.src[1..]) {
                out.write(src_start + offset);
            }
            for (out, &offset) in dst.iter_mut().zip(&template.dst[1..]) {
                out.write(dst_start + offset);
            }
            for (out, &length) in len.iter_mut().zip(&template.len[1..]) {
                out.write(length);
            }
            if let (Some(&os), Some(&od), Some(&ol)) = (
                template.src.last(),
                template.dst.last(),
                template.len.last(),
            ) {
                if end > at {
                    self.last = Some((src_start + os, dst_start + od, ol));
                }
            }
            at = end;
        }
        self.written = at;
        self.first_buffer = self.first_buffer.or(Some(f.buffer_index));
        self.last_buffer = Some(f.buffer_index);
    }

    /// How many were written, and the buffers of the first and the last.
    const fn finish(self) -> (usize, Option<u64>, Option<u64>) {
        (self.written, self.first_buffer, self.last_buffer)
    }
}

/// Below this many descriptors one thread writes them; above it, two.
const PARALLEL_FROM: u64 = 1 << 16;

/// Page sizes on each side and the tokens moved: what a request's segments depend on.
type SegmentsKey = ((u64, u64), (usize, usize));

/// A template's shape and the tokens it moves, with the template.
type Keyed = ((Shape, (usize, usize)), Template);

/// One request's templates, which template each fragment uses, and the descriptor counts.
struct Request {
    templates: Vec<Keyed>,
    which: Vec<usize>,
    counts: Vec<u64>,
    total: u64,
    /// The segments scanned every slot from token 0 and found none below -1.
    values_cleared: bool,
}

impl Request {
    /// Checks every fragment against the request's largest pages and the descriptor limit,
    /// and builds the templates.
    fn of<P: Borrow<TokenPlaced>>(
        placed: &[P],
        (src_slots, dst_slots): (&[i64], &[i64]),
        coalesce: bool,
        slice: &TokenSlice,
    ) -> PlanResult<Self> {
        // Segments per pair of page sizes and tokens moved (windows start late, slices end
        // early), templates per shape and tokens moved (one of each in most plans).
        let mut by_sizes: Vec<(SegmentsKey, Segments)> = Vec::new();
        let mut templates: Vec<Keyed> = Vec::new();
        let mut which = Vec::with_capacity(placed.len());
        let mut counts = Vec::with_capacity(placed.len());
        let mut total: u64 = 0;
        for p in placed.iter().map(Borrow::borrow) {
            if let Some(count) = p.page_count {
                bail!(
                    "fragment {} limits itself to page_count={count} pages, which slot maps do \
                     not use; select tokens with -1 slots instead",
                    p.position
                );
            }
            // A window keeps the request's last tokens, a chunk its current chunk; a slice
            // its newly final tokens past the decode side's prefix.
            let n = src_slots.len();
            let (first, stop) = slice.token_range(n as u64, p.window, p.chunk)?;
            let index = |t: u64| usize::try_from(t).map_or(n, |t| t.min(n));
            let (first, stop) = (index(first), index(stop));
            let key = (p.page_sizes, (first, stop));
            let found = by_sizes.iter().position(|(k, _)| *k == key);
            let at = found.unwrap_or_else(|| {
                let (src, dst) = (&src_slots[first..stop], &dst_slots[first..stop]);
                by_sizes.push((key, segments(src, dst, p.page_sizes)));
                by_sizes.len() - 1
            });
            let segs = &by_sizes[at].1;
            if !segs.list.is_empty() {
                let who = (p.position, p.buffer_index, p.run_bytes);
                p.src.placement.check("src", who, segs.largest_src_page)?;
                p.dst.placement.check("dst", who, segs.largest_dst_page)?;
            }
            let shape = (p.shape(), (first, stop));
            let known = templates.iter().position(|(s, _)| *s == shape);
            let template = if let Some(template) = known {
                template
            } else {
                // Bounded before it is built: one fragment's share of the limit.
                let unmerged = if shape.0.contiguous {
                    segs.list.len() as u64
                } else {
                    segs.tokens
                };
                check_descriptor_count(unmerged.saturating_mul(shape.0.runs))?;
                templates.push((shape, Template::of(&shape.0, &segs.list, coalesce)));
                templates.len() - 1
            };
            let count = templates[template].1.count() as u64;
            total = total.saturating_add(count);
            check_descriptor_count(total)?;
            which.push(template);
            counts.push(count);
        }
        let whole = |(first, stop): (usize, usize)| first == 0 && stop == src_slots.len();
        let values_cleared = by_sizes.iter().any(|((_, moved), _)| whole(*moved))
            && by_sizes.iter().all(|(_, segments)| !segments.suspicious);
        Ok(Self {
            templates,
            which,
            counts,
            total,
            values_cleared,
        })
    }
}

/// Builds the descriptors of placed token fragments for one request's slot maps, or refuses
/// before producing any.
pub fn build_tokens<P: Borrow<TokenPlaced>>(
    placed: &[P],
    src_slots: &[i64],
    dst_slots: &[i64],
    coalesce: bool,
) -> PlanResult<Descriptors> {
    Ok(plan_tokens(placed, src_slots, dst_slots, coalesce)?.write())
}

/// One request's token descriptors checked and planned, not yet written: everything that
/// reads the slot maps (checks, segments, templates) is done, so the maps may go before the
/// descriptors are written (the binding reads them in place, then writes without the GIL).
pub struct PlannedTokens<'a> {
    placed: Vec<&'a TokenPlaced>,
    request: Request,
    coalesce: bool,
}

/// Checks and plans one request's token descriptors over `placed`, or refuses.
pub fn plan_tokens<'a, P: Borrow<TokenPlaced>>(
    placed: &'a [P],
    src_slots: &[i64],
    dst_slots: &[i64],
    coalesce: bool,
) -> PlanResult<PlannedTokens<'a>> {
    let placed = placed.iter().map(Borrow::borrow).collect();
    plan_tokens_of(
        placed,
        src_slots,
        dst_slots,
        coalesce,
        &TokenSlice::default(),
    )
}

/// `plan_tokens` over fragments already chosen by reference, for one slice of the request
/// (`slices` module; the default is the whole request).
pub fn plan_tokens_of<'a>(
    placed: Vec<&'a TokenPlaced>,
    src_slots: &[i64],
    dst_slots: &[i64],
    coalesce: bool,
    slice: &TokenSlice,
) -> PlanResult<PlannedTokens<'a>> {
    check_slot_lengths(src_slots, dst_slots)?;
    // Segments treat every negative slot as lacking, and note any below -1 as they scan; the
    // values are checked (and a bad one named) only when the scan did not clear them all.
    let request = Request::of(&placed, (src_slots, dst_slots), coalesce, slice)
        .map_err(|e| check_slot_values(src_slots, dst_slots).err().unwrap_or(e))?;
    if !request.values_cleared {
        check_slot_values(src_slots, dst_slots)?;
    }
    Ok(PlannedTokens {
        placed,
        request,
        coalesce,
    })
}

impl PlannedTokens<'_> {
    /// How many descriptors `write` makes at most (before merging across fragments).
    pub const fn total(&self) -> u64 {
        self.request.total
    }

    /// The descriptors.
    pub fn write(self) -> Descriptors {
        write_planned(&self.placed, self.request, self.coalesce)
    }

    /// The planned descriptors as strided entries: each template compressed once, then
    /// placed at every fragment that uses it (one fragment's entries never merge into
    /// another's, as buffers are registered apart).
    pub fn write_strided(self) -> Strided {
        let templates = &self.request.templates;
        let compressed: Vec<Strided> = templates
            .iter()
            .map(|(_, t)| Strided::of_columns(&t.src, &t.dst, &t.len))
            .collect();
        let mut out = Strided::default();
        for (p, &at) in self.placed.iter().zip(&self.request.which) {
            if let Some(entries) = compressed.get(at) {
                let (src_start, dst_start) = p.starts();
                out.append_shifted(entries, src_start, dst_start);
            }
        }
        out
    }
}

fn write_planned(placed: &[&TokenPlaced], request: Request, coalesce: bool) -> Descriptors {
    let Request {
        templates,
        which,
        counts,
        total,
        ..
    } = request;
    let capacity = usize::try_from(total).unwrap_or(0);
    let mut out = Descriptors {
        src_addrs: Vec::with_capacity(capacity),
        dst_addrs: Vec::with_capacity(capacity),
        lengths: Vec::with_capacity(capacity),
    };
    let jobs: Vec<(&TokenPlaced, &Template)> = placed
        .iter()
        .copied()
        .zip(&which)
        .map(|(p, &at)| (p, &templates[at].1))
        .collect();
    let write = |jobs: &[(&TokenPlaced, &Template)], mut emitter: Emitter<'_>| {
        for (p, template) in jobs {
            emitter.fragment(p, template, coalesce);
        }
        emitter.finish()
    };
    let src = &mut out.src_addrs.spare_capacity_mut()[..capacity];
    let dst = &mut out.dst_addrs.spare_capacity_mut()[..capacity];
    let len = &mut out.lengths.spare_capacity_mut()[..capacity];
    let kept = if total < PARALLEL_FROM || jobs.len() < 2 {
        write(&jobs, Emitter::new(src, dst, len)).0
    } else {
        // Split the fragments where the running count passes half; each half merges inside
        // itself, then the halves join (the second moves down over what the first merged).
        // Counts add up to `capacity`, which fits usize.
        let (split, first) = split_in_half(counts.iter().map(|&c| usize::try_from(c).unwrap_or(0)));
        let (jobs_a, jobs_b) = jobs.split_at(split);
        let ((src_a, src_b), (dst_a, dst_b), (len_a, len_b)) = (
            src.split_at_mut(first),
            dst.split_at_mut(first),
            len.split_at_mut(first),
        );
        let ((kept_a, _, last_a), (kept_b, first_b, _)) = std::thread::scope(|scope| {
            let b = scope.spawn(|| write(jobs_b, Emitter::new(src_b, dst_b, len_b)));
            let a = write(jobs_a, Emitter::new(src_a, dst_a, len_a));
            (a, b.join().unwrap_or_default())
        });
        join_halves(
            (src, dst, len),
            (first, kept_a, kept_b),
            coalesce && kept_a > 0 && kept_b > 0 && last_a == first_b,
        )
    };
    // SAFETY: the emitters wrote the first `written` slots of their regions, each exactly
    // once, and `join_halves` moved the second region's written slots to follow the first's,
    // so the first `kept` slots of each column are initialised.
    unsafe {
        out.src_addrs.set_len(kept);
        out.dst_addrs.set_len(kept);
        out.lengths.set_len(kept);
    }
    out
}

type Columns<'a> = (
    &'a mut [MaybeUninit<u64>],
    &'a mut [MaybeUninit<u64>],
    &'a mut [MaybeUninit<u64>],
);

/// Moves the second half's `kept_b` descriptors (from slot `first`) to follow the first
/// half's `kept_a`, merging the first of them into the last of the first half where it
/// continues it and `may_join`; returns how many descriptors there are in all.
fn join_halves(
    (src, dst, len): Columns<'_>,
    (first, kept_a, kept_b): (usize, usize, usize),
    may_join: bool,
) -> usize {
    // SAFETY (reads): slots `kept_a - 1` and `first` were written by the two emitters
    // (`may_join` requires both halves to have written something).
    let read = |column: &[MaybeUninit<u64>], at: usize| unsafe { column[at].assume_init() };
    let mut from = first;
    let mut to = kept_a;
    if may_join {
        let (a, b) = (kept_a - 1, first);
        let a_len = read(len, a);
        if read(src, a) + a_len == read(src, b) && read(dst, a) + a_len == read(dst, b) {
            len[a].write(a_len + read(len, b));
            from += 1;
        }
    }
    let moved = first + kept_b - from;
    if from != to {
        src.copy_within(from..from + moved, to);
        dst.copy_within(from..from + moved, to);
        len.copy_within(from..from + moved, to);
    }
    to += moved;
    to
}

#[cfg(test)]
mod tests;
