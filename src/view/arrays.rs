//! Every array of a store that the view shows unsharded (and those it refuses), and every Zarr v3
//! array it shows at all (and every group), found by walking the store's metadata documents; for the commands that
//! go through a whole store.

use crate::format::source::Interpretation;
use crate::format::source::SourceFormat;
use crate::store::{self, Kind, PRIVATE_DIR, Store, join};
use crate::view::array::ShardedArray;
use crate::view::documents::source_of;

/// The arrays of a store that the view shows unsharded, and those it refuses.
#[derive(Debug, Default)]
pub struct FoundArrays {
    pub sharded: Vec<ShardedArray>,
    /// `zarr.json` path and reason, for sharded arrays with no faithful unsharded view.
    pub refused: Vec<(String, String)>,
    /// Document path and reason, for metadata documents that are not JSON objects.
    pub invalid: Vec<(String, String)>,
    /// Every Zarr v3 array the view shows, sharded or not, as the directory and the document the
    /// v3 view shows for it (a sharded array's as its inner chunks).
    pub shown: Vec<(String, serde_json::Value)>,
    /// Every Zarr v3 group, as its directory and its document.
    pub groups: Vec<(String, serde_json::Value)>,
}

/// Walks the store (not `__shardfs/`) for sharded arrays, in path order.
pub fn find_arrays(store: &dyn Store) -> Result<FoundArrays, store::Error> {
    let mut found = FoundArrays::default();
    let source = source_of(store);
    let top = source.documents_root();
    if !store.attr(top).is_ok_and(|a| a.kind == Kind::Dir) {
        return Ok(found);
    }
    find_in(store, &*source, top, &mut found)?;
    Ok(found)
}

fn find_in(
    store: &dyn Store,
    source: &dyn SourceFormat,
    dir: &str,
    found: &mut FoundArrays,
) -> Result<(), store::Error> {
    let (mut entries, _) = store.list(dir)?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in &entries {
        let key = join(dir, name);
        if *kind != Kind::File || !source.is_document(&key) {
            continue;
        }
        let bytes = store.read(&key)?;
        if !serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v.is_object()) {
            found.invalid.push((key, "not a JSON object".into()));
            continue;
        }
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && doc["zarr_format"] == 3
            && doc["node_type"] == "group"
            && let Some(group_dir) = source.array_dir(&key)
        {
            found.groups.push((group_dir, doc));
        }
        let interpretation = source.interpret(&key, &bytes);
        let shown = match &interpretation {
            Interpretation::ShardedArray { view, .. } => serde_json::from_slice(view).ok(),
            Interpretation::Unchanged | Interpretation::PlainArray { .. } => serde_json::from_slice(&bytes).ok(),
            Interpretation::Group { .. } | Interpretation::Refused(_) => None,
        };
        if let Some(doc) = shown.filter(|d: &serde_json::Value| d["zarr_format"] == 3 && d["node_type"] == "array")
            && let Some(array_dir) = source.array_dir(&key)
        {
            found.shown.push((array_dir, doc));
        }
        match interpretation {
            Interpretation::ShardedArray { array, .. } => {
                if let Some(array_dir) = source.array_dir(&key) {
                    found.sharded.push(ShardedArray::new(&array_dir, array));
                }
                if source.chunks_beside_document() {
                    return Ok(());
                }
            }
            Interpretation::Refused(reason) => found.refused.push((key, reason)),
            Interpretation::Unchanged | Interpretation::PlainArray { .. } | Interpretation::Group { .. } => {}
        }
    }
    for (name, kind) in entries {
        if kind == Kind::Dir && !(dir.is_empty() && name == PRIVATE_DIR) {
            find_in(store, source, &join(dir, &name), found)?;
        }
    }
    Ok(())
}
