//! Storing a metadata document written through the view. The view shows sharded arrays
//! unsharded, so a document written back must be translated before it is stored: an array stored
//! sharded keeps its stored chunk grid and codecs (for the draft layout: its sharding transformer) (shape, attributes, dimension names and the rest take the
//! written values), a group's consolidated metadata gets each sharded child's stored layout back,
//! and with `--shard-new` a new unsharded array is stored sharded. The stored document is replaced
//! atomically and durably with one conditional [`Store::put`], under the key's lock (so that
//! recovery, which takes it, never removes a write in progress).

use super::error::CommitError;
use crate::format::metadata::{reshard_consolidated, shard_new};
use crate::format::source::SourceFormat;
use crate::store::{self, PutMode, Store, join, lock};
use crate::view::presentation::Presentation;

/// Stores `written` as the document at store key `key` (a `zarr.json`, or a draft layout's
/// `.array.json`), translated against the stored document and written only over the very version
/// it was translated against (or only where there is none): when another writer replaced it
/// meanwhile, it is read and translated again.
pub fn store_document(
    store: &dyn Store,
    source: &dyn SourceFormat,
    presentation: &dyn Presentation,
    path: &str,
    key: &str,
    written: &[u8],
    shard_new_factors: Option<&[u64]>,
) -> Result<(), CommitError> {
    let dir = key.rsplit_once('/').map_or("", |(dir, _)| dir);
    let refuse = |why: crate::format::Unsupported| {
        log::warn!("{}: not stored: {why}", store.describe(key));
        CommitError::Refused(format!("{key}: {why}"))
    };
    // The document to store for `written`, given the document `stored` now.
    let translate = |stored: Option<&[u8]>| -> Result<Vec<u8>, CommitError> {
        let stored_is_array = stored.is_some_and(|s| {
            serde_json::from_slice::<serde_json::Value>(s).is_ok_and(|d| d.get("node_type") == Some(&"array".into()))
        });
        Ok(if let Some(translated) = presentation.store_back(source, path, key, written, stored).map_err(refuse)? {
            match shard_new_factors.filter(|_| stored.is_none()) {
                Some(factors) => shard_new(&translated, factors).map_err(refuse)?.unwrap_or(translated),
                None => translated,
            }
        } else if let Some(regrouped) =
            reshard_consolidated(written, &|child| store.read(&join(&join(dir, child), "zarr.json")).ok())
                .map_err(refuse)?
        {
            regrouped
        } else if let Some(factors) = shard_new_factors.filter(|_| !stored_is_array) {
            shard_new(written, factors).map_err(refuse)?.unwrap_or_else(|| written.to_vec())
        } else {
            written.to_vec()
        })
    };
    let _lock = store.lock(lock::slot(key))?;
    let mut attempt = 1;
    loop {
        let (stored, mode) = match store.open(key) {
            Ok(file) => (Some(file.read_exact_at(0, file.attr().size)?), PutMode::Update(file.attr().stamp)),
            Err(store::Error::NotFound(_)) => (None, PutMode::Create),
            Err(e) => return Err(e.into()),
        };
        let document = translate(stored.as_deref())?;
        match store.put(key, &[&document], mode) {
            Err(store::Error::Changed(_)) if attempt < ATTEMPTS => attempt += 1,
            done => return Ok(done.map(drop)?),
        }
    }
}

/// How often a document replaced while it was translated is read again.
const ATTEMPTS: usize = 5;
