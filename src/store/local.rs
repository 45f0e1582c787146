//! A store in a directory of a local filesystem. Symbolic links are reported, never followed:
//! every key is resolved from the root's descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so no key reaches outside the store, even through a link or a `..`
//! swapped in while the mount runs (such a key fails with ELOOP or EXDEV). Whole-file writes go to
//! `__shardfs/tmp/` first (named after the writing process, so that [`Store::clean_up`] removes
//! only what processes that are gone left there), are fsync'd and renamed over the key (without
//! replacing anything for [`PutMode::Create`]), and the directory is fsync'd. Locks are
//! open-file-description byte-range locks (`F_OFD_SETLKW`) on the one file `__shardfs/lock`, one
//! byte per lock slot.
//!
//! At a clean unmount [`Store::tidy_private_dir`] removes the empty directories of `__shardfs/`,
//! the lock file and `__shardfs/` itself. Removing a lock file another process may be about to
//! lock would let two processes lock different files, so both sides keep a protocol: the remover
//! unlinks it only while holding a lock on the whole file (which fails at once while anyone holds
//! a slot), and a locker that got its slot checks that the file it locked is still linked, and
//! starts again with a new file if not. A file or directory the remover took away between a
//! writer's creating a directory and using it (ENOENT) makes that writer create it again.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::RwLockWriteGuard;

use super::{Attr, Error, Kind, Lock, Object, OpenFile, OpenHow, PRIVATE_DIR, PutMode, Result, Space, Stamp, Store};
use super::{join, lock, parent_key};
use crate::metrics;

/// Runs `request`, counted as one request of `kind` to the store (the metrics; what an object
/// store's GET, HEAD or PUT is, a system call or a few here).
fn metered<T>(kind: &'static str, request: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let done = request();
    let outcome = match &done {
        Ok(_) => "ok",
        Err(Error::NotFound(_)) => "not_found",
        Err(Error::Changed(_)) => "precondition_failed",
        Err(_) => "error",
    };
    metrics::request(kind, outcome, start.elapsed());
    done
}

/// Where whole-file writes are prepared before they are renamed over their key.
pub fn tmp_dir() -> String {
    format!("{PRIVATE_DIR}/tmp")
}

fn attr_of(m: &std::fs::Metadata) -> Attr {
    Attr {
        kind: kind_of(m.file_type()),
        size: m.size(),
        perm: (m.mode() & 0o7777) as u16,
        uid: m.uid(),
        gid: m.gid(),
        nlink: m.nlink() as u32,
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        stamp: stamp_of(m.dev(), m.ino(), m.size(), (m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec())),
    }
}

/// A local file's version: its identity (device, inode), size and modification and change times.
fn stamp_of(dev: u64, ino: u64, size: u64, mtime: (i64, i64), ctime: (i64, i64)) -> Stamp {
    let nanos = |(secs, nsecs): (i64, i64)| (secs as u64).wrapping_mul(1_000_000_000).wrapping_add(nsecs as u64);
    Stamp::new([dev, ino, size, nanos(mtime), nanos(ctime)])
}

fn kind_of(ft: std::fs::FileType) -> Kind {
    if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Other
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs as u64);
    if secs >= 0 { UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos } else { UNIX_EPOCH }
}

/// A store rooted at a local directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    /// The root, opened once: every key is resolved beneath this descriptor.
    root_fd: Arc<OwnedFd>,
}

/// A store path that the standard library's path functions can use without leaving the store:
/// `/proc/self/fd/N/name`, where N is the key's parent directory, opened beneath the root. Only the
/// last component is resolved by name, so it is opened with `O_NOFOLLOW` where a link could sit.
#[derive(Debug)]
struct Beneath {
    _parent: OwnedFd,
    path: PathBuf,
}

impl Deref for Beneath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl LocalStore {
    /// Opens the store at `root`, which must be a directory.
    pub fn open(root: &Path) -> io::Result<Self> {
        let root = root.canonicalize()?;
        let dir = File::open(&root)?;
        if !dir.metadata()?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory"));
        }
        Ok(LocalStore { root, root_fd: Arc::new(dir.into()) })
    }

    /// The local path of `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        if key.is_empty() { self.root.clone() } else { self.root.join(key) }
    }

    /// The error of an I/O call on `key`; the message is built only when there is one.
    fn fail<'a>(&'a self, key: &'a str) -> impl Fn(io::Error) -> Error + 'a {
        move |e| Error::io(self.describe(key), e)
    }

    /// Opens `key` beneath the root with `flags`, crossing no symbolic link and no `..` out.
    fn open_beneath(&self, key: &str, flags: i32) -> io::Result<OwnedFd> {
        let rel = CString::new(if key.is_empty() { "." } else { key })?;
        // SAFETY: open_how is plain data; all-zero is its documented default.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        loop {
            // SAFETY: a valid directory descriptor, C string and open_how of the size passed.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.root_fd.as_raw_fd(),
                    rel.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if fd >= 0 {
                // SAFETY: openat2 returned a new descriptor that nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            }
            let error = io::Error::last_os_error();
            // EAGAIN: a rename raced with the resolution; the kernel asks for a retry.
            if !matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                return Err(error);
            }
        }
    }

    /// `key` as a path the standard library can use, confined to the store (see [`Beneath`]).
    fn beneath(&self, key: &str) -> io::Result<Beneath> {
        let (parent, name) = (parent_key(key), key.rsplit('/').next().unwrap_or(key));
        let parent = self.open_beneath(parent, libc::O_PATH | libc::O_DIRECTORY)?;
        let mut path = PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd()));
        if !name.is_empty() {
            path.push(name);
        }
        Ok(Beneath { _parent: parent, path })
    }

    /// fsyncs directory `key`, making the creation, rename or removal of its entries durable.
    fn sync_dir(&self, key: &str) -> io::Result<()> {
        File::from(self.open_beneath(key, libc::O_RDONLY | libc::O_DIRECTORY)?).sync_all()
    }

    /// Directory `key`, opened to be fsync'd after an entry leaves it: through this handle the
    /// removal is made durable even where the directory, left empty, is removed meanwhile (a
    /// commit that deleted a sibling shard removes the directories it left empty).
    fn dir_to_sync(&self, key: &str) -> io::Result<File> {
        self.open_beneath(key, libc::O_RDONLY | libc::O_DIRECTORY).map(File::from)
    }

    fn create_dirs(&self, key: &str) -> io::Result<()> {
        let mut at = String::new();
        for part in key.split('/').filter(|p| !p.is_empty()) {
            at = join(&at, part);
            match std::fs::create_dir(&*self.beneath(&at)?) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes `pieces` to a new file and renames it to `key`: the new file's version, or
    /// `Err(())` when `mode` refuses the file at `key`.
    fn put_io(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> io::Result<std::result::Result<Stamp, ()>> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        self.create_dirs(&tmp_dir())?;
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let tmp_key = join(&tmp_dir(), &format!("{}-{n}", std::process::id()));
        let tmp = self.beneath(&tmp_key)?;
        let file = OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(&*tmp)?;
        let written = super::write_gathered(0, pieces, |piece, at| file.write_all_at(piece, at))
            .and_then(|()| file.sync_all())
            .and_then(|()| self.create_dirs(parent_key(key)));
        let target = written.and_then(|()| self.beneath(key));
        let target = match target {
            Ok(target) => target,
            Err(e) => {
                let _ = std::fs::remove_file(&*tmp);
                return Err(e);
            }
        };
        let current = match self.attr_io(key) {
            Ok(attr) => Some(attr.stamp),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                let _ = std::fs::remove_file(&*tmp);
                return Err(e);
            }
        };
        // Create is exact (RENAME_NOREPLACE); Update is exact among writers that hold the key's
        // lock, as every writer in shardfs does.
        let allowed = match mode {
            PutMode::Overwrite | PutMode::Create => true,
            PutMode::Update(stamp) => current == Some(stamp),
        };
        let renamed = if !allowed {
            Err(io::Error::from_raw_os_error(libc::EEXIST))
        } else if mode == PutMode::Create {
            rename_noreplace(&tmp, &target)
        } else {
            std::fs::rename(&*tmp, &*target)
        };
        if let Err(e) = renamed {
            std::fs::remove_file(&*tmp)?;
            return if e.raw_os_error() == Some(libc::EEXIST) { Ok(Err(())) } else { Err(e) };
        }
        self.sync_dir(parent_key(key))?;
        // After the rename, which changed its ctime: the version an open of `key` finds.
        Ok(Ok(attr_of(&file.metadata()?).stamp))
    }

    fn attr_io(&self, key: &str) -> io::Result<Attr> {
        let fd = self.open_beneath(key, libc::O_PATH | libc::O_NOFOLLOW)?;
        File::from(fd).metadata().map(|m| attr_of(&m))
    }
}

impl Store for LocalStore {
    fn describe(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }

    fn url(&self, key: &str) -> String {
        self.describe(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        metered("head", || self.attr_io(key).map_err(self.fail(key)))
    }

    /// One `fstatat` from the root. That lookup is not confined, but it is trusted only to say
    /// "the same inode, unchanged", about a file already read through the confined path; any
    /// other answer (a change, an error, a link on the way) is `false`, and the caller takes the
    /// confined path.
    fn is_unchanged(&self, key: &str, stamp: &Stamp) -> bool {
        let Ok(rel) = CString::new(if key.is_empty() { "." } else { key }) else { return false };
        // SAFETY: stat is plain data, filled in by the kernel.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory descriptor, a C string and a properly sized out-parameter.
        let done = unsafe { libc::fstatat(self.root_fd.as_raw_fd(), rel.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        done == 0
            && stamp_of(
                st.st_dev,
                st.st_ino,
                st.st_size as u64,
                (st.st_mtime, st.st_mtime_nsec),
                (st.st_ctime, st.st_ctime_nsec),
            ) == *stamp
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        metered("list", || {
            let fail = self.fail(dir);
            let opened = File::from(self.open_beneath(dir, libc::O_RDONLY | libc::O_DIRECTORY).map_err(&fail)?);
            let stamp = attr_of(&opened.metadata().map_err(&fail)?).stamp;
            let mut out = Vec::new();
            // The descriptor names the directory itself, so reading it through /proc follows no link
            // of the store.
            for entry in std::fs::read_dir(format!("/proc/self/fd/{}", opened.as_raw_fd())).map_err(&fail)? {
                let entry = entry.map_err(&fail)?;
                let Ok(name) = entry.file_name().into_string() else {
                    log::warn!("{}: skipping an entry whose name is not UTF-8", self.describe(dir));
                    continue;
                };
                out.push((name, kind_of(entry.file_type().map_err(&fail)?)));
            }
            Ok((out, stamp))
        })
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        metered("open", || {
            let fail = self.fail(key);
            // O_NONBLOCK: opening a FIFO that sits in the store must not stall a worker thread.
            let fd = self.open_beneath(key, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK).map_err(&fail)?;
            let file = File::from(fd);
            let attr = attr_of(&file.metadata().map_err(&fail)?);
            Ok(Box::new(LocalObject { file, attr, place: self.describe(key) }) as Box<dyn Object>)
        })
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        self.beneath(key).and_then(|path| std::fs::read_link(&*path)).map_err(self.fail(key))
    }

    fn space(&self) -> Result<Space> {
        let fail = self.fail("");
        let path = CString::new(self.root.as_os_str().as_bytes()).map_err(|e| fail(e.into()))?;
        // SAFETY: statvfs is plain data, filled in by the kernel.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: path is a valid C string and st a properly sized out-parameter.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(fail(io::Error::last_os_error()));
        }
        Ok(Space {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
            frsize: st.f_frsize as u32,
        })
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        let stored = metered("put", || {
            // A directory put_io made can vanish before it is used when another process tidies
            // `__shardfs/` at its unmount (see the module doc); the next attempt makes it again.
            let mut attempts = 0;
            let done = loop {
                attempts += 1;
                match self.put_io(key, pieces, mode) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < RECREATE_ATTEMPTS => {}
                    done => break done,
                }
            };
            match done.map_err(self.fail(key))? {
                Ok(stamp) => Ok(Some(stamp)),
                Err(()) => Err(Error::Changed(self.describe(key))),
            }
        });
        if stored.is_ok() {
            metrics::sent(pieces.iter().map(|p| p.len() as u64).sum());
        }
        stored
    }

    fn delete(&self, key: &str) -> Result<()> {
        metered("delete", || {
            let fail = self.fail(key);
            let parent = self.dir_to_sync(parent_key(key)).map_err(&fail)?;
            self.beneath(key).and_then(|path| std::fs::remove_file(&*path)).map_err(&fail)?;
            parent.sync_all().map_err(fail)
        })
    }

    fn discard(&self, key: &str) -> Result<()> {
        self.beneath(key).and_then(|path| std::fs::remove_file(&*path)).map_err(self.fail(key))
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        metered("rename", || {
            let fail = self.fail(from);
            let target = self.beneath(to).map_err(self.fail(to))?;
            let moves = parent_key(from) != parent_key(to);
            let source_dir = moves.then(|| self.dir_to_sync(parent_key(from))).transpose().map_err(&fail)?;
            self.beneath(from).and_then(|path| std::fs::rename(&*path, &*target)).map_err(&fail)?;
            self.sync_dir(parent_key(to)).map_err(self.fail(to))?;
            if let Some(source_dir) = source_dir {
                source_dir.sync_all().map_err(&fail)?;
            }
            Ok(())
        })
    }

    fn link(&self, from: &str, to: &str) -> Result<()> {
        let target = self.beneath(to).map_err(self.fail(to))?;
        match self.beneath(from).and_then(|path| std::fs::hard_link(&*path, &*target)) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(Error::Changed(self.describe(to))),
            Err(e) => Err(self.fail(from)(e)),
            Ok(()) => self.sync_dir(parent_key(to)).map_err(self.fail(to)),
        }
    }

    fn make_dir(&self, key: &str, mode: u32) -> Result<()> {
        self.beneath(key)
            .and_then(|path| std::fs::DirBuilder::new().mode(mode & 0o7777).create(&*path))
            .map_err(self.fail(key))
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        self.create_dirs(key).map_err(self.fail(key))
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        self.beneath(key).and_then(|path| std::fs::remove_dir(&*path)).map_err(self.fail(key))
    }

    fn can_append(&self) -> bool {
        true
    }

    fn open_file(&self, key: &str, how: OpenHow) -> Result<Box<dyn OpenFile>> {
        let fail = self.fail(key);
        let mut options = OpenOptions::new();
        options.read(true).write(true).truncate(how.truncate).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        if let Some(mode) = how.create {
            options.create(true).mode(mode & 0o7777);
        }
        let file = self.beneath(key).and_then(|path| options.open(&*path)).map_err(fail)?;
        Ok(Box::new(LocalFile { file, place: self.describe(key) }))
    }

    fn clean_up(&self) -> Result<Vec<String>> {
        let tmp = tmp_dir();
        let names = match self.list(&tmp) {
            Ok((entries, _)) => entries.into_iter().map(|(name, _)| name),
            Err(Error::NotFound(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut removed = Vec::new();
        for name in names {
            let writer = name.split('-').next().and_then(|pid| pid.parse::<i32>().ok());
            if writer.is_some_and(alive) {
                continue;
            }
            let key = join(&tmp, &name);
            match self.discard(&key) {
                Ok(()) | Err(Error::NotFound(_)) => removed.push(self.describe(&key)),
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>> {
        let in_process = lock::writing(slot);
        let lock_key = lock_key();
        let fail = self.fail(&lock_key);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let file = self.create_dirs(PRIVATE_DIR).and_then(|()| self.beneath(&lock_key)).and_then(|path| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&*path)
            });
            let file = match file {
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < RECREATE_ATTEMPTS => continue,
                file => file.map_err(&fail)?,
            };
            set_lock(&file, slot, libc::F_WRLCK as i16).map_err(&fail)?;
            // Unlinked while this waited (a tidying unmount): the lock file is the linked one.
            if file.metadata().map_err(&fail)?.nlink() > 0 {
                return Ok(Box::new(LocalLock { file, _in_process: in_process }));
            }
        }
    }

    fn tidy_private_dir(&self) -> Result<()> {
        self.remove_empty_dirs(PRIVATE_DIR)?;
        self.remove_unused_lock_file()?;
        self.remove_if_empty(PRIVATE_DIR)
    }
}

/// How often a write starts again when a directory it made was removed before it was used.
const RECREATE_ATTEMPTS: u32 = 8;

/// The file whose bytes are the lock slots.
fn lock_key() -> String {
    join(PRIVATE_DIR, "lock")
}

impl LocalStore {
    /// Removes every empty directory below `dir`, deepest first; files are never touched.
    fn remove_empty_dirs(&self, dir: &str) -> Result<()> {
        let entries = match self.list(dir) {
            Ok((entries, _)) => entries,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        for (name, kind) in entries {
            if kind == Kind::Dir {
                let key = join(dir, &name);
                self.remove_empty_dirs(&key)?;
                self.remove_if_empty(&key)?;
            }
        }
        Ok(())
    }

    /// rmdir, which leaves a directory that is not empty (another process's files) alone.
    fn remove_if_empty(&self, key: &str) -> Result<()> {
        match self.beneath(key).and_then(|path| std::fs::remove_dir(&*path)) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOENT)) => Ok(()),
            done => done.map_err(self.fail(key)),
        }
    }

    /// Unlinks the lock file if no process holds a lock slot in it, under a lock on the whole
    /// file, which every locker's check of the link count respects (see the module doc).
    fn remove_unused_lock_file(&self) -> Result<()> {
        let key = lock_key();
        let fail = self.fail(&key);
        let opened = self
            .beneath(&key)
            .and_then(|path| OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(&*path));
        let file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(fail(e)),
        };
        if !try_lock_whole(&file).map_err(&fail)? {
            return Ok(());
        }
        let ours = file.metadata().map_err(&fail)?;
        let linked = self.beneath(&key).and_then(|path| std::fs::symlink_metadata(&*path));
        let same = linked.is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino());
        if ours.nlink() > 0 && same {
            self.beneath(&key).and_then(|path| std::fs::remove_file(&*path)).map_err(&fail)?;
        }
        // Closing `file` releases the lock: a locker waiting on this inode then finds it unlinked.
        Ok(())
    }
}

/// `rename(2)` that fails with EEXIST instead of replacing a file at `to`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (CString::new(from.as_os_str().as_bytes())?, CString::new(to.as_os_str().as_bytes())?);
    // SAFETY: two valid C strings; AT_FDCWD with the absolute /proc paths of Beneath.
    let done =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// True while process `pid` exists (also when it is another user's).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A file version opened for reading.
#[derive(Debug)]
struct LocalObject {
    file: File,
    attr: Attr,
    place: String,
}

impl Object for LocalObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        metered("get", || {
            loop {
                match self.file.read_at(buf, offset) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(n) => {
                        metrics::received(n as u64);
                        return Ok(n);
                    }
                    Err(e) => return Err(Error::io(self.place.clone(), e)),
                }
            }
        })
    }

    fn place(&self) -> String {
        self.place.clone()
    }

    /// As object_store's local store makes it (inode, modification time in microseconds, size),
    /// which is what Icechunk records for local files.
    fn e_tag(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let meta = self.file.metadata().ok()?;
        let micros = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_micros();
        Some(format!("{:x}-{micros:x}-{:x}", meta.ino(), meta.len()))
    }
}

/// A file opened for writing in place.
#[derive(Debug)]
struct LocalFile {
    file: File,
    place: String,
}

impl LocalFile {
    fn fail(&self, e: io::Error) -> Error {
        Error::io(self.place.clone(), e)
    }
}

impl OpenFile for LocalFile {
    fn attr(&self) -> Result<Attr> {
        self.file.metadata().map(|m| attr_of(&m)).map_err(|e| self.fail(e))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        metered("get", || {
            let n = self.file.read_at(buf, offset).map_err(|e| self.fail(e))?;
            metrics::received(n as u64);
            Ok(n)
        })
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        metered("write", || {
            self.file.write_all_at(data, offset).map_err(|e| self.fail(e))?;
            metrics::sent(data.len() as u64);
            Ok(())
        })
    }

    fn append(&self, data: &[u8]) -> Result<()> {
        let end = self.file.metadata().map_err(|e| self.fail(e))?.len();
        self.write_at(data, end)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(|e| self.fail(e))
    }

    fn sync(&self) -> Result<()> {
        metered("sync", || self.file.sync_all().map_err(|e| self.fail(e)))
    }
}

/// A held lock slot: the OFD lock on `__shardfs/lock`, and the in-process stripe.
#[derive(Debug)]
struct LocalLock {
    file: File,
    _in_process: RwLockWriteGuard<'static, ()>,
}

impl Lock for LocalLock {}

fn set_lock(file: &File, slot: u64, kind: i16) -> io::Result<()> {
    // SAFETY: flock is plain data; every field the kernel reads is set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = slot as libc::off_t;
    lock.l_len = 1;
    loop {
        // SAFETY: a valid descriptor and a fully initialised flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &lock) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Takes a write lock on every byte of `file` without waiting: false when a slot is held.
fn try_lock_whole(file: &File) -> io::Result<bool> {
    // SAFETY: flock is plain data; every field the kernel reads is set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    // l_start 0 and l_len 0: the whole file, however far it grows.
    loop {
        // SAFETY: a valid descriptor and a fully initialised flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => return Ok(false),
            Some(libc::EINTR) => {}
            _ => return Err(err),
        }
    }
}

impl Drop for LocalLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock as well; unlocking first makes it explicit.
        let _ = set_lock(&self.file, 0, libc::F_UNLCK as i16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_store(label: &str) -> (PathBuf, LocalStore) {
        let dir = std::env::temp_dir().join(format!("shardfs-local-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = LocalStore::open(&dir).unwrap();
        (dir, store)
    }

    #[test]
    fn tidying_removes_only_what_no_process_uses_and_locking_survives_it() {
        let (dir, store) = temp_store("tidy");
        let other = LocalStore::open(&dir).unwrap();
        store.put("a/x", &[b"x"], PutMode::Overwrite).unwrap();
        store.put(&format!("{PRIVATE_DIR}/journal/1-0"), &[b"record"], PutMode::Create).unwrap();
        std::fs::create_dir_all(dir.join(PRIVATE_DIR).join("scratch/deeper")).unwrap();
        let held = store.lock(3).unwrap();
        other.tidy_private_dir().unwrap();
        let private = dir.join(PRIVATE_DIR);
        assert!(private.join("lock").exists(), "a held lock file stays");
        assert!(private.join("journal/1-0").exists(), "a record is never removed");
        assert!(!private.join("scratch").exists() && !private.join("tmp").exists(), "empty directories go");
        drop(held);
        other.discard(&format!("{PRIVATE_DIR}/journal/1-0")).unwrap();
        other.tidy_private_dir().unwrap();
        assert!(!private.exists(), "nothing left in use: no trace");
        assert_eq!(std::fs::read(dir.join("a/x")).unwrap(), b"x");
        // Locks work again, on a new file; a lock taken on the old file after it was unlinked
        // would not keep them apart.
        let again = store.lock(3).unwrap();
        let file = File::options().read(true).write(true).open(private.join("lock")).unwrap();
        assert!(!try_lock_whole(&file).unwrap(), "the slot is held in the file that is linked");
        drop(again);
        other.tidy_private_dir().unwrap();
        assert!(!private.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_locker_waiting_on_a_lock_file_that_is_removed_locks_the_new_one() {
        let (dir, store) = temp_store("tidy-race");
        let lock_path = dir.join(PRIVATE_DIR).join("lock");
        drop(store.lock(0).unwrap());
        // Hold the whole old file as the remover does, let a locker open it and wait, then unlink.
        let remover = File::options().read(true).write(true).open(&lock_path).unwrap();
        assert!(try_lock_whole(&remover).unwrap());
        let waiting = std::thread::spawn({
            let (store, lock_path) = (store.clone(), lock_path.clone());
            move || {
                let held = store.lock(0).unwrap();
                let linked = File::options().read(true).write(true).open(&lock_path).unwrap();
                let free_while_held = try_lock_whole(&linked).unwrap();
                drop(held);
                (free_while_held, try_lock_whole(&linked).unwrap())
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        std::fs::remove_file(&lock_path).unwrap();
        drop(remover);
        let (free_while_held, free_after) = waiting.join().unwrap();
        assert!(!free_while_held, "the waiting locker moved to the linked file");
        assert!(free_after);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn deleting_a_file_whose_directory_another_deleter_then_removes_succeeds() {
        // A commit deletes a shard left empty and removes its directory if that is empty too; two
        // such commits of shards in one directory race, and the second one's fsync of the directory
        // found it removed: an unmount after zarr's resize failed with ENOENT (test_draft.py, once).
        let (dir, store) = temp_store("sibling-deletes");
        for round in 0..400 {
            store.put("d/a", &[b"a"], PutMode::Overwrite).unwrap();
            store.put("d/b", &[b"b"], PutMode::Overwrite).unwrap();
            let deleted: Vec<Result<()>> = std::thread::scope(|scope| {
                let deleters: Vec<_> = ["d/a", "d/b"]
                    .map(|key| {
                        let store = &store;
                        scope.spawn(move || {
                            let deleted = store.delete(key);
                            let _ = store.remove_dir("d");
                            deleted
                        })
                    })
                    .into_iter()
                    .collect();
                deleters.into_iter().map(|d| d.join().unwrap()).collect()
            });
            for d in deleted {
                assert!(d.is_ok(), "round {round}: {d:?}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn passes_the_conformance_checks() {
        let (dir, store) = temp_store("conformance");
        super::super::conformance::check(&store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn is_unchanged_says_yes_only_for_the_same_unchanged_file() {
        let (dir, store) = temp_store("unchanged");
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/zarr.json"), b"{}").unwrap();
        let stamp = store.attr("a/zarr.json").unwrap().stamp;
        assert!(store.is_unchanged("a/zarr.json", &stamp));
        std::fs::write(dir.join("a/zarr.json"), b"{ }").unwrap();
        assert!(!store.is_unchanged("a/zarr.json", &stamp), "rewritten");
        let stamp = store.attr("a/zarr.json").unwrap().stamp;
        std::fs::rename(dir.join("a/zarr.json"), dir.join("b.json")).unwrap();
        std::os::unix::fs::symlink("../b.json", dir.join("a/zarr.json")).unwrap();
        assert!(!store.is_unchanged("a/zarr.json", &stamp), "a link to the same file is not the file");
        std::fs::remove_file(dir.join("a/zarr.json")).unwrap();
        assert!(!store.is_unchanged("a/zarr.json", &stamp), "gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_lock_holder_at_a_time() {
        use std::sync::atomic::AtomicUsize;
        let (dir, store) = temp_store("lock");
        let inside = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let _lock = store.lock(lock::slot("a/c/0")).unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
