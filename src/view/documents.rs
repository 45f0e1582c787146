//! Metadata documents as the view serves them (`zarr.json`, or the draft layout's
//! `.array.json`), cached per file version so that each document is parsed (and each refusal
//! logged) once per change, and the [`Layout`] that says where a store keeps them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::array::ShardedArray;
use super::error::Result;
use crate::format::draft;
use crate::format::metadata::{Interpretation, ZARR_JSON, interpret};
use crate::store::{self, Attr, Kind, Stamp, Store, join};

/// How the view serves one `zarr.json`.
#[derive(Debug)]
pub struct Document {
    /// The rewritten text, or `None` to serve the file as it is.
    pub view: Option<Arc<[u8]>>,
    /// The array it describes, when the view shows a sharded array unsharded.
    pub array: Option<Arc<ShardedArray>>,
    /// False when the file is not a JSON object (being written in place, or damaged): what it will
    /// say is not known yet.
    pub readable: bool,
}

/// Which Zarr v3 layout a store uses, and so where its array documents live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Zarr v3: `zarr.json` in every node's directory.
    #[default]
    V3,
    /// The draft storage-transformer layout of zarr-python 2.x (see [`draft`]).
    Draft,
}

impl Layout {
    /// The layout of `store`, told by its root `zarr.json`.
    pub fn detect(store: &dyn Store) -> Layout {
        let root = store.read(ZARR_JSON).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        if root.as_ref().is_some_and(draft::is_bootstrap) { Layout::Draft } else { Layout::V3 }
    }

    /// The key of the document of the array whose chunks would live in directory `dir`.
    pub fn document_key(self, dir: &str) -> Option<String> {
        match self {
            Layout::V3 => Some(join(dir, ZARR_JSON)),
            Layout::Draft => draft::document_key(dir),
        }
    }

    /// True when the file at `key` is a metadata document that the view may rewrite.
    pub fn is_document(self, key: &str) -> bool {
        match self {
            Layout::V3 => key.rsplit('/').next() == Some(ZARR_JSON),
            Layout::Draft => key.starts_with("meta/") && key.ends_with(draft::ARRAY_SUFFIX),
        }
    }

    /// The directory holding the chunks of the array described by document `key`.
    pub fn array_dir(self, key: &str) -> Option<String> {
        match self {
            Layout::V3 => Some(key.rsplit_once('/').map_or("", |(dir, _)| dir).to_string()),
            Layout::Draft => draft::data_dir(key),
        }
    }

    /// How the view shows the document at `key`, whose content is `bytes`.
    pub fn interpret(self, key: &str, bytes: &[u8]) -> Interpretation {
        match self {
            Layout::Draft if key.ends_with(draft::ARRAY_SUFFIX) => draft::interpret_array(bytes),
            Layout::Draft => Interpretation::Unchanged,
            Layout::V3 => interpret(bytes),
        }
    }
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
#[derive(Debug, Default)]
pub struct Documents {
    layout: Layout,
    /// Arrays whose shards need a bigger index than this are shown as stored.
    max_index_bytes: u64,
    cache: Mutex<HashMap<String, (Stamp, Arc<Document>)>>,
}

impl Documents {
    pub fn new(layout: Layout, max_index_bytes: u64) -> Self {
        Documents { layout, max_index_bytes, cache: Mutex::default() }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The document at `key` (a `zarr.json` whose attributes are `attr`), from cache when the
    /// file has not changed.
    pub fn get(&self, store: &dyn Store, key: &str, attr: &Attr) -> Result<Arc<Document>> {
        if let Some((stamp, doc)) = self.cache.lock().get(key)
            && *stamp == attr.stamp
        {
            return Ok(doc.clone());
        }
        let bytes = store.read(key)?;
        let shown = store.describe(key);
        let readable = serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v.is_object());
        let (view, array) = match self.limited(self.layout.interpret(key, &bytes)) {
            Interpretation::Unchanged => (None, None),
            Interpretation::Group { view } => (Some(view.into()), None),
            Interpretation::ShardedArray { view, array } => match self.layout.array_dir(key) {
                Some(dir) => {
                    (Some(view.into()), Some(Arc::new(ShardedArray::new(&dir, array).read_from(key, attr.stamp))))
                }
                None => (None, None),
            },
            Interpretation::Refused(reason) => {
                log::warn!("{shown}: shown as stored, not unsharded: {reason}");
                (None, None)
            }
        };
        let doc = Arc::new(Document { view, array, readable });
        self.cache.lock().insert(key.to_string(), (attr.stamp, doc.clone()));
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

    /// What the document of the array whose directory is `dir` says now (see [`ArrayState`]).
    pub fn state_at(&self, store: &dyn Store, dir: &str) -> Result<ArrayState> {
        let Some(key) = self.layout.document_key(dir) else { return Ok(ArrayState::Other) };
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
        let Some(key) = self.layout.document_key(dir) else { return Ok(None) };
        // Asked on every operation in an array: the cached version is usually still there.
        let cached = self.cache.lock().get(&key).map(|(stamp, doc)| (*stamp, doc.array.clone()));
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
