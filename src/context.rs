//! Context parallelism: which of a request's tokens each rank of a side holds, and where among
//! its own tokens each one sits. The one home of token dealing: layouts, the planner, the
//! verifier and `token_slots` all ask a `TokenDeal`.
//!
//! A side deals a request's tokens over `ways` ranks (its CP or DCP ranks). A rank's tokens, in
//! order, are its local tokens `0, 1, ...`, stored in its own pages as if they were a request
//! of their own. Splits:
//! - interleave `I`: token `t` on rank `(t / I) % ways` (vLLM's DCP; `I = page_size` is block
//!   round-robin);
//! - contiguous: blocks of `page_size` tokens dealt in runs, rank `r` holding `N / ways`
//!   blocks, plus one when `r < N % ways` (`N` blocks in the request);
//! - zigzag: the request cut into `2 * ways` chunks of `ceil(n / (2 * ways))` tokens, rank `r`
//!   holding chunk `r`, then chunk `2 * ways - 1 - r`.
//!
//! Only interleave deals tokens independently of the request's length; for the others who
//! shares tokens with whom depends on it.

use crate::error::{bail, quoted, PlanResult};
use crate::limits;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CpSplit {
    #[default]
    Interleave,
    Contiguous,
    Zigzag,
}

impl CpSplit {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "interleave" => Ok(Self::Interleave),
            "contiguous" => Ok(Self::Contiguous),
            "zigzag" => Ok(Self::Zigzag),
            other => {
                bail!(
                    "cp_split must be 'interleave', 'contiguous' or 'zigzag', got {}",
                    quoted(other)
                )
            }
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Interleave => "interleave",
            Self::Contiguous => "contiguous",
            Self::Zigzag => "zigzag",
        }
    }
}

/// Whether the CP ranks of a side hold disjoint token shares or, after an all-gather, every
/// token (then they are replicas to read from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CpKv {
    #[default]
    Sharded,
    Replicated,
}

impl CpKv {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "sharded" => Ok(Self::Sharded),
            "replicated" => Ok(Self::Replicated),
            other => bail!(
                "cp_kv must be 'sharded' or 'replicated', got {}",
                quoted(other)
            ),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sharded => "sharded",
            Self::Replicated => "replicated",
        }
    }
}

/// How a side deals a request's tokens over `ways` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenDeal {
    ways: u64,
    split: CpSplit,
    /// Tokens a block: the interleave for interleave, the page size for contiguous (1 for
    /// zigzag, whose chunks follow the request's length).
    block: u64,
}

/// Tokens `start..end`, every `period` tokens again (`period == 0`: once), below `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Runs {
    start: u64,
    len: u64,
    period: u64,
    limit: u64,
}

impl Runs {
    const fn once(start: u64, end: u64) -> Self {
        Self {
            start,
            len: end.saturating_sub(start),
            period: 0,
            limit: end,
        }
    }

    /// The first token of these runs inside `lo..hi`, if any.
    fn first_in(self, lo: u64, hi: u64) -> Option<u64> {
        let hi = hi.min(self.limit);
        if self.len == 0 {
            return None;
        }
        let first = if lo <= self.start {
            self.start
        } else if let (Some(k), Some(within)) = (
            (lo - self.start).checked_div(self.period),
            (lo - self.start).checked_rem(self.period),
        ) {
            if within < self.len {
                lo
            } else {
                self.start + (k + 1) * self.period
            }
        } else if lo < self.start + self.len {
            lo
        } else {
            return None;
        };
        (first < hi).then_some(first)
    }
}

impl TokenDeal {
    /// Every token on one rank.
    pub const WHOLE: Self = Self {
        ways: 1,
        split: CpSplit::Interleave,
        block: 1,
    };

    /// A deal over `ways` ranks; `interleave` matters for interleave splits, `page_size` for
    /// contiguous ones.
    pub fn new(ways: u64, split: CpSplit, interleave: u64, page_size: u64) -> PlanResult<Self> {
        limits::WORLD_SIZE.check("cp_size", ways)?;
        limits::INTERLEAVE.check("cp_interleave", interleave)?;
        limits::PAGE_SIZE.check("page_size", page_size)?;
        let block = match split {
            CpSplit::Interleave => interleave,
            CpSplit::Contiguous => page_size,
            CpSplit::Zigzag => 1,
        };
        if ways == 1 {
            return Ok(Self::WHOLE);
        }
        Ok(Self { ways, split, block })
    }

    pub const fn ways(self) -> u64 {
        self.ways
    }

    pub const fn split(self) -> CpSplit {
        self.split
    }

    /// Whether who holds a token depends on the request's length.
    pub const fn depends_on_length(self) -> bool {
        self.ways > 1 && !matches!(self.split, CpSplit::Interleave)
    }

    /// Contiguous: (blocks of every rank, ranks holding one more) for `num_tokens` tokens.
    const fn block_counts(self, num_tokens: u64) -> (u64, u64) {
        let blocks = num_tokens.div_ceil(self.block);
        (blocks / self.ways, blocks % self.ways)
    }

    /// Contiguous: the first block of rank `rank`.
    fn first_block(self, rank: u64, num_tokens: u64) -> u64 {
        let (each, extra) = self.block_counts(num_tokens);
        rank * each + rank.min(extra)
    }

    /// Zigzag: tokens a chunk.
    const fn chunk(self, num_tokens: u64) -> u64 {
        let chunk = num_tokens.div_ceil(2 * self.ways);
        if chunk == 0 {
            1
        } else {
            chunk
        }
    }

    /// The rank holding token `token` of a request of `num_tokens` tokens.
    pub fn owner(self, token: u64, num_tokens: u64) -> u64 {
        if self.ways == 1 {
            return 0;
        }
        match self.split {
            CpSplit::Interleave => (token / self.block) % self.ways,
            CpSplit::Contiguous => {
                let (each, extra) = self.block_counts(num_tokens);
                let block = token / self.block;
                let long = extra * (each + 1);
                if block < long {
                    block / (each + 1)
                } else {
                    extra + (block - long) / each.max(1)
                }
            }
            CpSplit::Zigzag => {
                let j = token / self.chunk(num_tokens);
                if j < self.ways {
                    j
                } else {
                    (2 * self.ways - 1).saturating_sub(j)
                }
            }
        }
    }

    /// The owner of every token of a request of `num_tokens` tokens (at most `MAX_TOKENS`).
    pub fn owners(self, num_tokens: u64) -> PlanResult<Vec<i64>> {
        limits::TOKENS.check("num_tokens", num_tokens)?;
        Ok((0..num_tokens)
            .map(|t| i64::try_from(self.owner(t, num_tokens)).unwrap_or(-1))
            .collect())
    }

    /// Where token `token` sits among its owner's tokens.
    pub fn local_index(self, token: u64, num_tokens: u64) -> u64 {
        if self.ways == 1 {
            return token;
        }
        match self.split {
            CpSplit::Interleave => {
                let i = self.block;
                (token / (i * self.ways)) * i + token % i
            }
            CpSplit::Contiguous => {
                let rank = self.owner(token, num_tokens);
                token - self.first_block(rank, num_tokens) * self.block
            }
            CpSplit::Zigzag => {
                let chunk = self.chunk(num_tokens);
                let j = token / chunk;
                if j < self.ways {
                    token - j * chunk
                } else {
                    let rank = 2 * self.ways - 1 - j;
                    let first = (rank * chunk).min(num_tokens);
                    let first_len = ((rank + 1) * chunk).min(num_tokens) - first;
                    first_len + token - j * chunk
                }
            }
        }
    }

    /// The tokens rank `rank` holds, as at most two families of runs; `num_tokens` bounds
    /// them (`u64::MAX`: a request of unbounded length, interleave only).
    fn runs(self, rank: u64, num_tokens: u64) -> [Runs; 2] {
        let none = Runs::once(0, 0);
        if self.ways == 1 {
            return [Runs::once(0, num_tokens), none];
        }
        match self.split {
            CpSplit::Interleave => [
                Runs {
                    start: rank * self.block,
                    len: self.block,
                    period: self.block * self.ways,
                    limit: num_tokens,
                },
                none,
            ],
            CpSplit::Contiguous => {
                let first = self.first_block(rank, num_tokens) * self.block;
                let next = self.first_block(rank + 1, num_tokens) * self.block;
                [
                    Runs::once(first.min(num_tokens), next.min(num_tokens)),
                    none,
                ]
            }
            CpSplit::Zigzag => {
                let chunk = self.chunk(num_tokens);
                let at = |j: u64| {
                    Runs::once(
                        (j * chunk).min(num_tokens),
                        ((j + 1) * chunk).min(num_tokens),
                    )
                };
                [at(rank), at(2 * self.ways - 1 - rank)]
            }
        }
    }
}

/// One rank's share of a request's tokens: rank `index` of a deal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenShare {
    pub deal: TokenDeal,
    pub index: u64,
}

impl TokenShare {
    /// Every token.
    pub const WHOLE: Self = Self {
        deal: TokenDeal::WHOLE,
        index: 0,
    };

    pub const fn is_whole(self) -> bool {
        self.deal.ways == 1
    }

    /// Whether the rank holds token `token` of a request of `num_tokens` tokens.
    pub fn holds(self, token: u64, num_tokens: u64) -> bool {
        token < num_tokens && self.deal.owner(token, num_tokens) == self.index
    }
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whether two periodic runs of unbounded length ever overlap: runs `[s + k p, s + k p + l)`
/// and `[t + m q, ...)` meet iff some multiple of `gcd(p, q)` lies strictly between
/// `-l_a - (s - t)` and `l_b - (s - t)`.
fn periodic_meet(a: Runs, b: Runs) -> bool {
    let g = i128::from(gcd(a.period, b.period));
    let offset = i128::from(a.start) - i128::from(b.start);
    let low = -i128::from(a.len) - offset;
    let high = i128::from(b.len) - offset;
    let next = (low.div_euclid(g) + 1) * g;
    next < high
}

/// Whether runs `a` and `b` share a token.
fn runs_meet(a: Runs, b: Runs) -> bool {
    if a.len == 0 || b.len == 0 {
        return false;
    }
    if a.period == 0 || b.period == 0 {
        let (once, other) = if a.period == 0 { (a, b) } else { (b, a) };
        return other.first_in(once.start, once.start + once.len).is_some();
    }
    // Both periodic, below a common limit: walk the runs of the longer period over one common
    // period (or the limit); each step asks the other family in O(1). Steps are at most
    // min(shorter period, limit / longer period) + 1, below 2^15 for 2^28 tokens.
    let (long, short) = if a.period >= b.period { (a, b) } else { (b, a) };
    let limit = long.limit.min(short.limit);
    if limit == u64::MAX {
        return periodic_meet(a, b);
    }
    let common = (long.period / gcd(long.period, short.period)).saturating_mul(short.period);
    let end = limit.min(long.start.saturating_add(common));
    let mut start = long.start;
    while start < end {
        if short
            .first_in(start, (start + long.len).min(limit))
            .is_some()
        {
            return true;
        }
        start += long.period;
    }
    false
}

/// Whether two ranks' shares hold a common token: for a request of `num_tokens` tokens, or
/// (None) for some request when the deals do not depend on the length (interleave: any
/// request of at least one common period), and otherwise unless both sides deal alike and the
/// ranks differ (each may then share tokens with the other for some length).
pub fn shares_meet(a: TokenShare, b: TokenShare, num_tokens: Option<u64>) -> bool {
    match num_tokens {
        Some(n) => a
            .deal
            .runs(a.index, n)
            .into_iter()
            .any(|x| b.deal.runs(b.index, n).into_iter().any(|y| runs_meet(x, y))),
        None if a.is_whole() || b.is_whole() => true,
        None if a.deal.depends_on_length() || b.deal.depends_on_length() => {
            a.deal != b.deal || a.index == b.index
        }
        None => runs_meet(
            a.deal.runs(a.index, u64::MAX)[0],
            b.deal.runs(b.index, u64::MAX)[0],
        ),
    }
}

/// Tokens `start..stop` stepping by `step` (a Python `range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRange {
    pub start: i64,
    pub stop: i64,
    pub step: i64,
}

/// One rank's slot map for a request of `num_tokens` tokens: for each token `t` of `tokens`
/// that the rank's `share` holds, at local index `i` among the rank's tokens (`i = t` without
/// context parallelism), `page_table[i / page_size] * page_size + i % page_size`, and -1 for
/// every other token. A page-table entry of -1 is a page the rank does not hold; a token asked
/// for on one is refused, as is a table too short for the tokens asked for.
pub fn token_slots(
    page_table: &[i64],
    page_size: u64,
    num_tokens: u64,
    tokens: Option<TokenRange>,
    share: TokenShare,
) -> PlanResult<Vec<i64>> {
    limits::PAGE_SIZE.check("page_size", page_size)?;
    limits::TOKENS.check("num_tokens", num_tokens)?;
    let all = TokenRange {
        start: 0,
        stop: i64::try_from(num_tokens).unwrap_or(i64::MAX),
        step: 1,
    };
    let TokenRange { start, stop, step } = tokens.unwrap_or(all);
    if step <= 0 {
        bail!("tokens must be an ascending range, got a step of {step}");
    }
    let stop = stop.max(start);
    if start < 0 || u64::try_from(stop).unwrap_or(0) > num_tokens {
        bail!(
            "tokens range({start}, {stop}, {step}) must lie inside the request's \
             {num_tokens} tokens"
        );
    }
    let mut slots = vec![-1i64; usize::try_from(num_tokens).unwrap_or(0)];
    let size = i64::try_from(page_size).unwrap_or(i64::MAX);
    let whole = share.is_whole();
    for t in (start..stop).step_by(usize::try_from(step).unwrap_or(usize::MAX)) {
        let token = t.unsigned_abs();
        let local = if whole {
            t
        } else if share.holds(token, num_tokens) {
            i64::try_from(share.deal.local_index(token, num_tokens)).unwrap_or(i64::MAX)
        } else {
            continue;
        };
        let (page, position) = (local / size, local % size);
        let Some(&entry) = usize::try_from(page).ok().and_then(|p| page_table.get(p)) else {
            bail!(
                "token {t} (local token {local} of this rank) is on page {page} of the rank's \
                 tokens, but the page table has {} entries; give an entry for every page the \
                 tokens asked for touch",
                page_table.len()
            );
        };
        if entry < 0 {
            bail!(
                "token {t} is on page {page}, whose page-table entry is {entry}: {}; ask only \
                 for tokens on pages the rank holds (tokens=range(...))",
                if entry == -1 {
                    "the rank does not hold that page"
                } else {
                    "entries are page indices or -1"
                }
            );
        }
        let Some(slot) = entry
            .checked_mul(size)
            .and_then(|s| s.checked_add(position))
        else {
            bail!("page-table entry {entry} x page_size {page_size} does not fit 64 bits");
        };
        if let Some(out) = usize::try_from(t).ok().and_then(|t| slots.get_mut(t)) {
            *out = slot;
        }
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_INTERLEAVE;

    fn deal(ways: u64, split: CpSplit, interleave: u64, page: u64) -> TokenDeal {
        TokenDeal::new(ways, split, interleave, page).unwrap()
    }

    /// The splits as the issue defines them, token by token.
    fn owners_by_definition(d: (u64, CpSplit, u64, u64), n: u64) -> Vec<u64> {
        let (ways, split, interleave, page) = d;
        match split {
            CpSplit::Interleave => (0..n).map(|t| (t / interleave) % ways).collect(),
            CpSplit::Contiguous => {
                let blocks = n.div_ceil(page);
                let mut out = Vec::new();
                for rank in 0..ways {
                    let count = blocks / ways + u64::from(rank < blocks % ways);
                    for _ in 0..count * page {
                        out.push(rank);
                    }
                }
                out.truncate(usize::try_from(n).unwrap());
                out
            }
            CpSplit::Zigzag => {
                let chunk = n.div_ceil(2 * ways).max(1);
                let mut out = vec![0; usize::try_from(n).unwrap()];
                for rank in 0..ways {
                    for j in [rank, 2 * ways - 1 - rank] {
                        for t in j * chunk..((j + 1) * chunk).min(n) {
                            out[usize::try_from(t).unwrap()] = rank;
                        }
                    }
                }
                out
            }
        }
    }

    const DEALS: [(u64, CpSplit, u64, u64); 8] = [
        (2, CpSplit::Interleave, 1, 16),
        (4, CpSplit::Interleave, 3, 16),
        (8, CpSplit::Interleave, 16, 16),
        (3, CpSplit::Contiguous, 1, 4),
        (4, CpSplit::Contiguous, 1, 16),
        (2, CpSplit::Zigzag, 1, 16),
        (3, CpSplit::Zigzag, 1, 16),
        (1, CpSplit::Zigzag, 1, 16),
    ];

    #[test]
    fn owners_and_local_indexes_follow_the_definitions() {
        for d in DEALS {
            let dealt = deal(d.0, d.1, d.2, d.3);
            for n in [1, 2, 5, 16, 17, 47, 100, 129] {
                let owners = owners_by_definition(d, n);
                let mut seen = vec![0u64; usize::try_from(d.0).unwrap()];
                for t in 0..n {
                    let owner = dealt.owner(t, n);
                    assert_eq!(
                        owner,
                        owners[usize::try_from(t).unwrap()],
                        "{d:?} n={n} t={t}"
                    );
                    // Local indexes count the owner's tokens in order.
                    let count = &mut seen[usize::try_from(owner).unwrap()];
                    assert_eq!(dealt.local_index(t, n), *count, "{d:?} n={n} t={t}");
                    *count += 1;
                }
            }
        }
    }

    #[test]
    fn meeting_shares_match_brute_force() {
        for a in DEALS {
            for b in DEALS {
                let (da, db) = (deal(a.0, a.1, a.2, a.3), deal(b.0, b.1, b.2, b.3));
                for ra in 0..a.0 {
                    for rb in 0..b.0 {
                        let (sa, sb) = (
                            TokenShare {
                                deal: da,
                                index: ra,
                            },
                            TokenShare {
                                deal: db,
                                index: rb,
                            },
                        );
                        let mut ever = false;
                        for n in [1, 3, 16, 31, 64, 97, 240, 1000] {
                            let brute = (0..n).any(|t| sa.holds(t, n) && sb.holds(t, n));
                            assert_eq!(
                                shares_meet(sa, sb, Some(n)),
                                brute,
                                "{a:?} {b:?} {ra} {rb} {n}"
                            );
                            ever |= brute;
                        }
                        // Without a length the answer covers every length tried.
                        assert!(!ever || shares_meet(sa, sb, None), "{a:?} {b:?} {ra} {rb}");
                        if a.1 == CpSplit::Interleave && b.1 == CpSplit::Interleave {
                            assert_eq!(shares_meet(sa, sb, None), ever, "{a:?} {b:?} {ra} {rb}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dcp_8_and_4_at_interleave_1_meet_only_in_the_same_residue() {
        // vllm-project/vllm#50611: decode rank d shares tokens only with prefill r = d mod 4.
        let (p, d) = (
            deal(8, CpSplit::Interleave, 1, 16),
            deal(4, CpSplit::Interleave, 1, 16),
        );
        for r in 0..8 {
            for q in 0..4 {
                let meet = shares_meet(
                    TokenShare { deal: p, index: r },
                    TokenShare { deal: d, index: q },
                    None,
                );
                assert_eq!(meet, r % 4 == q, "{r} {q}");
            }
        }
    }

    #[test]
    fn coprime_periods_do_not_walk_forever() {
        let (a, b) = (
            deal(1 << 10, CpSplit::Interleave, MAX_INTERLEAVE, 1),
            deal((1 << 10) - 1, CpSplit::Interleave, MAX_INTERLEAVE - 1, 1),
        );
        let (sa, sb) = (
            TokenShare { deal: a, index: 5 },
            TokenShare { deal: b, index: 7 },
        );
        // Their common period is about 2^60 tokens; both answers come from arithmetic.
        assert!(shares_meet(sa, sb, None));
        // Within 2^28 tokens each holds one run, and the runs are apart.
        assert!(!shares_meet(sa, sb, Some(1 << 28)));
    }

    #[test]
    fn refusals() {
        assert!(TokenDeal::new(0, CpSplit::Interleave, 1, 16).is_err());
        assert!(TokenDeal::new(2, CpSplit::Interleave, 0, 16).is_err());
        assert!(TokenDeal::new(2, CpSplit::Interleave, MAX_INTERLEAVE + 1, 16).is_err());
        assert!(CpSplit::parse("ring").is_err());
        assert!(CpKv::parse("gathered").is_err());
    }
}
