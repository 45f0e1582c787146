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
