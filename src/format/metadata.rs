//! `zarr.json` documents: which ones shardfs rewrites, and the rewritten text.
//!
//! A sharded array's view document keeps every field verbatim except
//! `chunk_grid.configuration.chunk_shape` (the innermost chunk shape) and `codecs` (the innermost
//! codecs). A group's inline consolidated metadata repeats its children's documents, so each
//! sharded child in it is rewritten the same way. Key order and pretty-printing are kept.

use super::error::Unsupported;
use serde_json::{Map, Value};

use super::chunk_key::ChunkKeyEncoding;
use super::sharding::{Sharding, codec_name, shape};
use super::source::{Interpretation, ShardedArrayMeta, SourceFormat};

/// Name of the metadata document of every Zarr v3 node.
pub const ZARR_JSON: &str = "zarr.json";

/// Fields of a v3 array document that a reader must understand.
const ARRAY_FIELDS: &[&str] = &[
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "dimension_names",
    "storage_transformers",
];

/// Reads one `zarr.json` and decides how the view shows it.
pub fn interpret(bytes: &[u8]) -> Interpretation {
    let doc: Doc = match serde_json::from_slice(bytes) {
        Ok(Value::Object(doc)) => doc,
        Ok(_) => return Interpretation::Refused("not a JSON object".into()),
        Err(e) => return Interpretation::Refused(format!("not JSON: {e}")),
    };
    if doc.get("zarr_format") != Some(&Value::from(3)) {
        return Interpretation::Unchanged;
    }
    let pretty = bytes.contains(&b'\n');
    match doc.get("node_type").and_then(Value::as_str) {
        Some("array") => interpret_array(&doc, pretty),
        Some("group") => match rewrite_consolidated(&doc) {
            Some(view) => Interpretation::Group { view: to_bytes(&view, pretty) },
            None => Interpretation::Unchanged,
        },
        _ => Interpretation::Unchanged,
    }
}

/// A JSON document as a map, key order kept.
type Doc = Map<String, Value>;

/// How the view shows an array document: a sharded array unsharded, an unsharded one as it is.
fn interpret_array(doc: &Doc, pretty: bool) -> Interpretation {
    match unsharded_array(doc) {
        Ok(Some((view, array))) => Interpretation::ShardedArray { view: to_bytes(&view, pretty), array },
        Err(reason) => Interpretation::Refused(reason.0),
        Ok(None) => match (doc.get("codecs").and_then(Value::as_array), geometry(doc)) {
            (Some(codecs), Ok(g)) => Interpretation::PlainArray {
                array: ShardedArrayMeta {
                    sharding: Sharding::unsharded(&g.grid_shape, codecs),
                    shape: g.shape,
                    key_encoding: g.key_encoding,
                    chunk_format: g.chunk_format,
                },
            },
            // An unsharded array whose chunks shardfs cannot find is still shown as stored.
            _ => Interpretation::Unchanged,
        },
    }
}

/// The unsharded view of an array document: `Ok(None)` when it is not sharded.
fn unsharded_array(doc: &Doc) -> Result<Option<(Doc, ShardedArrayMeta)>, Unsupported> {
    let codecs = doc.get("codecs").and_then(Value::as_array).ok_or("codecs is not a list")?;
    if !codecs.iter().any(|c| codec_name(c) == Some("sharding_indexed")) {
        return Ok(None);
    }
    unsharded_view(doc, geometry(doc)?, codecs).map(Some)
}

/// What an array document says of where its chunks are.
struct Geometry {
    shape: Vec<u64>,
    /// The chunk grid's chunk shape: shards, for a sharded array.
    grid_shape: Vec<u64>,
    key_encoding: ChunkKeyEncoding,
    chunk_format: Value,
}

fn geometry(doc: &Doc) -> Result<Geometry, Unsupported> {
    let array_shape = shape(doc.get("shape")).ok_or("shape is not a list of non-negative integers")?;
    let grid = doc.get("chunk_grid").ok_or("no chunk_grid")?;
    if grid.get("name").and_then(Value::as_str) != Some("regular") {
        return Err(format!("chunk_grid {grid} is not regular").into());
    }
    let grid_shape = shape(grid.get("configuration").and_then(|c| c.get("chunk_shape")))
        .ok_or("chunk_grid chunk_shape is not a list of integers")?;
    if grid_shape.len() != array_shape.len() || grid_shape.contains(&0) {
        return Err(format!("chunk shape {grid_shape:?} does not fit array shape {array_shape:?}").into());
    }
    match doc.get("storage_transformers") {
        None => {}
        Some(Value::Array(t)) if t.is_empty() => {}
        Some(t) => return Err(format!("storage_transformers {t} are not supported").into()),
    }
    for (key, value) in doc {
        let optional = value.get("must_understand") == Some(&Value::Bool(false));
        if !ARRAY_FIELDS.contains(&key.as_str()) && !optional {
            return Err(format!("unknown field {key:?} must be understood").into());
        }
    }
    let key_encoding = ChunkKeyEncoding::from_json(doc.get("chunk_key_encoding").ok_or("no chunk_key_encoding")?)?;
    let chunk_format = doc.get("data_type").cloned().unwrap_or_default();
    Ok(Geometry { shape: array_shape, grid_shape, key_encoding, chunk_format })
}

/// The unsharded view of a sharded array document.
fn unsharded_view(doc: &Doc, g: Geometry, codecs: &[Value]) -> Result<(Doc, ShardedArrayMeta), Unsupported> {
    let sharding = Sharding::from_codecs(&g.grid_shape, codecs)?.expect("codecs include sharding_indexed");
    let mut view = doc.clone();
    view["chunk_grid"]["configuration"]["chunk_shape"] = Value::from(sharding.chunk_shape().to_vec());
    view["codecs"] = Value::from(sharding.inner_codecs.clone());
    let array =
        ShardedArrayMeta { shape: g.shape, key_encoding: g.key_encoding, sharding, chunk_format: g.chunk_format };
    Ok((view, array))
}

/// Zarr v3 with the `sharding_indexed` codec, as a [`SourceFormat`]: `zarr.json` in every
/// node's directory, chunks (shards) below the array's.
#[derive(Debug, Clone, Copy)]
pub struct ShardingCodec;

impl SourceFormat for ShardingCodec {
    fn document_key(&self, dir: &str) -> Option<String> {
        Some(if dir.is_empty() { ZARR_JSON.to_string() } else { format!("{dir}/{ZARR_JSON}") })
    }

    fn is_document(&self, key: &str) -> bool {
        key.rsplit('/').next() == Some(ZARR_JSON)
    }

    fn array_dir(&self, key: &str) -> Option<String> {
        Some(key.rsplit_once('/').map_or("", |(dir, _)| dir).to_string())
    }

    fn interpret(&self, _key: &str, bytes: &[u8]) -> Interpretation {
        interpret(bytes)
    }

    fn reshard(&self, _key: &str, written: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unsupported> {
        reshard(written, stored)
    }

    fn documents_root(&self) -> &'static str {
        ""
    }

    fn chunks_beside_document(&self) -> bool {
        true
    }
}

/// The group document with each sharded child in its consolidated metadata rewritten, or `None`
/// when nothing changes.
fn rewrite_consolidated(doc: &Doc) -> Option<Doc> {
    let children = doc.get("consolidated_metadata")?.get("metadata")?.as_object()?;
    let mut rewritten = children.clone();
    let mut changed = false;
    for (path, child) in children {
        let Some(child_doc) = child.as_object() else { continue };
        if child_doc.get("node_type").and_then(Value::as_str) != Some("array") {
            continue;
        }
        if let Ok(Some((view, _))) = unsharded_array(child_doc) {
            rewritten[path] = Value::Object(view);
            changed = true;
        }
    }
    changed.then(|| {
        let mut view = doc.clone();
        view["consolidated_metadata"]["metadata"] = Value::Object(rewritten);
        view
    })
}

/// The document to store when `written` (a view document) replaces `stored`, the document of an
/// array stored sharded: the written fields, with the stored chunk grid and codecs. Fails when the
/// written document changes what the sharded layout fixes (chunk shape, codecs) or is no array.
pub fn reshard(written: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unsupported> {
    let doc = parse_object(written)?;
    let stored = parse_object(stored)?;
    let Some((stored_view, _)) = unsharded_array(&stored)? else {
        return Err("the stored document is not a sharded array".into());
    };
    Ok(to_bytes(&reshard_doc(&doc, &stored, &stored_view)?, written.contains(&b'\n')))
}

fn reshard_doc(doc: &Doc, stored: &Doc, stored_view: &Doc) -> Result<Doc, Unsupported> {
    if doc.get("node_type") != Some(&Value::from("array")) {
        return Err("replacing a sharded array's document with a non-array one".into());
    }
    for field in ["chunk_grid", "codecs"] {
        if doc.get(field) != stored_view.get(field) {
            return Err(format!(
                "{field} differs from the array's ({}); it cannot be stored sharded",
                stored_view[field]
            )
            .into());
        }
    }
    let mut out = doc.clone();
    out["chunk_grid"] = stored["chunk_grid"].clone();
    out["codecs"] = stored["codecs"].clone();
    match unsharded_array(&out)? {
        Some(_) => Ok(out),
        None => Err("the result is not a sharded array".into()),
    }
}

/// The document to store for a group document written through the view: each inline
/// consolidated child that is stored sharded (`stored_child` gives its stored document by path)
/// gets its stored chunk grid and codecs back. `None` when nothing needs translating.
pub fn reshard_consolidated(
    written: &[u8],
    stored_child: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, Unsupported> {
    let mut doc = parse_object(written)?;
    let Some(children) =
        doc.get_mut("consolidated_metadata").and_then(|c| c.get_mut("metadata")).and_then(Value::as_object_mut)
    else {
        return Ok(None);
    };
    let mut changed = false;
    for (path, child) in children.iter_mut() {
        let Some(child_doc) = child.as_object() else { continue };
        let Some(stored) = stored_child(path).and_then(|b| parse_object(&b).ok()) else { continue };
        let Ok(Some((stored_view, _))) = unsharded_array(&stored) else { continue };
        *child = Value::Object(reshard_doc(child_doc, &stored, &stored_view).map_err(|e| format!("{path}: {e}"))?);
        changed = true;
    }
    Ok(changed.then(|| to_bytes(&doc, written.contains(&b'\n'))))
}

/// The document that stores a new unsharded array sharded, `per_shard` inner chunks per shard
/// along each dimension (one number: every dimension), with a crc32c index at the end. `None`
/// when `written` is not an unsharded array with a regular grid.
pub fn shard_new(written: &[u8], per_shard: &[u64]) -> Result<Option<Vec<u8>>, Unsupported> {
    let mut doc = parse_object(written)?;
    let is_array =
        doc.get("node_type") == Some(&Value::from("array")) && doc.get("zarr_format") == Some(&Value::from(3));
    let Some(codecs) = doc.get("codecs").and_then(Value::as_array).cloned() else { return Ok(None) };
    let grid = doc.get("chunk_grid");
    let regular = grid.and_then(|g| g.get("name")) == Some(&Value::from("regular"));
    if !is_array || !regular || codecs.iter().any(|c| codec_name(c) == Some("sharding_indexed")) {
        return Ok(None);
    }
    let Some(chunk) = shape(grid.and_then(|g| g.get("configuration")).and_then(|c| c.get("chunk_shape"))) else {
        return Ok(None);
    };
    let factors: Vec<u64> = match per_shard {
        [k] => vec![*k; chunk.len()],
        list if list.len() == chunk.len() => list.to_vec(),
        list => return Err(format!("--shard-new has {} factors for a {}-d array", list.len(), chunk.len()).into()),
    };
    let outer: Option<Vec<u64>> = chunk.iter().zip(&factors).map(|(c, k)| c.checked_mul(*k)).collect();
    let outer = outer.ok_or("shard shape overflows")?;
    doc["chunk_grid"]["configuration"]["chunk_shape"] = Value::from(outer);
    doc.insert(
        "codecs".into(),
        serde_json::json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": chunk,
        "codecs": codecs,
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}]),
    );
    unsharded_array(&doc)?.ok_or("the result is not a sharded array")?;
    Ok(Some(to_bytes(&doc, written.contains(&b'\n'))))
}

fn parse_object(bytes: &[u8]) -> Result<Doc, Unsupported> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(doc)) => Ok(doc),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}").into()),
    }
}

fn to_bytes(doc: &Doc, pretty: bool) -> Vec<u8> {
    let result = if pretty { serde_json::to_vec_pretty(doc) } else { serde_json::to_vec(doc) };
    result.expect("a JSON map always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunk_key::KeyStyle;
    use serde_json::json;

    fn sharded_doc() -> Value {
        json!({
            "zarr_format": 3, "node_type": "array", "shape": [10, 9], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [2, 3],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 5}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}],
            "attributes": {"b": 1, "a": [1.5, "x"]},
            "dimension_names": ["y", "x"],
            "extra": {"must_understand": false, "v": 2}
        })
    }

    fn interpret_value(v: &Value) -> Interpretation {
        interpret(&serde_json::to_vec_pretty(v).unwrap())
    }

    #[test]
    fn rewrites_grid_and_codecs_only() {
        let Interpretation::ShardedArray { view, array } = interpret_value(&sharded_doc()) else { panic!() };
        let view: Value = serde_json::from_slice(&view).unwrap();
        let mut expected = sharded_doc();
        expected["chunk_grid"]["configuration"]["chunk_shape"] = json!([2, 3]);
        expected["codecs"] = sharded_doc()["codecs"][0]["configuration"]["codecs"].clone();
        assert_eq!(view, expected);
        assert_eq!(array.shape, vec![10, 9]);
        assert_eq!(array.key_encoding.style, KeyStyle::Default);
    }

    #[test]
    fn keeps_key_order_and_style() {
        let compact = serde_json::to_vec(&sharded_doc()).unwrap();
        let Interpretation::ShardedArray { view, .. } = interpret(&compact) else { panic!() };
        assert!(!view.contains(&b'\n'));
        let text = String::from_utf8(view).unwrap();
        let keys: Vec<usize> = ["zarr_format", "shape", "codecs", "attributes", "extra"]
            .iter()
            .map(|k| text.find(&format!("\"{k}\"")).unwrap())
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn shows_unsharded_arrays_as_stored_and_leaves_foreign_documents_alone() {
        let mut plain = sharded_doc();
        plain["codecs"] = json!([{"name": "bytes"}]);
        let Interpretation::PlainArray { array } = interpret_value(&plain) else { panic!("not a plain array") };
        assert!(array.sharding.levels.is_empty());
        assert_eq!(
            array.sharding.chunk_shape(),
            plain["chunk_grid"]["configuration"]["chunk_shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect::<Vec<_>>()
        );
        plain["chunk_grid"]["name"] = json!("rectilinear");
        assert_eq!(interpret_value(&plain), Interpretation::Unchanged);
        assert_eq!(interpret_value(&json!({"zarr_format": 3, "node_type": "group"})), Interpretation::Unchanged);
        assert_eq!(interpret_value(&json!({"zarr_format": 2})), Interpretation::Unchanged);
    }

    #[test]
    fn refuses_with_a_reason() {
        let refused = |edit: &dyn Fn(&mut Value)| {
            let mut doc = sharded_doc();
            edit(&mut doc);
            match interpret_value(&doc) {
                Interpretation::Refused(reason) => reason,
                other => panic!("{other:?}"),
            }
        };
        assert!(refused(&|d| d["storage_transformers"] = json!([{"name": "x"}])).contains("storage_transformers"));
        assert!(refused(&|d| d["chunk_grid"]["name"] = json!("rectilinear")).contains("regular"));
        assert!(refused(&|d| d["surprise"] = json!({"v": 1})).contains("surprise"));
        assert!(refused(&|d| d["shape"] = json!([-1, 9])).contains("shape"));
        assert!(matches!(interpret(b"{not json"), Interpretation::Refused(r) if r.starts_with("not JSON")));
    }

    fn view_of(doc: &Value) -> Vec<u8> {
        match interpret_value(doc) {
            Interpretation::ShardedArray { view, .. } => view,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_view_document_written_back_keeps_the_sharding() {
        let stored = serde_json::to_vec(&sharded_doc()).unwrap();
        let mut written: Value = serde_json::from_slice(&view_of(&sharded_doc())).unwrap();
        written["shape"] = json!([30, 9]);
        written["attributes"]["new"] = json!("yes");
        let out: Value =
            serde_json::from_slice(&reshard(&serde_json::to_vec(&written).unwrap(), &stored).unwrap()).unwrap();
        let mut expected = sharded_doc();
        expected["shape"] = json!([30, 9]);
        expected["attributes"]["new"] = json!("yes");
        assert_eq!(out, expected);
    }

    #[test]
    fn changes_the_sharding_cannot_hold_are_refused() {
        let stored = serde_json::to_vec(&sharded_doc()).unwrap();
        let view: Value = serde_json::from_slice(&view_of(&sharded_doc())).unwrap();
        let mut chunk = view.clone();
        chunk["chunk_grid"]["configuration"]["chunk_shape"] = json!([2, 2]);
        assert!(reshard(&serde_json::to_vec(&chunk).unwrap(), &stored).unwrap_err().0.contains("chunk_grid"));
        let mut codecs = view.clone();
        codecs["codecs"] = json!([{"name": "bytes"}]);
        assert!(reshard(&serde_json::to_vec(&codecs).unwrap(), &stored).unwrap_err().0.contains("codecs"));
        let mut rank = view.clone();
        rank["shape"] = json!([3]);
        assert!(reshard(&serde_json::to_vec(&rank).unwrap(), &stored).is_err());
        assert!(reshard(b"[1]", &stored).is_err());
        assert!(reshard(br#"{"zarr_format":3,"node_type":"group"}"#, &stored).is_err());
    }

    #[test]
    fn consolidated_children_written_back_keep_their_sharding() {
        let view_child: Value = serde_json::from_slice(&view_of(&sharded_doc())).unwrap();
        let written = json!({"zarr_format": 3, "node_type": "group",
            "consolidated_metadata": {"kind": "inline", "must_understand": false, "metadata": {"a": view_child, "b": {"zarr_format": 3, "node_type": "group"}}}});
        let stored_a = serde_json::to_vec(&sharded_doc()).unwrap();
        let lookup = |path: &str| (path == "a").then(|| stored_a.clone());
        let out = reshard_consolidated(&serde_json::to_vec(&written).unwrap(), &lookup).unwrap().unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["consolidated_metadata"]["metadata"]["a"], sharded_doc());
        assert_eq!(out["consolidated_metadata"]["metadata"]["b"], written["consolidated_metadata"]["metadata"]["b"]);
    }

    #[test]
    fn new_arrays_can_be_stored_sharded() {
        let view: Value = serde_json::from_slice(&view_of(&sharded_doc())).unwrap();
        let out = shard_new(&serde_json::to_vec(&view).unwrap(), &[2]).unwrap().unwrap();
        let Interpretation::ShardedArray { view: shown, array } = interpret(&out) else { panic!() };
        assert_eq!(array.sharding.shard_shape, vec![4, 6]);
        assert_eq!(serde_json::from_slice::<Value>(&shown).unwrap(), view, "the view shows what was written");
        assert!(shard_new(br#"{"zarr_format":3,"node_type":"group"}"#, &[2]).unwrap().is_none());
        assert!(shard_new(&serde_json::to_vec(&sharded_doc()).unwrap(), &[2]).unwrap().is_none());
        assert!(shard_new(&serde_json::to_vec(&view).unwrap(), &[2, 3, 4]).is_err());
    }

    #[test]
    fn rewrites_consolidated_children() {
        let group = json!({"zarr_format": 3, "node_type": "group", "attributes": {},
            "consolidated_metadata": {"kind": "inline", "must_understand": false,
                "metadata": {"a": sharded_doc(), "g": {"zarr_format": 3, "node_type": "group"}}}});
        let Interpretation::Group { view } = interpret_value(&group) else { panic!() };
        let view: Value = serde_json::from_slice(&view).unwrap();
        assert_eq!(
            view["consolidated_metadata"]["metadata"]["a"]["chunk_grid"]["configuration"]["chunk_shape"],
            json!([2, 3])
        );
        assert_eq!(view["consolidated_metadata"]["metadata"]["g"], group["consolidated_metadata"]["metadata"]["g"]);
    }
}
