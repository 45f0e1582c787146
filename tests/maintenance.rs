//! `shardfs check`, `info` and `compact`: healthy stores pass, every kind of damage is named,
//! unfinished commits are settled by `--repair`, the byte counts add up, and compaction frees
//! unused space without changing a byte of the view, even when stopped at any byte.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::process::Command;

use common::*;
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec};
use shardfs::inspect::scan;
use shardfs::store::LocalStore;
use shardfs::store::faulty::FaultyStore;
use shardfs::write::commit::{Changes, Outcome, commit, compact};
use shardfs::write::journal::{Recovery, recover};

fn check(store: &std::path::Path, extra: &[&str]) -> (i32, String) {
    let out = check_store(store, extra);
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// raw_nocrc: three-entry shards, little-endian, no checksum, index at the end.
fn raw_nocrc_spec() -> IndexSpec {
    IndexSpec { entries: 3, endian: Endian::Little, checksum: false, location: IndexLocation::End }
}

#[test]
fn the_golden_store_is_healthy_and_counted_right() {
    let (code, out) = check(&golden().join("sharded"), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("10 arrays checked, 0 damaged, 0 invalid documents, 0 unfinished commits"), "{out}");
    let report = scan(&LocalStore::open(&golden().join("sharded")).unwrap()).unwrap();
    let (view, _) = walk_view(&fs_of(&golden().join("sharded")));
    let array = report.arrays.iter().find(|a| a.dir == "zp/gzip_crc_end").unwrap();
    let chunks: Vec<_> =
        view.iter().filter(|(k, _)| k.starts_with("zp/gzip_crc_end/c/")).map(|(_, v)| v.len() as u64).collect();
    assert_eq!(array.chunks, chunks.len() as u64);
    assert_eq!(array.live_bytes, chunks.iter().sum::<u64>());
    assert_eq!(array.unused_bytes, 0, "zarr-python writes shards without gaps");
}

#[test]
fn damage_is_named_and_fails_the_check() {
    let store = sharded_copy();
    let crc = store.path().join("zp/gzip_crc_end/c/1/0");
    let file = std::fs::OpenOptions::new().write(true).open(&crc).unwrap();
    file.write_all_at(&[0xaa], file.metadata().unwrap().len() - 9).unwrap();
    // raw_nocrc shard c/1: point entry 1 at entry 0's bytes.
    let overlap = store.path().join("zp/raw_nocrc/c/1");
    let bytes = std::fs::read(&overlap).unwrap();
    let index_at = bytes.len() - 48;
    let entry0 = bytes[index_at..index_at + 16].to_vec();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&overlap)
        .unwrap()
        .write_all_at(&entry0, index_at as u64 + 16)
        .unwrap();
    let truncated = store.path().join("ts/zstd_crc/c/1/0");
    std::fs::OpenOptions::new().write(true).open(&truncated).unwrap().set_len(20).unwrap();
    let (code, out) = check(store.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{}: index checksum mismatch", crc.display())), "{out}");
    assert!(out.contains(&format!("{}: entries 0 and 1 overlap", overlap.display())), "{out}");
    assert!(out.contains(&format!("{}: shard is 20 bytes, too short", truncated.display())), "{out}");
    assert!(out.contains("3 damaged"), "{out}");
}

#[test]
fn repair_settles_a_torn_append() {
    let store = sharded_copy();
    let dir = LocalStore::open(store.path()).unwrap();
    let key = "zp/raw_nocrc/c/1";
    let before = std::fs::read(store.path().join(key)).unwrap();
    let changes: Changes = BTreeMap::from([(0, Some(vec![9; 4].into()))]);
    // Stop the commit after its journal record and part of the appended bytes.
    let _ = commit(&FaultyStore::crash_after(dir.clone(), 120), key, &raw_nocrc_spec(), &changes);
    assert_ne!(std::fs::read(store.path().join(key)).unwrap(), before, "the crash left a torn tail");
    let (code, out) = check(store.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("unfinished commit"), "{out}");
    let (code, out) = check(store.path(), &["--repair"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("RolledBack"), "{out}");
    assert_eq!(std::fs::read(store.path().join(key)).unwrap(), before);
}

#[test]
fn info_counts_the_space_appends_leave_unused() {
    let store = sharded_copy();
    let dir = LocalStore::open(store.path()).unwrap();
    let changes: Changes = BTreeMap::from([(0, Some(vec![7; 4].into()))]);
    commit(&dir, "zp/raw_nocrc/c/1", &raw_nocrc_spec(), &changes).unwrap();
    let report = scan(&dir).unwrap();
    let array = report.arrays.iter().find(|a| a.dir == "zp/raw_nocrc").unwrap();
    // The replaced 4-byte chunk and the old 48-byte index are now unused.
    assert_eq!(array.unused_bytes, 4 + 48);
    let out = Command::new(BIN).arg("info").arg(store.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("zp/raw_nocrc") && l.contains(" 52 ")), "{text}");
}

#[test]
fn check_of_a_missing_store_says_so() {
    let out = Command::new(BIN).args(["check", "/nonexistent/store"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/store"));
}

#[test]
fn compact_frees_unused_space_and_changes_nothing_visible() {
    let store = sharded_copy();
    let dir = LocalStore::open(store.path()).unwrap();
    let changes: Changes = BTreeMap::from([(0, Some(vec![7; 4].into())), (2, Some(vec![8; 4].into()))]);
    commit(&dir, "zp/raw_nocrc/c/1", &raw_nocrc_spec(), &changes).unwrap();
    let (before, _) = walk_view(&fs_of(store.path()));
    let out = Command::new(BIN).arg("compact").arg(store.path()).arg("zp/raw_nocrc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 rewritten, 56 bytes freed"), "{:?}", out);
    let (after, _) = walk_view(&fs_of(store.path()));
    assert_eq!(before, after);
    let report = scan(&dir).unwrap();
    assert!(report.healthy());
    assert!(report.arrays.iter().all(|a| a.unused_bytes == 0), "{:?}", report.arrays);
}

#[test]
fn compaction_stopped_at_any_byte_keeps_the_shard_readable() {
    let store = sharded_copy();
    let dir = LocalStore::open(store.path()).unwrap();
    let key = "zp/raw_nocrc/c/1";
    let changes: Changes = BTreeMap::from([(1, Some(vec![5; 4].into()))]);
    commit(&dir, key, &raw_nocrc_spec(), &changes).unwrap();
    let (expected, _) = walk_view(&fs_of(store.path()));
    let appended = std::fs::read(store.path().join(key)).unwrap();
    for k in 0.. {
        std::fs::write(store.path().join(key), &appended).unwrap();
        let result = compact(&FaultyStore::crash_after(dir.clone(), k), key, &raw_nocrc_spec());
        recover(&dir).unwrap();
        let (view, _) = walk_view(&fs_of(store.path()));
        assert_eq!(view, expected, "after a compaction stopped at byte {k}");
        if let Ok(outcome) = result {
            assert!(matches!(outcome, Outcome::Compacted { .. }), "{outcome:?}");
            assert!(k > 20, "the compaction wrote only {k} bytes");
            return;
        }
    }
}

#[test]
fn compact_of_an_unknown_array_fails() {
    let out = Command::new(BIN).arg("compact").arg(golden().join("sharded")).arg("no/such").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such: no sharded array there"));
}

#[test]
fn recovery_removes_leftover_temporary_files_of_processes_that_are_gone_only() {
    let store = sharded_copy();
    let dir = LocalStore::open(store.path()).unwrap();
    let tmp = store.path().join("__shardfs/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let leftover = tmp.join(format!("{}-0", gone.id()));
    std::fs::write(&leftover, b"half a document").unwrap();
    // A live writer's file (this very process) is a write in progress: never removed.
    let in_progress = tmp.join(format!("{}-0", std::process::id()));
    std::fs::write(&in_progress, b"being written").unwrap();
    let recovered = recover(&dir).unwrap();
    assert!(!leftover.exists(), "{recovered:?}");
    assert!(in_progress.exists());
    assert_eq!(recovered, [Recovery::Removed(leftover.display().to_string())]);
}

#[test]
fn info_for_zarr_v2_names_what_a_v2_view_leaves_out_and_why() {
    let store = sharded_copy();
    let odd = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes"}, {"name": "lz77"}]
    });
    std::fs::create_dir(store.path().join("odd")).unwrap();
    std::fs::write(store.path().join("odd/zarr.json"), odd.to_string()).unwrap();
    let out = Command::new(BIN).args(["info", "--zarr-format", "2"]).arg(store.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line =
        |array: &str| text.lines().find(|l| l.split_whitespace().next() == Some(array)).unwrap_or("").to_string();
    assert!(line("odd").contains("left out: the lz77 codec has no v2 form"), "{text}");
    assert!(line("zp/big_endian_index").contains("shown: >f8"), "{text}");
    assert!(line("zp/gzip_crc_end").contains("shown: <u2 gzip"), "{text}");
}
