//! Decoded shard indexes in an LRU bounded by bytes. Each entry remembers the [`Stamp`] of the
//! file it was read from, and a lookup with any other stamp misses: a shard rewritten underneath
//! the mount is never served from its old index. Damaged indexes are cached too, so a bad shard
//! costs one read and one log line per version, not one per access.

use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::format::shard_index::{IndexError, ShardIndex};
use crate::store::Stamp;

/// Identifies one index: the shard's store key and the byte range of the blob it indexes (the
/// whole file for the outermost level, a nested shard for inner levels; a nested shard may start
/// at 0 too, so the range's end is part of the key).
pub type IndexKey = (String, u64, u64);

/// A decoded index, or why it could not be decoded.
pub type Decoded = Result<Arc<ShardIndex>, IndexError>;

/// Fixed bookkeeping cost charged per entry besides the key and the index itself.
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug)]
struct Cached {
    stamp: Stamp,
    decoded: Decoded,
    bytes: usize,
}

#[derive(Debug)]
struct Inner {
    lru: LruCache<IndexKey, Cached>,
    used: usize,
}

/// A byte-bounded, stamp-validated cache of decoded shard indexes.
#[derive(Debug)]
pub struct IndexCache {
    inner: Mutex<Inner>,
    budget: usize,
    max_index_bytes: u64,
}

impl IndexCache {
    /// A cache that holds at most `budget` bytes of decoded indexes (at least one index).
    pub fn new(budget: usize) -> Self {
        IndexCache {
            inner: Mutex::new(Inner { lru: LruCache::unbounded(), used: 0 }),
            budget,
            max_index_bytes: DEFAULT_MAX_INDEX_BYTES,
        }
    }

    /// The same cache, refusing arrays whose shards would each need an index of more than
    /// `bytes` (`--max-index-size`): such an array is shown as stored, with a log line.
    pub fn with_max_index_bytes(self, bytes: u64) -> Self {
        IndexCache { max_index_bytes: bytes, ..self }
    }

    /// The largest index one shard of a shown array may need.
    pub fn max_index_bytes(&self) -> u64 {
        self.max_index_bytes
    }

    /// The index for `key` if it was decoded from the file version `stamp`.
    pub fn get(&self, key: &IndexKey, stamp: &Stamp) -> Option<Decoded> {
        let mut inner = self.inner.lock();
        let found = match inner.lru.get(key) {
            Some(c) if c.stamp == *stamp => Some(c.decoded.clone()),
            _ => None,
        };
        crate::metrics::cache("index", found.is_some());
        found
    }

    /// Remembers `decoded` for `key` at `stamp`, evicting the least recently used entries past
    /// the budget.
    pub fn insert(&self, key: IndexKey, stamp: Stamp, decoded: Decoded) {
        let bytes = ENTRY_OVERHEAD + key.0.len() + decoded.as_ref().map_or(0, |i| i.heap_bytes());
        let mut inner = self.inner.lock();
        if let Some(old) = inner.lru.put(key, Cached { stamp, decoded, bytes }) {
            inner.used -= old.bytes;
        }
        inner.used += bytes;
        while inner.used > self.budget && inner.lru.len() > 1 {
            let (_, evicted) = inner.lru.pop_lru().expect("non-empty");
            inner.used -= evicted.bytes;
        }
    }

    #[cfg(test)]
    fn used(&self) -> usize {
        self.inner.lock().used
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().lru.len()
    }
}

/// The budget used when none is given: 64 MiB holds the indexes of 4 million inner chunks.
pub const DEFAULT_BUDGET: usize = crate::store::memory_budget::MemoryBudget::DEFAULT.indexes();

/// The largest index of one shard shown unsharded when no limit is given: the format layer's own
/// ceiling of 2^24 entries, 16 bytes each.
pub const DEFAULT_MAX_INDEX_BYTES: u64 = crate::format::sharding::MAX_INDEX_ENTRIES * 16;

impl Default for IndexCache {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard_index::{Endian, IndexLocation, IndexSpec};

    fn stamp(size: u64) -> Stamp {
        Stamp::new([1, 2, size, 3, 4])
    }

    fn index(entries: u64) -> Decoded {
        let spec = IndexSpec { entries, endian: Endian::Little, checksum: false, location: IndexLocation::End };
        let bytes = spec.encode(&vec![(u64::MAX, u64::MAX); entries as usize]);
        Ok(Arc::new(ShardIndex::decode(&spec, &bytes, spec.encoded_len(), 0).unwrap()))
    }

    #[test]
    fn misses_when_the_file_changed() {
        let cache = IndexCache::new(1 << 20);
        let key = ("a/c/0".to_string(), 0, 10);
        cache.insert(key.clone(), stamp(10), index(2));
        assert!(cache.get(&key, &stamp(10)).is_some());
        assert!(cache.get(&key, &stamp(11)).is_none());
    }

    #[test]
    fn stays_within_its_budget() {
        let one = ENTRY_OVERHEAD + 5 + 16 * 100;
        let cache = IndexCache::new(3 * one);
        for i in 0..10 {
            cache.insert((format!("s/{i:03}"), 0, 1), stamp(1), index(100));
            assert!(cache.used() <= 3 * one);
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&("s/009".to_string(), 0, 1), &stamp(1)).is_some());
        assert!(cache.get(&("s/000".to_string(), 0, 1), &stamp(1)).is_none());
    }
}
