//! What field clients do through a real writable mount, as zarr-python's LocalStore does it:
//! a directory renamed after the kernel cached the tree below it (`LocalStore.move`), files and
//! directories renamed again and again, link(2) for exclusive creates (`set_if_not_exists`), a
//! refused document write that must leave the store exactly as it was, names unlinked and made
//! again while a reader holds the old file, and writes far past any sane size.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use common::*;
use shardfs::fuse::{self, MountSettings};
use shardfs::write::pending::Policy;

fn writable() -> MountSettings {
    MountSettings { options: Vec::new(), threads: 4, read_only: false, io_uring: false }
}

fn policy() -> Policy {
    Policy { shard_bytes: usize::MAX, idle: Duration::from_secs(3600), ..Policy::default() }
}

/// Writes `bytes` to a new file at `path` and closes it, with the error of close(2), which
/// `std::fs::File` ignores: a document written through the view is stored at close.
fn write_and_close(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::IntoRawFd;
    let mut file = fs::File::create(path)?;
    file.write_all(bytes)?;
    // SAFETY: a descriptor taken from the file, closed once.
    if unsafe { libc::close(file.into_raw_fd()) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Every file below `dir`, read, so that the kernel holds every name and page.
fn read_tree(dir: &Path) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { read_tree(&path) } else { drop(fs::read(&path).unwrap()) }
    }
}

#[test]
fn a_renamed_directory_keeps_every_name_below_it() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let m = mnt.path();
    fs::create_dir_all(m.join("origin/c/0")).unwrap();
    fs::write(m.join("origin/c/0/0"), b"hello").unwrap();
    fs::write(m.join("origin/other.txt"), b"other").unwrap();
    // A sharded array moved with pending writes and chunks the kernel holds.
    let chunk = "c/2/1";
    let array = m.join("zp/gzip_crc_end");
    let before = fs::read(array.join(chunk)).unwrap();
    fs::create_dir_all(array.join("c/0")).unwrap();
    fs::write(array.join("c/0/0"), b"pending").unwrap();
    read_tree(&m.join("origin"));
    read_tree(&array);
    fs::rename(m.join("origin"), m.join("dest")).unwrap();
    fs::rename(&array, m.join("zp/moved")).unwrap();
    assert_eq!(fs::read(m.join("dest/other.txt")).unwrap(), b"other");
    assert_eq!(fs::read(m.join("dest/c/0/0")).unwrap(), b"hello");
    assert!(!m.join("origin").exists());
    assert_eq!(fs::read(m.join("zp/moved").join(chunk)).unwrap(), before);
    assert_eq!(fs::read(m.join("zp/moved/c/0/0")).unwrap(), b"pending");
    mounted.unmount().unwrap();
    assert_eq!(fs::read(store.path().join("dest/c/0/0")).unwrap(), b"hello");
    let fresh = fs_of(store.path());
    assert_eq!(read_path(&fresh, "zp/moved/c/0/0").unwrap(), b"pending", "committed before the move");
    assert_eq!(read_path(&fresh, &format!("zp/moved/{chunk}")).unwrap(), before);
    assert!(!store.path().join("zp/gzip_crc_end").exists());
}

#[test]
fn link_gives_a_new_name_and_refuses_an_existing_one() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let m = mnt.path();
    // A plain file: a real second name in a local store.
    fs::write(m.join("tmp.partial"), b"plain").unwrap();
    fs::hard_link(m.join("tmp.partial"), m.join("plain")).unwrap();
    fs::remove_file(m.join("tmp.partial")).unwrap();
    assert_eq!(fs::read(m.join("plain")).unwrap(), b"plain");
    let err = fs::hard_link(m.join("plain"), m.join("zarr.json")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    // A temporary file linked onto a chunk key, as set_if_not_exists writes one.
    let array = m.join("zp/raw_nocrc");
    fs::write(array.join("chunk.partial"), b"linked chunk").unwrap();
    let err = fs::hard_link(array.join("chunk.partial"), array.join("c/3")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "c/3 is stored");
    fs::remove_file(array.join("c/3")).unwrap();
    fs::hard_link(array.join("chunk.partial"), array.join("c/3")).unwrap();
    fs::remove_file(array.join("chunk.partial")).unwrap();
    assert_eq!(fs::read(array.join("c/3")).unwrap(), b"linked chunk");
    // A chunk linked to a plain name: a copy.
    fs::hard_link(array.join("c/3"), m.join("copy")).unwrap();
    assert_eq!(fs::read(m.join("copy")).unwrap(), b"linked chunk");
    mounted.unmount().unwrap();
    assert_eq!(read_path(&fs_of(store.path()), "zp/raw_nocrc/c/3").unwrap(), b"linked chunk");
    assert!(!store.path().join("zp/raw_nocrc/chunk.partial").exists());
    assert_eq!(fs::read(store.path().join("plain")).unwrap(), b"plain");
}

#[test]
fn a_refused_document_write_leaves_the_store_as_it_was() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let m = mnt.path();
    let stored = fs::read(store.path().join("zp/raw_nocrc/zarr.json")).unwrap();
    // Created, written in place, and renamed onto: each refused, each leaving what was stored.
    fs::create_dir(m.join("new")).unwrap();
    let err = write_and_close(&m.join("new/zarr.json"), b"not json").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    let err = write_and_close(&m.join("zp/raw_nocrc/zarr.json"), b"not json").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    fs::write(m.join("zp/raw_nocrc/zarr.json.partial"), b"not json").unwrap();
    let err = fs::rename(m.join("zp/raw_nocrc/zarr.json.partial"), m.join("zp/raw_nocrc/zarr.json")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    mounted.unmount().unwrap();
    assert!(!store.path().join("new/zarr.json").exists(), "no empty document left behind");
    assert_eq!(fs::read(store.path().join("zp/raw_nocrc/zarr.json")).unwrap(), stored);
    let out = check_store(store.path(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn files_and_directories_renamed_again_keep_their_content() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let m = mnt.path();
    fs::write(m.join("tmp1"), b"hello").unwrap();
    fs::rename(m.join("tmp1"), m.join("f")).unwrap();
    fs::rename(m.join("f"), m.join("g")).unwrap();
    fs::rename(m.join("g"), m.join("h")).unwrap();
    assert_eq!(fs::read(m.join("h")).unwrap(), b"hello");
    fs::create_dir(m.join("d1")).unwrap();
    fs::write(m.join("d1/f"), b"below").unwrap();
    fs::rename(m.join("d1"), m.join("d2")).unwrap();
    fs::rename(m.join("d2"), m.join("d3")).unwrap();
    assert_eq!(fs::read(m.join("d3/f")).unwrap(), b"below");
    // An atomic writer's chunk, moved twice: zarr-python then reads it, never the fill value.
    let array = m.join("zp/raw_nocrc");
    fs::write(array.join("c/tmp.partial"), b"chunk").unwrap();
    fs::rename(array.join("c/tmp.partial"), array.join("c/2")).unwrap();
    fs::rename(array.join("c/2"), array.join("c/3")).unwrap();
    assert_eq!(fs::read(array.join("c/3")).unwrap(), b"chunk");
    mounted.unmount().unwrap();
    assert_eq!(fs::read(store.path().join("h")).unwrap(), b"hello");
    assert_eq!(read_path(&fs_of(store.path()), "zp/raw_nocrc/c/3").unwrap(), b"chunk");
}

#[test]
fn a_name_made_again_is_another_file_for_a_reader_of_the_old_one() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let chunk = mnt.path().join("zp/raw_nocrc/c/4");
    let old = fs::read(&chunk).unwrap();
    assert!(old.len() > 1);
    let reader = fs::File::open(&chunk).unwrap();
    fs::remove_file(&chunk).unwrap();
    fs::write(&chunk, b"x").unwrap();
    assert_ne!(fs::metadata(&chunk).unwrap().ino(), reader.metadata().unwrap().ino());
    let mut buf = vec![0; old.len()];
    reader.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, old, "the reader still reads the file it opened, whole");
    assert_eq!(fs::read(&chunk).unwrap(), b"x");
    drop(reader);
    mounted.unmount().unwrap();
}

#[test]
fn a_chunk_written_after_a_reader_looked_it_up_is_read_back() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let array = mnt.path().join("zp/raw_nocrc");
    let reader = fs::File::open(array.join("c/4")).unwrap();
    // Another chunk of the shard committed: the shard's version changes under c/4's inode.
    fs::write(array.join("c/3"), b"first").unwrap();
    fs::File::open(array.join("c/3")).unwrap().sync_all().unwrap();
    let stored = fs::read(array.join("c/4")).unwrap();
    // Written in place, not truncated: the write stays pending, a chunk of no store version.
    let mut writer = fs::OpenOptions::new().read(true).write(true).open(array.join("c/4")).unwrap();
    std::io::Write::write_all(&mut writer, b"BBB").unwrap();
    drop(writer);
    assert!(fs::read_dir(array.join("c")).unwrap().count() > 0);
    let mut want = b"BBB".to_vec();
    want.extend_from_slice(&stored[3..]);
    assert_eq!(fs::read(array.join("c/4")).unwrap(), want);
    drop(reader);
    mounted.unmount().unwrap();
}

#[test]
fn a_write_far_past_any_file_size_is_refused_and_the_mount_serves_on() {
    use std::os::unix::fs::FileExt;
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let chunk = mnt.path().join("zp/raw_nocrc/c/4");
    let before = fs::read(&chunk).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&chunk).unwrap();
    let err = file.write_at(b"x", 1 << 40).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG));
    let err = file.set_len(1 << 40).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG));
    drop(file);
    assert_eq!(fs::read(&chunk).unwrap(), before);
    mounted.unmount().unwrap();
}

#[test]
fn link_into_a_chunk_directory_makes_what_it_needs_and_names_its_refusals() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let mounted = fuse::mount(writable_fs(store.path(), policy()), mnt.path(), &writable()).unwrap();
    let m = mnt.path();
    fs::write(m.join("plain"), b"plain").unwrap();
    let array = m.join("zp/raw_nocrc");
    fs::hard_link(m.join("plain"), array.join("c/foo")).unwrap();
    assert_eq!(fs::read(array.join("c/foo")).unwrap(), b"plain");
    mounted.unmount().unwrap();
}
