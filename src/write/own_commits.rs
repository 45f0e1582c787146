//! The shard versions this mount's own commits replaced, each with the version written and the
//! chunks it changed. A commit writes its changes over the very version it read, so a chunk it
//! did not change has the same bytes, and size, in the version written: a file bound to the old
//! version (the kernel holding its pages and size) may stand for the new one. Without this, a
//! writer reading one chunk of a shard while its own writes to the shard's other chunks are
//! committed would get ESTALE once two commits fell between the kernel's lookup and its open.
//!
//! Only the last commits are kept (bounded by count and by the chunks they changed); a file
//! bound to a version older than those gets ESTALE as before, upon which the kernel looks it up
//! again.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::store::Stamp;
use crate::view::array::ShardedArray;

/// The most commits remembered.
const MAX_COMMITS: usize = 1024;

/// The most changed chunks remembered over all commits kept.
const MAX_CHANGED: usize = 1 << 16;

/// One commit: the shard at `key` of `array` went from version `before` to `after`.
#[derive(Debug)]
struct Replacement {
    key: String,
    array: Arc<ShardedArray>,
    before: Stamp,
    after: Stamp,
    changed: HashSet<Vec<u64>>,
}

#[derive(Debug, Default)]
struct Log {
    /// Oldest first; the commits of one shard are in the order they were made.
    commits: VecDeque<Replacement>,
    changed: usize,
}

/// The last commits of this mount, for [`OwnCommits::kept`].
#[derive(Debug, Default)]
pub struct OwnCommits(Mutex<Log>);

impl OwnCommits {
    /// This mount replaced version `before` of the shard at `key` of `array` with `after`,
    /// changing the chunks `changed` (their grid coordinates) and no other.
    pub fn record(
        &self,
        key: &str,
        array: &Arc<ShardedArray>,
        (before, after): (Stamp, Stamp),
        changed: HashSet<Vec<u64>>,
    ) {
        let mut log = self.0.lock();
        log.changed += changed.len();
        let replacement = Replacement { key: key.to_string(), array: array.clone(), before, after, changed };
        log.commits.push_back(replacement);
        while log.commits.len() > MAX_COMMITS || (log.changed > MAX_CHANGED && log.commits.len() > 1) {
            let dropped = log.commits.pop_front().expect("not empty");
            log.changed -= dropped.changed.len();
        }
    }

    /// True when this mount's own commits to the shard at `key` (of `array`) led from version
    /// `from` to version `to` without changing the chunk at `coords`: its bytes are the same in
    /// both.
    pub fn kept(&self, key: &str, array: &ShardedArray, coords: &[u64], from: Stamp, to: Stamp) -> bool {
        let log = self.0.lock();
        let mut at = from;
        for commit in &log.commits {
            if commit.key != key || commit.before != at || !commit.array.same_chunks(array) {
                continue;
            }
            if commit.changed.contains(coords) {
                return false;
            }
            at = commit.after;
            if at == to {
                return true;
            }
        }
        false
    }
}
