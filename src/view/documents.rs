//! `zarr.json` documents as the view serves them, cached per file version so that each document
//! is parsed (and each refusal logged) once per change.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::array::ShardedArray;
use crate::error::{Error, Result};
use crate::format::metadata::{Interpretation, interpret};
use crate::store::{Attr, DirStore, Kind, Stamp};

/// How the view serves one `zarr.json`.
#[derive(Debug)]
pub struct Document {
    /// The rewritten text, or `None` to serve the file as it is.
    pub view: Option<Arc<[u8]>>,
    /// The array it describes, when the view shows a sharded array unsharded.
    pub array: Option<Arc<ShardedArray>>,
}

/// Interpretations of `zarr.json` files keyed by store key.
#[derive(Debug, Default)]
pub struct Documents {
    cache: Mutex<HashMap<String, (Stamp, Arc<Document>)>>,
}

impl Documents {
    /// The document at `key` (a `zarr.json` whose attributes are `attr`), from cache when the
    /// file has not changed.
    pub fn get(&self, store: &DirStore, key: &str, attr: &Attr) -> Result<Arc<Document>> {
        if let Some((stamp, doc)) = self.cache.lock().get(key)
            && *stamp == attr.stamp
        {
            return Ok(doc.clone());
        }
        let bytes = store.read(key).map_err(|e| Error::io(key, e))?;
        let dir = key.rsplit_once('/').map_or("", |(dir, _)| dir);
        let doc = Arc::new(match interpret(&bytes) {
            Interpretation::Unchanged => Document { view: None, array: None },
            Interpretation::Group { view } => Document { view: Some(view.into()), array: None },
            Interpretation::ShardedArray { view, array } => {
                Document { view: Some(view.into()), array: Some(Arc::new(ShardedArray::new(dir.to_string(), array))) }
            }
            Interpretation::Refused(reason) => {
                log::warn!("{key}: shown as stored, not unsharded: {reason}");
                Document { view: None, array: None }
            }
        });
        self.cache.lock().insert(key.to_string(), (attr.stamp, doc.clone()));
        Ok(doc)
    }

    /// The sharded array whose directory is `dir`, if the view shows one there.
    pub fn array_at(&self, store: &DirStore, dir: &str) -> Result<Option<Arc<ShardedArray>>> {
        let key = crate::store::join(dir, "zarr.json");
        match store.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => Ok(self.get(store, &key, &attr)?.array.clone()),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&key, e)),
        }
    }
}
