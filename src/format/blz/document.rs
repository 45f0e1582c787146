//! The `zarr.json` of a BLZ array, as a sharded Zarr v3 array (which the view then shows
//! unsharded): the inner chunks are the stored blosc chunks (codecs `bytes`, then `blosc` as their
//! headers say), an index of (offset, nbytes) pairs at the end of each shard; and of a group.

use serde_json::{Map, Value, json};

use super::dtype::Dtype;

/// The blosc settings of an array's chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blosc {
    pub cname: String,
    pub clevel: u64,
    pub shuffle: &'static str,
    pub typesize: u8,
}

/// Compression level written when the source does not record one (Bloscpack files): decoders
/// do not use it.
pub const UNKNOWN_CLEVEL: u64 = 5;

/// A BLZ array as a sharded Zarr v3 array.
#[derive(Debug, Clone)]
pub struct ArrayDoc {
    pub shape: Vec<u64>,
    pub shard_shape: Vec<u64>,
    pub chunk_shape: Vec<u64>,
    pub dtype: Dtype,
    pub fill_value: Value,
    pub blosc: Blosc,
    pub attributes: Map<String, Value>,
}

impl ArrayDoc {
    pub fn to_json(&self) -> Vec<u8> {
        let bytes = if self.dtype.size > 1 {
            json!({"name": "bytes", "configuration": {"endian": if self.dtype.big_endian { "big" } else { "little" }}})
        } else {
            json!({"name": "bytes"})
        };
        let blosc = json!({"name": "blosc", "configuration": {
            "cname": self.blosc.cname, "clevel": self.blosc.clevel, "shuffle": self.blosc.shuffle,
            "typesize": self.blosc.typesize, "blocksize": 0}});
        let doc = json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": self.shape,
            "data_type": self.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": self.shard_shape}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": self.fill_value,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": self.chunk_shape,
                "codecs": [bytes, blosc],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_location": "end"}}],
            "attributes": self.attributes,
        });
        serde_json::to_vec_pretty(&doc).expect("JSON values serialise")
    }
}

/// The `zarr.json` of a group with `attributes`.
pub fn group(attributes: Map<String, Value>) -> Vec<u8> {
    let doc = json!({"zarr_format": 3, "node_type": "group", "attributes": attributes});
    serde_json::to_vec_pretty(&doc).expect("JSON values serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::source::{Interpretation, SourceFormat};

    #[test]
    fn the_view_shows_the_stored_chunks_unsharded() {
        let doc = ArrayDoc {
            shape: vec![1037],
            shard_shape: vec![1100],
            chunk_shape: vec![100],
            dtype: Dtype::parse("<i4").unwrap(),
            fill_value: json!(0),
            blosc: Blosc { cname: "zstd".into(), clevel: 5, shuffle: "bitshuffle", typesize: 4 },
            attributes: Map::new(),
        };
        let interpretation = crate::format::metadata::ShardingCodec.interpret("a/zarr.json", &doc.to_json());
        let Interpretation::ShardedArray { view, array } = interpretation else { panic!("{interpretation:?}") };
        assert_eq!(array.sharding.levels[0].index.entries, 11);
        let view: Value = serde_json::from_slice(&view).unwrap();
        assert_eq!(view["chunk_grid"]["configuration"]["chunk_shape"], json!([100]));
        assert_eq!(view["codecs"][1]["configuration"]["shuffle"], "bitshuffle");
    }
}
