//! The consolidated metadata file a presentation may show at the root (Zarr v2's `.zmetadata`):
//! every metadata file of the view in one document. It is built by one walk of the store's
//! directories and documents and kept, with the version of each, until one of them changes, so
//! that a store of thousands of arrays is walked once per change rather than once per read.

use std::sync::Arc;

use parking_lot::Mutex;

use super::documents::Documents;
use super::error::Result;
use super::sources::Sources;
use crate::store::{self, Kind, PRIVATE_DIR, Stamp, Store, join};

/// The consolidated file as last built, and what it was built from.
#[derive(Debug)]
pub struct Built {
    pub bytes: Arc<[u8]>,
    /// Every directory listed and document read, with its version (`None`: it was not there).
    pub sources: Vec<(String, Option<Stamp>)>,
    /// This build's version, made of its bytes (a directory's times change with every file made
    /// in it, the bytes need not): a reader is served one build from first to last byte, as a
    /// file replaced by a rename is.
    pub stamp: Stamp,
}

/// The consolidated file of one view, built on demand.
#[derive(Debug, Default)]
pub struct Consolidated {
    built: Mutex<Option<Arc<Built>>>,
}

impl Consolidated {
    /// The consolidated file as the store is now: the one built before while none of its
    /// sources changed, else a new one.
    pub fn get(&self, store: &dyn Store, documents: &Documents) -> Result<Arc<Built>> {
        let previous = self.built.lock().clone();
        if let Some(built) = previous
            && built.sources.iter().all(|(key, stamp)| unchanged(store, key, stamp))
        {
            return Ok(built);
        }
        let sources = Sources::default();
        let mut files = Vec::new();
        walk(store, documents, "", &mut files, &sources).inspect_err(|e| {
            log::warn!("{}: consolidated metadata not built: {e}", store.describe(""));
        })?;
        let bytes = documents.presentation().consolidate(&files).into();
        let built = Arc::new(Built { stamp: Stamp::computed(&bytes), bytes, sources: sources.into_vec() });
        *self.built.lock() = Some(built.clone());
        Ok(built)
    }
}

fn unchanged(store: &dyn Store, key: &str, stamp: &Option<Stamp>) -> bool {
    match stamp {
        Some(stamp) => store.is_unchanged(key, stamp),
        None => matches!(store.attr(key), Err(store::Error::NotFound(_))),
    }
}

/// Adds the metadata files of directory `dir` and of every node below it to `files` (view paths
/// and contents), recording what was read in `sources`. An array's directory holds only chunks,
/// so the walk stops there.
fn walk(
    store: &dyn Store,
    documents: &Documents,
    dir: &str,
    files: &mut Vec<(String, Arc<[u8]>)>,
    sources: &Sources,
) -> Result<()> {
    if let Some(key) = documents.source().document_key(dir) {
        match store.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => {
                sources.record(&key, Some(attr.stamp));
                let doc = documents.get(store, &key, &attr)?;
                files.extend(doc.files.iter().map(|(name, content)| (join(dir, name), content.clone())));
                if !doc.holds_nodes {
                    return Ok(());
                }
            }
            Ok(_) => {}
            Err(store::Error::NotFound(_)) => sources.record(&key, None),
            Err(e) => return Err(e.into()),
        }
    }
    let (mut entries, stamp) = store.list(dir)?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    sources.record(dir, Some(stamp));
    for (name, kind) in entries {
        let shown = !(documents.presentation().hides(&name) || dir.is_empty() && name == PRIVATE_DIR);
        if kind == Kind::Dir && shown {
            walk(store, documents, &join(dir, &name), files, sources)?;
        }
    }
    Ok(())
}
