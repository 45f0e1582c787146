//! Writes through the view, without FUSE: read-your-writes before any commit, group commit
//! (fsync, size threshold, idle interval, everything at unmount), overwrite/append/truncate,
//! unlink, atomic-rename writers, chunk-key directories, concurrency, and a failed commit that
//! loses nothing.

mod common;

use std::time::Duration;

use common::*;
use shardfs::fs::Error;
use shardfs::fs::{Dropped, OpenMode, ROOT_INO, ShardFs};
use shardfs::fuse::CACHE_TTL;
use shardfs::inspect::scan;
use shardfs::store::LocalStore;
use shardfs::store::faulty::FaultyStore;
use shardfs::write::pending::Policy;

const WRITE: OpenMode = OpenMode { write: true, truncate: false, append: false };
const TRUNCATE: OpenMode = OpenMode { write: true, truncate: true, append: false };
const APPEND: OpenMode = OpenMode { write: true, truncate: false, append: true };

/// A policy that commits only when asked to (fsync, commit_all).
fn manual() -> Policy {
    Policy { shard_bytes: usize::MAX, idle: Duration::from_secs(3600), ..Policy::default() }
}

fn ino(fs: &ShardFs, path: &str) -> Result<u64, Error> {
    let mut ino = ROOT_INO;
    for name in path.split('/') {
        ino = fs.lookup(ino, name)?.0;
    }
    Ok(ino)
}

fn parent_and_name(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap()
}

fn read(fs: &ShardFs, path: &str) -> Vec<u8> {
    read_path(fs, path).unwrap()
}

/// What a fresh read-only mount of the store shows at `path`.
fn on_disk(store: &std::path::Path, path: &str) -> Option<Vec<u8>> {
    let fs = fs_of(store);
    ino(&fs, path).ok().map(|i| read_all(&fs, i))
}

#[test]
fn writes_are_visible_at_once_and_durable_after_fsync() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let path = "zp/gzip_crc_end/c/2/1";
    let fh = fs.open(ino(&fs, path).unwrap(), TRUNCATE).unwrap();
    fs.write(fh, 0, b"new bytes").unwrap();
    assert_eq!(read(&fs, path), b"new bytes", "read-your-writes before any commit");
    assert_ne!(on_disk(store.path(), path).unwrap(), b"new bytes", "not committed yet");
    fs.fsync(fh).unwrap();
    assert_eq!(on_disk(store.path(), path).unwrap(), b"new bytes", "durable after fsync");
    fs.release(fh);
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn partial_overwrites_appends_and_truncation() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let path = "zp/raw_nocrc/c/3";
    let original = read(&fs, path);
    let fh = fs.open(ino(&fs, path).unwrap(), WRITE).unwrap();
    fs.write(fh, 1, b"XY").unwrap();
    fs.release(fh);
    let mut expected = original.clone();
    expected[1..3].copy_from_slice(b"XY");
    assert_eq!(read(&fs, path), expected);
    let fh = fs.open(ino(&fs, path).unwrap(), APPEND).unwrap();
    fs.write(fh, 0, b"tail").unwrap();
    fs.release(fh);
    expected.extend_from_slice(b"tail");
    assert_eq!(read(&fs, path), expected);
    let attr = fs.set_size(ino(&fs, path).unwrap(), None, 2).unwrap();
    assert_eq!(attr.size, 2);
    fs.commit_all().unwrap();
    assert_eq!(on_disk(store.path(), path).unwrap(), expected[..2]);
}

#[test]
fn unlinked_chunks_vanish_and_an_emptied_shard_is_deleted() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    // raw_nocrc shard c/2 holds chunks 6 and 7 (8 lies outside the array).
    fs.unlink(ino(&fs, "zp/raw_nocrc/c").unwrap(), "6").unwrap();
    assert!(matches!(ino(&fs, "zp/raw_nocrc/c/6"), Err(Error::NotFound)));
    fs.unlink(ino(&fs, "zp/raw_nocrc/c").unwrap(), "7").unwrap();
    assert!(matches!(fs.unlink(ino(&fs, "zp/raw_nocrc/c").unwrap(), "7"), Err(Error::NotFound)));
    fs.commit_all().unwrap();
    assert!(!store.path().join("zp/raw_nocrc/c/2").exists(), "a shard with no chunk left is deleted");
    assert_eq!(on_disk(store.path(), "zp/raw_nocrc/c/5"), Some(read(&fs, "zp/raw_nocrc/c/5")));
}

#[test]
fn atomic_rename_writers_and_new_chunk_directories() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    // tensorstore's way: write "<key>.__lock" beside the key, then rename it onto the key.
    let dir = ino(&fs, "zp/gzip_crc_end/c/4").unwrap();
    let (_, _, fh) = fs.create(dir, "2.__lock", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, b"renamed into place").unwrap();
    fs.release(fh);
    assert_eq!(read(&fs, "zp/gzip_crc_end/c/4/2.__lock"), b"renamed into place");
    let scratch = store.path().join(shardfs::store::SCRATCH_DIR);
    assert!(!scratch.exists(), "a temporary file in a chunk-key directory is held in memory, not written");
    fs.rename(dir, "2.__lock", dir, "2").unwrap();
    assert_eq!(read(&fs, "zp/gzip_crc_end/c/4/2"), b"renamed into place");
    assert!(matches!(ino(&fs, "zp/gzip_crc_end/c/4/2.__lock"), Err(Error::NotFound)));
    // zarr-python's way into a row with no chunk yet: mkdir -p, then write the key.
    let c = ino(&fs, "zp/big_endian_index/c").unwrap();
    assert!(matches!(ino(&fs, "zp/big_endian_index/c/0"), Err(Error::NotFound)));
    fs.mkdir(c, "0", 0o755).unwrap();
    assert!(matches!(fs.mkdir(c, "0", 0o755), Err(Error::Exists)));
    write_file(&fs, "zp/big_endian_index/c/0/1", b"first row");
    fs.commit_all().unwrap();
    assert_eq!(on_disk(store.path(), "zp/gzip_crc_end/c/4/2").unwrap(), b"renamed into place");
    assert_eq!(on_disk(store.path(), "zp/big_endian_index/c/0/1").unwrap(), b"first row");
    assert!(store.path().join("zp/big_endian_index/c/0/0").exists(), "shard (0, 0) was created");
    // Writes outside the array or of the wrong rank are refused.
    assert!(matches!(fs.create(c, "9", 0o644, TRUNCATE), Err(Error::Invalid(_))));
    assert!(matches!(fs.rmdir(c, "0"), Err(Error::NotEmpty)));
}

#[test]
fn a_chunk_directory_taken_to_be_there_stays_there_until_removed() {
    // Row 0 of shard (0, 0) holds no chunk. A lookup of `c/0` that waits more than its grace for
    // the shard's index takes the shard file for a chunk below it, so mkdir answers EEXIST; the
    // exact answer that follows must not say the directory is not there (`os.makedirs(...,
    // exist_ok=True)` then raises FileExistsError, as eight SQLite mounts once saw).
    let dir = sharded_copy();
    let shard = "zp/big_endian_index/c/0/0";
    let (release, stalled) = std::sync::mpsc::channel::<()>();
    let store = Hooked::new(LocalStore::open(dir.path()).unwrap()).after_opening(shard, move || {
        let _ = stalled.recv();
    });
    let options = shardfs::fs::WriteOptions { policy: manual(), shard_new: None };
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let fs = shardfs::mount::filesystem(std::sync::Arc::new(store), cache, Some(options)).unwrap();
    let c = ino(&fs, "zp/big_endian_index/c").unwrap();
    assert!(matches!(fs.mkdir(c, "0", 0o755), Err(Error::Exists)));
    release.send(()).unwrap();
    // The shard's index now comes at once: the exact answer would be "not there".
    let (row, attr) = fs.lookup(c, "0").expect("the directory mkdir found is there");
    assert_eq!(attr.kind, shardfs::store::Kind::Dir);
    assert!(shardfs::view::dir_guesses::GUESS_HELD >= CACHE_TTL, "held as long as the kernel holds the entry");
    // Removed, it is gone at once (`rm -r` of a directory only guessed must not fail).
    fs.rmdir(c, "0").unwrap();
    assert!(matches!(fs.lookup(c, "0"), Err(Error::NotFound)));
    fs.mkdir(c, "0", 0o755).unwrap();
    write_file(&fs, "zp/big_endian_index/c/0/1", b"first row");
    assert!(fs.lookup(row, "1").is_ok());
    fs.commit_all().unwrap();
    assert_eq!(on_disk(dir.path(), "zp/big_endian_index/c/0/1").unwrap(), b"first row");
}

#[test]
fn group_commit_appends_one_index_for_many_chunks() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    // zstd_start: index at the start, so commits rewrite; gzip_crc_end appends. Rewrite every
    // chunk of shard c/1/0 of gzip_crc_end (chunks (2..4) x (0..2)) one file at a time.
    for (i, j) in [(2, 0), (2, 1), (3, 0), (3, 1)] {
        write_file(&fs, &format!("zp/gzip_crc_end/c/{i}/{j}"), &[i as u8; 40]);
    }
    let before = std::fs::metadata(store.path().join("zp/gzip_crc_end/c/1/0")).unwrap().len();
    fs.commit_all().unwrap();
    let after = std::fs::metadata(store.path().join("zp/gzip_crc_end/c/1/0")).unwrap().len();
    assert_eq!(after - before, 4 * 40 + 4 * 16 + 4, "one append: four chunks and one index");
}

#[test]
fn a_file_looked_up_before_the_mounts_own_commits_to_its_shard_still_opens() {
    // tensorstore reads some chunks of a shard while its writes to others are committed (each
    // rename, then fsync of the directory): a file looked up before those commits opens (it
    // got ESTALE, twice in a row failing the open), unless a commit changed that very chunk.
    // gzip_crc_end's commits append; zstd_start's (index at the start) rewrite the shard.
    let cases = [("zp/gzip_crc_end/c", "2/0", ["2/1", "3/0"]), ("zp/zstd_start/c", "1/0/0", ["1/0/1", "1/1/0"])];
    for (dir, kept, written) in cases {
        let store = sharded_copy();
        let fs = writable_fs(store.path(), manual());
        let kept_path = format!("{dir}/{kept}");
        let held = ino(&fs, &kept_path).unwrap();
        let old = read_all(&fs, held);
        for name in written {
            write_file(&fs, &format!("{dir}/{name}"), &[7; 40]);
            fs.commit_all().unwrap();
        }
        assert_eq!(read_all(&fs, held), old, "{kept_path}: the file held, after its shard's commits");
        // Replaced by a rename, tensorstore's way: the file held still stands for the old bytes.
        let (parent, name) = parent_and_name(&kept_path);
        let parent = ino(&fs, parent).unwrap();
        let lock = format!("{name}.__lock");
        let (_, _, fh) = fs.create(parent, &lock, 0o644, TRUNCATE).unwrap();
        fs.write(fh, 0, &[9; 40]).unwrap();
        fs.release(fh);
        fs.rename(parent, &lock, parent, name).unwrap();
        fs.commit_all().unwrap();
        let fh = fs.open(held, OpenMode::default());
        assert!(matches!(fh, Err(Error::Stale(_))), "{kept_path}: a commit changed it: {fh:?}");
        assert_eq!(read(&fs, &kept_path), [9; 40]);
    }
}

#[test]
fn a_full_shard_of_new_chunks_is_written_once() {
    let store = sharded_copy();
    let policy = Policy { shard_bytes: 64, idle: Duration::from_secs(3600), ..Policy::default() };
    let fs = writable_fs(store.path(), policy);
    // Crossing the 64-byte threshold has the background committer commit the shard, without
    // fsync or idle time.
    write_file(&fs, "zp/raw_nocrc/c/0", &[1; 40]);
    assert!(on_disk(store.path(), "zp/raw_nocrc/c/0").is_none());
    write_file(&fs, "zp/raw_nocrc/c/1", &[2; 40]);
    assert_eq!(eventually_on_disk(store.path(), "zp/raw_nocrc/c/1"), [2; 40]);
    assert_eq!(on_disk(store.path(), "zp/raw_nocrc/c/0").unwrap(), [1; 40]);
}

/// The chunk at `path` once a background commit has stored it (at most 10 s).
fn eventually_on_disk(store: &std::path::Path, path: &str) -> Vec<u8> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(bytes) = on_disk(store, path) {
            return bytes;
        }
        assert!(std::time::Instant::now() < deadline, "{path} was never committed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn idle_shards_are_committed_in_the_background() {
    let store = sharded_copy();
    let fs = writable_fs(
        store.path(),
        Policy { shard_bytes: usize::MAX, idle: Duration::from_millis(100), ..Policy::default() },
    );
    write_file(&fs, "zp/raw_nocrc/c/0", b"idle");
    assert_eq!(eventually_on_disk(store.path(), "zp/raw_nocrc/c/0"), b"idle");
}

#[test]
fn concurrent_writers_lose_nothing() {
    let store = sharded_copy();
    let fs =
        writable_fs(store.path(), Policy { shard_bytes: 200, idle: Duration::from_millis(50), ..Policy::default() });
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let fs = &fs;
            s.spawn(move || {
                for round in 0..20u8 {
                    let (i, j) = (t % 5, (round % 3) as usize);
                    write_file(fs, &format!("zp/gzip_crc_end/c/{i}/{j}"), &[t, round, 7]);
                }
            });
        }
    });
    let expected: Vec<(String, Vec<u8>)> = (0..5)
        .flat_map(|i| (0..3).map(move |j| format!("zp/gzip_crc_end/c/{i}/{j}")))
        .map(|p| (p.clone(), read(&fs, &p)))
        .collect();
    fs.commit_all().unwrap();
    for (path, bytes) in expected {
        assert_eq!(on_disk(store.path(), &path).unwrap(), bytes, "{path}");
    }
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn a_failed_commit_reports_at_fsync_and_at_close_of_later_files_and_keeps_the_writes() {
    let store = sharded_copy();
    let shard = store.path().join("zp/gzip_crc_end/c/1/0");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&shard, &bytes).unwrap();
    let fs = writable_fs(store.path(), manual());
    let (dir, _) = parent_and_name("zp/gzip_crc_end/c/2/0");
    let fh = fs.create(ino(&fs, dir).unwrap(), "0", 0o644, TRUNCATE);
    // The chunk is damaged on disk, so it cannot even be looked up; creating it anew works.
    let fh = fh.unwrap().2;
    assert!(!fs.flushes_at_close(fh), "nothing to report yet: the kernel is told to send no FLUSH");
    fs.write(fh, 0, b"kept").unwrap();
    assert!(matches!(fs.fsync(fh), Err(Error::Damaged(_))));
    let again = fs.open(ino(&fs, "zp/gzip_crc_end/c/2/0").unwrap(), WRITE).unwrap();
    assert!(fs.flushes_at_close(again), "a file of the shard opened after the failure reports it at close");
    assert!(fs.flush(again).is_err(), "close reports the failed commit");
    assert_eq!(read(&fs, "zp/gzip_crc_end/c/2/0"), b"kept", "the write is still pending, not lost");
    assert_eq!(std::fs::read(&shard).unwrap(), bytes, "the damaged shard was not written over");
    assert_eq!(read(&fs, "zp/gzip_crc_end/c/4/0"), on_disk(store.path(), "zp/gzip_crc_end/c/4/0").unwrap());
}

#[test]
fn read_only_filesystems_refuse_every_change() {
    let fs = fs_of(&golden().join("sharded"));
    let c = ino(&fs, "zp/raw_nocrc/c").unwrap();
    assert!(matches!(fs.open(ino(&fs, "zp/raw_nocrc/c/3").unwrap(), WRITE), Err(Error::ReadOnly)));
    assert!(matches!(fs.create(c, "0", 0o644, TRUNCATE), Err(Error::ReadOnly)));
    assert!(matches!(fs.unlink(c, "3"), Err(Error::ReadOnly)));
    assert!(matches!(fs.mkdir(ROOT_INO, "x", 0o755), Err(Error::ReadOnly)));
}

#[test]
fn a_truncate_between_open_and_write_applies_to_the_open_file() {
    // The kernel's order for `cp` onto an existing file without atomic O_TRUNC.
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let chunk = ino(&fs, "zp/gzip_crc_end/c/2/1").unwrap();
    let fh = fs.open(chunk, WRITE).unwrap();
    fs.set_size(chunk, None, 0).unwrap();
    fs.write(fh, 0, b"short").unwrap();
    fs.release(fh);
    assert_eq!(read(&fs, "zp/gzip_crc_end/c/2/1"), b"short");
}

#[test]
fn a_rename_onto_a_chunk_that_fails_leaves_the_chunk_as_it_was() {
    // The store fails from its k-th change on (every operation after a crash point fails): for
    // each k, the rename of a written file onto a chunk key either succeeds, or fails and the
    // chunk reads as before, never fails with the chunk changed anyway.
    let path = "zp/gzip_crc_end/c/4/2";
    let (mut failed, mut k) = (0, 0);
    loop {
        let store = sharded_copy();
        let old = read(&fs_of(store.path()), path);
        let faulty = FaultyStore::crash_after(LocalStore::open(store.path()).unwrap(), k);
        let options = shardfs::fs::WriteOptions { policy: manual(), shard_new: None };
        let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
        let fs = shardfs::mount::filesystem(std::sync::Arc::new(faulty), cache, Some(options)).unwrap();
        let dir = ino(&fs, "zp/gzip_crc_end/c/4").unwrap();
        let Ok((_, _, fh)) = fs.create(dir, "2.tmp", 0o644, TRUNCATE) else {
            k += 1;
            continue;
        };
        let written = fs.write(fh, 0, b"renamed into place").is_ok();
        let closed = fs.flush(fh).is_ok();
        fs.release(fh);
        if !(written && closed) {
            k += 1;
            continue;
        }
        match fs.rename(dir, "2.tmp", dir, "2") {
            Ok(()) => {
                assert_eq!(read(&fs, path), b"renamed into place");
                break;
            }
            Err(e) => {
                assert_eq!(read(&fs, path), old, "the rename failed ({e:?}) and the chunk changed anyway");
                failed += 1;
                k += 1;
            }
        }
    }
    assert!(failed > 0, "no crash point fell inside the rename");
}

#[test]
fn a_renamed_file_keeps_its_inode_under_the_new_name() {
    // After rename(2) the kernel reads the target name through the source's inode number.
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let dir = ino(&fs, "zp/raw_nocrc/c").unwrap();
    let (tmp_ino, _, fh) = fs.create(dir, "3.abc.partial", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, b"via the old inode").unwrap();
    fs.release(fh);
    fs.rename(dir, "3.abc.partial", dir, "3").unwrap();
    assert_eq!(read_all(&fs, tmp_ino), b"via the old inode");
    assert_eq!(fs.getattr(tmp_ino).unwrap().size, 17);
    // A new file under the old temporary name is a different file.
    let (new_ino, _, fh) = fs.create(dir, "3.abc.partial", 0o644, TRUNCATE).unwrap();
    fs.release(fh);
    assert_ne!(new_ino, tmp_ino);
    assert_eq!(read_all(&fs, tmp_ino), b"via the old inode");
}

#[test]
fn a_file_renamed_through_the_view_is_still_watched_for_changes_by_others() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let (file, _, fh) = fs.create(ROOT_INO, "notes.partial", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, b"ours").unwrap();
    fs.release(fh);
    fs.rename(ROOT_INO, "notes.partial", ROOT_INO, "notes").unwrap();
    // Its answers no longer say what it is: the next pass has the kernel ask for its attributes
    // again, which watches it at its new place.
    assert!(fs.stale(CACHE_TTL).iter().any(|s| s.ino == file && s.content == Dropped::Everything && s.entry.is_none()));
    assert_eq!(fs.getattr(file).unwrap().size, 4);
    let tmp = store.path().join("notes.tmp");
    std::fs::write(&tmp, b"another program's").unwrap();
    std::fs::rename(tmp, store.path().join("notes")).unwrap();
    assert!(
        fs.stale(CACHE_TTL).iter().any(|s| s.ino == file && s.content == Dropped::Everything),
        "the kernel drops its pages of ours"
    );
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

/// Writes `doc` onto `dir/zarr.json` the way zarr-python does: a temporary file, then a rename.
fn write_document(fs: &ShardFs, dir: &str, doc: &serde_json::Value) -> Result<(), Error> {
    let parent = ino(fs, dir).unwrap();
    let (_, _, fh) = fs.create(parent, "zarr.1234.partial", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, &serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
    fs.rename(parent, "zarr.1234.partial", parent, "zarr.json")
}

#[test]
fn a_document_written_back_keeps_the_array_sharded() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let stored_before = json(&std::fs::read(store.path().join("zp/gzip_crc_end/zarr.json")).unwrap());
    let mut doc = json(&read(&fs, "zp/gzip_crc_end/zarr.json"));
    doc["attributes"]["note"] = "written through the view".into();
    doc["shape"] = serde_json::json!([8, 18]);
    write_document(&fs, "zp/gzip_crc_end", &doc).unwrap();
    let stored = json(&std::fs::read(store.path().join("zp/gzip_crc_end/zarr.json")).unwrap());
    assert_eq!(stored["codecs"], stored_before["codecs"], "still sharded on disk");
    assert_eq!(stored["chunk_grid"], stored_before["chunk_grid"]);
    assert_eq!(stored["shape"], serde_json::json!([8, 18]));
    assert_eq!(stored["attributes"]["note"], "written through the view");
    assert_eq!(json(&read(&fs, "zp/gzip_crc_end/zarr.json")), doc, "the view shows what was written");
    // After the shrink to 8 rows (chunk rows 0 and 1), no chunk beyond the bounds stays visible.
    assert!(matches!(ino(&fs, "zp/gzip_crc_end/c/2"), Err(Error::NotFound)));
    assert!(ino(&fs, "zp/gzip_crc_end/c/1/0").is_ok());
}

#[test]
fn a_document_change_sharding_cannot_hold_is_refused() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let before = std::fs::read(store.path().join("zp/gzip_crc_end/zarr.json")).unwrap();
    let mut doc = json(&read(&fs, "zp/gzip_crc_end/zarr.json"));
    doc["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!([2, 2]);
    assert!(matches!(write_document(&fs, "zp/gzip_crc_end", &doc), Err(Error::Invalid(_))));
    assert_eq!(std::fs::read(store.path().join("zp/gzip_crc_end/zarr.json")).unwrap(), before);
    // Writing it in place fails at close, and the stored document is kept as well.
    let fh = fs.open(ino(&fs, "zp/gzip_crc_end/zarr.json").unwrap(), TRUNCATE).unwrap();
    fs.write(fh, 0, b"not json").unwrap();
    assert!(matches!(fs.flush(fh), Err(Error::Invalid(_))));
    fs.release(fh);
    assert_eq!(std::fs::read(store.path().join("zp/gzip_crc_end/zarr.json")).unwrap(), before);
}

#[test]
fn consolidated_metadata_written_back_keeps_the_children_sharded() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let stored_before = json(&std::fs::read(store.path().join("zarr.json")).unwrap());
    let mut doc = json(&read(&fs, "zarr.json"));
    doc["attributes"]["touched"] = true.into();
    let parent = ROOT_INO;
    let (_, _, fh) = fs.create(parent, "zarr.tmp.partial", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, &serde_json::to_vec(&doc).unwrap()).unwrap();
    fs.release(fh);
    fs.rename(parent, "zarr.tmp.partial", parent, "zarr.json").unwrap();
    let stored = json(&std::fs::read(store.path().join("zarr.json")).unwrap());
    let children = stored["consolidated_metadata"]["metadata"].as_object().unwrap();
    assert_eq!(children.len(), stored_before["consolidated_metadata"]["metadata"].as_object().unwrap().len());
    for (path, child) in children {
        let own = std::fs::read(store.path().join(path).join("zarr.json")).unwrap();
        if child["node_type"] == "array" {
            let own = json(&own);
            assert_eq!(child["codecs"], own["codecs"], "{path} keeps its stored codecs");
            assert_eq!(child["chunk_grid"], own["chunk_grid"], "{path} keeps its stored grid");
            assert_eq!(child["attributes"], own["attributes"], "{path}");
        }
    }
    assert_eq!(stored["attributes"]["touched"], true);
}

#[test]
fn shard_new_stores_new_arrays_sharded() {
    let store = sharded_copy();
    let options = shardfs::fs::WriteOptions { policy: manual(), shard_new: Some(vec![2]) };
    let fs = shardfs::mount::filesystem(
        shardfs::mount::open_store(store.path()).unwrap(),
        shardfs::view::index_cache::IndexCache::new(1 << 20),
        Some(options),
    )
    .unwrap();
    let (zp, _) = fs.mkdir(ino(&fs, "zp").unwrap(), "fresh", 0o755).unwrap();
    let doc = serde_json::json!({"zarr_format": 3, "node_type": "array", "shape": [6, 6], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes"}], "attributes": {}});
    let (_, _, fh) = fs.create(zp, "zarr.json", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, &serde_json::to_vec(&doc).unwrap()).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
    assert_eq!(json(&read(&fs, "zp/fresh/zarr.json")), doc, "the view shows the array as written");
    let stored = json(&std::fs::read(store.path().join("zp/fresh/zarr.json")).unwrap());
    assert_eq!(stored["chunk_grid"]["configuration"]["chunk_shape"], serde_json::json!([4, 4]));
    assert_eq!(stored["codecs"][0]["name"], "sharding_indexed");
    for (i, j) in [(0, 0), (0, 1), (2, 2)] {
        write_file(&fs, &format!("zp/fresh/c/{i}/{j}"), &[i as u8 * 3 + j as u8; 4]);
    }
    fs.commit_all().unwrap();
    assert!(store.path().join("zp/fresh/c/0/0").is_file(), "shard (0, 0) holds chunks (0, 0) and (0, 1)");
    assert!(store.path().join("zp/fresh/c/1/1").is_file(), "shard (1, 1) holds chunk (2, 2)");
    assert_eq!(on_disk(store.path(), "zp/fresh/c/2/2").unwrap(), [8; 4]);
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn writing_every_chunk_of_a_32x32x32_shard_appends_one_index() {
    let store = sharded_copy();
    let options = shardfs::fs::WriteOptions { policy: manual(), shard_new: Some(vec![32]) };
    let fs = shardfs::mount::filesystem(
        shardfs::mount::open_store(store.path()).unwrap(),
        shardfs::view::index_cache::IndexCache::new(1 << 20),
        Some(options),
    )
    .unwrap();
    let (array, _) = fs.mkdir(ROOT_INO, "cube", 0o755).unwrap();
    let doc = serde_json::json!({"zarr_format": 3, "node_type": "array", "shape": [32, 32, 32], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1, 1]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}, "fill_value": 0,
        "codecs": [{"name": "bytes"}]});
    let (_, _, fh) = fs.create(array, "zarr.json", 0o644, TRUNCATE).unwrap();
    fs.write(fh, 0, &serde_json::to_vec(&doc).unwrap()).unwrap();
    fs.release(fh);
    for i in 0..32u64 {
        for j in 0..32u64 {
            for k in 0..32u64 {
                let (_, _, fh) = fs.create(array, &format!("c.{i}.{j}.{k}"), 0o644, TRUNCATE).unwrap();
                fs.write(fh, 0, &[(i + j + k) as u8]).unwrap();
                fs.release(fh);
            }
        }
    }
    fs.commit_all().unwrap();
    let shard = std::fs::metadata(store.path().join("cube/c.0.0.0")).unwrap().len();
    assert_eq!(shard, 32768 + 32768 * 16 + 4, "32,768 chunk bytes and exactly one index");
    assert_eq!(on_disk(store.path(), "cube/c.31.2.7").unwrap(), [40]);
}

#[test]
fn nested_sharding_arrays_are_writable() {
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    // zp/nested: shards of 16x16 holding inner shards of 8x8 holding 4x4 chunks.
    let untouched = read(&fs, "zp/nested/c/1/1");
    write_file(&fs, "zp/nested/c/0/0", b"outer 0, inner 0, chunk 0");
    write_file(&fs, "zp/nested/c/3/2", b"outer 0, inner 3, chunk 1");
    write_file(&fs, "zp/nested/c/4/0", b"a shard of its own");
    fs.unlink(ino(&fs, "zp/nested/c/1").unwrap(), "0").unwrap();
    fs.commit_all().unwrap();
    assert_eq!(on_disk(store.path(), "zp/nested/c/0/0").unwrap(), b"outer 0, inner 0, chunk 0");
    assert_eq!(on_disk(store.path(), "zp/nested/c/3/2").unwrap(), b"outer 0, inner 3, chunk 1");
    assert_eq!(on_disk(store.path(), "zp/nested/c/4/0").unwrap(), b"a shard of its own");
    assert_eq!(on_disk(store.path(), "zp/nested/c/1/0"), None);
    assert_eq!(on_disk(store.path(), "zp/nested/c/1/1").unwrap(), untouched, "neighbours in the same inner shard stay");
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn two_mounts_of_one_store_do_not_lose_each_others_commits() {
    // Two writable filesystems over one store stand for two mounts (or a mount and another
    // process): each commit re-reads the shard's index under the shard lock.
    let store = sharded_copy();
    let (a, b) = (writable_fs(store.path(), manual()), writable_fs(store.path(), manual()));
    std::thread::scope(|s| {
        for (fs, tag) in [(&a, 1u8), (&b, 2u8)] {
            s.spawn(move || {
                for round in 0..10u8 {
                    let path = format!("zp/gzip_crc_end/c/{}/{}", 2 + tag as usize % 2, round % 2);
                    write_file(fs, &path, &[tag, round]);
                    fs.commit_all().unwrap();
                }
            });
        }
    });
    assert_eq!(on_disk(store.path(), "zp/gzip_crc_end/c/3/1").unwrap(), [1, 9]);
    assert_eq!(on_disk(store.path(), "zp/gzip_crc_end/c/2/1").unwrap(), [2, 9]);
    assert_eq!(on_disk(store.path(), "zp/gzip_crc_end/c/3/0").unwrap(), [1, 8]);
    assert_eq!(on_disk(store.path(), "zp/gzip_crc_end/c/2/0").unwrap(), [2, 8]);
    assert!(scan(&LocalStore::open(store.path()).unwrap()).unwrap().healthy());
}

#[test]
fn chunk_inodes_the_kernel_holds_follow_renames_of_the_chunk_and_of_its_array() {
    // Chunk inodes are numbered from their shard version and place; a rename moves what the
    // kernel holds to another place, so those inodes leave their group for the table.
    let store = sharded_copy();
    let fs = writable_fs(store.path(), manual());
    let three = ino(&fs, "zp/raw_nocrc/c/3").unwrap();
    let bytes3 = read(&fs, "zp/raw_nocrc/c/3");
    let dir = ino(&fs, "zp/raw_nocrc/c").unwrap();
    fs.rename(dir, "3", dir, "5").unwrap();
    assert_eq!(read_all(&fs, three), bytes3, "the inode of c/3 stands for c/5 now");
    assert_eq!(fs.getattr(three).unwrap().size, bytes3.len() as u64);
    assert_eq!(ino(&fs, "zp/raw_nocrc/c/5").unwrap(), three);
    // An array renamed: the inodes below it go along.
    let held = ino(&fs, "zp/gzip_crc_end/c/1/0").unwrap();
    let bytes = read(&fs, "zp/gzip_crc_end/c/1/0");
    let zp = ino(&fs, "zp").unwrap();
    fs.rename(zp, "gzip_crc_end", zp, "renamed").unwrap();
    assert_eq!(read_all(&fs, held), bytes, "the inode of c/1/0 stands for renamed/c/1/0 now");
    assert_eq!(ino(&fs, "zp/renamed/c/1/0").unwrap(), held);
    assert!(ino(&fs, "zp/gzip_crc_end/c/1/0").is_err());
}
