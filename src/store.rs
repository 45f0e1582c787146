//! The backing store: a directory on a local filesystem, addressed by `/`-separated keys
//! relative to its root (`""` is the root). Symbolic links are reported, never followed: every
//! key is resolved from the root's descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so no key reaches outside the store, even through a link or a `..`
//! swapped in while the mount runs (such a key fails with ELOOP or EXDEV).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The directory at the store root where shardfs keeps its own files (journal, locks, temporary
/// shards). Zarr readers never look at it, and the view does not show it.
pub const PRIVATE_DIR: &str = "__shardfs";

/// File type of a store entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Identity and version of a file: when any part changes, data cached from it is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

/// What the view needs to know of one store entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub stamp: Stamp,
}

impl Attr {
    fn from_metadata(m: &std::fs::Metadata) -> Self {
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
            stamp: Stamp {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
                ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            },
        }
    }
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

/// Space figures of the filesystem under the store, for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Space {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A store rooted at a local directory.
#[derive(Debug, Clone)]
pub struct DirStore {
    root: PathBuf,
    /// The root, opened once: every key is resolved beneath this descriptor.
    root_fd: Arc<OwnedFd>,
}

/// A store path that the standard library's path functions can use without leaving the store:
/// `/proc/self/fd/N/name`, where N is the key's parent directory, opened beneath the root. Only the
/// last component is resolved by name, so open it with `O_NOFOLLOW` where a link could sit there.
#[derive(Debug)]
pub struct Beneath {
    _parent: OwnedFd,
    path: PathBuf,
}

impl Deref for Beneath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl DirStore {
    /// Opens the store at `root`, which must be a directory.
    pub fn open(root: &Path) -> io::Result<Self> {
        let root = root.canonicalize()?;
        let dir = File::open(&root)?;
        if !dir.metadata()?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory"));
        }
        Ok(DirStore { root, root_fd: Arc::new(dir.into()) })
    }

    /// The local path of `key`, for messages and for tools that read the store directly.
    pub fn path(&self, key: &str) -> PathBuf {
        if key.is_empty() { self.root.clone() } else { self.root.join(key) }
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
    pub fn beneath(&self, key: &str) -> io::Result<Beneath> {
        let (parent, name) = (parent_key(key), key.rsplit('/').next().unwrap_or(key));
        let parent = self.open_beneath(parent, libc::O_PATH | libc::O_DIRECTORY)?;
        let mut path = PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd()));
        if !name.is_empty() {
            path.push(name);
        }
        Ok(Beneath { _parent: parent, path })
    }

    /// Creates directory `key` and its missing parents, all beneath the root.
    pub fn create_dirs(&self, key: &str) -> io::Result<()> {
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

    /// Attributes of the entry at `key`, not following a final symlink.
    pub fn attr(&self, key: &str) -> io::Result<Attr> {
        let fd = self.open_beneath(key, libc::O_PATH | libc::O_NOFOLLOW)?;
        File::from(fd).metadata().map(|m| Attr::from_metadata(&m))
    }

    /// True when the entry at `key` is still the file version `stamp`, told with one `fstatat`
    /// from the root. That lookup is not confined, but it is trusted only to say "the same inode,
    /// unchanged", about a file already read through the confined path; any other answer (a
    /// change, an error, a link on the way) is `false`, and the caller takes the confined path.
    pub fn is_unchanged(&self, key: &str, stamp: &Stamp) -> bool {
        let Ok(rel) = CString::new(if key.is_empty() { "." } else { key }) else { return false };
        // SAFETY: stat is plain data, filled in by the kernel.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory descriptor, a C string and a properly sized out-parameter.
        let done = unsafe { libc::fstatat(self.root_fd.as_raw_fd(), rel.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        done == 0
            && Stamp {
                dev: st.st_dev,
                ino: st.st_ino,
                size: st.st_size as u64,
                mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
                ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
            } == *stamp
    }

    /// The names and kinds in directory `key`. Names that are not UTF-8 are left out with a log
    /// line: Zarr keys are UTF-8 and the view's paths are strings.
    pub fn list(&self, key: &str) -> io::Result<Vec<(String, Kind)>> {
        self.list_versioned(key).map(|(entries, _)| entries)
    }

    /// [`DirStore::list`], with the version of the directory that was listed (taken before its
    /// entries are read, so a change while listing shows as a newer version).
    pub fn list_versioned(&self, key: &str) -> io::Result<(Vec<(String, Kind)>, Stamp)> {
        let dir = File::from(self.open_beneath(key, libc::O_RDONLY | libc::O_DIRECTORY)?);
        let stamp = Attr::from_metadata(&dir.metadata()?).stamp;
        let mut out = Vec::new();
        // The descriptor names the directory itself, so reading it through /proc follows no link
        // of the store.
        for entry in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                log::warn!("{}: skipping an entry whose name is not UTF-8", self.path(key).display());
                continue;
            };
            out.push((name, kind_of(entry.file_type()?)));
        }
        Ok((out, stamp))
    }

    /// Opens the file at `key` for reading; a symlink anywhere on the way is refused (ELOOP).
    pub fn open_file(&self, key: &str) -> io::Result<File> {
        // O_NONBLOCK: opening a FIFO that sits in the store must not stall a worker thread.
        self.open_beneath(key, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK).map(File::from)
    }

    /// Opens the file at `key` for reading and writing, refusing links as [`DirStore::open_file`].
    pub fn open_file_rw(&self, key: &str) -> io::Result<File> {
        self.open_beneath(key, libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK).map(File::from)
    }

    /// The whole content of the file at `key`.
    pub fn read(&self, key: &str) -> io::Result<Vec<u8>> {
        let file = self.open_file(key)?;
        let len = file.metadata()?.len();
        let mut buf = vec![0; len as usize];
        file.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }

    /// The target of the symlink at `key`, as stored.
    pub fn read_link(&self, key: &str) -> io::Result<PathBuf> {
        std::fs::read_link(&*self.beneath(key)?)
    }

    /// Space figures of the filesystem that holds the store.
    pub fn space(&self) -> io::Result<Space> {
        let path = CString::new(self.root.as_os_str().as_bytes())?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: path is a valid C string and st a properly sized out-parameter.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
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
}

/// Attributes of an open file, taken from the descriptor itself.
pub fn file_attr(file: &File) -> io::Result<Attr> {
    file.metadata().map(|m| Attr::from_metadata(&m))
}

/// The key of the directory holding `key` (`""`: the root).
pub fn parent_key(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// Joins a store key and a name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_unchanged_says_yes_only_for_the_same_unchanged_file() {
        let dir = std::env::temp_dir().join(format!("shardfs-unchanged-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/zarr.json"), b"{}").unwrap();
        let store = DirStore::open(&dir).unwrap();
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
}
