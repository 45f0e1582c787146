//! Storing a metadata document written through the view. The view shows sharded arrays
//! unsharded, so a document written back must be translated before it is stored: an array stored
//! sharded keeps its stored chunk grid and codecs (for the draft layout: its sharding transformer) (shape, attributes, dimension names and the rest take the
//! written values), a group's consolidated metadata gets each sharded child's stored layout back,
//! and with `--shard-new` a new unsharded array is stored sharded. The stored document is replaced
//! atomically: written beside it, fsync'd, renamed over it.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::journal::{sync_dir, tmp_dir};
use super::lock::{ShardLock, lock_slot};
use crate::error::{Error, Result};
use crate::format::draft;
use crate::format::metadata::{Interpretation, interpret, reshard, reshard_consolidated, shard_new};
use crate::store::{DirStore, join, parent_key};

/// Stores `written` as the document at store key `key` (a `zarr.json`, or a draft layout's
/// `.array.json`).
pub fn store_document(store: &DirStore, key: &str, written: &[u8], shard_new_factors: Option<&[u64]>) -> Result<()> {
    let dir = key.rsplit_once('/').map_or("", |(dir, _)| dir);
    let stored = match store.read(key) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(key, e)),
    };
    let refuse = |why: String| {
        log::warn!("{}: not stored: {why}", store.path(key).display());
        Error::Invalid(format!("{key}: {why}"))
    };
    let draft_array = key.ends_with(draft::ARRAY_SUFFIX);
    let interpret = |doc: &[u8]| if draft_array { draft::interpret_array(doc) } else { interpret(doc) };
    let stored_is_sharded =
        stored.as_deref().is_some_and(|s| matches!(interpret(s), Interpretation::ShardedArray { .. }));
    let stored_is_array = stored.as_deref().is_some_and(|s| {
        serde_json::from_slice::<serde_json::Value>(s).is_ok_and(|d| d.get("node_type") == Some(&"array".into()))
    });
    let document = if let Some(stored) = stored.as_deref().filter(|_| stored_is_sharded) {
        if draft_array { draft::reshard(written, stored) } else { reshard(written, stored) }.map_err(refuse)?
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

/// Replaces the file at `key` with `bytes` atomically and durably. The temporary file is named
/// after the key's lock slot and written under that lock, so that recovery removes it if a crash
/// leaves it behind.
fn replace_file(store: &DirStore, key: &str, bytes: &[u8]) -> Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let io = |e| Error::io(key, e);
    let slot = lock_slot(key);
    let _lock = ShardLock::acquire(store, slot).map_err(io)?;
    store.create_dirs(&tmp_dir()).map_err(io)?;
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let tmp = store.path(&tmp_dir()).join(format!("{slot:016x}-document-{}-{n}", std::process::id()));
    let mut file = File::create(&tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &*store.beneath(key).map_err(io)?).map_err(io)?;
    sync_dir(&store.beneath(parent_key(key)).map_err(io)?).map_err(io)
}
