//! The Zarr formats shardfs reads, as pure functions over bytes and JSON: no I/O, no FUSE.
//!
//! - [`chunk_key`]: chunk coordinates <-> store keys for every key encoding.
//! - [`draft`]: the draft sharding storage transformer layout of zarr-python 2.x.
//! - [`metadata`]: `zarr.json` documents and the unsharded view of a sharded array.
//! - [`sharding`]: the `sharding_indexed` codec configuration, possibly nested.
//! - [`shard_index`]: the (offset, nbytes) index at the start or end of a shard.

pub mod chunk_key;
pub mod draft;
pub mod metadata;
pub mod shard_index;
pub mod sharding;

/// Why a document cannot be shown or stored the way shardfs needs (the reason, for a log line or
/// an error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

impl From<String> for Unsupported {
    fn from(reason: String) -> Self {
        Unsupported(reason)
    }
}

impl From<&str> for Unsupported {
    fn from(reason: &str) -> Self {
        Unsupported(reason.to_string())
    }
}
