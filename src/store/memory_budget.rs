//! The daemon's memory limit (`--memory-limit`), shared between its caches. Each cache takes a
//! fixed share, so that a mount stays within the limit whatever its store: the shares of the
//! caches one store uses add up to less than the whole (an Icechunk repository in a bucket, the
//! most, uses 9/16). Each cache evicts its least recently used entries to stay within its share;
//! an option that sizes one cache (`--cache-size`, `--read-ahead-size`, `--write-buffer-size`)
//! replaces its share.
//!
//! Not counted: what the kernel decides the daemon holds, the state of the inodes it holds
//! (about 20 bytes for a chunk file, about 400 for any other file or directory, until it forgets them)
//! and files written to an object store until they are stored.

/// A memory limit, and each cache's share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    pub limit: usize,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl MemoryBudget {
    /// The default limit (`--memory-limit 1G`).
    pub const DEFAULT: MemoryBudget = MemoryBudget { limit: 1 << 30 };

    /// Decoded shard indexes.
    pub const fn indexes(&self) -> usize {
        self.limit / 16
    }

    /// An object store's bytes fetched ahead of readers.
    pub const fn read_ahead(&self) -> usize {
        self.limit / 4
    }

    /// Chunk writes not yet committed: room for all four shards an object store's committers
    /// upload at once, when their shards are of 64 MiB (with an eighth, writers waited for two
    /// shards to go up before they could fill the next: 256 MiB written to S3 at 20 ms took
    /// 1.84 s where 256 MiB of room took 1.41-1.58 s).
    pub const fn write_buffer(&self) -> usize {
        self.limit / 4
    }

    /// An Icechunk repository's parsed manifests.
    pub const fn manifests(&self) -> usize {
        self.limit / 4
    }

    /// kerchunk's parquet record files, as read.
    pub const fn records(&self) -> usize {
        self.limit / 16
    }

    /// BLZ array descriptions, and decoded BLZ chunks (each).
    pub const fn blz(&self) -> usize {
        self.limit / 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_gives_the_caches_their_usual_sizes() {
        let budget = MemoryBudget::default();
        assert_eq!((budget.indexes(), budget.read_ahead(), budget.write_buffer()), (64 << 20, 256 << 20, 256 << 20));
        assert_eq!((budget.manifests(), budget.records(), budget.blz()), (256 << 20, 64 << 20, 64 << 20));
    }

    #[test]
    fn no_store_uses_more_than_its_limit() {
        let b = MemoryBudget { limit: 1600 };
        let icechunk_in_a_bucket = b.indexes() + b.read_ahead() + b.manifests();
        let writable_bucket = b.indexes() + b.read_ahead() + b.write_buffer();
        let blz = b.indexes() + 2 * b.blz() + b.write_buffer();
        let kerchunk_in_a_bucket = b.indexes() + b.read_ahead() + b.records();
        for used in [icechunk_in_a_bucket, writable_bucket, blz, kerchunk_in_a_bucket] {
            assert!(used <= b.limit, "{used}");
        }
    }
}
