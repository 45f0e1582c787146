//! One shard update. Under the shard's lock, the current index is read from the shard itself (not
//! from any cache) and the changes are applied over it ([`super::apply`]: appended or rewritten,
//! as the store allows; a shard left with no chunk deleted, as zarr-python and tensorstore do),
//! tried again when another writer replaced the shard meanwhile. On a store many machines write
//! at once (one with an [`crate::store::exchange::Exchange`]), they take turns instead
//! ([`super::shared_commit`]). Every outcome is durable when [`commit`] returns.

use super::apply::{WhenEmpty, apply_levels, commit_over, read_current};
pub use super::error::CommitError;
pub use super::shard::{Changes, Committed, NestedChanges, Outcome};
use super::{rewrite, shared_commit};
use crate::format::shard_index::IndexSpec;
use crate::store::{self, PutMode, Store, lock};

/// Applies `changes` to the shard at store key `key`, whose outermost index is laid out as
/// `spec` says.
pub fn commit(store: &dyn Store, key: &str, spec: &IndexSpec, changes: &Changes) -> Result<Committed, CommitError> {
    retrying(|| {
        let _lock = store.lock(lock::slot(key))?;
        let current = read_current(store, key, spec, "not writing over it", true)?;
        commit_over(store, key, spec, current, changes, None, WhenEmpty::StoreNothing)
    })
}

/// Applies `changes` to a shard with one index spec per level (outermost first). Each inner
/// shard that holds a changed chunk is rebuilt whole from the shard as it is under the lock, and
/// then committed as an outer chunk like any other.
pub fn commit_levels(
    store: &dyn Store,
    key: &str,
    specs: &[IndexSpec],
    changes: &NestedChanges,
) -> Result<Committed, CommitError> {
    let Some(outer_spec) = specs.first() else { return commit_whole(store, key, changes) };
    if let Some(exchange) = store.exchange() {
        return shared_commit::commit(store, exchange, key, specs, changes);
    }
    // Each attempt rebuilds the inner shards from the very version it then writes over.
    retrying(|| {
        let _lock = store.lock(lock::slot(key))?;
        let current = read_current(store, key, outer_spec, "not writing over it", specs.len() == 1)?;
        apply_levels(store, key, specs, current, changes, None, WhenEmpty::StoreNothing)
    })
}

/// Commits the one chunk of an unsharded array's chunk file (a sharding of no levels): the file
/// is replaced whole, atomically and durably, or removed.
fn commit_whole(store: &dyn Store, key: &str, changes: &NestedChanges) -> Result<Committed, CommitError> {
    let Some(content) = changes.get(&Vec::new()) else { return Ok(Outcome::Unchanged.into()) };
    let _lock = store.lock(lock::slot(key))?;
    let outcome = match content {
        Some(bytes) => {
            store.put(key, &[bytes], PutMode::Overwrite)?;
            Outcome::Rewritten
        }
        None => match store.delete(key) {
            Ok(()) => Outcome::Deleted,
            Err(store::Error::NotFound(_)) => Outcome::Unchanged,
            Err(e) => return Err(e.into()),
        },
    };
    Ok(outcome.into())
}

/// How often a commit reads the shard again when another writer replaced it meanwhile: eight
/// mounts committing to one shard at once (each machine's unmount) take turns, the last of them
/// after seven others got there first.
const ATTEMPTS: u32 = 16;

/// Runs `attempt` (which takes the shard's lock, reads the shard and writes over the version
/// read) again when the shard changed between reading it and writing it (another program writing
/// to the store directly, another machine committing to the same shard of an object store); the
/// pause between attempts is spent without the lock, so readers of the shard go on meanwhile.
fn retrying(mut commit_once: impl FnMut() -> Result<Committed, CommitError>) -> Result<Committed, CommitError> {
    let mut attempt = 1;
    loop {
        match commit_once() {
            Err(CommitError::Store(store::Error::Changed(_))) if attempt < ATTEMPTS => {
                std::thread::sleep(store::backoff(attempt));
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Rewrites the shard at `key` without unused space (replaced chunks and old indexes left by
/// appends), atomically: readers see the old shard or the new one, never a mix.
pub fn compact(store: &dyn Store, key: &str, spec: &IndexSpec) -> Result<Outcome, CommitError> {
    let _lock = store.lock(lock::slot(key))?;
    let Some(current) = read_current(store, key, spec, "not compacting it", false)? else {
        return Ok(Outcome::Unchanged);
    };
    // Where machines take turns, the version written keeps the note of the one read: it holds the
    // same chunks, so the deltas named there are held still, never to be folded again.
    let note = match store.exchange() {
        None => None,
        Some(exchange) => match exchange.note(key)? {
            Some(noted) if noted.stamp == current.stamp() => Some((exchange, noted.note)),
            _ => return Err(store::Error::Changed(store.describe(key)).into()),
        },
    };
    let old_len = current.len();
    let live: u64 = current.entries.iter().flatten().map(|r| r.end - r.start).sum();
    let unique = if note.is_some() { rewrite::NONCE_LEN as u64 } else { 0 };
    let new_len = live + unique + spec.encoded_len();
    // Nothing to free (a version already compact; one written without the nonce by another tool).
    if new_len >= old_len {
        return Ok(Outcome::Unchanged);
    }
    let chunks: Vec<Option<Vec<u8>>> =
        (0..current.entries.len()).map(|i| current.chunk(i)).collect::<Result<_, _>>()?;
    let note = note.as_ref().map(|(exchange, note)| (*exchange, note.as_str()));
    rewrite::put_shard(store, key, spec, &chunks, Some(current.stamp()), note)?;
    Ok(Outcome::Compacted { old_len, new_len })
}
