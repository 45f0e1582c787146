//! An SQLite file as zarr-python 2's `SQLiteStore` lays it out: one table,
//! `zarr(k TEXT PRIMARY KEY, v BLOB)`, a row a key. Reads are SQLite's incremental blob I/O, a
//! byte range of a value and never the whole of it; a write is one transaction.
//!
//! Versions: SQLite keeps none per row. A value's version here is its rowid within an epoch. A
//! row written again gets a new rowid (zarr-python's `REPLACE INTO` deletes the old row and
//! inserts a new one with the next rowid; this store's writes take a rowid above every one it has
//! seen), and the epoch changes whenever another connection has committed anything (SQLite's
//! `PRAGMA data_version`), since a rowid another process freed may have been given again. Every
//! version from before such a commit is then stale: what another process changes is seen as a new
//! version, at the cost of reading the shard indexes again.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;
use rusqlite::blob::ZeroBlob;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::buffers::Buffer;
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "SQLite";

/// How long a statement waits for another process's lock on the file before failing.
const BUSY: Duration = Duration::from_secs(10);

/// The first bytes of every SQLite database file.
pub const MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// True when the local file at `path` starts as an SQLite database does.
pub fn is_sqlite(path: &Path) -> bool {
    use std::io::Read;
    let mut start = [0; 16];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).is_ok() && &start == MAGIC
}

/// An SQLite database of Zarr keys.
#[derive(Debug)]
pub struct Sqlite {
    path: PathBuf,
    name: String,
    /// The file cannot be written by this process.
    read_only: bool,
    state: Mutex<State>,
}

struct State {
    connection: Connection,
    /// `PRAGMA data_version` when last asked: it changes when another connection commits.
    data_version: i64,
    /// Names the versions seen since `data_version` last changed.
    epoch: u64,
    /// The highest rowid named in a version of this epoch: a rowid this store gives is above it,
    /// so that a row deleted here and another inserted never share a version.
    high_rowid: i64,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("epoch", &self.epoch).field("high_rowid", &self.high_rowid).finish()
    }
}

/// A fresh epoch: epochs of two connections (two mounts of one file) never coincide either.
fn new_epoch() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// The size of a value: `length` counts characters of a text value, and reads no overflow page
/// of a blob.
const SIZE: &str = "CASE typeof(v) WHEN 'blob' THEN length(v) ELSE coalesce(octet_length(v), 0) END";

impl Sqlite {
    /// Opens the database at `path`, for writing where the file may be written (else read-only,
    /// as [`Sqlite::read_only`] says); fails, naming the file and the cause, when it is not
    /// zarr-python's layout or stays locked by another process.
    pub fn open(path: &Path) -> std::result::Result<Sqlite, String> {
        let name = path.display().to_string();
        let fail = |e: &rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy) => {
                format!("{name}: locked by another process (waited {} s for it)", BUSY.as_secs())
            }
            _ => format!("{name}: {e}"),
        };
        let open = |flags| Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX);
        let connection = match open(OpenFlags::SQLITE_OPEN_READ_WRITE) {
            Ok(connection) => connection,
            Err(_) => open(OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| fail(&e))?,
        };
        // SQLite opens a file it may not write read-only, without an error.
        let read_only = connection.is_readonly(rusqlite::MAIN_DB).map_err(|e| fail(&e))?;
        connection.busy_timeout(BUSY).map_err(|e| fail(&e))?;
        let columns: Vec<(String, String)> = connection
            .prepare("SELECT name, type FROM pragma_table_info('zarr')")
            .and_then(|mut s| s.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect())
            .map_err(|e| fail(&e))?;
        let expected = [("k".to_string(), "TEXT".to_string()), ("v".to_string(), "BLOB".to_string())];
        if columns != expected {
            return Err(format!(
                "{name}: an SQLite database, but not in zarr-python's SQLiteStore layout: no table zarr(k TEXT PRIMARY KEY, v BLOB)"
            ));
        }
        let data_version = connection.query_row("PRAGMA data_version", [], |r| r.get(0)).map_err(|e| fail(&e))?;
        let state = State { connection, data_version, epoch: new_epoch(), high_rowid: 0 };
        Ok(Sqlite { path: path.to_path_buf(), name, read_only, state: Mutex::new(state) })
    }

    /// True when the file could only be opened for reading.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
    }
}

impl State {
    /// Starts a new epoch when another connection committed since the last look. Called inside
    /// a transaction, after its first read, so that the epoch is the one of what it reads.
    fn look(&mut self) -> rusqlite::Result<()> {
        let now: i64 = self.connection.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        if now != self.data_version {
            self.data_version = now;
            self.epoch = new_epoch();
            self.high_rowid = 0;
        }
        Ok(())
    }

    fn entry_of(&mut self, rowid: i64, size: i64) -> Entry {
        self.high_rowid = self.high_rowid.max(rowid);
        Entry { size: size.max(0) as u64, version: format!("{:x}-{rowid}", self.epoch) }
    }

    /// The rowid and size of `key`, read in the transaction open.
    fn row(&self, key: &str) -> rusqlite::Result<Option<(i64, i64)>> {
        self.connection
            .prepare_cached(&format!("SELECT rowid, {SIZE} FROM zarr WHERE k = ?1"))?
            .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    }

    /// Runs `work` in a transaction that began with `begin`, committed if `work` succeeds.
    fn within<T>(
        &mut self,
        begin: TransactionBehavior,
        work: impl FnOnce(&mut State) -> Result<T>,
        fail: impl Fn(rusqlite::Error) -> object_store::Error,
    ) -> Result<T> {
        let begin = match begin {
            TransactionBehavior::Immediate => "BEGIN IMMEDIATE",
            _ => "BEGIN",
        };
        self.connection.execute_batch(begin).map_err(&fail)?;
        // A read takes the file's shared lock (or fixes a WAL snapshot) for the transaction; the
        // epoch is looked at after it, so that what is read is never named by an older epoch.
        let looked = self
            .connection
            .query_row("SELECT count(*) FROM (SELECT 1 FROM zarr LIMIT 1)", [], |_| Ok(()))
            .and_then(|()| self.look());
        if let Err(e) = looked {
            let _ = self.connection.execute_batch("ROLLBACK");
            return Err(fail(e));
        }
        match work(self) {
            Ok(done) => match self.connection.execute_batch("COMMIT") {
                Ok(()) => Ok(done),
                // A failed COMMIT (the file busy past the timeout) leaves the transaction open.
                Err(e) => {
                    let _ = self.connection.execute_batch("ROLLBACK");
                    Err(fail(e))
                }
            },
            Err(e) => {
                let _ = self.connection.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

impl Database for Sqlite {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        std::fs::metadata(&self.path).and_then(|m| m.modified()).map(DateTime::from).unwrap_or_else(|_| Utc::now())
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Deferred,
            |state| {
                let row = state.row(key).map_err(fail)?;
                Ok(row.map(|(rowid, size)| state.entry_of(rowid, size)))
            },
            fail,
        )
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Deferred,
            |state| {
                let Some((rowid, size)) = state.row(key).map_err(fail)? else { return Ok(None) };
                let entry = state.entry_of(rowid, size);
                admit(&entry)?;
                let range = resolve(STORE, range, entry.size)?;
                let mut bytes = Buffer::of((range.end - range.start) as usize);
                if !bytes.is_empty() {
                    let blob =
                        state.connection.blob_open(rusqlite::MAIN_DB, c"zarr", c"v", rowid, true).map_err(fail)?;
                    blob.read_at_exact(&mut bytes, range.start as usize).map_err(fail)?;
                }
                Ok(Some((entry, range, bytes.into_bytes())))
            },
            fail,
        )
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Immediate,
            |state| {
                let old = state.row(key).map_err(fail)?.map(|(rowid, size)| state.entry_of(rowid, size));
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
                let highest: i64 = state
                    .connection
                    .query_row("SELECT coalesce(max(rowid), 0) FROM zarr", [], |r| r.get(0))
                    .map_err(fail)?;
                let rowid = highest
                    .max(state.high_rowid)
                    .checked_add(1)
                    .ok_or_else(|| self.fail("no rowid is left above the highest"))?;
                let size = value.content_length();
                state
                    .connection
                    .prepare_cached("DELETE FROM zarr WHERE k = ?1")
                    .and_then(|mut s| s.execute([key]))
                    .map_err(fail)?;
                state
                    .connection
                    .prepare_cached("INSERT INTO zarr(rowid, k, v) VALUES (?1, ?2, ?3)")
                    .and_then(|mut s| s.execute(rusqlite::params![rowid, key, ZeroBlob(size as u64)]))
                    .map_err(fail)?;
                if size > 0 {
                    let mut blob =
                        state.connection.blob_open(rusqlite::MAIN_DB, c"zarr", c"v", rowid, false).map_err(fail)?;
                    let mut at = 0;
                    for piece in value.iter() {
                        blob.write_at(piece, at).map_err(fail)?;
                        at += piece.len();
                    }
                }
                Ok(state.entry_of(rowid, size as i64))
            },
            fail,
        )
    }

    fn delete(&self, key: &str) -> Result<()> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Immediate,
            |state| {
                state
                    .connection
                    .prepare_cached("DELETE FROM zarr WHERE k = ?1")
                    .and_then(|mut s| s.execute([key]))
                    .map_err(fail)?;
                Ok(())
            },
            fail,
        )
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Deferred,
            |state| {
                let (mut files, mut dirs) = (Vec::new(), Vec::new());
                let mut from = dir.to_string();
                let end = after(dir);
                // Each directory found is skipped over in one seek: a listing costs its entries,
                // not the keys below it.
                'seek: loop {
                    let mut statement = state
                        .connection
                        .prepare_cached(&format!(
                            "SELECT k, rowid, {SIZE} FROM zarr WHERE k >= ?1 AND (?2 IS NULL OR k < ?2) ORDER BY k"
                        ))
                        .map_err(fail)?;
                    let mut rows = statement.query(rusqlite::params![from, end]).map_err(fail)?;
                    let mut found = Vec::new();
                    let mut next_dir = None;
                    while let Some(row) = rows.next().map_err(fail)? {
                        let key: String = row.get(0).map_err(fail)?;
                        let Some(name) = key.strip_prefix(dir) else { break };
                        match name.split_once('/') {
                            Some((sub, _)) => {
                                next_dir = Some(sub.to_string());
                                break;
                            }
                            None if !name.is_empty() => {
                                found.push((key.clone(), row.get(1).map_err(fail)?, row.get(2).map_err(fail)?))
                            }
                            None => {}
                        }
                    }
                    drop(rows);
                    drop(statement);
                    for (key, rowid, size) in found {
                        let entry = state.entry_of(rowid, size);
                        files.push((key, entry));
                    }
                    match next_dir {
                        Some(sub) => {
                            from = after(&format!("{dir}{sub}/")).expect("a prefix ending in / has a successor");
                            dirs.push(sub);
                        }
                        None => break 'seek,
                    }
                }
                Ok(Listing { files, dirs })
            },
            fail,
        )
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        let fail = |e| self.fail(e);
        self.state.lock().within(
            TransactionBehavior::Deferred,
            |state| {
                let rows: Vec<(String, i64, i64)> = state
                    .connection
                    .prepare_cached(&format!(
                        "SELECT k, rowid, {SIZE} FROM zarr WHERE k >= ?1 AND (?2 IS NULL OR k < ?2) ORDER BY k"
                    ))
                    .and_then(|mut s| {
                        s.query_map(rusqlite::params![prefix, after(prefix)], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        })?
                        .collect()
                    })
                    .map_err(fail)?;
                let below = rows.into_iter().filter(|(key, _, _)| key.starts_with(prefix));
                Ok(below.map(|(key, rowid, size)| (key, state.entry_of(rowid, size))).collect())
            },
            fail,
        )
    }
}

/// The least string above every string starting with `prefix` (`None`: there is none, or the
/// prefix is empty). Keys compare as bytes, as SQLite's BINARY collation compares text.
fn after(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;

    /// A new database file in zarr-python's layout, removed when the guard is dropped.
    fn temp_database(label: &str) -> (Removed, PathBuf) {
        let dir = std::env::temp_dir().join(format!("shardfs-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.sqlite");
        Connection::open(&path).unwrap().execute_batch("CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)").unwrap();
        (Removed(dir), path)
    }

    struct Removed(PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn passes_the_conformance_checks() {
        let (_dir, path) = temp_database("sqlite-conformance");
        let store =
            Objects::mount(Sqlite::open(&path).unwrap(), "SQLite", "test.sqlite", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
    }

    #[test]
    fn a_row_another_process_replaces_under_the_same_rowid_is_another_version() {
        let (_dir, path) = temp_database("sqlite-versions");
        let other = Connection::open(&path).unwrap();
        other.execute("INSERT INTO zarr VALUES ('a/c/0', x'0102')", []).unwrap();
        let database = Sqlite::open(&path).unwrap();
        let seen = database.entry("a/c/0").unwrap().unwrap();
        // Deleted and inserted again: the same rowid (the highest) and size, other bytes.
        other.execute_batch("DELETE FROM zarr; INSERT INTO zarr VALUES ('a/c/0', x'0304')").unwrap();
        let now = database.entry("a/c/0").unwrap().unwrap();
        assert_ne!(seen.version, now.version);
        let (read, _, bytes) = database.read("a/c/0", None, &|_| Ok(())).unwrap().unwrap();
        assert_eq!((read, &bytes[..]), (now, &[3u8, 4][..]));
    }

    #[test]
    fn a_read_of_a_changed_version_fails_its_precondition_whatever_its_range() {
        use object_store::{GetOptions, ObjectStore};
        let (_dir, path) = temp_database("sqlite-precondition");
        let objects = Objects(std::sync::Arc::new(Sqlite::open(&path).unwrap()));
        let long = objects.0.write("k", &PutPayload::from(vec![7u8; 100]), &Condition::Any).unwrap();
        objects.0.write("k", &PutPayload::from_static(b"short"), &Condition::Any).unwrap();
        let options = GetOptions {
            if_match: Some(format!("\"{}\"", long.version)),
            range: Some(GetRange::Bounded(50..60)),
            ..Default::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let read = runtime.block_on(objects.get_opts(&object_store::path::Path::from("k"), options));
        assert!(matches!(read, Err(object_store::Error::Precondition { .. })), "{read:?}");
    }

    #[test]
    fn rowids_freed_here_are_not_given_again() {
        let (_dir, path) = temp_database("sqlite-rowids");
        let database = Sqlite::open(&path).unwrap();
        let first = database.write("k", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.delete("k").unwrap();
        let second = database.write("k", &PutPayload::from_static(b"two"), &Condition::Any).unwrap();
        assert_ne!(first.version, second.version);
        let stale = database.write("k", &PutPayload::from_static(b"three"), &Condition::At(first.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
    }

    #[test]
    fn a_listing_names_each_directory_once_and_only_its_own_files() {
        let (_dir, path) = temp_database("sqlite-listing");
        let database = Sqlite::open(&path).unwrap();
        crate::store::database::check_listing(&database);
    }
}
