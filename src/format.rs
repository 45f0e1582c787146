//! The Zarr formats shardfs reads, as pure functions over bytes and JSON: no I/O, no FUSE.
//!
//! - [`blz`]: the BLZ family (Bloscpack files, bcolz directories), headers to Zarr documents.
//! - [`codecs`]: undoing an inner chunk's codecs to tell whether its stored bytes are intact.
//! - [`chunk_key`]: chunk coordinates <-> store keys for every key encoding.
//! - [`draft`]: the draft sharding storage transformer layout of zarr-python 2.x.
//! - [`foreign`]: other crates' parsers run with their panics caught.
//! - [`icechunk`]: Icechunk repositories (spec v1 and v2): branches and tags, a snapshot's nodes,
//!   a chunk's place in a manifest, read with the `icechunk-format` crate.
//! - [`kerchunk`]: kerchunk reference sets (JSON and parquet): keys to inline bytes or ranges of
//!   files at URLs.
//! - [`metadata`]: `zarr.json` documents and the unsharded view of a sharded array.
//! - [`ome`]: OME-Zarr 0.5 group metadata in its 0.4 form (for the Zarr v2 view) and back.
//! - [`sharding`]: the `sharding_indexed` codec configuration, possibly nested.
//! - [`shard_index`]: the (offset, nbytes) index at the start or end of a shard.
//! - [`shard_merge`]: two writers' versions of one shard merged inner chunk by inner chunk.
//! - [`source`]: the kinds of store shardfs reads (the sharding codec, the draft transformer),
//!   one implementation each; [`recognise`] is the one place a store's kind is decided.
//! - [`zarr_v2`]: the Zarr v2 metadata of a v3 array, or why v2 cannot express it.
//! - [`zip`]: a zip file's end records, central directory and local headers (zip stores).
//! - [`error`]: why a document cannot be shown or stored.

pub mod blz;
pub mod chunk_key;
pub mod codecs;
pub mod draft;
pub mod error;
pub mod foreign;
pub mod icechunk;
pub mod kerchunk;
pub mod metadata;
pub mod ome;
pub mod shard_index;
pub mod shard_merge;
pub mod sharding;
pub mod source;
pub mod zarr_v2;
pub mod zip;

use std::sync::Arc;

use serde_json::Value;

pub use error::Unsupported;
use source::SourceFormat;

/// The kind of a store whose root document is `root`; `None` when shardfs reads no such store.
pub fn recognise(root: &Value) -> Option<Arc<dyn SourceFormat>> {
    if root.get("zarr_format") == Some(&Value::from(3)) {
        Some(Arc::new(metadata::ShardingCodec))
    } else if draft::is_bootstrap(root) {
        Some(Arc::new(draft::DraftTransformer))
    } else {
        None
    }
}
