//! A store over another whose server answers lookups by name but cannot list directories (a
//! plain web server without WebDAV): every file is still found by its key, and directories are
//! derived from the Zarr documents the store holds, read with the inner store's lookups.
//!
//! - The root, and every directory with a `zarr.json`, is a directory. It lists its `zarr.json`;
//!   a group also lists the children that consolidated metadata (its own, or the nearest
//!   ancestor's) names, and nothing else (a group without consolidated metadata shows no
//!   children, though each is there by name).
//! - An array's chunk key space comes from its document: the directories of its `/`-separated
//!   keys are every coordinate of its chunk grid (of shards, for a sharded array), whether or not
//!   anything is stored below; the chunk (shard) files are those of the grid that a HEAD finds,
//!   so a missing shard is simply not there.
//! - Other files (attributes, `.zattrs`, a README) are found by name, never listed.
//!
//! The inner store must answer a lookup of a key that is no object with `NotFound` without
//! listing (a [`BucketStore`](super::BucketStore) without the list ability does).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use serde_json::Value;

use super::{
    Attr, Error, Kind, Lock, Object, OpenFile, OpenHow, PutMode, Result, Space, Stamp, Store, Then, file_name, join,
    parent_key,
};
use crate::format::chunk_key::{ChunkKeyEncoding, KeyStyle};
use crate::format::metadata::ZARR_JSON;
use crate::format::sharding::shape;

/// A listing never enumerates more candidate keys than this: past it, the directory is refused
/// (EFBIG) rather than sent a HEAD per key.
const MOST_CANDIDATES: u64 = 100_000;

/// What one `zarr.json` says of the directories below it.
#[derive(Debug)]
enum Node {
    /// A group, with the paths (relative to it) its consolidated metadata names, if it has any.
    Group { consolidated: Option<Vec<String>> },
    /// An array whose chunk keys are known: the grid of stored keys and their encoding.
    Array { grid: Vec<u64>, encoding: ChunkKeyEncoding },
    /// Anything else (an array whose chunk keys cannot be told): only its `zarr.json` is listed.
    Opaque,
}

impl Node {
    fn parse(bytes: &[u8]) -> Node {
        let Ok(doc) = serde_json::from_slice::<Value>(bytes) else { return Node::Opaque };
        match doc.get("node_type").and_then(Value::as_str) {
            Some("group") => {
                let metadata = doc.get("consolidated_metadata").and_then(|c| c.get("metadata"));
                let consolidated = metadata.and_then(Value::as_object).map(|m| m.keys().cloned().collect());
                Node::Group { consolidated }
            }
            Some("array") => Self::array(&doc).unwrap_or(Node::Opaque),
            _ => Node::Opaque,
        }
    }

    fn array(doc: &Value) -> Option<Node> {
        let array_shape = shape(doc.get("shape"))?;
        let grid = doc.get("chunk_grid")?;
        if grid.get("name").and_then(Value::as_str) != Some("regular") {
            return None;
        }
        let chunk_shape = shape(grid.get("configuration").and_then(|c| c.get("chunk_shape")))?;
        if chunk_shape.len() != array_shape.len() || chunk_shape.contains(&0) {
            return None;
        }
        let encoding = ChunkKeyEncoding::from_json(doc.get("chunk_key_encoding")?).ok()?;
        let grid = array_shape.iter().zip(&chunk_shape).map(|(s, c)| s.div_ceil(*c)).collect();
        Some(Node::Array { grid, encoding })
    }
}

/// A directory this store knows of.
#[derive(Debug)]
enum Dir {
    /// The root or a node: its document (`None`: the root without one).
    Node { doc: Option<(Attr, Arc<Node>)> },
    /// A directory of an array's chunk keys: `rel` below the array at `array`, fixing `prefix`.
    Chunks { array: String, doc: (Attr, Arc<Node>), rel: String, prefix: Vec<u64> },
}

/// A store whose directories are derived from its Zarr documents.
#[derive(Debug)]
pub struct UnlistedStore {
    inner: Arc<dyn Store>,
    /// Parsed documents by key, with the version parsed.
    nodes: Mutex<lru::LruCache<String, (Stamp, Arc<Node>)>>,
}

impl UnlistedStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let size = std::num::NonZeroUsize::new(10_000).expect("non-zero");
        UnlistedStore { inner, nodes: Mutex::new(lru::LruCache::new(size)) }
    }

    /// The document of the node at `dir`, if there is one.
    fn node(&self, dir: &str) -> Result<Option<(Attr, Arc<Node>)>> {
        let key = join(dir, ZARR_JSON);
        let attr = match self.inner.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => attr,
            Ok(_) | Err(Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some((stamp, node)) = self.nodes.lock().get(&key)
            && *stamp == attr.stamp
        {
            return Ok(Some((attr, node.clone())));
        }
        let object = self.inner.open(&key)?;
        let attr = *object.attr();
        let node = Arc::new(Node::parse(&object.read_exact_at(0, attr.size)?));
        self.nodes.lock().put(key, (attr.stamp, node.clone()));
        Ok(Some((attr, node)))
    }

    /// What directory `key` is, or `None` when it is none this store can tell of.
    fn dir(&self, key: &str) -> Result<Option<Dir>> {
        if key.is_empty() {
            return Ok(Some(Dir::Node { doc: self.node("")? }));
        }
        if file_name(key) == ZARR_JSON {
            return Ok(None);
        }
        // The nearest document above decides: inside an array only chunk keys live, and no
        // document needs to be asked for.
        let mut above = key;
        while !above.is_empty() {
            above = parent_key(above);
            let Some(doc) = self.node(above)? else { continue };
            if let Node::Array { grid, encoding } = &*doc.1 {
                let rel = key.strip_prefix(above).unwrap_or(key).trim_start_matches('/');
                let inside = encoding.decode_dir(rel, grid.len()).filter(|p| p.iter().zip(grid).all(|(c, g)| c < g));
                return Ok(inside.map(|prefix| Dir::Chunks { array: above.to_string(), doc, rel: rel.into(), prefix }));
            }
            break;
        }
        Ok(self.node(key)?.map(|doc| Dir::Node { doc: Some(doc) }))
    }

    /// True when a file is at `key`.
    fn exists(&self, key: &str) -> Result<bool> {
        match self.inner.attr(key) {
            Ok(attr) => Ok(attr.kind == Kind::File),
            Err(Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The children of group `dir` that consolidated metadata names: its own, or the nearest
    /// ancestor's.
    fn consolidated_children(&self, dir: &str) -> Result<Vec<String>> {
        let mut above = dir;
        loop {
            if let Some((_, node)) = self.node(above)?
                && let Node::Group { consolidated: Some(paths) } = &*node
            {
                let rel = dir.strip_prefix(above).unwrap_or(dir).trim_start_matches('/');
                let mut names: Vec<String> = paths
                    .iter()
                    .filter_map(
                        |p| if rel.is_empty() { Some(p.as_str()) } else { p.strip_prefix(rel)?.strip_prefix('/') },
                    )
                    .filter_map(|rest| rest.split('/').next().filter(|n| !n.is_empty()))
                    .map(str::to_string)
                    .collect();
                names.sort();
                names.dedup();
                return Ok(names);
            }
            if above.is_empty() {
                return Ok(Vec::new());
            }
            above = parent_key(above);
        }
    }

    /// The entries of directory `dir`, sorted.
    fn entries(&self, key: &str, dir: &Dir) -> Result<Vec<(String, Kind)>> {
        let mut entries = Vec::new();
        match dir {
            Dir::Node { doc } => {
                let Some((_, node)) = doc else { return Ok(entries) };
                entries.push((ZARR_JSON.to_string(), Kind::File));
                match &**node {
                    Node::Group { .. } => {
                        entries.extend(self.consolidated_children(key)?.into_iter().map(|n| (n, Kind::Dir)));
                    }
                    Node::Array { grid, encoding } => {
                        entries.extend(self.chunk_entries(key, grid, encoding, "", &[])?)
                    }
                    Node::Opaque => {}
                }
            }
            Dir::Chunks { array, doc: (_, node), rel, prefix } => {
                if let Node::Array { grid, encoding } = &**node {
                    entries.extend(self.chunk_entries(array, grid, encoding, rel, prefix)?);
                }
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        Ok(entries)
    }

    /// The entries of the chunk-key directory `rel` of the array at `array`, which fixes the
    /// leading coordinates `prefix`: directories from the grid, files that are there.
    fn chunk_entries(
        &self,
        array: &str,
        grid: &[u64],
        encoding: &ChunkKeyEncoding,
        rel: &str,
        prefix: &[u64],
    ) -> Result<Vec<(String, Kind)>> {
        let rank = grid.len();
        let mut names = Vec::new();
        let file = |name: String, names: &mut Vec<(String, Kind)>| -> Result<()> {
            if self.exists(&join(array, &join(rel, &name)))? {
                names.push((name, Kind::File));
            }
            Ok(())
        };
        if rank == 0 || encoding.separator != '/' {
            // Every key is a file of the array's own directory.
            if !rel.is_empty() {
                return Ok(names);
            }
            self.check_count(array, grid.iter().product())?;
            let mut coords = vec![0; rank];
            if grid.contains(&0) {
                return Ok(names);
            }
            loop {
                file(encoding.encode(&coords), &mut names)?;
                let Some(axis) = (0..rank).rev().find(|&a| coords[a] + 1 < grid[a]) else { break };
                coords[axis] += 1;
                coords[axis + 1..].fill(0);
            }
            return Ok(names);
        }
        if rel.is_empty() && encoding.style == KeyStyle::Default {
            return Ok(vec![("c".to_string(), Kind::Dir)]);
        }
        let depth = prefix.len();
        self.check_count(array, grid[depth])?;
        for i in 0..grid[depth] {
            let mut coords = prefix.to_vec();
            coords.push(i);
            let name = file_name(&encoding.encode(&coords)).to_string();
            if depth + 1 < rank {
                names.push((name, Kind::Dir));
            } else {
                file(name, &mut names)?;
            }
        }
        Ok(names)
    }

    fn check_count(&self, array: &str, count: u64) -> Result<()> {
        if count <= MOST_CANDIDATES {
            return Ok(());
        }
        let why = format!("{count} chunk keys to look up one by one: the server cannot list them");
        Err(Error::Io { place: self.inner.describe(array), source: std::io::Error::other(why) })
    }

    /// The attributes of directory `key`, whose version is that of its listing.
    fn dir_attr(&self, key: &str, dir: &Dir) -> Result<Attr> {
        let entries = self.entries(key, dir)?;
        let mut hasher = DefaultHasher::new();
        for (name, kind) in &entries {
            (name, *kind == Kind::Dir).hash(&mut hasher);
        }
        let stamp = Stamp::new([3, hasher.finish(), entries.len() as u64, 0, 0]);
        let doc = match dir {
            Dir::Node { doc } => doc.as_ref().map(|d| d.0),
            Dir::Chunks { doc, .. } => Some(doc.0),
        };
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let t = doc.map_or(SystemTime::UNIX_EPOCH, |d| d.mtime);
        Ok(Attr { kind: Kind::Dir, size: 0, perm: 0o755, uid, gid, nlink: 2, atime: t, mtime: t, ctime: t, stamp })
    }
}

impl Store for UnlistedStore {
    fn describe(&self, key: &str) -> String {
        self.inner.describe(key)
    }

    fn url(&self, key: &str) -> String {
        self.inner.url(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        match self.dir(key)? {
            Some(dir) => self.dir_attr(key, &dir),
            None => self.inner.attr(key),
        }
    }

    fn list(&self, dir_key: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        match self.dir(dir_key)? {
            Some(dir) => Ok((self.entries(dir_key, &dir)?, self.dir_attr(dir_key, &dir)?.stamp)),
            None if self.exists(dir_key)? => Err(Error::Io {
                place: self.describe(dir_key),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            }),
            None => Err(Error::NotFound(self.describe(dir_key))),
        }
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        self.inner.open(key)
    }

    fn prefetch(&self, key: &str, then: Then) {
        self.inner.prefetch(key, then)
    }

    fn read(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.read(key)
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        self.inner.read_link(key)
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        self.inner.put(key, pieces, mode)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }

    fn delete_version(&self, key: &str, stamp: &Stamp) -> Result<bool> {
        self.inner.delete_version(key, stamp)
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(from, to)
    }

    fn make_dir(&self, key: &str, mode: u32) -> Result<()> {
        self.inner.make_dir(key, mode)
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        self.inner.make_dirs(key)
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
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
        self.inner.open_file(key, how)
    }

    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>> {
        self.inner.lock(slot)
    }

    fn check_writes(&self) -> Result<()> {
        self.inner.check_writes()
    }

    fn synthesized(&self) -> bool {
        self.inner.synthesized()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    /// Every directory of the golden sharded store, listed by the local store itself and derived
    /// from its documents: the same files, and every directory (the derived listing may add chunk
    /// directories of the grid that hold nothing).
    #[test]
    fn derived_listings_hold_what_the_directory_holds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden/sharded");
        let local: Arc<dyn Store> = Arc::new(LocalStore::open(&root).unwrap());
        let unlisted = UnlistedStore::new(local.clone());
        let mut dirs = vec![String::new()];
        let mut checked = 0;
        while let Some(dir) = dirs.pop() {
            let (want, _) = local.list(&dir).unwrap();
            let (got, stamp) = unlisted.list(&dir).unwrap();
            assert_eq!(unlisted.attr(&dir).unwrap().stamp, stamp, "{dir}");
            let files = |entries: &[(String, Kind)]| {
                let mut names: Vec<_> = entries.iter().filter(|e| e.1 == Kind::File).map(|e| e.0.clone()).collect();
                names.sort();
                names
            };
            assert_eq!(files(&got), files(&want), "files of {dir:?}");
            for (name, kind) in want.iter().filter(|e| e.1 == Kind::Dir) {
                assert!(got.contains(&(name.clone(), *kind)), "{dir:?} lacks {name}");
                dirs.push(join(&dir, name));
            }
            checked += 1;
        }
        assert!(checked > 30, "{checked} directories");
        assert_eq!(unlisted.attr("zp/gzip_crc_end/c/1/0").unwrap().kind, Kind::File);
        assert_eq!(unlisted.attr("zp/gzip_crc_end/c/9").map(|a| a.kind).ok(), None);
        assert!(matches!(unlisted.list("zp/nothing"), Err(Error::NotFound(_))));
        assert_eq!(unlisted.list("zp/gzip_crc_end/zarr.json").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
    }
}
