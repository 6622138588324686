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
    pub fn get(&mut self, hash: u64, matches: impl Fn(&E) -> bool) -> Option<&E> {
        self.tick += 1;
        let tick = self.tick;
        let found = self
            .buckets
            .get_mut(&hash)
            .and_then(|bucket| bucket.iter_mut().find(|slot| matches(&slot.entry)));
        let Some(slot) = found else {
            self.stats.misses += 1;
            return None;
        };
        slot.last_used = tick;
        self.stats.hits += 1;
        Some(&slot.entry)
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
        assert_eq!(lru.get(0, |&v| v == 2), Some(&2)); // 2 is now the newest
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
