//! The hostile-input corpus: stores damaged the ways other programs, crashes and people damage
//! them, each with what the view and `shardfs check` must do. Every case ends in the right bytes
//! or a clear error naming the file; the rest of the store keeps being served; nothing is read
//! from outside the store.
//!
//! The cases are built from copies of the golden store; `zp/raw_nocrc` is a 1-D array of 30
//! bytes, shards of 12 (`c/0`, `c/1`, `c/2`), inner chunks of 4, a 48-byte index at the end.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::{Value, json};
use shardfs::fs::Error;
use shardfs::fs::ShardFs;
use shardfs::mount::{filesystem, open_store};
use shardfs::view::index_cache::IndexCache;

const ARRAY: &str = "zp/raw_nocrc";

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What must hold whatever was done to `zp/raw_nocrc`: another array reads exactly its twin.
fn assert_rest_served(fs: &ShardFs) {
    let other = "zp/gzip_crc_end/c/4/0";
    assert_eq!(read_path(fs, other).unwrap(), twin(other), "an undamaged array stopped being served");
}

fn edit_document(store: &Path, edit: impl FnOnce(&mut Value)) {
    let path = store.join(ARRAY).join("zarr.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(path, serde_json::to_vec(&doc).unwrap()).unwrap();
}

/// The array is shown exactly as stored (its shard files visible, its document verbatim), and
/// `check` exits `code` with a line naming the document.
fn assert_shown_as_stored(store: &Path, code: i32) {
    let fs = fs_of(store);
    let document = std::fs::read(store.join(ARRAY).join("zarr.json")).unwrap();
    assert_eq!(read_path(&fs, &format!("{ARRAY}/zarr.json")).unwrap(), document);
    let shard = std::fs::read(store.join(ARRAY).join("c/1")).unwrap();
    assert_eq!(read_path(&fs, &format!("{ARRAY}/c/1")).unwrap(), shard, "the shard file itself is shown");
    assert_rest_served(&fs);
    let out = check_store(store, &[]);
    assert_eq!(out.status.code(), Some(code), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("{ARRAY}/zarr.json")),
        "check does not name the document:\n{}",
        stdout(&out)
    );
}

#[test]
fn a_document_that_is_not_json_is_served_as_stored_and_fails_check() {
    for bytes in [&b"{\"zarr_format\": 3, \"node_type\": \"arr"[..], b"\xff\xfe", b"[1, 2]", b""] {
        let store = sharded_copy();
        std::fs::write(store.path().join(ARRAY).join("zarr.json"), bytes).unwrap();
        assert_shown_as_stored(store.path(), 1);
    }
}

#[test]
fn malformed_documents_are_shown_as_stored() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 9] = [
        ("shape of the wrong type", |d| d["shape"] = json!("thirty")),
        ("negative shape", |d| d["shape"] = json!([-30])),
        ("shape of another rank", |d| d["shape"] = json!([30, 2])),
        ("no codecs", |d| drop(d.as_object_mut().unwrap().remove("codecs"))),
        ("no chunk_key_encoding", |d| drop(d.as_object_mut().unwrap().remove("chunk_key_encoding"))),
        ("unknown field to understand", |d| d["extension"] = json!({"must_understand": true})),
        ("unknown field, plain value", |d| d["extension"] = json!(7)),
        ("inner chunks that do not divide the shard", |d| d["codecs"][0]["configuration"]["chunk_shape"] = json!([5])),
        ("index entries past the format's limit", |d| {
            d["chunk_grid"]["configuration"]["chunk_shape"] = json!([4u64 << 25])
        }),
    ];
    for (case, edit) in cases {
        let store = sharded_copy();
        edit_document(store.path(), edit);
        eprintln!("case: {case}");
        assert_shown_as_stored(store.path(), 0);
    }
}

#[test]
fn an_index_bigger_than_the_configured_limit_is_shown_as_stored() {
    let store = golden().join("sharded");
    // raw_nocrc's shards need 3 entries (48 bytes); gzip_crc_end's 4 entries and a checksum.
    let cache = IndexCache::new(1 << 20).with_max_index_bytes(48);
    let fs = filesystem(open_store(&store).unwrap(), cache, None).unwrap();
    assert_eq!(read_path(&fs, &format!("{ARRAY}/c/3")).unwrap(), twin(&format!("{ARRAY}/c/3")));
    let shard = std::fs::read(store.join("zp/gzip_crc_end/c/1/0")).unwrap();
    assert_eq!(read_path(&fs, "zp/gzip_crc_end/c/1/0").unwrap(), shard, "over the limit: shown as stored");
}

#[test]
fn absurd_shapes_show_what_is_in_bounds_and_nothing_else() {
    let store = sharded_copy();
    edit_document(store.path(), |d| d["shape"] = json!([0]));
    let fs = fs_of(store.path());
    assert!(matches!(read_path(&fs, &format!("{ARRAY}/c/2")), Err(Error::NotFound)));
    assert!(names_in(&fs, ARRAY).iter().all(|n| n != "c"), "an empty array shows no chunk directory");
    assert_rest_served(&fs);

    let store = sharded_copy();
    edit_document(store.path(), |d| d["shape"] = json!([1u64 << 63]));
    let fs = fs_of(store.path());
    assert_eq!(read_path(&fs, &format!("{ARRAY}/c/7")).unwrap(), twin(&format!("{ARRAY}/c/7")));
    for far in ["c/2305843009213693951", "c/18446744073709551615", "c/99999999999999999999999"] {
        assert!(matches!(read_path(&fs, &format!("{ARRAY}/{far}")), Err(Error::NotFound)), "{far}");
    }
    assert!(check_store(store.path(), &[]).status.success());
}

/// Truncates shard `c/1` of the array to `len` bytes.
fn truncate_shard(store: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(store.join(ARRAY).join("c/1")).unwrap().set_len(len).unwrap();
}

#[test]
fn truncated_shards_fail_their_chunks_at_every_cut() {
    let full = std::fs::metadata(golden().join("sharded").join(ARRAY).join("c/1")).unwrap().len();
    // Empty, inside the data, where the index starts, inside the index, one byte short.
    for len in [0, 5, full - 48, full - 47, full - 20, full - 1] {
        let store = sharded_copy();
        truncate_shard(store.path(), len);
        let shard = store.path().join(ARRAY).join("c/1");
        let fs = fs_of(store.path());
        for chunk in ["c/3", "c/4", "c/5"] {
            assert_damaged(&fs, &format!("{ARRAY}/{chunk}"), &shard);
        }
        assert_eq!(read_path(&fs, &format!("{ARRAY}/c/2")).unwrap(), twin(&format!("{ARRAY}/c/2")), "cut at {len}");
        assert_rest_served(&fs);
        let out = check_store(store.path(), &[]);
        assert_eq!(out.status.code(), Some(1), "cut at {len}: {}", stdout(&out));
        assert!(stdout(&out).contains(shard.to_str().unwrap()), "cut at {len}: {}", stdout(&out));
    }
}

/// Overwrites index entry `entry` of shard `c/1` with (offset, nbytes).
fn set_entry(store: &Path, entry: i64, offset: u64, nbytes: u64) {
    let mut bytes = offset.to_le_bytes().to_vec();
    bytes.extend(nbytes.to_le_bytes());
    patch(&store.join(ARRAY).join("c/1"), -48 + 16 * entry, &bytes);
}

#[test]
fn bad_index_entries_fail_only_their_chunk() {
    let cases: [(&str, u64, u64); 4] = [
        ("past the end", 1 << 40, 4),
        ("running past the end", 0, 1 << 20),
        ("half of the empty sentinel (offset)", u64::MAX, 4),
        ("half of the empty sentinel (nbytes)", 0, u64::MAX),
    ];
    for (case, offset, nbytes) in cases {
        let store = sharded_copy();
        set_entry(store.path(), 1, offset, nbytes);
        let shard = store.path().join(ARRAY).join("c/1");
        let fs = fs_of(store.path());
        eprintln!("case: {case}");
        assert_damaged(&fs, &format!("{ARRAY}/c/4"), &shard);
        assert_eq!(read_path(&fs, &format!("{ARRAY}/c/3")).unwrap(), twin(&format!("{ARRAY}/c/3")), "{case}");
        assert_eq!(check_store(store.path(), &[]).status.code(), Some(1), "{case}");
    }
}

#[test]
fn overlapping_entries_are_served_as_indexed_and_reported_by_check() {
    let store = sharded_copy();
    // Chunk 4 now points at chunk 3's bytes: every Zarr reader would read those, so the view does.
    set_entry(store.path(), 1, 0, 4);
    let fs = fs_of(store.path());
    assert_eq!(read_path(&fs, &format!("{ARRAY}/c/4")).unwrap(), twin(&format!("{ARRAY}/c/3")));
    let out = check_store(store.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("overlap"), "{}", stdout(&out));
}

#[test]
fn shards_that_are_not_files_fail_their_chunks() {
    type Make = fn(&Path);
    let cases: [(&str, Make); 3] = [
        ("directory", |p| std::fs::create_dir(p).unwrap()),
        ("symlink loop", |p| std::os::unix::fs::symlink(p.file_name().unwrap(), p).unwrap()),
        ("fifo", |p| {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid C string path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        }),
    ];
    for (case, make) in cases {
        let store = sharded_copy();
        let shard = store.path().join(ARRAY).join("c/1");
        std::fs::remove_file(&shard).unwrap();
        make(&shard);
        let fs = fs_of(store.path());
        eprintln!("case: {case}");
        assert_damaged(&fs, &format!("{ARRAY}/c/4"), &shard);
        assert_rest_served(&fs);
        let out = check_store(store.path(), &[]);
        assert_eq!(out.status.code(), Some(1), "{case}: {}", stdout(&out));
    }
}

#[test]
fn a_symlink_loop_outside_arrays_is_shown_as_a_link() {
    let store = sharded_copy();
    std::os::unix::fs::symlink("loop", store.path().join("loop")).unwrap();
    let fs = fs_of(store.path());
    let ino = lookup(&fs, "loop").unwrap();
    assert_eq!(fs.getattr(ino).unwrap().kind, shardfs::store::Kind::Symlink);
    assert_eq!(fs.readlink(ino).unwrap(), b"loop");
    assert!(walk_dir_names(&fs).contains(&"loop".to_string()));
}

#[test]
fn nothing_outside_the_store_is_read_or_written_through_a_link() {
    let outside = TempDir::new("outside");
    copy_tree(&golden().join("sharded").join(ARRAY).join("c"), outside.path());
    let before = walk_dir(outside.path());
    let store = sharded_copy();
    // The array's shard directory is now a link to a copy of itself outside the store.
    let shards = store.path().join(ARRAY).join("c");
    std::fs::remove_dir_all(&shards).unwrap();
    std::os::unix::fs::symlink(outside.path(), &shards).unwrap();
    // A shard inside the store that links to a file outside.
    let escape = store.path().join("zp/gzip_crc_end/c/1/0");
    std::fs::remove_file(&escape).unwrap();
    std::os::unix::fs::symlink(golden().join("sharded/zp/gzip_crc_end/c/1/0"), &escape).unwrap();

    let fs = fs_of(store.path());
    for chunk in ["c/2", "c/3", "c/7"] {
        assert!(read_path(&fs, &format!("{ARRAY}/{chunk}")).is_err(), "{chunk} was read through a link");
    }
    assert!(read_path(&fs, "zp/gzip_crc_end/c/2/0").is_err(), "a chunk was read through a linked shard");
    assert_eq!(read_path(&fs, "zp/gzip_crc_end/c/4/0").unwrap(), twin("zp/gzip_crc_end/c/4/0"));

    // Writing a chunk of that array either cannot start (its directory cannot be entered) or
    // cannot be committed; either way nothing outside changes.
    let fs = writable_fs(store.path(), Default::default());
    if let Ok(c) = lookup(&fs, &format!("{ARRAY}/c"))
        && let Ok((_, _, fh)) = fs.create(c, "2", 0o644, Default::default())
    {
        fs.write(fh, 0, b"evil").unwrap();
        assert!(fs.fsync(fh).is_err(), "a commit went through a link out of the store");
        fs.release(fh);
    }
    drop(fs);
    assert_eq!(walk_dir(outside.path()), before, "a file outside the store changed");
}

#[test]
fn an_unreadable_shard_fails_check_naming_it() {
    let store = sharded_copy();
    make_world_readable(store.path());
    let shard = store.path().join(ARRAY).join("c/1");
    set_mode(&shard, 0o000);
    let out = Command::new(BIN).args(["check", store.path().to_str().unwrap()]).uid(65534).gid(65534).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let line = stdout(&out).lines().find(|l| l.contains(shard.to_str().unwrap())).map(str::to_owned);
    assert!(line.is_some_and(|l| l.contains("ermission denied")), "{}", stdout(&out));
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Opens the tree at `dir` (a fresh temporary directory) to everyone, so that another user can
/// read it.
fn make_world_readable(dir: &Path) {
    let (files, dirs) = walk_dir(dir);
    set_mode(dir, 0o755);
    for d in dirs {
        set_mode(&dir.join(d), 0o755);
    }
    for f in files.keys() {
        set_mode(&dir.join(f), 0o644);
    }
}

fn names_in(fs: &ShardFs, path: &str) -> Vec<String> {
    list_plus(fs, lookup(fs, path).unwrap()).into_iter().map(|(e, _)| e.name).collect()
}

fn walk_dir_names(fs: &ShardFs) -> Vec<String> {
    list_plus(fs, shardfs::fs::ROOT_INO).into_iter().map(|(e, _)| e.name).collect()
}
