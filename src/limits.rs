//! Every bound pdplan puts on what it is given, and the one check (and message) of each.
//!
//! A bound keeps an allocation finite, a product inside 64 bits or a loop short; each is a
//! `Limit` with its unit, and every check of it goes through `Limit::check`, so a bound has one
//! value and one message wherever it is met. Python reads them as `pdplan.limits`.

use crate::error::{bail, PlanResult};

/// An inclusive range a value must lie in, with the unit it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The name Python knows it by (`pdplan.limits.<name>`).
    pub name: &'static str,
    pub min: u64,
    pub max: u64,
    pub unit: &'static str,
    /// What to do instead, when there is a general answer.
    pub advice: &'static str,
}

impl Limit {
    /// `value` when it lies in the range; else the one message of this limit.
    pub fn check(&self, what: &str, value: u64) -> PlanResult<u64> {
        self.check_advising(what, value, self.advice)
    }

    /// `check`, with advice that fits the caller better than the limit's own.
    pub fn check_advising(&self, what: &str, value: u64, advice: &str) -> PlanResult<u64> {
        if value >= self.min && value <= self.max {
            return Ok(value);
        }
        let Self {
            name,
            min,
            max,
            unit,
            ..
        } = *self;
        let range = if min == 0 {
            format!("is above the limit of {max} {unit}")
        } else {
            format!("must be between {min} and {max} {unit}")
        };
        let advice = if advice.is_empty() {
            String::new()
        } else {
            format!("; {advice}")
        };
        bail!("{what}={value} {range} (pdplan.limits.{name}){advice}")
    }

    /// Whether `value` lies in the range.
    pub fn holds(&self, value: u64) -> bool {
        (self.min..=self.max).contains(&value)
    }
}

const fn limit(name: &'static str, min: u64, max: u64, unit: &'static str) -> Limit {
    Limit {
        name,
        min,
        max,
        unit,
        advice: "",
    }
}

const fn advising(limit: Limit, advice: &'static str) -> Limit {
    Limit { advice, ..limit }
}

/// Ranks a side may have. Fanout and routing tables hold one entry per rank, so the bound
/// keeps every per-rank allocation finite (and rank products inside 64 bits); TP, CP and
/// replica-group sizes are bounded by it too.
pub const WORLD_SIZE: Limit = advising(
    limit("MAX_WORLD_SIZE", 1, 1 << 20, "ranks"),
    "plan one slice of the cluster at a time",
);
/// Pipeline stages a side may have.
pub const STAGES: Limit = limit("MAX_STAGES", 1, 1 << 10, "stages");
/// Tokens a page may hold.
pub const PAGE_SIZE: Limit = limit("MAX_PAGE_SIZE", 1, 1 << 20, "tokens");
/// Rows a page may have (tokens of a token-major page, twice that for fused K/V pages), and
/// runs a token may move.
pub const ROWS_PER_PAGE: Limit = limit("MAX_ROWS_PER_PAGE", 1, 1 << 20, "rows");
/// Parts a split axis may be made of (Mamba2's conv state has three: x, B, C).
pub const PARTS: Limit = limit("MAX_PARTS", 1, 8, "parts");
/// Tokens a context-parallel deal hands a rank at a time.
pub const INTERLEAVE: Limit = limit("MAX_INTERLEAVE", 1, 1 << 20, "tokens");
/// Tokens of one request (a slot map of 2^28 tokens is 2 GiB of int64).
pub const TOKENS: Limit = limit("MAX_TOKENS", 0, 1 << 28, "tokens");
/// Fragments one decode rank's plan may hold (each is a Python object).
pub const PLAN_FRAGMENTS: Limit = advising(
    limit("MAX_PLAN_FRAGMENTS", 0, 1 << 24, "fragments"),
    "plan fewer buffers or a smaller prefill TP per call",
);
/// Descriptors one call may build (3 x 8 bytes each: 6 GiB at the bound).
pub const DESCRIPTORS: Limit = advising(
    limit("MAX_DESCRIPTORS", 0, 1 << 28, "descriptors"),
    "split the request's pages, tokens or fragments over several calls",
);
/// Layers a model may have.
pub const LAYERS: Limit = limit("MAX_LAYERS", 0, 1 << 16, "layers");
/// Dimensions a cache array may have.
pub const ARRAY_AXES: Limit = limit("MAX_ARRAY_AXES", 1, 8, "dimensions");
/// Buffers one exchanged layout may list.
pub const LAYOUT_BUFFERS: Limit = limit("MAX_LAYOUT_BUFFERS", 0, 1 << 16, "buffers");
/// Bytes of a `config.json` that are read.
pub const CONFIG_BYTES: Limit = limit("MAX_CONFIG_BYTES", 0, 16 << 20, "bytes");
/// Levels a `config.json` may nest.
pub const CONFIG_DEPTH: Limit = limit("MAX_CONFIG_DEPTH", 0, 64, "levels");

/// Every limit above, in the order `pdplan.limits` lists them.
pub const ALL: [Limit; 14] = [
    WORLD_SIZE,
    STAGES,
    PAGE_SIZE,
    ROWS_PER_PAGE,
    PARTS,
    INTERLEAVE,
    TOKENS,
    PLAN_FRAGMENTS,
    DESCRIPTORS,
    LAYERS,
    ARRAY_AXES,
    LAYOUT_BUFFERS,
    CONFIG_BYTES,
    CONFIG_DEPTH,
];

pub const MAX_WORLD_SIZE: u64 = WORLD_SIZE.max;
pub const MAX_STAGES: u64 = STAGES.max;
pub const MAX_PAGE_SIZE: u64 = PAGE_SIZE.max;
pub const MAX_ROWS_PER_PAGE: u64 = ROWS_PER_PAGE.max;
#[allow(clippy::cast_possible_truncation)] // 8
pub const MAX_PARTS: usize = PARTS.max as usize;
pub const MAX_INTERLEAVE: u64 = INTERLEAVE.max;
pub const MAX_TOKENS: u64 = TOKENS.max;
pub const MAX_DESCRIPTORS: u64 = DESCRIPTORS.max;
#[allow(clippy::cast_possible_truncation)] // 8
pub const MAX_ARRAY_AXES: usize = ARRAY_AXES.max as usize;

/// Every size, offset and index is below 2^63, so it survives any signed 64-bit consumer
/// (Python's C API, numpy int64, the wire format) and byte arithmetic cannot wrap.
pub const MAX_VALUE: u64 = i64::MAX as u64;

/// Defaults a caller may raise per call: a frame pair's payload bytes and fragments (16 MiB and
/// 65,536: a plan of 160 buffers from 400 sources, far above one rank pair's), an exchanged
/// layout's bytes.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 16 << 20;
pub const DEFAULT_MAX_FRAGMENTS: u64 = 1 << 16;
pub const DEFAULT_MAX_LAYOUT_BYTES: u64 = 1 << 20;

/// The process-wide caches' capacities: parsed frame pairs (count and payload bytes; frames
/// larger than an eighth of it are not kept; an entry also holds its parsed fragments and their
/// last placement, about three times its payload in all) and encoded fragment lists (count and
/// the fragment objects they hold).
pub const FRAME_CACHE_ENTRIES: usize = 1024;
pub const FRAME_CACHE_BYTES: usize = 64 << 20;
pub const ENCODE_CACHE_ENTRIES: usize = 1024;
pub const ENCODE_CACHE_ITEMS: usize = 1 << 18;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_names_itself_and_its_unit() {
        assert_eq!(PAGE_SIZE.check("page_size", 16), Ok(16));
        let err = PAGE_SIZE.check("page_size", 0).unwrap_err();
        assert_eq!(
            err.message(),
            "page_size=0 must be between 1 and 1048576 tokens (pdplan.limits.MAX_PAGE_SIZE)"
        );
        let err = TOKENS.check("num_tokens", MAX_TOKENS + 1).unwrap_err();
        assert!(err
            .message()
            .starts_with("num_tokens=268435457 is above the limit of"));
        assert!(TOKENS.holds(0) && !TOKENS.holds(MAX_TOKENS + 1));
    }

    #[test]
    fn every_limit_is_listed_once() {
        let mut names: Vec<_> = ALL.iter().map(|l| l.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        assert!(ALL.iter().all(|l| l.min <= l.max));
    }
}
