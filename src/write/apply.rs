//! A shard's changes applied over the version of it a commit read, by whichever strategy the
//! store allows: inner shards of a nested shard rebuilt whole, then
//! - [`append`] (index at the end, on a store that [`Store::can_append`]): the new chunk bytes and
//!   a fresh index appended after the shard's end, journaled;
//! - [`extend`] (index at the end, on a store that copies inside itself, an object store): the
//!   old version's chunk bytes copied by the store, the new chunk bytes and a fresh index sent;
//! - [`rewrite`] (index at the start, a new shard, or a store that cannot append): a whole new
//!   shard written with one atomic [`Store::put`] over the version read (or where there was none);
//!
//! and a shard left with no chunk deleted (where the store can delete only the version read;
//! elsewhere rewritten with empty entries). Used by [`super::commit`] (one machine, under the
//! shard's lock) and [`super::shared_commit`] (many machines taking turns).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::error::CommitError;
use super::rewrite::Note;
use super::shard::{Changes, Committed, Current, NestedChanges, Outcome};
use super::{append, extend, rewrite};
use crate::format::shard_index::{IndexLocation, IndexSpec, ShardIndex};
use crate::store::{self, Need, Object, Store};

/// Reads the shard at `key` laid out as `spec`: `None` when there is none; damage is
/// [`CommitError::Damaged`] with the reason followed by `refusal` ("not writing over it").
/// `extending`: the commit extends the shard where the store copies its chunks (they are not
/// read then), rather than read them (to compact it, or to rebuild the inner shards of a nested
/// one).
pub(super) fn read_current(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    refusal: &str,
    extending: bool,
) -> Result<Option<Current>, CommitError> {
    open_shard(store, key)?.map(|file| read_index(store, key, spec, file, refusal, extending)).transpose()
}

/// The shard at `key` opened, nothing of it read yet: `None` when there is none.
pub(super) fn open_shard(store: &dyn Store, key: &str) -> Result<Option<Box<dyn Object>>, CommitError> {
    match store.open(key) {
        Ok(file) => Ok(Some(file)),
        Err(store::Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `file`, the shard at `key` as [`open_shard`] opened it, with its index read (laid out as
/// `spec` says); damage and `extending` as [`read_current`] says.
pub(super) fn read_index(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    file: Box<dyn Object>,
    refusal: &str,
    extending: bool,
) -> Result<Current, CommitError> {
    let damaged = |reason: String| CommitError::Damaged(format!("{}: {reason}; {refusal}", store.describe(key)));
    if file.attr().kind != store::Kind::File {
        return Err(damaged("shard is not a regular file".into()));
    }
    let len = file.attr().size;
    let range = spec.index_range(len).map_err(|e| damaged(e.to_string()))?;
    // A shard the commit extends is copied by the store: its chunks need not cross the network
    // (unless it turns out to be too little used, and is rewritten whole after all).
    if extending && extend::kept(store, spec, len).is_some() {
        file.will_need(range.clone(), Need::Only);
    }
    let bytes = file.read_exact_at(range.start, range.end - range.start)?;
    let index = ShardIndex::decode(spec, &bytes, len, 0).map_err(|e| damaged(e.to_string()))?;
    let entries =
        (0..spec.entries).map(|i| index.chunk(i)).collect::<Result<_, _>>().map_err(|e| damaged(e.to_string()))?;
    Ok(Current { file, entries })
}

/// What a commit over no shard stores when its changes leave no chunk in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WhenEmpty {
    /// Nothing: there is still no shard.
    StoreNothing,
    /// A shard of empty entries, which every reader takes for none: the only way a shared
    /// commit's round settles the holders in doubt its lease carries ([`super::lease`]).
    StoreEmpty,
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
    when_empty: WhenEmpty,
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
    commit_over(store, key, &specs[0], current, &outer, note, when_empty)
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

/// Applies `changes` over `current`, the shard as read (`None`: there is none).
pub(super) fn commit_over(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    current: Option<Current>,
    changes: &Changes,
    note: Option<Note>,
    when_empty: WhenEmpty,
) -> Result<Committed, CommitError> {
    let Some(current) = current else {
        let chunks: Vec<Option<Cow<[u8]>>> =
            (0..spec.entries).map(|i| changes.get(&i).and_then(|c| c.as_deref().map(Cow::Borrowed))).collect();
        if chunks.iter().all(Option::is_none) && when_empty == WhenEmpty::StoreNothing {
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
    if let Some(extended) = extend::extend(store, key, &current, spec, changes, note)? {
        return Ok(extended);
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
