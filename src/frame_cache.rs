//! Wire frames already parsed, by content: a peer sends the same fragment list for every request
//! between the same two ranks, each time as new bytes. A bounded, least-recently-used cache keyed
//! by a fast hash of the bytes (xxh3), every hit confirmed by comparing the bytes themselves, so
//! it never answers for different frames and never trusts an object's identity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{bail, PlanResult};
use crate::fragment::Fragment;
use crate::lru::evict_oldest_quarter;
use crate::wire::{self, FrameLimits};

/// Most frame pairs the shared cache keeps.
pub const MAX_ENTRIES: usize = 1024;
/// Most payload bytes the shared cache keeps (frames larger than an eighth of it are not kept).
pub const MAX_BYTES: usize = 64 << 20;

struct Entry {
    version: Box<[u8]>,
    payload: Box<[u8]>,
    fragments: Arc<[Fragment]>,
    last_used: u64,
}

/// Hits, misses and what the cache holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub bytes: usize,
}

pub struct FrameCache {
    by_hash: HashMap<u64, Vec<Entry>>,
    tick: u64,
    max_entries: usize,
    max_bytes: usize,
    stats: Stats,
}

fn key(version: &[u8], payload: &[u8]) -> u64 {
    xxh3_64_with_seed(payload, xxh3_64_with_seed(version, 0x7064_706c_616e))
}

impl FrameCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            by_hash: HashMap::new(),
            tick: 0,
            max_entries,
            max_bytes,
            stats: Stats::default(),
        }
    }

    pub const fn stats(&self) -> Stats {
        self.stats
    }

    /// The fragments of frames byte-equal to `(version, payload)`, if held.
    pub fn get(&mut self, hash: u64, version: &[u8], payload: &[u8]) -> Option<Arc<[Fragment]>> {
        self.tick += 1;
        let tick = self.tick;
        let found = self.by_hash.get_mut(&hash).and_then(|bucket| {
            bucket
                .iter_mut()
                .find(|e| *e.version == *version && *e.payload == *payload)
        });
        if let Some(entry) = found {
            entry.last_used = tick;
            self.stats.hits += 1;
            return Some(Arc::clone(&entry.fragments));
        }
        self.stats.misses += 1;
        None
    }

    /// Keeps `fragments` for the frames, evicting the least recently used past the bounds.
    pub fn insert(
        &mut self,
        hash: u64,
        version: &[u8],
        payload: &[u8],
        fragments: Arc<[Fragment]>,
    ) {
        let size = version.len() + payload.len();
        if size > self.max_bytes / 8 || self.max_entries == 0 {
            return;
        }
        while self.stats.entries >= self.max_entries || self.stats.bytes + size > self.max_bytes {
            if !self.evict_oldest() {
                break;
            }
        }
        self.tick += 1;
        self.by_hash.entry(hash).or_default().push(Entry {
            version: version.into(),
            payload: payload.into(),
            fragments,
            last_used: self.tick,
        });
        self.stats.entries += 1;
        self.stats.bytes += size;
    }

    fn evict_oldest(&mut self) -> bool {
        let gone = evict_oldest_quarter(&mut self.by_hash, |e| e.last_used);
        for entry in &gone {
            self.stats.entries -= 1;
            self.stats.bytes -= entry.version.len() + entry.payload.len();
        }
        !gone.is_empty()
    }
}

/// The process-wide cache behind `decode_cached`.
pub fn shared() -> &'static Mutex<FrameCache> {
    static CACHE: OnceLock<Mutex<FrameCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(FrameCache::new(MAX_ENTRIES, MAX_BYTES)))
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
    let hash = key(version, payload);
    let cached = shared()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(hash, version, payload);
    let fragments = if let Some(fragments) = cached {
        fragments
    } else {
        let parsed: Arc<[Fragment]> =
            wire::decode_with(Some(version), Some(payload), limits)?.into();
        shared()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(hash, version, payload, Arc::clone(&parsed));
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
        cache.insert(key(&v, &p), &v, &p, Arc::clone(&parsed));
        let again = cache.get(key(&v, &p), &v.clone(), &p.clone()).unwrap();
        assert!(Arc::ptr_eq(&again, &parsed));
        // Same hash but other bytes (forced): never answered.
        let (_, other) = frames(2);
        assert!(cache.get(key(&v, &p), &v, &other).is_none());
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut cache = FrameCache::new(2, 1 << 20);
        let all: Vec<_> = (0..3).map(frames).collect();
        for (v, p) in &all[..2] {
            cache.insert(key(v, p), v, p, Arc::from(Vec::new()));
        }
        let (v0, p0) = &all[0];
        assert!(cache.get(key(v0, p0), v0, p0).is_some()); // 0 is now newer than 1
        let (v2, p2) = &all[2];
        cache.insert(key(v2, p2), v2, p2, Arc::from(Vec::new()));
        let (v1, p1) = &all[1];
        assert!(cache.get(key(v1, p1), v1, p1).is_none());
        assert!(cache.get(key(v0, p0), v0, p0).is_some());
        assert_eq!(cache.stats().entries, 2);
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
