//! Plain files written through an object store, held in this process until they are stored. An
//! object cannot be written in place, so a file opened for writing is held whole and stored with
//! one PUT when it is synced (`fsync`, a directory's `fsync`, unmount: [`Store::sync_all`]) or
//! once nothing has changed it for the commit interval ([`Store::sync_idle`]). Until then it
//! exists only here: the store's lookups, listings and reads show it, a rename moves it, an unlink
//! drops it, each without a request. So a file that lives only inside the mount (an atomic
//! writer's temporary file, renamed onto a chunk key or a document a moment after it was written)
//! never reaches the bucket. Temporary files inside chunk-key directories (the view keeps them
//! under [`SCRATCH_DIR`]) never do at all: they are this process's alone, like the directories.
//!
//! Every handle of one file shares its content, as handles of a local file share the file; between
//! processes the last one stored wins, as for any object PUT. A file is held up to [`LARGEST`]
//! bytes (EFBIG past it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::BucketStore;
#[cfg(doc)]
use crate::store::SCRATCH_DIR;
use crate::store::{Attr, Error, Kind, Object, OpenFile, PRIVATE_DIR, PutMode, Result, Stamp, Store};

/// The largest file held: a bigger one is refused with EFBIG rather than exhaust memory.
pub const LARGEST: u64 = 1 << 30;

pub fn too_large(place: &str) -> Error {
    Error::Io { place: place.to_string(), source: std::io::Error::from_raw_os_error(libc::EFBIG) }
}

/// True for keys that are this process's alone: never asked about, listed or stored in the bucket.
pub fn is_private(key: &str) -> bool {
    key.strip_prefix(PRIVATE_DIR).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[derive(Debug)]
struct Content {
    /// Where the file is now (a rename moves it).
    key: String,
    bytes: Vec<u8>,
    /// The bytes differ from what the bucket holds at `key`.
    unsaved: bool,
    /// An object is at `key` in the bucket (it was there when the file was opened, or the file was
    /// stored): a rename or unlink removes it there too.
    in_bucket: bool,
    /// Unlinked: nothing is stored any more, whatever open handles still write.
    gone: bool,
    modified: SystemTime,
    changed: Instant,
}

/// One file held until stored.
#[derive(Debug)]
pub struct StagedFile {
    content: Mutex<Content>,
}

impl StagedFile {
    /// The attributes, with `owner` as the file's owner.
    pub fn attr(self: &Arc<Self>, owner: (u32, u32)) -> Attr {
        let content = self.content.lock();
        let size = content.bytes.len() as u64;
        let time = content.modified;
        Attr {
            kind: Kind::File,
            size,
            perm: 0o644,
            uid: owner.0,
            gid: owner.1,
            nlink: 1,
            atime: time,
            mtime: time,
            ctime: time,
            // The version of held bytes: they are nobody else's.
            stamp: Stamp::new([3, Arc::as_ptr(self) as u64, size, 0, 0]),
        }
    }
}

/// The files held by one store, by key.
#[derive(Debug, Default)]
pub struct Staged {
    files: Mutex<HashMap<String, Arc<StagedFile>>>,
}

impl Staged {
    /// The file held at `key`.
    pub fn get(&self, key: &str) -> Option<Arc<StagedFile>> {
        self.files.lock().get(key).cloned()
    }

    /// Holds `bytes` as the file at `key`; `in_bucket` when an object is there, `unsaved` when
    /// the bytes differ from it.
    pub fn hold(&self, key: &str, bytes: Vec<u8>, in_bucket: bool, unsaved: bool) -> Arc<StagedFile> {
        let content = Content {
            key: key.to_string(),
            bytes,
            unsaved,
            in_bucket,
            gone: false,
            modified: SystemTime::now(),
            changed: Instant::now(),
        };
        let file = Arc::new(StagedFile { content: Mutex::new(content) });
        if let Some(old) = self.files.lock().insert(key.to_string(), file.clone()) {
            old.content.lock().gone = true;
        }
        file
    }

    /// The attributes of the file held at `key`.
    pub fn attr(&self, key: &str, owner: (u32, u32)) -> Option<Attr> {
        self.get(key).map(|file| file.attr(owner))
    }

    /// True when a held file lies below directory `dir`.
    pub fn holds_below(&self, dir: &str) -> bool {
        let below = format!("{dir}/");
        self.files.lock().keys().any(|k| dir.is_empty() || k.starts_with(&below))
    }

    /// The names and kinds of what is held directly in `dir`: files, and directories of files
    /// held deeper.
    pub fn entries(&self, dir: &str) -> Vec<(String, Kind)> {
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let files = self.files.lock();
        let mut entries: Vec<(String, Kind)> = files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|rest| match rest.split_once('/') {
                Some((first, _)) => (first.to_string(), Kind::Dir),
                None => (rest.to_string(), Kind::File),
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        entries
    }

    /// Takes the file held at `key` out, to be dropped or moved; whether an object is at `key` in
    /// the bucket.
    pub fn take(&self, key: &str) -> Option<(Arc<StagedFile>, bool)> {
        let file = self.files.lock().remove(key)?;
        let in_bucket = file.content.lock().in_bucket;
        Some((file, in_bucket))
    }

    /// Moves a file taken out of its old key to `to`, where the bucket may or may not hold an
    /// object (`to_in_bucket`): it is to be stored there.
    pub fn place(&self, file: Arc<StagedFile>, to: &str, to_in_bucket: bool) {
        {
            let mut content = file.content.lock();
            content.key = to.to_string();
            content.in_bucket = to_in_bucket;
            content.unsaved = true;
            content.changed = Instant::now();
        }
        if let Some(old) = self.files.lock().insert(to.to_string(), file) {
            old.content.lock().gone = true;
        }
    }

    /// Drops a file taken out: what its handles write from now on is stored nowhere.
    pub fn drop_file(file: &StagedFile) {
        file.content.lock().gone = true;
    }

    /// The files to store: every one not yet stored, or only those unchanged for `idle`.
    fn unsaved(&self, idle: Option<Duration>) -> Vec<Arc<StagedFile>> {
        let files = self.files.lock();
        files
            .values()
            .filter(|f| {
                let c = f.content.lock();
                c.unsaved && !c.gone && !is_private(&c.key) && idle.is_none_or(|idle| c.changed.elapsed() >= idle)
            })
            .cloned()
            .collect()
    }

    /// Forgets the files stored and no longer open: the bucket answers for them now.
    fn prune(&self) {
        self.files.lock().retain(|_, f| {
            let content = f.content.lock();
            Arc::strong_count(f) > 1 || content.unsaved || is_private(&content.key)
        });
    }
}

impl BucketStore {
    /// Stores `file` if it holds bytes the bucket does not have yet, with one PUT.
    fn store_staged(&self, file: &StagedFile) -> Result<()> {
        let mut content = file.content.lock();
        if !content.unsaved || content.gone || is_private(&content.key) {
            return Ok(());
        }
        let key = content.key.clone();
        // Held for the PUT, so that writes wait for it and are not marked stored unseen.
        self.put_unstaged(&key, &[&content.bytes], PutMode::Overwrite)?;
        content.unsaved = false;
        content.in_bucket = true;
        Ok(())
    }

    /// Stores every file held, or only those unchanged for `idle`; the first error after trying all.
    pub(super) fn store_all_staged(&self, idle: Option<Duration>) -> Result<()> {
        let mut first = Ok(());
        for file in self.0.staged.unsaved(idle) {
            if let Err(e) = self.store_staged(&file) {
                log::warn!("{e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        self.0.staged.prune();
        first
    }
}

/// A handle of a held file.
#[derive(Debug)]
pub struct StagedHandle {
    store: BucketStore,
    file: Arc<StagedFile>,
}

impl StagedHandle {
    pub(super) fn new(store: BucketStore, file: Arc<StagedFile>) -> Self {
        StagedHandle { store, file }
    }

    /// Applies `change`, which leaves the content `len` bytes long.
    fn change(&self, len: u64, change: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut content = self.file.content.lock();
        if len > LARGEST {
            return Err(too_large(&self.store.describe(&content.key)));
        }
        change(&mut content.bytes);
        content.unsaved = true;
        content.modified = SystemTime::now();
        content.changed = Instant::now();
        Ok(())
    }
}

impl Drop for StagedHandle {
    fn drop(&mut self) {
        if !self.file.content.lock().unsaved {
            self.store.0.staged.prune();
        }
    }
}

impl OpenFile for StagedHandle {
    fn attr(&self) -> Result<Attr> {
        Ok(self.file.attr(self.store.0.owner))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        read_at(&self.file, buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let end = offset.saturating_add(data.len() as u64);
        let len = end.max(self.file.content.lock().bytes.len() as u64);
        self.change(len, |bytes| {
            let (start, end) = (offset as usize, end as usize);
            // A file written in order grows by its writes: zeroing the new end first would touch
            // every page twice.
            if start == bytes.len() {
                bytes.extend_from_slice(data);
                return;
            }
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[start..end].copy_from_slice(data);
        })
    }

    fn append(&self, data: &[u8]) -> Result<()> {
        let len = self.file.content.lock().bytes.len() as u64 + data.len() as u64;
        self.change(len, |bytes| bytes.extend_from_slice(data))
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.change(len, |bytes| bytes.resize(len as usize, 0))
    }

    fn sync(&self) -> Result<()> {
        self.store.store_staged(&self.file)
    }
}

fn read_at(file: &StagedFile, buf: &mut [u8], offset: u64) -> Result<usize> {
    let content = file.content.lock();
    let start = (offset as usize).min(content.bytes.len());
    let n = buf.len().min(content.bytes.len() - start);
    buf[..n].copy_from_slice(&content.bytes[start..start + n]);
    Ok(n)
}

/// A held file opened for reading: it reads what the file holds at each read.
#[derive(Debug)]
pub struct StagedObject {
    pub(super) file: Arc<StagedFile>,
    pub(super) attr: Attr,
    pub(super) place: String,
}

impl Object for StagedObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        read_at(&self.file, buf, offset)
    }

    fn place(&self) -> String {
        self.place.clone()
    }
}

impl StagedFile {
    /// True when an object is at the file's key in the bucket.
    pub fn in_bucket(&self) -> bool {
        self.content.lock().in_bucket
    }

    /// The whole content.
    pub fn bytes(&self) -> Vec<u8> {
        self.content.lock().bytes.clone()
    }

    /// The whole content of a file taken out (see [`Staged::take`]), which is dropped: moved when
    /// no handle has it open (an atomic writer closes its temporary file before the rename),
    /// else copied.
    pub fn into_bytes(file: Arc<StagedFile>) -> Vec<u8> {
        match Arc::try_unwrap(file) {
            Ok(file) => file.content.into_inner().bytes,
            Err(shared) => {
                Staged::drop_file(&shared);
                shared.bytes()
            }
        }
    }

    /// Cuts the content to nothing (a truncating open).
    pub fn truncate(&self) {
        let mut content = self.content.lock();
        content.bytes.clear();
        content.unsaved = true;
        content.modified = SystemTime::now();
        content.changed = Instant::now();
    }
}
