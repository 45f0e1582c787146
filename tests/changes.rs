//! Arrays that change while mounted, without FUSE: entries the kernel holds (looked up before the
//! change) are served with the array's geometry as its document is now, never a copy from when
//! they were looked up; pending writes of a replaced array are refused, never committed into the
//! new array's shards; pending chunks outside a shrunk array are dropped.
//!
//! `zp/gzip_crc_end` (20 x 18 uint16, shards 8 x 12, inner chunks 4 x 6) and `ts/zstd_crc`
//! (21 x 10 uint16, shards 8 x 10, inner chunks 4 x 5) are the two geometries.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use shardfs::fs::Error;
use shardfs::fs::{Dropped, OpenMode, ShardFs};
use shardfs::fuse::CACHE_TTL;
use shardfs::inspect::scan;
use shardfs::store::LocalStore;
use shardfs::write::pending::Policy;

const TRUNCATE: OpenMode = OpenMode { write: true, truncate: true, append: false };
const ARRAY: &str = "zp/gzip_crc_end";

fn manual() -> Policy {
    Policy { shard_bytes: usize::MAX, idle: Duration::from_secs(3600), ..Policy::default() }
}

/// Sets the shape in the stored document of `array`, as another program resizing it would.
fn resize_stored(store: &Path, array: &str, shape: &[u64]) {
    let path = store.join(array).join("zarr.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    doc["shape"] = Value::from(shape.to_vec());
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// Deletes `array` and creates it again as a copy of `other`, another geometry.
fn recreate_as(store: &Path, array: &str, other: &str) {
    std::fs::remove_dir_all(store.join(array)).unwrap();
    copy_tree(&golden().join("sharded").join(other), &store.join(array));
}

fn read_chunk(fs: &ShardFs, ino: u64) -> Result<Vec<u8>, Error> {
    let fh = fs.open(ino, shardfs::fs::OpenMode::default())?;
    let read = fs.read(fh, 0, 1 << 20);
    fs.release(fh);
    read
}

#[test]
fn entries_held_across_a_grow_see_the_new_chunks() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let c = lookup(&fs, &format!("{ARRAY}/c")).unwrap();
    let last_row = lookup(&fs, &format!("{ARRAY}/c/4")).unwrap();
    assert!(matches!(fs.lookup(c, "7"), Err(Error::NotFound)), "row 7 is outside 20 rows");
    // Grown to 40 rows by another program, which writes shard (3, 0): chunk rows 6 and 7 (a copy
    // of shard (0, 0), whose row 0 is all fill value).
    resize_stored(store.path(), ARRAY, &[40, 18]);
    let shards = store.path().join(ARRAY).join("c");
    std::fs::create_dir(shards.join("3")).unwrap();
    std::fs::copy(shards.join("0/0"), shards.join("3/0")).unwrap();
    let row7 = fs.lookup(c, "7").expect("the held c/ directory takes the new geometry").0;
    let chunk = fs.lookup(row7, "1").unwrap().0;
    assert_eq!(read_chunk(&fs, chunk).unwrap(), twin(&format!("{ARRAY}/c/1/1")));
    // Row 4 was a partial edge row (rows 16..20); it is a whole row now, and its chunks stay.
    assert_eq!(read_chunk(&fs, fs.lookup(last_row, "0").unwrap().0).unwrap(), twin(&format!("{ARRAY}/c/4/0")));
}

#[test]
fn entries_held_across_a_shrink_are_gone() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let last_row = lookup(&fs, &format!("{ARRAY}/c/4")).unwrap();
    let chunk = lookup(&fs, &format!("{ARRAY}/c/4/0")).unwrap();
    resize_stored(store.path(), ARRAY, &[12, 18]);
    assert!(matches!(fs.getattr(chunk), Err(Error::NotFound)));
    assert!(matches!(read_chunk(&fs, chunk), Err(Error::NotFound)));
    assert!(matches!(fs.getattr(last_row), Err(Error::NotFound)));
    assert!(matches!(fs.lookup(last_row, "0"), Err(Error::NotFound)));
    let c = lookup(&fs, &format!("{ARRAY}/c")).unwrap();
    let rows: Vec<String> =
        list_plus(&fs, c).into_iter().map(|(e, _)| e.name).filter(|n| n != "." && n != "..").collect();
    assert_eq!(rows, ["1", "2"], "row 0 is all fill value; rows 3 and 4 are outside");
}

#[test]
fn entries_held_across_a_new_array_read_the_new_array() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let row = lookup(&fs, &format!("{ARRAY}/c/1")).unwrap();
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    assert_eq!(read_chunk(&fs, chunk).unwrap(), twin(&format!("{ARRAY}/c/1/0")));
    recreate_as(store.path(), ARRAY, "ts/zstd_crc");
    // The inode held stands for the old chunk's version: opening it is ESTALE, upon which the
    // kernel looks the name up again. The same names now mean the new array's chunks, located
    // with its geometry.
    assert!(matches!(read_chunk(&fs, chunk), Err(Error::Stale(_))));
    assert_eq!(read_chunk(&fs, fs.lookup(row, "0").unwrap().0).unwrap(), twin("ts/zstd_crc/c/1/0"));
    assert_eq!(read_chunk(&fs, fs.lookup(row, "1").unwrap().0).unwrap(), twin("ts/zstd_crc/c/1/1"));
    assert!(matches!(fs.lookup(row, "2"), Err(Error::NotFound)), "the new array has two chunk columns");
    let (files, _) = walk_view(&fs);
    let (twin_files, _) = walk_dir(&golden().join("unsharded/ts/zstd_crc"));
    for (path, bytes) in twin_files {
        assert_eq!(files.get(&format!("{ARRAY}/{path}")), Some(&bytes), "{path}");
    }
}

#[test]
fn a_read_with_no_open_gets_the_version_looked_up_after_it_was_replaced() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    recreate_as(store.path(), ARRAY, "ts/zstd_crc");
    // A read-only mount's reads come with no open (FUSE no-open), which the kernel does not retry
    // on ESTALE: the lookup opened the version, whose bytes the inode's reads still get, whole.
    assert_eq!(fs.read_unopened(chunk, 0, 1 << 20).unwrap(), twin(&format!("{ARRAY}/c/1/0")));
    assert!(matches!(read_chunk(&fs, chunk), Err(Error::Stale(_))), "an open still finds it replaced");
}

#[test]
fn writes_pending_when_their_array_is_made_anew_are_refused_and_never_committed() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    let fh = fs.open(chunk, TRUNCATE).unwrap();
    fs.write(fh, 0, b"written under the old geometry").unwrap();
    recreate_as(store.path(), ARRAY, "ts/zstd_crc");
    let before = walk_dir(&store.path().join(ARRAY)).0;
    assert!(matches!(fs.write(fh, 5, b"more"), Err(Error::Stale(_))), "the file no longer means that chunk");
    match fs.fsync(fh) {
        Err(Error::Stale(msg)) => assert!(msg.contains(ARRAY), "{msg}"),
        other => panic!("fsync: expected ESTALE, got {other:?}"),
    }
    fs.release(fh);
    fs.commit_all().unwrap();
    assert_eq!(walk_dir(&store.path().join(ARRAY)).0, before, "nothing reached the new array's shards");
    assert_eq!(read_chunk(&fs, chunk).unwrap(), twin("ts/zstd_crc/c/1/0"));
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn a_shrink_through_the_view_deletes_the_chunks_outside_as_zarr_python_does() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let (written, stored, inside) = (format!("{ARRAY}/c/4/2"), format!("{ARRAY}/c/4/1"), format!("{ARRAY}/c/1/0"));
    for path in [&written, &inside] {
        let fh = fs.open(lookup(&fs, path).unwrap(), TRUNCATE).unwrap();
        fs.write(fh, 0, b"pending").unwrap();
        fs.release(fh);
    }
    let row4 = lookup(&fs, &format!("{ARRAY}/c/4")).unwrap();
    shrink_through_the_view(&fs, &[12, 18]);
    assert!(matches!(lookup(&fs, &written), Err(Error::NotFound)), "read-your-writes of the shrink");
    assert!(matches!(fs.lookup(lookup(&fs, &format!("{ARRAY}/c")).unwrap(), "4"), Err(Error::NotFound)));
    // zarr-python 2 stores the smaller shape first and deletes the chunks outside after it.
    fs.unlink(row4, "0").unwrap();
    assert!(matches!(fs.create(row4, "0", 0o644, TRUNCATE), Err(Error::Invalid(_))), "nothing is written outside");
    fs.commit_all().unwrap();
    // Grown again underneath: the fill value outside the old bounds, as after zarr-python's resize
    // of a plain store (it deletes the chunks outside).
    resize_stored(store.path(), ARRAY, &[20, 18]);
    for path in [&written, &stored, &format!("{ARRAY}/c/4/0"), &format!("{ARRAY}/c/3/0")] {
        assert_eq!(on_disk(store.path(), path), None, "{path}");
    }
    assert_eq!(on_disk(store.path(), &inside).as_deref(), Some(&b"pending"[..]));
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

/// zarr-python's resize: the view's document, rewritten with the new shape and stored at close.
fn shrink_through_the_view(fs: &ShardFs, shape: &[u64]) {
    let document = lookup(fs, &format!("{ARRAY}/zarr.json")).unwrap();
    let mut doc: Value = serde_json::from_slice(&read_all(fs, document)).unwrap();
    doc["shape"] = Value::from(shape.to_vec());
    let fh = fs.open(document, TRUNCATE).unwrap();
    fs.write(fh, 0, &serde_json::to_vec(&doc).unwrap()).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
}

#[test]
fn only_the_writer_of_the_old_array_hears_of_its_dropped_writes() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let old = fs.open(lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap(), TRUNCATE).unwrap();
    fs.write(old, 0, b"old geometry").unwrap();
    recreate_as(store.path(), ARRAY, "ts/zstd_crc");
    // A writer of the new array, in a shard with the same key (c/0/0).
    let row = lookup(&fs, &format!("{ARRAY}/c/1")).unwrap();
    let (_, _, new) = fs.create(row, "1", 0o644, TRUNCATE).unwrap();
    fs.write(new, 0, b"new geometry").unwrap();
    fs.fsync(new).unwrap();
    fs.flush(new).unwrap();
    assert!(fs.flushes_at_close(old), "the old writer's close has something to report");
    assert!(matches!(fs.flush(old), Err(Error::Stale(_))), "close of the old writer");
    assert!(matches!(fs.fsync(old), Err(Error::Stale(_))), "fsync of the old writer");
    fs.release(old);
    fs.release(new);
    assert_eq!(on_disk(store.path(), &format!("{ARRAY}/c/1/1")).as_deref(), Some(&b"new geometry"[..]));
    assert_eq!(on_disk(store.path(), &format!("{ARRAY}/c/1/0")), Some(twin("ts/zstd_crc/c/1/0")));
}

#[test]
fn a_document_unreadable_for_a_moment_keeps_the_writes_pending() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let path = format!("{ARRAY}/c/1/0");
    let fh = fs.open(lookup(&fs, &path).unwrap(), TRUNCATE).unwrap();
    fs.write(fh, 0, b"kept").unwrap();
    fs.release(fh);
    let document = store.path().join(ARRAY).join("zarr.json");
    let whole = std::fs::read(&document).unwrap();
    // Another program rewriting it in place, half-way through.
    std::fs::write(&document, &whole[..whole.len() / 2]).unwrap();
    match fs.commit_all() {
        Err(Error::Damaged(msg)) => assert!(msg.contains("cannot be read now"), "{msg}"),
        other => panic!("commit while the document is torn: {other:?}"),
    }
    std::fs::write(&document, &whole).unwrap();
    fs.commit_all().unwrap();
    assert_eq!(on_disk(store.path(), &path).as_deref(), Some(&b"kept"[..]));
}

#[test]
fn a_held_chunk_of_an_array_made_anew_at_another_rank_is_gone_not_damaged() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    let row = lookup(&fs, &format!("{ARRAY}/c/1")).unwrap();
    recreate_as(store.path(), ARRAY, "zp/zstd_start");
    assert!(matches!(fs.getattr(chunk), Err(Error::NotFound)));
    assert!(matches!(read_chunk(&fs, chunk), Err(Error::NotFound)));
    assert!(fs.getattr(row).is_ok(), "c/1 is a chunk-key directory of the 3-D array too");
    assert_eq!(
        read_chunk(&fs, lookup(&fs, &format!("{ARRAY}/c/1/0/1")).unwrap()).unwrap(),
        twin("zp/zstd_start/c/1/0/1")
    );
}

/// What a fresh read-only mount of the store shows at `path`.
fn on_disk(store: &Path, path: &str) -> Option<Vec<u8>> {
    let fs = fs_of(store);
    lookup(&fs, path).ok().map(|ino| read_all(&fs, ino))
}

#[test]
fn a_grow_keeps_what_the_kernel_holds_of_the_chunks_and_any_other_change_drops_it() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    let c = lookup(&fs, &format!("{ARRAY}/c")).unwrap();
    list_plus(&fs, c);
    let document = lookup(&fs, &format!("{ARRAY}/zarr.json")).unwrap();
    assert!(fs.stale(CACHE_TTL).is_empty());
    resize_stored(store.path(), ARRAY, &[40, 18]);
    let stale: Vec<u64> = fs.stale(CACHE_TTL).into_iter().map(|s| s.ino).collect();
    assert!(!stale.contains(&chunk), "an append leaves every cached chunk alone: {stale:?}");
    assert!(stale.contains(&c) && stale.contains(&document), "listings and the document itself go: {stale:?}");
    resize_stored(store.path(), ARRAY, &[12, 18]);
    let stale = fs.stale(CACHE_TTL);
    let dropped = stale.iter().find(|s| s.ino == chunk).expect("a shrink drops the chunk");
    assert!(dropped.entry.is_some(), "with its name");
}

/// Replaces the file at `path` by a copy of itself, as a program writing it atomically would: the
/// same bytes, another version.
fn replace_stored(path: &Path) {
    let tmp = path.with_extension("tmp");
    std::fs::copy(path, &tmp).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

#[test]
fn a_chunk_found_replaced_when_asked_for_its_attributes_still_has_its_name_dropped() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let chunk = lookup(&fs, &format!("{ARRAY}/c/1/0")).unwrap();
    assert!(fs.stale(CACHE_TTL).is_empty());
    replace_stored(&store.path().join(ARRAY).join("c/0/0"));
    // The kernel asks before the watcher's next pass: so it does when a pass dropped the name
    // and the inode, and the name was looked up again (the same inode) in between.
    fs.getattr(chunk).unwrap();
    let stale = fs.stale(CACHE_TTL);
    let dropped = stale.iter().find(|s| s.ino == chunk).expect("the name still leads to the replaced version");
    assert!(dropped.entry.is_some() && dropped.content == Dropped::Nothing, "only its name goes: {dropped:?}");
    assert!(fs.stale(CACHE_TTL).is_empty(), "once");
}

#[test]
fn a_consolidated_file_read_in_pieces_is_one_build_while_documents_change() {
    let store = sharded_copy();
    let v2 = std::sync::Arc::new(shardfs::view::presentation::ZarrV2);
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let fs =
        shardfs::mount::filesystem_showing(shardfs::mount::open_store(store.path()).unwrap(), v2, cache, None).unwrap();
    let zmetadata = lookup(&fs, ".zmetadata").unwrap();
    // A file made in a group's directory changes the directory, not the document.
    std::fs::write(store.path().join("stray.partial"), b"").unwrap();
    assert_eq!(lookup(&fs, ".zmetadata").unwrap(), zmetadata, "the same bytes are the same version");
    let mut bytes = fs.read_unopened(zmetadata, 0, 100).unwrap();
    resize_stored(store.path(), ARRAY, &[40, 18]);
    // The rest of the file comes from the build whose first bytes were read, as the rest of a file
    // replaced by a rename comes from the file opened.
    bytes.extend(fs.read_unopened(zmetadata, 100, 1 << 20).unwrap());
    let shape = |bytes: &[u8]| {
        let doc: Value = serde_json::from_slice(bytes).unwrap();
        doc["metadata"][format!("{ARRAY}/.zarray")]["shape"].clone()
    };
    assert_eq!(shape(&bytes), serde_json::json!([20, 18]));
    let stale = fs.stale(CACHE_TTL);
    assert!(stale.iter().any(|s| s.ino == zmetadata && s.entry.is_some()), "the name goes: {stale:?}");
    let again = lookup(&fs, ".zmetadata").unwrap();
    assert_ne!(again, zmetadata);
    assert_eq!(shape(&read_all(&fs, again)), serde_json::json!([40, 18]));
}

#[test]
fn a_consolidated_file_refused_for_writing_stays_bound_to_its_build() {
    let store = sharded_copy();
    let v2 = std::sync::Arc::new(shardfs::view::presentation::ZarrV2);
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let options = shardfs::fs::WriteOptions { policy: manual(), shard_new: None };
    let fs =
        shardfs::mount::filesystem_showing(shardfs::mount::open_store(store.path()).unwrap(), v2, cache, Some(options))
            .unwrap();
    let zmetadata = lookup(&fs, ".zmetadata").unwrap();
    assert!(matches!(fs.open(zmetadata, TRUNCATE), Err(Error::ReadOnly)));
    assert!(matches!(fs.set_size(zmetadata, None, 0), Err(Error::ReadOnly)));
    resize_stored(store.path(), ARRAY, &[40, 18]);
    assert_ne!(lookup(&fs, ".zmetadata").unwrap(), zmetadata, "the new build is another version");
}

#[test]
fn chunk_inodes_of_a_read_only_mount_are_numbered_by_shard_version() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let row = lookup(&fs, &format!("{ARRAY}/c/1")).unwrap();
    let baseline = fs.known_inodes();
    let listed = list(&fs, row);
    let chunks: Vec<_> = listed.iter().filter(|e| e.name != "." && e.name != "..").collect();
    assert!(chunks.len() > 1);
    let mut held = Vec::new();
    for entry in &chunks {
        let (ino, attr) = fs.lookup(row, &entry.name).unwrap();
        assert_eq!(ino, entry.ino, "{}: a listing numbers a chunk as its lookup does", entry.name);
        held.push((ino, attr));
    }
    assert_eq!(fs.known_inodes(), baseline + chunks.len());
    // c/1/0 lies in shard c/0/0: rewritten, it is another version, with other numbers.
    let (old, old_attr) = held[0];
    replace_stored(&store.path().join(ARRAY).join("c/0/0"));
    let (new, new_attr) = fs.lookup(row, "0").unwrap();
    assert_ne!(new, old, "another version: another inode");
    assert_eq!(new_attr.size, old_attr.size);
    assert_eq!(fs.getattr(old).unwrap().stamp, old_attr.stamp, "the old inode keeps its version's attributes");
    let stale = fs.stale(CACHE_TTL);
    assert!(stale.iter().any(|s| s.ino == old && s.entry.is_some()), "the old inode's name goes: {stale:?}");
    assert_eq!(read_chunk(&fs, new).unwrap(), twin(&format!("{ARRAY}/c/1/0")));
    held.push((new, new_attr));
    for (ino, _) in held {
        fs.forget(ino, 1);
    }
    assert_eq!(fs.known_inodes(), baseline, "each group goes with its last reference");
}
