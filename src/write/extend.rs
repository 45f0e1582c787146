//! The extend commit strategy, for shards with the index at the end on stores that copy inside
//! themselves ([`Store::can_keep`]: S3's multipart copy): the new version is the old version's
//! chunk bytes, copied by the store without crossing the network, then the new chunks and a
//! fresh index, written with one atomic [`Store::put_extending`] only over the version read.
//! What a commit sends is its own chunks and an index, whatever the shard's size.
//!
//! Every version is one valid shard that any Zarr reader reads; the chunk bytes it no longer
//! indexes (chunks replaced or emptied since) are unused space. A commit that would leave more
//! than [`MOST_UNUSED`] of the version unused rewrites it whole instead (as `shardfs compact`
//! would), so that a shard rewritten again and again stays within twice its live bytes.

use std::sync::Arc;

use super::error::CommitError;
use super::rewrite::Note;
use super::shard::{Changes, Committed, Current, Outcome, Written};
use crate::format::shard_index::{EMPTY, IndexLocation, IndexSpec, ShardIndex};
use crate::store::Store;

/// The most of a version's bytes that may be unused before a commit rewrites it whole: half.
pub const MOST_UNUSED: f64 = 0.5;

/// Commits `changes` over `current` by extending it, or `None` when that does not fit: the
/// store cannot, the bytes kept are fewer than it copies, the index is not at the end, a chunk
/// lies past the data kept, or too much would be unused. `note`: as in [`super::rewrite`].
pub(super) fn extend(
    store: &dyn Store,
    key: &str,
    current: &Current,
    spec: &IndexSpec,
    changes: &Changes,
    note: Option<Note>,
) -> Result<Option<Committed>, CommitError> {
    let Some(kept) = kept(store, spec, current.len()) else { return Ok(None) };
    let mut tail: Vec<&[u8]> = Vec::new();
    let (mut end, mut live) = (kept, 0);
    let mut entries = Vec::with_capacity(current.entries.len());
    for (i, range) in current.entries.iter().enumerate() {
        entries.push(match (changes.get(&(i as u64)), range) {
            (Some(Some(bytes)), _) => {
                tail.push(bytes);
                let offset = end;
                end += bytes.len() as u64;
                live += bytes.len() as u64;
                (offset, bytes.len() as u64)
            }
            (Some(None), _) | (None, None) => (EMPTY, EMPTY),
            // A chunk in the old index's place (a shard some other writer laid out so) would be
            // overwritten by the new chunks: such a shard is rewritten whole.
            (None, Some(range)) if range.end > kept => return Ok(None),
            (None, Some(range)) => {
                live += range.end - range.start;
                (range.start, range.end - range.start)
            }
        });
    }
    let index = spec.encode(&entries);
    let len = end + super::rewrite::NONCE_LEN as u64 + index.len() as u64;
    let unused = len - live - index.len() as u64;
    if unused as f64 > MOST_UNUSED * len as f64 {
        return Ok(None);
    }
    // The new chunks may be an earlier version's: the version's bytes are made unique all the same.
    let nonce = super::rewrite::nonce();
    tail.push(&nonce);
    tail.push(&index);
    let note = note.map_or("", |(_, note)| note);
    let Some(stamp) = store.put_extending(key, &current.stamp(), kept, &tail, note)? else {
        return Ok(Some(Committed {
            outcome: Outcome::Appended { old_len: current.len(), new_len: len },
            replaced: None,
            written: None,
        }));
    };
    let index = ShardIndex::decode(spec, &index, len, 0).expect("an index just encoded decodes");
    Ok(Some(Committed {
        outcome: Outcome::Appended { old_len: current.len(), new_len: len },
        replaced: Some((current.stamp(), stamp)),
        written: Some(Written { stamp, len, index: Arc::new(index) }),
    }))
}

/// How many of the first bytes of a shard of `len` bytes laid out as `spec` says a commit keeps
/// by extending it: its chunk bytes (the old index is its last bytes); `None`: the store cannot
/// extend it.
pub(super) fn kept(store: &dyn Store, spec: &IndexSpec, len: u64) -> Option<u64> {
    let chunks = len.checked_sub(spec.encoded_len())?;
    (spec.location == IndexLocation::End && store.can_keep(chunks)).then_some(chunks)
}
