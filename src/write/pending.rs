//! Group commit: chunk writes wait here, visible through the view at once (this is the view's
//! [`Overlay`]), until one commit carries every pending chunk of a shard to the store. A shard is
//! committed when a chunk file in it is fsync'd, as soon as every chunk of it is pending (nothing
//! later could add to it), once it has been idle for [`Policy::idle`], and at unmount, so that
//! writing a shard's chunks one file at a time costs a handful of commits, not one per chunk.
//! Background committers ([`Pending::take_due`]) commit several shards at once while writers go on.
//!
//! On a store that appends, a shard is also committed once its pending bytes pass
//! [`Policy::shard_bytes`] (an append costs only what is new), and when the committers fall behind
//! the writer commits it itself. On a store where each commit rewrites the whole shard (an object
//! store), committing a shard before it is complete would upload it again at each commit: its
//! chunks wait for the shard to fill, or to be left alone. Either way pending chunks hold at most
//! [`Policy::memory`] bytes: past it a writer waits ([`Pending::make_room`]) until commits free
//! some, and when none is on its way the largest shard is committed as it is.
//!
//! A failed commit keeps its chunks pending (nothing acknowledged is dropped) and its error is
//! reported by the next fsync or close of a file in that shard.
//!
//! Pending chunks belong to the version of their array's document they were written under. A
//! commit first reads the document as it is now. A resize changes no chunk: every pending chunk is
//! committed, those outside a shrunk array too, as a plain store keeps a chunk file written before
//! a shrink (the view hides them until the array grows again; zarr-python deletes the chunks
//! outside before it writes the smaller shape, and those deletions are committed as well). When
//! the document was replaced by one whose chunks mean something else (another chunk grid, codecs,
//! data type, or no sharded array at all), nothing is committed: the writes are dropped with a log
//! line naming the array, and the files they were written through get ESTALE (see
//! `fs::write_ops`). A document that cannot be read for the moment (missing from a directory that
//! is still there, or not JSON: a writer may be half-way through it) keeps the writes pending, to
//! be committed once it can be read.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::commit::{CommitError, NestedChanges, Outcome, commit_levels};
use super::own_commits::OwnCommits;
use crate::metrics;
use crate::store::{self, Stamp};
use crate::view::array::ShardedArray;
use crate::view::documents::ArrayState;
use crate::view::namespace::Namespace;
use crate::view::overlay::{Buffer, Overlay, PendingChunk};

/// When pending chunks are committed besides fsync and unmount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// On a store that appends, a shard whose pending chunks reach this many bytes is committed
    /// at once. Each such commit is a journal record, an append and their fsyncs: 256 MiB written
    /// into 64 MiB shards of a local directory took 0.38 s with 16 MiB, 0.30 s with 64 MiB.
    pub shard_bytes: usize,
    /// A shard with no new write for this long is committed by the background flusher.
    pub idle: Duration,
    /// The most bytes pending chunks hold: past it writers wait for commits.
    pub memory: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { shard_bytes: 64 << 20, idle: Duration::from_secs(2), memory: 256 << 20 }
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
    /// The array as its document was when the chunks were written.
    array: Arc<ShardedArray>,
    /// Its place in the shard grid.
    coords: Vec<u64>,
    /// Pending chunks by grid coordinates.
    entries: HashMap<Vec<u64>, Entry>,
    bytes: usize,
    last_write: Instant,
    /// The last failed commit: its errno (when it had one) and message.
    error: Option<(Option<i32>, String)>,
    /// Held while the shard is being committed, so one commit at a time carries its chunks.
    committing: Arc<Mutex<()>>,
}

impl Shard {
    /// True when every chunk of the shard has a pending state: no later write can add to what a
    /// commit now would store. A chunk still open for writing (its buffer held by a file) is not
    /// settled yet, and a shard the array's edge cuts is never complete: the array may grow into
    /// it (zarr-python's `append` writes a chunk of it after each resize).
    fn is_complete(&self) -> bool {
        let settled = |e: &Entry| match &e.state {
            PendingChunk::Written(buffer) => Arc::strong_count(buffer) == 1,
            PendingChunk::Deleted => true,
        };
        let whole: u64 = self.array.meta.sharding.chunks_per_shard().iter().product();
        // Asked at every write: counting the entries each time made writing a shard's n chunks
        // cost n^2 / 2 visits (32,768 chunks: 11 minutes of a debug build).
        if (self.entries.len() as u64) < whole {
            return false;
        }
        let inside = self.entries.iter().filter(|(c, e)| self.array.in_bounds(c) && settled(e)).count() as u64;
        inside == whole && self.array.chunks_in_shard(&self.coords) == whole
    }

    /// The error that drops the pending chunks, which the array's document no longer describes;
    /// logged here, since no file may be left to report it.
    fn orphaned(&self, ns: &Namespace) -> CommitError {
        let e = CommitError::Stale { array: ns.store().describe(&self.array.dir), dropped: self.entries.len() };
        log::error!("{e}");
        e
    }
}

/// Every pending chunk write and chunk directory of one mount.
#[derive(Debug, Default)]
pub struct Pending {
    shards: Mutex<HashMap<String, Shard>>,
    dirs: Mutex<HashMap<Arc<str>, BTreeSet<String>>>,
    generation: AtomicU64,
    policy: Policy,
    /// Each commit rewrites the whole shard (the store cannot append).
    rewrites: bool,
    /// Bytes held by pending chunks, every shard's.
    held: AtomicUsize,
    /// Commits running now.
    running: AtomicUsize,
    /// Notified (with `due` held) when a commit ends, for writers waiting for room.
    room: Condvar,
    /// Shards committed since [`Pending::take_committed`] last asked.
    committed: Mutex<HashSet<String>>,
    /// The versions those commits went from and to.
    own: OwnCommits,
    /// Shards past the threshold, waiting for the background committer, which `due_ready` wakes.
    due: Mutex<Vec<String>>,
    due_ready: Condvar,
}

/// The most shards past the threshold that wait for the background committers; beyond them (or
/// at twice the threshold in one shard) writers commit themselves.
const MAX_DUE: usize = 4;

/// Shards committed at once, in the background and at unmount: on an object store each is a
/// round trip or an upload of its own.
pub const COMMITTERS: usize = 4;

/// Puts `key` on the list of shards due for a commit, once.
fn push_due(due: &mut Vec<String>, key: String, ready: &Condvar) {
    if !due.contains(&key) {
        due.push(key);
        ready.notify_one();
    }
}

/// The store key of the shard that holds a chunk.
fn shard_of(array: &ShardedArray, coords: &[u64]) -> String {
    array.shard_key(&array.meta.sharding.locate(coords).shard)
}

impl Pending {
    /// Pending writes committed as `policy` says, into a store where each commit rewrites the
    /// whole shard when `rewrites`.
    pub fn new(policy: Policy, rewrites: bool) -> Self {
        Pending { policy, rewrites, ..Default::default() }
    }

    /// Records a new state for a chunk (its content, shared with the files writing it, or its
    /// deletion). Returns the shard's key when the caller should commit the shard now.
    pub fn set(&self, array: &Arc<ShardedArray>, coords: &[u64], state: PendingChunk) -> Option<String> {
        let bytes = match &state {
            PendingChunk::Written(buffer) => buffer.read().len(),
            PendingChunk::Deleted => 0,
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let key = shard_of(array, coords);
        let mut shards = self.shards.lock();
        let shard = shards.entry(key.clone()).or_insert_with(|| Shard {
            array: array.clone(),
            coords: array.meta.sharding.locate(coords).shard,
            entries: HashMap::new(),
            bytes: 0,
            last_write: Instant::now(),
            error: None,
            committing: Arc::default(),
        });
        if !shard.array.same_chunks(array) {
            // The array was made anew under the chunks pending here: they are not its chunks (the
            // files they were written through get ESTALE), nor is their shard's error.
            log::error!(
                "{}: {} pending chunk writes dropped: the array was made anew with other chunks",
                array.dir,
                shard.entries.len()
            );
            self.held.fetch_sub(shard.bytes, Ordering::Relaxed);
            metrics::pending(-(shard.entries.len() as i64), -(shard.bytes as i64));
            shard.entries.clear();
            shard.bytes = 0;
            shard.error = None;
        }
        // The array as it is now (resized, perhaps): whether the shard is complete is of its shape.
        shard.array = array.clone();
        let old = shard.entries.insert(coords.to_vec(), Entry { state, generation, bytes });
        let old_bytes = old.as_ref().map_or(0, |e| e.bytes);
        metrics::pending(i64::from(old.is_none()), bytes as i64 - old_bytes as i64);
        shard.bytes = shard.bytes + bytes - old_bytes;
        self.held.fetch_add(bytes, Ordering::Relaxed);
        self.held.fetch_sub(old_bytes, Ordering::Relaxed);
        shard.last_write = Instant::now();
        let complete = shard.is_complete();
        if !complete && (self.rewrites || shard.bytes < self.policy.shard_bytes) {
            return None;
        }
        let mut due = self.due.lock();
        if !complete && (shard.bytes / 2 >= self.policy.shard_bytes || due.len() >= MAX_DUE) {
            return Some(key);
        }
        push_due(&mut due, key, &self.due_ready);
        None
    }

    /// A file writing the chunk at `coords` was closed: its shard is due for a commit if that made
    /// it complete.
    pub fn closed(&self, array: &ShardedArray, coords: &[u64]) {
        let key = shard_of(array, coords);
        let complete = self.shards.lock().get(&key).is_some_and(Shard::is_complete);
        if complete {
            push_due(&mut self.due.lock(), key, &self.due_ready);
        }
    }

    /// Waits up to `timeout` for a shard to commit in the background, and takes it.
    pub fn take_due(&self, timeout: Duration) -> Option<String> {
        let mut due = self.due.lock();
        if due.is_empty() {
            self.due_ready.wait_for(&mut due, timeout);
        }
        (!due.is_empty()).then(|| due.remove(0))
    }

    /// Waits while pending chunks hold more than [`Policy::memory`] bytes, for commits to free
    /// some; when none is on its way, the shard holding most is committed as it is.
    pub fn make_room(&self) {
        while self.held.load(Ordering::Relaxed) > self.policy.memory {
            let largest = {
                let shards = self.shards.lock();
                shards
                    .iter()
                    .filter(|(_, s)| !s.entries.is_empty())
                    .max_by_key(|(_, s)| s.bytes)
                    .map(|(k, _)| k.clone())
            };
            let mut due = self.due.lock();
            if due.is_empty() && self.running.load(Ordering::Relaxed) == 0 {
                let Some(key) = largest else { return };
                push_due(&mut due, key, &self.due_ready);
            }
            self.room.wait_for(&mut due, Duration::from_millis(100));
        }
    }

    /// Bytes pending chunks hold now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
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
        let mut shards = self.shards.lock();
        shards.get_mut(&shard_of(array, coords)).filter(|s| s.array.same_chunks(array)).and_then(|s| s.error.take())
    }

    /// True while the last commit of the chunk's shard has failed and no close or fsync has
    /// reported it yet.
    pub fn has_error(&self, array: &ShardedArray, coords: &[u64]) -> bool {
        let shards = self.shards.lock();
        shards.get(&shard_of(array, coords)).is_some_and(|s| s.error.is_some() && s.array.same_chunks(array))
    }

    /// Commits the pending chunks of the shard that holds `coords`.
    pub fn commit_chunk_shard(&self, ns: &Namespace, array: &ShardedArray, coords: &[u64]) -> Result<(), CommitError> {
        self.commit_shard(ns, &shard_of(array, coords))
    }

    /// Holds the pending chunks of the shard at `key` against the array's document as it is now,
    /// and drops them when it no longer describes the chunks they were written as. Ok(false):
    /// nothing is pending there.
    fn reconcile(&self, ns: &Namespace, key: &str) -> Result<bool, CommitError> {
        let dir = match self.shards.lock().get(key) {
            Some(shard) => shard.array.dir.clone(),
            None => return Ok(false),
        };
        let state = ns.array_state(&dir).map_err(|e| CommitError::Damaged(e.to_string()))?;
        let mut shards = self.shards.lock();
        let Some(shard) = shards.get_mut(key) else { return Ok(false) };
        match state {
            ArrayState::Sharded(current) if current.same_chunks(&shard.array) => {
                shard.array = current;
                Ok(!shard.entries.is_empty())
            }
            ArrayState::Unreadable => {
                let e = CommitError::Damaged(format!(
                    "{}: the array's metadata document cannot be read now; its pending chunks stay and are committed once it can",
                    ns.store().describe(&dir)
                ));
                shard.error = Some((None, e.to_string()));
                Err(e)
            }
            ArrayState::Sharded(_) | ArrayState::Other => {
                let e = shard.orphaned(ns);
                if let Some(gone) = shards.remove(key) {
                    metrics::pending(-(gone.entries.len() as i64), -(gone.bytes as i64));
                    self.freed(gone.bytes);
                }
                Err(e)
            }
        }
    }

    /// `bytes` of pending chunks are gone: writers waiting for room may go on.
    fn freed(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        let _due = self.due.lock();
        self.room.notify_all();
    }

    /// Commits every pending chunk of the shard at `key`, durably.
    pub fn commit_shard(&self, ns: &Namespace, key: &str) -> Result<(), CommitError> {
        let Some(committing) = self.shards.lock().get(key).map(|s| s.committing.clone()) else { return Ok(()) };
        let _one_at_a_time = committing.lock();
        self.running.fetch_add(1, Ordering::Relaxed);
        let result = self.commit_locked(ns, key);
        self.running.fetch_sub(1, Ordering::Relaxed);
        self.freed(0);
        result
    }

    /// [`Pending::commit_shard`] under the shard's commit lock.
    fn commit_locked(&self, ns: &Namespace, key: &str) -> Result<(), CommitError> {
        if !self.reconcile(ns, key)? {
            return Ok(());
        }
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
            .map(|((coords, ..), content)| {
                (sharding.locate(coords).entries, content.as_ref().map(|c| as_stored(&array, c)))
            })
            .collect();
        let specs: Vec<_> = sharding.levels.iter().map(|level| level.index).collect();
        let result = commit_levels(ns.store(), key, &specs, &changes);
        drop(changes);
        drop(contents);
        let mut shards = self.shards.lock();
        metrics::commit(match &result {
            Ok(_) => "ok",
            Err(CommitError::Store(store::Error::Changed(_))) => "conflict",
            Err(CommitError::Store(_)) => "store_error",
            Err(CommitError::Refused(_)) => "refused",
            Err(CommitError::Damaged(_)) => "damaged",
            Err(CommitError::Stale { .. }) => "stale",
        });
        let Some(shard) = shards.get_mut(key) else { return result.map(drop) };
        match result {
            Ok(committed) => {
                self.committed.lock().insert(key.to_string());
                if committed.outcome == Outcome::Deleted {
                    remove_empty_dirs_above(ns.store(), key, &array.dir);
                }
                if let Some(written) = committed.written.as_ref().filter(|_| array.meta.sharding.levels.len() == 1) {
                    ns.remember_index(key, written.len, written.stamp, written.index.clone());
                }
                if let Some(versions) = committed.replaced {
                    let changed = carried.iter().map(|(coords, ..)| coords.clone()).collect();
                    self.own.record(key, &array, versions, changed);
                }
                let (mut freed, mut committed) = (0, 0);
                for (coords, generation, _) in carried {
                    if shard.entries.get(&coords).is_some_and(|e| e.generation == generation) {
                        let e = shard.entries.remove(&coords).expect("present");
                        shard.bytes -= e.bytes;
                        freed += e.bytes;
                        committed += 1;
                    }
                }
                metrics::pending(-committed, -(freed as i64));
                if shard.entries.is_empty() {
                    shards.remove(key);
                }
                drop(shards);
                self.freed(freed);
                Ok(())
            }
            Err(e) => {
                log::error!("commit failed, chunks stay pending: {e}");
                let errno = match &e {
                    CommitError::Store(e) => e.raw_os_error(),
                    _ => None,
                };
                shard.error = Some((errno, e.to_string()));
                Err(e)
            }
        }
    }

    /// True when this mount's own commits replaced version `from` of the shard of the chunk at
    /// `coords` with version `to`, leaving the chunk as it was (see [`OwnCommits`]).
    pub fn kept_by_own_commits(&self, array: &ShardedArray, coords: &[u64], from: Stamp, to: Stamp) -> bool {
        self.own.kept(&shard_of(array, coords), array, coords, from, to)
    }

    /// The keys of the shards committed since the last call: their new versions are this mount's
    /// own doing, which the kernel's caches already reflect.
    pub fn take_committed(&self) -> HashSet<String> {
        std::mem::take(&mut *self.committed.lock())
    }

    /// Commits every pending chunk of the shards below store directory `dir`.
    pub fn commit_below(&self, ns: &Namespace, dir: &str) -> Result<(), CommitError> {
        let below = format!("{dir}/");
        let keys: Vec<String> = self.shards.lock().keys().filter(|k| k.starts_with(&below)).cloned().collect();
        for key in keys {
            self.commit_shard(ns, &key)?;
        }
        Ok(())
    }

    /// Hands the shards idle for at least the policy's interval to the background committers
    /// (a failed commit's shard too: it is tried again each interval, its error kept for the next
    /// fsync or close).
    pub fn idle_due(&self) {
        let idle: Vec<String> = {
            let shards = self.shards.lock();
            let idle = |s: &Shard| !s.entries.is_empty() && s.last_write.elapsed() >= self.policy.idle;
            shards.iter().filter(|(_, s)| idle(s)).map(|(k, _)| k.clone()).collect()
        };
        let mut due = self.due.lock();
        for key in idle {
            push_due(&mut due, key, &self.due_ready);
        }
    }

    /// Commits everything pending, [`COMMITTERS`] shards at a time; the first error is returned
    /// after trying every shard. Writes dropped because their array was made anew are not an
    /// error here: they were logged, and there is nothing left to retry.
    pub fn commit_all(&self, ns: &Namespace) -> Result<(), CommitError> {
        let keys: Vec<String> =
            self.shards.lock().iter().filter(|(_, s)| !s.entries.is_empty()).map(|(k, _)| k.clone()).collect();
        let next = AtomicUsize::new(0);
        let first = Mutex::new(Ok(()));
        std::thread::scope(|scope| {
            for _ in 0..COMMITTERS.min(keys.len()) {
                scope.spawn(|| {
                    while let Some(key) = keys.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = self.commit_shard(ns, key)
                            && !matches!(e, CommitError::Stale { .. })
                        {
                            let mut first = first.lock();
                            if first.is_ok() {
                                *first = Err(e);
                            }
                        }
                    }
                });
            }
        });
        first.into_inner()
    }
}

/// The view shows a pending chunk only as part of the array version it was written under (or one
/// that differs only in shape), and only inside the array's current bounds.
impl Overlay for Pending {
    fn chunk(&self, array: &ShardedArray, coords: &[u64]) -> Option<PendingChunk> {
        let shards = self.shards.lock();
        let shard = shards.get(&shard_of(array, coords)).filter(|s| s.array.same_chunks(array))?;
        shard.entries.get(coords).filter(|_| array.in_bounds(coords)).map(|e| e.state.clone())
    }

    fn chunks_under(&self, array: &ShardedArray, prefix: &[u64]) -> Vec<(Vec<u64>, PendingChunk)> {
        let shards = self.shards.lock();
        shards
            .values()
            .filter(|s| s.array.same_chunks(array))
            .flat_map(|s| s.entries.iter())
            .filter(|(coords, _)| coords.starts_with(prefix) && array.in_bounds(coords))
            .map(|(coords, e)| (coords.clone(), e.state.clone()))
            .collect()
    }

    fn dirs(&self, array: &ShardedArray) -> Vec<String> {
        // Made directories are named in the view's chunk keys, which may not be the stored ones.
        let enc = &array.view_keys;
        let inside = |dir: &&String| enc.decode_dir(dir, array.rank()).is_some_and(|prefix| array.in_bounds(&prefix));
        self.dirs.lock().get(&array.dir).map(|d| d.iter().filter(inside).cloned().collect()).unwrap_or_default()
    }
}

/// Removes the directories between the shard at `key`, just deleted, and its array's directory
/// `top`, as far up as they are empty: nothing is shown there, and a directory removed through the
/// view (`rm -r` of the array) must find nothing left of its shards.
fn remove_empty_dirs_above(store: &dyn crate::store::Store, key: &str, top: &str) {
    let mut dir = crate::store::parent_key(key);
    while dir.len() > top.len() && store.remove_dir(dir).is_ok() {
        dir = crate::store::parent_key(dir);
    }
}

/// A chunk as the view shows it, as the store keeps it: the trailing crc32c that the view left
/// out goes back on.
fn as_stored<'a>(array: &ShardedArray, chunk: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
    if array.strip_crc32c { [chunk, &crc32c::crc32c(chunk).to_le_bytes()].concat().into() } else { chunk.into() }
}
