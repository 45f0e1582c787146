//! A directory of BLZ data (Bloscpack files, bcolz carrays and ctables) as a read-only store of
//! sharded Zarr v3 arrays, which the view then shows unsharded like any other: the root and every
//! plain directory is a group with a synthesized `zarr.json` (a ctable's with its attributes); a
//! Bloscpack file `NAME.blp` is the array `NAME`, one shard at `NAME/c/0[/0...]` holding all its
//! chunks; a carray directory is an array whose shard `c/i[/0...]` holds the one chunk of
//! `data/__i.blp`. Each shard file is the source file's bytes with an index appended (see
//! [`shard`]); nothing is copied but a short last chunk, decoded once and cached. Other files pass
//! through. Refused arrays (object or structured dtypes, non-uniform chunks, metadata that
//! disagrees with the header) are not shown, with one log line per version.
//!
//! - [`arrays`]: reading an array's description from its files.
//! - [`shard`]: a shard file, opened.

pub mod arrays;
pub mod shard;

use std::path::PathBuf;
use std::sync::Arc;

use super::cache::Cache;
use arrays::{Array, carray_stamp, combine, read_blp, read_carray};
use shard::{ChunkCache, ShardObject};

use super::read_only::ReadOnlyStore;
use super::{Attr, BytesObject, Error, Kind, Object, Result, Space, Stamp, join};
use crate::format::blz::{bcolz, document};
use crate::format::metadata::ZARR_JSON;

/// The suffix of Bloscpack files.
pub const BLP: &str = ".blp";

/// What a key of the store is.
#[derive(Debug)]
enum Node {
    /// A plain directory or a ctable: a group.
    Group {
        dir: String,
        table: bool,
    },
    GroupDoc {
        dir: String,
        table: bool,
    },
    /// A file (or link) shown as it is.
    Plain(String),
    Array(Arc<Array>),
    ArrayDoc(Arc<Array>),
    /// `c` and the directories below it, `depth` coordinates in.
    ShardDir(Arc<Array>, usize),
    Shard(Arc<Array>, u64),
}

/// A directory of BLZ data as a read-only sharded Zarr v3 store.
#[derive(Debug)]
pub struct BlzStore {
    inner: Arc<dyn super::Store>,
    arrays: Cache<String, Option<Arc<Array>>>,
    chunks: Arc<ChunkCache>,
}

/// True when the directory `dir` of `store` is a bcolz carray.
fn is_carray(store: &dyn super::Store, dir: &str) -> bool {
    store.attr(&join(dir, bcolz::SIZES)).is_ok_and(|a| a.kind == Kind::File)
}

/// True when the directory `dir` of `store` is a bcolz ctable.
fn is_ctable(store: &dyn super::Store, dir: &str) -> bool {
    store.attr(&join(dir, bcolz::ROOTDIRS)).is_ok_and(|a| a.kind == Kind::File)
}

/// True when `store`, which has no `zarr.json` at its root, holds BLZ data at its root or in a
/// directory just below it (its root listing and two stats per directory in it: never a walk).
pub fn holds_blz(store: &dyn super::Store) -> bool {
    if is_carray(store, "") || is_ctable(store, "") {
        return true;
    }
    let Ok((entries, _)) = store.list("") else { return false };
    entries.iter().any(|(name, kind)| match kind {
        Kind::File => name.len() > BLP.len() && name.ends_with(BLP),
        Kind::Dir => is_carray(store, name) || is_ctable(store, name),
        _ => false,
    })
}

/// True when an array is listed: unless refused. One that cannot be read at all is listed too, so
/// that looking it up fails (EIO) rather than the whole listing.
fn shown_array(read: Result<Option<Arc<Array>>>) -> bool {
    !matches!(read, Ok(None))
}

impl BlzStore {
    /// The BLZ data in `inner`, with `cache_bytes` of memory for array descriptions (the chunk
    /// tables of Bloscpack files) and as much for verified and decoded chunks.
    pub fn new(inner: Arc<dyn super::Store>, cache_bytes: usize) -> Self {
        BlzStore { inner, arrays: Cache::new(cache_bytes), chunks: Arc::new(Cache::new(cache_bytes)) }
    }

    /// The array of the Bloscpack file `file`, as it is now; `None` when refused.
    fn blp(&self, file: &str) -> Result<Option<Arc<Array>>> {
        let stamp = self.inner.attr(file)?.stamp;
        self.array(file, stamp, || read_blp(&*self.inner, file))
    }

    /// The array of the carray directory `dir`, as it is now; `None` when refused.
    fn carray(&self, dir: &str) -> Result<Option<Arc<Array>>> {
        let stamp = carray_stamp(&*self.inner, dir)?;
        self.array(dir, stamp, || read_carray(&*self.inner, dir))
    }

    fn array(&self, key: &str, stamp: Stamp, read: impl Fn() -> Result<Option<Array>>) -> Result<Option<Arc<Array>>> {
        if let Some(found) = self.arrays.get(&key.to_string(), &stamp) {
            return Ok(found);
        }
        let array = read()?.map(Arc::new);
        // The stamp of what was read: a file replaced since the stat is cached at its new version.
        let read_at = array.as_ref().map_or(stamp, |a| a.stamp);
        let bytes = array.as_ref().map_or(0, |a| a.heap_bytes());
        self.arrays.insert(key.to_string(), read_at, array.clone(), bytes);
        Ok(array)
    }

    /// What `key` is.
    fn node(&self, key: &str) -> Result<Node> {
        let missing = || Error::NotFound(self.inner.describe(key));
        let parts: Vec<&str> = if key.is_empty() { Vec::new() } else { key.split('/').collect() };
        if is_carray(&*self.inner, "") {
            let array = self.carray("")?.ok_or_else(missing)?;
            return self.inside(array, &parts).ok_or_else(missing);
        }
        let mut dir = String::new();
        let mut table = is_ctable(&*self.inner, "");
        for (at, name) in parts.iter().enumerate() {
            let last = at + 1 == parts.len();
            if *name == ZARR_JSON {
                return if last { Ok(Node::GroupDoc { dir, table }) } else { Err(missing()) };
            }
            if table && (*name == bcolz::ROOTDIRS || *name == bcolz::ATTRS) {
                return Err(missing());
            }
            let stored = join(&dir, name);
            match self.inner.attr(&stored) {
                Ok(attr) if attr.kind == Kind::Dir => {
                    if is_carray(&*self.inner, &stored) {
                        let array = self.carray(&stored)?.ok_or_else(missing)?;
                        return self.inside(array, &parts[at + 1..]).ok_or_else(missing);
                    }
                    table = is_ctable(&*self.inner, &stored);
                    dir = stored;
                }
                Ok(_) if name.ends_with(BLP) => return Err(missing()),
                Ok(_) if last => return Ok(Node::Plain(stored)),
                Ok(_) => return Err(missing()),
                Err(Error::NotFound(_)) => {
                    let file = format!("{stored}{BLP}");
                    if !self.inner.attr(&file).is_ok_and(|a| a.kind == Kind::File) {
                        return Err(missing());
                    }
                    let array = self.blp(&file)?.ok_or_else(missing)?;
                    return self.inside(array, &parts[at + 1..]).ok_or_else(missing);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Node::Group { dir, table })
    }

    /// The node at `rest` inside `array`'s directory.
    fn inside(&self, array: Arc<Array>, rest: &[&str]) -> Option<Node> {
        match rest {
            [] => Some(Node::Array(array)),
            [name] if *name == ZARR_JSON => Some(Node::ArrayDoc(array)),
            ["c", coords @ ..] if array.doc.is_ok() && coords.len() <= array.rank => {
                let canonical = |s: &str| s.parse::<u64>().ok().filter(|n| n.to_string() == s);
                let mut parsed = coords.iter().map(|c| canonical(c));
                let first = match parsed.next() {
                    None => return Some(Node::ShardDir(array, 0)),
                    Some(first) => first.filter(|i| *i < array.shards)?,
                };
                if !parsed.all(|c| c == Some(0)) {
                    return None;
                }
                Some(if coords.len() == array.rank {
                    Node::Shard(array, first)
                } else {
                    Node::ShardDir(array, coords.len())
                })
            }
            _ => None,
        }
    }

    fn group_doc(&self, dir: &str, table: bool) -> Result<(Vec<u8>, Stamp, Attr)> {
        let dir_attr = self.inner.attr(dir)?;
        if !table {
            return Ok((document::group(Default::default()), dir_attr.stamp, dir_attr));
        }
        let key = join(dir, bcolz::ATTRS);
        let (bytes, stamp) = match self.inner.open(&key) {
            Ok(file) if file.attr().size > bcolz::MAX_META_FILE => {
                (None, combine(&[dir_attr.stamp, file.attr().stamp]))
            }
            Ok(file) => (Some(file.read_exact_at(0, file.attr().size)?), combine(&[dir_attr.stamp, file.attr().stamp])),
            Err(Error::NotFound(_)) => (Some(Vec::new()), dir_attr.stamp),
            Err(e) => return Err(e),
        };
        let too_large = || crate::format::blz::BlzError::Damaged(format!("larger than {} bytes", bcolz::MAX_META_FILE));
        let attributes = bytes.ok_or_else(too_large).and_then(|b| bcolz::attributes(&b)).unwrap_or_else(|e| {
            log::warn!("{}: {e}; the table's attributes are left out", self.inner.describe(&key));
            Default::default()
        });
        Ok((document::group(attributes), stamp, dir_attr))
    }

    fn doc_attr(base: Attr, size: usize, stamp: Stamp) -> Attr {
        Attr { kind: Kind::File, size: size as u64, perm: base.perm & 0o666, nlink: 1, stamp, ..base }
    }

    fn array_doc(&self, array: &Array) -> Result<Vec<u8>> {
        array.doc.clone().map_err(|why| arrays::damaged(self.describe_array(array), why))
    }

    fn describe_array(&self, array: &Array) -> String {
        match &array.source {
            arrays::Source::Blp { file, .. } => self.inner.describe(file),
            arrays::Source::Carray { dir, .. } => self.inner.describe(dir),
        }
    }

    fn shard_attr(&self, array: &Array, shard: u64) -> Result<Attr> {
        let file = array.shard_file(shard);
        let attr = match self.inner.attr(&file) {
            Ok(attr) => attr,
            Err(Error::NotFound(_)) => {
                return Err(arrays::damaged(self.inner.describe(&file), "chunk file is missing"));
            }
            Err(e) => return Err(e),
        };
        Ok(match array.source {
            arrays::Source::Blp { .. } => ShardObject::blp_attr(array, &attr),
            arrays::Source::Carray { .. } => ShardObject::carray_attr(array, &attr, shard),
        })
    }

    fn list_group(&self, dir: &str, table: bool) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let (entries, stamp) = self.inner.list(dir)?;
        let names: std::collections::HashSet<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        let mut shown = vec![(ZARR_JSON.to_string(), Kind::File)];
        for (name, kind) in &entries {
            let key = join(dir, name);
            if name == ZARR_JSON || (table && (name == bcolz::ROOTDIRS || name == bcolz::ATTRS)) {
                continue;
            }
            match kind {
                Kind::File if name.len() > BLP.len() && name.ends_with(BLP) => {
                    let array = name.strip_suffix(BLP).expect("checked");
                    if names.contains(array) {
                        log::warn!("{}: not shown: {array} is taken by another entry", self.inner.describe(&key));
                    } else if shown_array(self.blp(&key)) {
                        shown.push((array.to_string(), Kind::Dir));
                    }
                }
                Kind::Dir if is_carray(&*self.inner, &key) => {
                    if shown_array(self.carray(&key)) {
                        shown.push((name.clone(), Kind::Dir));
                    }
                }
                _ => shown.push((name.clone(), *kind)),
            }
        }
        Ok((shown, stamp))
    }
}

impl ReadOnlyStore for BlzStore {
    fn describe(&self, key: &str) -> String {
        match self.node(key) {
            Ok(Node::Shard(array, shard)) => self.inner.describe(&array.shard_file(shard)),
            // A document's name must end in its file name (the view names what it renders so).
            Ok(Node::Array(array) | Node::ShardDir(array, _)) => self.describe_array(&array),
            _ => self.inner.describe(key),
        }
    }

    /// The source file for a shard (its chunks are at the same offsets there, all but a short last
    /// chunk, which exists only in the view: see [`Store::synthesized`]).
    fn url(&self, key: &str) -> String {
        match self.node(key) {
            Ok(Node::Shard(array, shard)) => self.inner.url(&array.shard_file(shard)),
            _ => self.inner.url(key),
        }
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        match self.node(key)? {
            Node::Group { dir, .. } => self.inner.attr(&dir),
            Node::GroupDoc { dir, table } => {
                let (doc, stamp, base) = self.group_doc(&dir, table)?;
                Ok(Self::doc_attr(base, doc.len(), stamp))
            }
            Node::Plain(key) => self.inner.attr(&key),
            Node::Array(array) | Node::ShardDir(array, _) => Ok(array.attr),
            Node::ArrayDoc(array) => Ok(Self::doc_attr(array.attr, self.array_doc(&array)?.len(), array.stamp)),
            Node::Shard(array, shard) => self.shard_attr(&array, shard),
        }
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let not_dir =
            || Error::Io { place: self.inner.describe(dir), source: std::io::Error::from_raw_os_error(libc::ENOTDIR) };
        match self.node(dir)? {
            Node::Group { dir, table } => self.list_group(&dir, table),
            Node::Array(array) => {
                let mut entries = vec![(ZARR_JSON.to_string(), Kind::File)];
                if array.doc.is_ok() {
                    entries.insert(0, ("c".to_string(), Kind::Dir));
                }
                Ok((entries, array.stamp))
            }
            Node::ShardDir(array, depth) => {
                let kind = if depth + 1 == array.rank { Kind::File } else { Kind::Dir };
                let names: Vec<(String, Kind)> = if depth == 0 {
                    (0..array.shards).map(|i| (i.to_string(), kind)).collect()
                } else {
                    vec![("0".to_string(), kind)]
                };
                Ok((names, array.stamp))
            }
            Node::Plain(_) | Node::GroupDoc { .. } | Node::ArrayDoc(_) | Node::Shard(..) => Err(not_dir()),
        }
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let place = self.inner.describe(key);
        let is_dir = || Error::Io { place: place.clone(), source: std::io::Error::from_raw_os_error(libc::EISDIR) };
        // A Bloscpack file replaced between reading its description and opening it is read again.
        for _ in 0..3 {
            return match self.node(key)? {
                Node::Plain(key) => self.inner.open(&key),
                Node::GroupDoc { dir, table } => {
                    let (doc, stamp, base) = self.group_doc(&dir, table)?;
                    let attr = Self::doc_attr(base, doc.len(), stamp);
                    Ok(Box::new(BytesObject { attr, bytes: doc.into(), place }))
                }
                Node::ArrayDoc(array) => {
                    let doc = self.array_doc(&array)?;
                    let attr = Self::doc_attr(array.attr, doc.len(), array.stamp);
                    Ok(Box::new(BytesObject { attr, bytes: doc.into(), place }))
                }
                Node::Shard(array, shard) => {
                    match ShardObject::open(&*self.inner, array, shard, self.chunks.clone())? {
                        Some(object) => Ok(Box::new(object)),
                        None => continue,
                    }
                }
                Node::Group { .. } | Node::Array(_) | Node::ShardDir(..) => Err(is_dir()),
            };
        }
        Err(arrays::damaged(place, "keeps changing while being opened"))
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        match self.node(key)? {
            Node::Plain(key) => self.inner.read_link(&key),
            _ => Err(Error::Io {
                place: self.inner.describe(key),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            }),
        }
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    fn synthesized(&self) -> bool {
        true
    }
}
