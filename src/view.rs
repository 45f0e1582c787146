//! The namespace of the unsharded view: which view path is which backing file, rewritten
//! document, virtual chunk directory or inner chunk, computed lazily from `zarr.json` documents
//! and shard indexes.
//!
//! - [`array`]: one sharded array as the view sees it (grid, keys, bounds).
//! - [`arrays`]: every sharded array of a store, for commands that walk it whole.
//! - [`error`]: why a view operation failed.
//! - [`documents`]: `zarr.json` interpretations, cached per file version.
//! - [`consolidated`]: the root file consolidating every metadata file (Zarr v2's `.zmetadata`),
//!   kept until a directory or document it was built from changes.
//! - [`index_cache`]: decoded shard indexes in a byte-bounded LRU, revalidated per file version.
//! - [`shards`]: finding shards on disk and inner chunks inside them.
//! - [`plain_arrays`]: arrays the view shows as stored, and which of them a file is a chunk of.
//! - [`read_ahead`]: the next shards or chunk files of an array read in order, asked for ahead of
//!   the reader.
//! - [`namespace`]: path resolution and directory listings.
//! - [`presentation`]: what the view shows: metadata files, chunk names, write-back (the seam).
//! - [`reading`]: a view file opened for reading, opened again when its version is replaced
//!   before anything was read.
//! - [`overlay`]: the hook through which uncommitted writes show in the view.
//! - [`sources`]: the store files (and versions) an answer was read from.
//! - [`retries`]: how often, and after how long, a read tries again at the version that
//!   replaced the one it was given.

pub mod array;
pub mod arrays;
pub mod consolidated;
pub mod dir_guesses;
pub mod documents;
pub mod error;
pub mod index_cache;
pub mod namespace;
pub mod overlay;
pub mod plain_arrays;
pub mod presentation;
pub mod read_ahead;
pub mod reading;
pub mod retries;
pub mod shards;
pub mod sources;
