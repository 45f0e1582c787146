//! Storing a metadata document written through the view. The view shows sharded arrays
//! unsharded, so a document written back must be translated before it is stored: an array stored
//! sharded keeps its stored chunk grid and codecs (for the draft layout: its sharding transformer) (shape, attributes, dimension names and the rest take the
//! written values), a group's consolidated metadata gets each sharded child's stored layout back,
//! and with `--shard-new` a new unsharded array is stored sharded. The stored document is replaced
//! atomically: written beside it, fsync'd, renamed over it.

use super::error::CommitError;
use crate::format::metadata::{reshard_consolidated, shard_new};
use crate::format::source::Interpretation;
use crate::format::source::SourceFormat;
use crate::store::{self, PutMode, Store, join, lock};
use crate::view::presentation::Presentation;

/// Stores `written` as the document at store key `key` (a `zarr.json`, or a draft layout's
/// `.array.json`).
pub fn store_document(
    store: &dyn Store,
    source: &dyn SourceFormat,
    presentation: &dyn Presentation,
    key: &str,
    written: &[u8],
    shard_new_factors: Option<&[u64]>,
) -> Result<(), CommitError> {
    let dir = key.rsplit_once('/').map_or("", |(dir, _)| dir);
    let stored = match store.read(key) {
        Ok(bytes) => Some(bytes),
        Err(store::Error::NotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let refuse = |why: crate::format::Unsupported| {
        log::warn!("{}: not stored: {why}", store.describe(key));
        CommitError::Refused(format!("{key}: {why}"))
    };
    let stored_is_sharded =
        stored.as_deref().is_some_and(|s| matches!(source.interpret(key, s), Interpretation::ShardedArray { .. }));
    let stored_is_array = stored.as_deref().is_some_and(|s| {
        serde_json::from_slice::<serde_json::Value>(s).is_ok_and(|d| d.get("node_type") == Some(&"array".into()))
    });
    let document = if let Some(stored) = stored.as_deref().filter(|_| stored_is_sharded) {
        presentation.store_back(source, key, written, stored).map_err(refuse)?
    } else if let Some(regrouped) =
        reshard_consolidated(written, &|child| store.read(&join(&join(dir, child), "zarr.json")).ok())
            .map_err(refuse)?
    {
        regrouped
    } else if let Some(factors) = shard_new_factors.filter(|_| !stored_is_array) {
        shard_new(written, factors).map_err(refuse)?.unwrap_or_else(|| written.to_vec())
    } else {
        written.to_vec()
    };
    replace_file(store, key, &document)
}

/// Replaces the file at `key` with `bytes` atomically and durably, under the key's lock, so that
/// recovery (which takes it) never removes a write in progress.
fn replace_file(store: &dyn Store, key: &str, bytes: &[u8]) -> Result<(), CommitError> {
    let _lock = store.lock(lock::slot(key))?;
    Ok(store.put(key, &[bytes], PutMode::Overwrite)?)
}
