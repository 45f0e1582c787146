//! The draft storage-transformer layout (zarr-python 2.16.1 experimental v3 sharding): the view
//! of tests/data/golden_draft/sharded equals the same arrays written unsharded, byte for byte,
//! with each `.array.json` losing only its sharding transformer.

mod common;

use common::*;

fn golden_draft() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_draft")
}

#[test]
fn draft_view_equals_the_unsharded_twin() {
    assert_view_equals_twin(&golden_draft());
}

#[test]
fn the_zarr_v2_view_refuses_the_draft_layout_with_the_reason() {
    let store = std::sync::Arc::new(shardfs::store::local::LocalStore::open(&golden_draft().join("sharded")).unwrap());
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let presentation = std::sync::Arc::new(shardfs::view::presentation::ZarrV2);
    let Err(err) = shardfs::mount::filesystem_showing(store, presentation, cache, None) else { panic!("not refused") };
    assert!(err.contains("golden_draft/sharded") && err.contains("draft layout"), "{err}");
}

#[test]
fn draft_shards_are_checked_and_counted() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardfs"))
        .arg("check")
        .arg(golden_draft().join("sharded"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("5 arrays checked, 0 damaged"), "{text}");
}

#[test]
fn draft_writes_append_without_checksum_and_compact() {
    let store = TempDir::new("draft");
    copy_tree(&golden_draft().join("sharded"), store.path());
    let policy = shardfs::write::pending::Policy {
        shard_bytes: usize::MAX,
        idle: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    let fs = writable_fs(store.path(), policy);
    let mut ino = shardfs::fs::ROOT_INO;
    for name in ["data", "root", "g1", "arr", "c3"] {
        ino = fs.lookup(ino, name).unwrap().0;
    }
    let chunk = fs.lookup(ino, "4").unwrap().0;
    let fh = fs.open(chunk, shardfs::fs::OpenMode { write: true, truncate: true, append: false }).unwrap();
    fs.write(fh, 0, b"new chunk").unwrap();
    fs.release(fh);
    let shard = store.path().join("data/root/g1/arr/c1/1");
    let before = std::fs::metadata(&shard).unwrap().len();
    fs.commit_all().unwrap();
    // g1/arr: 2x3 chunks per shard, so one append is 9 chunk bytes and a 6-entry index, no crc.
    assert_eq!(std::fs::metadata(&shard).unwrap().len(), before + 9 + 6 * 16);
    assert_eq!(read_all(&fs, chunk), b"new chunk");
    let bin = env!("CARGO_BIN_EXE_shardfs");
    let out = std::process::Command::new(bin).arg("compact").arg(store.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 rewritten"), "{out:?}");
    let out = std::process::Command::new(bin).arg("info").arg(store.path()).output().unwrap();
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(info.lines().any(|l| l.starts_with("data/root/g1/arr ")), "{info}");
    let (view, _) = walk_view(&fs_of(store.path()));
    assert_eq!(view["data/root/g1/arr/c3/4"], b"new chunk");
    let out = std::process::Command::new(bin).arg("check").arg(store.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
