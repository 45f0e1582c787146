//! What the daemon counts for an operator: requests to the backing store, bytes, cache hits,
//! pending chunks and commits, lease turns and the errors callers were given, in one registry
//! for the process (a daemon serves one mount), kept always, as a few atomic additions and a
//! short lock per request, and shown only when asked for.
//!
//! - [`text`]: the registry as Prometheus text;
//! - [`serve`]: the `--metrics-address` listener, and `shardfs status`'s scrape of it.
//!
//! The counters are plain functions on a static rather than a value handed down: every layer
//! from the store to the FUSE adapter counts, and none of them should carry the others' wiring.

pub mod serve;
pub mod text;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the request latency histogram's buckets, in seconds: from a local file's
/// read to an object store's slow tail.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The latencies of one kind of request.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// How many requests fell at or below each of [`LATENCY_BUCKETS`] (not cumulative here).
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&bound| seconds <= bound) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// What is counted under labels, behind one lock.
#[derive(Debug, Default)]
struct Labelled {
    /// Store requests by (kind, outcome).
    requests: BTreeMap<(&'static str, &'static str), u64>,
    /// Store request latencies by kind.
    latency: BTreeMap<&'static str, Histogram>,
    /// Cache lookups by (cache, hit).
    /// Shard commits by outcome.
    commits: BTreeMap<&'static str, u64>,
    /// Commits that found another machine's lease, by how they waited.
    lease_waits: BTreeMap<&'static str, u64>,
    /// Errors given to callers by errno.
    errors: BTreeMap<i32, u64>,
}

struct Registry {
    labelled: Mutex<Labelled>,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    chunks_pending: AtomicI64,
    bytes_pending: AtomicI64,
    inodes: AtomicI64,
    lease_takeovers: AtomicU64,
    /// Misses and hits of each of [`CACHES`]: atomics, not the lock, as every read looks in one.
    caches: [[AtomicU64; 2]; CACHES.len()],
}

/// The caches counted, in the order they are shown.
const CACHES: [&str; 4] = ["disk", "fetch", "index", "metadata"];

static REGISTRY: Registry = Registry {
    labelled: Mutex::new(Labelled {
        requests: BTreeMap::new(),
        latency: BTreeMap::new(),
        commits: BTreeMap::new(),
        lease_waits: BTreeMap::new(),
        errors: BTreeMap::new(),
    }),
    bytes_received: AtomicU64::new(0),
    bytes_sent: AtomicU64::new(0),
    chunks_pending: AtomicI64::new(0),
    bytes_pending: AtomicI64::new(0),
    inodes: AtomicI64::new(0),
    lease_takeovers: AtomicU64::new(0),
    caches: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; CACHES.len()],
};

fn labelled() -> std::sync::MutexGuard<'static, Labelled> {
    // A thread that panicked while counting left numbers, not broken invariants.
    REGISTRY.labelled.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One request to the backing store: its kind (`get`, `head`, `put`, `list`, `delete`, `copy`,
/// `multipart`, ...), how it ended (`ok`, `not_found`, `precondition_failed`, `error`, ...) and
/// how long it took.
pub fn request(kind: &'static str, outcome: &'static str, took: Duration) {
    let mut labelled = labelled();
    *labelled.requests.entry((kind, outcome)).or_default() += 1;
    labelled.latency.entry(kind).or_default().observe(took.as_secs_f64());
}

/// Bytes read from the backing store.
pub fn received(bytes: u64) {
    REGISTRY.bytes_received.fetch_add(bytes, Ordering::Relaxed);
}

/// Bytes written to the backing store.
pub fn sent(bytes: u64) {
    REGISTRY.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
}

/// A lookup in `cache` that found (`hit`) or did not find what it looked for.
pub fn cache(cache: &'static str, hit: bool) {
    if let Some(at) = CACHES.iter().position(|c| *c == cache) {
        REGISTRY.caches[at][usize::from(hit)].fetch_add(1, Ordering::Relaxed);
    } else {
        debug_assert!(false, "a cache not in CACHES: {cache}");
    }
}

/// Chunks written and not yet committed went up (or down) by `chunks`, holding `bytes` more.
pub fn pending(chunks: i64, bytes: i64) {
    REGISTRY.chunks_pending.fetch_add(chunks, Ordering::Relaxed);
    REGISTRY.bytes_pending.fetch_add(bytes, Ordering::Relaxed);
}

/// The kernel now holds `n` inodes of the mount.
pub fn inodes(n: usize) {
    REGISTRY.inodes.store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
}

/// A shard commit ended as `outcome` (`ok`, or the kind of failure).
pub fn commit(outcome: &'static str) {
    *labelled().commits.entry(outcome).or_default() += 1;
}

/// A commit found another machine holding the shard's lease and waited, as `how` says (`queue`:
/// for its turn; `delta`: as a delta the holder folds in).
pub fn lease_wait(how: &'static str) {
    *labelled().lease_waits.entry(how).or_default() += 1;
}

/// A lease whose holder stopped renewing it was taken over.
pub fn lease_takeover() {
    REGISTRY.lease_takeovers.fetch_add(1, Ordering::Relaxed);
}

/// A caller (a FUSE request) was given `errno`.
pub fn error_given(errno: i32) {
    *labelled().errors.entry(errno).or_default() += 1;
}

/// Every number at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub requests: Vec<((&'static str, &'static str), u64)>,
    pub latency: Vec<(&'static str, Histogram)>,
    pub caches: Vec<((&'static str, bool), u64)>,
    pub commits: Vec<(&'static str, u64)>,
    pub lease_waits: Vec<(&'static str, u64)>,
    pub errors: Vec<(i32, u64)>,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub chunks_pending: i64,
    pub bytes_pending: i64,
    pub inodes: i64,
    pub lease_takeovers: u64,
}

/// The registry as it is now.
pub fn snapshot() -> Snapshot {
    let labelled = labelled();
    Snapshot {
        requests: labelled.requests.iter().map(|(k, v)| (*k, *v)).collect(),
        latency: labelled.latency.iter().map(|(k, v)| (*k, v.clone())).collect(),
        caches: CACHES
            .iter()
            .zip(&REGISTRY.caches)
            .flat_map(|(name, counts)| {
                [false, true].map(|hit| ((*name, hit), counts[usize::from(hit)].load(Ordering::Relaxed)))
            })
            .filter(|(_, n)| *n > 0)
            .collect(),
        commits: labelled.commits.iter().map(|(k, v)| (*k, *v)).collect(),
        lease_waits: labelled.lease_waits.iter().map(|(k, v)| (*k, *v)).collect(),
        errors: labelled.errors.iter().map(|(k, v)| (*k, *v)).collect(),
        bytes_received: REGISTRY.bytes_received.load(Ordering::Relaxed),
        bytes_sent: REGISTRY.bytes_sent.load(Ordering::Relaxed),
        chunks_pending: REGISTRY.chunks_pending.load(Ordering::Relaxed),
        bytes_pending: REGISTRY.bytes_pending.load(Ordering::Relaxed),
        inodes: REGISTRY.inodes.load(Ordering::Relaxed),
        lease_takeovers: REGISTRY.lease_takeovers.load(Ordering::Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_the_first_bucket_that_holds_them() {
        let mut histogram = Histogram::default();
        histogram.observe(0.0001);
        histogram.observe(0.003);
        histogram.observe(60.0);
        assert_eq!(histogram.buckets[0], 1);
        assert_eq!(histogram.buckets[3], 1, "3 ms is at most 5 ms");
        assert_eq!(histogram.buckets.iter().sum::<u64>(), 2, "a minute is only in +Inf");
        assert_eq!(histogram.count, 3);
    }
}
