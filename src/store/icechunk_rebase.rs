//! How a commit is rebased onto commits other writers made since its session began: as
//! Icechunk's `BasicConflictSolver` does it, this mount's chunk winning where both wrote one (the
//! last writer of a file wins), except for shards. Both writers' shard holds inner chunks the
//! other did not write, so neither may replace the other's: such a commit is refused (the sync
//! fails with EIO and commits nothing) rather than lose the other writer's inner chunks.

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
}

impl Rebase {
    fn loses_inner_chunks(&self, conflict: &Conflict) -> bool {
        matches!(conflict, Conflict::ChunkDoubleUpdate { path, .. } if self.sharded.contains(&path.to_string()))
    }
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
                if reason.iter().any(|c| self.loses_inner_chunks(c)) {
                    return Ok(ConflictResolution::Unsolvable { reason, unmodified });
                }
                BasicConflictSolver::default().solve(previous_change, previous_repo, unmodified, current_repo).await
            }
            patched => Ok(patched),
        }
    }
}
