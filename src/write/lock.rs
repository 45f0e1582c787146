//! Advisory shard locks: open-file-description byte-range locks (`F_OFD_SETLKW`) on the single
//! file `__shardfs/lock`, one byte per shard at an offset derived from the shard's key. Two
//! processes, two mounts, or two threads of one mount (each lock opens its own descriptor) never
//! commit to one shard at the same time; two shards whose offsets collide merely wait for each
//! other.
//!
//! Within one process, the same slots also stripe a table of read-write locks: a commit holds its
//! stripe for writing, and the view reads a shard (stat, index, data range) holding it for
//! reading, so that a daemon never reads a shard its own committer is half-way through appending
//! to. (A commit by another process can still be seen half-done: its index then fails to decode,
//! and that read is EIO, never wrong bytes.)

use std::fs::{File, OpenOptions};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::os::fd::AsRawFd;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::PRIVATE_DIR;
use crate::store::DirStore;

/// In-process stripes over lock slots: commits write-lock, readers read-lock.
static STRIPES: [RwLock<()>; 64] = [const { parking_lot::const_rwlock(()) }; 64];

fn stripe(slot: u64) -> &'static RwLock<()> {
    &STRIPES[(slot % STRIPES.len() as u64) as usize]
}

/// Held while reading shard `shard_key`: no commit of this process to it runs meanwhile.
pub fn reading(shard_key: &str) -> RwLockReadGuard<'static, ()> {
    stripe(lock_slot(shard_key)).read_recursive()
}

/// The lock-file offset of a shard.
pub fn lock_slot(shard_key: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    shard_key.hash(&mut hasher);
    hasher.finish() >> 2
}

/// A held shard lock; dropping it releases the lock.
#[derive(Debug)]
pub struct ShardLock {
    file: File,
    _in_process: RwLockWriteGuard<'static, ()>,
}

impl ShardLock {
    /// Waits for and takes the lock of slot `slot` (see [`lock_slot`]).
    pub fn acquire(store: &DirStore, slot: u64) -> io::Result<Self> {
        let in_process = stripe(slot).write();
        store.create_dirs(PRIVATE_DIR)?;
        let dir = store.path(PRIVATE_DIR);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("lock"))?;
        set_lock(&file, slot, libc::F_WRLCK as i16)?;
        Ok(ShardLock { file, _in_process: in_process })
    }
}

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

impl Drop for ShardLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock as well; unlocking first makes it explicit.
        let _ = set_lock(&self.file, 0, libc::F_UNLCK as i16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_holder_at_a_time() {
        let dir = std::env::temp_dir().join(format!("shardfs-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(DirStore::open(&dir).unwrap());
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (store, inside) = (store.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _lock = ShardLock::acquire(&store, lock_slot("a/c/0")).unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
