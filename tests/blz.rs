//! BLZ data (tests/data/blz: Bloscpack files written by bloscpack 0.16.0, a carray and a ctable
//! written by bcolz-zipline, made by tests/data/generate_blz.py) shown as Zarr v3 arrays: every
//! array's document and every chunk, decoded, against the values the writer was given; chunk
//! files that are the stored blosc buffers; damaged files costing exactly what they touch;
//! refused arrays left out; and a real mount, read-only whatever is asked.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;
use shardfs::format::blz::blosc;
use shardfs::fs::Error;

fn blz() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blz")
}

fn store_copy() -> TempDir {
    let dir = TempDir::new("blz");
    copy_tree(&blz().join("store"), dir.path());
    dir
}

fn expected() -> BTreeMap<String, Value> {
    serde_json::from_slice(&std::fs::read(blz().join("expected/arrays.json")).unwrap()).unwrap()
}

/// The raw C-order data of a `.npy` file written by numpy (format 1.0 or 2.0).
fn npy(path: &str) -> Vec<u8> {
    let bytes = std::fs::read(blz().join("expected").join(format!("{}.npy", path.replace('/', "__")))).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let start = match bytes[6] {
        1 => 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize,
        _ => 12 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
    };
    bytes[start..].to_vec()
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// The chunk keys of a `rows`-chunked array of rank `rank`.
fn chunk_key(i: u64, rank: usize) -> String {
    let mut key = format!("c/{i}");
    for _ in 1..rank {
        key.push_str("/0");
    }
    key
}

#[test]
fn every_array_reads_exactly_through_the_view() {
    let fs = fs_of(&blz().join("store"));
    let (files, _) = walk_view(&fs);
    assert!(files.keys().all(|k| !k.ends_with(".blp") && !k.contains("/meta/") && !k.contains("__")), "{files:?}");
    for (path, want) in expected() {
        let doc = json(&files[&format!("{path}/zarr.json")]);
        assert_eq!(doc["node_type"], "array", "{path}");
        assert_eq!(doc["shape"], want["shape"], "{path}");
        assert_eq!(doc["chunk_grid"]["configuration"]["chunk_shape"], want["chunks"], "{path}");
        assert_eq!(doc["attributes"], want["attributes"], "{path}");
        assert_eq!(doc["fill_value"].as_f64(), want["fill_value"].as_f64(), "{path}");
        assert_eq!(doc["codecs"][1]["name"], "blosc", "{path}");
        let rank = want["shape"].as_array().unwrap().len();
        let rows = want["shape"][0].as_u64().unwrap();
        let chunk_rows = want["chunks"][0].as_u64().unwrap();
        let data = npy(&path);
        let row_bytes = data.len() as u64 / rows;
        let mut decoded = Vec::new();
        for i in 0..rows.div_ceil(chunk_rows) {
            let chunk = &files[&format!("{path}/{}", chunk_key(i, rank))];
            let header = blosc::Header::parse(chunk).unwrap();
            assert_eq!(header.ctbytes as usize, chunk.len(), "{path}: chunk {i} is exactly its blosc buffer");
            assert_eq!(header.nbytes as u64, chunk_rows * row_bytes, "{path}: chunk {i} is a full chunk");
            decoded.extend(blosc::decompress(chunk, header.nbytes as usize).unwrap());
        }
        let (values, padding) = decoded.split_at(data.len());
        assert!(values == data.as_slice(), "{path}: values differ");
        let fill = want["fill_value"].as_f64().unwrap();
        let item = want["dtype"].as_str().unwrap()[2..].parse::<usize>().unwrap();
        for pad in padding.chunks(item) {
            let value = match (want["dtype"].as_str().unwrap(), pad.len()) {
                ("<f8", 8) => f64::from_le_bytes(pad.try_into().unwrap()),
                _ => pad.iter().map(|b| *b as f64).sum(),
            };
            assert_eq!(value, fill, "{path}: the short last chunk is padded with the fill value");
        }
        assert!(!files.contains_key(&format!("{path}/{}", chunk_key(rows.div_ceil(chunk_rows), rank))), "{path}");
    }
    let groups: BTreeMap<String, Value> =
        serde_json::from_slice(&std::fs::read(blz().join("expected/groups.json")).unwrap()).unwrap();
    for (group, attributes) in groups {
        let doc = json(&files[&if group.is_empty() { "zarr.json".to_string() } else { format!("{group}/zarr.json") }]);
        assert_eq!((doc["node_type"].as_str(), &doc["attributes"]), (Some("group"), &attributes), "{group}");
    }
}

#[test]
fn chunk_files_are_the_stored_blosc_buffers() {
    let fs = fs_of(&blz().join("store"));
    // A Bloscpack file: every chunk but a short last one is a byte range of the file.
    let file = std::fs::read(blz().join("store/ints.blp")).unwrap();
    for i in 0..10 {
        let chunk = read_path(&fs, &format!("ints/c/{i}")).unwrap();
        assert!(file.windows(chunk.len()).any(|w| w == chunk), "ints/c/{i}");
    }
    // A carray: chunk i is data/__i.blp after its 16-byte header; the short last one is memcpyed.
    for i in 0..10 {
        let stored = std::fs::read(blz().join(format!("store/prices/data/__{i}.blp"))).unwrap();
        assert_eq!(read_path(&fs, &format!("prices/c/{i}/0")).unwrap(), stored[16..], "prices/c/{i}/0");
    }
    let last = read_path(&fs, "prices/c/10/0").unwrap();
    assert_eq!((last[2], last.len()), (0x02, 16 + 100 * 2 * 8));
}

/// Asserts that reading view file `path` fails with an I/O error whose message names `file`.
fn assert_eio(fs: &shardfs::fs::ShardFs, path: &str, file: &str) {
    match read_path(fs, path) {
        Err(e @ (Error::Damaged(_) | Error::Store(_))) => {
            assert!(e.to_string().contains(file), "{path}: {e} does not name {file}")
        }
        other => panic!("{path}: expected EIO, got {:?}", other.map(|b| b.len())),
    }
}

#[test]
fn damaged_files_cost_what_they_touch() {
    let store = store_copy();
    let at = |p: &str| store.path().join(p);
    // ints.blp (offsets, adler32): a flipped byte in chunk 3's data fails its checksum.
    let bytes = std::fs::read(at("ints.blp")).unwrap();
    let fs = fs_of(store.path());
    let chunk3 = read_path(&fs, "ints/c/3").unwrap();
    let start = bytes.windows(chunk3.len()).position(|w| w == chunk3).unwrap();
    drop(fs);
    patch(&at("ints.blp"), start as i64 + 40, &[bytes[start + 40] ^ 0xff]);
    // ints_short.blp (no offsets, sha256): cut in the middle; the chunks from the cut on are lost.
    let len = std::fs::metadata(at("ints_short.blp")).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(at("ints_short.blp")).unwrap().set_len(len / 2).unwrap();
    // grid.blp (offsets): chunk 2's offset points past the end.
    let header = std::fs::read(at("grid.blp")).unwrap();
    let meta_len = 32 + u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize + 4;
    patch(&at("grid.blp"), (32 + meta_len + 2 * 8) as i64, &1_000_000i64.to_le_bytes());
    // bytes16.blp: no magic.
    patch(&at("bytes16.blp"), 0, b"xxxx");
    // prices: a chunk file gone; nested/counts: a chunk file header damaged; bars/open: its last
    // (short) chunk truncated.
    std::fs::remove_file(at("prices/data/__4.blp")).unwrap();
    patch(&at("nested/counts/data/__1.blp"), 0, b"junk");
    let last = at("bars/open/data/__12.blp");
    std::fs::OpenOptions::new().write(true).open(&last).unwrap().set_len(40).unwrap();

    let fs = fs_of(store.path());
    assert_eio(&fs, "ints/c/3", "ints.blp");
    assert!(read_path(&fs, "ints/c/2").is_ok() && read_path(&fs, "ints/c/4").is_ok());
    assert!(read_path(&fs, "ints_short/c/0").is_ok());
    assert_eio(&fs, "ints_short/c/10", "ints_short.blp");
    assert_eio(&fs, "ints_short/c/6", "ints_short.blp");
    assert_eio(&fs, "grid/c/2/0", "grid.blp");
    assert!(read_path(&fs, "grid/c/1/0").is_ok() && read_path(&fs, "grid/c/5/0").is_ok());
    assert_eio(&fs, "bytes16/zarr.json", "bytes16");
    assert_eio(&fs, "prices/c/4/0", "__4.blp");
    assert!(read_path(&fs, "prices/c/3/0").is_ok() && read_path(&fs, "prices/c/10/0").is_ok());
    assert_eio(&fs, "nested/counts/c/1", "__1.blp");
    assert!(read_path(&fs, "nested/counts/c/0").is_ok());
    assert_eio(&fs, "bars/open/c/12", "__12.blp");
    assert!(read_path(&fs, "bars/open/c/11").is_ok() && read_path(&fs, "bars/close/c/12").is_ok());
    assert!(read_path(&fs, "nested/raw/zarr.json").is_ok());
}

#[test]
fn refused_arrays_are_not_shown() {
    let store = store_copy();
    let at = |p: &str| store.path().join(p);
    // Non-uniform chunks (chunk size -1).
    patch(&at("ints.blp"), 8, &(-1i32).to_le_bytes());
    // The header counts disagree with the numpy metadata, as after an append.
    patch(&at("grid.blp"), 16, &7i64.to_le_bytes());
    // Object and structured dtypes.
    let storage = |dtype: &str| {
        format!(
            r#"{{"dtype": {dtype}, "cparams": {{"clevel": 5, "shuffle": 1, "cname": "lz4"}}, "chunklen": 100, "dflt": 0}}"#
        )
    };
    std::fs::write(at("prices/meta/storage"), storage("\"object\"")).unwrap();
    std::fs::write(at("nested/counts/meta/storage"), storage(r#"[["a", "<i4"], ["b", "<f8"]]"#)).unwrap();
    let fs = fs_of(store.path());
    let root: Vec<String> = shardfs_names(&fs, "");
    assert_eq!(root, ["bars", "bytes16", "ints_short", "nested", "zarr.json"]);
    assert_eq!(shardfs_names(&fs, "nested"), ["deeper", "raw", "zarr.json"]);
    assert!(matches!(lookup(&fs, "ints"), Err(Error::NotFound)));
    assert!(matches!(lookup(&fs, "ints.blp"), Err(Error::NotFound)));
}

fn shardfs_names(fs: &shardfs::fs::ShardFs, path: &str) -> Vec<String> {
    let ino = if path.is_empty() { shardfs::fs::ROOT_INO } else { lookup(fs, path).unwrap() };
    let dir = ino;
    let mut names = Vec::new();
    fs.readdir(dir, 2, |e, _| {
        names.push(e.name.clone());
        false
    })
    .unwrap();
    names.sort();
    names
}

#[test]
fn mounted_read_only_whatever_is_asked() {
    let Some(mnt) = mount_point() else { return };
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let out = Command::new(BIN).arg("mount").arg(blz().join("store")).arg(mnt.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view = mnt.path();
    let fs = fs_of(&blz().join("store"));
    let (files, _) = walk_view(&fs);
    let (mounted, _) = walk_dir(view);
    assert_same_tree(&mounted, &files);
    let refused = std::fs::write(view.join("new"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    let refused = std::fs::write(view.join("ints/c/0"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    let out = Command::new(BIN).arg("unmount").arg(view).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(view));
}

#[test]
fn a_carray_or_ctable_can_be_the_root() {
    let fs = fs_of(&blz().join("store/prices"));
    let (files, _) = walk_view(&fs);
    assert_eq!(json(&files["zarr.json"])["shape"], serde_json::json!([1050, 2]));
    assert_eq!(files.keys().filter(|k| k.starts_with("c/")).count(), 11);
    let fs = fs_of(&blz().join("store/bars"));
    let (files, _) = walk_view(&fs);
    assert_eq!(json(&files["zarr.json"])["attributes"]["last_row"], serde_json::json!({"1": 776}));
    assert_eq!(files.keys().filter(|k| k.ends_with("/zarr.json")).count(), 7);
}

#[test]
fn reference_files_of_blz_data_are_refused() {
    let out = Command::new(BIN).arg("refs").arg(blz().join("store")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("BLZ data cannot be referenced") && stderr.lines().count() == 1, "{stderr}");
}

#[test]
fn a_directory_without_blz_data_or_zarr_json_is_refused() {
    let dir = TempDir::new("plain");
    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    let error = shardfs::mount::open_store(dir.path()).unwrap_err();
    assert!(
        error.contains("not a Zarr v3 store (nor an Icechunk repository, BLZ data or kerchunk references)"),
        "{error}"
    );
}
