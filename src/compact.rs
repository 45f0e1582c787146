//! `shardfs compact`: rewrites the shards of chosen arrays without the unused space that appends
//! leave behind. Each shard is rewritten under its lock and renamed over the old one, so readers
//! (a running mount included) see the old shard or the new one, never a partial one.

use crate::progress::Progress;
use crate::store::{self, Store};
use crate::view::array::ShardedArray;
use crate::view::arrays::find_arrays;
use crate::view::error::Error as ViewError;
use crate::view::shards::shards_on_disk;
use crate::view::sources::Sources;
use crate::write::commit::{CommitError, Outcome, compact};

/// Why a compaction run failed.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("{0}")]
    View(#[from] ViewError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("{0}: no sharded array there")]
    NoArray(String),
    /// Damaged shards, one message each, left as they were; the others were compacted.
    #[error("{} damaged shards were not compacted: {}", .0.len(), .0.join("; "))]
    Damaged(Vec<String>),
}

/// Totals of one compaction run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    pub shards: u64,
    pub rewritten: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Compacts every shard of the arrays at `only` (store paths; all sharded arrays when empty),
/// telling `progress` about each shard. Damaged shards are skipped with a message and make the run
/// fail at the end.
pub fn compact_command(store: &dyn Store, only: &[String], progress: &dyn Progress) -> Result<Compacted, CompactError> {
    store.check_writes()?;
    let found = find_arrays(store)?;
    let trim = |p: &String| p.trim_matches('/').to_string();
    let only: Vec<String> = only.iter().map(trim).collect();
    if let Some(missing) = only.iter().find(|p| !found.sharded.iter().any(|a| *a.dir == **p)) {
        return Err(CompactError::NoArray(missing.clone()));
    }
    let chosen = found.sharded.iter().filter(|a| only.is_empty() || only.iter().any(|p| *a.dir == **p));
    let (nested, flat): (Vec<_>, Vec<_>) = chosen.partition(|a| a.meta.sharding.levels.len() > 1);
    // Every array's shards are listed first, so that the progress knows how many there are.
    let listed = flat
        .into_iter()
        .map(|array| Ok((array, shards_on_disk(store, array, &[], &Sources::default())?)))
        .collect::<Result<Vec<_>, ViewError>>()?;
    progress.start(listed.iter().map(|(_, shards)| shards.len() as u64).sum());
    let mut totals = Compacted::default();
    let mut failures = Vec::new();
    let run = compact_listed(store, &listed, progress, &mut totals, &mut failures);
    progress.finish();
    run?;
    for array in nested {
        println!("{}: nested sharding, left as is", array.dir);
    }
    println!(
        "{} shards, {} rewritten, {} bytes freed",
        totals.shards,
        totals.rewritten,
        totals.bytes_before.saturating_sub(totals.bytes_after)
    );
    if failures.is_empty() { Ok(totals) } else { Err(CompactError::Damaged(failures)) }
}

fn compact_listed(
    store: &dyn Store,
    listed: &[(&ShardedArray, Vec<Vec<u64>>)],
    progress: &dyn Progress,
    totals: &mut Compacted,
    failures: &mut Vec<String>,
) -> Result<(), CompactError> {
    for (array, shards) in listed {
        progress.array(&array.dir);
        let spec = array.meta.sharding.levels[0].index;
        for coords in shards {
            let key = array.shard_key(coords);
            totals.shards += 1;
            match compact(store, &key, &spec) {
                Ok(Outcome::Compacted { old_len, new_len }) => {
                    totals.rewritten += 1;
                    totals.bytes_before += old_len;
                    totals.bytes_after += new_len;
                }
                Ok(_) => {}
                Err(e @ CommitError::Damaged(_)) => failures.push(e.to_string()),
                Err(e) => return Err(e.into()),
            }
            progress.shard_done();
        }
    }
    Ok(())
}
