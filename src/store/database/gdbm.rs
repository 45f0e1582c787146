//! A GNU dbm file of Zarr keys, as zarr-python 2's `DBMStore` writes one over `dbm.gnu`: keys the
//! Zarr keys in ASCII, values the bytes. Through Debian's GNU dbm library ([`library`]), the one
//! Python's `dbm.gnu` uses, loaded when such a file is mounted.
//!
//! GNU dbm locks its file: a writer alone, or readers only. A writable mount is the writer, so
//! nothing else changes the file while it is mounted, and a read-only mount is a reader, so
//! nothing writes it meanwhile either; a file another process holds is refused before mounting.
//! Versions are then this mount's own ([`Versions`]). GNU dbm is a hash with no order of keys, and
//! tells a value's size only by reading it: the keys are read once at open into an ordered index
//! (kept up to date by this mount's writes), and each value's size is learnt when first needed.
//! A read reads the whole value (GNU dbm reads no part of one) and gives the range asked for;
//! each write is synced to disk before it returns.

mod library;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;

use super::sole::Versions;
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "GNU dbm";

/// True when the local file at `path` starts as a GNU dbm file does.
pub fn is_gdbm(path: &Path) -> bool {
    use std::io::Read;
    let mut start = [0; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).is_ok() && library::is_gdbm(&start)
}

/// A GNU dbm file of Zarr keys, locked by this process.
pub struct Gdbm {
    name: String,
    read_only: bool,
    state: Mutex<State>,
}

impl std::fmt::Debug for Gdbm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gdbm").field("name", &self.name).finish()
    }
}

struct State {
    file: library::File,
    /// Every key, with its value's size once known.
    keys: BTreeMap<String, Option<u64>>,
    versions: Versions,
}

impl State {
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

impl Gdbm {
    /// Opens the file at `path`, as its writer unless `read_only`; fails, naming it and the
    /// cause, when another process holds it, it is damaged, or the library is missing.
    pub fn open(path: &Path, read_only: bool) -> std::result::Result<Gdbm, String> {
        let name = path.display().to_string();
        let mut file = library::File::open(path, !read_only).map_err(|e| match e {
            library::OpenError::Held(why) => format!(
                "{name}: held by another process ({why}: GNU dbm lets one writer, or only readers, open a file)"
            ),
            library::OpenError::Other(why) => format!("{name}: {why}"),
        })?;
        let mut keys = BTreeMap::new();
        for key in file.keys() {
            match String::from_utf8(key) {
                Ok(key) => {
                    keys.insert(key, None);
                }
                Err(e) => log::warn!("{name}: a key that is not UTF-8 left out: {:?}", e.as_bytes()),
            }
        }
        let state = State { file, keys, versions: Versions::new(path) };
        Ok(Gdbm { name, read_only, state: Mutex::new(state) })
    }

    /// True when opened as a reader.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
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

impl Database for Gdbm {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // GNU dbm keeps no time of a value's writing: the Unix epoch, the same for every version.
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
        let range = resolve(STORE, range, entry.size)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;

    /// A new empty GNU dbm file, removed when the guard is dropped; `None` (said loudly) where
    /// the library is missing, unless `SHARDFS_REQUIRE_GDBM=1` (`.ci/run`) makes that a failure.
    fn temp_file(label: &str) -> Option<(Removed, std::path::PathBuf)> {
        let path = std::env::temp_dir().join(format!("shardfs-{label}-{}.gdbm", std::process::id()));
        let _ = std::fs::remove_file(&path);
        std::fs::File::create(&path).unwrap();
        // GNU dbm writes its header into an empty file it opens as a writer.
        match library::File::open(&path, true) {
            Ok(made) => drop(made),
            Err(library::OpenError::Other(e))
                if e.contains("not installed") && std::env::var("SHARDFS_REQUIRE_GDBM").as_deref() != Ok("1") =>
            {
                eprintln!("*** SKIPPED: {e} ***");
                return None;
            }
            Err(library::OpenError::Held(e) | library::OpenError::Other(e)) => panic!("{e}"),
        }
        assert!(is_gdbm(&path));
        Some((Removed(path.clone()), path))
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn passes_the_conformance_checks() {
        let Some((_file, path)) = temp_file("gdbm-conformance") else { return };
        let store =
            Objects::mount(Gdbm::open(&path, false).unwrap(), STORE, "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_a_held_file_is_refused() {
        let Some((_file, path)) = temp_file("gdbm-versions") else { return };
        let database = Gdbm::open(&path, false).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let held = Gdbm::open(&path, true).unwrap_err();
        assert!(held.contains("held by another process"), "{held}");
        drop(database);
        // Opened again, as a reader: the values are there, with their sizes.
        let again = Gdbm::open(&path, true).unwrap();
        assert_eq!(again.entry("a").unwrap().map(|e| e.size), Some(3));
        assert_eq!(again.list_all("").unwrap().len(), 2);
    }

    #[test]
    fn a_listing_names_each_directory_once_and_only_its_own_files() {
        let Some((_file, path)) = temp_file("gdbm-listing") else { return };
        crate::store::database::check_listing(&Gdbm::open(&path, false).unwrap());
    }
}
