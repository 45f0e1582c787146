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
    let fs = fs_of(&golden_draft().join("sharded"));
    let (view, view_dirs) = walk_view(&fs);
    let (twin, twin_dirs) = walk_dir(&golden_draft().join("unsharded"));
    assert_same_tree(&view, &twin);
    let holds_files = |d: &String| twin.keys().any(|f| f.starts_with(&format!("{d}/")));
    assert_eq!(view_dirs, twin_dirs.into_iter().filter(holds_files).collect::<Vec<_>>());
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
