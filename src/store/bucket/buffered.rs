//! A plain file of an object store opened for writing: objects cannot be written in place, so
//! the file's content is held in memory from open and stored whole, with one PUT, at `sync`
//! (fsync, and every close through the view), up to [`LARGEST`] bytes. Every handle of one file
//! in this daemon shares one content, as handles of a local file share the file; between daemons
//! the last one stored wins, as for any object PUT.

use std::time::SystemTime;

use std::sync::Arc;

use parking_lot::Mutex;

use super::BucketStore;
use crate::store::{Attr, Error, Kind, OpenFile, PutMode, Result, Stamp, Store};

/// The largest file held: a bigger one is refused with EFBIG rather than exhaust memory.
pub const LARGEST: u64 = 1 << 30;

pub fn too_large(place: &str) -> Error {
    Error::Io { place: place.to_string(), source: std::io::Error::from_raw_os_error(libc::EFBIG) }
}

#[derive(Debug)]
struct Content {
    bytes: Vec<u8>,
    unsaved: bool,
    modified: SystemTime,
}

/// An object's content, held until stored.
#[derive(Debug)]
pub struct BufferedFile {
    store: BucketStore,
    key: String,
    content: Mutex<Content>,
}

impl BufferedFile {
    /// The file at `key` holding `bytes`; `unsaved` when they differ from the object already
    /// (a truncating open), so that even a close with no write stores them.
    pub(super) fn new(store: BucketStore, key: String, bytes: Vec<u8>, unsaved: bool) -> Self {
        let content = Content { bytes, unsaved, modified: SystemTime::now() };
        BufferedFile { store, key, content: Mutex::new(content) }
    }

    /// Applies `change`, which leaves the content `len` bytes long.
    fn change(&self, len: u64, change: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        if len > LARGEST {
            return Err(too_large(&self.store.describe(&self.key)));
        }
        let mut content = self.content.lock();
        change(&mut content.bytes);
        content.unsaved = true;
        content.modified = SystemTime::now();
        Ok(())
    }
}

/// Every handle of one open file is one of these.
impl OpenFile for Arc<BufferedFile> {
    fn attr(&self) -> Result<Attr> {
        let content = self.content.lock();
        let size = content.bytes.len() as u64;
        let time = content.modified;
        // The version of held bytes: they are nobody else's.
        let stamp = Stamp::new([3, Arc::as_ptr(self) as u64, size, 0, 0]);
        Ok(Attr {
            kind: Kind::File,
            size,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            atime: time,
            mtime: time,
            ctime: time,
            stamp,
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let content = self.content.lock();
        let start = (offset as usize).min(content.bytes.len());
        let n = buf.len().min(content.bytes.len() - start);
        buf[..n].copy_from_slice(&content.bytes[start..start + n]);
        Ok(n)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let end = offset.saturating_add(data.len() as u64);
        let len = end.max(self.content.lock().bytes.len() as u64);
        self.change(len, |bytes| {
            let end = end as usize;
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset as usize..end].copy_from_slice(data);
        })
    }

    fn append(&self, data: &[u8]) -> Result<()> {
        let len = self.content.lock().bytes.len() as u64 + data.len() as u64;
        self.change(len, |bytes| bytes.extend_from_slice(data))
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.change(len, |bytes| bytes.resize(len as usize, 0))
    }

    fn sync(&self) -> Result<()> {
        let mut content = self.content.lock();
        if content.unsaved {
            self.store.put(&self.key, &[&content.bytes], PutMode::Overwrite)?;
            content.unsaved = false;
        }
        Ok(())
    }

    fn buffered(&self) -> bool {
        true
    }
}
