//! Wire frames already parsed, by content: a peer sends the same fragment list for every request
//! between the same two ranks, each time as new bytes. A bounded, least-recently-used cache keyed
//! by a fast hash of the bytes (xxh3), every hit confirmed by comparing the bytes themselves, so
//! it never answers for different frames and never trusts an object's identity. The few frames
//! used last are compared first, before anything is hashed: a rank hears from few peers. Each
//! entry also keeps the last placement of its fragments (a `Prepared` for both sides' buffers),
//! reused while the same buffers come with the same frames.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::descriptors::Buffers;
use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::lru::{Lru, Shared, Stats};
use crate::prepared::Prepared;
use crate::wire::{self, FrameLimits};

/// Most frame pairs and payload bytes the shared cache keeps.
pub use crate::limits::{FRAME_CACHE_BYTES as MAX_BYTES, FRAME_CACHE_ENTRIES as MAX_ENTRIES};

/// A parsed frame pair: the bytes it was parsed from and what they hold.
pub struct Entry {
    version: Box<[u8]>,
    payload: Box<[u8]>,
    fragments: Arc<[Fragment]>,
    /// The last placement of the fragments, and the buffers it was placed against.
    placed: Option<(Buffers, Buffers, Arc<Prepared>)>,
}

impl Entry {
    fn holds(&self, version: &[u8], payload: &[u8]) -> bool {
        *self.version == *version && *self.payload == *payload
    }
}

pub type FrameCache = Lru<Entry>;

static CACHE: Shared<Entry> = Shared::new(MAX_ENTRIES, MAX_BYTES);

fn key(version: &[u8], payload: &[u8]) -> u64 {
    xxh3_64_with_seed(payload, xxh3_64_with_seed(version, 0x7064_706c_616e))
}

/// The entry of frames byte-equal to `(version, payload)`, if `cache` holds it: one of the
/// last few used (no hash), or under the frames' hash.
fn entry<'c>(cache: &'c mut FrameCache, version: &[u8], payload: &[u8]) -> Option<&'c mut Entry> {
    cache.get_recent_or(|e| e.holds(version, payload), || key(version, payload))
}

/// The fragments of frames byte-equal to `(version, payload)`, if `cache` holds them.
pub fn get(cache: &mut FrameCache, version: &[u8], payload: &[u8]) -> Option<Arc<[Fragment]>> {
    entry(cache, version, payload).map(|e| Arc::clone(&e.fragments))
}

/// Keeps `fragments` for the frames (weighed by their bytes).
pub fn insert(cache: &mut FrameCache, version: &[u8], payload: &[u8], fragments: Arc<[Fragment]>) {
    let entry = Entry {
        version: version.into(),
        payload: payload.into(),
        fragments,
        placed: None,
    };
    cache.insert(key(version, payload), entry, version.len() + payload.len());
}

/// Hits, misses, entries and payload bytes of the shared cache.
pub fn stats() -> Stats {
    CACHE.lock().stats()
}

/// Decodes a frame pair through the shared cache: byte-equal frames seen before cost a
/// comparison (and a hash, unless they were among the last few used). The limits apply to
/// every call, hit or miss.
pub fn decode_cached(
    version: Option<&[u8]>,
    payload: Option<&[u8]>,
    limits: FrameLimits,
) -> PlanResult<Arc<[Fragment]>> {
    let Some((version, payload)) = both_given(version, payload) else {
        return wire::decode_with(version, payload, limits).map(Arc::from);
    };
    wire::check_payload_len(payload.len(), limits)?;
    let cached = get(&mut CACHE.lock(), version, payload);
    let fragments = if let Some(fragments) = cached {
        fragments
    } else {
        let parsed: Arc<[Fragment]> =
            wire::decode_with(Some(version), Some(payload), limits)?.into();
        insert(&mut CACHE.lock(), version, payload, Arc::clone(&parsed));
        parsed
    };
    within_limits(&fragments, limits)?;
    Ok(fragments)
}

/// Both frames, when both are given and not empty (the only frames the cache keeps); the
/// decoder answers for every other pair.
fn both_given<'a>(
    version: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
) -> Option<(&'a [u8], &'a [u8])> {
    version
        .zip(payload)
        .filter(|(v, p)| !v.is_empty() && !p.is_empty())
}

fn within_limits(fragments: &[Fragment], limits: FrameLimits) -> PlanResult<()> {
    if fragments.len() as u64 > limits.max_fragments {
        bail!(
            "more than {} fragments in one payload; a peer sent more than one plan can hold, or \
             raise max_fragments if the plan really is this large",
            limits.max_fragments
        );
    }
    Ok(())
}

/// A transfer prepared from a frame pair against both sides' buffers, through the shared
/// cache: byte-equal frames seen before reuse their fragments and, with equal buffers, their
/// placement (a comparison of the buffers instead of placing every fragment again). Counted as
/// one hit or one miss.
pub fn prepare_cached(
    version: Option<&[u8]>,
    payload: Option<&[u8]>,
    limits: FrameLimits,
    (src, dst): (&Buffers, &Buffers),
) -> PlanResult<Arc<Prepared>> {
    let Some((v, p)) = both_given(version, payload) else {
        let fragments = wire::decode_with(version, payload, limits)?;
        return Ok(Arc::new(Prepared::from_valid(fragments.into(), src, dst)?));
    };
    wire::check_payload_len(p.len(), limits)?;
    let known = entry(&mut CACHE.lock(), v, p).map(|e| {
        let same_buffers = e.placed.as_ref().filter(|(s, d, _)| s == src && d == dst);
        (
            Arc::clone(&e.fragments),
            same_buffers.map(|(_, _, placed)| Arc::clone(placed)),
        )
    });
    let fragments = match known {
        Some((fragments, Some(placed))) => {
            within_limits(&fragments, limits)?;
            return Ok(placed);
        }
        Some((fragments, None)) => fragments,
        None => wire::decode_with(Some(v), Some(p), limits)?.into(),
    };
    within_limits(&fragments, limits)?;
    // The decoder validated every fragment it returned (and the cache keeps only those).
    let placed = Arc::new(Prepared::from_valid(Arc::clone(&fragments), src, dst)?);
    let memo = Some((src.clone(), dst.clone(), Arc::clone(&placed)));
    let mut cache = CACHE.lock();
    if let Some(e) = cache.recent_mut(|e| e.holds(v, p)) {
        e.placed = memo;
    } else {
        let entry = Entry {
            version: v.into(),
            payload: p.into(),
            fragments,
            placed: memo,
        };
        cache.insert(key(v, p), entry, v.len() + p.len());
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: u64) -> (Vec<u8>, Vec<u8>) {
        let fragment = Fragment {
            buffer_index: n,
            buffer_kind: crate::BufferKind::TargetK,
            src_rank: 0,
            dst_rank: 0,
            src_page_stride_bytes: 64,
            dst_page_stride_bytes: 64,
            src_byte_offset: 0,
            dst_byte_offset: 0,
            bytes_per_page: 64,
            ..Fragment::default()
        };
        wire::encode(&[fragment])
    }

    #[test]
    fn equal_bytes_hit_and_different_bytes_miss() {
        let mut cache = FrameCache::new(2, 1 << 20);
        let (v, p) = frames(1);
        let parsed: Arc<[Fragment]> = wire::decode(Some(&v), Some(&p)).unwrap().into();
        insert(&mut cache, &v, &p, Arc::clone(&parsed));
        let again = get(&mut cache, &v.clone(), &p.clone()).unwrap();
        assert!(Arc::ptr_eq(&again, &parsed));
        let (_, other) = frames(2);
        assert!(get(&mut cache, &v, &other).is_none());
        // The same hash with other bytes (forced) is never answered.
        let forced = cache.get(key(&v, &p), |e| *e.payload == *other);
        assert!(forced.is_none());
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 2));
        assert_eq!(cache.stats().weight, v.len() + p.len());
    }

    #[test]
    fn placements_are_reused_for_equal_frames_and_equal_buffers_only() {
        let (v, p) = frames(77);
        let buffers = |base: u64| Buffers {
            bases: vec![0; 77].into_iter().chain([base]).collect(),
            limits: None,
        };
        let (a, b) = (buffers(1 << 20), buffers(1 << 30));
        let limits = FrameLimits::DEFAULT;
        let first = prepare_cached(Some(&v), Some(&p), limits, (&a, &a)).unwrap();
        let again = prepare_cached(Some(&v.clone()), Some(&p.clone()), limits, (&a, &a.clone()));
        assert!(Arc::ptr_eq(&first, &again.unwrap()));
        let moved = prepare_cached(Some(&v), Some(&p), limits, (&a, &b)).unwrap();
        assert!(!Arc::ptr_eq(&first, &moved) && first.shares_fragments(&moved));
        // The limits still apply to a reused placement.
        let tight = FrameLimits {
            max_fragments: 0,
            ..limits
        };
        assert!(prepare_cached(Some(&v), Some(&p), tight, (&a, &b)).is_err());
        // Buffers that cannot hold the fragments are refused, and nothing is kept for them.
        let short = Buffers::default();
        assert!(prepare_cached(Some(&v), Some(&p), limits, (&short, &short)).is_err());
        let back = prepare_cached(Some(&v), Some(&p), limits, (&a, &b)).unwrap();
        assert!(Arc::ptr_eq(&back, &moved));
    }

    #[test]
    fn limits_hold_on_hits_too() {
        let (v, p) = frames(3);
        assert_eq!(
            decode_cached(Some(&v), Some(&p), FrameLimits::DEFAULT)
                .unwrap()
                .len(),
            1
        );
        let tight = FrameLimits {
            max_fragments: 0,
            ..FrameLimits::DEFAULT
        };
        assert!(decode_cached(Some(&v), Some(&p), tight).is_err());
    }
}
