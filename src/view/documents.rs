//! Metadata documents as the view serves them (`zarr.json`, or the draft layout's
//! `.array.json`), cached per file version so that each document is parsed (and each refusal
//! logged) once per change, read as the store's source format says.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::array::ShardedArray;
use super::error::Result;
use super::presentation::Presentation;
use crate::format::metadata::{ShardingCodec, ZARR_JSON};
use crate::format::recognise;
use crate::format::source::Interpretation;
use crate::format::source::SourceFormat;
use crate::store::{self, Attr, Kind, Stamp, Store};

/// How the view serves one `zarr.json`.
#[derive(Debug)]
pub struct Document {
    /// The view files rendered from it, by name in its directory; none: the file is served as it
    /// is (unless the presentation hides it).
    pub files: Vec<(String, Arc<[u8]>)>,
    /// The array it describes, when the view shows a sharded array unsharded.
    pub array: Option<Arc<ShardedArray>>,
    /// False when the file is not a JSON object (being written in place, or damaged): what it will
    /// say is not known yet.
    pub readable: bool,
    /// True when it describes a group, whose directory may hold further nodes (an array's
    /// directory holds only its chunks).
    pub holds_nodes: bool,
}

impl Document {
    /// What the view serves at view path `path`, a metadata file rendered from the stored
    /// document `key`: the rendered bytes, the stored file as it is (`None` inside), or nothing
    /// (`None`).
    pub fn served(&self, path: &str, key: &str, presentation: &dyn Presentation) -> Option<Option<Arc<[u8]>>> {
        let name = store::file_name(path);
        if let Some((_, content)) = self.files.iter().find(|(n, _)| n == name) {
            return Some(Some(content.clone()));
        }
        (self.files.is_empty() && name == store::file_name(key) && !presentation.hides(name)).then_some(None)
    }
}

/// The source format of `store`, told by its root document (the sharding codec when there is
/// none to tell: the view then shows the store as it is).
pub fn source_of(store: &dyn Store) -> Arc<dyn SourceFormat> {
    let root = store.read(ZARR_JSON).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    root.as_ref().and_then(recognise).unwrap_or_else(|| Arc::new(ShardingCodec))
}

#[derive(Debug)]
struct Cached {
    stamp: Stamp,
    doc: Arc<Document>,
    previous: Option<(Stamp, Option<Arc<ShardedArray>>)>,
}

/// What an array's document says now, for pending writes made under an earlier version of it.
#[derive(Debug)]
pub enum ArrayState {
    /// A sharded array the view shows unsharded.
    Sharded(Arc<ShardedArray>),
    /// Something else for good: no array any more, a group, an unsharded or refused array.
    Other,
    /// Not known yet: the document is missing from a directory that is still there, or is not a
    /// JSON object (a writer may be half-way through it).
    Unreadable,
}

/// Interpretations of the store's metadata documents keyed by store key.
#[derive(Debug)]
pub struct Documents {
    source: Arc<dyn SourceFormat>,
    presentation: Arc<dyn Presentation>,
    /// Arrays whose shards need a bigger index than this are shown as stored.
    max_index_bytes: u64,
    /// Per document key: the version cached, its interpretation, and the version and array it
    /// replaced (to tell a grow from other changes).
    cache: Mutex<HashMap<String, Cached>>,
}

impl Documents {
    pub fn new(source: Arc<dyn SourceFormat>, presentation: Arc<dyn Presentation>, max_index_bytes: u64) -> Self {
        Documents { source, presentation, max_index_bytes, cache: Mutex::default() }
    }

    /// What the view shows.
    pub fn presentation(&self) -> &dyn Presentation {
        &*self.presentation
    }

    /// How the store keeps its arrays.
    pub fn source(&self) -> &dyn SourceFormat {
        &*self.source
    }

    /// The document at `key` (a `zarr.json` whose attributes are `attr`), from cache when the
    /// file has not changed.
    pub fn get(&self, store: &dyn Store, key: &str, attr: &Attr) -> Result<Arc<Document>> {
        if let Some(cached) = self.cache.lock().get(key)
            && cached.stamp == attr.stamp
        {
            return Ok(cached.doc.clone());
        }
        let bytes = store.read(key)?;
        let shown = store.describe(key);
        let parsed = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
        let readable = parsed.as_ref().is_some_and(|v| v.is_object());
        let holds_nodes = parsed.is_some_and(|v| v["node_type"] == "group");
        let interpretation = self.limited(self.source.interpret(key, &bytes));
        let rendered = self.presentation.render(&shown, &interpretation, &bytes);
        let files = rendered.files.into_iter().map(|(name, content)| (name, Arc::from(content))).collect();
        let array = match interpretation {
            Interpretation::ShardedArray { array, .. } | Interpretation::PlainArray { array } => {
                rendered.chunks.zip(self.source.array_dir(key)).map(|(chunks, dir)| {
                    Arc::new(ShardedArray::new(&dir, array).shown_with(chunks).read_from(key, attr.stamp))
                })
            }
            Interpretation::Refused(reason) => {
                log::warn!("{shown}: shown as stored, not unsharded: {reason}");
                None
            }
            Interpretation::Unchanged | Interpretation::Group { .. } => None,
        };
        let doc = Arc::new(Document { files, array, readable, holds_nodes });
        let mut cache = self.cache.lock();
        let previous = cache.get(key).map(|c| (c.stamp, c.doc.array.clone()));
        cache.insert(key.to_string(), Cached { stamp: attr.stamp, doc: doc.clone(), previous });
        Ok(doc)
    }

    /// `interpretation`, refused when a shard of the array would need an index bigger than the
    /// limit: decoding it would take that much memory for every shard read.
    fn limited(&self, interpretation: Interpretation) -> Interpretation {
        if let Interpretation::ShardedArray { array, .. } = &interpretation
            && let Some(largest) = array.sharding.levels.iter().map(|l| l.index.encoded_len()).max()
            && largest > self.max_index_bytes
        {
            return Interpretation::Refused(format!(
                "one shard's index takes {largest} bytes, more than the limit of {} (--max-index-size)",
                self.max_index_bytes
            ));
        }
        interpretation
    }

    /// True when the document at `key` (now at `attr`) changed from version `from` only by growing
    /// its sharded array: same chunks, no dimension smaller.
    pub fn grew(&self, store: &dyn Store, key: &str, from: Stamp, attr: &Attr) -> bool {
        let Ok(doc) = self.get(store, key, attr) else { return false };
        let cache = self.cache.lock();
        let Some(Cached { previous: Some((before, Some(old))), .. }) = cache.get(key) else { return false };
        *before == from
            && doc.array.as_ref().is_some_and(|new| {
                new.same_chunks(old) && new.meta.shape.iter().zip(&old.meta.shape).all(|(n, o)| n >= o)
            })
    }

    /// What the document of the array whose directory is `dir` says now (see [`ArrayState`]).
    pub fn state_at(&self, store: &dyn Store, dir: &str) -> Result<ArrayState> {
        let Some(key) = self.source.document_key(dir) else { return Ok(ArrayState::Other) };
        match store.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => {
                let doc = self.get(store, &key, &attr)?;
                Ok(match (&doc.array, doc.readable) {
                    (Some(array), _) => ArrayState::Sharded(array.clone()),
                    (None, true) => ArrayState::Other,
                    (None, false) => ArrayState::Unreadable,
                })
            }
            Ok(_) => Ok(ArrayState::Other),
            // A document being replaced can be missing for a moment; an array deleted takes its
            // directory with it.
            Err(store::Error::NotFound(_)) => match store.attr(dir) {
                Ok(_) => Ok(ArrayState::Unreadable),
                Err(store::Error::NotFound(_)) => Ok(ArrayState::Other),
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The sharded array whose directory is `dir`, if the view shows one there.
    pub fn array_at(&self, store: &dyn Store, dir: &str) -> Result<Option<Arc<ShardedArray>>> {
        let Some(key) = self.source.document_key(dir) else { return Ok(None) };
        // Asked on every operation in an array: the cached version is usually still there.
        let cached = self.cache.lock().get(&key).map(|c| (c.stamp, c.doc.array.clone()));
        if let Some((stamp, array)) = cached
            && store.is_unchanged(&key, &stamp)
        {
            return Ok(array);
        }
        match store.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => Ok(self.get(store, &key, &attr)?.array.clone()),
            Ok(_) | Err(store::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
