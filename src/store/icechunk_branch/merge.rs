//! Shards this mount changed, merged with the branch's tip before a commit where other writers'
//! commits changed them too ([`shard_merge`]), so that the rebase that follows loses no writer's
//! inner chunks.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::TryStreamExt;
use icechunk::conflicts::Conflict;
use icechunk::format::ByteRange;
use icechunk::repository::VersionInfo;
use icechunk::session::{SessionError, SessionErrorKind};
use icechunk::store::StoreErrorKind;

use super::keys::{chunk_key, is_document};
use super::{BranchStore, Change, one_line};
use crate::format::metadata::ZARR_JSON;
use crate::format::shard_index::IndexSpec;
use crate::format::shard_merge;
use crate::format::sharding::{self, Sharding};
use crate::store::icechunk_rebase::is_shard_conflict;
use crate::store::{Error, Store, join};

/// Why shards could not be merged with the branch's tip.
pub(super) enum Merge {
    /// The store failed (a request): the commit may be tried again.
    Failed(Error),
    /// Nothing of the session can be placed on the tip (the array redefined, nested sharding, a
    /// branch reset): the changes are given up.
    Impossible(String),
}

impl BranchStore {
    /// Merges each shard this mount changed with the branch's tip, where commits made since the
    /// session began changed it too ([`shard_merge`]); returns those commits.
    pub(super) fn merge_with_tip(
        &self,
        session: &icechunk::Store,
        sharded: &HashSet<String>,
    ) -> std::result::Result<HashSet<String>, Merge> {
        let base = self.runtime.block_on(async { session.session().read().await.snapshot_id().clone() });
        let failed = |key: &str, why: String| Merge::Failed(self.failed(key, why));
        let keys: Vec<(String, Option<Arc<[u8]>>)> = {
            let state = self.state.lock();
            let of_sharded = |k: &String| chunk_key(k).is_some_and(|(dir, _)| sharded.contains(&format!("/{dir}")));
            let changed = state.overlay.iter().filter(|(k, _)| !is_document(k) && of_sharded(k));
            changed
                .filter_map(|(k, change)| match change {
                    Change::Written { bytes, .. } => Some((k.clone(), Some(bytes.clone()))),
                    Change::Deleted => Some((k.clone(), None)),
                    Change::Placeholder { .. } => None,
                })
                .collect()
        };
        if keys.is_empty() {
            return Ok(HashSet::new());
        }
        let repository = self.repository().map_err(Merge::Failed)?;
        let tip = self
            .runtime
            .block_on(repository.lookup_branch(&self.branch))
            .map_err(|e| failed("", format!("branch {}: {}", self.branch, one_line(&e))))?;
        if tip == base {
            return Ok(HashSet::new());
        }
        let at_tip = VersionInfo::SnapshotId(tip.clone());
        let tip_store = self
            .runtime
            .block_on(repository.readonly_session(&at_tip))
            .map(|s| icechunk::Store::from_session_and_config(Arc::new(tokio::sync::RwLock::new(s)), 16))
            .map_err(|e| failed("", format!("snapshot {tip}: {}", one_line(&e))))?;
        for (key, ours) in keys {
            let theirs = match self.runtime.block_on(tip_store.get(&key, &ByteRange::ALL)) {
                Ok(bytes) => Some(bytes.to_vec()),
                Err(e) if matches!(e.kind, StoreErrorKind::NotFound(_)) => None,
                Err(e) => return Err(failed(&key, format!("at snapshot {tip}: {}", one_line(&e)))),
            };
            // The version both sides started from: the session's base, or what an earlier merge
            // already took in.
            let merged_before = self.state.lock().merge_bases.get(&key).cloned();
            let base = match merged_before {
                Some(base) => base,
                None => match self.shown.read(&key) {
                    Ok(bytes) => Some(bytes),
                    Err(Error::NotFound(_)) => None,
                    Err(e) => return Err(Merge::Failed(e)),
                },
            };
            if theirs == base {
                continue;
            }
            let (dir, _) = chunk_key(&key).unwrap_or_default();
            let spec = self.index_spec(&dir).map_err(|why| Merge::Impossible(format!("{key}: {why}")))?;
            let merged = shard_merge::merge(&spec, base.as_deref(), ours.as_deref(), theirs.as_deref())
                .map_err(|why| Merge::Impossible(format!("{key}: cannot merge with snapshot {tip}: {why}")))?;
            let _turn = self.turn(&key);
            let stamp = self.new_stamp(&key);
            let change = match merged {
                Some(bytes) => {
                    let bytes: Arc<[u8]> = bytes.into();
                    self.record(&key, &bytes).map_err(Merge::Failed)?;
                    Change::Written { bytes, stamp, modified: SystemTime::now() }
                }
                None => {
                    drop(self.uploaded(&key));
                    self.runtime.block_on(session.delete(&key)).map_err(|e| failed(&key, one_line(&e)))?;
                    Change::Deleted
                }
            };
            let mut state = self.state.lock();
            state.change(&key, change);
            state.merge_bases.insert(key, theirs);
        }
        let ancestry = self.runtime.block_on(async {
            let mut found = HashSet::new();
            let mut snapshots = Box::pin(repository.ancestry(&at_tip).await?);
            while let Some(snapshot) = snapshots.try_next().await? {
                if snapshot.id == base {
                    return Ok(Some(found));
                }
                found.insert(snapshot.id.to_string());
            }
            Ok::<_, icechunk::repository::RepositoryError>(None)
        });
        match ancestry {
            Ok(Some(found)) => Ok(found),
            // The branch was reset to a history without the session's base: nothing of this
            // session can be placed on it.
            Ok(None) => Err(Merge::Impossible(format!("branch {} was reset past snapshot {base}", self.branch))),
            Err(e) => Err(failed("", format!("branch {}: {}", self.branch, one_line(&e)))),
        }
    }

    /// The index layout of the shards of the sharded array in `dir`; an error for nested sharding,
    /// whose shards are never merged.
    pub(super) fn index_spec(&self, dir: &str) -> std::result::Result<IndexSpec, String> {
        let doc = self.read(&join(dir, ZARR_JSON)).map_err(|e| e.to_string())?;
        let doc: serde_json::Value = serde_json::from_slice(&doc).map_err(|e| format!("{dir}/zarr.json: {e}"))?;
        let grid = sharding::shape(doc.pointer("/chunk_grid/configuration/chunk_shape"));
        let codecs = doc.get("codecs").and_then(|c| c.as_array());
        let (Some(grid), Some(codecs)) = (grid, codecs) else {
            return Err(format!("{dir}/zarr.json: no chunk grid or codecs"));
        };
        match Sharding::from_codecs(&grid, codecs) {
            Ok(Some(sharding)) if sharding.levels.len() == 1 => Ok(sharding.levels[0].index),
            Ok(Some(_)) => Err("nested sharding: shards written by two writers are not merged".into()),
            Ok(None) => Err("not sharded".into()),
            Err(why) => Err(why.to_string()),
        }
    }

    /// The sharded arrays whose chunks the overlay writes, as Icechunk names nodes.
    pub(super) fn sharded_arrays(&self) -> HashSet<String> {
        let arrays: BTreeSet<String> = {
            let state = self.state.lock();
            state.overlay.keys().filter_map(|k| chunk_key(k)).map(|(dir, _)| dir).collect()
        };
        let sharded = |dir: &String| {
            let doc = self.read(&join(dir, ZARR_JSON)).ok();
            let doc = doc.and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
            let codecs = doc.as_ref().and_then(|d| d.get("codecs")).and_then(|c| c.as_array()).cloned();
            codecs
                .unwrap_or_default()
                .iter()
                .any(|c| c.get("name").and_then(|n| n.as_str()) == Some("sharding_indexed"))
        };
        arrays.iter().filter(|dir| sharded(dir)).map(|dir| format!("/{dir}")).collect()
    }
}

/// True when a commit failed only because another writer committed a shard this mount wrote
/// since the shards were merged.
pub(super) fn raced(e: &SessionError, sharded: &HashSet<String>) -> bool {
    let SessionErrorKind::RebaseFailed { conflicts, .. } = &e.kind else { return false };
    conflicts.iter().any(|c| is_shard_conflict(c, sharded))
        && conflicts.iter().all(|c| matches!(c, Conflict::ChunkDoubleUpdate { .. }))
}
