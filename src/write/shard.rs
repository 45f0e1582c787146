//! A shard as a commit sees it: the changes to make ([`Changes`]), the shard as it is under its
//! lock ([`Current`]), and what the commit did ([`Outcome`], [`Committed`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::format::shard_index::ShardIndex;
use crate::store::{self, Object, Stamp};

/// New content per index entry: `Some(bytes)` stores, `None` empties the entry. The bytes are
/// borrowed where they can be (a pending chunk's buffer), so that a commit copies each chunk
/// only into the file.
pub type Changes<'a> = BTreeMap<u64, Option<Cow<'a, [u8]>>>;

/// New content per innermost chunk of a nested shard, keyed by its entry at every level
/// (outermost first): `Some(bytes)` stores, `None` empties.
pub type NestedChanges<'a> = BTreeMap<Vec<u64>, Option<Cow<'a, [u8]>>>;

/// What a commit did to the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Appended {
        old_len: u64,
        new_len: u64,
    },
    Rewritten,
    Created,
    Deleted,
    /// Left holding no chunk, but kept as a shard of empty entries (see [`crate::store::Store::delete_version`]).
    Emptied,
    Unchanged,
    /// Rewritten without unused space.
    Compacted {
        old_len: u64,
        new_len: u64,
    },
}

/// What a commit did, and the shard versions it went from and to when the store could name the
/// one it wrote: every chunk the commit did not change has the same bytes in both.
#[derive(Debug, Clone)]
pub struct Committed {
    pub outcome: Outcome,
    pub replaced: Option<(Stamp, Stamp)>,
    /// The shard written whole, when the store named its version: its index is known without
    /// reading it back.
    pub written: Option<Written>,
}

/// A shard a commit wrote whole: its version, length and index.
#[derive(Debug, Clone)]
pub struct Written {
    pub stamp: Stamp,
    pub len: u64,
    pub index: Arc<ShardIndex>,
}

impl From<Outcome> for Committed {
    /// A commit with no pair of versions to name: it made the first version, deleted the last,
    /// changed nothing, or replaced a whole chunk file (no other chunk is in it).
    fn from(outcome: Outcome) -> Self {
        Committed { outcome, replaced: None, written: None }
    }
}

/// A shard as it is under its lock: the version read and its entries.
pub(super) struct Current {
    pub file: Box<dyn Object>,
    pub entries: Vec<Option<Range<u64>>>,
}

impl Current {
    pub fn len(&self) -> u64 {
        self.file.attr().size
    }

    pub fn stamp(&self) -> Stamp {
        self.file.attr().stamp
    }

    /// The bytes of entry `i`, if it holds a chunk.
    pub fn chunk(&self, i: usize) -> Result<Option<Vec<u8>>, store::Error> {
        self.entries[i].as_ref().map(|r| self.file.read_exact_at(r.start, r.end - r.start)).transpose()
    }
}
