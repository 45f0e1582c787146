//! An LMDB environment as zarr-python 2's `LMDBStore` writes it: a directory holding `data.mdb`
//! and `lock.mdb`, one unnamed database of Zarr keys (UTF-8) to values. A read copies the range
//! asked for straight from the memory map, inside a read transaction; a write is one write
//! transaction, synced when it commits.
//!
//! Versions: LMDB keeps none per value. A value's version here is an epoch and a count of this
//! store's own writes of that key within it; the epoch changes whenever a transaction this store
//! did not make has committed (the environment's last transaction ID moved on by itself), since a
//! value another process wrote leaves no other trace. Every version from before such a commit is
//! then stale: what another process changes is seen as a new version, at the cost of reading the
//! shard indexes again.
//!
//! Another process may hold the environment open meanwhile only if its LMDB has the same lock
//! format: py-lmdb's bundled LMDB 0.9 does not share heed's (LMDB's master branch), and whichever
//! opens it second fails with MDB_VERSION_MISMATCH, naming it.

use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use heed::types::Bytes as Raw;
use heed::{CommitOrAbort, Env, EnvFlags, EnvOpenOptions, RoTxn, WithoutTls};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;

use super::buffers::Buffer;
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "LMDB";

type Db = heed::Database<'static, Raw, Raw>;

/// The map's size: the address space it may take (zarr-python's LMDBStore default, 1 TiB); the
/// file grows only as data is written.
const MAP_SIZE: usize = 1 << 40;

/// True when `dir` holds an LMDB environment.
pub fn is_lmdb(dir: &Path) -> bool {
    dir.join("data.mdb").is_file()
}

/// An LMDB environment of Zarr keys.
pub struct Lmdb {
    env: Env<WithoutTls>,
    /// The unnamed database, where the keys are.
    db: Db,
    path: std::path::PathBuf,
    name: String,
    read_only: bool,
    /// Held through every transaction, so that versions are told in the order of commits.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last transaction this store knows of: its own last commit, or what it saw.
    seen: usize,
    epoch: u64,
    /// This store's writes of each key in this epoch.
    written: HashMap<String, u64>,
    writes: u64,
}

impl std::fmt::Debug for Lmdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lmdb").field("name", &self.name).field("read_only", &self.read_only).finish()
    }
}

/// A fresh epoch: epochs of two mounts of one environment never coincide either.
fn new_epoch() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

impl State {
    /// Starts a new epoch when the transaction `at` (a read transaction's snapshot, or the one
    /// before a write transaction) is not the last one this store knows of.
    fn look(&mut self, at: usize) {
        if at != self.seen {
            self.seen = at;
            self.epoch = new_epoch();
            self.written.clear();
        }
    }

    fn entry(&self, key: &str, size: usize) -> Entry {
        Entry { size: size as u64, version: format!("{:x}-{}", self.epoch, self.written.get(key).unwrap_or(&0)) }
    }
}

impl Lmdb {
    /// Opens the environment in `dir`, for writing where the directory may be written (else
    /// read-only, as [`Lmdb::read_only`] says); fails naming it and the cause.
    pub fn open(dir: &Path) -> std::result::Result<Lmdb, String> {
        let name = dir.display().to_string();
        let open = |read_only: bool| {
            // A read transaction holds a slot of the environment's reader table only while it
            // lasts, not for the life of the thread that began it: each of a mount's threads
            // (the kernel's, the runtime's) would otherwise keep one, and eight mounts ran out of
            // LMDB's 126 (MDB_READERS_FULL).
            let mut options = EnvOpenOptions::new().read_txn_without_tls();
            options.map_size(MAP_SIZE).max_dbs(0);
            if read_only {
                // SAFETY: a flag of how the environment is opened, with no other requirement.
                unsafe { options.flags(EnvFlags::READ_ONLY) };
            }
            // SAFETY: heed asks that an environment be opened once per process and its files not
            // be cut short while open; each mount is a process of its own, and opens it here once
            // (a second try only after the first failed).
            unsafe { options.open(dir) }
        };
        let describe = |e: heed::Error| match e {
            heed::Error::Mdb(heed::MdbError::VersionMismatch) => format!(
                "{name}: cannot open the LMDB environment: another process holds it open with another LMDB's lock \
                 format (py-lmdb's LMDB 0.9); close it there first"
            ),
            e => format!("{name}: cannot open the LMDB environment: {e}"),
        };
        // Where the files may not be written, for reading only.
        let (env, writable) = match open(false) {
            Ok(env) => (env, true),
            Err(heed::Error::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                (open(true).map_err(describe)?, false)
            }
            Err(e) => return Err(describe(e)),
        };
        let rtxn = env.read_txn().map_err(|e| format!("{name}: {e}"))?;
        let opened = env.open_databases_and_commit(rtxn, |opener, rtxn| -> heed::Result<_> {
            Ok(CommitOrAbort::<_, ()>::Commit(opener.open_database::<Raw, Raw>(rtxn, None)?))
        });
        let db = match opened.map_err(|e| format!("{name}: {e}"))? {
            CommitOrAbort::Commit(Some(db)) => db,
            _ => return Err(format!("{name}: an LMDB environment without its unnamed database")),
        };
        let state = Mutex::new(State { epoch: new_epoch(), ..State::default() });
        let lmdb = Lmdb { env, db, path: dir.to_path_buf(), name, read_only: !writable, state };
        Ok(lmdb)
    }

    /// True when the environment could only be opened for reading.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
    }

    /// Runs `work` in a read transaction, with the state looked at.
    fn reading<T>(&self, work: impl FnOnce(&RoTxn, Db, &mut State) -> Result<T>) -> Result<T> {
        let mut state = self.state.lock();
        let rtxn = self.env.read_txn().map_err(|e| self.fail(e))?;
        state.look(rtxn.id());
        work(&rtxn, self.db, &mut state)
    }

    /// Visits each key from `from` (included) below `prefix`, with its value's size, in order,
    /// while `visit` answers true.
    fn keys(
        &self,
        rtxn: &RoTxn,
        db: Db,
        prefix: &str,
        from: &str,
        mut visit: impl FnMut(&str, usize) -> bool,
    ) -> Result<()> {
        // LMDB has no empty key to start from.
        let start =
            if from.is_empty() { std::ops::Bound::Unbounded } else { std::ops::Bound::Included(from.as_bytes()) };
        let range = (start, std::ops::Bound::Unbounded);
        for item in db.range(rtxn, &range).map_err(|e| self.fail(e))? {
            let (key, value) = item.map_err(|e| self.fail(e))?;
            if !key.starts_with(prefix.as_bytes()) {
                break;
            }
            match std::str::from_utf8(key) {
                Ok(key) if !visit(key, value.len()) => break,
                Ok(_) => {}
                Err(_) => log::warn!("{}: a key that is not UTF-8 left out: {key:?}", self.name),
            }
        }
        Ok(())
    }
}

impl Database for Lmdb {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        let data = self.path.join("data.mdb");
        std::fs::metadata(data).and_then(|m| m.modified()).map(DateTime::from).unwrap_or_else(|_| Utc::now())
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        self.reading(|rtxn, db, state| {
            let value = db.get(rtxn, key.as_bytes()).map_err(|e| self.fail(e))?;
            Ok(value.map(|value| state.entry(key, value.len())))
        })
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        self.reading(|rtxn, db, state| {
            let Some(value) = db.get(rtxn, key.as_bytes()).map_err(|e| self.fail(e))? else { return Ok(None) };
            let entry = state.entry(key, value.len());
            admit(&entry)?;
            let range = resolve(STORE, range, entry.size)?;
            let bytes = Buffer::copy(&value[range.start as usize..range.end as usize]);
            Ok(Some((entry, range, bytes)))
        })
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        // The environment's write lock first, then the state: readers, which hold the state,
        // never wait for another process's writer.
        let mut wtxn = self.env.write_txn().map_err(|e| self.fail(e))?;
        let mut state = self.state.lock();
        let db = self.db;
        state.look(wtxn.id() - 1);
        let old = db.get(&wtxn, key.as_bytes()).map_err(|e| self.fail(e))?.map(|v| state.entry(key, v.len()));
        match (condition, &old) {
            (Condition::Absent, Some(_)) => {
                let source = format!("{key} exists").into();
                return Err(object_store::Error::AlreadyExists { path: key.to_string(), source });
            }
            (Condition::At(version), Some(old)) if *version != old.version => {
                return Err(changed(key, format!("at {}, not {version}", old.version)));
            }
            (Condition::At(version), None) => return Err(changed(key, format!("gone, not at {version}"))),
            _ => {}
        }
        let size = value.content_length();
        let slot = db.put_reserved(&mut wtxn, key.as_bytes(), size, |reserved| {
            for piece in value.iter() {
                reserved.write_all(piece)?;
            }
            Ok(())
        });
        slot.map_err(|e| self.fail(e))?;
        let id = wtxn.id();
        wtxn.commit().map_err(|e| self.fail(e))?;
        state.seen = id;
        state.writes += 1;
        let writes = state.writes;
        state.written.insert(key.to_string(), writes);
        Ok(state.entry(key, size))
    }

    fn delete(&self, key: &str) -> Result<()> {
        // The environment's write lock first, then the state: readers, which hold the state,
        // never wait for another process's writer.
        let mut wtxn = self.env.write_txn().map_err(|e| self.fail(e))?;
        let mut state = self.state.lock();
        let db = self.db;
        state.look(wtxn.id() - 1);
        db.delete(&mut wtxn, key.as_bytes()).map_err(|e| self.fail(e))?;
        let id = wtxn.id();
        wtxn.commit().map_err(|e| self.fail(e))?;
        state.seen = id;
        state.writes += 1;
        let writes = state.writes;
        state.written.insert(key.to_string(), writes);
        Ok(())
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        self.reading(|rtxn, db, state| {
            let mut listing = Listing::default();
            let mut from = dir.to_string();
            // Each directory found is skipped over in one seek: a listing costs its entries, not
            // the keys below it.
            'seek: loop {
                let mut next = None;
                self.keys(rtxn, db, dir, &from, |key, size| {
                    let name = &key[dir.len()..];
                    match name.split_once('/') {
                        Some((sub, _)) => {
                            next = Some(format!("{dir}{sub}0"));
                            listing.dirs.push(sub.to_string());
                            return false;
                        }
                        None if !name.is_empty() => listing.files.push((key.to_string(), state.entry(key, size))),
                        None => {}
                    }
                    true
                })?;
                match next {
                    Some(after_dir) => from = after_dir,
                    None => break 'seek,
                }
            }
            Ok(listing)
        })
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        self.reading(|rtxn, db, state| {
            let mut found = Vec::new();
            self.keys(rtxn, db, prefix, prefix, |key, size| {
                found.push((key.to_string(), state.entry(key, size)));
                true
            })?;
            Ok(found)
        })
    }

    /// A range is copied out of the environment's map, which is the file's pages.
    fn reads_in_place(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;

    /// A new empty environment, removed when the guard is dropped.
    fn temp_environment(label: &str) -> (Removed, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("shardfs-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: opened once, closed before the store opens it.
        let env = unsafe { EnvOpenOptions::new().map_size(1 << 20).open(&dir) }.unwrap();
        env.prepare_for_closing().wait();
        (Removed(dir.clone()), dir)
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn passes_the_conformance_checks() {
        let (_dir, path) = temp_environment("lmdb-conformance");
        let store = Objects::mount(Lmdb::open(&path).unwrap(), "LMDB", "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_stand_between_them() {
        let (_dir, path) = temp_environment("lmdb-versions");
        let database = Lmdb::open(&path).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
    }

    #[test]
    fn a_listing_names_each_directory_once_and_only_its_own_files() {
        let (_dir, path) = temp_environment("lmdb-listing");
        let database = Lmdb::open(&path).unwrap();
        crate::store::database::check_listing(&database);
    }
}
