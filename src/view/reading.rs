//! A view file opened for reading. On a store whose files cannot be pinned at open (an object
//! store), the version opened can be replaced before it is read: its reads then fail as
//! [`store::Error::Changed`]. A file opened pinned to its version (the kernel holds pages and a
//! size of that version) then fails. Otherwise, as long as nothing was served from it, the file
//! is opened afresh (index and data of the new version) and the read tried again; once bytes
//! were served, the read fails instead, so one reader never gets bytes of two versions.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;

use super::error::{Error, Result};
use super::namespace::{Content, Namespace, Node};
use super::retries::Retries;
use crate::store;

/// An open view file, read from one version.
#[derive(Debug)]
pub struct Reading {
    node: Node,
    content: RwLock<Content>,
    /// Set, under the read lock, once bytes were served: from then on the version stays.
    served: AtomicBool,
    /// Counts reopenings, so that readers who all found the version gone reopen it once.
    generation: AtomicU64,
    /// Read from the version opened or not at all.
    pinned: bool,
    /// Opened at a lookup ([`Reading::held`]), and not read since: its first read is where a
    /// reader is.
    unread_since_lookup: AtomicBool,
}

impl Reading {
    pub fn open(ns: &Namespace, node: Node, pinned: bool) -> Result<Self> {
        let content = ns.open(&node)?;
        Ok(Self::of(node, content, pinned, false))
    }

    /// Opened, pinned, at a read-only mount's lookup for the reads that may follow with no open
    /// ([`Namespace::open_held`]): the reader is followed at its first read.
    pub fn held(ns: &Namespace, node: Node) -> Result<Self> {
        let content = ns.open_held(&node)?;
        Ok(Self::of(node, content, true, true))
    }

    fn of(node: Node, content: Content, pinned: bool, held: bool) -> Self {
        Reading {
            node,
            content: RwLock::new(content),
            served: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            pinned,
            unread_since_lookup: AtomicBool::new(held),
        }
    }

    /// The version of the store file read, as [`Content::version`] says.
    pub fn version(&self) -> Option<store::Stamp> {
        self.content.read().version()
    }

    /// The view path of the file.
    pub fn path(&self) -> String {
        self.node.path()
    }

    /// Up to `size` bytes from `offset`; fewer only at the end of the file.
    pub fn read(&self, ns: &Namespace, offset: u64, size: u32) -> Result<Vec<u8>> {
        if self.unread_since_lookup.swap(false, Ordering::Relaxed) {
            ns.reader_at(&self.node);
        }
        let mut retries = Retries::default();
        loop {
            let content = self.content.read();
            let generation = self.generation.load(Ordering::SeqCst);
            match content.read(offset, size) {
                Ok(bytes) => {
                    self.served.store(true, Ordering::SeqCst);
                    return Ok(bytes);
                }
                Err(changed @ Error::Store(store::Error::Changed(_))) => {
                    drop(content);
                    if self.pinned || self.served.load(Ordering::SeqCst) || !retries.again() {
                        return Err(changed);
                    }
                    // Checked again under the write lock: a reader may have served bytes meanwhile.
                    let mut content = self.content.write();
                    if self.served.load(Ordering::SeqCst) {
                        return Err(changed);
                    }
                    if self.generation.load(Ordering::SeqCst) == generation {
                        *content = ns.open(&self.node)?;
                        self.generation.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}
