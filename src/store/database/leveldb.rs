//! A LevelDB directory of Zarr keys, as plyvel users write one: keys the Zarr keys in UTF-8,
//! values the bytes. Through Debian's LevelDB library ([`library`]), the reference
//! implementation, so that what plyvel (which bundles the same library) writes is read exactly.
//!
//! LevelDB lets one process at a time open a database (its `LOCK` file): while mounted, this
//! mount is the database's only writer, and another process's open fails; a database another
//! process holds is refused before mounting. So versions are this mount's own ([`Versions`]).
//!
//! A value is read whole (an iterator seeks the key, and LevelDB decompresses the block that
//! holds it at every seek) and kept for the reads that follow ([`Recent`]: a chunk file looked
//! up, then read in pieces); writes are synced to disk before they return (LevelDB's `sync`).

mod library;

use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::{Mutex, RwLock};

use super::buffers::Buffer;
use super::recent::Recent;
use super::sole::{Registered, Versions};
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "LevelDB";

/// True when `dir` holds a LevelDB: its `CURRENT` file names a manifest.
pub fn is_leveldb(dir: &Path) -> bool {
    std::fs::read(dir.join("CURRENT")).is_ok_and(|current| current.starts_with(b"MANIFEST-"))
}

/// A LevelDB of Zarr keys, open for this process alone.
pub struct LevelDb {
    name: String,
    database: library::Database,
    versions: RwLock<Versions>,
    /// The values last read; taken and changed under `versions`' lock (read, then write), so that
    /// no value a write replaced is kept.
    recent: Mutex<Recent>,
    /// Last: given up once the database is closed.
    _registered: Registered,
}

impl std::fmt::Debug for LevelDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LevelDb").field("name", &self.name).finish()
    }
}

impl LevelDb {
    /// Opens the LevelDB in `dir`; fails, naming it and the cause, when another process holds it,
    /// it is damaged, or the library is missing.
    pub fn open(dir: &Path) -> std::result::Result<LevelDb, String> {
        let name = dir.display().to_string();
        let registered = Registered::open(dir, &name)?;
        let database = library::Database::open(dir, false).map_err(|e| {
            if e.contains("lock") {
                format!("{name}: held by another process (LevelDB lets one process at a time open it): {e}")
            } else {
                format!("{name}: {e}")
            }
        })?;
        let versions = RwLock::new(Versions::new(dir));
        Ok(LevelDb { name, database, versions, recent: Mutex::default(), _registered: registered })
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
    }

    /// The size of the value at `key` and the value's bytes `range` of it, if there is one; the
    /// caller holds the versions' lock.
    fn look<T>(&self, key: &str, take: impl FnOnce(&[u8]) -> Result<T>) -> Result<Option<T>> {
        let mut cursor = self.database.iter();
        cursor.seek(key.as_bytes());
        match cursor.current().map_err(|e| self.fail(e))? {
            Some((found, value)) if found == key.as_bytes() => take(value).map(Some),
            _ => Ok(None),
        }
    }

    /// The value at `key`, kept or read now (and kept); the caller holds the versions' lock.
    fn value(&self, key: &str) -> Result<Option<Bytes>> {
        if let Some(kept) = self.recent.lock().get(key) {
            return Ok(Some(kept));
        }
        let value = self.look(key, |value| Ok(Buffer::copy(value)))?;
        if let Some(value) = &value {
            self.recent.lock().keep(key, value.clone());
        }
        Ok(value)
    }

    /// Goes through the keys starting with `prefix` in byte order, giving `visit` each key (as
    /// text), its value's size and the cursor, which it may move on past what it skips.
    fn scan(&self, prefix: &str, mut visit: impl FnMut(&str, u64) -> Option<Vec<u8>>) -> Result<()> {
        let mut cursor = self.database.iter();
        cursor.seek(prefix.as_bytes());
        while let Some((key, value)) = cursor.current().map_err(|e| self.fail(e))? {
            if !key.starts_with(prefix.as_bytes()) {
                break;
            }
            let skip = match std::str::from_utf8(key) {
                Ok(key) => visit(key, value.len() as u64),
                Err(_) => {
                    log::warn!("{}: a key that is not UTF-8 left out: {key:?}", self.name);
                    None
                }
            };
            match skip {
                Some(past) => cursor.seek(&past),
                None => cursor.next(),
            }
        }
        Ok(())
    }
}

impl Database for LevelDb {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // LevelDB keeps no time of a value's writing: the Unix epoch, the same for every version.
        DateTime::UNIX_EPOCH
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        let versions = self.versions.read();
        let value = self.value(key)?;
        Ok(value.map(|value| Entry { size: value.len() as u64, version: versions.of(key.as_bytes()) }))
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        let versions = self.versions.read();
        let Some(value) = self.value(key)? else { return Ok(None) };
        let entry = Entry { size: value.len() as u64, version: versions.of(key.as_bytes()) };
        admit(&entry)?;
        let range = resolve(STORE, range, entry.size)?;
        let bytes = Recent::piece(&value, range.start as usize..range.end as usize);
        Ok(Some((entry, range, bytes)))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let mut versions = self.versions.write();
        let found = self.look(key, |_| Ok(versions.of(key.as_bytes())))?;
        match (condition, found) {
            (Condition::Absent, Some(_)) => {
                let source = format!("{key} exists").into();
                return Err(object_store::Error::AlreadyExists { path: key.to_string(), source });
            }
            (Condition::At(version), found) if found.as_ref() != Some(version) => {
                return Err(changed(key, format!("not at {version}")));
            }
            _ => {}
        }
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        self.recent.lock().forget(key);
        self.database.put(key.as_bytes(), &bytes).map_err(|e| self.fail(format!("{key}: {e}")))?;
        Ok(Entry { size: bytes.len() as u64, version: versions.wrote(key.as_bytes()) })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut versions = self.versions.write();
        self.recent.lock().forget(key);
        self.database.delete(key.as_bytes()).map_err(|e| self.fail(format!("{key}: {e}")))?;
        versions.wrote(key.as_bytes());
        Ok(())
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let versions = self.versions.read();
        let mut listing = Listing::default();
        self.scan(dir, |key, size| {
            let name = &key[dir.len()..];
            match name.split_once('/') {
                Some((sub, _)) => {
                    if !sub.is_empty() {
                        listing.dirs.push(sub.to_string());
                    }
                    // On past every key of the subdirectory: '0' follows '/'.
                    Some(format!("{dir}{sub}0").into_bytes())
                }
                None => {
                    if !name.is_empty() {
                        let entry = Entry { size, version: versions.of(key.as_bytes()) };
                        listing.files.push((key.to_string(), entry));
                    }
                    None
                }
            }
        })?;
        Ok(listing)
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        let versions = self.versions.read();
        let mut found = Vec::new();
        self.scan(prefix, |key, size| {
            found.push((key.to_string(), Entry { size, version: versions.of(key.as_bytes()) }));
            None
        })?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;

    /// A new empty LevelDB, removed when the guard is dropped; `None` (said loudly) where the
    /// library is missing, unless `SHARDFS_REQUIRE_LEVELDB=1` (`.ci/run`) makes that a failure.
    fn temp_database(label: &str) -> Option<(Removed, std::path::PathBuf)> {
        let dir = std::env::temp_dir().join(format!("shardfs-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        match library::Database::open(&dir, true) {
            Ok(made) => drop(made),
            Err(e) if e.contains("not installed") && std::env::var("SHARDFS_REQUIRE_LEVELDB").as_deref() != Ok("1") => {
                eprintln!("*** SKIPPED: {e} ***");
                return None;
            }
            Err(e) => panic!("{e}"),
        }
        Some((Removed(dir.clone()), dir))
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn passes_the_conformance_checks() {
        let Some((_dir, path)) = temp_database("leveldb-conformance") else { return };
        let store = Objects::mount(LevelDb::open(&path).unwrap(), STORE, "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_a_second_open_is_refused() {
        let Some((_dir, path)) = temp_database("leveldb-versions") else { return };
        let database = LevelDb::open(&path).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let twice = LevelDb::open(&path).unwrap_err();
        assert!(twice.contains("already open in this process"), "{twice}");
        // Another process is refused (plyvel's refusal is in tests/interop/test_databases.py).
        drop(database);
        // Opened again: the values are there, at versions of the new open.
        let again = LevelDb::open(&path).unwrap();
        let entry = again.entry("a").unwrap().unwrap();
        assert_eq!(entry.size, 3);
        assert_ne!(entry.version, two.version);
    }

    #[test]
    fn a_value_kept_once_read_is_never_served_after_a_write_or_removal() {
        let Some((_dir, path)) = temp_database("leveldb-kept") else { return };
        let database = LevelDb::open(&path).unwrap();
        let read = |range: Option<&GetRange>| database.read("a", range, &|_| Ok(())).unwrap().map(|(_, _, b)| b);
        database.write("a", &PutPayload::from_static(b"first value"), &Condition::Any).unwrap();
        assert_eq!(read(None).as_deref(), Some(&b"first value"[..]));
        assert_eq!(read(Some(&GetRange::Bounded(6..11))).as_deref(), Some(&b"value"[..]), "from the value kept");
        database.write("a", &PutPayload::from_static(b"second"), &Condition::Any).unwrap();
        assert_eq!(read(None).as_deref(), Some(&b"second"[..]));
        assert_eq!(database.entry("a").unwrap().map(|e| e.size), Some(6));
        database.delete("a").unwrap();
        assert_eq!(read(None), None);
        assert_eq!(database.entry("a").unwrap(), None);
    }

    #[test]
    fn a_listing_names_each_directory_once_and_only_its_own_files() {
        let Some((_dir, path)) = temp_database("leveldb-listing") else { return };
        crate::store::database::check_listing(&LevelDb::open(&path).unwrap());
    }
}
