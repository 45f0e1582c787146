//! Databases as stores: zarr-python 2's `SQLiteStore`, `LMDBStore`, `RedisStore` and `DBMStore`
//! (GNU dbm) layouts, a LevelDB, a Kyoto Cabinet file and a PostgreSQL table, each a flat map of Zarr keys to values, served as an object store ([`Objects`]) under the same
//! [`BucketStore`] every object store is served through. A database then reads and writes as a
//! bucket does: ranged reads checked against the version opened, whole-value writes made
//! conditional on the version read (so two mounts writing one shard never overwrite each other),
//! directories from the keys' `/`-separated prefixes, plain files held in the process until
//! synced.
//!
//! - [`sqlite`]: an SQLite file with the table `zarr(k TEXT PRIMARY KEY, v BLOB)`, read with
//!   incremental blob I/O.
//! - [`lmdb`]: an LMDB environment's unnamed database, read from its memory map.
//! - [`gdbm`]: a GNU dbm file's keys (zarr-python 2's `DBMStore` over `dbm.gnu`), through
//!   Debian's GNU dbm library.
//! - [`bdb`]: a Berkeley DB hash or btree file's keys (zarr-python 2's `DBMStore` over
//!   `berkeleydb` or `bsddb3`), through Debian's Berkeley DB 5.3 library.
//! - [`kyoto`]: a Kyoto Cabinet hash or tree file's keys, through Debian's Kyoto Cabinet library.
//! - [`leveldb`]: a LevelDB directory's keys, read and written through Debian's LevelDB library.
//! - [`redis`]: a Redis database's keys `PREFIX:KEY`, versions known from the server's
//!   invalidations of the values read (`CLIENT TRACKING`).
//! - [`postgres`]: a PostgreSQL table `(key, value)`, versions the server's own row versions.
//!
//! A backend implements [`Database`]: entries with versions, ranged reads consistent with the
//! version they report, and writes that check a condition and commit in one transaction. What an
//! object store's protocol adds (preconditions of reads, listings by delimiter, copies, uploads in
//! parts) is done here once.

pub mod bdb;
mod buffers;
pub mod gdbm;
pub mod keyed_file;
pub mod kyoto;
pub mod leveldb;
pub mod lmdb;
mod loaded;
pub mod postgres;
mod recent;
pub mod redis;
mod sole;
pub mod sqlite;

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};
use parking_lot::Mutex;

use super::bucket::{Abilities, BucketStore, Caching, Service};

/// One value's size and version. A version names one value: a value written again, by anyone,
/// has another, so data cached under a version is never another value's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub version: String,
}

/// What a read asks of the version it found before it reads ([`Database::read`]).
pub type Admit<'a> = &'a dyn Fn(&Entry) -> Result<()>;

/// A directory's content.
#[derive(Debug, Default)]
pub struct Listing {
    /// Its keys (whole keys, not names), with their entries.
    pub files: Vec<(String, Entry)>,
    /// The names of the directories in it, each once.
    pub dirs: Vec<String>,
}

/// What a write requires of the value it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Nothing.
    Any,
    /// That there is none.
    Absent,
    /// That it is still this version.
    At(String),
}

/// A database holding Zarr keys, as the backends see it. Errors are object_store's, so that the
/// bucket store above reads them as it reads a server's: `NotFound`, `Precondition` (a condition
/// failed), `AlreadyExists`, or `Generic` naming the database and the cause.
pub trait Database: Send + Sync + std::fmt::Debug + 'static {
    /// What the database is called in messages (a path, a URL) and in its service's name.
    fn name(&self) -> &str;

    /// When the database last changed, as well as it can tell (an object's Last-Modified).
    fn modified(&self) -> DateTime<Utc>;

    /// The entry at `key`, if there is one.
    fn entry(&self, key: &str) -> Result<Option<Entry>>;

    /// The bytes `range` (all of them when `None`) of the value at `key`, with its entry and the
    /// range resolved, all read from one version. `admit` is asked about the entry before the
    /// range is resolved, and its error is the read's: a version that fails a condition is a
    /// changed version, whatever the range (as a server answers 412 before 416).
    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>>;

    /// Stores `value` at `key` if `condition` holds, atomically and durably.
    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry>;

    /// Removes the value at `key`, durably; nothing there is no error.
    fn delete(&self, key: &str) -> Result<()>;

    /// What is directly in directory `dir` (`""`, or a prefix ending in `/`).
    fn list_dir(&self, dir: &str) -> Result<Listing>;

    /// Every key starting with `prefix`, with its entry.
    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>>;

    /// True when a byte range of a value is read from where the value lies, for what a read of a
    /// local file costs: values fetched ahead of readers would then only be copied once more, into
    /// memory the kernel must first fault in. False by default: a value is better read in one go.
    fn reads_in_place(&self) -> bool {
        false
    }
}

/// The error of a database that failed at `what`.
pub fn failed(store: &'static str, what: impl std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic { store, source: what.to_string().into() }
}

/// The range `range` resolves to in a value of `size` bytes (all of it when `None`).
pub fn resolve(store: &'static str, range: Option<&GetRange>, size: u64) -> Result<Range<u64>> {
    match range {
        None => Ok(0..size),
        Some(range) => range.as_range(size).map_err(|e| failed(store, e)),
    }
}

/// The precondition failure of a conditional write to `key`.
pub fn changed(key: &str, why: impl Into<String>) -> object_store::Error {
    object_store::Error::Precondition { path: key.to_string(), source: why.into().into() }
}

/// A [`Database`] as an [`ObjectStore`].
#[derive(Debug)]
pub struct Objects<D>(pub(crate) Arc<D>);

impl<D: Database> Objects<D> {
    /// The store of `database` as a mount serves it: a [`BucketStore`] named `url`, writable
    /// unless `read_only`, caching as `caching` says.
    pub fn mount(
        database: D,
        service: &'static str,
        url: &str,
        read_only: bool,
        caching: Caching,
    ) -> std::io::Result<BucketStore> {
        let service = Service {
            name: service,
            bucket: "database",
            updates_name_generation: false,
            abilities: Abilities { write: !read_only, list: true, addressed: false },
        };
        BucketStore::of_service(service, Arc::new(Objects(Arc::new(database))), "", url, caching)
    }

    /// The object metadata of `entry` at `key`, the database last changed at `modified`.
    fn meta(&self, key: &str, entry: &Entry, modified: DateTime<Utc>) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(key),
            last_modified: modified,
            size: entry.size,
            e_tag: Some(format!("\"{}\"", entry.version)),
            version: None,
        }
    }

    fn not_found(&self, key: &str) -> object_store::Error {
        object_store::Error::NotFound {
            path: key.to_string(),
            source: format!("no key {key} in {}", self.0.name()).into(),
        }
    }

    /// The entries of `listed` as object metadata, leaving out (with a log line) keys that are
    /// no object name.
    fn metas(&self, listed: Vec<(String, Entry)>) -> Vec<ObjectMeta> {
        // Asked once for the listing: a local database's answer is a stat of its file.
        let modified = self.0.modified();
        listed
            .into_iter()
            .filter_map(|(key, entry)| match Path::parse(&key) {
                Ok(_) => Some(self.meta(&key, &entry, modified)),
                Err(e) => {
                    log::warn!("{}: key {key:?} left out: {e}", self.0.name());
                    None
                }
            })
            .collect()
    }
}

/// The version an object_store condition names, without its quotes.
fn bare(e_tag: &str) -> &str {
    e_tag.trim_matches('"')
}

impl<D> std::fmt::Display for Objects<D>
where
    D: Database,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

#[async_trait]
impl<D: Database> ObjectStore for Objects<D> {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let condition = match opts.mode {
            PutMode::Overwrite => Condition::Any,
            PutMode::Create => Condition::Absent,
            PutMode::Update(version) => {
                let e_tag = version.e_tag.ok_or_else(|| changed(location.as_ref(), "no version to update"))?;
                Condition::At(bare(&e_tag).to_string())
            }
        };
        let entry = self.0.write(location.as_ref(), &payload, &condition)?;
        Ok(PutResult { e_tag: Some(format!("\"{}\"", entry.version)), version: None, extensions: Default::default() })
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        let _ = opts;
        Ok(Box::new(Upload { database: self.0.clone(), key: location.to_string(), parts: Arc::default() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let key = location.as_ref();
        let modified = self.0.modified();
        let admit = |entry: &Entry| options.check_preconditions(&self.meta(key, entry, modified));
        let (entry, range, bytes) = if options.head {
            let entry = self.0.entry(key)?.ok_or_else(|| self.not_found(key))?;
            admit(&entry)?;
            let size = entry.size;
            (entry, 0..size, Bytes::new())
        } else {
            self.0.read(key, options.range.as_ref(), &admit)?.ok_or_else(|| self.not_found(key))?
        };
        let meta = self.meta(key, &entry, modified);
        let payload = futures_util::stream::once(futures_util::future::ready(Ok(bytes))).boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(payload),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let database = self.0.clone();
        locations
            .map(move |location| {
                let location = location?;
                database.delete(location.as_ref())?;
                Ok(location)
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let prefix = prefix.map(|p| format!("{p}/")).unwrap_or_default();
        let listed = match self.0.list_all(&prefix) {
            Ok(listed) => self.metas(listed).into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        futures_util::stream::iter(listed).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let dir = prefix.map(|p| format!("{p}/")).unwrap_or_default();
        let Listing { files, dirs } = self.0.list_dir(&dir)?;
        let common_prefixes = dirs.iter().filter_map(|name| Path::parse(format!("{dir}{name}")).ok()).collect();
        Ok(ListResult { objects: self.metas(files), common_prefixes, extensions: Default::default() })
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let (_, _, bytes) =
            self.0.read(from.as_ref(), None, &|_| Ok(()))?.ok_or_else(|| self.not_found(from.as_ref()))?;
        let condition = match options.mode {
            CopyMode::Overwrite => Condition::Any,
            CopyMode::Create => Condition::Absent,
        };
        self.0.write(to.as_ref(), &PutPayload::from(bytes), &condition).map(drop)
    }
}

/// An upload in parts, gathered here and written as one value when complete.
#[derive(Debug)]
struct Upload<D> {
    database: Arc<D>,
    key: String,
    parts: Arc<Mutex<Vec<Bytes>>>,
}

#[async_trait]
impl<D: Database> MultipartUpload for Upload<D> {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.parts.lock().extend(data.iter().cloned());
        Box::pin(futures_util::future::ready(Ok(())))
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let payload = PutPayload::from_iter(std::mem::take(&mut *self.parts.lock()));
        let entry = self.database.write(&self.key, &payload, &Condition::Any)?;
        Ok(PutResult { e_tag: Some(format!("\"{}\"", entry.version)), version: None, extensions: Default::default() })
    }

    async fn abort(&mut self) -> Result<()> {
        self.parts.lock().clear();
        Ok(())
    }
}

/// Checks a backend's listings: each directory named once, with only its own files.
#[cfg(test)]
pub(crate) fn check_listing(database: &dyn Database) {
    for key in ["a/zarr.json", "a/c/0/0", "a/c/0/1", "a/c/1/0", "a/d", "a0", "b/x", "zarr.json"] {
        database.write(key, &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
    }
    let names = |listing: Listing| (listing.files.into_iter().map(|(k, _)| k).collect::<Vec<_>>(), listing.dirs);
    assert_eq!(
        names(database.list_dir("").unwrap()),
        (vec!["a0".into(), "zarr.json".into()], vec!["a".into(), "b".into()])
    );
    assert_eq!(names(database.list_dir("a/").unwrap()), (vec!["a/d".into(), "a/zarr.json".into()], vec!["c".into()]));
    assert_eq!(database.list_all("a/c/").unwrap().len(), 3);
}
