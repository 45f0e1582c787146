//! `shardfs check --data`: every stored inner chunk decoded with its array's codecs. The golden
//! store passes (gzip, zstd, raw, big-endian, nested); one byte flipped inside a stored chunk whose
//! shard index is intact is found by gzip's CRC and by an inner crc32c, named by shard and chunk
//! key, with exit status 1; a chunk of the wrong length is found even without a checksum, while a
//! changed byte of a raw chunk with no checksum cannot be (the report says so); and the same scan
//! runs through an object store.

mod common;

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use common::*;
use object_store::memory::InMemory;
use serde_json::json;
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex, assemble_shard};
use shardfs::inspect::{Depth, scan, scan_with};
use shardfs::progress::Silent;
use shardfs::store::bucket::{BucketStore, Caching};
use shardfs::store::{PutMode, Store};

fn check_data(store: &Path) -> (i32, String) {
    let out = check_store(store, &["--data"]);
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The byte ranges of the stored chunks of a one-level shard, by entry, read from its index.
fn stored_chunks(shard: &Path, spec: &IndexSpec) -> Vec<(u64, Range<u64>)> {
    let bytes = std::fs::read(shard).unwrap();
    let len = bytes.len() as u64;
    let range = spec.index_range(len).unwrap();
    let index = ShardIndex::decode(spec, &bytes[range.start as usize..range.end as usize], len, 0).unwrap();
    (0..index.entries()).filter_map(|e| index.chunk(e).unwrap().map(|r| (e, r))).collect()
}

fn flip(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x5a], at).unwrap();
}

#[test]
fn the_golden_store_decodes_whole() {
    let (code, out) = check_data(&golden().join("sharded"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("10 arrays checked, 0 damaged"), "{out}");
    assert!(out.contains("zp/nested: 2 shards, 20 chunks, 20 decoded and checksummed"), "{out}");
    assert!(out.contains("decoded (no checksum: a changed byte may pass)"), "zstd without checksum, raw: {out}");
    assert!(!out.contains("not checked"), "{out}");
    let report = scan_with(&shardfs::store::LocalStore::open(&golden().join("sharded")).unwrap(), Depth::Data, &Silent);
    let report = report.unwrap();
    assert!(report.arrays.iter().all(|a| a.decoded == a.chunks && a.chunks > 0), "{report:?}");
}

#[test]
fn a_byte_flipped_inside_a_gzip_chunk_is_named_by_shard_and_chunk() {
    let store = sharded_copy();
    let shard = store.path().join("zp/gzip_crc_end/c/1/0");
    // Four entries (2 x 2 inner chunks of 4 x 6 in a shard of 8 x 12), index at the end, with a crc32c.
    let spec = IndexSpec { entries: 4, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    let (entry, chunk) = stored_chunks(&shard, &spec)[0].clone();
    flip(&shard, (chunk.start + chunk.end) / 2);
    let indexes_only = check_store(store.path(), &[]).status.code().unwrap();
    assert_eq!(indexes_only, 0, "the index is intact, so check without --data sees nothing");
    let (code, out) = check_data(store.path());
    assert_eq!(code, 1, "{out}");
    // Shard (1, 0) holds chunk rows 2..4, columns 0..2; entries run in C order.
    let key = format!("zp/gzip_crc_end/c/{}/{}", 2 + entry / 2, entry % 2);
    let line = format!("{}: chunk {key} (bytes {}..{}): gzip: ", shard.display(), chunk.start, chunk.end);
    assert!(out.contains(&line), "{line} in {out}");
    assert_eq!(out.lines().filter(|l| l.contains(": chunk ")).count(), 1, "{out}");
    assert!(out.contains("DAMAGED zp/gzip_crc_end"), "{out}");
    assert!(out.contains("1 damaged"), "{out}");
}

#[test]
fn a_byte_flipped_inside_a_nested_shard_names_the_innermost_chunk() {
    let store = sharded_copy();
    let shard = store.path().join("zp/nested/c/1/0");
    // The outer level: 2 x 2 nested shards of 8 x 8 per 16 x 16 shard; the first stored one
    // starts with its own first inner chunk (its index is at its end).
    let spec = IndexSpec { entries: 4, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    let (_, nested) = stored_chunks(&shard, &spec)[0].clone();
    flip(&shard, nested.start + 12);
    let (code, out) = check_data(store.path());
    assert_eq!(code, 1, "{out}");
    let problems: Vec<_> = out.lines().filter(|l| l.contains(": chunk zp/nested/c/")).collect();
    assert_eq!(problems.len(), 1, "{out}");
    assert!(problems[0].contains(&format!("{}: chunk zp/nested/c/", shard.display())), "{out}");
}

/// A store with one uint8 array of 8 elements, shards of 4 and inner chunks of 2 stored with
/// `inner` codecs, its shards' inner chunks as given.
fn one_array_store(inner: serde_json::Value, shards: &[(&str, Vec<Option<Vec<u8>>>)]) -> TempDir {
    let dir = TempDir::new("checkdata");
    let doc = json!({"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]});
    std::fs::write(dir.path().join("zarr.json"), r#"{"zarr_format": 3, "node_type": "group"}"#).unwrap();
    std::fs::create_dir_all(dir.path().join("a/c")).unwrap();
    std::fs::write(dir.path().join("a/zarr.json"), doc.to_string()).unwrap();
    let spec = IndexSpec { entries: 2, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    for (key, chunks) in shards {
        std::fs::write(dir.path().join("a").join(key), assemble_shard(&spec, chunks)).unwrap();
    }
    dir
}

fn with_crc(data: &[u8]) -> Vec<u8> {
    [data, &crc32c::crc32c(data).to_le_bytes()].concat()
}

#[test]
fn an_inner_crc32c_finds_a_flipped_byte() {
    let inner = json!([{"name": "bytes"}, {"name": "crc32c"}]);
    let chunks = vec![Some(with_crc(&[1, 2])), Some(with_crc(&[3, 4]))];
    let store = one_array_store(inner, &[("c/0", chunks.clone()), ("c/1", chunks)]);
    let (code, out) = check_data(store.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok      a: 2 shards, 4 chunks, 4 decoded and checksummed"), "{out}");
    // The second chunk of shard c/1 (chunk 3) starts after the 6 bytes of the first.
    let shard = store.path().join("a/c/1");
    flip(&shard, 7);
    let (code, out) = check_data(store.path());
    assert_eq!(code, 1, "{out}");
    let line = format!("{}: chunk a/c/3 (bytes 6..12): crc32c mismatch (stored ", shard.display());
    assert!(out.contains(&line), "{line} in {out}");
}

#[test]
fn raw_chunks_without_a_checksum_are_checked_for_length_only() {
    let inner = json!([{"name": "bytes"}]);
    let store = one_array_store(
        inner,
        &[("c/0", vec![Some(vec![1, 2]), Some(vec![3])]), ("c/1", vec![None, Some(vec![5, 6])])],
    );
    let (code, out) = check_data(store.path());
    assert_eq!(code, 1, "{out}");
    let line =
        format!("{}: chunk a/c/1 (bytes 2..3): decodes to 1 bytes, 2 expected", store.path().join("a/c/0").display());
    assert!(out.contains(&line), "{line} in {out}");
    assert!(out.contains("3 decoded (no checksum: a changed byte may pass)"), "{out}");
    // A changed byte of a raw chunk is a valid value as far as any reader can tell.
    flip(&store.path().join("a/c/1"), 0);
    let (_, after) = check_data(store.path());
    assert_eq!(after.lines().filter(|l| l.contains(": chunk ")).count(), 1, "{after}");
}

#[test]
fn codecs_it_cannot_decode_are_noted_and_not_failed() {
    let inner = json!([{"name": "bytes"}, {"name": "numcodecs.lzma"}]);
    let store = one_array_store(inner, &[("c/0", vec![Some(vec![1, 2, 3]), None])]);
    let (code, out) = check_data(store.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("note: chunk data not checked: codec \"numcodecs.lzma\" is not one shardfs decodes"), "{out}");
}

#[test]
fn an_object_store_is_decoded_through_the_store_trait() {
    let objects = Arc::new(InMemory::new());
    let bucket = || BucketStore::new(objects.clone(), "data", "memory://bucket/data", Caching::default()).unwrap();
    let source = golden().join("sharded");
    let store = bucket();
    for entry in walk_files(&source) {
        let key = entry.strip_prefix(&source).unwrap().to_str().unwrap().to_string();
        store.put(&key, &[&std::fs::read(&entry).unwrap()], PutMode::Overwrite).unwrap();
    }
    let report = scan_with(&store, Depth::Data, &Silent).unwrap();
    assert!(report.healthy(), "{report:?}");
    let key = "zp/gzip_crc_end/c/0/1";
    let mut bytes = std::fs::read(source.join(key)).unwrap();
    bytes[20] ^= 0x5a;
    store.put(key, &[&bytes], PutMode::Overwrite).unwrap();
    let fresh = bucket();
    assert!(scan(&fresh).unwrap().healthy(), "the index is intact");
    let report = scan_with(&fresh, Depth::Data, &Silent).unwrap();
    let problems: Vec<_> = report.arrays.iter().flat_map(|a| &a.problems).collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with(&format!("{}: chunk zp/gzip_crc_end/c/", fresh.describe(key))), "{problems:?}");
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk_files(&path)) } else { out.push(path) }
    }
    out
}
