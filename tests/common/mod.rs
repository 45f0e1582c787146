//! Helpers shared by the integration tests: temporary directories, the golden stores, walking a
//! view through [`ShardFs`] and a plain directory tree, and the FUSE guard.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use shardfs::fs::Error;
use shardfs::fs::{DirEntry, ROOT_INO, ShardFs};
use shardfs::mount::{filesystem, open_store};
use shardfs::store::{Attr, Kind};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let path = std::env::temp_dir().join(format!("shardfs-test-{label}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The committed golden stores: `sharded` and its `unsharded` twin.
pub fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

/// Copies a directory tree (files and directories only).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A private copy of the golden sharded store, safe to damage.
pub fn sharded_copy() -> TempDir {
    let dir = TempDir::new("store");
    copy_tree(&golden().join("sharded"), dir.path());
    dir
}

/// The read-only filesystem of a store, as `--read-only` mounts build it.
pub fn fs_of(store: &Path) -> ShardFs {
    filesystem(open_store(store).unwrap(), shardfs::view::index_cache::IndexCache::new(1 << 20), None).unwrap()
}

/// The writable filesystem of a store, committing as `policy` says.
pub fn writable_fs(store: &Path, policy: shardfs::write::pending::Policy) -> ShardFs {
    let options = shardfs::fs::WriteOptions { policy, shard_new: None };
    filesystem(open_store(store).unwrap(), shardfs::view::index_cache::IndexCache::new(1 << 20), Some(options)).unwrap()
}

/// Every file of a view (path -> bytes) and every directory path, read through `fs`.
pub fn walk_view(fs: &ShardFs) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let mut files = BTreeMap::new();
    let mut dirs = Vec::new();
    walk_view_dir(fs, ROOT_INO, "", &mut files, &mut dirs);
    (files, dirs)
}

fn walk_view_dir(fs: &ShardFs, ino: u64, path: &str, files: &mut BTreeMap<String, Vec<u8>>, dirs: &mut Vec<String>) {
    let entries = list_plus(fs, ino);
    for (entry, plus) in entries.into_iter().filter(|(e, _)| e.name != "." && e.name != "..") {
        let child = if path.is_empty() { entry.name.clone() } else { format!("{path}/{}", entry.name) };
        let (child_ino, attr) = fs.lookup(ino, &entry.name).unwrap_or_else(|e| panic!("{child}: {e}"));
        assert_eq!(child_ino, entry.ino, "{child}: readdirplus and lookup disagree on the inode");
        assert_eq!(attr.kind, entry.kind, "{child}");
        let plus = plus.unwrap_or_else(|| panic!("{child}: readdirplus gave no attributes"));
        assert_eq!(
            (plus.kind, plus.size, plus.perm, plus.mtime),
            (attr.kind, attr.size, attr.perm, attr.mtime),
            "{child}"
        );
        if entry.kind == Kind::Dir {
            dirs.push(child.clone());
            walk_view_dir(fs, child_ino, &child, files, dirs);
        } else {
            let bytes = read_all(fs, child_ino);
            assert_eq!(bytes.len() as u64, attr.size, "{child}: size and content disagree");
            files.insert(child, bytes);
        }
    }
}

/// Every entry of directory `ino` as plain readdir gives it, `.` and `..` included.
pub fn list(fs: &ShardFs, ino: u64) -> Vec<DirEntry> {
    let dir = ino;
    let mut entries = Vec::new();
    fs.readdir(dir, 0, |e, _| {
        entries.push(e.clone());
        false
    })
    .unwrap();
    entries
}

/// Every entry of directory `ino` with the attributes readdirplus gives it, fetched a few entries
/// per call as the kernel's small reply buffers do; the listing must equal plain readdir's.
pub fn list_plus(fs: &ShardFs, ino: u64) -> Vec<(DirEntry, Option<Attr>)> {
    let plain = list(fs, ino);
    let dir = ino;
    let mut entries: Vec<(DirEntry, Option<Attr>)> = Vec::new();
    let mut offset = 0;
    loop {
        let before = entries.len();
        fs.readdirplus(dir, offset, |e, attr, next| {
            if entries.len() - before == 3 {
                return true;
            }
            entries.push((e.clone(), attr.copied()));
            offset = next;
            false
        })
        .unwrap();
        if entries.len() == before {
            break;
        }
    }
    // Inode numbers may differ where a file was replaced while the kernel held its old inode:
    // readdirplus then gives the new version's inode, readdir the name's usual number.
    let names =
        |entries: &mut dyn Iterator<Item = &DirEntry>| entries.map(|e| (e.name.clone(), e.kind)).collect::<Vec<_>>();
    assert_eq!(
        names(&mut entries.iter().map(|(e, _)| e)),
        names(&mut plain.iter()),
        "readdirplus and readdir disagree"
    );
    entries
}

/// The whole content of file `ino`, read in odd-sized pieces.
pub fn read_all(fs: &ShardFs, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino, shardfs::fs::OpenMode::default()).unwrap();
    let mut out = Vec::new();
    loop {
        let piece = fs.read(fh, out.len() as u64, 7).unwrap();
        if piece.is_empty() {
            break;
        }
        out.extend(piece);
    }
    fs.release(fh);
    out
}

/// Every file (path -> bytes) and directory of a plain directory tree.
pub fn walk_dir(root: &Path) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let mut files = BTreeMap::new();
    let mut dirs = Vec::new();
    walk_plain(root, "", &mut files, &mut dirs);
    (files, dirs)
}

fn walk_plain(dir: &Path, path: &str, files: &mut BTreeMap<String, Vec<u8>>, dirs: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().into_string().unwrap();
        let child = if path.is_empty() { name } else { format!("{path}/{name}") };
        if entry.file_type().unwrap().is_dir() {
            dirs.push(child.clone());
            walk_plain(&entry.path(), &child, files, dirs);
        } else {
            files.insert(child, std::fs::read(entry.path()).unwrap());
        }
    }
}

/// The view of `dir/sharded`, read through the filesystem logic, equals `dir/unsharded`: the same
/// files with the same bytes, and the same directories, except empty ones the twin's writer left
/// behind (tensorstore does), since the view lists only directories that lead to stored chunks.
pub fn assert_view_equals_twin(dir: &Path) {
    let (view, view_dirs) = walk_view(&fs_of(&dir.join("sharded")));
    let (twin, twin_dirs) = walk_dir(&dir.join("unsharded"));
    assert_same_tree(&view, &twin);
    let holds_files = |d: &String| twin.keys().any(|f| f.starts_with(&format!("{d}/")));
    assert_eq!(view_dirs, twin_dirs.into_iter().filter(holds_files).collect::<Vec<_>>());
}

/// Compares a view with its unsharded twin: the same files, chunk bytes equal, documents equal as
/// JSON values.
pub fn assert_same_tree(view: &BTreeMap<String, Vec<u8>>, twin: &BTreeMap<String, Vec<u8>>) {
    let view_keys: Vec<_> = view.keys().collect();
    let twin_keys: Vec<_> = twin.keys().collect();
    assert_eq!(view_keys, twin_keys, "the view's files differ from the unsharded twin's");
    for (path, bytes) in view {
        if path.ends_with(".json") {
            let a: serde_json::Value = serde_json::from_slice(bytes).unwrap();
            let b: serde_json::Value = serde_json::from_slice(&twin[path]).unwrap();
            assert_eq!(a, b, "{path}");
        } else {
            assert!(bytes == &twin[path], "{path}: chunk bytes differ");
        }
    }
}

/// The `shardfs` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_shardfs");

/// `shardfs check STORE EXTRA...`, run as users run it.
pub fn check_store(store: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN).arg("check").arg(store).args(extra).output().unwrap()
}

/// The content of view file `path`, or the error of looking it up, opening or reading it.
pub fn read_path(fs: &ShardFs, path: &str) -> Result<Vec<u8>, Error> {
    let ino = lookup(fs, path)?;
    let fh = fs.open(ino, shardfs::fs::OpenMode::default())?;
    let mut out = Vec::new();
    let read = loop {
        match fs.read(fh, out.len() as u64, 1 << 20) {
            Ok(piece) if piece.is_empty() => break Ok(out),
            Ok(piece) => out.extend(piece),
            Err(e) => break Err(e),
        }
    };
    fs.release(fh);
    read
}

/// A fresh mount point for a test that mounts, or `None` where FUSE cannot be used (see
/// [`fuse_available`]: loudly skipped, or a failure with `SHARDFS_REQUIRE_FUSE=1`).
pub fn mount_point() -> Option<TempDir> {
    fuse_available().then(|| TempDir::new("mnt"))
}

/// True when FUSE can be used here. When it cannot, says so loudly and returns false, unless
/// `SHARDFS_REQUIRE_FUSE=1`, which makes a missing FUSE a failure instead of a skip.
pub fn fuse_available() -> bool {
    let usable = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    if !usable {
        let required = std::env::var("SHARDFS_REQUIRE_FUSE").is_ok_and(|v| v == "1");
        assert!(!required, "SHARDFS_REQUIRE_FUSE=1 but /dev/fuse cannot be opened");
        eprintln!("\n*** SKIPPING A FUSE TEST: /dev/fuse cannot be opened on this machine ***\n");
    }
    usable
}

/// True while `path` is a mount point in /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let target = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(target.to_str().unwrap()))
}

/// Unmounts `path` on drop if something left it mounted, so that no test leaves a stale mount.
pub struct UnmountGuard(pub PathBuf);

impl Drop for UnmountGuard {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = shardfs::mount::unmount(&self.0);
        }
    }
}

/// Looks up a `/`-separated view path.
pub fn lookup(fs: &ShardFs, path: &str) -> Result<u64, Error> {
    let mut ino = ROOT_INO;
    for name in path.split('/') {
        ino = fs.lookup(ino, name)?.0;
    }
    Ok(ino)
}

/// Writes a whole file as `mkdir -p` plus `cat > path` would.
pub fn write_file(fs: &ShardFs, path: &str, bytes: &[u8]) {
    let (dir, name) = path.rsplit_once('/').unwrap();
    let mut made = String::new();
    for part in dir.split('/') {
        let parent = if made.is_empty() { ROOT_INO } else { lookup(fs, &made).unwrap() };
        made = if made.is_empty() { part.to_string() } else { format!("{made}/{part}") };
        if lookup(fs, &made).is_err() {
            match fs.mkdir(parent, part, 0o755) {
                Ok(_) | Err(Error::Exists) => {}
                Err(e) => panic!("mkdir {made}: {e}"),
            }
        }
    }
    let fh = match lookup(fs, path) {
        Ok(file) => fs.open(file, shardfs::fs::OpenMode { write: true, truncate: true, append: false }).unwrap(),
        Err(_) => {
            fs.create(
                lookup(fs, dir).unwrap(),
                name,
                0o644,
                shardfs::fs::OpenMode { write: true, truncate: true, append: false },
            )
            .unwrap()
            .2
        }
    };
    fs.write(fh, 0, bytes).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
}

/// The bytes of `path` in the unsharded twin of the golden store.
pub fn twin(path: &str) -> Vec<u8> {
    std::fs::read(golden().join("unsharded").join(path)).unwrap()
}

/// Asserts that looking up `path` fails as damage, naming `shard`.
pub fn assert_damaged(fs: &ShardFs, path: &str, shard: &Path) {
    match lookup(fs, path) {
        Err(Error::Damaged(msg)) => assert!(msg.contains(&shard.display().to_string()), "{msg}"),
        other => panic!("{path}: expected a damaged-shard error, got {other:?}"),
    }
}

/// Overwrites bytes of a file at `offset` (negative: from the end).
pub fn patch(path: &Path, offset: i64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len() as i64;
    let at = if offset < 0 { len + offset } else { offset };
    file.write_all_at(bytes, at as u64).unwrap();
}

/// What a [`Hooked`] store runs at its moment.
type Hook = Box<dyn FnOnce() + Send>;

/// A store forwarding to `inner`, for tests that play another writer or a store of another kind:
/// the hook runs once, just before this store's first write to its key (a put, a delete, opening
/// it for writing in place), and `can_append: false` makes a store that cannot append, as an
/// object store cannot.
pub struct Hooked<S> {
    pub inner: S,
    pub can_append: bool,
    key: String,
    hook: std::sync::Mutex<Option<Hook>>,
    /// A key, and what runs just after this store first opens it for reading.
    opened: std::sync::Mutex<Option<(String, Hook)>>,
    /// How many files were opened for reading.
    pub opens: std::sync::atomic::AtomicUsize,
}

impl<S: shardfs::store::Store> Hooked<S> {
    pub fn new(inner: S) -> Self {
        Hooked {
            can_append: inner.can_append(),
            inner,
            key: String::new(),
            hook: Default::default(),
            opened: Default::default(),
            opens: Default::default(),
        }
    }

    pub fn no_append(inner: S) -> Self {
        Hooked { can_append: false, ..Self::new(inner) }
    }

    /// Runs `hook` just before the first write to `key`.
    pub fn before_writing(self, key: &str, hook: impl FnOnce() + Send + 'static) -> Self {
        Hooked { key: key.to_string(), hook: std::sync::Mutex::new(Some(Box::new(hook))), ..self }
    }

    /// Runs `hook` just after the first time `key` is opened for reading.
    pub fn after_opening(self, key: &str, hook: impl FnOnce() + Send + 'static) -> Self {
        Hooked { opened: std::sync::Mutex::new(Some((key.to_string(), Box::new(hook)))), ..self }
    }

    fn writing(&self, key: &str) {
        if key == self.key
            && let Some(hook) = self.hook.lock().unwrap().take()
        {
            hook();
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Hooked<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Hooked({:?})", self.inner)
    }
}

impl<S: shardfs::store::Store> shardfs::store::Store for Hooked<S> {
    fn describe(&self, key: &str) -> String {
        self.inner.describe(key)
    }
    fn url(&self, key: &str) -> String {
        self.inner.url(key)
    }
    fn attr(&self, key: &str) -> shardfs::store::Result<Attr> {
        self.inner.attr(key)
    }
    fn list(&self, dir: &str) -> shardfs::store::Result<(Vec<(String, Kind)>, shardfs::store::Stamp)> {
        self.inner.list(dir)
    }
    fn open(&self, key: &str) -> shardfs::store::Result<Box<dyn shardfs::store::Object>> {
        let opened = self.inner.open(key);
        self.opens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut hook = self.opened.lock().unwrap();
        if hook.as_ref().is_some_and(|(k, _)| k == key)
            && let Some((_, hook)) = hook.take()
        {
            hook();
        }
        opened
    }
    fn read_link(&self, key: &str) -> shardfs::store::Result<PathBuf> {
        self.inner.read_link(key)
    }
    fn space(&self) -> shardfs::store::Result<shardfs::store::Space> {
        self.inner.space()
    }
    fn put(
        &self,
        key: &str,
        pieces: &[&[u8]],
        mode: shardfs::store::PutMode,
    ) -> shardfs::store::Result<Option<shardfs::store::Stamp>> {
        self.writing(key);
        self.inner.put(key, pieces, mode)
    }
    fn delete(&self, key: &str) -> shardfs::store::Result<()> {
        self.writing(key);
        self.inner.delete(key)
    }
    fn delete_version(&self, key: &str, stamp: &shardfs::store::Stamp) -> shardfs::store::Result<bool> {
        self.writing(key);
        self.inner.delete_version(key, stamp)
    }
    fn rename(&self, from: &str, to: &str) -> shardfs::store::Result<()> {
        self.inner.rename(from, to)
    }
    fn make_dir(&self, key: &str, mode: u32) -> shardfs::store::Result<()> {
        self.inner.make_dir(key, mode)
    }
    fn make_dirs(&self, key: &str) -> shardfs::store::Result<()> {
        self.inner.make_dirs(key)
    }
    fn remove_dir(&self, key: &str) -> shardfs::store::Result<()> {
        self.inner.remove_dir(key)
    }
    fn can_append(&self) -> bool {
        self.can_append
    }
    fn open_file(
        &self,
        key: &str,
        how: shardfs::store::OpenHow,
    ) -> shardfs::store::Result<Box<dyn shardfs::store::OpenFile>> {
        assert!(self.can_append, "{key}: a store that cannot append was asked to write in place");
        self.writing(key);
        self.inner.open_file(key, how)
    }
    fn lock(&self, slot: u64) -> shardfs::store::Result<Box<dyn shardfs::store::Lock>> {
        self.inner.lock(slot)
    }
}
