//! Group commit: chunk writes wait here, visible through the view at once (this is the view's
//! [`Overlay`]), until one commit carries every pending chunk of a shard to disk. A shard is
//! committed when a chunk file in it is fsync'd, when its pending bytes pass
//! [`Policy::shard_bytes`], once it has been idle for [`Policy::idle`], and at unmount, so that
//! writing a shard's chunks one file at a time appends a handful of indexes, not one per chunk.
//! A shard past the threshold is committed by the background committer while the writer goes on
//! (a copy into a shard overlaps the next writes), unless the committer has fallen behind: then
//! the writer commits it, which bounds the memory pending writes take.
//!
//! A failed commit keeps its chunks pending (nothing acknowledged is dropped) and its error is
//! reported by the next fsync or close of a file in that shard.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::commit::{CommitError, NestedChanges, commit_levels};
use super::crash_point::CrashPoint;
use crate::store::DirStore;
use crate::view::array::ShardedArray;
use crate::view::overlay::{Buffer, Overlay, PendingChunk};

/// When pending chunks are committed besides fsync and unmount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A shard whose pending chunks reach this many bytes is committed at once.
    pub shard_bytes: usize,
    /// A shard with no new write for this long is committed by the background flusher.
    pub idle: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { shard_bytes: 16 << 20, idle: Duration::from_secs(2) }
    }
}

#[derive(Debug)]
struct Entry {
    state: PendingChunk,
    /// Bumped by every change, so a commit drops only the entries it carried unchanged.
    generation: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Shard {
    array: Arc<ShardedArray>,
    /// Pending chunks by grid coordinates.
    entries: HashMap<Vec<u64>, Entry>,
    bytes: usize,
    last_write: Instant,
    /// The last failed commit: its errno (when it had one) and message.
    error: Option<(Option<i32>, String)>,
    /// Held while the shard is being committed, so one commit at a time carries its chunks.
    committing: Arc<Mutex<()>>,
}

/// Every pending chunk write and chunk directory of one mount.
#[derive(Debug, Default)]
pub struct Pending {
    shards: Mutex<HashMap<String, Shard>>,
    dirs: Mutex<HashMap<String, BTreeSet<String>>>,
    generation: AtomicU64,
    policy: Policy,
    /// Shards committed since [`Pending::take_committed`] last asked.
    committed: Mutex<HashSet<String>>,
    /// Shards past the threshold, waiting for the background committer, which `due_ready` wakes.
    due: Mutex<Vec<String>>,
    due_ready: Condvar,
}

/// The most shards past the threshold that wait for the background committer; beyond them (or
/// at twice the threshold in one shard) writers commit themselves.
const MAX_DUE: usize = 4;

/// The store key of the shard that holds a chunk.
fn shard_key(array: &ShardedArray, coords: &[u64]) -> String {
    array.shard_path(&array.meta.sharding.locate(coords).shard)
}

impl Pending {
    pub fn new(policy: Policy) -> Self {
        Pending { policy, ..Default::default() }
    }

    /// Records a new state for a chunk (its content, shared with the files writing it, or its
    /// deletion). Returns the shard's key when the caller should commit the shard now.
    pub fn set(&self, array: &Arc<ShardedArray>, coords: &[u64], state: PendingChunk) -> Option<String> {
        let bytes = match &state {
            PendingChunk::Written(buffer) => buffer.read().len(),
            PendingChunk::Deleted => 0,
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let key = shard_key(array, coords);
        let mut shards = self.shards.lock();
        let shard = shards.entry(key.clone()).or_insert_with(|| Shard {
            array: array.clone(),
            entries: HashMap::new(),
            bytes: 0,
            last_write: Instant::now(),
            error: None,
            committing: Arc::default(),
        });
        let old = shard.entries.insert(coords.to_vec(), Entry { state, generation, bytes });
        shard.bytes = shard.bytes + bytes - old.map_or(0, |e| e.bytes);
        shard.last_write = Instant::now();
        if shard.bytes < self.policy.shard_bytes {
            return None;
        }
        let mut due = self.due.lock();
        if shard.bytes / 2 >= self.policy.shard_bytes || due.len() >= MAX_DUE {
            return Some(key);
        }
        if !due.contains(&key) {
            due.push(key);
            self.due_ready.notify_one();
        }
        None
    }

    /// Waits up to `timeout` for shards past the threshold, and returns them.
    pub fn wait_due(&self, timeout: Duration) -> Vec<String> {
        let mut due = self.due.lock();
        if due.is_empty() {
            self.due_ready.wait_for(&mut due, timeout);
        }
        std::mem::take(&mut *due)
    }

    /// Remembers a chunk-key directory made through the view (`dir` relative to the array).
    pub fn add_dir(&self, array: &ShardedArray, dir: &str) {
        self.dirs.lock().entry(array.dir.clone()).or_default().insert(dir.to_string());
    }

    /// Forgets a made directory; true when it was one.
    pub fn remove_dir(&self, array: &ShardedArray, dir: &str) -> bool {
        self.dirs.lock().get_mut(&array.dir).is_some_and(|dirs| dirs.remove(dir))
    }

    /// The errno and message of the last failed commit of the chunk's shard, if any, cleared by
    /// reading it.
    pub fn take_error(&self, array: &ShardedArray, coords: &[u64]) -> Option<(Option<i32>, String)> {
        self.shards.lock().get_mut(&shard_key(array, coords)).and_then(|s| s.error.take())
    }

    /// True while the last commit of the chunk's shard has failed and no close or fsync has
    /// reported it yet.
    pub fn has_error(&self, array: &ShardedArray, coords: &[u64]) -> bool {
        self.shards.lock().get(&shard_key(array, coords)).is_some_and(|s| s.error.is_some())
    }

    /// Commits the pending chunks of the shard that holds `coords`.
    pub fn commit_chunk_shard(
        &self,
        store: &DirStore,
        array: &ShardedArray,
        coords: &[u64],
    ) -> Result<(), CommitError> {
        self.commit_shard(store, &shard_key(array, coords))
    }

    /// Commits every pending chunk of the shard at `key`, durably.
    pub fn commit_shard(&self, store: &DirStore, key: &str) -> Result<(), CommitError> {
        let Some(committing) = self.shards.lock().get(key).map(|s| s.committing.clone()) else { return Ok(()) };
        let _one_at_a_time = committing.lock();
        let (array, carried) = {
            let shards = self.shards.lock();
            let Some(shard) = shards.get(key) else { return Ok(()) };
            let carried: Vec<(Vec<u64>, u64, Option<Buffer>)> = shard
                .entries
                .iter()
                .map(|(coords, e)| {
                    let buffer = match &e.state {
                        PendingChunk::Written(buffer) => Some(buffer.clone()),
                        PendingChunk::Deleted => None,
                    };
                    (coords.clone(), e.generation, buffer)
                })
                .collect();
            (shard.array.clone(), carried)
        };
        // The buffers are read in place, not copied: a write to one of these chunks waits for the
        // commit; a write that got in before is carried along and re-committed (its generation).
        let contents: Vec<_> = carried.iter().map(|(_, _, buffer)| buffer.as_ref().map(|b| b.read())).collect();
        let sharding = &array.meta.sharding;
        let changes: NestedChanges = carried
            .iter()
            .zip(&contents)
            .map(|((coords, ..), content)| (sharding.locate(coords).entries, content.as_ref().map(|c| c[..].into())))
            .collect();
        let specs: Vec<_> = sharding.levels.iter().map(|level| level.index).collect();
        let result = commit_levels(store, key, &specs, &changes, &mut CrashPoint::never());
        drop(changes);
        drop(contents);
        let mut shards = self.shards.lock();
        let Some(shard) = shards.get_mut(key) else { return result.map(drop) };
        match result {
            Ok(_) => {
                self.committed.lock().insert(key.to_string());
                for (coords, generation, _) in carried {
                    if shard.entries.get(&coords).is_some_and(|e| e.generation == generation) {
                        let e = shard.entries.remove(&coords).expect("present");
                        shard.bytes -= e.bytes;
                    }
                }
                if shard.entries.is_empty() {
                    shards.remove(key);
                }
                Ok(())
            }
            Err(e) => {
                log::error!("commit failed, chunks stay pending: {e}");
                let errno = match &e {
                    CommitError::Io { source, .. } => source.raw_os_error(),
                    _ => None,
                };
                shard.error = Some((errno, e.to_string()));
                Err(e)
            }
        }
    }

    /// The keys of the shards committed since the last call: their new versions are this mount's
    /// own doing, which the kernel's caches already reflect.
    pub fn take_committed(&self) -> HashSet<String> {
        std::mem::take(&mut *self.committed.lock())
    }

    /// Commits the shards idle for at least the policy's interval; errors are kept for the next
    /// fsync or close.
    pub fn commit_idle(&self, store: &DirStore) {
        let idle: Vec<String> = {
            let shards = self.shards.lock();
            shards.iter().filter(|(_, s)| s.last_write.elapsed() >= self.policy.idle).map(|(k, _)| k.clone()).collect()
        };
        for key in idle {
            let _ = self.commit_shard(store, &key);
        }
    }

    /// Commits everything pending; the first error is returned after trying every shard.
    pub fn commit_all(&self, store: &DirStore) -> Result<(), CommitError> {
        let keys: Vec<String> = self.shards.lock().keys().cloned().collect();
        let mut first = Ok(());
        for key in keys {
            if let Err(e) = self.commit_shard(store, &key)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

impl Overlay for Pending {
    fn chunk(&self, array: &ShardedArray, coords: &[u64]) -> Option<PendingChunk> {
        self.shards.lock().get(&shard_key(array, coords))?.entries.get(coords).map(|e| e.state.clone())
    }

    fn chunks_under(&self, array: &ShardedArray, prefix: &[u64]) -> Vec<(Vec<u64>, PendingChunk)> {
        let shards = self.shards.lock();
        shards
            .values()
            .filter(|s| s.array.dir == array.dir)
            .flat_map(|s| s.entries.iter())
            .filter(|(coords, _)| coords.starts_with(prefix))
            .map(|(coords, e)| (coords.clone(), e.state.clone()))
            .collect()
    }

    fn dirs(&self, array: &ShardedArray) -> Vec<String> {
        self.dirs.lock().get(&array.dir).map(|d| d.iter().cloned().collect()).unwrap_or_default()
    }
}
