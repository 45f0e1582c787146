//! FUSE over io_uring against the kernel of the machine (Linux 6.14+, as root, which can turn the
//! `fuse` module's `enable_uring` on): replies sent from other threads than the ring's worker,
//! threads that exit right after, and a filesystem method that panics. Skipped, saying so, where
//! the kernel has no such switch or it cannot be set, or FUSE cannot be mounted.

use std::ffi::OsStr;
use std::time::Duration;
use std::time::UNIX_EPOCH;

use fuser::Config;
use fuser::Errno;
use fuser::FileAttr;
use fuser::FileHandle;
use fuser::FileType;
use fuser::Filesystem;
use fuser::Generation;
use fuser::INodeNo;
use fuser::LockOwner;
use fuser::OpenFlags;
use fuser::ReplyAttr;
use fuser::ReplyData;
use fuser::ReplyEntry;
use fuser::Request;
use fuser::Session;

const TTL: Duration = Duration::from_secs(0);
const FILE: INodeNo = INodeNo(2);
const CONTENT: &[u8] = b"hello from another thread";

/// One file, read from threads of its own; a lookup of "panic" panics.
struct Threads;

fn attr(ino: INodeNo) -> FileAttr {
    let dir = ino == INodeNo::ROOT;
    FileAttr {
        ino,
        size: if dir { 0 } else { CONTENT.len() as u64 },
        blocks: 1,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Threads {
    fn lookup(&self, _req: &Request, _parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match name.to_str() {
            Some("file") => reply.entry(&TTL, &attr(FILE), Generation(0)),
            Some("panic") => panic!("a filesystem method panicked, as the test asks"),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &attr(ino));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        _size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Replied from a thread that ends right after, a while after the worker went back to
        // waiting on its ring.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            reply.data(&CONTENT[(offset as usize).min(CONTENT.len())..]);
        });
    }
}

struct EnableUring(String);

impl EnableUring {
    const PATH: &str = "/sys/module/fuse/parameters/enable_uring";

    fn on() -> Option<Self> {
        let before = std::fs::read_to_string(Self::PATH).ok()?;
        std::fs::write(Self::PATH, "Y").ok()?;
        Some(Self(before.trim().to_string()))
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

fn ring_workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("fuser-ring-"))
        })
        .count()
}

#[test]
fn replies_from_other_threads_and_panics_are_answered_over_io_uring() {
    let Some(_on) = EnableUring::on() else {
        eprintln!(
            "SKIPPED: no FUSE over io_uring here ({} cannot be set)",
            EnableUring::PATH
        );
        return;
    };
    let mnt = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.n_threads = Some(2);
    config.io_uring = true;
    let session = match Session::new(Threads, mnt.path(), &config) {
        Ok(session) => session.spawn().unwrap(),
        Err(e) => {
            eprintln!("SKIPPED: cannot mount FUSE here: {e}");
            return;
        }
    };
    let file = mnt.path().join("file");
    for _ in 0..200 {
        assert_eq!(std::fs::read(&file).unwrap(), CONTENT);
    }
    // Once a request was answered, the kernel had the INIT reply, so the session took the rings.
    assert!(ring_workers() >= 2, "the session made no rings");
    let err = std::fs::metadata(mnt.path().join("panic")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The worker that met the panic serves on, as do the others.
    for _ in 0..200 {
        assert_eq!(std::fs::read(&file).unwrap(), CONTENT);
    }
    session.umount_and_join().unwrap();
}
