//! 0-d sharded arrays (which zarr-python 3.1 cannot write): their one chunk is the file `c`
//! (default keys) or `0` (v2 keys), written here with the format layer's own shard assembler.

mod common;

use common::*;
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, assemble_shard};
use shardfs::fs::ROOT_INO;

fn write_scalar(store: &std::path::Path, name: &str, key_encoding: serde_json::Value, key: &str) {
    let dir = store.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [], "data_type": "int16", "fill_value": 0,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": []}},
        "chunk_key_encoding": key_encoding,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]
    });
    std::fs::write(dir.join("zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    let spec = IndexSpec { entries: 1, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    std::fs::write(dir.join(key), assemble_shard(&spec, &[Some(7i16.to_le_bytes().to_vec())])).unwrap();
}

#[test]
fn a_scalar_array_shows_its_one_chunk() {
    let store = TempDir::new("scalar");
    std::fs::write(store.path().join("zarr.json"), br#"{"zarr_format":3,"node_type":"group"}"#).unwrap();
    write_scalar(store.path(), "default", serde_json::json!({"name": "default"}), "c");
    write_scalar(store.path(), "v2", serde_json::json!({"name": "v2"}), "0");
    let fs = fs_of(store.path());
    let (view, dirs) = walk_view(&fs);
    assert_eq!(view["default/c"], 7i16.to_le_bytes());
    assert_eq!(view["v2/0"], 7i16.to_le_bytes());
    assert_eq!(dirs, ["default", "v2"]);
    let (array, _) = fs.lookup(ROOT_INO, "default").unwrap();
    assert!(fs.lookup(array, "c").is_ok());
}
