//! How a commit is rebased onto commits other writers made since its session began: as
//! Icechunk's `BasicConflictSolver` does it, this mount's chunk winning where both wrote one (the
//! last writer of a file wins), except for shards. Each writer's shard holds inner chunks the
//! other did not write, so one may replace the other's only once it holds both: the branch store
//! merges its shards with those of the commits it rebases over before committing
//! ([`crate::format::shard_merge`]), and names those commits here. A shard both wrote in a commit
//! not merged with (one made meanwhile) fails the rebase, and the branch store merges again.

use std::collections::HashSet;

use async_trait::async_trait;
use icechunk::change_set::ChangeSet;
use icechunk::conflicts::basic_solver::BasicConflictSolver;
use icechunk::conflicts::detector::ConflictDetector;
use icechunk::conflicts::{Conflict, ConflictResolution, ConflictSolver};
use icechunk::format::transaction_log::TransactionLog;
use icechunk::session::{Session, SessionResult};

/// The rebase of one commit.
#[derive(Debug)]
pub struct Rebase {
    /// The sharded arrays this commit writes chunks of, as Icechunk names nodes (`/group/array`).
    pub sharded: HashSet<String>,
    /// The commits whose shards this commit's shards were merged with.
    pub merged_with: HashSet<String>,
}

impl Rebase {
    /// True when taking this commit's version of a chunk would drop inner chunks of the commit
    /// rebased over.
    fn loses_inner_chunks(&self, conflict: &Conflict, theirs: &str) -> bool {
        is_shard_conflict(conflict, &self.sharded) && !self.merged_with.contains(theirs)
    }
}

/// True when `conflict` is a shard of `sharded` written by both sides.
pub fn is_shard_conflict(conflict: &Conflict, sharded: &HashSet<String>) -> bool {
    matches!(conflict, Conflict::ChunkDoubleUpdate { path, .. } if sharded.contains(&path.to_string()))
}

#[async_trait]
impl ConflictSolver for Rebase {
    async fn solve(
        &self,
        previous_change: &TransactionLog,
        previous_repo: &Session,
        current_changes: ChangeSet,
        current_repo: &Session,
    ) -> SessionResult<ConflictResolution> {
        match ConflictDetector.solve(previous_change, previous_repo, current_changes, current_repo).await? {
            ConflictResolution::Unsolvable { reason, unmodified } => {
                let theirs = previous_repo.snapshot_id().to_string();
                if reason.iter().any(|c| self.loses_inner_chunks(c, &theirs)) {
                    return Ok(ConflictResolution::Unsolvable { reason, unmodified });
                }
                BasicConflictSolver::default().solve(previous_change, previous_repo, unmodified, current_repo).await
            }
            patched => Ok(patched),
        }
    }
}
