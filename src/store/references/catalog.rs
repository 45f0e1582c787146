//! One version of a reference set, indexed: the key tree, each file key's reference, and (the
//! parquet layout) the chunk grid of each array whose chunk references are rows of record files,
//! read only when asked for.

use std::collections::HashMap;

use crate::format::kerchunk::parquet::{self, ChunkGrid};
use crate::format::kerchunk::{self, Reference};
use crate::store::Attr;
use crate::store::key_tree::KeyTree;

/// How the reference set is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One JSON file (version 0 or 1).
    Json,
    /// A directory of `.zmetadata` and per-array record files.
    Parquet,
}

impl Layout {
    /// The file whose version is the reference set's: the JSON file, or `.zmetadata`.
    pub fn version_file(self, at: &str) -> String {
        match self {
            Layout::Json => at.to_string(),
            Layout::Parquet => crate::store::join(at, parquet::METADATA),
        }
    }
}

/// One version of a reference set.
#[derive(Debug)]
pub struct Catalog {
    /// The attributes of the file read (its stamp is the version's).
    pub attr: Attr,
    pub tree: KeyTree,
    /// Each file key's reference, by its number in `tree`.
    pub refs: Vec<Reference>,
    /// The parquet layout: the arrays whose chunks are rows of records, by directory key, with
    /// their chunk grid and how many rows a record holds, or why their `.zarray` cannot say.
    pub arrays: HashMap<String, Result<ChunkGrid, String>>,
    pub record_size: u64,
}

impl Catalog {
    /// The catalog of `bytes`, the version file of a reference set in `layout` (whose attributes
    /// are `attr`, named `place` in messages); the error says why it is not one.
    pub fn parse(bytes: Vec<u8>, attr: Attr, place: &str, layout: Layout) -> Result<Catalog, String> {
        match layout {
            Layout::Json => {
                let refs = kerchunk::parse_json(&bytes).map_err(|e| format!("not a kerchunk reference file: {e}"))?;
                let tree = KeyTree::of(refs.iter().enumerate().map(|(n, (key, _))| (n, key.as_str())), place);
                let refs = refs.into_iter().map(|(_, reference)| reference).collect();
                Ok(Catalog { attr, tree, refs, arrays: HashMap::new(), record_size: 0 })
            }
            Layout::Parquet => {
                let metadata =
                    parquet::metadata(&bytes).map_err(|e| format!("not a parquet reference set's metadata: {e}"))?;
                // fsspec shows `.zmetadata` itself, a Zarr v2 consolidated metadata document.
                let mut documents = metadata.documents;
                documents.push((parquet::METADATA.to_string(), bytes));
                let documents = &documents;
                let tree = KeyTree::of(documents.iter().enumerate().map(|(n, (key, _))| (n, key.as_str())), place);
                // fsspec finds records of arrays below the root only: a chunk key has a directory.
                let arrays = documents
                    .iter()
                    .filter_map(|(key, doc)| Some((key.strip_suffix("/.zarray")?, doc)))
                    .map(|(dir, doc)| {
                        let grid = ChunkGrid::of_zarray(doc).map_err(|e| format!("{dir}/.zarray: {e}"));
                        (dir.to_string(), grid)
                    })
                    .collect();
                let refs = documents.iter().map(|(_, doc)| Reference::Inline(doc.as_slice().into())).collect();
                Ok(Catalog { attr, tree, refs, arrays, record_size: metadata.record_size })
            }
        }
    }
}
