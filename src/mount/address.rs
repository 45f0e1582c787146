//! Which store is at an address, and how it is shown: a Zarr v3 directory or object store
//! prefix, a web server path, a zip file, BLZ data, an Icechunk repository (one version of it), or
//! kerchunk references; the store opened as the kind found, with the checks that fail before
//! anything is mounted. `mount`, `check`, `info`, `compact` and `refs` all open stores here.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::format::icechunk::{Refs, Version};
use crate::format::kerchunk;
use crate::format::metadata::ZARR_JSON;
use crate::store::blz::{self, BlzStore};
use crate::store::bucket::Caching;
use crate::store::bucket::azure::{self, AzureOptions};
use crate::store::bucket::gcs::{self, GcsOptions};
use crate::store::bucket::http;
use crate::store::bucket::s3::{self, S3Options};
use crate::store::database::leveldb::{self, LevelDb};
use crate::store::database::lmdb::{self, Lmdb};
use crate::store::database::postgres::{self, Postgres};
use crate::store::database::redis::Redis;
use crate::store::database::sqlite::{self, Sqlite};
use crate::store::database::{Database, Objects};
use crate::store::database::{bdb, gdbm, kyoto};
use crate::store::icechunk::{self, IcechunkStore};
use crate::store::icechunk_branch::BranchStore;
use crate::store::memory_budget::MemoryBudget;
use crate::store::references::ReferenceStore;
use crate::store::references::catalog::Layout;
use crate::store::scratch::ScratchInMemory;
use crate::store::targets::{OpenRoot, Targets};
use crate::store::zip::{self, ZipStore};
use crate::store::{LocalStore, Store};

/// Where a store is: a local directory or an object store URL, and how to reach the latter.
#[derive(Debug, Clone, Default)]
pub struct StoreAddress {
    pub location: PathBuf,
    pub s3: S3Options,
    pub azure: AzureOptions,
    pub gcs: GcsOptions,
    pub caching: Caching,
    pub repository: RepositoryOptions,
    /// `--memory-limit`, for the caches of the stores opened.
    pub memory: MemoryBudget,
    /// `--key-prefix`: a Redis database's keys are `PREFIX:KEY`.
    pub key_prefix: String,
    /// `--table`: the table of a PostgreSQL database that holds the Zarr keys.
    pub table: String,
}

/// Which version of an Icechunk repository to show, and what it may read.
#[derive(Debug, Clone, Default)]
pub struct RepositoryOptions {
    /// `--branch`, `--tag` or `--snapshot`; none: branch `main`.
    pub version: Option<Version>,
    /// `--allow-virtual`: the URL prefixes virtual chunks may be read from.
    pub allow_virtual: Vec<String>,
    /// A writable mount: a branch is opened for commits ([`BranchStore`]).
    pub writable: bool,
    /// `--message`: the message of the commits a writable branch mount makes.
    pub message: Option<String>,
}

impl From<&Path> for StoreAddress {
    fn from(path: &Path) -> Self {
        StoreAddress { location: path.to_path_buf(), ..Default::default() }
    }
}

impl From<&PathBuf> for StoreAddress {
    fn from(path: &PathBuf) -> Self {
        path.as_path().into()
    }
}

/// Opens the store at `address` after checking that it is a Zarr v3 store, or a directory of BLZ
/// data with no `zarr.json` at its root (shown through [`BlzStore`]). A zip file (its name ends
/// in `.zip` or `.ozx`, or a local file starts as one does) is opened as a [`ZipStore`] over the
/// store of the directory or prefix holding it.
pub fn open_store(address: impl Into<StoreAddress>) -> Result<Arc<dyn Store>, String> {
    let address = address.into();
    let shown = address.location.display().to_string();
    let store: Arc<dyn Store> = match address.location.to_str().and_then(|l| l.split_once("://")) {
        // A zip file in an object store: its entries, over the store of the prefix holding it.
        Some(_) if zip_name(&shown).is_some() && !shown.starts_with("http") => {
            let (prefix, name) = zip_name(&shown).expect("just checked");
            Arc::new(ZipStore::open(open_bucket(prefix, &address)?, name)?)
        }
        // A JSON reference file in an object store or on a web server.
        Some(_) if is_reference_file(&shown) => {
            let (prefix, name) = shown.rsplit_once('/').expect("a URL has a slash");
            let inner = if shown.starts_with("http") {
                http::open(prefix, address.caching.clone())?
            } else {
                open_bucket(prefix, &address)?
            };
            return open_references(inner, name, Layout::Json, prefix, &address);
        }
        Some(("s3" | "gs", _)) => open_bucket(&shown, &address)?,
        // Before https: an Azure account's blob endpoint is an https:// URL.
        Some(_) if azure::is_azure_url(&shown) => open_bucket(&shown, &address)?,
        Some(("http" | "https", _)) => http::open(&shown, address.caching.clone())?,
        Some(("redis", _)) => return open_redis(&shown, &address),
        Some(("postgres" | "postgresql", _)) => return open_postgres(&shown, &address),
        Some((scheme, _)) => {
            return Err(format!(
                "{shown}: {scheme}:// stores are not supported yet (s3://, gs://, az://, https://, http://, redis://, postgresql:// and local directories and files are)"
            ));
        }
        None if address.caching.disk.is_some() => {
            return Err(format!(
                "{shown}: --cache is for object stores (s3://...); a local store is read from its own disk"
            ));
        }
        None => {
            let meta = std::fs::metadata(&address.location).map_err(|e| format!("{shown}: cannot open store: {e}"))?;
            if meta.is_file() && (zip_name(&shown).is_some() || starts_as_zip(&address.location)) {
                let path = address.location.canonicalize().map_err(|e| format!("{shown}: cannot open store: {e}"))?;
                let (parent, name) = (path.parent().unwrap_or(Path::new("/")), path.file_name().unwrap_or_default());
                let dir =
                    LocalStore::open(parent).map_err(|e| format!("{}: cannot open store: {e}", parent.display()))?;
                let name = name.to_str().ok_or_else(|| format!("{shown}: the file name is not UTF-8"))?;
                Arc::new(ZipStore::open(Arc::new(dir), name)?)
            } else if meta.is_file() && (is_reference_file(&shown) || starts_as_json(&address.location)) {
                let path = address.location.canonicalize().map_err(|e| format!("{shown}: cannot open store: {e}"))?;
                let (parent, name) = (path.parent().unwrap_or(Path::new("/")), path.file_name().unwrap_or_default());
                let dir =
                    LocalStore::open(parent).map_err(|e| format!("{}: cannot open store: {e}", parent.display()))?;
                let name = name.to_str().ok_or_else(|| format!("{shown}: the file name is not UTF-8"))?;
                return open_references(Arc::new(dir), name, Layout::Json, &parent.to_string_lossy(), &address);
            } else if meta.is_file() && sqlite::is_sqlite(&address.location) {
                return open_sqlite(&address.location, &address);
            } else if meta.is_file() && gdbm::is_gdbm(&address.location) {
                return open_gdbm(&address.location, &address);
            } else if let Some(kind) = kyoto::kind(&address.location).filter(|_| meta.is_file()) {
                return open_kyoto(&address.location, kind, &address);
            } else if meta.is_file() && bdb::kind(&address.location).is_some() {
                return open_bdb(&address.location, &address);
            } else if meta.is_dir() && lmdb::is_lmdb(&address.location) {
                return open_lmdb(&address.location, &address);
            } else if meta.is_dir() && leveldb::is_leveldb(&address.location) {
                return open_leveldb(&address.location, &address);
            } else if !meta.is_dir() {
                return Err(format!(
                    "{shown}: not a directory, a zip file, an SQLite, GNU dbm, Kyoto Cabinet or Berkeley DB database nor a kerchunk reference file, so not a Zarr store"
                ));
            } else {
                let dir =
                    LocalStore::open(&address.location).map_err(|e| format!("{shown}: cannot open store: {e}"))?;
                Arc::new(ScratchInMemory::new(Arc::new(dir)))
            }
        }
    };
    if icechunk::spec_of(&*store).is_some() {
        return open_repository(store, &address);
    }
    if address.repository.version.is_some() || !address.repository.allow_virtual.is_empty() {
        return Err(format!(
            "{shown}: --branch, --tag, --snapshot and --allow-virtual are for Icechunk repositories, which this is not"
        ));
    }
    let doc = match store.read(ZARR_JSON) {
        Err(crate::store::Error::NotFound(_)) if holds_parquet_references(&*store) => {
            // The directory is the reference set, as a JSON file would be: relative URLs are
            // taken from where it is.
            let url = store.url("");
            let base = url.trim_end_matches('/').rsplit_once('/').map_or("", |(parent, _)| parent);
            let base = if base.is_empty() { "/" } else { base }.to_string();
            return open_references(store, "", Layout::Parquet, &base, &address);
        }
        Err(crate::store::Error::NotFound(_)) if blz::holds_blz(&*store) => return Ok(Arc::new(BlzStore::new(store, address.memory.blz()))),
        found => found.map_err(|e| {
            format!("{shown}: not a Zarr v3 store (nor an Icechunk repository, BLZ data or kerchunk references): cannot read {ZARR_JSON} at its root: {e}")
        })?,
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&doc).map_err(|e| format!("{}: not a Zarr v3 store: {e}", store.describe(ZARR_JSON)))?;
    if crate::format::recognise(&doc).is_none() {
        return Err(format!("{}: not a Zarr v3 store: zarr_format is not 3", store.describe(ZARR_JSON)));
    }
    Ok(store)
}

/// Opens the SQLite database at `path` (zarr-python 2's `SQLiteStore`): its keys as they are, Zarr
/// v2 arrays and sharded v3 ones alike, so no root document is required.
fn open_sqlite(path: &Path, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = Sqlite::open(path)?;
    let url = path.canonicalize().unwrap_or_else(|_| path.to_path_buf()).display().to_string();
    let read_only = database.read_only();
    let caching = local_database_caching(address, &database);
    Ok(Arc::new(Objects::mount(database, "SQLite", &url, read_only, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// How a local database is cached: what another process changes is asked for each time (a look
/// costs no round trip), and values are read ahead of readers as from an object store (a value
/// read in one go costs one transaction, not one per read of the kernel's), within
/// [`LOCAL_READ_AHEAD`]; not at all where the database reads a range in place, as a local file is
/// read (`Database::reads_in_place`). Read ahead there, 256 MiB of GNU dbm values took 18,000 page faults of fresh memory and
/// 0.29 s of the daemon's CPU; read as asked, 6,600 and 0.19 s (plain files: 900 and 0.10 s).
fn local_database_caching(address: &StoreAddress, database: &dyn Database) -> Caching {
    let read_ahead_bytes =
        if database.reads_in_place() { 0 } else { address.caching.read_ahead_bytes.min(LOCAL_READ_AHEAD) };
    Caching { metadata_ttl: Duration::ZERO, disk: None, read_ahead_bytes, ..address.caching.clone() }
}

/// The most bytes of a local database's values held for readers (`--read-ahead-size` beyond it
/// is not taken): read again, a value costs no round trip, and the file's pages are in the
/// kernel's cache anyway. Held to the object stores' 256 MiB, bytes readers had passed stayed
/// until that much was read, so that reading 256 MiB of GNU dbm values took 48,000 page faults of
/// fresh memory; with this, 18,000, the memory read into being used again
/// (`store/database/buffers.rs`).
const LOCAL_READ_AHEAD: usize = 32 << 20;

/// How a local database that only this mount can change while mounted is cached (LevelDB, GNU
/// dbm, Kyoto Cabinet and Berkeley DB under their locks, `src/store/database/sole.rs`): as a
/// local database, except that what the mount learns of keys and versions is kept (up to the
/// bucket store's bounds) rather than asked again at each look. Nothing else changes it, and what
/// this mount changes is written into what it keeps, so nothing kept goes stale; `--metadata-ttl`,
/// which bounds how long another writer's changes go unseen, has nothing to bound here. Asked at
/// each look, a LevelDB listing decompressed every value under its prefix.
fn sole_database_caching(address: &StoreAddress, database: &dyn Database) -> Caching {
    Caching { metadata_ttl: SOLE_DATABASE_TTL, ..local_database_caching(address, database) }
}

/// What a mount learns of a database only it can change is kept this long: a mount's lifetime,
/// as long as `Instant` arithmetic safely goes.
const SOLE_DATABASE_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Opens the LMDB environment in `dir` (zarr-python 2's `LMDBStore`): its keys as they are.
fn open_lmdb(dir: &Path, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = Lmdb::open(dir)?;
    let url = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()).display().to_string();
    let read_only = database.read_only();
    let caching = local_database_caching(address, &database);
    Ok(Arc::new(Objects::mount(database, "LMDB", &url, read_only, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// Opens the GNU dbm file at `path` (zarr-python 2's `DBMStore` over `dbm.gnu`): its keys as they
/// are, locked as GNU dbm locks (the writer of a writable mount, a reader of a read-only one).
fn open_gdbm(path: &Path, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = gdbm::open(path, !address.repository.writable)?;
    let url = path.canonicalize().unwrap_or_else(|_| path.to_path_buf()).display().to_string();
    let read_only = database.read_only();
    let caching = sole_database_caching(address, &database);
    Ok(Arc::new(Objects::mount(database, "GNU dbm", &url, read_only, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// Opens the Kyoto Cabinet file at `path`, a `kind` (`kch`, `kct`) file: its keys as they are,
/// locked as Kyoto Cabinet locks (the writer of a writable mount, a reader of a read-only one).
fn open_kyoto(path: &Path, kind: &str, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = kyoto::open(path, kind, !address.repository.writable)?;
    let url = path.canonicalize().unwrap_or_else(|_| path.to_path_buf()).display().to_string();
    let read_only = database.read_only();
    let caching = sole_database_caching(address, &database);
    Ok(Arc::new(
        Objects::mount(database, "Kyoto Cabinet", &url, read_only, caching).map_err(|e| format!("{url}: {e}"))?,
    ))
}

/// Opens the Berkeley DB hash or btree file at `path` (zarr-python 2's `DBMStore` over
/// `berkeleydb`): its keys as they are, under the mount's own `flock` of the file (exclusive when
/// writable, shared when read-only), as Berkeley DB keeps none of its own there.
fn open_bdb(path: &Path, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = bdb::open(path, !address.repository.writable)?;
    let url = path.canonicalize().unwrap_or_else(|_| path.to_path_buf()).display().to_string();
    let read_only = database.read_only();
    let caching = sole_database_caching(address, &database);
    Ok(Arc::new(Objects::mount(database, "Berkeley DB", &url, read_only, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// Opens the LevelDB in `dir` (keys the Zarr keys, as plyvel users write them): its keys as they
/// are. LevelDB lets one process at a time open it, so nothing changes it under the mount.
fn open_leveldb(dir: &Path, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let database = LevelDb::open(dir)?;
    let url = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()).display().to_string();
    let caching = sole_database_caching(address, &database);
    Ok(Arc::new(Objects::mount(database, "LevelDB", &url, false, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// Opens the Redis database at `url` (zarr-python 2's `RedisStore`, keys `--key-prefix`): its
/// keys as they are. Versions and listings are trusted for `--metadata-ttl`, and values are
/// fetched ahead of readers (`--read-ahead-size`), as from an object store: a value is better read
/// in one request than in many.
fn open_redis(url: &str, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    // An address made in code rather than from the command line has no prefix: RedisStore's.
    let prefix = if address.key_prefix.is_empty() { "zarr" } else { &address.key_prefix };
    let database = Redis::open(url, prefix)?;
    let caching = Caching { disk: None, ..address.caching.clone() };
    Ok(Arc::new(Objects::mount(database, "Redis", url, false, caching).map_err(|e| format!("{url}: {e}"))?))
}

/// Opens the table `--table` of the PostgreSQL database at `url`: its keys as they are. A writable
/// mount creates the table when there is none. Versions and listings are trusted for
/// `--metadata-ttl`, as of an object store: a look is a round trip to the server.
fn open_postgres(url: &str, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    // An address made in code rather than from the command line names no table: the default's.
    let table = if address.table.is_empty() { postgres::DEFAULT_TABLE } else { &address.table };
    let database = Postgres::open(url, table, address.repository.writable)?;
    let name = database.name().to_string();
    let caching = Caching { disk: None, ..address.caching.clone() };
    Ok(Arc::new(Objects::mount(database, "PostgreSQL", &name, false, caching).map_err(|e| format!("{name}: {e}"))?))
}

/// Checks that the view can show `store` as Zarr `zarr_format`: the v2 view is made from Zarr v3
/// documents, so a store with none at its root (kerchunk references to a Zarr v2 store) is shown
/// as it is, in the v3 view only.
pub fn check_zarr_format(store: &dyn Store, zarr_format: u8) -> Result<(), String> {
    match store.attr(ZARR_JSON) {
        Err(crate::store::Error::NotFound(_)) if zarr_format == 2 => Err(format!(
            "{}: holds no {ZARR_JSON} at its root, so the store is shown as it is (a Zarr v2 store already?); \
             leave out --zarr-format 2",
            store.describe("")
        )),
        _ => Ok(()),
    }
}

/// True when `location` names a kerchunk JSON reference file.
fn is_reference_file(location: &str) -> bool {
    location.to_ascii_lowercase().ends_with(".json")
}

/// True when the store holds a parquet reference set: a `.zmetadata` with a record size.
fn holds_parquet_references(store: &dyn Store) -> bool {
    let doc = store.read(kerchunk::parquet::METADATA).ok().and_then(|b| serde_json::from_slice(&b).ok());
    doc.is_some_and(|doc| kerchunk::parquet::is_reference_metadata(&doc))
}

/// The branches and tags of the Icechunk repository at `address`; `None` when it holds none.
pub fn repository_refs(address: &StoreAddress) -> Result<Option<Refs>, String> {
    let shown = address.location.display().to_string();
    let store: Arc<dyn Store> = match address.location.to_str().and_then(|l| l.split_once("://")) {
        Some(("s3" | "gs", _)) => open_bucket(&shown, address)?,
        Some(_) if azure::is_azure_url(&shown) => open_bucket(&shown, address)?,
        Some(_) => return Ok(None),
        None if address.location.is_dir() => {
            Arc::new(LocalStore::open(&address.location).map_err(|e| format!("{shown}: {e}"))?)
        }
        None => return Ok(None),
    };
    let Some(spec) = icechunk::spec_of(&*store) else { return Ok(None) };
    icechunk::refs(&*store, spec).map(Some).map_err(|e| e.to_string())
}

/// The version of the Icechunk repository in `store` that `address` names, as a store: a branch of
/// a writable mount is written through Icechunk's sessions where the repository is local or in S3.
fn open_repository(store: Arc<dyn Store>, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let options = &address.repository;
    let version = options.version.clone().unwrap_or_else(|| Version::Branch("main".into()));
    let targets = Targets::new(store.url(""), target_opener(address));
    let shown = IcechunkStore::open(
        store,
        version.clone(),
        targets,
        options.allow_virtual.clone(),
        address.memory.manifests(),
    )?;
    let Version::Branch(branch) = &version else { return Ok(Arc::new(shown)) };
    if !options.writable {
        return Ok(Arc::new(shown));
    }
    let Some(storage) = icechunk_storage(address)? else {
        log::warn!(
            "{}: writes to an Icechunk repository are supported in local directories and S3; mounted read-only",
            address.location.display()
        );
        return Ok(Arc::new(shown));
    };
    Ok(Arc::new(BranchStore::open(shown, storage, branch, options.message.clone())?))
}

/// Icechunk's own storage of the repository at `address`, for its writer: `None` where shardfs
/// does not write repositories (Azure, GCS).
fn icechunk_storage(address: &StoreAddress) -> Result<Option<Arc<dyn ::icechunk::Storage + Send + Sync>>, String> {
    use ::icechunk::storage::{S3Credentials, S3Options, S3StaticCredentials};
    let shown = address.location.display().to_string();
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("{shown}: {e}"))?;
    let storage = match shown.split_once("://") {
        None => {
            let path = address.location.canonicalize().map_err(|e| format!("{shown}: {e}"))?;
            runtime.block_on(::icechunk::new_local_filesystem_storage(&path))
        }
        Some(("s3", _)) => {
            let resolved = s3::resolve(&shown, &address.s3)?;
            let credentials = match (&resolved.keys, resolved.anonymous) {
                (_, true) => S3Credentials::Anonymous,
                (Some((id, secret, token)), false) => S3Credentials::Static(S3StaticCredentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                    session_token: token.clone(),
                    expires_after: None,
                }),
                (None, false) => S3Credentials::FromEnv,
            };
            let mut options = S3Options::default();
            options.region = Some(resolved.region.clone());
            options.allow_http = resolved.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"));
            options.endpoint_url = resolved.endpoint.clone();
            options.anonymous = resolved.anonymous;
            options.force_path_style = true;
            let prefix = (!resolved.prefix.is_empty()).then(|| resolved.prefix.clone());
            runtime.block_on(::icechunk::storage::new_s3_object_store_storage(
                options,
                resolved.bucket.clone(),
                prefix,
                Some(credentials),
                Vec::new(),
                Vec::new(),
            ))
        }
        Some(_) => return Ok(None),
    };
    storage.map(Some).map_err(|e| format!("{shown}: cannot open the repository for writing: {e}"))
}

/// How the stores referenced files are in are opened: as the mount's own is (object store
/// options, caching but no disk cache).
fn target_opener(address: &StoreAddress) -> OpenRoot {
    let address = StoreAddress { caching: Caching { disk: None, ..address.caching.clone() }, ..address.clone() };
    Box::new(move |root: &str| match root.split_once("://") {
        Some(("http" | "https", _)) => http::open(root, address.caching.clone()),
        Some(_) => open_bucket(root, &address),
        None => Ok(Arc::new(LocalStore::open(Path::new(root)).map_err(|e| format!("{root}: {e}"))?)),
    })
}

/// The reference set at `at` in `inner` as a store; relative URLs are taken from `base`, the
/// reference set's directory.
fn open_references(
    inner: Arc<dyn Store>,
    at: &str,
    layout: Layout,
    base: &str,
    address: &StoreAddress,
) -> Result<Arc<dyn Store>, String> {
    let targets = Targets::new(base.to_string(), target_opener(address));
    Ok(Arc::new(ReferenceStore::open(inner, at, layout, targets, address.memory.records())?))
}

/// The location holding a zip file and the zip file's name, when `location`'s last component
/// ends in a zip suffix (`.zip`, `.ozx`; any case).
fn zip_name(location: &str) -> Option<(&str, &str)> {
    let (parent, name) = location.trim_end_matches('/').rsplit_once('/').unwrap_or((".", location));
    let lower = name.to_ascii_lowercase();
    zip::SUFFIXES.iter().any(|suffix| lower.len() > suffix.len() && lower.ends_with(suffix)).then_some((parent, name))
}

/// The object store (S3, GCS, Azure) at `url`, reached as `address` says.
fn open_bucket(url: &str, address: &StoreAddress) -> Result<Arc<dyn Store>, String> {
    let caching = address.caching.clone();
    Ok(match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("s3") => Arc::new(s3::open(url, &address.s3, caching)?),
        Some("gs") => Arc::new(gcs::open(url, &address.gcs, caching)?),
        _ if azure::is_azure_url(url) => Arc::new(azure::open(url, &address.azure, caching)?),
        _ => return Err(format!("{url}: not an object store URL (s3://, gs://, az://)")),
    })
}

/// True when the local file at `path` starts as a JSON object does.
fn starts_as_json(path: &Path) -> bool {
    let mut start = [0; 64];
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut start)).unwrap_or(0);
    start[..read].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// True when the local file at `path` starts with a zip file's signature.
fn starts_as_zip(path: &Path) -> bool {
    let mut start = [0; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).is_ok() && zip::MAGIC.contains(&&start[..])
}
