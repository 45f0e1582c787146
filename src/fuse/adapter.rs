//! The FUSE adapter: [`ShardFs`] served to the kernel. Each callback is one call into
//! [`ShardFs`] and one reply; [`errno`] is the only place where an error becomes an errno.

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
use crate::store::{self, Attr, Kind};

/// How long the kernel may trust names and attributes before asking again. Long, so that a warm
/// pass over a store asks nothing per file: the watcher invalidates what changes underneath the
/// mount within [`WATCH_INTERVAL`]; this is only the backstop.
pub const CACHE_TTL: Duration = Duration::from_secs(60);

pub use super::watcher::INTERVAL as WATCH_INTERVAL;

/// ioctl on the mount's root directory answering the serving process's id (a native-endian
/// `u32`), so that `shardfs unmount` can wait for the daemon to finish: `_IOR('Z', 0x70, u32)`.
pub const PID_IOCTL: u32 = (2 << 30) | (4 << 16) | ((b'Z' as u32) << 8) | 0x70;

/// The size of [`METRICS_IOCTL`]'s answer: room for any `[IPv6%scope]:port`.
pub const METRICS_ADDRESS_LEN: usize = 64;

/// ioctl on the mount's root directory answering where the daemon serves its metrics (the
/// address, NUL-padded; all NULs when it serves none), so that `shardfs status` finds them as
/// `shardfs unmount` finds the daemon: `_IOR('Z', 0x71, char[64])`.
pub const METRICS_IOCTL: u32 = (2 << 30) | ((METRICS_ADDRESS_LEN as u32) << 16) | ((b'Z' as u32) << 8) | 0x71;

/// Largest read the kernel sends at once, and its readahead.
const MAX_READAHEAD: u32 = 1 << 20;

/// The `st_blksize` of directories. glibc's opendir sizes its getdents buffer by it (32 KiB up to
/// 1 MiB), and the kernel sizes each READDIR(PLUS) request by that buffer, up to `max_pages` (1
/// MiB): a listing then takes one request per 6,500 entries, not per 200 (READDIRPLUS entries
/// are 160 bytes, five times READDIR's, whether or not they carry attributes).
const DIR_BLKSIZE: u32 = 1 << 20;

/// [`ShardFs`] served over FUSE, whether the kernel opens directories without asking
/// (`FUSE_NO_OPENDIR_SUPPORT`, learnt at init), and what to call once the session has ended.
pub struct Fuse(pub Arc<ShardFs>, pub bool, pub SessionEnd);

/// Called once, when the session has ended and its last commit is made (see
/// [`super::Mounted::when_ended`]).
pub type SessionEnd = Arc<std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>>;

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
        Error::Damaged(_) | Error::Contended(_) => Errno::EIO,
        // The version a file was opened or looked up as is gone from the store: its handle is
        // stale, as NFS says of a file replaced on the server; opened again, it reads the new one.
        Error::Store(store::Error::Changed(_)) => Errno::ESTALE,
        Error::Store(e) => e.raw_os_error().map_or(Errno::EIO, Errno::from_i32),
        Error::NotADirectory => Errno::ENOTDIR,
        Error::IsADirectory => Errno::EISDIR,
        Error::ReadOnly => Errno::EROFS,
        Error::Invalid(_) => Errno::EINVAL,
        Error::Exists => Errno::EEXIST,
        Error::NotEmpty => Errno::ENOTEMPTY,
        Error::CrossDevice => Errno::EXDEV,
        Error::BadHandle => Errno::EBADF,
        Error::TooLarge(_) => Errno::EFBIG,
        Error::Stale(_) => Errno::ESTALE,
    }
}

/// The errno of a failed operation, logged: a failure of the mount or its store (EIO, ENOSPC,
/// ...) at warning level every time, since its caller sees only the errno and the log says why;
/// an answer about what the caller asked (ENOENT, EEXIST, a stale handle the kernel opens again)
/// only when asked for.
fn fail(op: &str, error: &Error) -> Errno {
    let errno = errno(error);
    crate::metrics::error_given(errno.code());
    match error {
        Error::NotFound => {}
        Error::Damaged(msg) => log::debug!("{op}: {msg}"),
        Error::NotADirectory
        | Error::IsADirectory
        | Error::ReadOnly
        | Error::Invalid(_)
        | Error::Exists
        | Error::NotEmpty
        | Error::CrossDevice
        | Error::BadHandle
        | Error::Stale(_)
        | Error::Store(store::Error::Changed(_) | store::Error::NotFound(_)) => log::info!("{op}: {error}"),
        other => log::warn!("{op}: {other} ({errno:?})"),
    }
    errno
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
        blksize: if attr.kind == Kind::Dir { DIR_BLKSIZE } else { 4096 },
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
    name.to_str().ok_or_else(|| {
        crate::metrics::error_given(libc::ENOENT);
        Errno::ENOENT
    })
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel drops cached pages of a file whose mtime or size it sees change, so
        // keep_cache never serves a rewritten shard's old bytes past the attribute TTL.
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        // O_TRUNC arrives with the open instead of as a separate truncate.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        let _ = config.set_max_readahead(MAX_READAHEAD);
        // Every listing is a READDIRPLUS, whose entries carry attributes where the daemon expects
        // them to be used (`ls -l`, `du`) and not elsewhere (`find`): `fs/listing_attributes.rs`.
        // Not FUSE_READDIRPLUS_AUTO, with which the kernel chooses by batch and gives `du` none.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        // Lookups in one directory (every chunk of a 1-D array) run in parallel.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        self.1 = config.capabilities().contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, child: &OsStr, reply: ReplyEntry) {
        let result = name(child).and_then(|n| self.0.lookup(parent.0, n).map_err(|e| fail("lookup", &e)));
        match result {
            Ok((ino, attr)) => {
                self.0.looked_up_by(req.pid(), parent.0, attr.kind);
                reply.entry(&CACHE_TTL, &file_attr(ino, &attr), Generation(0))
            }
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
            // No open costs a request on a read-only mount from then on (FUSE no-open, which
            // keeps the page cache across opens): `cat` of 262,144 cached chunk files cost 4.6x
            // plain files with an OPEN and a RELEASE each. Reads are pinned by their inode's
            // version instead of their handle's (ShardFs::read_unopened).
            reply.error(Errno::ENOSYS);
            return;
        }
        let caching = if self.0.uncached(ino.0) { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::FOPEN_KEEP_CACHE };
        match self.0.open(ino.0, mode) {
            Ok(fh) => reply.opened(FileHandle(fh), caching | self.close_flags(fh)),
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

    fn link(&self, _req: &Request, ino: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        let result = name(new_name).and_then(|n| self.0.link(ino.0, new_parent.0, n).map_err(|e| fail("link", &e)));
        match result {
            Ok((ino, attr)) => reply.entry(&CACHE_TTL, &file_attr(ino, &attr), Generation(0)),
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
        if let Some(ended) = self.2.get() {
            ended();
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
            // Not opened (no-open): nothing to flush, and ENOSYS stops the kernel asking again.
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
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if ino.0 == crate::fs::ROOT_INO && cmd == PID_IOCTL && out_size >= 4 {
            // Our number means this process only to a caller in our pid namespace: to one in
            // another (a container's), it names some other process or none (0: unknown).
            let pid = if shares_pid_namespace(req.pid()) { std::process::id() } else { 0 };
            reply.ioctl(0, &pid.to_ne_bytes());
            return;
        }
        if ino.0 == crate::fs::ROOT_INO && cmd == METRICS_IOCTL && out_size as usize >= METRICS_ADDRESS_LEN {
            let mut answer = [0u8; METRICS_ADDRESS_LEN];
            if let Some(address) = crate::metrics::serve::address() {
                let text = address.to_string();
                let len = text.len().min(METRICS_ADDRESS_LEN);
                answer[..len].copy_from_slice(&text.as_bytes()[..len]);
            }
            reply.ioctl(0, &answer);
            return;
        }
        // Every Python open() asks whether the file is a terminal (TCGETS), and the kernel does not
        // remember a refusal: answer "not a terminal" quietly instead of logging each one.
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Listings are kept by directory, not by open (`ShardFs::readdir`), so an open needs
        // nothing of the daemon: ENOSYS tells a kernel that offers it to send no more opendir or
        // releasedir, and to keep listings as the flags below say. Elsewhere this is the first
        // and the last open the kernel asks for. The kernel keeps listings (across opens too)
        // until the watcher invalidates the directory, or a change through the mount does.
        if self.1 {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let result = self.0.readdir(ino.0, offset, |entry, next| {
            reply.add(INodeNo(entry.ino), next, file_type(entry.kind), &entry.name)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdir", &e)),
        }
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let attributes = self.0.listing_attributes(req.pid(), ino.0);
        let (mut with, mut without) = (0, 0);
        let result = self.0.readdirplus_with(ino.0, offset, attributes, |entry, attr, next| {
            let full = match attr {
                Some(attr) => reply.add(
                    INodeNo(entry.ino),
                    next,
                    &entry.name,
                    &CACHE_TTL,
                    &file_attr(entry.ino, attr),
                    Generation(0),
                ),
                // By name alone (node id 0): the kernel makes no inode, and a stat looks it up.
                None => reply.add_without_attr(INodeNo(entry.ino), next, file_type(entry.kind), &entry.name),
            };
            if !full && entry.kind == Kind::File {
                *if attr.is_some() { &mut with } else { &mut without } += 1;
            }
            full
        });
        self.0.listing_gave(req.pid(), ino.0, with, without);
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdirplus", &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.0.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
            Err(e) => reply.error(fail("statfs", &e)),
        }
    }
}

/// Whether process `pid` (as this process sees it; 0: one it cannot see) is in this process's pid
/// namespace.
fn shares_pid_namespace(pid: u32) -> bool {
    let namespace = |process: &str| std::fs::read_link(format!("/proc/{process}/ns/pid")).ok();
    pid != 0 && namespace(&pid.to_string()).is_some_and(|theirs| namespace("self") == Some(theirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_an_errno() {
        assert_eq!(errno(&Error::NotFound), Errno::ENOENT);
        assert_eq!(errno(&Error::Damaged("x".into())), Errno::EIO);
        let denied = Error::Store(crate::store::Error::Io {
            place: "a".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!(errno(&denied), Errno::EACCES);
        assert_eq!(errno(&Error::Store(store::Error::Changed("a".into()))), Errno::ESTALE);
        // A commit that lost to other writers every time is a failed write, not a stale handle.
        let contended = Error::from(crate::write::error::CommitError::Store(store::Error::Changed("a".into())));
        assert_eq!(errno(&contended), Errno::EIO);
        assert_eq!(errno(&Error::ReadOnly), Errno::EROFS);
    }

    #[test]
    fn directories_say_blocks_as_large_as_a_request() {
        let attr = |kind| Attr {
            size: 0,
            mtime: SystemTime::UNIX_EPOCH,
            atime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            kind,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            stamp: crate::store::Stamp::new([0; 5]),
        };
        assert_eq!(file_attr(2, &attr(Kind::Dir)).blksize, 1 << 20);
        assert_eq!(file_attr(3, &attr(Kind::File)).blksize, 4096);
    }
}
