//! Least-recently-used eviction for the bounded caches (parsed frames, encoded frames): entries
//! in hash buckets, each stamped with the tick of its last use.

use std::collections::HashMap;
use std::hash::BuildHasher;

/// Removes the least recently used quarter of the entries (at least one) in one pass and
/// returns them, so a stream of new entries costs O(1) a miss, amortised, not a scan each.
pub fn evict_oldest_quarter<E, S: BuildHasher>(
    buckets: &mut HashMap<u64, Vec<E>, S>,
    last_used: impl Fn(&E) -> u64,
) -> Vec<E> {
    let mut ticks: Vec<u64> = buckets.values().flatten().map(&last_used).collect();
    if ticks.is_empty() {
        return Vec::new();
    }
    let cut = ticks.len() / 4;
    let (_, &mut threshold, _) = ticks.select_nth_unstable(cut);
    let mut evicted = Vec::new();
    for bucket in buckets.values_mut() {
        let (kept, gone): (Vec<E>, Vec<E>) =
            bucket.drain(..).partition(|e| last_used(e) > threshold);
        *bucket = kept;
        evicted.extend(gone);
    }
    buckets.retain(|_, bucket| !bucket.is_empty());
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_quarter_goes() {
        let mut buckets: HashMap<u64, Vec<u64>> = HashMap::new();
        for tick in 0..8 {
            buckets.entry(tick % 3).or_default().push(tick);
        }
        let mut gone = evict_oldest_quarter(&mut buckets, |&t| t);
        gone.sort_unstable();
        assert_eq!(gone, vec![0, 1, 2]); // 8 / 4 = 2: ticks up to the third oldest
        assert_eq!(buckets.values().map(Vec::len).sum::<usize>(), 5);
        assert!(evict_oldest_quarter(&mut HashMap::<u64, Vec<u64>>::new(), |&t| t).is_empty());
    }
}
