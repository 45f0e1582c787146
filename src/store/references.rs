//! A kerchunk reference set (a JSON file, or a parquet reference directory) as a read-only store
//! of the keys it describes: metadata documents and chunks held inline, or byte ranges of files
//! elsewhere (local, `file://`, `s3://`, `gs://`, `az://`, `http(s)://`). The view above sees
//! keys and never knows of references.
//!
//! The reference set is read once per version of its JSON file or `.zmetadata`, and kept while
//! that file's stamp stays the same; a parquet record file is read when a key it holds is first
//! asked for, and kept in a byte-bounded cache while its own stamp stays the same. A referenced
//! range is read in place from the file it names. What the references say is never softened into
//! a missing chunk: a reference to a file that is not there, a range past the end of its file, a
//! value that is not a reference, or a record file that cannot be read makes the keys concerned
//! EIO, with a log line naming the key and the cause; every other key keeps working. A record
//! file that is not there holds no chunks, as fsspec reads it (writers leave out empty records).
//!
//! - [`catalog`]: one version of the reference set, indexed.

pub mod catalog;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use catalog::{Catalog, Layout};
use parking_lot::Mutex;

use super::cache::Cache;
use super::range::RangeObject;
use super::read_only::{ReadOnlyStore, damaged, errno};
use super::targets::Targets;
use super::{Attr, BytesObject, Error, Kind, Location, Object, Result, Space, Stamp, join};
use crate::format::kerchunk::Reference;
use crate::format::kerchunk::parquet::{self, ChunkGrid};

/// The rows of one record file, or why it cannot be read.
type Rows = std::result::Result<Arc<[Option<Reference>]>, String>;

/// The catalog of the version last read, or why it could not be read.
type LastRead = (Stamp, std::result::Result<Arc<Catalog>, String>);

/// A reference set as a read-only store.
#[derive(Debug)]
pub struct ReferenceStore {
    inner: Arc<dyn super::Store>,
    /// The JSON file's key in `inner`, or the parquet directory's.
    at: String,
    layout: Layout,
    targets: Targets,
    last: Mutex<Option<LastRead>>,
    /// Parquet record files' rows, by array directory and record number.
    records: Cache<(String, u64), Rows>,
}

/// What a key of the reference set is.
enum Node {
    Dir,
    File(Reference),
}

impl ReferenceStore {
    /// The reference set at `at` in `inner`, read; relative URLs are taken from `targets`' base,
    /// and parquet record files kept in `record_bytes` of memory.
    /// The error is one line naming the reference file and why it cannot be read.
    pub fn open(
        inner: Arc<dyn super::Store>,
        at: &str,
        layout: Layout,
        targets: Targets,
        record_bytes: usize,
    ) -> std::result::Result<Self, String> {
        let records = Cache::new(record_bytes);
        let store = ReferenceStore { inner, at: at.to_string(), layout, targets, last: Mutex::new(None), records };
        store.catalog().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// The catalog of the reference set as it is now, read again when it changed.
    fn catalog(&self) -> Result<Arc<Catalog>> {
        let version_file = self.layout.version_file(&self.at);
        let place = self.inner.describe(&version_file);
        let stamp = self.inner.attr(&version_file)?.stamp;
        let mut last = self.last.lock();
        if let Some((seen, read)) = &*last
            && *seen == stamp
        {
            return read.clone().map_err(|why| damaged(place, why));
        }
        // A store's failure is not kept (the next question asks again); what the file says is.
        let file = self.inner.open(&version_file)?;
        let bytes = file.read_exact_at(0, file.attr().size)?;
        let read = Catalog::parse(bytes, *file.attr(), &place, self.layout).map(Arc::new);
        if let Err(why) = &read {
            log::warn!("{place}: {why}");
        }
        *last = Some((file.attr().stamp, read.clone()));
        read.map_err(|why| damaged(place, why))
    }

    /// What `key` is.
    fn node(&self, catalog: &Catalog, key: &str) -> Result<Node> {
        let key = key.trim_matches('/');
        if let Some(&n) = catalog.tree.files.get(key) {
            return Ok(Node::File(catalog.refs[n].clone()));
        }
        if catalog.tree.dirs.contains_key(key) {
            return Ok(Node::Dir);
        }
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
        match catalog.arrays.get(dir) {
            Some(Ok(grid)) => match grid.number(name) {
                Some(n) => {
                    match self.rows(catalog, dir, n / catalog.record_size)?.get((n % catalog.record_size) as usize) {
                        Some(Some(reference)) => Ok(Node::File(reference.clone())),
                        _ => Err(Error::NotFound(self.describe(key))),
                    }
                }
                None => Err(Error::NotFound(self.describe(key))),
            },
            Some(Err(why)) => Err(damaged(self.describe(key), why.clone())),
            None => Err(Error::NotFound(self.describe(key))),
        }
    }

    /// The rows of record `n` of the array in `dir`, from cache or from its file.
    fn rows(&self, catalog: &Catalog, dir: &str, n: u64) -> Result<Arc<[Option<Reference>]>> {
        let key = join(&join(&self.at, dir), &parquet::record_name(n));
        let place = self.inner.describe(&key);
        let attr = match self.inner.attr(&key) {
            Err(Error::NotFound(_)) => return Ok(Arc::from([])),
            found => found?,
        };
        let cache_key = (dir.to_string(), n);
        if let Some(rows) = self.records.get(&cache_key, &attr.stamp) {
            return rows.map_err(|why| damaged(place, why));
        }
        let file = self.inner.open(&key)?;
        let bytes = file.read_exact_at(0, file.attr().size)?;
        let rows: Rows = match parquet::record(Bytes::from(bytes)) {
            Ok(rows) if rows.len() as u64 > catalog.record_size => {
                Err(format!("{} rows, more than the record size {}", rows.len(), catalog.record_size))
            }
            Ok(rows) => Ok(rows.into()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(why) = &rows {
            log::warn!("{place}: {why}; the chunks it holds read as EIO");
        }
        let held = rows.as_ref().map_or(0, |rows| rows.len() * std::mem::size_of::<Option<Reference>>());
        self.records.insert(cache_key, file.attr().stamp, rows.clone(), held);
        rows.map_err(|why| damaged(place, why))
    }

    /// The chunk names of the array in `dir` whose rows hold a reference.
    fn chunk_names(&self, catalog: &Catalog, dir: &str, grid: &ChunkGrid) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for record in 0..grid.len().div_ceil(catalog.record_size) {
            for (row, reference) in self.rows(catalog, dir, record)?.iter().enumerate() {
                let n = record * catalog.record_size + row as u64;
                if reference.is_some() && n < grid.len() {
                    names.push(grid.name(n));
                }
            }
        }
        Ok(names)
    }

    /// The referenced file of `url`, opened, with its key's description.
    fn target(&self, key: &str, url: &str) -> Result<Box<dyn Object>> {
        let (store, target_key) = self.targets.resolve(url).map_err(|why| self.unreadable(key, why))?;
        match store.open(&target_key) {
            Ok(file) => Ok(file),
            Err(Error::NotFound(place)) => {
                Err(self.unreadable(key, format!("{place}, which it refers to, is not there")))
            }
            Err(e) => Err(self.unreadable(key, e.to_string())),
        }
    }

    /// EIO for `key`, logged.
    fn unreadable(&self, key: &str, why: String) -> Error {
        let place = self.describe(key);
        log::warn!("{place}: {why}");
        damaged(place, why)
    }

    fn attr_in(&self, catalog: &Catalog, key: &str, node: &Node) -> Result<Attr> {
        let set = catalog.attr;
        let file = |size: u64, part: Stamp| set.file_inside(size, (key, part));
        Ok(match node {
            Node::Dir => set.dir_inside(key),
            Node::File(Reference::Inline(bytes)) => file(bytes.len() as u64, Stamp::new([0; 5])),
            Node::File(Reference::Range { len: Some(len), .. }) => file(*len, Stamp::new([0; 5])),
            // Its size is the file's, from where it starts.
            Node::File(Reference::Range { url, start, len: None }) => {
                let target = self.target(key, url)?;
                file(target.attr().size.saturating_sub(*start), target.attr().stamp)
            }
            // It is there, and what it is cannot be known.
            Node::File(Reference::Bad(why)) => return Err(self.unreadable(key, format!("not a reference: {why}"))),
        })
    }
}

impl ReadOnlyStore for ReferenceStore {
    /// The reference set's name, then the key's: `/data/refs.json/temp/0.0`.
    fn describe(&self, key: &str) -> String {
        let set = self.inner.describe(&self.at);
        if key.is_empty() { set } else { format!("{}/{key}", set.trim_end_matches('/')) }
    }

    fn url(&self, key: &str) -> String {
        let set = self.inner.url(&self.at);
        if key.is_empty() { set } else { format!("{}/{key}", set.trim_end_matches('/')) }
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        let catalog = self.catalog()?;
        let node = self.node(&catalog, key)?;
        self.attr_in(&catalog, key, &node)
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let catalog = self.catalog()?;
        let dir = dir.trim_matches('/');
        let Node::Dir = self.node(&catalog, dir)? else { return Err(errno(self.describe(dir), libc::ENOTDIR)) };
        let mut names: BTreeMap<String, Kind> = catalog.tree.dirs[dir].clone();
        match catalog.arrays.get(dir) {
            Some(Ok(grid)) => names.extend(self.chunk_names(&catalog, dir, grid)?.into_iter().map(|n| (n, Kind::File))),
            Some(Err(why)) => return Err(damaged(self.describe(dir), why.clone())),
            None => {}
        }
        // A listing of an array's chunks changes with its record files, which the version file's
        // stamp does not follow: its stamp is of the names.
        let stamp = catalog.attr.stamp.derived((dir, names.keys().collect::<Vec<_>>()));
        Ok((names.into_iter().collect(), stamp))
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let catalog = self.catalog()?;
        let node = self.node(&catalog, key)?;
        let place = self.describe(key);
        match node {
            Node::Dir => Err(errno(place, libc::EISDIR)),
            Node::File(Reference::Inline(bytes)) => {
                let attr = self.attr_in(&catalog, key, &Node::File(Reference::Inline(bytes.clone())))?;
                Ok(Box::new(BytesObject { attr, bytes, place }))
            }
            Node::File(Reference::Bad(why)) => Err(self.unreadable(key, format!("not a reference: {why}"))),
            Node::File(Reference::Range { url, start, len }) => {
                let target = self.target(key, &url)?;
                let size = target.attr().size;
                let end = match len {
                    Some(len) => start.checked_add(len).filter(|&end| end <= size),
                    None => (start <= size).then_some(size),
                };
                let Some(end) = end else {
                    let wanted = len.map_or(String::new(), |len| format!(" and {len} bytes on"));
                    let why = format!("refers to bytes from {start}{wanted} of {url}, which is {size} bytes long");
                    return Err(self.unreadable(key, why));
                };
                let mut attr = self.attr_in(&catalog, key, &Node::File(Reference::Range { url, start, len }))?;
                attr.size = end - start;
                Ok(Box::new(RangeObject::new(attr, start..end, target, place)))
            }
        }
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    /// A referenced range is where it is; inline bytes are nowhere else.
    fn location(&self, key: &str) -> Result<Location> {
        let catalog = self.catalog()?;
        match self.node(&catalog, key)? {
            Node::File(Reference::Range { url, start, .. }) => {
                let (store, target_key) = self.targets.resolve(&url).map_err(|why| damaged(self.describe(key), why))?;
                Ok(Location::At { url: store.url(&target_key), start: Some(start) })
            }
            Node::File(Reference::Inline(_)) => Ok(Location::Inline),
            Node::File(Reference::Bad(why)) => Err(damaged(self.describe(key), format!("not a reference: {why}"))),
            Node::Dir => Err(errno(self.describe(key), libc::EISDIR)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    fn store_of(dir: &std::path::Path) -> ReferenceStore {
        let inner: Arc<dyn super::super::Store> = Arc::new(LocalStore::open(dir).unwrap());
        let open_root: crate::store::targets::OpenRoot = Box::new(|root: &str| {
            let store: Arc<dyn super::super::Store> =
                Arc::new(LocalStore::open(std::path::Path::new(root)).map_err(|e| e.to_string())?);
            Ok(store)
        });
        let targets = Targets::new(dir.to_string_lossy().into_owned(), open_root);
        ReferenceStore::open(inner, "refs.json", Layout::Json, targets, 1 << 20).unwrap()
    }

    fn read(store: &ReferenceStore, key: &str) -> Result<Vec<u8>> {
        super::super::Store::read(store, key)
    }

    #[test]
    fn references_read_as_the_bytes_they_name_or_fail() {
        let dir = std::env::temp_dir().join(format!("shardfs-references-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data.bin"), b"0123456789").unwrap();
        let refs = serde_json::json!({"version": 1, "refs": {
            ".zgroup": "{\"zarr_format\":2}",
            "a/0": ["data.bin", 2, 3],
            "a/1": ["data.bin"],
            "a/2": ["missing.bin", 0, 1],
            "a/3": ["data.bin", 8, 3],
            "a/4": 17,
        }});
        std::fs::write(dir.join("refs.json"), refs.to_string()).unwrap();
        let store = store_of(&dir);
        assert_eq!(read(&store, ".zgroup").unwrap(), b"{\"zarr_format\":2}");
        assert_eq!(read(&store, "a/0").unwrap(), b"234");
        assert_eq!(read(&store, "a/1").unwrap(), b"0123456789");
        assert_eq!(ReadOnlyStore::attr(&store, "a/1").unwrap().size, 10);
        for key in ["a/2", "a/3", "a/4"] {
            let e = read(&store, key).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{key}: {e}");
        }
        assert!(matches!(read(&store, "a/5"), Err(Error::NotFound(_))));
        let (names, _) = ReadOnlyStore::list(&store, "a").unwrap();
        assert_eq!(names.len(), 5);

        // A new version of the reference set is read again.
        let refs = serde_json::json!({"a/0": ["data.bin", 0, 2]});
        std::fs::write(dir.join("refs.json"), refs.to_string()).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(dir.join("refs.json")).unwrap().set_modified(later).unwrap();
        assert_eq!(read(&store, "a/0").unwrap(), b"01");
        assert!(matches!(read(&store, ".zgroup"), Err(Error::NotFound(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
