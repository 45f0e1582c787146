//! What the view shows, behind one seam chosen at mount: a [`Presentation`] names the chunk files
//! of an array, says which view files are metadata documents and which stored document each one
//! is rendered from, renders it, and translates a document written through the view back to the
//! form the store keeps. The unsharded Zarr v3 view ([`ZarrV3`]) is the first presentation: each
//! stored document is shown at its own path, rewritten without sharding, and chunk files keep the
//! array's own chunk key encoding.

use std::fmt::Debug;

use crate::format::Unsupported;
use crate::format::chunk_key::ChunkKeyEncoding;
use crate::format::source::{Interpretation, ShardedArrayMeta, SourceFormat};

/// One way of showing a store.
pub trait Presentation: Send + Sync + Debug {
    /// The chunk key encoding the view names `array`'s inner chunks with.
    fn chunk_keys(&self, array: &ShardedArrayMeta) -> ChunkKeyEncoding;

    /// The stored document that the view file at `path` is rendered from, if it is a metadata
    /// document of the view.
    fn document_at(&self, source: &dyn SourceFormat, path: &str) -> Option<String>;

    /// The content the view shows for a stored document, given what the source format made of
    /// it; `None` serves the stored bytes as they are.
    fn render(&self, interpretation: &Interpretation) -> Option<Vec<u8>>;

    /// The document to store at `key` when its view file is written with `written`, over the
    /// stored document `stored` of a sharded array.
    fn store_back(
        &self,
        source: &dyn SourceFormat,
        key: &str,
        written: &[u8],
        stored: &[u8],
    ) -> Result<Vec<u8>, Unsupported>;
}

/// The unsharded Zarr v3 store (or, for the draft layout, the same layout without its sharding
/// transformer).
#[derive(Debug, Clone, Copy, Default)]
pub struct ZarrV3;

impl Presentation for ZarrV3 {
    fn chunk_keys(&self, array: &ShardedArrayMeta) -> ChunkKeyEncoding {
        array.key_encoding
    }

    fn document_at(&self, source: &dyn SourceFormat, path: &str) -> Option<String> {
        source.is_document(path).then(|| path.to_string())
    }

    fn render(&self, interpretation: &Interpretation) -> Option<Vec<u8>> {
        match interpretation {
            Interpretation::Group { view } | Interpretation::ShardedArray { view, .. } => Some(view.clone()),
            Interpretation::Unchanged | Interpretation::Refused(_) => None,
        }
    }

    fn store_back(
        &self,
        source: &dyn SourceFormat,
        key: &str,
        written: &[u8],
        stored: &[u8],
    ) -> Result<Vec<u8>, Unsupported> {
        source.reshard(key, written, stored)
    }
}
