//! Chunks recorded in the session by uploads in the background (16 at once): a write returns once
//! its chunk is held, the newest write of a key lands last, and a commit waits for them all,
//! recording again any whose upload failed.

use std::sync::Arc;

use bytes::Bytes;

use super::keys::{chunk_key, is_document};
use super::{BranchStore, Change, one_line};
use crate::store::Result;

impl BranchStore {
    /// Records `bytes` at the Zarr key `key` in the session: a document at once, a chunk by an
    /// upload in the background (once its array is known to be there). The caller holds the key's
    /// turn.
    pub(super) fn record(&self, key: &str, bytes: &Arc<[u8]>) -> Result<()> {
        let session = self.session()?;
        let value = Bytes::from_owner(bytes.clone());
        if is_document(key) {
            return self.runtime.block_on(session.set(key, value)).map_err(|e| self.failed(key, one_line(&e)));
        }
        let Some((dir, _)) = chunk_key(key) else {
            return Err(self.failed(key, "not a chunk key".into()));
        };
        let node = icechunk::format::Path::try_from(format!("/{dir}")).map_err(|e| self.failed(key, e.to_string()))?;
        self.runtime
            .block_on(async { session.session().read().await.get_array(&node).await.map(drop) })
            .map_err(|e| self.failed(key, format!("no array to hold it: {}", one_line(&e))))?;
        let slot = self.runtime.block_on(self.slots.clone().acquire_owned()).expect("the semaphore is never closed");
        let owned = key.to_string();
        let mut uploads = self.uploads.lock();
        let previous = uploads.remove(key);
        let upload = self.runtime.spawn(async move {
            // The newest write of a key is the one recorded: it lands after the one before.
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let done = session.set(&owned, value).await.map_err(|e| one_line(&e));
            drop(slot);
            done
        });
        uploads.insert(key.to_string(), upload);
        self.state.lock().unrecorded.remove(key);
        Ok(())
    }

    /// Waits for the upload of the chunk at `key`, if one is in flight; one that failed is left to
    /// be recorded again before the next commit.
    pub(super) fn uploaded(&self, key: &str) -> Result<()> {
        let Some(upload) = self.uploads.lock().remove(key) else { return Ok(()) };
        let why = match self.runtime.block_on(upload) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(why)) => why,
            Err(e) => format!("its upload stopped: {e}"),
        };
        self.state.lock().unrecorded.insert(key.to_string());
        Err(self.failed(key, why))
    }

    /// Waits for every chunk upload in flight, and records again, in this thread, each chunk whose
    /// upload failed: an error while one is still not recorded.
    pub(super) fn all_uploaded(&self) -> Result<()> {
        let keys: Vec<String> = self.uploads.lock().keys().cloned().collect();
        for key in keys {
            drop(self.uploaded(&key));
        }
        let unrecorded: Vec<String> = self.state.lock().unrecorded.iter().cloned().collect();
        for key in unrecorded {
            let bytes = match self.state.lock().overlay.get(&key) {
                Some(Change::Written { bytes, .. }) => bytes.clone(),
                _ => {
                    self.state.lock().unrecorded.remove(&key);
                    continue;
                }
            };
            let session = self.session()?;
            self.runtime
                .block_on(session.set(&key, Bytes::from_owner(bytes)))
                .map_err(|e| self.failed(&key, one_line(&e)))?;
            self.state.lock().unrecorded.remove(&key);
        }
        Ok(())
    }
}
