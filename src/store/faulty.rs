//! Fault injection as a store: [`FaultyStore`] passes every operation to the store it wraps,
//! counting what is written: every byte of a write in place, every whole-file write as its bytes
//! plus one, and every delete, rename and truncation as one. Once its budget is spent it stops
//! dead, as a killed process would: the write in progress keeps only the bytes the budget allowed
//! (a whole-file write, which is atomic, none), and every later change fails with
//! [`Error::Crashed`]. Crash tests run a commit on it with budgets 0, 1, 2, ... and check what
//! recovery makes of the store each time.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Attr, Error, Kind, Lock, Object, OpenFile, OpenHow, PutMode, Result, Space, Stamp, Store};

/// Bytes and steps left before the crash (`None`: no crash), shared with the files it opened.
#[derive(Debug, Clone)]
struct Budget(Arc<Mutex<Option<u64>>>);

impl Budget {
    /// Takes one indivisible step, unless the crash comes first.
    fn step(&self, place: &str) -> Result<()> {
        let mut left = self.0.lock();
        match *left {
            Some(0) => Err(Error::Crashed(place.to_string())),
            Some(n) => {
                *left = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// How many of `len` bytes may still be written; a crash when fewer than `len`.
    fn bytes(&self, len: u64) -> (u64, bool) {
        let mut left = self.0.lock();
        match *left {
            None => (len, false),
            Some(n) if n >= len && n > 0 => {
                *left = Some(n - len);
                (len, false)
            }
            Some(n) => {
                *left = Some(0);
                (n, true)
            }
        }
    }
}

/// A store that crashes after a given number of bytes and steps.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    budget: Budget,
}

impl<S: Store> FaultyStore<S> {
    /// `inner`, stopped dead once `budget` bytes and steps went through.
    pub fn crash_after(inner: S, budget: u64) -> Self {
        FaultyStore { inner, budget: Budget(Arc::new(Mutex::new(Some(budget)))) }
    }

    /// True once the crash happened.
    pub fn crashed(&self) -> bool {
        *self.budget.0.lock() == Some(0)
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn describe(&self, key: &str) -> String {
        self.inner.describe(key)
    }

    fn url(&self, key: &str) -> String {
        self.inner.url(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        self.inner.attr(key)
    }

    fn is_unchanged(&self, key: &str, stamp: &Stamp) -> bool {
        self.inner.is_unchanged(key, stamp)
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        self.inner.list(dir)
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        self.inner.open(key)
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        self.inner.read_link(key)
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        let len = pieces.iter().map(|p| p.len() as u64).sum::<u64>() + 1;
        match self.budget.bytes(len) {
            (_, true) => Err(Error::Crashed(self.describe(key))),
            _ => self.inner.put(key, pieces, mode),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.budget.step(&self.describe(key))?;
        self.inner.delete(key)
    }

    fn delete_version(&self, key: &str, stamp: &Stamp) -> Result<bool> {
        self.budget.step(&self.describe(key))?;
        self.inner.delete_version(key, stamp)
    }

    fn check_writes(&self) -> Result<()> {
        self.inner.check_writes()
    }

    fn tidy_private_dir(&self) -> Result<()> {
        self.inner.tidy_private_dir()
    }

    fn discard(&self, key: &str) -> Result<()> {
        self.budget.step(&self.describe(key))?;
        self.inner.discard(key)
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.budget.step(&self.describe(from))?;
        self.inner.rename(from, to)
    }

    fn make_dir(&self, key: &str, mode: u32) -> Result<()> {
        self.inner.make_dir(key, mode)
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        self.inner.make_dirs(key)
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        self.budget.step(&self.describe(key))?;
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

    fn open_file(&self, key: &str, how: OpenHow) -> Result<Box<dyn OpenFile>> {
        let file = self.inner.open_file(key, how)?;
        Ok(Box::new(FaultyFile { file, budget: self.budget.clone(), place: self.describe(key) }))
    }

    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>> {
        self.inner.lock(slot)
    }
}

/// A file of a [`FaultyStore`], writing within the store's budget.
#[derive(Debug)]
struct FaultyFile {
    file: Box<dyn OpenFile>,
    budget: Budget,
    place: String,
}

impl OpenFile for FaultyFile {
    fn attr(&self) -> Result<Attr> {
        self.file.attr()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let (allowed, crashed) = self.budget.bytes(data.len() as u64);
        self.file.write_at(&data[..allowed as usize], offset)?;
        if crashed { Err(Error::Crashed(self.place.clone())) } else { Ok(()) }
    }

    fn append(&self, data: &[u8]) -> Result<()> {
        let end = self.file.attr()?.size;
        self.write_at(data, end)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.budget.step(&self.place)?;
        self.file.set_len(len)
    }

    fn sync(&self) -> Result<()> {
        self.file.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_conformance_checks_until_it_crashes() {
        let dir = std::env::temp_dir().join(format!("shardfs-faulty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = FaultyStore::crash_after(super::super::LocalStore::open(&dir).unwrap(), u64::MAX);
        super::super::conformance::check(&store);
        assert!(!store.crashed());
        let store = FaultyStore::crash_after(super::super::LocalStore::open(&dir).unwrap(), 3);
        let file = store.open_file("f", OpenHow { create: Some(0o644), truncate: true }).unwrap();
        assert!(matches!(file.write_at(b"hello", 0), Err(Error::Crashed(_))));
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"hel", "a prefix, as a killed process leaves");
        assert!(matches!(store.delete("f"), Err(Error::Crashed(_))), "nothing changes after the crash");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
