//! The draft "sharding storage transformer" layout of zarr-python 2.x's experimental v3 support:
//! a bootstrap `zarr.json` at the root, array documents at `meta/root/<path>.array.json` whose
//! `storage_transformers` hold the sharding entry (`chunks_per_shard`; `chunk_grid.chunk_shape`
//! is the inner chunk shape), data under `data/root/<path>/`, chunk keys with the `c` glued to the
//! first coordinate, and shard indexes of little-endian (offset, nbytes) pairs at the end with no
//! checksum. Its unsharded view is the same document without the sharding entry (and, as that is
//! the only transformer shardfs accepts, without the `storage_transformers` field, as zarr-python
//! 2.x writes unsharded arrays).

use super::error::Unsupported;
use serde_json::{Map, Value};

use super::chunk_key::{ChunkKeyEncoding, KeyStyle};
use super::shard_index::{Endian, IndexLocation, IndexSpec};
use super::sharding::{Level, MAX_INDEX_ENTRIES, Sharding, shape};
use super::source::{Interpretation, ShardedArrayMeta, SourceFormat};

/// `zarr_format` of the root bootstrap document.
pub const CORE_PROTOCOL: &str = "https://purl.org/zarr/spec/protocol/core/3.0";

/// `extension` of the sharding storage transformer.
pub const SHARDING_TRANSFORMER: &str = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0";

/// Suffix of array documents.
pub const ARRAY_SUFFIX: &str = ".array.json";

/// True when `doc` is the root bootstrap document of this layout.
pub fn is_bootstrap(doc: &Value) -> bool {
    doc.get("zarr_format").and_then(Value::as_str) == Some(CORE_PROTOCOL)
}

/// The key of the array document whose data lives in directory `data_dir` (`data/root/a/b` ->
/// `meta/root/a/b.array.json`; `data/root` -> `meta/root.array.json`).
pub fn document_key(data_dir: &str) -> Option<String> {
    if data_dir == "data/root" {
        return Some(format!("meta/root{ARRAY_SUFFIX}"));
    }
    let path = data_dir.strip_prefix("data/root/")?;
    Some(format!("meta/root/{path}{ARRAY_SUFFIX}"))
}

/// The data directory of the array document at `key`: the inverse of [`document_key`].
pub fn data_dir(key: &str) -> Option<String> {
    let path = key.strip_prefix("meta/root")?.strip_suffix(ARRAY_SUFFIX)?;
    match path {
        "" => Some("data/root".into()),
        p => p.strip_prefix('/').map(|p| format!("data/root/{p}")),
    }
}

type Doc = Map<String, Value>;

/// Reads one array document of this layout and decides how the view shows it.
pub fn interpret_array(bytes: &[u8]) -> Interpretation {
    let doc: Doc = match serde_json::from_slice(bytes) {
        Ok(Value::Object(doc)) => doc,
        Ok(_) => return Interpretation::Refused("not a JSON object".into()),
        Err(e) => return Interpretation::Refused(format!("not JSON: {e}")),
    };
    match unsharded(&doc) {
        Ok(None) => Interpretation::Unchanged,
        Ok(Some((view, array))) => {
            let pretty = bytes.contains(&b'\n');
            let view = if pretty { serde_json::to_vec_pretty(&view) } else { serde_json::to_vec(&view) };
            Interpretation::ShardedArray { view: view.expect("a JSON map always serialises"), array }
        }
        Err(reason) => Interpretation::Refused(reason.0),
    }
}

fn unsharded(doc: &Doc) -> Result<Option<(Doc, ShardedArrayMeta)>, Unsupported> {
    let transformers = match doc.get("storage_transformers") {
        None => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(other) => return Err(format!("storage_transformers {other} is not a list").into()),
    };
    let is_sharding = |t: &Value| t.get("extension").and_then(Value::as_str) == Some(SHARDING_TRANSFORMER);
    let (sharding, others): (Vec<&Value>, Vec<&Value>) = transformers.iter().partition(|t| is_sharding(t));
    match (sharding.as_slice(), others.as_slice()) {
        ([], []) => return Ok(None),
        ([_], []) => {}
        (_, [other, ..]) => return Err(format!("storage transformer {other} is not supported").into()),
        _ => return Err("more than one sharding storage transformer".into()),
    }
    let transformer = sharding[0];
    if transformer.get("type").and_then(Value::as_str) != Some("indexed") {
        return Err(format!("sharding transformer type {} is not \"indexed\"", transformer["type"]).into());
    }
    let array_shape = shape(doc.get("shape")).ok_or("shape is not a list of non-negative integers")?;
    let grid = doc.get("chunk_grid").ok_or("no chunk_grid")?;
    if grid.get("type").and_then(Value::as_str) != Some("regular") {
        return Err(format!("chunk_grid {grid} is not regular").into());
    }
    let inner = shape(grid.get("chunk_shape")).ok_or("chunk_grid chunk_shape is not a list of integers")?;
    let per_shard = shape(transformer.get("configuration").and_then(|c| c.get("chunks_per_shard")))
        .ok_or("chunks_per_shard is not a list of integers")?;
    if inner.len() != array_shape.len()
        || per_shard.len() != inner.len()
        || inner.contains(&0)
        || per_shard.contains(&0)
    {
        return Err(format!(
            "chunk shape {inner:?} and chunks_per_shard {per_shard:?} do not fit shape {array_shape:?}"
        )
        .into());
    }
    let entries =
        per_shard.iter().try_fold(1u64, |n, c| n.checked_mul(*c).filter(|n| *n <= MAX_INDEX_ENTRIES)).ok_or_else(
            || format!("{per_shard:?} chunks per shard exceed the limit of {MAX_INDEX_ENTRIES} index entries"),
        )?;
    let separator = match grid.get("separator").and_then(Value::as_str) {
        None | Some("/") => '/',
        Some(".") => '.',
        Some(other) => return Err(format!("unsupported chunk key separator {other:?}").into()),
    };
    let shard_shape: Option<Vec<u64>> = inner.iter().zip(&per_shard).map(|(c, k)| c.checked_mul(*k)).collect();
    let level = Level {
        chunk_shape: inner,
        chunks_per_shard: per_shard,
        index: IndexSpec { entries, endian: Endian::Little, checksum: false, location: IndexLocation::End },
    };
    let sharding = Sharding {
        shard_shape: shard_shape.ok_or("shard shape overflows")?,
        levels: vec![level],
        inner_codecs: Vec::new(),
    };
    let key_encoding = ChunkKeyEncoding { style: KeyStyle::Draft, separator };
    // zarr-python 2.x writes no storage_transformers field for an array without transformers.
    let mut view = doc.clone();
    view.shift_remove("storage_transformers");
    let chunk_format = Value::from(
        ["data_type", "compressor", "filters"].map(|field| doc.get(field).cloned().unwrap_or_default()).to_vec(),
    );
    Ok(Some((view, ShardedArrayMeta { shape: array_shape, key_encoding, sharding, chunk_format })))
}

/// The draft storage-transformer layout as a [`SourceFormat`].
#[derive(Debug, Clone, Copy)]
pub struct DraftTransformer;

impl SourceFormat for DraftTransformer {
    fn document_key(&self, dir: &str) -> Option<String> {
        document_key(dir)
    }

    fn is_document(&self, key: &str) -> bool {
        key.starts_with("meta/") && key.ends_with(ARRAY_SUFFIX)
    }

    fn array_dir(&self, key: &str) -> Option<String> {
        data_dir(key)
    }

    fn interpret(&self, key: &str, bytes: &[u8]) -> Interpretation {
        if key.ends_with(ARRAY_SUFFIX) { interpret_array(bytes) } else { Interpretation::Unchanged }
    }

    fn reshard(&self, _key: &str, written: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unsupported> {
        reshard(written, stored)
    }

    fn documents_root(&self) -> &'static str {
        "meta"
    }

    fn chunks_beside_document(&self) -> bool {
        false
    }
}

/// The document to store when `written` (a view document) replaces `stored`, a sharded array
/// document of this layout: the written fields with the stored sharding transformer back. Fails
/// when the written document changes the chunk grid or the compressor, which the stored shards fix.
pub fn reshard(written: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unsupported> {
    let parse = |b: &[u8]| match serde_json::from_slice(b) {
        Ok(Value::Object(doc)) => Ok(doc),
        _ => Err("not a JSON object".to_string()),
    };
    let (mut doc, stored) = (parse(written)?, parse(stored)?);
    let Some((stored_view, _)) = unsharded(&stored)? else {
        return Err("the stored document is not a sharded array".into());
    };
    for field in ["chunk_grid", "compressor", "data_type"] {
        if doc.get(field) != stored_view.get(field) {
            return Err(format!("{field} differs from the array's; it cannot be stored sharded").into());
        }
    }
    doc.insert("storage_transformers".into(), stored["storage_transformers"].clone());
    unsharded(&doc)?.ok_or("the result is not a sharded array")?;
    let out = if written.contains(&b'\n') { serde_json::to_vec_pretty(&doc) } else { serde_json::to_vec(&doc) };
    Ok(out.expect("a JSON map always serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({"attributes": {}, "chunk_grid": {"chunk_shape": [10, 10], "separator": "/", "type": "regular"},
            "chunk_memory_layout": "C", "compressor": {"codec": "https://purl.org/zarr/spec/codec/zlib/1.0", "configuration": {"level": 1}},
            "data_type": "<u2", "extensions": [], "fill_value": 0, "shape": [45, 70],
            "storage_transformers": [{"configuration": {"chunks_per_shard": [2, 3]}, "extension": SHARDING_TRANSFORMER, "type": "indexed"}]})
    }

    #[test]
    fn paths_map_both_ways() {
        assert_eq!(document_key("data/root/g1/arr").as_deref(), Some("meta/root/g1/arr.array.json"));
        assert_eq!(data_dir("meta/root/g1/arr.array.json").as_deref(), Some("data/root/g1/arr"));
        assert_eq!(document_key("data/root").as_deref(), Some("meta/root.array.json"));
        assert_eq!(data_dir("meta/root.array.json").as_deref(), Some("data/root"));
        assert_eq!(document_key("elsewhere/x"), None);
        assert_eq!(data_dir("meta/rootx.array.json"), None);
    }

    #[test]
    fn the_view_drops_the_sharding_entry() {
        let Interpretation::ShardedArray { view, array } = interpret_array(&serde_json::to_vec(&doc()).unwrap()) else {
            panic!()
        };
        let mut expected = doc();
        expected.as_object_mut().unwrap().remove("storage_transformers");
        assert_eq!(serde_json::from_slice::<Value>(&view).unwrap(), expected);
        assert_eq!(array.sharding.shard_shape, vec![20, 30]);
        assert_eq!(array.key_encoding.encode(&[4, 6]), "c4/6");
        assert_eq!(array.sharding.levels[0].index.encoded_len(), 6 * 16);
    }

    #[test]
    fn other_transformers_are_refused_and_plain_arrays_left_alone() {
        let mut other = doc();
        other["storage_transformers"] = json!([{"extension": "https://example.org/other", "type": "x"}]);
        assert!(matches!(interpret_array(&serde_json::to_vec(&other).unwrap()), Interpretation::Refused(_)));
        let mut plain = doc();
        plain["storage_transformers"] = json!([]);
        assert_eq!(interpret_array(&serde_json::to_vec(&plain).unwrap()), Interpretation::Unchanged);
    }

    #[test]
    fn written_back_documents_get_the_transformer_again() {
        let stored = serde_json::to_vec(&doc()).unwrap();
        let mut written = doc();
        written.as_object_mut().unwrap().remove("storage_transformers");
        written["shape"] = json!([50, 70]);
        let out: Value =
            serde_json::from_slice(&reshard(&serde_json::to_vec(&written).unwrap(), &stored).unwrap()).unwrap();
        let mut expected = doc();
        expected["shape"] = json!([50, 70]);
        assert_eq!(out, expected);
        written["chunk_grid"]["chunk_shape"] = json!([5, 5]);
        assert!(reshard(&serde_json::to_vec(&written).unwrap(), &stored).is_err());
    }
}
