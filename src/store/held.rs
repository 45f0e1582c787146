//! Plain files held in the daemon's memory, never written to the store: on an Icechunk branch, a
//! file that is neither a `zarr.json` nor a chunk (an atomic writer's temporary file, a chunk file
//! written before its array's `zarr.json`) until it is renamed onto one or adopted as a chunk; on
//! a local directory, the temporary files made inside chunk-key directories ([`super::scratch`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::store::read_only::errno;
use crate::store::{Attr, OpenFile, Result, Stamp};

/// A plain file held in this process.
#[derive(Debug)]
pub struct Held {
    pub bytes: Vec<u8>,
    pub stamp: Stamp,
    pub modified: SystemTime,
}

pub type HeldFile = Arc<parking_lot::Mutex<Held>>;

/// A plain file held in this process, opened for writing.
#[derive(Debug)]
pub struct HeldHandle {
    pub key: String,
    pub file: HeldFile,
    pub attr: Attr,
    /// The store's change count: every version of the file gets a stamp of its own.
    pub changes: Arc<AtomicU64>,
}

/// A stamp no other change of any key shares.
pub fn new_stamp(changes: &AtomicU64, key: &str) -> Stamp {
    Stamp::computed((key, changes.fetch_add(1, Ordering::Relaxed), std::process::id()))
}

/// The largest plain file held: a bigger one is refused with EFBIG rather than exhaust memory.
pub const LARGEST_HELD: u64 = 1 << 30;

impl OpenFile for HeldHandle {
    fn attr(&self) -> Result<Attr> {
        let held = self.file.lock();
        Ok(Attr { size: held.bytes.len() as u64, stamp: held.stamp, mtime: held.modified, ..self.attr })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let held = self.file.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(held.bytes.len());
        let n = buf.len().min(held.bytes.len() - start);
        buf[..n].copy_from_slice(&held.bytes[start..start + n]);
        Ok(n)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let mut held = self.file.lock();
        let end = self.within(offset.checked_add(data.len() as u64))?;
        let start = end - data.len();
        if start == held.bytes.len() {
            // Written front to back, as files mostly are: no zeros first.
            held.bytes.extend_from_slice(data);
        } else {
            if held.bytes.len() < end {
                held.bytes.resize(end, 0);
            }
            held.bytes[start..end].copy_from_slice(data);
        }
        self.touched(&mut held);
        Ok(())
    }

    fn append(&self, data: &[u8]) -> Result<()> {
        let mut held = self.file.lock();
        self.within((held.bytes.len() as u64).checked_add(data.len() as u64))?;
        held.bytes.extend_from_slice(data);
        self.touched(&mut held);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        let mut held = self.file.lock();
        let len = self.within(Some(len))?;
        held.bytes.resize(len, 0);
        self.touched(&mut held);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }
}

impl HeldHandle {
    fn touched(&self, held: &mut Held) {
        held.stamp = new_stamp(&self.changes, &self.key);
        held.modified = SystemTime::now();
    }

    /// `end` as a length, if a file held may be that long (EFBIG otherwise).
    fn within(&self, end: Option<u64>) -> Result<usize> {
        match end.filter(|&end| end <= LARGEST_HELD) {
            Some(end) => Ok(end as usize),
            None => Err(errno(self.key.clone(), libc::EFBIG)),
        }
    }
}
