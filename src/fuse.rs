//! The FUSE adapter: the only code that imports `fuser`, and the only place where an [`Error`]
//! becomes an errno. Each callback is one call into [`ShardFs`] and one reply.

mod watcher;

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::fs::Error;
use crate::fs::{OpenMode, ShardFs};
use crate::store::{Attr, Kind};

/// How long the kernel may trust names and attributes before asking again. Long, so that a warm
/// pass over a store asks nothing per file: the watcher invalidates what changes underneath the
/// mount within [`WATCH_INTERVAL`]; this is only the backstop.
pub const CACHE_TTL: Duration = Duration::from_secs(60);

pub use watcher::INTERVAL as WATCH_INTERVAL;

/// ioctl on the mount's root directory answering the serving process's id (a native-endian
/// `u32`), so that `shardfs unmount` can wait for the daemon to finish: `_IOR('Z', 0x70, u32)`.
pub const PID_IOCTL: u32 = (2 << 30) | (4 << 16) | ((b'Z' as u32) << 8) | 0x70;

/// Largest read the kernel sends at once, and its readahead.
const MAX_READAHEAD: u32 = 1 << 20;

/// [`ShardFs`] served over FUSE.
pub struct Fuse(pub Arc<ShardFs>);

impl Fuse {
    /// FOPEN_NOFLUSH for a handle whose close has nothing to do, so the kernel sends no FLUSH.
    fn close_flags(&self, fh: u64) -> FopenFlags {
        if self.0.flushes_at_close(fh) { FopenFlags::empty() } else { FopenFlags::FOPEN_NOFLUSH }
    }
}

/// The errno a failed operation returns to the caller.
pub fn errno(error: &Error) -> Errno {
    match error {
        Error::NotFound => Errno::ENOENT,
        Error::Damaged(_) => Errno::EIO,
        Error::Store(e) => e.raw_os_error().map_or(Errno::EIO, Errno::from_i32),
        Error::NotADirectory => Errno::ENOTDIR,
        Error::IsADirectory => Errno::EISDIR,
        Error::ReadOnly => Errno::EROFS,
        Error::Invalid(_) => Errno::EINVAL,
        Error::Exists => Errno::EEXIST,
        Error::NotEmpty => Errno::ENOTEMPTY,
        Error::CrossDevice => Errno::EXDEV,
        Error::BadHandle => Errno::EBADF,
        Error::Stale(_) => Errno::ESTALE,
    }
}

fn fail(op: &str, error: &Error) -> Errno {
    match error {
        Error::NotFound => {}
        Error::Damaged(msg) => log::debug!("{op}: {msg}"),
        other => log::info!("{op}: {other}"),
    }
    errno(error)
}

fn file_attr(ino: u64, attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.ctime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Attributes for an entry whose real ones cannot be had: only its inode and type are true.
fn unknown_attr(ino: u64, kind: Kind) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(kind),
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File | Kind::Other => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn open_mode(flags: i32) -> OpenMode {
    OpenMode {
        write: OpenFlags(flags).acc_mode() != OpenAccMode::O_RDONLY,
        truncate: flags & libc::O_TRUNC != 0,
        append: flags & libc::O_APPEND != 0,
    }
}

fn name(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::ENOENT)
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel drops cached pages of a file whose mtime or size it sees change, so
        // keep_cache never serves a rewritten shard's old bytes past the attribute TTL.
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        // O_TRUNC arrives with the open instead of as a separate truncate.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        let _ = config.set_max_readahead(MAX_READAHEAD);
        // Listings carry attributes, so `ls -l` costs no lookup per entry.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Lookups in one directory (every chunk of a 1-D array) run in parallel.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, child: &OsStr, reply: ReplyEntry) {
        let result = name(child).and_then(|n| self.0.lookup(parent.0, n).map_err(|e| fail("lookup", &e)));
        match result {
            Ok((ino, attr)) => reply.entry(&CACHE_TTL, &file_attr(ino, &attr), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.getattr(ino.0) {
            Ok(attr) => reply.attr(&CACHE_TTL, &file_attr(ino.0, &attr)),
            Err(e) => reply.error(fail("getattr", &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(fail("readlink", &e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mode = open_mode(flags.0);
        if self.0.is_read_only() {
            reply.error(Errno::ENOSYS);
            return;
        }
        match self.0.open(ino.0, mode) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE | self.close_flags(fh)),
            Err(e) => reply.error(fail("open", &e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        child: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = name(child)
            .and_then(|n| self.0.create(parent.0, n, mode & !umask, open_mode(flags)).map_err(|e| fail("create", &e)));
        match result {
            Ok((ino, attr, fh)) => {
                reply.created(&CACHE_TTL, &file_attr(ino, &attr), Generation(0), FileHandle(fh), self.close_flags(fh))
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.0.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fail("write", &e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = match size {
            Some(size) => self.0.set_size(ino.0, fh.map(|f| f.0), size),
            None => self.0.getattr(ino.0),
        };
        match result {
            Ok(attr) => reply.attr(&CACHE_TTL, &file_attr(ino.0, &attr)),
            Err(e) => reply.error(fail("setattr", &e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, child: &OsStr, reply: ReplyEmpty) {
        match name(child).and_then(|n| self.0.unlink(parent.0, n).map_err(|e| fail("unlink", &e))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, child: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        match name(child).and_then(|n| self.0.mkdir(parent.0, n, mode & !umask).map_err(|e| fail("mkdir", &e))) {
            Ok((ino, attr)) => reply.entry(&CACHE_TTL, &file_attr(ino, &attr), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, child: &OsStr, reply: ReplyEmpty) {
        match name(child).and_then(|n| self.0.rmdir(parent.0, n).map_err(|e| fail("rmdir", &e))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        child: &OsStr,
        new_parent: INodeNo,
        new_child: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.bits() != 0 {
            // RENAME_NOREPLACE and RENAME_EXCHANGE cannot be done atomically across the overlay.
            reply.error(Errno::EINVAL);
            return;
        }
        let result = name(child).and_then(|from| {
            let to = name(new_child)?;
            self.0.rename(parent.0, from, new_parent.0, to).map_err(|e| fail("rename", &e))
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.0.fsync(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("fsync", &e)),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.0.commit_all() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("fsyncdir", &e)),
        }
    }

    fn destroy(&mut self) {
        if let Err(e) = self.0.commit_all() {
            log::error!("unmount: pending writes could not be committed: {e}");
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = if fh.0 == 0 { self.0.read_unopened(ino.0, offset, size) } else { self.0.read(fh.0, offset, size) };
        match data {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(fail("read", &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.release(fh.0);
        reply.ok();
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        if fh.0 == 0 {
            reply.error(Errno::ENOSYS);
            return;
        }
        match self.0.flush(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("flush", &e)),
        }
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        // There are no extended attributes; which "no" matters for speed. After ENOSYS the kernel
        // answers every later getxattr itself, and must: it asks for security.capability before
        // every write(2). But it then answers ACL queries "no ACL" (ENODATA), which `ls -l` asks
        // again for every file, while EOPNOTSUPP it remembers for the whole mount (ls -lR of
        // 4,096 chunks: 22 ms -> 13.5 ms). A read-only mount sees no writes, so it says that.
        reply.error(if self.0.is_read_only() { Errno::EOPNOTSUPP } else { Errno::ENOSYS });
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if ino.0 == crate::fs::ROOT_INO && cmd == PID_IOCTL && out_size >= 4 {
            reply.ioctl(0, &std::process::id().to_ne_bytes());
            return;
        }
        // Every Python open() asks whether the file is a terminal (TCGETS), and the kernel does not
        // remember a refusal: answer "not a terminal" quietly instead of logging each one.
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The kernel keeps listings (across opens too) until the watcher invalidates the
        // directory, or a change through the mount does.
        match self.0.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(fail("opendir", &e)),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let result = self.0.readdir(fh.0, offset, |entry, next| {
            reply.add(INodeNo(entry.ino), next, file_type(entry.kind), &entry.name)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdir", &e)),
        }
    }

    fn readdirplus(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let result = self.0.readdirplus(fh.0, offset, |entry, attr, next| {
            let (attr, ttl) = match attr {
                Some(attr) => (file_attr(entry.ino, attr), CACHE_TTL),
                // Not cached, so that the next stat or open asks again and gets the error.
                None => (unknown_attr(entry.ino, entry.kind), Duration::ZERO),
            };
            reply.add(INodeNo(entry.ino), next, &entry.name, &ttl, &attr, Generation(0))
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdirplus", &e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.0.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.0.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
            Err(e) => reply.error(fail("statfs", &e)),
        }
    }
}

/// A live mount. Dropping it unmounts, so a test or a daemon never leaves a mount behind.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    watcher: Option<watcher::Watcher>,
}

impl Mounted {
    /// True once the session ended (unmounted from outside, or the connection was aborted).
    pub fn finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts (unless that already happened from outside) and waits for the session's threads.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.watcher.take();
        self.session.take().map_or(Ok(()), end)
    }

    /// Waits for a session that already ended, without unmounting anything.
    pub fn join(mut self) -> std::io::Result<()> {
        self.watcher.take();
        self.session.take().map_or(Ok(()), join_ended)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.watcher.take();
        if let Some(session) = self.session.take()
            && let Err(e) = end(session)
        {
            log::warn!("unmount: {e}");
        }
    }
}

fn end(session: fuser::BackgroundSession) -> std::io::Result<()> {
    if session.guard.is_finished() { join_ended(session) } else { session.umount_and_join() }
}

/// Joins the thread of a session the kernel has ended (the mount was unmounted from outside or
/// its connection aborted). fuser 0.18 unmounts by path when a session's mount handle is dropped,
/// and its check that the mount is still there reads the device's POLLERR (gone) as "mounted", so
/// a daemon exiting after `umount` unmounted whatever had been mounted at that path since: a
/// second `shardfs mount` right after `fusermount3 -u` vanished about every other time (fixed
/// upstream in cberner/fuser#703, not in a release yet). So the handle is never dropped; it holds
/// only the ended connection's file descriptors.
fn join_ended(session: fuser::BackgroundSession) -> std::io::Result<()> {
    let session = std::mem::ManuallyDrop::new(session);
    // SAFETY: the thread handle is moved out exactly once, and `session` is never dropped, so
    // nothing is dropped twice.
    let thread = unsafe { std::ptr::read(&session.guard) };
    thread.join().map_err(|_| std::io::Error::other("the filesystem's session thread panicked"))?
}

/// How to mount: `-o` options as mount(8) spells them, and the worker thread count.
#[derive(Debug, Clone)]
pub struct MountSettings {
    pub options: Vec<String>,
    pub threads: usize,
    /// Mount read-only (also set by `-o ro`).
    pub read_only: bool,
}

impl MountSettings {
    /// True when the mount must reject every write.
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.options.iter().any(|o| o == "ro")
    }
}

/// Checks `-o` options without mounting, so that a typo fails before anything happens.
pub fn check_options(settings: &MountSettings) -> Result<(), String> {
    config(settings).map(|_| ())
}

fn config(settings: &MountSettings) -> Result<fuser::Config, String> {
    use fuser::{MountOption as O, SessionACL};
    let mut config = fuser::Config::default();
    let access = if settings.is_read_only() { O::RO } else { O::RW };
    // default_permissions: the kernel checks every access against the mode, owner and group the
    // view reports (the backing files' own), as on any local filesystem.
    config.mount_options =
        vec![access, O::FSName("shardfs".into()), O::Subtype("shardfs".into()), O::DefaultPermissions];
    for option in &settings.options {
        let parsed = match option.as_str() {
            "ro" => O::RO,
            "rw" if settings.read_only => return Err("-o rw contradicts --read-only".into()),
            "rw" => O::RW,
            "allow_other" => {
                config.acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                config.acl = SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => O::DefaultPermissions,
            "auto_unmount" => O::AutoUnmount,
            "dev" => O::Dev,
            "nodev" => O::NoDev,
            "suid" => O::Suid,
            "nosuid" => O::NoSuid,
            "exec" => O::Exec,
            "noexec" => O::NoExec,
            "atime" => O::Atime,
            "noatime" => O::NoAtime,
            "sync" => O::Sync,
            "async" => O::Async,
            "dirsync" => O::DirSync,
            s if s.starts_with("fsname=") => O::FSName(s["fsname=".len()..].into()),
            s if s.starts_with("subtype=") => O::Subtype(s["subtype=".len()..].into()),
            other => return Err(format!("-o {other}: unknown mount option")),
        };
        config.mount_options.retain(|o| std::mem::discriminant(o) != std::mem::discriminant(&parsed));
        config.mount_options.push(parsed);
    }
    if config.mount_options.contains(&O::AutoUnmount) && config.acl == SessionACL::Owner {
        return Err("-o auto_unmount needs -o allow_other or -o allow_root".into());
    }
    config.n_threads = Some(settings.threads.max(1));
    config.clone_fd = settings.threads > 1;
    Ok(config)
}

/// Mounts `fs` at `mountpoint` and serves it from background threads until unmounted.
pub fn mount(fs: ShardFs, mountpoint: &std::path::Path, settings: &MountSettings) -> Result<Mounted, String> {
    let config = config(settings)?;
    let fs = Arc::new(fs);
    let session = fuser::Session::new(Fuse(fs.clone()), mountpoint, &config)
        .and_then(|s| s.spawn())
        .map_err(|e| format!("{}: cannot mount: {e}", mountpoint.display()))?;
    let watcher = watcher::Watcher::start(fs, session.notifier());
    Ok(Mounted { session: Some(session), watcher: Some(watcher) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(options: &[&str]) -> MountSettings {
        MountSettings { options: options.iter().map(|s| s.to_string()).collect(), threads: 2, read_only: false }
    }

    #[test]
    fn accepts_what_mount_users_type() {
        let c = config(&settings(&["allow_other", "default_permissions", "fsname=data", "noatime"])).unwrap();
        assert_eq!(c.acl, fuser::SessionACL::All);
        assert!(c.mount_options.contains(&fuser::MountOption::FSName("data".into())));
        assert!(!c.mount_options.contains(&fuser::MountOption::FSName("shardfs".into())));
        assert!(c.mount_options.contains(&fuser::MountOption::RW));
        let ro = config(&settings(&["ro"])).unwrap();
        assert!(
            ro.mount_options.contains(&fuser::MountOption::RO) && !ro.mount_options.contains(&fuser::MountOption::RW)
        );
        assert_eq!(c.n_threads, Some(2));
    }

    #[test]
    fn rejects_unknown_and_conflicting_options() {
        assert!(config(&settings(&["bogus"])).unwrap_err().contains("bogus"));
        assert!(config(&settings(&["auto_unmount"])).unwrap_err().contains("allow_other"));
        let read_only = MountSettings { read_only: true, ..settings(&["rw"]) };
        assert!(config(&read_only).is_err());
    }

    #[test]
    fn every_error_has_an_errno() {
        assert_eq!(errno(&Error::NotFound), Errno::ENOENT);
        assert_eq!(errno(&Error::Damaged("x".into())), Errno::EIO);
        let denied = Error::Store(crate::store::Error::Io {
            place: "a".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!(errno(&denied), Errno::EACCES);
        assert_eq!(errno(&Error::ReadOnly), Errno::EROFS);
    }
}
