//! One shard update. Under the shard's lock, the current index is read from the shard itself (not
//! from any cache), the changes are applied, and then one of two strategies runs, chosen by what
//! the store can do:
//! - [`append`] (index at the end, on a store that [`Store::can_append`]): the new chunk bytes and
//!   a fresh index are appended after the shard's end, journaled so that a torn append rolls
//!   back; the replaced bytes and the old index become unused space;
//! - [`rewrite`] (index at the start, a new shard, or a store that cannot append): a whole new
//!   shard is written with one atomic [`Store::put`], only over the version read (or only where
//!   there was none);
//!
//! and a shard left with no chunk is deleted, as zarr-python and tensorstore do (where the store
//! can delete only the version read; elsewhere it is rewritten with empty entries). Every outcome
//! is durable when [`commit`] returns.

use std::borrow::Cow;
use std::collections::BTreeMap;

pub use super::error::CommitError;
use super::rewrite::Note;
use super::shard::Current;
pub use super::shard::{Changes, Committed, Outcome};
use super::{append, rewrite, shared_commit};
use crate::format::shard_index::{IndexLocation, IndexSpec, ShardIndex};
use crate::store::{self, PutMode, Store, lock};

/// Reads the shard at `key` laid out as `spec`: `None` when there is none; damage is
/// [`CommitError::Damaged`] with the reason followed by `refusal` ("not writing over it").
pub(super) fn read_current(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    refusal: &str,
) -> Result<Option<Current>, CommitError> {
    let file = match store.open(key) {
        Ok(file) => file,
        Err(store::Error::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let damaged = |reason: String| CommitError::Damaged(format!("{}: {reason}; {refusal}", store.describe(key)));
    if file.attr().kind != store::Kind::File {
        return Err(damaged("shard is not a regular file".into()));
    }
    let len = file.attr().size;
    let range = spec.index_range(len).map_err(|e| damaged(e.to_string()))?;
    let bytes = file.read_exact_at(range.start, range.end - range.start)?;
    let index = ShardIndex::decode(spec, &bytes, len, 0).map_err(|e| damaged(e.to_string()))?;
    let entries =
        (0..spec.entries).map(|i| index.chunk(i)).collect::<Result<_, _>>().map_err(|e| damaged(e.to_string()))?;
    Ok(Some(Current { file, entries }))
}

/// Applies `changes` to the shard at store key `key`, whose outermost index is laid out as
/// `spec` says.
pub fn commit(store: &dyn Store, key: &str, spec: &IndexSpec, changes: &Changes) -> Result<Committed, CommitError> {
    retrying(|| {
        let _lock = store.lock(lock::slot(key))?;
        let current = read_current(store, key, spec, "not writing over it")?;
        commit_over(store, key, spec, current, changes, None)
    })
}

/// New content per innermost chunk of a nested shard, keyed by its entry at every level
/// (outermost first): `Some(bytes)` stores, `None` empties.
pub type NestedChanges<'a> = BTreeMap<Vec<u64>, Option<Cow<'a, [u8]>>>;

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
        let current = read_current(store, key, outer_spec, "not writing over it")?;
        apply_levels(store, key, specs, current, changes, None)
    })
}

/// Applies `changes` over `current`, the shard as read laid out as `specs` say (`None`: there is
/// none): each inner shard that holds a changed chunk is rebuilt whole from it, and then
/// committed as an outer chunk like any other. With `note`, the version written carries that
/// note through the exchange.
pub(super) fn apply_levels(
    store: &dyn Store,
    key: &str,
    specs: &[IndexSpec],
    current: Option<Current>,
    changes: &NestedChanges,
    note: Option<Note>,
) -> Result<Committed, CommitError> {
    let mut by_outer: BTreeMap<u64, NestedChanges> = BTreeMap::new();
    for (path, content) in changes {
        by_outer.entry(path[0]).or_default().insert(path[1..].to_vec(), content.clone());
    }
    let mut outer = Changes::new();
    for (entry, inner) in &by_outer {
        let mut inner = inner.clone();
        if specs.len() == 1 {
            outer.insert(*entry, inner.remove(&Vec::new()).flatten());
            continue;
        }
        let blob = match &current {
            Some(current) => current.chunk(*entry as usize)?,
            None => None,
        };
        let rebuilt = rebuild(&specs[1..], blob, &inner).map_err(|reason| {
            let shard = store.describe(key);
            CommitError::Damaged(format!("{shard}: inner shard {entry}: {reason}; not writing over it"))
        })?;
        outer.insert(*entry, rebuilt.map(Cow::Owned));
    }
    commit_over(store, key, &specs[0], current, &outer, note)
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

/// An inner shard laid out by `specs` (its own level first) with `changes` applied; `None` when
/// no chunk is left in it.
fn rebuild(specs: &[IndexSpec], blob: Option<Vec<u8>>, changes: &NestedChanges) -> Result<Option<Vec<u8>>, String> {
    let spec = &specs[0];
    let mut chunks: Vec<Option<Vec<u8>>> = vec![None; spec.entries as usize];
    if let Some(blob) = blob {
        let len = blob.len() as u64;
        let range = spec.index_range(len).map_err(|e| e.to_string())?;
        let index = ShardIndex::decode(spec, &blob[range.start as usize..range.end as usize], len, 0)
            .map_err(|e| e.to_string())?;
        for (i, chunk) in chunks.iter_mut().enumerate() {
            *chunk = index
                .chunk(i as u64)
                .map_err(|e| e.to_string())?
                .map(|r| blob[r.start as usize..r.end as usize].to_vec());
        }
    }
    let mut by_entry: BTreeMap<u64, NestedChanges> = BTreeMap::new();
    for (path, content) in changes {
        by_entry.entry(path[0]).or_default().insert(path[1..].to_vec(), content.clone());
    }
    for (entry, mut inner) in by_entry {
        let slot = &mut chunks[entry as usize];
        *slot = if specs.len() == 1 {
            inner.remove(&Vec::new()).flatten().map(Cow::into_owned)
        } else {
            rebuild(&specs[1..], slot.take(), &inner)?
        };
    }
    Ok(chunks.iter().any(Option::is_some).then(|| crate::format::shard_index::assemble_shard(spec, &chunks)))
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

/// Applies `changes` over `current`, the shard as read (`None`: there is none).
fn commit_over(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    current: Option<Current>,
    changes: &Changes,
    note: Option<Note>,
) -> Result<Committed, CommitError> {
    let Some(current) = current else {
        let chunks: Vec<Option<Cow<[u8]>>> =
            (0..spec.entries).map(|i| changes.get(&i).and_then(|c| c.as_deref().map(Cow::Borrowed))).collect();
        if chunks.iter().all(Option::is_none) {
            return Ok(Outcome::Unchanged.into());
        }
        let written = rewrite::put_shard(store, key, spec, &chunks, None, note)?;
        return Ok(Committed { outcome: Outcome::Created, replaced: None, written });
    };
    let kept = |i: u64| !changes.contains_key(&i) && current.entries[i as usize].is_some();
    let stays_empty = (0..spec.entries).all(|i| !kept(i) && changes.get(&i).is_none_or(Option::is_none));
    if stays_empty {
        if note.is_none() && store.delete_version(key, &current.stamp())? {
            return Ok(Outcome::Deleted.into());
        }
        // A store that cannot delete only this version keeps a shard of empty entries, which
        // every reader takes for a shard with no chunk.
        let empty: Vec<Option<&[u8]>> = vec![None; spec.entries as usize];
        rewrite::put_shard(store, key, spec, &empty, Some(current.stamp()), note)?;
        return Ok(Outcome::Emptied.into());
    }
    if spec.location == IndexLocation::End && store.can_append() {
        return append::append(store, key, &current, spec, changes);
    }
    let mut chunks = Vec::with_capacity(spec.entries as usize);
    for i in 0..spec.entries {
        chunks.push(match changes.get(&i) {
            Some(new) => new.as_deref().map(Cow::Borrowed),
            None => current.chunk(i as usize)?.map(Cow::Owned),
        });
    }
    let written = rewrite::put_shard(store, key, spec, &chunks, Some(current.stamp()), note)?;
    let replaced = written.as_ref().map(|after| (current.stamp(), after.stamp));
    Ok(Committed { outcome: Outcome::Rewritten, replaced, written })
}

/// Rewrites the shard at `key` without unused space (replaced chunks and old indexes left by
/// appends), atomically: readers see the old shard or the new one, never a mix.
pub fn compact(store: &dyn Store, key: &str, spec: &IndexSpec) -> Result<Outcome, CommitError> {
    let _lock = store.lock(lock::slot(key))?;
    let Some(current) = read_current(store, key, spec, "not compacting it")? else { return Ok(Outcome::Unchanged) };
    let old_len = current.len();
    let live: u64 = current.entries.iter().flatten().map(|r| r.end - r.start).sum();
    let new_len = live + spec.encoded_len();
    if new_len == old_len {
        return Ok(Outcome::Unchanged);
    }
    let chunks: Vec<Option<Vec<u8>>> =
        (0..current.entries.len()).map(|i| current.chunk(i)).collect::<Result<_, _>>()?;
    rewrite::put_shard(store, key, spec, &chunks, Some(current.stamp()), None)?;
    Ok(Outcome::Compacted { old_len, new_len })
}
