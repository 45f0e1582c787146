//! A byte-bounded LRU shared by a store's readers, keyed by source file version: a BLZ store's
//! array descriptions (a Bloscpack file's header, metadata and chunk table, read once per
//! version), chunks whose checksum was verified and decoded last chunks; a zip store's inflated
//! entries.

use std::hash::Hash;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::store::Stamp;

/// Fixed bookkeeping cost charged per entry.
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug)]
struct Inner<K: Hash + Eq, V> {
    lru: LruCache<K, (Stamp, V, usize)>,
    used: usize,
}

/// Values of `V`, each remembered with the stamp of the version it was made from and its size.
#[derive(Debug)]
pub struct Cache<K: Hash + Eq, V: Clone> {
    inner: Mutex<Inner<K, V>>,
    budget: usize,
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    pub fn new(budget: usize) -> Self {
        Cache { inner: Mutex::new(Inner { lru: LruCache::unbounded(), used: 0 }), budget }
    }

    /// The value for `key` if it was made from version `stamp`.
    pub fn get(&self, key: &K, stamp: &Stamp) -> Option<V> {
        let mut inner = self.inner.lock();
        match inner.lru.get(key) {
            Some((s, value, _)) if s == stamp => Some(value.clone()),
            _ => None,
        }
    }

    /// Remembers `value` (about `bytes` large) for `key` at `stamp`, evicting the least recently
    /// used entries past the budget (always keeping the newest).
    pub fn insert(&self, key: K, stamp: Stamp, value: V, bytes: usize) {
        let bytes = bytes + ENTRY_OVERHEAD;
        let mut inner = self.inner.lock();
        if let Some((_, _, old)) = inner.lru.put(key, (stamp, value, bytes)) {
            inner.used -= old;
        }
        inner.used += bytes;
        while inner.used > self.budget && inner.lru.len() > 1 {
            let (_, (_, _, evicted)) = inner.lru.pop_lru().expect("non-empty");
            inner.used -= evicted;
        }
    }

    /// The value for `key` at `stamp`, made with `make` on a miss.
    pub fn get_or(&self, key: K, stamp: Stamp, make: impl FnOnce() -> (V, usize)) -> V {
        if let Some(value) = self.get(&key, &stamp) {
            return value;
        }
        let (value, bytes) = make();
        self.insert(key, stamp, value.clone(), bytes);
        value
    }
}

/// Bytes shared between the cache and readers.
pub type Shared = Arc<[u8]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_budget_and_misses_other_versions() {
        let cache: Cache<u32, u32> = Cache::new(3 * (ENTRY_OVERHEAD + 100));
        let stamp = Stamp::new([1; 5]);
        for i in 0..10 {
            cache.insert(i, stamp, i, 100);
        }
        assert_eq!(cache.get(&9, &stamp), Some(9));
        assert_eq!(cache.get(&0, &stamp), None);
        assert_eq!(cache.get(&9, &Stamp::new([2; 5])), None);
        assert_eq!(cache.get_or(3, stamp, || (33, 1)), 33);
    }
}
