//! `shardfs refs`: the reference file of a store, resolved as fsspec's ReferenceFileSystem
//! resolves it (inline text or base64, `[url]` whole files, `[url, offset, length]` ranges), must
//! be exactly the view read through the filesystem logic: the same paths, the same bytes. The
//! golden stores in the v3 and v2 views (nested sharding, index at the start, big-endian indexes,
//! every key encoding), the draft layout, and inner chunks ending in a crc32c (v2: left out of the
//! range). What references cannot say is refused with one line and exit 1: a damaged shard, a
//! symbolic link, a store that changes during the walk.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, assemble_shard};
use shardfs::store::{LocalStore, Store};

fn refs_of(store: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN).arg("refs").arg(store).args(extra).output().unwrap()
}

/// The files the reference file names, path -> bytes, read as a reference reader reads them.
fn resolve(output: &std::process::Output, store: &Path) -> BTreeMap<String, Vec<u8>> {
    assert!(output.status.success(), "refs failed: {}", String::from_utf8_lossy(&output.stderr));
    let doc: Value = serde_json::from_slice(&output.stdout).expect("the output is JSON");
    assert_eq!(doc["version"], 1);
    let root = store.canonicalize().unwrap();
    let mut files = BTreeMap::new();
    for (path, reference) in doc["refs"].as_object().unwrap() {
        let bytes = match reference {
            Value::String(text) => match text.strip_prefix("base64:") {
                Some(_) => panic!("{path}: unexpected base64 inline"),
                None => text.as_bytes().to_vec(),
            },
            Value::Array(parts) => {
                let url = parts[0].as_str().unwrap();
                assert!(Path::new(url).starts_with(&root), "{path}: {url} is not an absolute path in the store");
                let file = std::fs::File::open(url).unwrap();
                match parts.as_slice() {
                    [_] => std::fs::read(url).unwrap(),
                    [_, offset, length] => {
                        let mut buf = vec![0; length.as_u64().unwrap() as usize];
                        file.read_exact_at(&mut buf, offset.as_u64().unwrap()).unwrap();
                        buf
                    }
                    _ => panic!("{path}: {reference}"),
                }
            }
            other => panic!("{path}: {other}"),
        };
        files.insert(path.clone(), bytes);
    }
    files
}

fn assert_refs_equal_view(store: &Path, refs: &BTreeMap<String, Vec<u8>>, fs: &shardfs::fs::ShardFs) {
    let (view, _) = walk_view(fs);
    let (only_view, only_refs): (Vec<_>, Vec<_>) = (
        view.keys().filter(|k| !refs.contains_key(*k)).collect(),
        refs.keys().filter(|k| !view.contains_key(*k)).collect(),
    );
    assert!(
        only_view.is_empty() && only_refs.is_empty(),
        "{store:?}: only in the view {only_view:?}, only in refs {only_refs:?}"
    );
    for (path, bytes) in &view {
        assert!(refs[path] == *bytes, "{store:?}: {path} differs from the view");
    }
}

#[test]
fn v3_references_are_the_v3_view() {
    let store = golden().join("sharded");
    let refs = resolve(&refs_of(&store, &[]), &store);
    assert_refs_equal_view(&store, &refs, &fs_of(&store));
    // Nested sharding: the inner chunks' ranges are absolute in the shard file.
    assert!(refs.keys().any(|k| k.starts_with("zp/nested/c/")));
}

#[test]
fn v2_references_are_the_v2_view() {
    let store = golden().join("sharded");
    let refs = resolve(&refs_of(&store, &["--zarr-format", "2"]), &store);
    assert!(refs.contains_key("zp/nested/.zarray") && !refs.keys().any(|k| k.ends_with("zarr.json")));
    assert_refs_equal_view(&store, &refs, &v2_fs(&store));
}

#[test]
fn draft_layout_references_are_its_view() {
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_draft/sharded");
    let refs = resolve(&refs_of(&store, &[]), &store);
    assert!(refs.contains_key("meta/root/g1/arr.array.json"));
    assert_refs_equal_view(&store, &refs, &fs_of(&store));
}

#[test]
fn the_v2_view_of_the_draft_layout_is_refused_as_at_mount() {
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_draft/sharded");
    let output = refs_of(&store, &["--zarr-format", "2"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.lines().count() == 1 && stderr.contains("golden_draft/sharded"), "{stderr}");
    assert!(output.stdout.is_empty());
}

fn v2_fs(store: &Path) -> shardfs::fs::ShardFs {
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let presentation = Arc::new(shardfs::view::presentation::ZarrV2);
    shardfs::mount::filesystem_showing(shardfs::mount::open_store(store).unwrap(), presentation, cache, None).unwrap()
}

/// A 2-D uint8 array of 4x4 with 2x2 inner chunks in 4x4 shards, each inner chunk ending in a
/// crc32c of its bytes; one shard, three chunks stored.
fn crc_store() -> TempDir {
    let dir = TempDir::new("refs-crc");
    std::fs::write(dir.path().join("zarr.json"), br#"{"zarr_format": 3, "node_type": "group"}"#).unwrap();
    let array = dir.path().join("a");
    std::fs::create_dir_all(array.join("c/0")).unwrap();
    let doc = json!({"zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
            "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]});
    std::fs::write(array.join("zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    let chunk = |v: u8| {
        let mut bytes = vec![v; 4];
        bytes.extend_from_slice(&crc32c::crc32c(&bytes).to_le_bytes());
        Some(bytes)
    };
    let spec = IndexSpec { entries: 4, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    std::fs::write(array.join("c/0/0"), assemble_shard(&spec, &[chunk(1), None, chunk(2), chunk(3)])).unwrap();
    dir
}

#[test]
fn crc32c_is_left_out_of_v2_ranges_and_kept_in_v3_ones() {
    let store = crc_store();
    let v2 = resolve(&refs_of(store.path(), &["--zarr-format", "2"]), store.path());
    assert_eq!(v2["a/1/1"], vec![3; 4]);
    assert_refs_equal_view(store.path(), &v2, &v2_fs(store.path()));
    let v3 = resolve(&refs_of(store.path(), &[]), store.path());
    assert_eq!(v3["a/c/1/1"].len(), 8);
    assert_refs_equal_view(store.path(), &v3, &fs_of(store.path()));
}

/// One line on stderr naming `needle`, exit status 1, and no complete JSON document on stdout.
fn assert_refused(output: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "{stderr} does not name {needle}");
    assert!(serde_json::from_slice::<Value>(&output.stdout).is_err(), "a refused run must not look complete");
}

#[test]
fn a_damaged_shard_is_refused() {
    let store = sharded_copy();
    let shard = store.path().join("zp/gzip_crc_end/c/1/0");
    let len = std::fs::metadata(&shard).unwrap().len();
    patch(&shard, len as i64 - 8, &[0xff]);
    let output = refs_of(store.path(), &[]);
    assert_refused(&output, "zp/gzip_crc_end/c/1/0");
    assert!(String::from_utf8_lossy(&output.stderr).contains("damaged"));
}

#[test]
fn a_symbolic_link_is_refused() {
    let store = sharded_copy();
    std::os::unix::fs::symlink("zarr.json", store.path().join("zp/link")).unwrap();
    assert_refused(&refs_of(store.path(), &[]), "zp/link");
}

#[test]
fn a_shard_replaced_during_the_walk_is_refused() {
    let store = sharded_copy();
    let shard = store.path().join("zp/raw_nocrc/c/1");
    let replacement = store.path().join("replacement");
    std::fs::copy(&shard, &replacement).unwrap();
    let local = LocalStore::open(store.path()).unwrap();
    // Just after the walk opens the shard (and reads its index from that version), it is renamed
    // over by a copy: the references were made from a version that is gone.
    let hooked =
        Hooked::new(local).after_opening("zp/raw_nocrc/c/1", move || std::fs::rename(&replacement, &shard).unwrap());
    let mut out = Vec::new();
    let err = shardfs::inspect::refs::refs_command(Arc::new(hooked), 3, &mut out).unwrap_err();
    assert!(err.contains("zp/raw_nocrc/c/1") && err.contains("changed while"), "{err}");
    assert!(!err.contains('\n'));
    assert!(serde_json::from_slice::<Value>(&out).is_err());
    // Untouched, the same store gives complete references.
    let mut out = Vec::new();
    let local: Arc<dyn Store> = Arc::new(LocalStore::open(store.path()).unwrap());
    shardfs::inspect::refs::refs_command(local, 3, &mut out).unwrap();
    assert!(serde_json::from_slice::<Value>(&out).is_ok());
}
