//! Lock slots and in-process stripes. Every shard key has a lock slot (a hash of the key): a
//! store's [`super::Store::lock`] takes the slot exclusively across processes, and two keys whose
//! slots collide merely wait for each other.
//!
//! Within one process, the slots also stripe a table of read-write locks: a commit holds its
//! stripe for writing (every [`super::Store::lock`] takes it), and the view reads a shard (stat,
//! index, data range) holding it for reading, so that a daemon never reads a shard its own
//! committer is half-way through appending to. (A commit by another process can still be seen
//! half-done: its index then fails to decode, and that read is EIO, never wrong bytes.)

use std::hash::{DefaultHasher, Hash, Hasher};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// In-process stripes over lock slots: commits write-lock, readers read-lock.
static STRIPES: [RwLock<()>; 64] = [const { parking_lot::const_rwlock(()) }; 64];

fn stripe(slot: u64) -> &'static RwLock<()> {
    &STRIPES[(slot % STRIPES.len() as u64) as usize]
}

/// The lock slot of a key.
pub fn slot(key: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish() >> 2
}

/// Held while reading the shard at `key`: no commit of this process to it runs meanwhile.
pub fn reading(key: &str) -> RwLockReadGuard<'static, ()> {
    stripe(slot(key)).read_recursive()
}

/// Held by a commit to slot `slot`, for the in-process half of a store's lock.
pub fn writing(slot: u64) -> RwLockWriteGuard<'static, ()> {
    stripe(slot).write()
}
