//! Wire frames already parsed, by content: a peer sends the same fragment list for every request
//! between the same two ranks, each time as new bytes. A bounded, least-recently-used cache keyed
//! by a fast hash of the bytes (xxh3), every hit confirmed by comparing the bytes themselves, so
//! it never answers for different frames and never trusts an object's identity.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::lru::{Lru, Shared, Stats};
use crate::wire::{self, FrameLimits};

/// Most frame pairs and payload bytes the shared cache keeps.
pub use crate::limits::{FRAME_CACHE_BYTES as MAX_BYTES, FRAME_CACHE_ENTRIES as MAX_ENTRIES};

/// A parsed frame pair: the bytes it was parsed from and what they hold.
pub struct Entry {
    version: Box<[u8]>,
    payload: Box<[u8]>,
    fragments: Arc<[Fragment]>,
}

pub type FrameCache = Lru<Entry>;

static CACHE: Shared<Entry> = Shared::new(MAX_ENTRIES, MAX_BYTES);

fn key(version: &[u8], payload: &[u8]) -> u64 {
    xxh3_64_with_seed(payload, xxh3_64_with_seed(version, 0x7064_706c_616e))
}

/// The fragments of frames byte-equal to `(version, payload)`, if `cache` holds them.
pub fn get(cache: &mut FrameCache, version: &[u8], payload: &[u8]) -> Option<Arc<[Fragment]>> {
    cache
        .get(key(version, payload), |e| {
            *e.version == *version && *e.payload == *payload
        })
        .map(|e| Arc::clone(&e.fragments))
}

/// Keeps `fragments` for the frames (weighed by their bytes).
pub fn insert(cache: &mut FrameCache, version: &[u8], payload: &[u8], fragments: Arc<[Fragment]>) {
    let entry = Entry {
        version: version.into(),
        payload: payload.into(),
        fragments,
    };
    cache.insert(key(version, payload), entry, version.len() + payload.len());
}

/// Hits, misses, entries and payload bytes of the shared cache.
pub fn stats() -> Stats {
    CACHE.lock().stats()
}

/// Decodes a frame pair through the shared cache: byte-equal frames seen before cost a hash
/// and a comparison. The limits apply to every call, hit or miss.
pub fn decode_cached(
    version: Option<&[u8]>,
    payload: Option<&[u8]>,
    limits: FrameLimits,
) -> PlanResult<Arc<[Fragment]>> {
    let (Some(version), Some(payload)) = (
        version.filter(|v| !v.is_empty()),
        payload.filter(|p| !p.is_empty()),
    ) else {
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
    if fragments.len() as u64 > limits.max_fragments {
        bail!(
            "more than {} fragments in one payload; a peer sent more than one plan can hold, or \
             raise max_fragments if the plan really is this large",
            limits.max_fragments
        );
    }
    Ok(fragments)
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
