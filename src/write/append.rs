//! The append commit strategy, for shards with the index at the end on stores that can append:
//! the new chunk bytes and a fresh index are written after the shard's end, as the sharding spec
//! allows, and the replaced bytes and the old index become unused space (`shardfs compact` frees
//! it). The append is journaled first ([`journal`]), so that a crash at any byte leaves a shard
//! that recovery makes wholly old or wholly new; a failed append (a full disk) is undone at once.

use std::ops::Range;

use super::error::CommitError;
use super::journal::{self, AppendRecord};
use super::shard::{Changes, Committed, Current, Outcome};
use crate::format::shard_index::{EMPTY, IndexSpec};
use crate::store::{self, OpenHow, Store, lock, write_gathered};

/// Appends `changes` to the shard at `key`, read as `current` under its lock; the version left.
pub(super) fn append(
    store: &dyn Store,
    key: &str,
    current: &Current,
    spec: &IndexSpec,
    changes: &Changes,
) -> Result<Committed, CommitError> {
    let old_len = current.len();
    let mut appended: Vec<&[u8]> = Vec::new();
    let mut end = old_len;
    let entries: Vec<(u64, u64)> = current
        .entries
        .iter()
        .enumerate()
        .map(|(i, range): (usize, &Option<Range<u64>>)| match (changes.get(&(i as u64)), range) {
            (Some(Some(bytes)), _) => {
                appended.push(bytes);
                let offset = end;
                end += bytes.len() as u64;
                (offset, bytes.len() as u64)
            }
            (Some(None), _) | (None, None) => (EMPTY, EMPTY),
            (None, Some(range)) => (range.start, range.end - range.start),
        })
        .collect();
    let index = spec.encode(&entries);
    appended.push(&index);
    let new_len = end + index.len() as u64;
    let crc32c = appended.iter().fold(0, |crc, piece| crc32c::crc32c_append(crc, piece));
    let record = AppendRecord { shard: key.to_string(), old_len, new_len, crc32c };
    let file = store.open_file(key, OpenHow::default())?;
    // The lock keeps shardfs out, not another program: the file appended to must be the very
    // version whose index was read, or the append would land inside someone else's file.
    if file.attr()?.stamp != current.stamp() {
        return Err(store::Error::Changed(store.describe(key)).into());
    }
    let record_key = journal::begin(store, lock::slot(key), &record)?;
    let written = write_gathered(old_len, &appended, |piece, at| file.write_at(piece, at)).and_then(|()| file.sync());
    if let Err(e) = written {
        // A failed append (a full disk) is undone at once, so that the shard is never left torn
        // while the daemon lives; if even that fails (or the process is gone), the record stays
        // for recovery.
        if !matches!(e, store::Error::Crashed(_)) && file.set_len(old_len).and_then(|()| file.sync()).is_ok() {
            let _ = store.delete(&record_key);
        }
        log::warn!("{}: append failed and was rolled back: {e}", store.describe(key));
        return Err(e.into());
    }
    let after = file.attr()?.stamp;
    journal::end(store, &record_key)?;
    Ok(Committed {
        outcome: Outcome::Appended { old_len, new_len },
        replaced: Some((current.stamp(), after)),
        written: None,
    })
}
