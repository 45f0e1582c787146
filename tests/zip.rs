//! Zip stores: the golden sharded store zipped by Python's `zipfile` (an independent writer:
//! stored as RFC-9 asks, with `zarr.json` entries first; deflated; ZIP64 local headers; with a
//! comment), mounted, shows exactly the view of the same store as a directory, in v3 and v2; a
//! real mount through the binary is read-only (EROFS); damage costs what it holds (a truncated
//! central directory refuses the mount with one line naming the file; a bad local header or an
//! entry past the end is EIO for that shard only); `check` and `refs` work on the zip, and each
//! reference is a range of the zip file holding exactly the view file's bytes.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use shardfs::fs::{Error, ShardFs};
use shardfs::mount::{filesystem_showing, open_store};
use shardfs::view::index_cache::IndexCache;
use shardfs::view::presentation::{Presentation, ZarrV2, ZarrV3};

/// Zips `dir` into `zip` with Python's zipfile: `how` is `stored`, `deflated`, `bzip2` or `zip64`
/// (stored, every local header with a ZIP64 extra field); `zarr.json` entries first, as RFC-9
/// asks, explicit directory entries, and a comment.
fn zip_dir(dir: &Path, zip: &Path, how: &str) {
    let script = r#"
import os, sys, zipfile
root, out, how = sys.argv[1:]
method = {"deflated": zipfile.ZIP_DEFLATED, "bzip2": zipfile.ZIP_BZIP2}.get(how, zipfile.ZIP_STORED)
files, dirs = [], []
for d, subdirs, names in os.walk(root):
    dirs += [os.path.relpath(os.path.join(d, s), root) + "/" for s in subdirs]
    files += [os.path.relpath(os.path.join(d, n), root) for n in names]
files.sort(key=lambda p: (not p.endswith("zarr.json"), p))
with zipfile.ZipFile(out, "w", method) as z:
    for d in sorted(dirs):
        z.writestr(d, b"")
    for f in files:
        with open(os.path.join(root, f), "rb") as src, z.open(f, "w", force_zip64=how == "zip64") as dst:
            dst.write(src.read())
    z.comment = b'{"ome": {"version": "0.5"}}'
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(dir).arg(zip).arg(how).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn golden_sharded() -> PathBuf {
    golden().join("sharded")
}

fn fs_showing(store: &Path, presentation: Arc<dyn Presentation>) -> ShardFs {
    filesystem_showing(open_store(store).unwrap(), presentation, IndexCache::new(1 << 20), None).unwrap()
}

/// A zip of the golden sharded store, made as `how` says, in a fresh directory.
fn golden_zip(how: &str, name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("zip");
    let zip = dir.path().join(name);
    zip_dir(&golden_sharded(), &zip, how);
    (dir, zip)
}

#[test]
fn zipped_store_shows_what_the_directory_shows() {
    let v3: Arc<dyn Presentation> = Arc::new(ZarrV3);
    let v2: Arc<dyn Presentation> = Arc::new(ZarrV2);
    for presentation in [v3, v2] {
        let (expected, expected_dirs) = walk_view(&fs_showing(&golden_sharded(), presentation.clone()));
        for (how, name) in [("stored", "golden.ozx"), ("deflated", "golden.zip"), ("zip64", "no-suffix")] {
            let (_dir, zip) = golden_zip(how, name);
            let (files, dirs) = walk_view(&fs_showing(&zip, presentation.clone()));
            assert_eq!(files, expected, "{how}");
            assert_eq!(dirs, expected_dirs, "{how}");
        }
    }
}

/// Patches the central directory entry of `entry` in `zip` with Python (`field` = `header`: its
/// local header's signature; `size`: its sizes, so that it runs past the end).
fn damage_entry(zip: &Path, entry: &str, field: &str) {
    let script = r#"
import struct, sys, zipfile
path, name, field = sys.argv[1:]
data = bytearray(open(path, "rb").read())
info = zipfile.ZipFile(path).getinfo(name)
if field == "header":
    data[info.header_offset] ^= 0xff
else:
    at = zipfile.ZipFile(path).start_dir
    while True:
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[at + 28:at + 34])
        if data[at + 46:at + 46 + name_len].decode() == name:
            data[at + 20:at + 28] = struct.pack("<II", 1 << 30, 1 << 30)
            break
        at += 46 + name_len + extra_len + comment_len
open(path, "wb").write(data)
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(zip).arg(entry).arg(field).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_damaged_entry_costs_its_chunks_only() {
    let (expected, _) = walk_view(&fs_of(&golden_sharded()));
    for field in ["header", "size"] {
        let (_dir, zip) = golden_zip("stored", "golden.ozx");
        damage_entry(&zip, "zp/raw_nocrc/c/0", field);
        let fs = fs_of(&zip);
        let mut damaged = Vec::new();
        for (path, bytes) in &expected {
            match read_path(&fs, path) {
                Ok(read) => assert_eq!(&read, bytes, "{field}: {path}"),
                // What fuse.rs answers EIO for, naming the entry.
                Err(e @ (Error::Damaged(_) | Error::Store(_))) => {
                    assert!(e.to_string().contains("golden.ozx/zp/raw_nocrc/c/0"), "{field}: {path}: {e}");
                    damaged.push(path.as_str());
                }
                Err(e) => panic!("{field}: {path}: {e}"),
            }
        }
        // Shard c/0 holds inner chunks 0 to 2, of which the golden store has 2.
        assert_eq!(damaged, ["zp/raw_nocrc/c/2"], "{field}");
        let out = check_store(&zip, &[]);
        assert_eq!(out.status.code(), Some(1), "{field}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("DAMAGED zp/raw_nocrc") && stdout.contains("golden.ozx/zp/raw_nocrc/c/0"), "{stdout}");
    }
}

#[test]
fn a_truncated_central_directory_refuses_the_zip_in_one_line() {
    let (_dir, zip) = golden_zip("stored", "golden.ozx");
    let data = std::fs::read(&zip).unwrap();
    let end = data.windows(4).rposition(|w| w == b"PK\x05\x06").unwrap();
    std::fs::write(&zip, [&data[..end - 200], &data[end..]].concat()).unwrap();
    let mnt = TempDir::new("mnt");
    for args in
        [vec!["mount", zip.to_str().unwrap(), mnt.path().to_str().unwrap()], vec!["check", zip.to_str().unwrap()]]
    {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&format!("{}: not a readable zip file", zip.display())), "{stderr}");
        assert!(stderr.contains("truncated"), "{stderr}");
    }
    assert!(!is_mounted(mnt.path()));
    // Cut short at the end: no end record at all.
    std::fs::write(&zip, &data[..data.len() - 10]).unwrap();
    let error = open_store(&zip).unwrap_err();
    assert!(error.contains("no end of central directory record"), "{error}");
}

#[test]
fn mounted_read_only_through_the_binary() {
    let Some(mnt) = mount_point() else { return };
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let (_dir, zip) = golden_zip("zip64", "golden.ozx");
    let out = Command::new(BIN).arg("mount").arg(&zip).arg(mnt.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view = mnt.path();
    let (expected, _) = walk_view(&fs_of(&golden_sharded()));
    let (mounted, _) = walk_dir(view);
    assert_eq!(mounted, expected);
    for refused in [
        std::fs::write(view.join("new"), b"x"),
        std::fs::write(view.join("zp/raw_nocrc/c/2"), b"x"),
        std::fs::create_dir(view.join("d")),
        std::fs::remove_file(view.join("zp/raw_nocrc/c/2")),
    ] {
        assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EROFS));
    }
    let out = Command::new(BIN).arg("unmount").arg(view).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(view));
}

#[test]
fn references_are_ranges_of_the_zip_file() {
    let (_dir, zip) = golden_zip("stored", "golden.ozx");
    let (expected, _) = walk_view(&fs_of(&golden_sharded()));
    let out = Command::new(BIN).arg("refs").arg(&zip).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let refs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let refs = refs["refs"].as_object().unwrap();
    let data = std::fs::read(&zip).unwrap();
    let mut resolved = BTreeMap::new();
    for (path, reference) in refs {
        let bytes = match reference {
            serde_json::Value::String(text) => text.as_bytes().to_vec(),
            serde_json::Value::Array(parts) => {
                assert_eq!(parts[0].as_str(), Some(zip.to_str().unwrap()), "{path}");
                let (at, len) = (parts[1].as_u64().unwrap() as usize, parts[2].as_u64().unwrap() as usize);
                data[at..at + len].to_vec()
            }
            other => panic!("{path}: {other}"),
        };
        resolved.insert(path.clone(), bytes);
    }
    assert_same_tree(&resolved, &expected);
    // A deflated entry is no range of the zip: refused in one line.
    let (_dir, deflated) = golden_zip("deflated", "golden.zip");
    let out = Command::new(BIN).arg("refs").arg(&deflated).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.lines().count() == 1 && stderr.contains("compressed in the zip file"), "{stderr}");
}

#[test]
fn a_zip_in_a_bucket_shows_the_same_view() {
    use object_store::memory::InMemory;
    use shardfs::store::bucket::{BucketStore, Caching};
    use shardfs::store::{PutMode, Store, zip::ZipStore};
    let (_dir, zip) = golden_zip("zip64", "golden.ozx");
    let objects = Arc::new(InMemory::new());
    let bucket = BucketStore::new(objects, "data", "memory://bucket/data", Caching::default()).unwrap();
    bucket.put("golden.ozx", &[&std::fs::read(&zip).unwrap()], PutMode::Overwrite).unwrap();
    let store = Arc::new(ZipStore::open(Arc::new(bucket), "golden.ozx").unwrap());
    assert_eq!(store.url("zp/zarr.json"), "memory://bucket/data/golden.ozx/zp/zarr.json");
    let fs = shardfs::mount::filesystem(store, IndexCache::new(1 << 20), None).unwrap();
    assert_eq!(walk_view(&fs), walk_view(&fs_of(&golden_sharded())));
}

#[test]
fn a_replaced_zip_is_read_again() {
    use shardfs::store::Kind;
    let (dir, zip) = golden_zip("stored", "golden.ozx");
    let store = open_store(&zip).unwrap();
    let before = store.list("zp").unwrap();
    assert!(before.0.contains(&("raw_nocrc".to_string(), Kind::Dir)));
    let smaller = TempDir::new("smaller");
    copy_tree(&golden_sharded(), smaller.path());
    std::fs::remove_dir_all(smaller.path().join("zp/raw_nocrc")).unwrap();
    zip_dir(smaller.path(), &dir.path().join("next.ozx"), "deflated");
    std::fs::rename(dir.path().join("next.ozx"), &zip).unwrap();
    let after = store.list("zp").unwrap();
    assert!(!after.0.contains(&("raw_nocrc".to_string(), Kind::Dir)));
    assert_ne!(before.1, after.1, "the listing's version follows the zip's");
    assert!(matches!(store.attr("zp/raw_nocrc/zarr.json"), Err(shardfs::store::Error::NotFound(_))));
}

#[test]
fn the_central_directory_is_read_once_per_version_of_the_zip() {
    use shardfs::store::{LocalStore, zip::ZipStore};
    use std::sync::atomic::Ordering;
    let (dir, zip) = golden_zip("stored", "golden.ozx");
    let inner = Arc::new(Hooked::new(LocalStore::open(dir.path()).unwrap()));
    let store = Arc::new(ZipStore::open(inner.clone(), "golden.ozx").unwrap());
    let fs = shardfs::mount::filesystem(store.clone(), IndexCache::new(1 << 20), None).unwrap();
    let (expected, _) = walk_view(&fs_of(&golden_sharded()));
    assert_eq!(walk_view(&fs).0, expected);
    assert_eq!(walk_view(&fs).0, expected);
    // Every read of every entry went through the zip file opened once, for its directory.
    assert_eq!(inner.opens.load(Ordering::Relaxed), 1);
    zip_dir(&golden_sharded(), &dir.path().join("next.ozx"), "zip64");
    std::fs::rename(dir.path().join("next.ozx"), &zip).unwrap();
    let fresh = shardfs::mount::filesystem(store, IndexCache::new(1 << 20), None).unwrap();
    assert_eq!(walk_view(&fresh).0, expected);
    assert_eq!(inner.opens.load(Ordering::Relaxed), 2, "a new version is read once more");
}

#[test]
fn a_compression_method_other_than_stored_or_deflated_is_an_error_naming_it() {
    let (_dir, zip) = golden_zip("bzip2", "golden.zip");
    let error = open_store(&zip).unwrap_err();
    assert!(error.contains("golden.zip/zarr.json") && error.contains("compression method 12"), "{error}");
}
