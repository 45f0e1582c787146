//! What the view shows, behind one seam chosen at mount: a [`Presentation`] names the chunk files
//! of an array, says which view files are metadata documents and which stored document each one
//! is rendered from, renders them, hides stored names it replaces, and translates a document
//! written through the view back to the form the store keeps.
//!
//! - [`ZarrV3`]: the unsharded Zarr v3 store: each stored document at its own path, rewritten
//!   without sharding; chunk files keep the array's own chunk key encoding.
//! - [`ZarrV2`]: a Zarr v2 store: `.zgroup`, `.zarray` and `.zattrs` rendered from each
//!   `zarr.json` (which is hidden; written `.zattrs` and `.zarray` resizes are stored back into it),
//!   a consolidated `.zmetadata` at the root, chunk files at v2 keys, a trailing crc32c checked and
//!   left out; sharded arrays as their inner chunks, unsharded ones as their stored chunk files
//!   renamed. Arrays v2 cannot express are left out, each with a log line. A group's OME-Zarr
//!   0.5 metadata is shown in its 0.4 form (`format::ome`), and a `.zattrs` written in 0.4 form
//!   is stored back in 0.5 form.

use std::fmt::Debug;
use std::sync::Arc;

use crate::format::Unsupported;
use crate::format::chunk_key::{ChunkKeyEncoding, KeyStyle};
use crate::format::metadata::ZARR_JSON;
use crate::format::source::{Interpretation, SourceFormat};
use crate::format::{ome, zarr_v2};

/// The view files rendered from one stored document.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rendered {
    /// File name (in the document's directory) and content; none: the stored document is shown
    /// as it is, unless [`Presentation::hides`] it.
    pub files: Vec<(String, Vec<u8>)>,
    /// For a sharded array: whether its inner chunks are shown, and how.
    pub chunks: Option<ChunkView>,
}

/// How the view shows the inner chunks of a sharded array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkView {
    /// The key encoding chunk files are named with.
    pub keys: ChunkKeyEncoding,
    /// Each chunk ends in a crc32c of the rest, which the view checks and leaves out.
    pub strip_crc32c: bool,
}

/// One way of showing a store.
pub trait Presentation: Send + Sync + Debug {
    /// The stored document that the view file at `path` is rendered from, if it names one of the
    /// view's metadata documents.
    fn document_at(&self, source: &dyn SourceFormat, path: &str) -> Option<String>;

    /// True when a stored entry named `name` is not shown.
    fn hides(&self, name: &str) -> bool;

    /// The view files of the stored document `key` (named as the store shows it, for log lines;
    /// it ends in the document's file name), whose content is `stored`, given what the source
    /// format made of it.
    fn render(&self, key: &str, interpretation: &Interpretation, stored: &[u8]) -> Rendered;

    /// The name of a file at the root consolidating every metadata file of the view, if the view
    /// has one.
    fn consolidated_name(&self) -> Option<&'static str>;

    /// The content of that file, given every metadata file of the view (path and content).
    fn consolidate(&self, files: &[(String, Arc<[u8]>)]) -> Vec<u8>;

    /// Why the view cannot show a store of format `source`, if it cannot.
    fn cannot_show(&self, source: &dyn SourceFormat) -> Option<String>;

    /// True when a metadata file of the view can be created or deleted on its own (it is a stored
    /// document); false when view files share one stored document (Zarr v2's `.zarray` and
    /// `.zattrs`), so that arrays and groups are created and deleted through the v3 view only.
    fn creates_documents(&self) -> bool;

    /// The document to store at `key` when the view file at `path`, rendered from it, is written
    /// with `written`; `stored` is the document there now. `Ok(None)`: the view file is the
    /// document itself, stored as written.
    fn store_back(
        &self,
        source: &dyn SourceFormat,
        path: &str,
        key: &str,
        written: &[u8],
        stored: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>, Unsupported>;
}

/// The unsharded Zarr v3 store (or, for the draft layout, the same layout without its sharding
/// transformer).
#[derive(Debug, Clone, Copy, Default)]
pub struct ZarrV3;

impl Presentation for ZarrV3 {
    fn document_at(&self, source: &dyn SourceFormat, path: &str) -> Option<String> {
        source.is_document(path).then(|| path.to_string())
    }

    fn hides(&self, _name: &str) -> bool {
        false
    }

    fn render(&self, key: &str, interpretation: &Interpretation, _stored: &[u8]) -> Rendered {
        let name = crate::store::file_name(key).to_string();
        match interpretation {
            Interpretation::Group { view } => Rendered { files: vec![(name, view.clone())], chunks: None },
            Interpretation::ShardedArray { view, array } => {
                let chunks = ChunkView { keys: array.key_encoding, strip_crc32c: false };
                Rendered { files: vec![(name, view.clone())], chunks: Some(chunks) }
            }
            Interpretation::Unchanged | Interpretation::PlainArray { .. } | Interpretation::Refused(_) => {
                Rendered::default()
            }
        }
    }

    fn consolidated_name(&self) -> Option<&'static str> {
        None
    }

    fn consolidate(&self, _files: &[(String, Arc<[u8]>)]) -> Vec<u8> {
        Vec::new()
    }

    fn cannot_show(&self, _source: &dyn SourceFormat) -> Option<String> {
        None
    }

    fn creates_documents(&self) -> bool {
        true
    }

    /// A sharded array's document gets its stored sharding back.
    fn store_back(
        &self,
        source: &dyn SourceFormat,
        _path: &str,
        key: &str,
        written: &[u8],
        stored: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>, Unsupported> {
        let Some(stored) = stored else { return Ok(None) };
        if !matches!(source.interpret(key, stored), Interpretation::ShardedArray { .. }) {
            return Ok(None);
        }
        source.reshard(key, written, stored).map(Some)
    }
}

/// A group's `.zattrs` with its OME-Zarr 0.5 metadata in 0.4 form, since the readers of OME-Zarr
/// 0.4 are the ones that read only Zarr v2; as stored where 0.4 cannot express it (a 0.4 reader
/// would misread it), with a log line naming the document.
fn ome_v04(key: &str, zattrs: serde_json::Value) -> serde_json::Value {
    match ome::to_v04(&zattrs) {
        Ok(Some(v04)) => v04,
        Ok(None) => zattrs,
        Err(why) => {
            log::warn!("{key}: OME-Zarr metadata kept in 0.5 form in the Zarr v2 view: {why}");
            zattrs
        }
    }
}

/// A Zarr v2 store of the same data, for readers that know only v2.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZarrV2;

/// The names of the v2 view's metadata files.
const V2_DOCUMENTS: [&str; 3] = [".zgroup", ".zarray", ".zattrs"];

/// The v2 view's consolidated metadata, at the root.
const ZMETADATA: &str = ".zmetadata";

impl Presentation for ZarrV2 {
    fn document_at(&self, source: &dyn SourceFormat, path: &str) -> Option<String> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        V2_DOCUMENTS.contains(&name).then(|| source.document_key(dir)).flatten()
    }

    /// A stored `.zmetadata` would contradict the one rendered.
    fn hides(&self, name: &str) -> bool {
        name == ZARR_JSON || name == ZMETADATA
    }

    fn render(&self, key: &str, interpretation: &Interpretation, stored: &[u8]) -> Rendered {
        let json = |value: &serde_json::Value| serde_json::to_vec_pretty(value).expect("JSON values serialize");
        let parsed = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).ok();
        let (view, sharded) = match interpretation {
            Interpretation::ShardedArray { view, array } => (parsed(view), Some(array)),
            Interpretation::Group { view } => (parsed(view), None),
            Interpretation::PlainArray { array } => (parsed(stored), Some(array)),
            Interpretation::Unchanged => (parsed(stored), None),
            Interpretation::Refused(_) => return Rendered::default(),
        };
        let Some(doc) = view.filter(|d| d["zarr_format"] == 3) else { return Rendered::default() };
        if doc["node_type"] == "group" {
            let (zgroup, zattrs) = zarr_v2::v2_group(&doc);
            let zattrs = ome_v04(key, zattrs);
            return Rendered {
                files: vec![(".zgroup".into(), json(&zgroup)), (".zattrs".into(), json(&zattrs))],
                chunks: None,
            };
        }
        let Some(array) = sharded else {
            log::warn!("{key}: not shown in the Zarr v2 view: shardfs cannot find its chunks");
            return Rendered::default();
        };
        match zarr_v2::v2_array(&doc) {
            Ok(v2) => {
                let keys = ChunkKeyEncoding { style: KeyStyle::V2, separator: array.key_encoding.separator };
                Rendered {
                    files: vec![(".zarray".into(), json(&v2.zarray)), (".zattrs".into(), json(&v2.zattrs))],
                    chunks: Some(ChunkView { keys, strip_crc32c: v2.strip_crc32c }),
                }
            }
            Err(why) => {
                log::warn!("{key}: not shown in the Zarr v2 view: {why}");
                Rendered::default()
            }
        }
    }

    fn consolidated_name(&self) -> Option<&'static str> {
        Some(ZMETADATA)
    }

    /// zarr-python 2's format (`zarr.consolidate_metadata`), which xarray reads too.
    fn consolidate(&self, files: &[(String, Arc<[u8]>)]) -> Vec<u8> {
        let metadata: serde_json::Map<String, serde_json::Value> = files
            .iter()
            .filter_map(|(path, content)| Some((path.clone(), serde_json::from_slice(content).ok()?)))
            .collect();
        let consolidated = serde_json::json!({"metadata": metadata, "zarr_consolidated_format": 1});
        serde_json::to_vec_pretty(&consolidated).expect("JSON values serialize")
    }

    /// v2 metadata files live in their node's directory, beside its chunks.
    fn cannot_show(&self, source: &dyn SourceFormat) -> Option<String> {
        (!source.chunks_beside_document()).then(|| {
            "the Zarr v2 view shows stores that keep each array's document beside its chunks, \
             which the draft layout (meta/ and data/ trees) does not"
                .into()
        })
    }

    fn creates_documents(&self) -> bool {
        false
    }

    /// `.zattrs` sets the attributes (and dimension names), `.zarray` the shape; `.zgroup` says
    /// nothing a v3 group does not. Where there is no document yet, `.zarray` makes an array and
    /// `.zgroup` a group.
    fn store_back(
        &self,
        source: &dyn SourceFormat,
        path: &str,
        key: &str,
        written: &[u8],
        stored: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>, Unsupported> {
        let parse = |bytes: &[u8], what: &str| {
            serde_json::from_slice::<serde_json::Value>(bytes)
                .map_err(|e| Unsupported(format!("{what} is not JSON: {e}")))
        };
        let name = crate::store::file_name(path);
        let written = parse(written, name)?;
        let json = |value: &serde_json::Value| serde_json::to_vec_pretty(value).expect("JSON values serialize");
        // A node made through this view: zarr-python 2 writes its .zarray or .zgroup first.
        let Some(stored) = stored else {
            return match name {
                ".zarray" => Ok(Some(json(&zarr_v2::v3_array(&written)?))),
                ".zgroup" if written == serde_json::json!({"zarr_format": 2}) => {
                    Ok(Some(json(&serde_json::json!({"zarr_format": 3, "node_type": "group", "attributes": {}}))))
                }
                _ => Err(format!("{name}: no array or group here to store it in").into()),
            };
        };
        let doc = parse(stored, "the stored document")?;
        let updated = match name {
            ".zattrs" if doc["node_type"] == "group" => {
                let stored_attributes = &doc["attributes"];
                let attributes = ome::from_v04(&written, stored_attributes).unwrap_or(written);
                zarr_v2::with_zattrs(&doc, &attributes)?
            }
            ".zattrs" => zarr_v2::with_zattrs(&doc, &written)?,
            ".zarray" => {
                let shown = match source.interpret(key, stored) {
                    Interpretation::ShardedArray { view, .. } => parse(&view, "the stored document's view")?,
                    _ => doc.clone(),
                };
                zarr_v2::with_zarray(&doc, &zarr_v2::v2_array(&shown)?.zarray, &written)?
            }
            ".zgroup" if written == serde_json::json!({"zarr_format": 2}) => doc.clone(),
            _ => return Err(format!("{name}: not a metadata file the Zarr v2 view can store").into()),
        };
        // Unchanged (a tool writing back what it read): the stored bytes as they are, whatever
        // their layout (zarr-python indents by 4, serde by 2).
        if updated == doc {
            return Ok(Some(stored.to_vec()));
        }
        let pretty = stored.contains(&b'\n');
        let bytes = if pretty { serde_json::to_vec_pretty(&updated) } else { serde_json::to_vec(&updated) };
        Ok(Some(bytes.expect("JSON values serialize")))
    }
}
