//! The temporary files atomic writers make inside chunk-key directories (zarr-python writes each
//! chunk to `c/0.<uuid>.partial`, then renames it onto `c/0`), held in the daemon's memory over a
//! store that would otherwise write them to its disk: [`ScratchInMemory`] wraps that store and
//! answers every key under [`SCRATCH_DIR`] (where the view keeps such files) from memory, and
//! every other key from the store.
//!
//! On a local directory each such file was written to disk, read back when renamed onto its chunk,
//! and unlinked with a directory fsync: most of the daemon's time when zarr-python writes large
//! chunks, for a file that lives a moment and that nobody else can see (an object store and an
//! Icechunk branch hold them in memory already). Held here, a rename onto a chunk copies its bytes
//! once, in memory. Like any file held in the daemon, it is not durable: a crash loses it, as it
//! loses the pending chunk it was about to become; its `fsync` does nothing.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;

use super::held::{Held, HeldFile, HeldHandle, new_stamp};
use super::{
    Attr, BytesObject, Error, Kind, Location, Lock, Object, OpenFile, OpenHow, PutMode, Result, SCRATCH_DIR, Space,
    Stamp, Store, Then,
};

/// True for the keys of files made inside chunk-key directories.
fn is_scratch(key: &str) -> bool {
    key.strip_prefix(SCRATCH_DIR).is_some_and(|rest| rest.starts_with('/'))
}

/// A store whose scratch files live in memory.
#[derive(Debug)]
pub struct ScratchInMemory {
    inner: Arc<dyn Store>,
    files: Mutex<HashMap<String, HeldFile>>,
    /// Every change of a held file: each version gets a stamp of its own.
    changes: Arc<AtomicU64>,
}

impl ScratchInMemory {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        ScratchInMemory { inner, files: Mutex::default(), changes: Arc::default() }
    }

    fn held(&self, key: &str) -> Option<HeldFile> {
        self.files.lock().get(key).cloned()
    }

    /// Holds `bytes` as the file at `key`, in place of any held there.
    fn hold(&self, key: &str, bytes: Vec<u8>) -> HeldFile {
        let held = Held { bytes, stamp: new_stamp(&self.changes, key), modified: SystemTime::now() };
        let file = Arc::new(Mutex::new(held));
        self.files.lock().insert(key.to_string(), file.clone());
        file
    }

    /// A held file's attributes: a writable file of the store root's owner.
    fn attr_of(&self, file: &HeldFile) -> Result<Attr> {
        let root = self.inner.attr("")?;
        let held = file.lock();
        let time = held.modified;
        Ok(Attr {
            kind: Kind::File,
            size: held.bytes.len() as u64,
            perm: (root.perm & 0o666) | 0o200,
            nlink: 1,
            atime: time,
            mtime: time,
            ctime: time,
            stamp: held.stamp,
            ..root
        })
    }

    /// The content of the file at `key`, held or stored.
    fn content(&self, key: &str) -> Result<Vec<u8>> {
        match self.held(key) {
            Some(file) => Ok(file.lock().bytes.clone()),
            None if is_scratch(key) => Err(Error::NotFound(self.describe(key))),
            None => self.inner.read(key),
        }
    }

    fn exists(&self, key: &str) -> bool {
        match is_scratch(key) {
            true => self.held(key).is_some(),
            false => self.inner.attr(key).is_ok(),
        }
    }
}

impl Store for ScratchInMemory {
    fn describe(&self, key: &str) -> String {
        self.inner.describe(key)
    }

    fn url(&self, key: &str) -> String {
        self.inner.url(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        match self.held(key) {
            Some(file) => self.attr_of(&file),
            None if is_scratch(key) => Err(Error::NotFound(self.describe(key))),
            None => self.inner.attr(key),
        }
    }

    fn is_unchanged(&self, key: &str, stamp: &Stamp) -> bool {
        match self.held(key) {
            Some(file) => file.lock().stamp == *stamp,
            None => !is_scratch(key) && self.inner.is_unchanged(key, stamp),
        }
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        if dir != SCRATCH_DIR {
            return self.inner.list(dir);
        }
        let files = self.files.lock();
        let names = files.keys().filter_map(|k| k.strip_prefix(SCRATCH_DIR)).map(|n| (n[1..].to_string(), Kind::File));
        let stamp = Stamp::computed(("scratch", self.changes.load(Ordering::Relaxed)));
        Ok((names.collect(), stamp))
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let Some(file) = self.held(key) else {
            return match is_scratch(key) {
                true => Err(Error::NotFound(self.describe(key))),
                false => self.inner.open(key),
            };
        };
        // The attributes and the bytes of one moment.
        let attr = self.attr_of(&file)?;
        let bytes = Arc::from(file.lock().bytes.as_slice());
        Ok(Box::new(BytesObject { attr, bytes, place: self.describe(key) }))
    }

    fn open_range(&self, key: &str, range: Range<u64>) -> Result<Box<dyn Object>> {
        match is_scratch(key) {
            true => self.open(key),
            false => self.inner.open_range(key, range),
        }
    }

    fn refresh(&self, keys: &[&str]) {
        self.inner.refresh(keys)
    }

    fn prefetch(&self, key: &str, then: Then) {
        self.inner.prefetch(key, then)
    }

    fn read(&self, key: &str) -> Result<Vec<u8>> {
        self.content(key)
    }

    fn read_written_once(&self, key: &str) -> Result<Vec<u8>> {
        match is_scratch(key) {
            true => self.content(key),
            false => self.inner.read_written_once(key),
        }
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        self.inner.read_link(key)
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        if !is_scratch(key) {
            return self.inner.put(key, pieces, mode);
        }
        let current = self.held(key).map(|file| file.lock().stamp);
        let allowed = match mode {
            PutMode::Overwrite => true,
            PutMode::Create => current.is_none(),
            PutMode::Update(stamp) => current == Some(stamp),
        };
        if !allowed {
            return Err(Error::Changed(self.describe(key)));
        }
        let file = self.hold(key, pieces.concat());
        let stamp = file.lock().stamp;
        Ok(Some(stamp))
    }

    fn delete(&self, key: &str) -> Result<()> {
        match is_scratch(key) {
            true => self.files.lock().remove(key).map(drop).ok_or_else(|| Error::NotFound(self.describe(key))),
            false => self.inner.delete(key),
        }
    }

    fn take(&self, key: &str) -> Result<Vec<u8>> {
        if !is_scratch(key) {
            return self.inner.take(key);
        }
        let file = self.files.lock().remove(key).ok_or_else(|| Error::NotFound(self.describe(key)))?;
        // No handle open on it (zarr-python closes its temporary file before the rename): its
        // bytes move; else they are copied, and what the handles write goes nowhere.
        match Arc::try_unwrap(file) {
            Ok(held) => Ok(held.into_inner().bytes),
            Err(shared) => Ok(shared.lock().bytes.clone()),
        }
    }

    fn delete_version(&self, key: &str, stamp: &Stamp) -> Result<bool> {
        self.inner.delete_version(key, stamp)
    }

    fn discard(&self, key: &str) -> Result<()> {
        match is_scratch(key) {
            true => self.delete(key),
            false => self.inner.discard(key),
        }
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        if !is_scratch(from) && !is_scratch(to) {
            return self.inner.rename(from, to);
        }
        if is_scratch(from) && is_scratch(to) {
            let mut files = self.files.lock();
            let file = files.remove(from).ok_or_else(|| Error::NotFound(self.describe(from)))?;
            files.insert(to.to_string(), file);
            return Ok(());
        }
        // Into or out of the scratch space: the content moves, as across filesystems.
        let content = self.content(from)?;
        self.put(to, &[&content], PutMode::Overwrite)?;
        self.delete(from)
    }

    fn link(&self, from: &str, to: &str) -> Result<()> {
        if !is_scratch(from) && !is_scratch(to) {
            return self.inner.link(from, to);
        }
        // A second name is a copy here: written afterwards, the two differ (as on an object store).
        if self.exists(to) {
            return Err(Error::Changed(self.describe(to)));
        }
        let content = self.content(from)?;
        self.put(to, &[&content], PutMode::Create).map(drop)
    }

    fn make_dir(&self, key: &str, mode: u32) -> Result<()> {
        match key == SCRATCH_DIR || is_scratch(key) {
            true => Ok(()),
            false => self.inner.make_dir(key, mode),
        }
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        match key == SCRATCH_DIR || is_scratch(key) {
            // Held files need no directory.
            true => Ok(()),
            false => self.inner.make_dirs(key),
        }
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        self.inner.remove_dir(key)
    }

    fn can_append(&self) -> bool {
        self.inner.can_append()
    }

    fn can_keep(&self, kept: u64) -> bool {
        self.inner.can_keep(kept)
    }

    fn put_extending(&self, key: &str, over: &Stamp, kept: u64, tail: &[&[u8]], note: &str) -> Result<Option<Stamp>> {
        self.inner.put_extending(key, over, kept, tail, note)
    }

    fn exchange(&self) -> Option<&dyn super::exchange::Exchange> {
        self.inner.exchange()
    }

    fn open_file(&self, key: &str, how: OpenHow) -> Result<Box<dyn OpenFile>> {
        if !is_scratch(key) {
            return self.inner.open_file(key, how);
        }
        let file = match (self.held(key), how.create) {
            (Some(file), _) => file,
            (None, Some(_)) => self.hold(key, Vec::new()),
            (None, None) => return Err(Error::NotFound(self.describe(key))),
        };
        if how.truncate {
            file.lock().bytes.clear();
        }
        let attr = self.attr_of(&file)?;
        Ok(Box::new(HeldHandle { key: self.describe(key), file, attr, changes: self.changes.clone() }))
    }

    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>> {
        self.inner.lock(slot)
    }

    fn sync_all(&self) -> Result<()> {
        self.inner.sync_all()
    }

    fn syncs_as_one(&self) -> bool {
        self.inner.syncs_as_one()
    }

    fn sync_idle(&self, idle: std::time::Duration) {
        self.inner.sync_idle(idle)
    }

    fn check_writes(&self) -> Result<()> {
        self.inner.check_writes()
    }

    fn clean_up(&self) -> Result<Vec<String>> {
        self.inner.clean_up()
    }

    fn tidy_private_dir(&self) -> Result<()> {
        self.inner.tidy_private_dir()
    }

    fn synthesized(&self) -> bool {
        self.inner.synthesized()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn location(&self, key: &str) -> Result<Location> {
        self.inner.location(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    fn temp_store(label: &str) -> (PathBuf, ScratchInMemory) {
        let dir = std::env::temp_dir().join(format!("shardfs-scratch-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = ScratchInMemory::new(Arc::new(LocalStore::open(&dir).unwrap()));
        (dir, store)
    }

    #[test]
    fn passes_the_conformance_checks_outside_the_scratch_space() {
        let (dir, store) = temp_store("conformance");
        crate::store::conformance::check(&store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_atomic_writers_temporary_file_lives_in_memory_until_it_moves_out() {
        let (dir, store) = temp_store("atomic");
        let tmp = format!("{SCRATCH_DIR}/0123");
        store.make_dirs(SCRATCH_DIR).unwrap();
        let file = store.open_file(&tmp, OpenHow { create: Some(0o644), truncate: true }).unwrap();
        file.write_at(b"chunk", 0).unwrap();
        file.append(b" bytes").unwrap();
        let attr = store.attr(&tmp).unwrap();
        assert_eq!((attr.kind, attr.size), (Kind::File, 11));
        assert!(store.is_unchanged(&tmp, &attr.stamp));
        assert_eq!(store.read(&tmp).unwrap(), b"chunk bytes");
        assert!(!dir.join(SCRATCH_DIR).exists(), "nothing of it on disk");
        assert_eq!(store.list(SCRATCH_DIR).unwrap().0, [("0123".to_string(), Kind::File)]);

        file.set_len(5).unwrap();
        assert!(!store.is_unchanged(&tmp, &attr.stamp), "a change is a new version");
        let other = format!("{SCRATCH_DIR}/4567");
        store.rename(&tmp, &other).unwrap();
        assert!(matches!(store.attr(&tmp), Err(Error::NotFound(_))));
        assert_eq!(store.open(&other).unwrap().read_exact_at(0, 5).unwrap(), b"chunk");

        assert!(matches!(store.link(&other, &other), Err(Error::Changed(_))), "EEXIST");
        store.link(&other, &tmp).unwrap();
        file.write_at(b"C", 0).unwrap();
        assert_eq!(store.read(&tmp).unwrap(), b"chunk", "a link is a copy, apart from the file written");
        assert_eq!(store.read(&other).unwrap(), b"Chunk");

        store.rename(&other, "out/of/scratch").unwrap();
        assert_eq!(std::fs::read(dir.join("out/of/scratch")).unwrap(), b"Chunk", "moved out: on disk");
        assert!(matches!(store.read(&other), Err(Error::NotFound(_))));

        assert!(matches!(store.put(&tmp, &[b"x"], PutMode::Create), Err(Error::Changed(_))));
        let stamp = store.attr(&tmp).unwrap().stamp;
        store.put(&tmp, &[b"new"], PutMode::Update(stamp)).unwrap();
        assert!(matches!(store.put(&tmp, &[b"x"], PutMode::Update(stamp)), Err(Error::Changed(_))));
        store.delete(&tmp).unwrap();
        assert!(matches!(store.delete(&tmp), Err(Error::NotFound(_))));
        assert!(matches!(store.open_file(&tmp, OpenHow::default()), Err(Error::NotFound(_))));
        assert!(store.list(SCRATCH_DIR).unwrap().0.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
