//! Files of a read-only mount held open between the kernel's lookup and its reads. A read-only
//! mount answers no open (FUSE no-open, which keeps the page cache across opens), so its reads come
//! with no handle and are served from the version the file's inode is bound to. Opened only at
//! the read, a version replaced after the lookup is gone by then (ESTALE, which the kernel does
//! not retry for a read); opened at the lookup, it stays readable: a local file replaced by a
//! rename through the descriptor opened before, an object version by its ETag while the store
//! keeps it. The few most recently looked up or read are held, each until its inode is forgotten
//! or pushed out by newer ones.

use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::store::Stamp;
use crate::view::reading::Reading;

/// Files held open at most (each a descriptor of a local store).
const HELD: usize = 64;

/// The open files, by inode.
#[derive(Debug)]
pub struct Unopened {
    readings: Mutex<LruCache<u64, Arc<Reading>>>,
}

impl Default for Unopened {
    fn default() -> Self {
        Unopened { readings: Mutex::new(LruCache::new(NonZeroUsize::new(HELD).expect("non-zero"))) }
    }
}

impl Unopened {
    /// Holds `reading` open for inode `ino`.
    pub fn hold(&self, ino: u64, reading: Arc<Reading>) {
        self.readings.lock().put(ino, reading);
    }

    /// The file held open for inode `ino`, when it is of version `bound`.
    pub fn get(&self, ino: u64, bound: Stamp) -> Option<Arc<Reading>> {
        let mut readings = self.readings.lock();
        readings.get(&ino).filter(|reading| reading.version() == Some(bound)).cloned()
    }

    /// Closes the file of an inode the kernel forgot.
    pub fn forget(&self, ino: u64) {
        self.readings.lock().pop(&ino);
    }
}
