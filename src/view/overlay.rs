//! The hook through which writes not yet committed to a shard show in the view: the namespace
//! asks the overlay before it looks at a shard, so a chunk written through the mount reads back at
//! once. The write layer implements it; a read-only view uses [`NoOverlay`].

use std::sync::Arc;

use parking_lot::RwLock;

use super::array::ShardedArray;

/// The content of a chunk being written, shared by the open files that write it.
pub type Buffer = Arc<RwLock<Vec<u8>>>;

/// The pending state of one chunk.
#[derive(Debug, Clone)]
pub enum PendingChunk {
    Written(Buffer),
    Deleted,
}

/// Pending changes the view must show.
pub trait Overlay: Send + Sync + std::fmt::Debug {
    /// The pending state of the chunk at `coords`, if it has one.
    fn chunk(&self, array: &ShardedArray, coords: &[u64]) -> Option<PendingChunk>;
    /// Every chunk with a pending state whose leading coordinates are `prefix`.
    fn chunks_under(&self, array: &ShardedArray, prefix: &[u64]) -> Vec<(Vec<u64>, PendingChunk)>;
    /// Chunk-key directories (relative to the array) made through the view and not removed.
    fn dirs(&self, array: &ShardedArray) -> Vec<String>;
}

/// The overlay of a view that is never written.
#[derive(Debug, Default)]
pub struct NoOverlay;

impl Overlay for NoOverlay {
    fn chunk(&self, _: &ShardedArray, _: &[u64]) -> Option<PendingChunk> {
        None
    }

    fn chunks_under(&self, _: &ShardedArray, _: &[u64]) -> Vec<(Vec<u64>, PendingChunk)> {
        Vec::new()
    }

    fn dirs(&self, _: &ShardedArray) -> Vec<String> {
        Vec::new()
    }
}
