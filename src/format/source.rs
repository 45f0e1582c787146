//! How a store keeps its arrays: one [`SourceFormat`] for each kind of store shardfs reads (a
//! store's kind is decided in one place, [`super::recognise`], from its root document). Everything
//! that differs between kinds (where array documents live, where their chunks live, what a document
//! means, how a document written through the view is stored back) is a method here; nothing else
//! in the crate asks which kind a store is.

use std::fmt::Debug;

use serde_json::Value;

use super::chunk_key::ChunkKeyEncoding;
use super::error::Unsupported;
use super::sharding::Sharding;

/// One way of storing sharded arrays.
pub trait SourceFormat: Send + Sync + Debug {
    /// The key of the document of the array whose chunks would live in directory `dir`.
    fn document_key(&self, dir: &str) -> Option<String>;

    /// True when the file at `key` is a metadata document that the view may rewrite.
    fn is_document(&self, key: &str) -> bool;

    /// The directory holding the chunks of the array described by document `key`.
    fn array_dir(&self, key: &str) -> Option<String>;

    /// How the view shows the document at `key`, whose content is `bytes`.
    fn interpret(&self, key: &str, bytes: &[u8]) -> Interpretation;

    /// The document to store when `written` (a view document) replaces `stored` at `key`, the
    /// document of a sharded array: the written fields with the stored sharding put back.
    fn reshard(&self, key: &str, written: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unsupported>;

    /// The directory under which every metadata document lives.
    fn documents_root(&self) -> &'static str;

    /// True when an array's own directory holds its chunks (and no further documents), so that a
    /// walk for documents need not go below it.
    fn chunks_beside_document(&self) -> bool;
}

/// A sharded array that shardfs shows unsharded (or, with no sharding levels, an unsharded array
/// whose chunk files a view shows under other keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedArrayMeta {
    pub shape: Vec<u64>,
    pub key_encoding: ChunkKeyEncoding,
    pub sharding: Sharding,
    /// The other fields that fix what an inner chunk's bytes mean (the data type; in the draft
    /// layout also the compressor and filters): chunks written under one value are garbage under
    /// another.
    pub chunk_format: Value,
}

impl ShardedArrayMeta {
    /// True when an inner chunk at given grid coordinates is the same stored object, with bytes
    /// meaning the same, in both arrays: only the shape (and attributes) may differ.
    pub fn same_chunks(&self, other: &ShardedArrayMeta) -> bool {
        self.key_encoding == other.key_encoding
            && self.sharding == other.sharding
            && self.chunk_format == other.chunk_format
    }
}

/// What shardfs makes of one `zarr.json`.
#[derive(Debug, Clone, PartialEq)]
pub enum Interpretation {
    /// Not something shardfs changes (a plain group, not Zarr v3 at all).
    Unchanged,
    /// An unsharded array: the unsharded view shows it as stored; a view that names chunks
    /// otherwise (Zarr v2) shows each stored chunk file under its own key. Its `sharding` has no
    /// levels: each "shard" is one chunk.
    PlainArray { array: ShardedArrayMeta },
    /// A group whose inline consolidated metadata lists sharded arrays.
    Group { view: Vec<u8> },
    /// A sharded array, shown as the equivalent unsharded array.
    ShardedArray { view: Vec<u8>, array: ShardedArrayMeta },
    /// A sharded array with no faithful unsharded view; the reason is meant for a log line.
    Refused(String),
}
