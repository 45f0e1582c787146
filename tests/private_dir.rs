//! `__shardfs/` through real mounts of the `shardfs` binary: a read-only mount never creates it;
//! after writes (chunks, an atomic-rename writer's scratch file, a plain file) and `shardfs
//! unmount` nothing of it is left; a lock slot another process holds keeps the lock file (and so
//! the directory) through another mount's unmount, and the next clean unmount removes it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use shardfs::store::{LocalStore, PRIVATE_DIR, Store};

fn shardfs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn mount(store: &Path, mnt: &Path, extra: &[&str]) {
    let out = shardfs(&[&["mount", store.to_str().unwrap(), mnt.to_str().unwrap()], extra].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn unmount(mnt: &Path) {
    let out = shardfs(&["unmount", mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(mnt));
}

#[test]
fn a_read_only_mount_never_creates_it() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    mount(store.path(), mnt.path(), &["--read-only"]);
    let (view, _) = walk_dir(mnt.path());
    assert!(view.len() > 100, "the view was read");
    assert!(std::fs::write(mnt.path().join("zp/raw_nocrc/c/0"), b"no").is_err());
    unmount(mnt.path());
    assert!(!store.path().join(PRIVATE_DIR).exists());
}

#[test]
fn a_clean_unmount_after_writes_leaves_no_trace() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    mount(store.path(), mnt.path(), &[]);
    let m = mnt.path();
    std::fs::write(m.join("zp/raw_nocrc/c/3"), [1, 2, 3, 4]).unwrap();
    // An atomic writer: a temporary file in a chunk directory (kept under __shardfs/scratch/),
    // renamed onto a chunk key.
    std::fs::write(m.join("zp/gzip_crc_end/c/1/.tmp-writer"), twin("zp/gzip_crc_end/c/1/1")).unwrap();
    std::fs::rename(m.join("zp/gzip_crc_end/c/1/.tmp-writer"), m.join("zp/gzip_crc_end/c/1/0")).unwrap();
    std::fs::write(m.join("notes.txt"), b"plain").unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(m.join("zp/raw_nocrc/c/4")).unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert!(store.path().join(PRIVATE_DIR).exists(), "the writes used it");
    unmount(m);
    assert!(!store.path().join(PRIVATE_DIR).exists(), "{:?}", list_private(store.path()));
    assert_eq!(std::fs::read(store.path().join("notes.txt")).unwrap(), b"plain");
    assert!(check_store(store.path(), &["--data"]).status.success());
    mount(store.path(), m, &["--read-only"]);
    assert_eq!(std::fs::read(m.join("zp/raw_nocrc/c/3")).unwrap(), [1, 2, 3, 4]);
    assert_eq!(std::fs::read(m.join("zp/gzip_crc_end/c/1/0")).unwrap(), twin("zp/gzip_crc_end/c/1/1"));
    unmount(m);
}

#[test]
fn a_lock_held_by_another_process_keeps_the_lock_file_through_an_unmount() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    // This test process stands for a second live mount in the middle of a commit.
    let other = LocalStore::open(store.path()).unwrap();
    let held = other.lock(7).unwrap();
    mount(store.path(), mnt.path(), &[]);
    std::fs::write(mnt.path().join("zp/raw_nocrc/c/3"), [9; 4]).unwrap();
    unmount(mnt.path());
    assert!(store.path().join(PRIVATE_DIR).join("lock").exists(), "a lock in use is never removed");
    drop(held);
    mount(store.path(), mnt.path(), &[]);
    std::fs::write(mnt.path().join("zp/raw_nocrc/c/3"), [8; 4]).unwrap();
    unmount(mnt.path());
    assert!(!store.path().join(PRIVATE_DIR).exists(), "{:?}", list_private(store.path()));
    assert!(check_store(store.path(), &[]).status.success());
}

/// What is left in the store's `__shardfs/`, for a failure message.
fn list_private(store: &Path) -> String {
    let (files, others) = walk_dir(&store.join(PRIVATE_DIR));
    format!("{:?} {others:?}", files.keys().collect::<Vec<_>>())
}
