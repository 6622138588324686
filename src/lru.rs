//! The bounded, least-recently-used cache behind both per-request caches (parsed frames,
//! encoded frames): entries in hash buckets, each stamped with the tick of its last use, bounded
//! by a count and by a total weight (bytes, objects held), with hit and miss counters. Callers
//! give the hash and say which entry of a bucket matches, so a hit is always confirmed against
//! the entry itself, never taken on the hash alone.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// What a cache holds and has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    /// The entries' weights added up.
    pub weight: usize,
}

struct Slot<E> {
    entry: E,
    weight: usize,
    last_used: u64,
}

pub struct Lru<E> {
    buckets: HashMap<u64, Vec<Slot<E>>>,
    /// The hashes of the most recently used entries, newest first (`get_recent`).
    recent: Vec<u64>,
    tick: u64,
    max_entries: usize,
    max_weight: usize,
    stats: Stats,
}

impl<E> Lru<E> {
    /// At most `max_entries` entries weighing `max_weight` in all; an entry heavier than an
    /// eighth of that is not kept, so one entry never evicts most of the others.
    pub fn new(max_entries: usize, max_weight: usize) -> Self {
        Self {
            buckets: HashMap::new(),
            recent: Vec::with_capacity(RECENT),
            tick: 0,
            max_entries,
            max_weight,
            stats: Stats::default(),
        }
    }

    pub const fn stats(&self) -> Stats {
        self.stats
    }

    /// The entry under `hash` that `matches`, marked as just used.
    pub fn get(&mut self, hash: u64, matches: impl Fn(&E) -> bool) -> Option<&mut E> {
        let at = self
            .buckets
            .get(&hash)
            .and_then(|bucket| bucket.iter().position(|slot| matches(&slot.entry)));
        let Some(at) = at else {
            self.stats.misses += 1;
            return None;
        };
        self.used(hash, at)
    }

    /// `get` trying the last few entries used first: `hash` is only computed when none of
    /// them `matches`. A caller that meets the same few entries again and again (a rank's few
    /// peers) skips hashing them.
    pub fn get_recent_or(
        &mut self,
        matches: impl Fn(&E) -> bool,
        hash: impl FnOnce() -> u64,
    ) -> Option<&mut E> {
        let recent = self.recent.iter().find_map(|&hash| {
            let bucket = self.buckets.get(&hash)?;
            let at = bucket.iter().position(|slot| matches(&slot.entry))?;
            Some((hash, at))
        });
        match recent {
            Some((hash, at)) => self.used(hash, at),
            None => self.get(hash(), matches),
        }
    }

    /// One of the last few entries used that `matches`, neither counted nor marked: to update
    /// an entry just used.
    pub fn recent_mut(&mut self, matches: impl Fn(&E) -> bool) -> Option<&mut E> {
        let recent = &self.recent;
        self.buckets
            .iter_mut()
            .filter(|(hash, _)| recent.contains(hash))
            .flat_map(|(_, bucket)| bucket.iter_mut())
            .map(|slot| &mut slot.entry)
            .find(|entry| matches(entry))
    }

    /// Entry `at` of bucket `hash`, marked as just used.
    fn used(&mut self, hash: u64, at: usize) -> Option<&mut E> {
        self.tick += 1;
        let slot = self.buckets.get_mut(&hash)?.get_mut(at)?;
        slot.last_used = self.tick;
        self.stats.hits += 1;
        note_recent(&mut self.recent, hash);
        Some(&mut slot.entry)
    }

    /// Keeps `entry` under `hash`, evicting the least recently used past the bounds. Returns
    /// what left the cache (`entry` itself when it is too heavy to keep), for the caller to
    /// drop where that is safe.
    pub fn insert(&mut self, hash: u64, entry: E, weight: usize) -> Vec<E> {
        if weight > self.max_weight / 8 || self.max_entries == 0 {
            return vec![entry];
        }
        let mut evicted = Vec::new();
        while self.stats.entries >= self.max_entries || self.stats.weight + weight > self.max_weight
        {
            let gone = self.evict_oldest_quarter();
            if gone.is_empty() {
                break;
            }
            evicted.extend(gone);
        }
        self.tick += 1;
        self.buckets.entry(hash).or_default().push(Slot {
            entry,
            weight,
            last_used: self.tick,
        });
        self.stats.entries += 1;
        self.stats.weight += weight;
        note_recent(&mut self.recent, hash);
        evicted
    }

    /// Removes the least recently used quarter of the entries (at least one) in one pass, so a
    /// stream of new entries costs O(1) a miss, amortised, not a scan each.
    fn evict_oldest_quarter(&mut self) -> Vec<E> {
        let mut ticks: Vec<u64> = self
            .buckets
            .values()
            .flatten()
            .map(|s| s.last_used)
            .collect();
        if ticks.is_empty() {
            return Vec::new();
        }
        // Ticks are unique (one a use), so exactly the `count` oldest are at or below it.
        let count = (ticks.len() / 4).max(1);
        let (_, &mut threshold, _) = ticks.select_nth_unstable(count - 1);
        let mut evicted = Vec::new();
        for bucket in self.buckets.values_mut() {
            let (kept, gone): (Vec<_>, Vec<_>) =
                bucket.drain(..).partition(|s| s.last_used > threshold);
            *bucket = kept;
            for slot in gone {
                self.stats.entries -= 1;
                self.stats.weight -= slot.weight;
                evicted.push(slot.entry);
            }
        }
        self.buckets.retain(|_, bucket| !bucket.is_empty());
        evicted
    }
}

/// How many recently used hashes `get_recent` tries.
const RECENT: usize = 8;

/// Puts `hash` first among the recent ones, dropping the oldest past `RECENT`. A hash whose
/// entries were evicted may linger; `get_recent` finds nothing under it and moves on.
fn note_recent(recent: &mut Vec<u64>, hash: u64) {
    if let Some(at) = recent.iter().position(|&h| h == hash) {
        recent.remove(at);
    }
    recent.insert(0, hash);
    recent.truncate(RECENT);
}

/// A process-wide cache, made on first use: `static CACHE: Shared<E> = Shared::new(n, w);`.
pub struct Shared<E> {
    cell: OnceLock<Mutex<Lru<E>>>,
    max_entries: usize,
    max_weight: usize,
}

impl<E> Shared<E> {
    pub const fn new(max_entries: usize, max_weight: usize) -> Self {
        Self {
            cell: OnceLock::new(),
            max_entries,
            max_weight,
        }
    }

    /// The cache, locked. A panic while it was held leaves nothing half-written that matters
    /// (counters at worst), so a poisoned lock is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, Lru<E>> {
        self.cell
            .get_or_init(|| Mutex::new(Lru::new(self.max_entries, self.max_weight)))
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_confirmed_and_the_least_recently_used_go_first() {
        let mut lru: Lru<u64> = Lru::new(4, 1 << 20);
        for value in 0..4 {
            assert!(lru.insert(value % 2, value, 1).is_empty());
        }
        // Same hash, another value: a miss.
        assert_eq!(lru.get(0, |&v| v == 5), None);
        assert_eq!(lru.get(0, |&v| v == 2).copied(), Some(2)); // 2 is now the newest
        let gone = lru.insert(9, 9, 1);
        assert_eq!(gone, vec![0]); // 4 / 4 = 1: the oldest one
        assert_eq!(lru.get(0, |&v| v == 0), None);
        let stats = lru.stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.entries, stats.weight),
            (1, 2, 4, 4)
        );
    }

    #[test]
    fn recent_entries_are_found_without_their_hash_and_others_with_it() {
        let mut lru: Lru<u64> = Lru::new(64, 1 << 20);
        for value in 0..20 {
            lru.insert(value, value, 1);
        }
        let never = || -> u64 { panic!("hashed a recent entry") };
        assert_eq!(lru.get_recent_or(|&v| v == 19, never).copied(), Some(19));
        assert_eq!(lru.get_recent_or(|&v| v == 12, never).copied(), Some(12));
        // Past the last few used: found under its hash, which is then computed.
        let mut hashed = false;
        let found = lru.get_recent_or(
            |&v| v == 3,
            || {
                hashed = true;
                3
            },
        );
        assert_eq!((found.copied(), hashed), (Some(3), true));
        assert_eq!(lru.get_recent_or(|&v| v == 3, never).copied(), Some(3));
        assert_eq!(lru.get_recent_or(|&v| v == 99, || 99), None);
        // Neither counted nor marked: an update of an entry just used.
        let before = lru.stats();
        *lru.recent_mut(|&v| v == 3).unwrap() = 3;
        assert!(lru.recent_mut(|&v| v == 4).is_none());
        assert_eq!(lru.stats(), before);
        assert_eq!((before.hits, before.misses), (4, 1));
    }

    #[test]
    fn weight_bounds_the_cache_and_heavy_entries_are_not_kept() {
        let mut lru: Lru<&str> = Lru::new(100, 80);
        assert_eq!(lru.insert(1, "heavy", 11), vec!["heavy"]);
        for hash in 0..8 {
            lru.insert(hash, "light", 10);
        }
        assert_eq!(lru.stats().weight, 80);
        let gone = lru.insert(8, "one more", 10);
        assert_eq!(gone.len(), 2); // a quarter of 8
        assert_eq!(lru.stats().weight, 70);
        assert!(Lru::<u8>::new(0, 10).insert(0, 1, 1) == vec![1]);
    }
}
