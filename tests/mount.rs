//! Real mounts: in-process through the library, and through the `shardfs` binary as users run it
//! (background daemon, foreground with signals, `shardfs unmount`, errors before mounting).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use shardfs::fuse::{self, MountSettings};

fn settings() -> MountSettings {
    MountSettings { options: Vec::new(), threads: 4, read_only: true, io_uring: false }
}

fn shardfs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid the mount's root answers to [`fuse::PID_IOCTL`].
fn daemon_pid(mountpoint: &Path) -> i32 {
    use std::os::fd::AsRawFd;
    let root = std::fs::File::open(mountpoint).unwrap();
    let mut pid: u32 = 0;
    // SAFETY: an open descriptor, and a request that writes one u32 to the pointer given.
    let rc = unsafe { libc::ioctl(root.as_raw_fd(), fuse::PID_IOCTL as _, &mut pid as *mut u32) };
    assert_eq!(rc, 0, "pid ioctl: {}", std::io::Error::last_os_error());
    pid as i32
}

/// True while process `pid` exists and is not a zombie.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[test]
fn mounted_view_equals_the_unsharded_twin() {
    let Some(mnt) = mount_point() else { return };
    let mounted = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    let (view, _) = walk_dir(mnt.path());
    let (twin, _) = walk_dir(&golden().join("unsharded"));
    assert_same_tree(&view, &twin);
    mounted.unmount().unwrap();
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn concurrent_readers_see_the_same_bytes() {
    let Some(mnt) = mount_point() else { return };
    let _mounted = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    let (twin, _) = walk_dir(&golden().join("unsharded"));
    std::thread::scope(|s| {
        for t in 0..8 {
            let twin = &twin;
            let root = mnt.path();
            s.spawn(move || {
                for (path, bytes) in twin.iter().skip(t).step_by(3) {
                    assert_eq!(&std::fs::read(root.join(path)).unwrap(), bytes, "{path}");
                }
            });
        }
    });
}

#[test]
fn damaged_chunks_read_as_eio_and_the_rest_is_served() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let index_byte = store.path().join("zp/gzip_crc_end/c/1/0");
    let mut bytes = std::fs::read(&index_byte).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&index_byte, bytes).unwrap();
    let _mounted = fuse::mount(fs_of(store.path()), mnt.path(), &settings()).unwrap();
    let err = std::fs::read(mnt.path().join("zp/gzip_crc_end/c/2/0")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let ok = std::fs::read(mnt.path().join("zp/gzip_crc_end/c/4/0")).unwrap();
    assert_eq!(ok, std::fs::read(golden().join("unsharded/zp/gzip_crc_end/c/4/0")).unwrap());
    let missing = std::fs::read(mnt.path().join("zp/raw_nocrc/c/0")).unwrap_err();
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn a_shard_replaced_underneath_is_seen_long_before_the_kernel_cache_expires() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _mounted = fuse::mount(fs_of(store.path()), mnt.path(), &settings()).unwrap();
    let array = "zp/big_endian_index";
    let (kept, gone, appears) = (mnt.path().join(array).join("c/1/0"), mnt.path().join(array).join("c/0/0"), "c/2/0");
    let names = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(mnt.path().join(array).join(dir))
            .map(|entries| entries.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    // Read twice, so that the kernel holds the names, attributes, pages and listings.
    for _ in 0..2 {
        assert_eq!(std::fs::read(&kept).unwrap(), twin(&format!("{array}/c/1/0")));
        assert_eq!(
            (names("c"), names("c/1")),
            (vec!["1".into(), "2".into()], vec!["0".into(), "1".into(), "2".into()])
        );
    }
    assert_eq!(std::fs::read(&gone).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    // Shard (0, 0) becomes a copy of shard (1, 0), replaced by rename as zarr-python does: chunk
    // (1, 0) is gone from it, and chunk (0, 0) now holds the bytes of chunk (2, 0).
    let shards = store.path().join(array).join("c");
    std::fs::copy(shards.join("1/0"), shards.join("0/new")).unwrap();
    std::fs::rename(shards.join("0/new"), shards.join("0/0")).unwrap();
    let changed = Instant::now();
    wait_for("the new shard to be served", || {
        std::fs::read(&kept).is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
            && std::fs::read(&gone).is_ok_and(|b| b == twin(&format!("{array}/{appears}")))
            && names("c") == ["0", "1", "2"]
            && names("c/1") == ["2"]
    });
    let seen = changed.elapsed();
    assert!(seen < fuse::CACHE_TTL / 4, "seen after {seen:?}: the kernel cache expired, no watcher invalidated it");
}

/// The errno of asking `path` for its POSIX access ACL.
fn acl_query_errno(path: &Path) -> i32 {
    let path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C strings; a null buffer of size 0 only asks for the size.
    let rc = unsafe { libc::getxattr(path.as_ptr(), c"system.posix_acl_access".as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(rc, -1);
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn a_read_only_mount_says_extended_attributes_are_unsupported_for_every_file() {
    let Some(mnt) = mount_point() else { return };
    let mounted = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    // EOPNOTSUPP each time (which `ls -l` remembers for the mount), not "no ACL" (ENODATA, which
    // it asks again per file).
    for chunk in ["zp/raw_nocrc/c/2", "zp/raw_nocrc/c/3", "zp/raw_nocrc/c/4"] {
        assert_eq!(acl_query_errno(&mnt.path().join(chunk)), libc::EOPNOTSUPP, "{chunk}");
    }
    mounted.unmount().unwrap();
}

#[test]
fn a_read_only_mount_refuses_writes() {
    let Some(mnt) = mount_point() else { return };
    let _mounted = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    let chunk = mnt.path().join("zp/raw_nocrc/c/3");
    let err = std::fs::OpenOptions::new().write(true).open(&chunk).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::create_dir(mnt.path().join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

/// Runs `cat path` as the unprivileged user nobody; its exit status and stderr.
fn cat_as_nobody(path: &Path) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new("cat").arg(path).uid(65534).gid(65534).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_view_honours_permission_bits_and_only_its_user_enters_without_allow_other() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    use std::os::unix::fs::PermissionsExt;
    let private = store.path().join("zp/raw_nocrc/c/1");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let shared = MountSettings { options: vec!["allow_other".into()], ..settings() };
    let mounted = fuse::mount(fs_of(store.path()), mnt.path(), &shared).unwrap();
    let (ok, err) = cat_as_nobody(&mnt.path().join("zp/raw_nocrc/c/2"));
    assert!(ok, "a chunk of a 0644 shard is readable by others: {err}");
    let (ok, err) = cat_as_nobody(&mnt.path().join("zp/raw_nocrc/c/4"));
    assert!(!ok && err.contains("Permission denied"), "a chunk of a 0600 shard must not be: {err}");
    assert!(std::fs::read(mnt.path().join("zp/raw_nocrc/c/4")).is_ok(), "its owner reads it");
    mounted.unmount().unwrap();

    let mounted = fuse::mount(fs_of(store.path()), mnt.path(), &settings()).unwrap();
    let (ok, err) = cat_as_nobody(&mnt.path().join("zp/raw_nocrc/c/2"));
    assert!(!ok && err.contains("Permission denied"), "without allow_other only the mounting user enters: {err}");
    mounted.unmount().unwrap();
}

#[test]
fn binary_mounts_in_the_background_and_unmounts() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let log = store.path().join("shardfs.log");
    // Damage one shard so that the daemon has something to log.
    std::fs::write(store.path().join("zp/raw_nocrc/c/1"), b"short").unwrap();
    let out = shardfs(&[
        "mount",
        store.path().to_str().unwrap(),
        mnt.path().to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
        "-o",
        "fsname=golden,noatime",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(mnt.path()), "mount must be ready when the command returns");
    let twin = golden().join("unsharded/zp/gzip_crc_end/c/4/0");
    assert_eq!(std::fs::read(mnt.path().join("zp/gzip_crc_end/c/4/0")).unwrap(), std::fs::read(twin).unwrap());
    let err = std::fs::read(mnt.path().join("zp/raw_nocrc/c/4")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let daemon = daemon_pid(mnt.path());
    assert!(running(daemon), "the mount's root names daemon {daemon}, which is not running");
    let out = shardfs(&["unmount", mnt.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(mnt.path()));
    assert!(!running(daemon), "unmount returned before daemon {daemon} exited");
    let log = std::fs::read_to_string(&log).unwrap();
    let shard = store.path().join("zp/raw_nocrc/c/1");
    assert!(log.lines().any(|l| l.contains(shard.to_str().unwrap())), "no log line names the shard:\n{log}");
}

#[test]
fn unmount_waits_for_the_daemon_so_a_remount_survives() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let (s, m) = (store.path().to_str().unwrap(), mnt.path().to_str().unwrap());
    for round in 0..5 {
        assert!(shardfs(&["mount", s, m]).status.success());
        let chunk = mnt.path().join("zp/raw_nocrc/c/3");
        std::fs::write(&chunk, format!("round {round}")).unwrap();
        let out = shardfs(&["unmount", m]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!is_mounted(mnt.path()));
    }
    assert!(shardfs(&["mount", "--read-only", s, m]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    assert!(is_mounted(mnt.path()), "the previous daemon unmounted the new mount");
    assert_eq!(std::fs::read(mnt.path().join("zp/raw_nocrc/c/3")).unwrap(), b"round 4");
    assert!(shardfs(&["unmount", m]).status.success());
}

#[test]
fn a_mount_unmounted_from_outside_leaves_the_next_mount_at_its_place_alone() {
    let Some(mnt) = mount_point() else { return };
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let first = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    assert!(Command::new("umount").arg(mnt.path()).status().unwrap().success());
    wait_for("the first session to end", || first.finished());
    let second = fuse::mount(fs_of(&golden().join("sharded")), mnt.path(), &settings()).unwrap();
    // What a daemon does when its mount goes away: join its session, then exit.
    first.join().unwrap();
    assert!(is_mounted(mnt.path()), "the ended session unmounted the mount that replaced it");
    assert!(std::fs::read(mnt.path().join("zarr.json")).is_ok());
    second.unmount().unwrap();
    assert!(!is_mounted(mnt.path()));
}

/// A foreground daemon serving the golden sharded store at `mnt`, once its mount is there.
fn foreground_daemon(mnt: &Path) -> std::process::Child {
    let store = golden().join("sharded");
    let child =
        Command::new(BIN).args(["mount", "-f", store.to_str().unwrap(), mnt.to_str().unwrap()]).spawn().unwrap();
    wait_for("the mount", || is_mounted(mnt));
    assert!(mnt.join("zp/nested/c/1/0").exists());
    child
}

#[test]
fn sigterm_unmounts_a_foreground_mount() {
    let Some(mnt) = mount_point() else { return };
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let mut child = foreground_daemon(mnt.path());
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn a_foreground_daemon_exits_when_unmounted_from_outside_and_ignores_sigusr1_from_outside() {
    let Some(mnt) = mount_point() else { return };
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let mut child = foreground_daemon(mnt.path());
    // The daemon waits for SIGUSR1 from its own session's last thread; one from elsewhere is not
    // the session ending.
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "SIGUSR1 from outside ended the daemon");
    assert!(mnt.path().join("zp/nested/c/1/0").exists());
    let out = Command::new("umount").arg(mnt.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn errors_before_mounting_are_one_line_and_mount_nothing() {
    let mnt = TempDir::new("mnt");
    let not_zarr = TempDir::new("plain");
    std::fs::write(not_zarr.path().join("file.txt"), b"hello").unwrap();
    let full = TempDir::new("full");
    std::fs::write(full.path().join("x"), b"x").unwrap();
    let v2 = TempDir::new("v2");
    std::fs::write(v2.path().join("zarr.json"), br#"{"zarr_format": 2}"#).unwrap();
    let store = golden().join("sharded");
    let m = mnt.path().to_str().unwrap();
    let cases: [(Vec<&str>, &str); 6] = [
        (vec!["mount", "/nonexistent/store", m], "/nonexistent/store"),
        (vec!["mount", not_zarr.path().to_str().unwrap(), m], "not a Zarr v3 store"),
        (vec!["mount", v2.path().to_str().unwrap(), m], "zarr_format is not 3"),
        (vec!["mount", store.to_str().unwrap(), full.path().to_str().unwrap()], "not empty"),
        (vec!["mount", store.to_str().unwrap(), "/nonexistent/mnt"], "/nonexistent/mnt"),
        (vec!["mount", store.to_str().unwrap(), m, "-o", "bogus"], "bogus"),
    ];
    for (args, expected) in cases {
        let out = shardfs(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!is_mounted(mnt.path()));
    }
    let out = shardfs(&["unmount", m]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a mount point"));
}

#[test]
fn demo_store_shows_its_features() {
    let dir = TempDir::new("demo");
    let store = shardfs::demo::write_store(dir.path()).unwrap();
    let fs = fs_of(&store);
    let (view, dirs) = walk_view(&fs);
    assert!(dirs.contains(&"survey/labels/c/6".to_string()), "partial edge chunks are shown");
    assert!(!view.contains_key("temperature/c/0/9"), "all-fill chunks stay empty");
    let chunk = &view["temperature/c/3/4"];
    assert_eq!(&chunk[..2], &[0x1f, 0x8b], "gzip inner chunks");
    assert_eq!(view["survey/labels/c/1/1"].len(), 64, "uncompressed 8x8 uint8 chunks, index at the start");
    let doc: serde_json::Value = serde_json::from_slice(&view["temperature/zarr.json"]).unwrap();
    assert_eq!(doc["chunk_grid"]["configuration"]["chunk_shape"], serde_json::json!([10, 10]));
    assert!(Path::new(&store).join("temperature/c/2/2").is_file());
}

#[test]
fn kill_9_loses_nothing_that_was_fsynced() {
    let Some(mnt) = mount_point() else { return };
    let store = sharded_copy();
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let (s, m) = (store.path().to_str().unwrap(), mnt.path().to_str().unwrap());
    let mut child = Command::new(BIN).args(["mount", "-f", "--commit-idle-ms", "3600000", s, m]).spawn().unwrap();
    wait_for("the mount", || is_mounted(mnt.path()));
    let mut durable = Vec::new();
    for (k, path) in ["zp/raw_nocrc/c/3", "zp/gzip_crc_end/c/2/0", "zp/zstd_start/c/1/0/0"].iter().enumerate() {
        let bytes = format!("durable {k}").into_bytes();
        let mut file = std::fs::File::create(mnt.path().join(path)).unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        file.sync_all().unwrap();
        durable.push((path.to_string(), bytes));
    }
    // Acknowledged by write(2) but never fsync'd: may be lost, must not damage anything.
    std::fs::write(mnt.path().join("zp/raw_nocrc/c/4"), b"volatile").unwrap();
    // SAFETY: killing our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let out = shardfs(&["unmount", m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = shardfs(&["check", s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_durable(store.path(), durable);
}

/// Checks that each (path, bytes) fsync'd through a mount of `store` before its daemon was
/// killed reads back from the store.
fn assert_durable(store: &Path, durable: Vec<(String, Vec<u8>)>) {
    let fs = fs_of(store);
    for (path, bytes) in durable {
        let mut ino = shardfs::fs::ROOT_INO;
        for name in path.split('/') {
            ino = fs.lookup(ino, name).unwrap().0;
        }
        assert_eq!(read_all(&fs, ino), bytes, "{path} was fsync'd before the kill");
    }
}

/// A store whose array `a` has `n` chunk files of 4 bytes in one directory (`a/c/<i>`), shards of
/// 4,096 written straight as files.
fn many_chunks(n: u64) -> TempDir {
    use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, assemble_shard};
    let dir = TempDir::new("many");
    let array = dir.path().join("a");
    std::fs::create_dir_all(array.join("c")).unwrap();
    std::fs::write(dir.path().join("zarr.json"), br#"{"zarr_format": 3, "node_type": "group"}"#).unwrap();
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [n * 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4096 * 4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
    });
    std::fs::write(array.join("zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    let spec = IndexSpec { entries: 4096, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    for shard in 0..n.div_ceil(4096) {
        let chunks: Vec<Option<Vec<u8>>> = (0..4096u64)
            .map(|i| (shard * 4096 + i < n).then(|| (shard * 4096 + i).to_le_bytes()[..4].to_vec()))
            .collect();
        std::fs::write(array.join("c").join(shard.to_string()), assemble_shard(&spec, &chunks)).unwrap();
    }
    dir
}

#[test]
fn inodes_the_kernel_forgets_mid_walk_are_forgotten_by_the_daemon_too() {
    let Some(mnt) = mount_point() else { return };
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("*** SKIPPING the forget test: dropping the kernel's caches needs root ***");
        return;
    }
    let store = many_chunks(20_000);
    let mounted = fuse::mount(fs_of(store.path()), mnt.path(), &settings()).unwrap();
    let drop_caches = || std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let chunks = mnt.path().join("a/c");
    // A stat walk, as `ls -l` makes it: the kernel holds an inode for every file it stats.
    let mut names: Vec<String> =
        std::fs::read_dir(&chunks).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort_by_key(|n| n.parse::<u64>().unwrap());
    assert_eq!(names.len(), 20_000);
    let (first, rest) = names.split_at(10_000);
    for name in first {
        assert_eq!(std::fs::metadata(chunks.join(name)).unwrap().len(), 4);
    }
    let held = mounted.filesystem().known_inodes();
    assert!(held >= 10_000, "the kernel holds what it stat'ed: {held}");
    // The kernel drops its caches mid-walk, forgets its inodes, and the daemon with it.
    drop_caches();
    wait_for("the daemon to forget the inodes the kernel dropped", || mounted.filesystem().known_inodes() < 100);
    for name in rest {
        assert_eq!(std::fs::read(chunks.join(name)).unwrap(), name.parse::<u64>().unwrap().to_le_bytes()[..4]);
    }
    assert!(mounted.filesystem().known_inodes() >= 10_000);
    drop_caches();
    wait_for("the daemon to forget the rest", || mounted.filesystem().known_inodes() < 100);
    drop(mounted);
}

/// Listings give a file's attributes (an inode the kernel keeps) only to a reader that stats what
/// it lists (`fs/listing_attributes.rs`); every other entry comes by name alone (node id 0). Both
/// kinds must read the same through the kernel: `ls -l`, `stat`, `ls -i`, `find`.
#[test]
fn listings_give_attributes_to_readers_that_stat() {
    use std::os::unix::fs::MetadataExt;
    let Some(mnt) = mount_point() else { return };
    let store = many_chunks(1000);
    for copy in ["b", "d"] {
        assert!(
            Command::new("cp")
                .arg("-r")
                .arg(store.path().join("a"))
                .arg(store.path().join(copy))
                .status()
                .unwrap()
                .success()
        );
    }
    let perm = std::fs::metadata(store.path().join("d/c/0")).unwrap().mode() & 0o777;
    let mounted = fuse::mount(fs_of(store.path()), mnt.path(), &settings()).unwrap();
    let held = || mounted.filesystem().known_inodes();
    let run = |cmd: &str| {
        let out = Command::new("sh").arg("-c").arg(cmd).current_dir(mnt.path()).output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };

    // find lists by name: right, and without an inode per file.
    assert_eq!(run("find a/c -type f | wc -l").trim(), "1000");
    assert!(held() < 100, "find made the kernel hold {} inodes", held());

    // A reader that stats a file of a directory it listed gets attributes with its next listings:
    // the kernel then holds every file of d/c before any of them is stat'ed.
    std::thread::scope(|s| {
        s.spawn(|| {
            let names = |dir: &str| std::fs::read_dir(mnt.path().join(dir)).unwrap().count();
            assert_eq!(names("b/c"), 1000);
            assert!(held() < 100, "a listing by name made the kernel hold {} inodes", held());
            assert_eq!(std::fs::metadata(mnt.path().join("b/c/7")).unwrap().len(), 4);
            let before = held();
            assert_eq!(names("d/c"), 1000);
            assert!(held() >= before + 1000, "the listing gave attributes: {before} -> {}", held());
            for i in 0..1000 {
                let meta = std::fs::metadata(mnt.path().join(format!("d/c/{i}"))).unwrap();
                assert_eq!((meta.len(), meta.is_file(), meta.mode() & 0o777), (4, true, perm), "d/c/{i}");
            }
        });
    });

    // Files listed by name alone (a/c, listed by find) stat right, with the number they were
    // listed under; `ls -l` and `stat` agree with the files' bytes.
    let long = run("ls -l a/c");
    let sizes: Vec<&str> = long.lines().skip(1).map(|l| l.split_whitespace().nth(4).unwrap()).collect();
    assert_eq!(sizes.len(), 1000);
    assert!(sizes.iter().all(|s| *s == "4"), "{long}");
    assert_eq!(run("stat -c %s:%F b/c/999 a/c/3"), "4:regular file\n4:regular file\n");
    let listed = run("ls -i -f b/c");
    for line in listed.lines().filter(|l| !l.ends_with(" .") && !l.ends_with(" ..")) {
        let (ino, name) = line.trim().split_once(' ').unwrap();
        let meta = std::fs::metadata(mnt.path().join("b/c").join(name)).unwrap();
        assert_eq!(ino.parse::<u64>().unwrap(), meta.ino(), "b/c/{name}: d_ino and st_ino");
        assert_eq!(
            std::fs::read(mnt.path().join("b/c").join(name)).unwrap(),
            name.parse::<u64>().unwrap().to_le_bytes()[..4]
        );
    }
    assert_eq!(run("find . -type f -name '[0-9]*' | wc -l").trim(), "3000");
    // Directories say 1 MiB blocks, so that readers list them in requests of 1 MiB (adapter.rs).
    assert_eq!(run("stat -c %o a/c"), "1048576\n");
    drop(mounted);
}

/// The `fuse` module's switch for FUSE over io_uring (Linux 6.14+), set to `on` for as long as this
/// lives and then put back; None where the kernel has no such switch or it cannot be set.
struct EnableUring(String);

impl EnableUring {
    const PATH: &str = "/sys/module/fuse/parameters/enable_uring";

    fn set(on: bool) -> Option<Self> {
        let before = std::fs::read_to_string(Self::PATH).ok()?;
        std::fs::write(Self::PATH, if on { "Y" } else { "N" }).ok()?;
        Some(Self(before.trim().to_string()))
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// The ring workers of daemon `pid` (threads `fuser-ring-N`) and how often they have woken.
fn ring_workers(pid: i32) -> (usize, u64) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let rings = tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-ring-")));
    rings.fold((0, 0), |(n, woken), t| {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let switches = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"));
        (n + 1, woken + switches.map_or(0, |s| s.trim().parse().unwrap()))
    })
}

/// `--io-uring` where the kernel offers FUSE over io_uring: the view is exact, its requests are
/// served from the rings, fsync'd writes survive kill -9, and the killed daemon's mount ends.
/// Where the kernel does not offer it, the same mount serves through /dev/fuse.
#[test]
fn io_uring_mounts_serve_exactly_and_fall_back_to_dev_fuse() {
    let Some(mnt) = mount_point() else { return };
    let (s, m) = (golden().join("sharded"), mnt.path().to_str().unwrap().to_string());
    let (twin, _) = walk_dir(&golden().join("unsharded"));
    let Some(off) = EnableUring::set(false) else {
        eprintln!("SKIPPED: no FUSE over io_uring here ({} cannot be set)", EnableUring::PATH);
        return;
    };
    let out = shardfs(&["mount", "--read-only", "--io-uring", s.to_str().unwrap(), &m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    assert_eq!(ring_workers(daemon_pid(mnt.path())).0, 0, "rings made where the kernel offers none");
    assert_same_tree(&walk_dir(mnt.path()).0, &twin);
    assert!(shardfs(&["unmount", &m]).status.success());
    drop(off);

    let _on = EnableUring::set(true).unwrap();
    let store = sharded_copy();
    let s = store.path().to_str().unwrap();
    let mut child = Command::new(BIN).args(["mount", "-f", "--io-uring", "--threads", "4", s, &m]).spawn().unwrap();
    wait_for("the mount", || is_mounted(mnt.path()));
    let pid = daemon_pid(mnt.path());
    let (rings, woken) = ring_workers(pid);
    assert!(rings >= 4, "{rings} ring workers for 4 threads");
    let (view, _) = walk_dir(mnt.path());
    assert_same_tree(&view, &twin);
    let mut durable = Vec::new();
    for (k, path) in ["zp/raw_nocrc/c/3", "zp/gzip_crc_end/c/2/0", "zp/zstd_start/c/1/0/0"].iter().enumerate() {
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + k as u32) as u8).collect();
        let mut file = std::fs::File::create(mnt.path().join(path)).unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        file.sync_all().unwrap();
        assert_eq!(std::fs::read(mnt.path().join(path)).unwrap(), bytes, "{path} read back");
        durable.push((path.to_string(), bytes));
    }
    // Each request wakes a ring worker (unless one is already awake), and no other thread.
    let served = view.len() as u64;
    assert!(
        ring_workers(pid).1 - woken >= served,
        "ring workers woke {} times for {served} files",
        ring_workers(pid).1 - woken
    );
    // SAFETY: killing our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // ENOTCONN, or ECONNABORTED once the daemon's guard has aborted the connection; a call caught
    // in the rings' teardown gets the kernel's ECANCELED, and the next one the same as others.
    let list = || std::fs::read_dir(mnt.path()).and_then(|mut d| d.next().transpose()).unwrap_err();
    let first = list();
    assert!(matches!(first.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)), "{first}");
    wait_for("ENOTCONN", || matches!(list().raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)));
    assert!(shardfs(&["unmount", &m]).status.success());
    let out = shardfs(&["check", s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_durable(store.path(), durable);
}

/// A daemon in a pid namespace of its own, as in a container or a CSI plugin without `hostPID`,
/// serving readers outside it: every request comes as thread 0. `ls -l` there still gets files'
/// attributes in listings once it stats (`fs/listing_attributes.rs`), and `shardfs unmount` from
/// outside neither waits on the process that the daemon's own pid names here nor fails.
#[test]
fn a_daemon_in_a_pid_namespace_of_its_own_serves_readers_outside_it() {
    use std::os::fd::AsRawFd;
    let Some(mnt) = mount_point() else { return };
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("*** SKIPPING the pid namespace test: unshare --pid needs root ***");
        return;
    }
    let store = many_chunks(1000);
    let copied = Command::new("cp").arg("-r").arg(store.path().join("a")).arg(store.path().join("b")).status();
    assert!(copied.unwrap().success());
    let _guard = UnmountGuard(mnt.path().to_path_buf());
    let (s, m) = (store.path().to_str().unwrap(), mnt.path().to_str().unwrap());
    let mut daemon = Command::new("unshare")
        .args(["--pid", "--fork", BIN, "mount", "-f", "--read-only", "--metrics-address", "127.0.0.1:0", s, m])
        .spawn()
        .unwrap();
    wait_for("the mount", || is_mounted(mnt.path()));
    let inodes = || {
        let out = shardfs(&["status", m]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text.lines().find(|l| l.starts_with("shardfs_inodes ")).expect("shardfs_inodes in status");
        line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() as i64
    };

    // find from outside lists by name: right, and without an inode per file.
    let found = Command::new("find").arg(mnt.path().join("b/c")).args(["-type", "f"]).output().unwrap();
    assert_eq!(String::from_utf8(found.stdout).unwrap().lines().count(), 1000);
    assert!(inodes() < 100, "find made the kernel hold {} inodes", inodes());

    // One reply of a listing of a/c (a small buffer: a small FUSE request), then a stat of each
    // file it gave, as `ls -l` does, then the rest of the listing: the rest comes with attributes.
    let dir = std::fs::File::open(mnt.path().join("a/c")).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut batch = || {
        // SAFETY: an open directory and a buffer of the length given.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
        assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        let (mut names, mut at) = (Vec::new(), 0);
        while at < n as usize {
            let len = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            let name = &buf[at + 19..at + len];
            names.push(String::from_utf8_lossy(&name[..name.iter().position(|b| *b == 0).unwrap()]).into_owned());
            at += len;
        }
        names
    };
    let first: Vec<String> = batch().into_iter().filter(|n| n != "." && n != "..").collect();
    assert!(!first.is_empty() && first.len() < 500, "{} names in the first reply", first.len());
    for name in &first {
        assert_eq!(std::fs::metadata(mnt.path().join("a/c").join(name)).unwrap().len(), 4);
    }
    let before = inodes();
    assert!(before < first.len() as i64 + 100, "a listing by name made the kernel hold {before} inodes");
    let mut rest = 0;
    loop {
        let names = batch();
        if names.is_empty() {
            break;
        }
        rest += names.iter().filter(|n| *n != "." && *n != "..").count();
    }
    drop(dir);
    assert_eq!(first.len() + rest, 1000);
    let after = inodes();
    assert!(after >= before + rest as i64 - 100, "the rest of the listing gave no attributes: {before} -> {after}");
    // And they are right, through `ls -l` too.
    let long = Command::new("ls").arg("-l").arg(mnt.path().join("a/c")).output().unwrap();
    let long = String::from_utf8(long.stdout).unwrap();
    let sizes: Vec<&str> = long.lines().skip(1).map(|l| l.split_whitespace().nth(4).unwrap()).collect();
    assert_eq!(sizes.len(), 1000);
    assert!(sizes.iter().all(|s| *s == "4"), "{long}");

    let start = Instant::now();
    let out = shardfs(&["unmount", m]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("another pid namespace"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "unmount took {:?}", start.elapsed());
    assert!(!is_mounted(mnt.path()));
    assert!(daemon.wait().unwrap().success());
}
