//! Slices of a request: which of its tokens, and which of its pages, one call moves while
//! prefill runs, so that the slices of any partition of the request move its bytes exactly
//! once, each byte once it is final.
//!
//! A slice names the tokens `[start, stop)` newly final, the request's length once known
//! (`final_length`) and the tokens the decode side holds already (`decode_prefix`). For a
//! buffer with a window `w` or a chunk `c`, the tokens it keeps are those of
//! `layout::first_kept_token` for the final length (for `stop` while it is unknown: tokens a
//! longer prompt pushes out of the window or the chunk are then moved for nothing).
//!
//! - By slot maps, a token-indexed buffer moves tokens `[max(start, prefix, kept), stop)`.
//! - By pages, a full page moves in the slice holding its last token, and the partial last page
//!   in the slice that ends the prompt. Pages wholly below the prefix, or wholly before the
//!   kept tokens, never move. A prefix must be whole pages there.
//! - State (not indexed by token) moves once, in the slice that ends the prompt.
//!
//! A request's slices are a partition of its tokens of which exactly one ends the prompt: its
//! `stop` is the `final_length` it names (an empty `range(n, n)` will do).

use crate::error::{bail, PlanResult};
use crate::layout::first_kept_token;

/// One slice of a request. `Default` is the whole request, as calls without slices move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenSlice {
    /// The tokens `[start, stop)` newly final; `None`: every token the call is given.
    pub tokens: Option<(u64, u64)>,
    /// The request's length once known; `None`: not known yet.
    pub final_length: Option<u64>,
    /// Tokens the decode side holds already: they never move.
    pub decode_prefix: u64,
}

impl TokenSlice {
    /// Whether this is the whole request (no slice named).
    pub fn is_whole(&self) -> bool {
        *self == Self::default()
    }

    /// The slice checked against a request of `given` tokens (slot maps' length, or pages
    /// times their size): its `(start, stop)` and the length the kept tokens are counted from.
    fn bounds(&self, given: u64) -> PlanResult<(u64, u64, u64)> {
        let (start, stop) = self
            .tokens
            .unwrap_or((0, self.final_length.unwrap_or(given)));
        if start > stop {
            bail!("tokens=range({start}, {stop}) is backwards: give start <= stop");
        }
        if let Some(length) = self.final_length {
            if stop > length {
                bail!(
                    "tokens=range({start}, {stop}) runs past final_length={length}: a slice holds \
                     only tokens of the request"
                );
            }
        }
        if stop > given {
            bail!(
                "tokens=range({start}, {stop}) runs past the {given} tokens the call was given: \
                 pass the request's slot maps or pages up to token {stop} at least"
            );
        }
        Ok((start, stop, self.final_length.unwrap_or(stop)))
    }

    /// Whether state moves in this slice: it ends the prompt (or is the whole request).
    pub fn ends_prompt(&self) -> bool {
        match (self.tokens, self.final_length) {
            (None, _) => true,
            (Some((_, stop)), Some(length)) => stop == length,
            (Some(_), None) => false,
        }
    }

    /// The slot-map positions `[first, stop)` a token-indexed buffer with `window` or `chunk`
    /// moves, of slot maps `given` long.
    pub fn token_range(
        &self,
        given: u64,
        window: Option<u64>,
        chunk: Option<u64>,
    ) -> PlanResult<(u64, u64)> {
        let (start, stop, length) = self.bounds(given)?;
        let kept = first_kept_token(length, window, chunk);
        let first = start.max(self.decode_prefix).max(kept).min(stop);
        Ok((first, stop))
    }

    /// The page pairs `[first, stop)` of a request's `pairs` pages of `page_size` tokens a
    /// token-indexed buffer with `window` or `chunk` moves: the full pages whose last token is
    /// in the slice, and the partial last page in the slice that ends the prompt.
    pub fn page_range(
        &self,
        pairs: u64,
        page_size: u64,
        window: Option<u64>,
        chunk: Option<u64>,
    ) -> PlanResult<(u64, u64)> {
        if page_size == 0 {
            bail!(
                "a fragment of a page plan names no page size: prepare the transfer with \
                 buffer_layouts= (the prefill side's BufferLayouts; from_layouts knows them) \
                 to slice it by tokens"
            );
        }
        let given = pairs.saturating_mul(page_size);
        let (start, stop, _) = self.bounds(given)?;
        if self.decode_prefix % page_size != 0 {
            bail!(
                "decode_prefix={} is not a whole number of {page_size}-token pages, so pages \
                 would rewrite tokens the decode side holds; move such a request by slot maps \
                 (token_descriptors)",
                self.decode_prefix
            );
        }
        // A full page moves in the slice holding its last token; the partial last page, once
        // the prompt's length is known, in the slice that ends the prompt.
        let partial = match self.final_length {
            Some(length) if stop == length && length % page_size != 0 => 1,
            _ => 0,
        };
        // Pages wholly before the tokens a window or chunk keeps never move: kept of the
        // final length, or of the tokens so far while it is unknown (pages a longer prompt
        // pushes out are then moved for nothing), or none for the request as given.
        let kept = match (self.final_length, self.tokens) {
            (Some(length), _) => first_kept_token(length, window, chunk),
            (None, Some(_)) => first_kept_token(stop, window, chunk),
            (None, None) => 0,
        };
        let first = (start / page_size)
            .max(self.decode_prefix / page_size)
            .max(kept / page_size);
        let stop_page = (stop / page_size + partial).min(pairs);
        Ok((first.min(stop_page), stop_page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(start: u64, stop: u64, length: Option<u64>, prefix: u64) -> TokenSlice {
        TokenSlice {
            tokens: Some((start, stop)),
            final_length: length,
            decode_prefix: prefix,
        }
    }

    #[test]
    fn token_ranges_clip_to_the_prefix_and_the_kept_tokens() {
        assert_eq!(
            TokenSlice::default().token_range(50, None, None).unwrap(),
            (0, 50)
        );
        assert_eq!(
            slice(10, 30, Some(50), 15)
                .token_range(50, None, None)
                .unwrap(),
            (15, 30)
        );
        // Window 16 of a 50-token request keeps tokens 34..50.
        assert_eq!(
            slice(10, 30, Some(50), 0)
                .token_range(50, Some(16), None)
                .unwrap(),
            (30, 30)
        );
        assert_eq!(
            slice(30, 50, Some(50), 0)
                .token_range(50, Some(16), None)
                .unwrap(),
            (34, 50)
        );
        // Length unknown: the window of the tokens so far.
        assert_eq!(
            slice(10, 30, None, 0)
                .token_range(50, Some(16), None)
                .unwrap(),
            (14, 30)
        );
        assert!(slice(10, 60, Some(50), 0)
            .token_range(60, None, None)
            .is_err());
        assert!(slice(10, 40, None, 0).token_range(30, None, None).is_err());
        assert!(slice(20, 10, None, 0).token_range(30, None, None).is_err());
    }

    #[test]
    fn a_page_moves_in_the_slice_its_last_token_becomes_final_in() {
        // 50 tokens in pages of 16: pages 0..3 full, page 3 holds tokens 48, 49.
        let pages = |s: TokenSlice| s.page_range(4, 16, None, None).unwrap();
        assert_eq!(pages(slice(0, 20, Some(50), 0)), (0, 1));
        assert_eq!(pages(slice(20, 49, Some(50), 0)), (1, 3));
        assert_eq!(pages(slice(49, 50, Some(50), 0)), (3, 4));
        // Unknown length: the partial page waits, for the slice that ends the prompt, even an
        // empty one.
        assert_eq!(pages(slice(20, 50, None, 0)), (1, 3));
        assert_eq!(pages(slice(50, 50, Some(50), 0)), (3, 4));
        assert_eq!(pages(slice(0, 50, Some(50), 32)), (2, 4));
        assert!(slice(0, 50, Some(50), 8)
            .page_range(4, 16, None, None)
            .is_err());
        assert_eq!(
            slice(0, 50, Some(50), 0)
                .page_range(4, 16, Some(16), None)
                .unwrap(),
            (2, 4)
        );
    }

    #[test]
    fn state_moves_in_the_slice_that_ends_the_prompt() {
        assert!(TokenSlice::default().ends_prompt());
        assert!(slice(30, 50, Some(50), 0).ends_prompt());
        assert!(!slice(0, 30, Some(50), 0).ends_prompt());
        assert!(!slice(0, 50, None, 0).ends_prompt());
    }
}
