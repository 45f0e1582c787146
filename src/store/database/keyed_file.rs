//! A database file this process locks, whose keys the file keeps in no order it can seek (GNU
//! dbm's hash, Kyoto Cabinet's hash and tree files as their C APIs give them; Berkeley DB's hash
//! and btree files, served alike): the store of [`super::gdbm`], [`super::kyoto`] and
//! [`super::bdb`], each of which supplies a [`LockedFile`].
//!
//! The lock (one writer, or only readers; the library's, or for Berkeley DB the mount's own
//! `flock`) means nothing else changes the file while it is
//! mounted: a writable mount is its writer, a read-only mount one of its readers. Versions are
//! then this mount's own ([`Versions`]). The keys are read once at open into an ordered index
//! (kept up to date by this mount's writes), and each value's size is learnt when first needed,
//! by reading the value, which these libraries give only whole: a read reads the whole value and
//! gives the range asked for. One lock covers the file and the index, as a handle of these
//! libraries is not for two threads at once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;

use super::sole::{Registered, Versions};
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

/// An open, locked database file, as a C library gives it.
pub trait LockedFile: Send + 'static {
    /// The value at `key`, if there is one.
    fn fetch(&mut self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, String>;
    /// Stores `value` at `key`, on disk before it returns.
    fn store(&mut self, key: &[u8], value: &[u8]) -> std::result::Result<(), String>;
    /// Removes `key`, on disk before it returns; nothing there is no error.
    fn delete(&mut self, key: &[u8]) -> std::result::Result<(), String>;
    /// Every key, in whatever order the file keeps.
    fn keys(&mut self) -> std::result::Result<Vec<Vec<u8>>, String>;
}

/// The database of a [`LockedFile`].
pub struct KeyedFile<F> {
    /// What the database is called in errors (`GNU dbm`).
    store: &'static str,
    name: String,
    read_only: bool,
    state: Mutex<State<F>>,
    /// Last: given up once the file is closed.
    _registered: Registered,
}

impl<F> std::fmt::Debug for KeyedFile<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.store).field("name", &self.name).finish()
    }
}

struct State<F> {
    file: F,
    /// Every key, with its value's size once known.
    keys: BTreeMap<String, Option<u64>>,
    versions: Versions,
}

impl<F: LockedFile> State<F> {
    /// The size of the value at `key`, read once and then remembered.
    fn size(&mut self, key: &str) -> std::result::Result<Option<u64>, String> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(Some(size)) => Ok(Some(*size)),
            Some(None) => {
                let size = self.file.fetch(key.as_bytes())?.map(|value| value.len() as u64);
                match size {
                    Some(size) => self.keys.insert(key.to_string(), Some(size)),
                    None => self.keys.remove(key),
                };
                Ok(size)
            }
        }
    }

    fn entry(&mut self, key: &str) -> std::result::Result<Option<Entry>, String> {
        Ok(self.size(key)?.map(|size| Entry { size, version: self.versions.of(key.as_bytes()) }))
    }
}

impl<F: LockedFile> KeyedFile<F> {
    /// The database of the file at `path`, opened by `open` (a reader when `read_only`) once no
    /// other open of this process has it, its keys read now.
    pub fn open(
        store: &'static str,
        path: &Path,
        open: impl FnOnce() -> std::result::Result<F, String>,
        read_only: bool,
    ) -> std::result::Result<Self, String> {
        let name = path.display().to_string();
        let registered = Registered::open(path, &name)?;
        let mut file = open()?;
        let mut keys = BTreeMap::new();
        for key in file.keys().map_err(|e| format!("{name}: {e}"))? {
            match String::from_utf8(key) {
                Ok(key) => {
                    keys.insert(key, None);
                }
                Err(e) => log::warn!("{name}: a key that is not UTF-8 left out: {:?}", e.as_bytes()),
            }
        }
        let state = State { file, keys, versions: Versions::new(path) };
        Ok(KeyedFile { store, name, read_only, state: Mutex::new(state), _registered: registered })
    }

    /// True when opened as a reader.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(self.store, format!("{}: {what}", self.name))
    }
    /// The keys under `prefix` with their entries; with `dirs`, the names of the directories
    /// directly under it too, whose keys are skipped.
    fn listed(&self, prefix: &str, dirs: Option<&mut Vec<String>>) -> Result<Vec<(String, Entry)>> {
        let mut state = self.state.lock();
        let mut names = Vec::new();
        let mut from = prefix.to_string();
        let mut dirs = dirs;
        while let Some(key) = state.keys.range(from.clone()..).next().map(|(k, _)| k.clone()) {
            let Some(name) = key.strip_prefix(prefix) else { break };
            match (name.split_once('/'), dirs.as_deref_mut()) {
                (Some((sub, _)), Some(dirs)) => {
                    if !sub.is_empty() {
                        dirs.push(sub.to_string());
                    }
                    // On past every key of the subdirectory: '0' follows '/'.
                    from = format!("{prefix}{sub}0");
                    continue;
                }
                _ if !name.is_empty() => names.push(key.clone()),
                _ => {}
            }
            from = format!("{key}\0");
        }
        let mut found = Vec::with_capacity(names.len());
        for key in names {
            if let Some(entry) = state.entry(&key).map_err(|e| self.fail(format!("{key}: {e}")))? {
                found.push((key, entry));
            }
        }
        Ok(found)
    }
}

impl<F: LockedFile> Database for KeyedFile<F> {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // These files keep no time of a value's writing: the Unix epoch, the same for every
        // version.
        DateTime::UNIX_EPOCH
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        self.state.lock().entry(key).map_err(|e| self.fail(format!("{key}: {e}")))
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        let mut state = self.state.lock();
        if !state.keys.contains_key(key) {
            return Ok(None);
        }
        let Some(value) = state.file.fetch(key.as_bytes()).map_err(|e| self.fail(format!("{key}: {e}")))? else {
            return Ok(None);
        };
        state.keys.insert(key.to_string(), Some(value.len() as u64));
        let entry = Entry { size: value.len() as u64, version: state.versions.of(key.as_bytes()) };
        admit(&entry)?;
        let range = resolve(self.store, range, entry.size)?;
        let bytes = Bytes::copy_from_slice(&value[range.start as usize..range.end as usize]);
        Ok(Some((entry, range, bytes)))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let mut state = self.state.lock();
        let found = state.entry(key).map_err(|e| self.fail(format!("{key}: {e}")))?;
        match (condition, found) {
            (Condition::Absent, Some(_)) => {
                let source = format!("{key} exists").into();
                return Err(object_store::Error::AlreadyExists { path: key.to_string(), source });
            }
            (Condition::At(version), found) if found.as_ref().map(|e| &e.version) != Some(version) => {
                return Err(changed(key, format!("not at {version}")));
            }
            _ => {}
        }
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        state.file.store(key.as_bytes(), &bytes).map_err(|e| self.fail(format!("{key}: {e}")))?;
        state.keys.insert(key.to_string(), Some(bytes.len() as u64));
        Ok(Entry { size: bytes.len() as u64, version: state.versions.wrote(key.as_bytes()) })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut state = self.state.lock();
        state.file.delete(key.as_bytes()).map_err(|e| self.fail(format!("{key}: {e}")))?;
        state.keys.remove(key);
        state.versions.wrote(key.as_bytes());
        Ok(())
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let mut dirs = Vec::new();
        let files = self.listed(dir, Some(&mut dirs))?;
        Ok(Listing { files, dirs })
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        self.listed(prefix, None)
    }
}
