//! Strided descriptors, NIXL 1.5's compressed form: `count` blocks of `length` bytes spaced
//! `stride` apart on each side. Written straight from the fragments by runs of pages whose ids
//! step by a constant on both sides (rows of a token-major page become one entry across a page
//! run, or one a row), or from any flat list in order (`Strided::push`).

use std::borrow::Cow;
use std::sync::OnceLock;

use super::{Descriptors, Job};

/// One strided entry: `count` descriptors of `length` bytes, the `k`-th from
/// `src + k * src_stride` to `dst + k * dst_stride`. An entry of one block has strides equal
/// to its length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    pub src: u64,
    pub dst: u64,
    pub length: u64,
    pub src_stride: u64,
    pub dst_stride: u64,
    pub count: u64,
}

/// A request's descriptors as strided entries, in order, as the two N x 5 lists NIXL 1.5
/// takes: rows `(address, length, device, stride, count)`, `src` and `dst` row for row,
/// device 0 (the caller names devices). No entry spans two buffers (engines register buffers
/// one by one), and an entry's blocks never overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strided {
    pub src: Vec<[u64; 5]>,
    pub dst: Vec<[u64; 5]>,
}

impl Strided {
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            src: Vec::with_capacity(rows),
            dst: Vec::with_capacity(rows),
        }
    }

    pub fn len(&self) -> usize {
        self.src.len()
    }

    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Entry `i` (`i < len()`).
    fn entry(&self, i: usize) -> Entry {
        let ([src, length, _, src_stride, count], [dst, _, _, dst_stride, _]) =
            (self.src[i], self.dst[i]);
        Entry {
            src,
            dst,
            length,
            src_stride,
            dst_stride,
            count,
        }
    }

    /// The entries, in order.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }

    fn write(&mut self, i: usize, e: Entry) {
        self.src[i] = [e.src, e.length, 0, e.src_stride, e.count];
        self.dst[i] = [e.dst, e.length, 0, e.dst_stride, e.count];
    }

    fn append_entry(&mut self, e: Entry) {
        self.src.push([e.src, e.length, 0, e.src_stride, e.count]);
        self.dst.push([e.dst, e.length, 0, e.dst_stride, e.count]);
    }

    /// The flat descriptors the entries stand for.
    pub fn blocks(&self) -> u64 {
        self.src.iter().map(|r| r[4]).fold(0, u64::saturating_add)
    }

    /// The bytes the entries move.
    pub fn total_bytes(&self) -> u64 {
        self.src
            .iter()
            .map(|r| r[1].saturating_mul(r[4]))
            .fold(0, u64::saturating_add)
    }

    /// Appends `count` blocks, merged into the last entry when they continue it and it is at
    /// or after `floor` (the first entry of the current buffer): blocks that touch on both
    /// sides become one block, and blocks that keep the last entry's spacing extend it.
    /// Callers pass addresses of bounds-checked descriptors, so no end or step wraps.
    pub fn push(&mut self, floor: usize, new: Entry) {
        if new.count == 0 {
            return;
        }
        // Blocks that touch on both sides are one block; one block's strides are its length.
        let (length, count) =
            if new.count > 1 && new.src_stride == new.length && new.dst_stride == new.length {
                (new.length * new.count, 1)
            } else {
                (new.length, new.count)
            };
        let new = if count == 1 {
            Entry::single(new.src, new.dst, length)
        } else {
            new
        };
        if let Some(last) = self.len().checked_sub(1).filter(|&i| i >= floor) {
            let mut entry = self.entry(last);
            if entry.merge(&new) {
                self.write(last, entry);
                return;
            }
        }
        self.append_entry(new);
    }

    /// Flat descriptors as they are, a row of one block each.
    pub fn one_row_each(flat: &Descriptors) -> Self {
        let mut out = Self::with_capacity(flat.lengths.len());
        for ((&s, &d), &len) in flat
            .src_addrs
            .iter()
            .zip(&flat.dst_addrs)
            .zip(&flat.lengths)
        {
            out.append_entry(Entry::single(s, d, len));
        }
        out
    }

    /// Descriptors of one buffer, in order, compressed.
    pub fn of_columns(src: &[u64], dst: &[u64], lengths: &[u64]) -> Self {
        let mut out = Self::default();
        for ((&s, &d), &len) in src.iter().zip(dst).zip(lengths) {
            out.push(0, Entry::single(s, d, len));
        }
        out
    }

    /// Appends `other`'s entries, never merged into this list's.
    pub fn append(&mut self, other: Self) {
        self.src.extend(other.src);
        self.dst.extend(other.dst);
    }

    /// Appends `other`'s entries moved by `src_start` and `dst_start` (entries of offsets
    /// placed at a fragment's bytes), never merged into this list's.
    pub fn append_shifted(&mut self, other: &Self, src_start: u64, dst_start: u64) {
        // The offsets plus the starts are descriptors bounds-checked inside 64 bits.
        let shift = |start: u64| move |r: &[u64; 5]| [r[0] + start, r[1], r[2], r[3], r[4]];
        self.src.extend(other.src.iter().map(shift(src_start)));
        self.dst.extend(other.dst.iter().map(shift(dst_start)));
    }

    /// The flat descriptors, entry by entry, block by block.
    pub fn expand(&self) -> Descriptors {
        let total = usize::try_from(self.blocks()).unwrap_or(usize::MAX);
        let mut out = Descriptors {
            src_addrs: Vec::with_capacity(total),
            dst_addrs: Vec::with_capacity(total),
            lengths: Vec::with_capacity(total),
        };
        for e in self.entries() {
            for k in 0..e.count {
                // Each block was a bounds-checked descriptor: its address fits 64 bits.
                out.src_addrs.push(e.src + k * e.src_stride);
                out.dst_addrs.push(e.dst + k * e.dst_stride);
                out.lengths.push(e.length);
            }
        }
        out
    }
}

impl Entry {
    const fn single(src: u64, dst: u64, length: u64) -> Self {
        Self {
            src,
            dst,
            length,
            src_stride: length,
            dst_stride: length,
            count: 1,
        }
    }

    /// Takes in `new`'s blocks when they continue this entry; whether it did.
    fn merge(&mut self, new: &Self) -> bool {
        let (s, d, len, count) = (new.src, new.dst, new.length, new.count);
        // A single block that the new one continues on both sides.
        if self.count == 1
            && count == 1
            && self.src + self.length == s
            && self.dst + self.length == d
        {
            *self = Self::single(self.src, self.dst, self.length + len);
            return true;
        }
        // Blocks never overlap inside an entry (engines may not read it as overlapping).
        let gap = len.max(1);
        if self.length != len || s < self.src + gap || d < self.dst + gap {
            return false;
        }
        let (step_s, step_d) = (s - self.src, d - self.dst);
        // The new blocks continue this entry's spacing.
        let spans = (
            self.src_stride.checked_mul(self.count),
            self.dst_stride.checked_mul(self.count),
        );
        let same_spacing = new.src_stride == self.src_stride && new.dst_stride == self.dst_stride;
        if self.count > 1 && spans == (Some(step_s), Some(step_d)) && (count == 1 || same_spacing) {
            self.count += count;
            return true;
        }
        // A single block and what follows it at one spacing.
        let spaced = new.src_stride == step_s && new.dst_stride == step_d;
        if self.count == 1 && (count == 1 || spaced) {
            self.src_stride = step_s;
            self.dst_stride = step_d;
            self.count = count + 1;
            return true;
        }
        false
    }
}

/// A run of page pairs whose ids step by `steps` on both sides (both at least 1): pairs
/// `start..start + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageRun {
    pub(super) start: usize,
    pub(super) count: usize,
    pub(super) steps: (u64, u64),
}

/// A request's page pairs, cut into runs with each side's largest page the first time a slice
/// needs them (a layer group's; a slice of tokens finds its own pages' runs), then kept for
/// every other: the pages and their runs are held together, so they always agree.
#[derive(Debug, Clone)]
pub struct RequestPages<'a> {
    src: Cow<'a, [u64]>,
    dst: Cow<'a, [u64]>,
    found: OnceLock<FoundRuns>,
}

/// The runs of a request's pairs and each side's largest page (None without pages).
type FoundRuns = (Vec<PageRun>, Option<(u64, u64)>);

impl<'a> RequestPages<'a> {
    /// Pages pair by position, the first `min(src, dst)` of them (a slice may pair a prefill's
    /// pages so far with a longer decode table; a whole request refuses tables of different
    /// lengths).
    pub fn new(src: Cow<'a, [u64]>, dst: Cow<'a, [u64]>) -> Self {
        Self {
            src,
            dst,
            found: OnceLock::new(),
        }
    }

    pub fn src(&self) -> &[u64] {
        &self.src
    }

    pub fn dst(&self) -> &[u64] {
        &self.dst
    }

    fn found(&self) -> &FoundRuns {
        self.found.get_or_init(|| {
            let runs = page_runs(&self.src, &self.dst);
            let largest = largest_pages(&runs, &self.src, &self.dst);
            (runs, largest)
        })
    }

    /// How many runs the pairs make.
    pub fn run_count(&self) -> usize {
        self.found().0.len()
    }

    pub(super) fn runs(&self) -> &[PageRun] {
        &self.found().0
    }

    pub(super) fn largest(&self) -> Option<(u64, u64)> {
        self.found().1
    }
}

/// The page pairs cut into maximal runs, greedily from the first.
pub(super) fn page_runs(src_pages: &[u64], dst_pages: &[u64]) -> Vec<PageRun> {
    let n = src_pages.len().min(dst_pages.len());
    let (src, dst) = (&src_pages[..n], &dst_pages[..n]);
    // A step of at least 1 and below 2^63 on both sides, rising without wrapping: a page
    // past 2^64 - 1 is no step of a run (its rows' addresses would wrap, and a run's last page
    // would not be its largest, the one bounds are checked at).
    let step = |i: usize| {
        let rising = |a: u64, b: u64| (b > a && b - a < 1 << 63).then(|| b - a);
        Some((rising(src[i], src[i + 1])?, rising(dst[i], dst[i + 1])?))
    };
    // Pages all below 2^63 on both sides (any request that fits its buffers): no wrapped
    // difference equals a step, so whole chunks may be compared by wrapping differences.
    let low = (src.iter().fold(0, |a, &p| a | p) | dst.iter().fold(0, |a, &p| a | p)) >> 63 == 0;
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let (mut count, mut steps) = (1, (1, 1));
        if let Some((s, d)) = (i + 1 < n).then(|| step(i)).flatten() {
            steps = (s, d);
            count = 1 + keeps_steps(&src[i..], &dst[i..], (s, d), low);
        }
        runs.push(PageRun {
            start: i,
            count,
            steps,
        });
        i += count;
    }
    runs
}

/// How many pairs after the first continue steps `src_step` and `dst_step` from the pair
/// before, on both sides: a chunk of pairs at a time where every page is `low` (below 2^63),
/// then pair by pair in the chunk that breaks (a run is most often the whole table).
fn keeps_steps(src: &[u64], dst: &[u64], (src_step, dst_step): (u64, u64), low: bool) -> usize {
    const CHUNK: usize = 16;
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &dst[..n]);
    let mut j = 0;
    if low && n > 1 {
        // A fold without a branch a pair: any difference from the steps leaves a bit set.
        let pairs = src[1..]
            .chunks_exact(CHUNK)
            .zip(src.chunks_exact(CHUNK))
            .zip(dst[1..].chunks_exact(CHUNK).zip(dst.chunks_exact(CHUNK)));
        for ((src_next, src_at), (dst_next, dst_at)) in pairs {
            let off = src_next
                .iter()
                .zip(src_at)
                .zip(dst_next.iter().zip(dst_at))
                .fold(0, |off, ((&sn, &sa), (&dn, &da))| {
                    off | (sn.wrapping_sub(sa) ^ src_step) | (dn.wrapping_sub(da) ^ dst_step)
                });
            if off != 0 {
                break;
            }
            j += CHUNK;
        }
    }
    while j + 1 < n
        && src[j + 1] > src[j]
        && dst[j + 1] > dst[j]
        && src[j + 1] - src[j] == src_step
        && dst[j + 1] - dst[j] == dst_step
    {
        j += 1;
    }
    j
}

/// Each side's largest page, from its runs: a run's pages rise, so its largest is its last
/// (None without pages).
pub(super) fn largest_pages(runs: &[PageRun], src: &[u64], dst: &[u64]) -> Option<(u64, u64)> {
    let last = |pages: &[u64], run: &PageRun| pages.get(run.start + run.count - 1).copied();
    runs.iter()
        .try_fold(None, |most: Option<(u64, u64)>, run| {
            let (s, d) = (last(src, run)?, last(dst, run)?);
            Some(Some(most.map_or((s, d), |(ms, md)| (ms.max(s), md.max(d)))))
        })?
}

impl Job<'_> {
    /// This job's descriptors as strided entries, over `runs` of its page pairs (runs of the
    /// request's pairs, clipped to the pairs this job uses).
    /// Entries from `floor` on (this buffer's) may take in its blocks.
    pub(super) fn write_strided(&self, runs: &[PageRun], floor: usize, out: &mut Strided) {
        let used = self.src_pages.len();
        // Rows that touch on both sides are one block a page.
        let contiguous = self.len == self.src_row_stride && self.len == self.dst_row_stride;
        let (rows, len) = if self.rows > 1 && contiguous {
            (1, self.len * self.rows as u64)
        } else {
            (self.rows as u64, self.len)
        };
        let (rs, rd) = (self.src_row_stride, self.dst_row_stride);
        for run in runs {
            if run.start >= used {
                break;
            }
            let count = run.count.min(used - run.start) as u64;
            // Pages were checked against the limits, so every address and step fits 64 bits.
            let s0 = self.src_start + self.src_pages[run.start] * self.src_stride;
            let d0 = self.dst_start + self.dst_pages[run.start] * self.dst_stride;
            let (ps, pd) = (run.steps.0 * self.src_stride, run.steps.1 * self.dst_stride);
            if rows == 1 {
                push_spaced(out, floor, (s0, d0, len, ps, pd, count));
            } else if count > 1
                && rows.checked_mul(rs) == Some(ps)
                && rows.checked_mul(rd) == Some(pd)
            {
                // Rows of one page continue into the next page's: one progression.
                push_spaced(out, floor, (s0, d0, len, rs, rd, rows * count));
            } else if rows <= count {
                for r in 0..rows {
                    push_spaced(out, floor, (s0 + r * rs, d0 + r * rd, len, ps, pd, count));
                }
            } else {
                for k in 0..count {
                    push_spaced(out, floor, (s0 + k * ps, d0 + k * pd, len, rs, rd, rows));
                }
            }
        }
    }
}

/// `Strided::push`, but blocks closer than their length on a side (a page or row stride of 0,
/// say) are written one by one: an entry's blocks never overlap.
fn push_spaced(out: &mut Strided, floor: usize, (s, d, len, ss, ds, count): Spaced) {
    if count > 1 && (ss < len.max(1) || ds < len.max(1)) {
        for k in 0..count {
            out.push(floor, Entry::single(s + k * ss, d + k * ds, len));
        }
    } else {
        out.push(
            floor,
            Entry {
                src: s,
                dst: d,
                length: len,
                src_stride: ss,
                dst_stride: ds,
                count,
            },
        );
    }
}

/// `(src, dst, length, src stride, dst stride, count)`.
type Spaced = (u64, u64, u64, u64, u64, u64);

#[cfg(test)]
mod tests {
    use super::{page_runs, PageRun};

    /// Runs cut pair by pair: the greedy maximal runs, from first principles.
    fn runs_one_by_one(src: &[u64], dst: &[u64]) -> Vec<(usize, usize)> {
        let n = src.len().min(dst.len());
        let rising = |a: u64, b: u64| b > a && b - a < 1 << 63;
        let mut out = Vec::new();
        let mut i = 0;
        while i < n {
            let mut end = i + 1;
            if end < n && rising(src[i], src[end]) && rising(dst[i], dst[end]) {
                let steps = (src[end] - src[i], dst[end] - dst[i]);
                while end + 1 < n
                    && rising(src[end], src[end + 1])
                    && rising(dst[end], dst[end + 1])
                    && src[end + 1] - src[end] == steps.0
                    && dst[end + 1] - dst[end] == steps.1
                {
                    end += 1;
                }
                end += 1;
            }
            out.push((i, end - i));
            i = end;
        }
        out
    }

    #[test]
    fn runs_are_the_greedy_maximal_runs() {
        // A fixed-seed generator: tables of runs of random steps and lengths, some broken.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for _ in 0..2000 {
            let (mut src, mut dst) = (Vec::new(), Vec::new());
            let (mut s, mut d) = (next(50), next(50));
            while src.len() < usize::try_from(next(90)).unwrap_or(0) {
                let (ss, ds) = (next(4), next(3));
                for _ in 0..next(40) {
                    src.push(s);
                    dst.push(d);
                    (s, d) = (s + ss, d + ds);
                }
                if next(3) == 0 {
                    s = s.saturating_sub(next(7));
                }
            }
            dst.truncate(dst.len() - usize::try_from(next(2)).unwrap_or(0).min(dst.len()));
            // Ids that wrap: past 2^64 - 1 the next page is 0, one step on in wrapping terms.
            if next(4) == 0 && src.len() > 2 {
                let at = usize::try_from(next(src.len() as u64 - 1)).unwrap_or(0);
                src[at] = u64::MAX - next(2);
            }
            let got: Vec<(usize, usize)> = page_runs(&src, &dst)
                .iter()
                .map(|r: &PageRun| (r.start, r.count))
                .collect();
            assert_eq!(got, runs_one_by_one(&src, &dst), "{src:?} {dst:?}");
        }
        // The last id, then 0: one step of 1 in wrapping terms, no run here.
        let wrapping = page_runs(&[u64::MAX, 0, 1], &[0, 1, 2]);
        let cut: Vec<(usize, usize)> = wrapping.iter().map(|r| (r.start, r.count)).collect();
        assert_eq!(cut, [(0, 1), (1, 2)]);
        let onward = page_runs(&[u64::MAX - 1, u64::MAX, 0], &[0, 1, 2]);
        let cut: Vec<(usize, usize)> = onward.iter().map(|r| (r.start, r.count)).collect();
        assert_eq!(cut, [(0, 2), (2, 1)]);
    }
}
