//! Reading a request's two slot maps: checking them, and finding their *segments*, runs of
//! consecutive tokens whose slots both advance by one inside one page on each side. The scan
//! skips 16-token blocks one side lacks at once and is compiled for AVX2 where the CPU has it.

use crate::error::{bail, PlanResult};
use crate::limits;

/// Consecutive tokens whose slots advance together inside one page on each side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub src_page: u64,
    pub src_position: u64,
    pub dst_page: u64,
    pub dst_position: u64,
    pub tokens: u64,
}

/// A request's segments for one pair of page sizes, and what bounds-checking needs of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    pub list: Vec<Segment>,
    pub tokens: u64,
    pub largest_src_page: u64,
    pub largest_dst_page: u64,
    /// Some slot scanned may be below -1 (`slot + 1` was negative): check them properly.
    pub suspicious: bool,
}

/// Two slot maps as long as each other, within the limit.
pub fn check_slot_lengths(src: &[i64], dst: &[i64]) -> PlanResult<()> {
    if src.len() != dst.len() {
        bail!(
            "src_slots has {} entries and dst_slots {}; entry t of each is token t's slot on \
             that rank, so give both the request's length",
            src.len(),
            dst.len()
        );
    }
    limits::TOKENS.check("len(src_slots)", src.len() as u64)?;
    Ok(())
}

/// Every entry -1 or a slot.
pub fn check_slot_values(src: &[i64], dst: &[i64]) -> PlanResult<()> {
    for (name, slots) in [("src_slots", src), ("dst_slots", dst)] {
        // `slot + 1` is negative for every slot below -1 (and wraps for i64::MAX): one OR over
        // the map, which vectorises, clears most maps without a search.
        if slots
            .iter()
            .fold(0i64, |bits, &slot| bits | slot.wrapping_add(1))
            >= 0
        {
            continue;
        }
        if let Some(t) = slots.iter().position(|&slot| slot < -1) {
            bail!(
                "{name}[{t}] is {}: a slot is page * page_size + position, or -1 for a token \
                 the rank holds no slot for",
                slots[t]
            );
        }
    }
    Ok(())
}

/// Tokens `segments` looks at together when skipping tokens one side lacks.
const BLOCK: usize = 16;

/// The segments of slot maps of equal length, for pages of `src_size` and `dst_size` tokens.
pub fn segments(src: &[i64], dst: &[i64], sizes: (u64, u64)) -> Segments {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `segments_avx2` needs only that the CPU has AVX2, detected just now.
        return unsafe { segments_avx2(src, dst, sizes) };
    }
    segments_in_blocks(src, dst, sizes)
}

/// `segments_in_blocks` compiled for AVX2, whose block tests then run four slots a lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn segments_avx2(src: &[i64], dst: &[i64], sizes: (u64, u64)) -> Segments {
    segments_in_blocks(src, dst, sizes)
}

// Always inlined, so that `segments_avx2` compiles the whole scan for AVX2.
#[allow(clippy::inline_always)]
#[inline(always)]
fn segments_in_blocks(src: &[i64], dst: &[i64], sizes: (u64, u64)) -> Segments {
    let mut scan = Scan::new(sizes);
    // Tokens one side lacks (-1) come in long runs under context parallelism (7 of 8 under
    // DCP 8): whole blocks of them are skipped at once.
    let blocks = src.chunks_exact(BLOCK).zip(dst.chunks_exact(BLOCK));
    let tail = src.len() - src.len() % BLOCK;
    for (s_block, d_block) in blocks {
        // Fixed-size blocks, so the tests unroll into a few vector instructions.
        let (Ok(s_block), Ok(d_block)) = (
            <&[i64; BLOCK]>::try_from(s_block),
            <&[i64; BLOCK]>::try_from(d_block),
        ) else {
            continue;
        };
        let (lacking, odd) = block_flags(s_block, d_block);
        scan.out.suspicious |= odd;
        if lacking {
            scan.close();
        } else if advancing(s_block, d_block) {
            // Slots advancing by one on both sides (tokens held in order, the usual case):
            // the first token joins or starts a segment, the rest extend it at once when both
            // pages have room. The same segments as token by token.
            scan.token(s_block[0], d_block[0]);
            let last = (s_block[BLOCK - 1], d_block[BLOCK - 1]);
            if !scan.extend(BLOCK as u64 - 1, last) {
                for (&s, &d) in s_block.iter().zip(d_block).skip(1) {
                    scan.token(s, d);
                }
            }
        } else {
            for (&s, &d) in s_block.iter().zip(d_block) {
                scan.token(s, d);
            }
        }
    }
    for (&s, &d) in src[tail..].iter().zip(&dst[tail..]) {
        scan.out.suspicious |= (s.wrapping_add(1) | d.wrapping_add(1)) < 0;
        scan.token(s, d);
    }
    scan.finish()
}

/// Whether a block's slots are all set and advance by one on both sides.
#[allow(clippy::inline_always)] // part of the scan `segments_avx2` compiles for AVX2
#[inline(always)]
fn advancing(src: &[i64; BLOCK], dst: &[i64; BLOCK]) -> bool {
    let (s0, d0) = (src[0], dst[0]);
    let mut advancing = s0 >= 0 && d0 >= 0;
    for i in 1..BLOCK {
        let step = i64::try_from(i).unwrap_or(0);
        advancing &= src[i] == s0.wrapping_add(step) && dst[i] == d0.wrapping_add(step);
    }
    advancing
}

/// Of one block: whether every token lacks a slot on one side (`s | d` is negative iff either
/// is, so their bitwise AND is negative iff every token lacks one), and whether some slot may
/// be below -1 (`slot + 1` negative; `check_slot_values` says which). One pass, in lanes.
#[allow(clippy::inline_always)] // part of the scan `segments_avx2` compiles for AVX2
#[inline(always)]
fn block_flags(src: &[i64; BLOCK], dst: &[i64; BLOCK]) -> (bool, bool) {
    let (mut lacking, mut odd) = ([-1i64; 4], [0i64; 4]);
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact(4)) {
        for (((lack, odd), &s), &d) in lacking.iter_mut().zip(&mut odd).zip(s).zip(d) {
            *lack &= s | d;
            *odd |= s.wrapping_add(1) | d.wrapping_add(1);
        }
    }
    (
        (lacking[0] & lacking[1] & lacking[2] & lacking[3]) < 0,
        (odd[0] | odd[1] | odd[2] | odd[3]) < 0,
    )
}

/// Segments being found, token by token: the one open, and the previous token's slots (a
/// token continues the open segment when both slots advance by one and stay inside their
/// pages, which needs no division).
struct Scan {
    out: Segments,
    open: Option<Segment>,
    last: (i64, i64),
    sizes: (u64, u64),
}

#[allow(clippy::inline_always)] // part of the scan `segments_avx2` compiles for AVX2
impl Scan {
    fn new(sizes: (u64, u64)) -> Self {
        Self {
            out: Segments::default(),
            open: None,
            last: (-2, -2),
            sizes,
        }
    }

    /// Ends the open segment, if any.
    #[inline(always)]
    fn close(&mut self) {
        if let Some(seg) = self.open.take() {
            self.out.list.push(seg);
        }
    }

    /// One token: it continues the open segment, starts a new one, or (a slot of -1 on
    /// either side) closes it.
    #[inline(always)]
    fn token(&mut self, s: i64, d: i64) {
        if s < 0 || d < 0 {
            self.close();
            return;
        }
        let (src_size, dst_size) = self.sizes;
        self.out.tokens += 1;
        let follows = s == self.last.0.wrapping_add(1) && d == self.last.1.wrapping_add(1);
        self.last = (s, d);
        if let Some(seg) = self.open.as_mut() {
            if follows
                && seg.src_position + seg.tokens < src_size
                && seg.dst_position + seg.tokens < dst_size
            {
                seg.tokens += 1;
                return;
            }
            self.out.list.push(*seg);
        }
        let (s, d) = (s.unsigned_abs(), d.unsigned_abs());
        let (src_page, dst_page) = (s / src_size, d / dst_size);
        self.out.largest_src_page = self.out.largest_src_page.max(src_page);
        self.out.largest_dst_page = self.out.largest_dst_page.max(dst_page);
        self.open = Some(Segment {
            src_page,
            src_position: s % src_size,
            dst_page,
            dst_position: d % dst_size,
            tokens: 1,
        });
    }

    /// Extends the open segment by `tokens` that follow it, the last at slots `last`, when
    /// both its pages have room; whether it did.
    #[inline(always)]
    fn extend(&mut self, tokens: u64, last: (i64, i64)) -> bool {
        let (src_size, dst_size) = self.sizes;
        let Some(seg) = self.open.as_mut() else {
            return false;
        };
        let end = seg.tokens + tokens;
        if seg.src_position + end > src_size || seg.dst_position + end > dst_size {
            return false;
        }
        seg.tokens = end;
        self.out.tokens += tokens;
        self.last = last;
        true
    }

    fn finish(mut self) -> Segments {
        self.close();
        self.out
    }
}
