//! An Icechunk repository (spec v1 or v2, in any store) as a read-only store of one of its
//! versions: a branch's tip (followed as it moves), a tag, or a snapshot. Each node's
//! `zarr.json` is at its path; each chunk at the key its array's chunk key encoding gives its
//! coordinates, read from where its manifest says it is: inline, a range of a native chunk object,
//! or a range of a virtual file elsewhere. The view above sees a Zarr v3 store.
//!
//! The branch or tag is resolved again when the file naming it (`repo`, or `refs/.../ref.json`)
//! changes, and the snapshot it names is read once; manifests are immutable (named by their ID),
//! parsed once and kept in a byte-bounded cache. Virtual chunks are read only from URLs under a
//! prefix the user authorizes (`--allow-virtual`, Icechunk's own rule), and only while their file
//! is the version the repository recorded (its ETag or modification time). What cannot be read
//! as recorded (a damaged manifest, a native chunk object missing or too short, a virtual chunk
//! refused) is EIO for the keys concerned with a log line naming the cause; every other key keeps
//! working, and no chunk a manifest holds ever reads as missing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use parking_lot::Mutex;

use super::cache::Cache;
use super::key_tree::KeyTree;
use super::range::RangeObject;
use super::read_only::{ReadOnlyStore, damaged, errno};
use super::targets::Targets;
use super::{Attr, BytesObject, Error, Kind, Location, Object, Result, Space, Stamp, join};
use crate::format::chunk_key::ChunkKeyEncoding;
use crate::format::icechunk::{
    self, ArrayChunks, Checksum, ManifestFile, Payload, REPO_FILE, SnapshotId, Version, manifest_key, snapshot_key,
};
use crate::format::metadata::ZARR_JSON;

/// How a repository keeps its branches and tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `refs/branch.NAME/ref.json` and `refs/tag.NAME/ref.json`.
    V1,
    /// One `repo` file.
    V2,
}

/// True when `store` holds an Icechunk repository, and which kind.
pub fn spec_of(store: &dyn super::Store) -> Option<Spec> {
    let is = |key: &str, kind| store.attr(key).is_ok_and(|a| a.kind == kind);
    if is(REPO_FILE, Kind::File) {
        // The root's listing, which finding `repo` read on an object store, says whether
        // `snapshots` is a directory: asking for its attributes would list it, a round trip more
        // before the mount starts.
        let (entries, _) = store.list("").ok()?;
        entries.iter().any(|(name, kind)| name == "snapshots" && *kind == Kind::Dir).then_some(Spec::V2)
    } else if is("refs", Kind::Dir) && is("snapshots", Kind::Dir) {
        Some(Spec::V1)
    } else {
        None
    }
}

/// The branches and tags of the repository in `inner`, each with the snapshot it names.
pub fn refs(inner: &dyn super::Store, spec: Spec) -> Result<icechunk::Refs> {
    match spec {
        Spec::V2 => {
            let bytes = inner.read(REPO_FILE)?;
            icechunk::repo_refs(&bytes).map_err(|e| damaged(inner.describe(REPO_FILE), e.0))
        }
        Spec::V1 => {
            let (names, _) = inner.list("refs")?;
            let mut refs = icechunk::Refs { branches: Vec::new(), tags: Vec::new() };
            for (name, _) in names {
                let (list, short) = match (name.strip_prefix("branch."), name.strip_prefix("tag.")) {
                    (Some(branch), _) => (&mut refs.branches, branch),
                    (_, Some(tag)) => (&mut refs.tags, tag),
                    _ => continue,
                };
                let key = format!("refs/{name}/ref.json");
                match inner.read(&key) {
                    Ok(bytes) => {
                        let id = icechunk::ref_json(&bytes).map_err(|e| damaged(inner.describe(&key), e.0))?;
                        list.push((short.to_string(), id));
                    }
                    // A deleted tag leaves its directory with a marker and no ref.json.
                    Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(refs)
        }
    }
}

/// One array of the snapshot shown.
#[derive(Debug)]
struct Array {
    chunks: ArrayChunks,
    /// How its chunk coordinates become keys, or why its document does not say.
    encoding: std::result::Result<ChunkKeyEncoding, String>,
    /// Its chunk keys (relative to its directory) as a tree, once listed.
    listed: Mutex<Option<Arc<KeyTree>>>,
}

/// One snapshot, indexed.
#[derive(Debug)]
struct Catalog {
    snapshot: String,
    /// The snapshot file's attributes: every file's times and permissions.
    attr: Attr,
    /// Every node's `zarr.json`, and the directories they imply.
    tree: KeyTree,
    documents: Vec<Arc<[u8]>>,
    arrays: HashMap<String, Array>,
}

/// What a key of the version shown is.
enum Node {
    Dir,
    Document(Arc<[u8]>),
    Chunk(Payload),
}

/// The snapshot last shown, by the stamp of what named it, or why it could not be read.
type LastRead = (Stamp, std::result::Result<Arc<Catalog>, String>);

/// A version of an Icechunk repository as a read-only store.
#[derive(Debug)]
pub struct IcechunkStore {
    inner: Arc<dyn super::Store>,
    spec: Spec,
    /// The version shown: fixed, except where a writable branch mount pins the snapshot its
    /// session is based on ([`IcechunkStore::show`]).
    version: parking_lot::RwLock<Version>,
    targets: Targets,
    /// URL prefixes virtual chunks may be read from.
    allowed: Vec<String>,
    last: Mutex<Option<LastRead>>,
    manifests: Cache<String, std::result::Result<Arc<ManifestFile>, String>>,
}

impl IcechunkStore {
    /// `version` of the repository in `inner`, read, its parsed manifests kept in
    /// `manifest_bytes` of memory; the error is one line naming the repository
    /// and why that version cannot be shown.
    pub fn open(
        inner: Arc<dyn super::Store>,
        version: Version,
        targets: Targets,
        allowed: Vec<String>,
        manifest_bytes: usize,
    ) -> std::result::Result<Self, String> {
        let spec = spec_of(&*inner).ok_or_else(|| format!("{}: not an Icechunk repository", inner.describe("")))?;
        let manifests = Cache::new(manifest_bytes);
        let version = parking_lot::RwLock::new(version);
        let store = IcechunkStore { inner, spec, version, targets, allowed, last: Mutex::new(None), manifests };
        store.catalog().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// The file whose version says which snapshot `version` is: `None` for a snapshot ID.
    fn naming_file(&self, version: &Version) -> Option<String> {
        match (version, self.spec) {
            (Version::Snapshot(_), _) => None,
            (_, Spec::V2) => Some(REPO_FILE.to_string()),
            (version, Spec::V1) => icechunk::ref_key(version),
        }
    }

    /// The snapshot shown now, read again when what names it changed.
    fn catalog(&self) -> Result<Arc<Catalog>> {
        // One version throughout, though another may be shown meanwhile (IcechunkStore::show).
        let version = self.version();
        let naming = self.naming_file(&version);
        let stamp = match &naming {
            Some(key) => match self.inner.attr(key) {
                Err(Error::NotFound(_)) => return Err(damaged(self.describe(""), format!("no {version}"))),
                found => found?.stamp.derived(version.to_string()),
            },
            // The snapshot's ID: a catalog read for one never answers for another.
            None => Stamp::computed(version.to_string()),
        };
        let mut last = self.last.lock();
        if let Some((seen, read)) = &*last
            && *seen == stamp
        {
            return read.clone().map_err(|why| damaged(self.describe(""), why));
        }
        // A store's failure (the network) is not kept: the next question asks again. What the
        // repository's files say (damaged, or naming what is not there) is kept for this version.
        let read = self.read_catalog(&version, naming.as_deref())?.map(Arc::new);
        if let Err(why) = &read {
            log::warn!("{}: {why}", self.describe(""));
        }
        *last = Some((stamp, read.clone()));
        read.map_err(|why| damaged(self.describe(""), why))
    }

    /// The ID of the snapshot `version` is, read from `naming` (none for a snapshot ID); the inner
    /// error says what in the repository's files keeps it from being known.
    fn resolve(&self, version: &Version, naming: Option<&str>) -> Result<std::result::Result<SnapshotId, String>> {
        let in_file = |key: &str, e: icechunk::IcechunkError| format!("{}: {e}", self.inner.describe(key));
        Ok(match (naming, self.spec) {
            (None, _) => icechunk::snapshot_id(match version {
                Version::Snapshot(id) => id,
                _ => "",
            })
            .map_err(|e| e.0),
            (Some(key), Spec::V2) => match icechunk::repo_refs(&self.inner.read(key)?) {
                Ok(refs) => refs.resolve(version).map_err(|e| e.0),
                Err(e) => Err(in_file(key, e)),
            },
            (Some(key), Spec::V1) => match self.inner.read(key) {
                Err(Error::NotFound(_)) => Err(format!("no {version}")),
                found => icechunk::ref_json(&found?).map_err(|e| in_file(key, e)),
            },
        })
    }

    /// The snapshot branch `branch` names now, read from the file that names it (looked at again
    /// only when that file changed): no request where nothing moved.
    pub fn tip(&self, branch: &str) -> Result<String> {
        let version = Version::Branch(branch.to_string());
        let naming = self.naming_file(&version);
        let id = self.resolve(&version, naming.as_deref())?.map_err(|why| damaged(self.describe(""), why))?;
        Ok(id.to_string())
    }

    /// The snapshot `naming` (or the snapshot ID shown) names, indexed; the inner error says what
    /// in the repository's files keeps it from being read.
    fn read_catalog(&self, version: &Version, naming: Option<&str>) -> Result<std::result::Result<Catalog, String>> {
        let in_file = |key: &str, e: icechunk::IcechunkError| format!("{}: {e}", self.inner.describe(key));
        let snapshot = match self.resolve(version, naming)? {
            Ok(snapshot) => snapshot,
            Err(why) => return Ok(Err(why)),
        };
        let key = snapshot_key(&snapshot);
        // Named by its ID, a snapshot never changes: read whole without asking for its version
        // first (a round trip less before a mount starts), and one stamp serves it for good. One
        // committed since the store last looked is there for good once a ref names it.
        let bytes = match self.inner.read_written_once(&key) {
            Ok(bytes) => bytes,
            Err(Error::NotFound(place)) => {
                return Ok(Err(format!("{place}: snapshot {snapshot} of {version} is not there")));
            }
            Err(e) => return Err(e),
        };
        let attr = Attr {
            kind: Kind::File,
            size: bytes.len() as u64,
            nlink: 1,
            stamp: Stamp::computed(&key),
            ..self.inner.attr("")?
        };
        let nodes = match icechunk::snapshot_nodes(&bytes) {
            Ok(nodes) => nodes,
            Err(e) => return Ok(Err(in_file(&key, e))),
        };
        let names: Vec<String> = nodes.iter().map(|node| join(&node.path, ZARR_JSON)).collect();
        let tree = KeyTree::of(names.iter().enumerate().map(|(n, name)| (n, name.as_str())), &self.describe(""));
        let mut documents = Vec::with_capacity(nodes.len());
        let mut arrays = HashMap::new();
        for node in nodes {
            if let Some(chunks) = node.array {
                let encoding = serde_json::from_slice::<serde_json::Value>(&node.zarr_json)
                    .map_err(|e| format!("{}: not JSON: {e}", join(&node.path, ZARR_JSON)))
                    .and_then(|doc| {
                        let encoding = doc.get("chunk_key_encoding").cloned().unwrap_or(serde_json::Value::Null);
                        ChunkKeyEncoding::from_json(&encoding)
                            .map_err(|e| format!("{}: {e}", join(&node.path, ZARR_JSON)))
                    });
                arrays.insert(node.path.clone(), Array { chunks, encoding, listed: Mutex::new(None) });
            }
            documents.push(node.zarr_json);
        }
        Ok(Ok(Catalog { snapshot: snapshot.to_string(), attr, tree, documents, arrays }))
    }

    fn version(&self) -> Version {
        self.version.read().clone()
    }

    /// Manifest `id`, from cache or from its file.
    fn manifest(&self, id: &icechunk_format::ManifestId) -> Result<Arc<ManifestFile>> {
        let key = manifest_key(id);
        let place = self.inner.describe(&key);
        // Named by its ID, a manifest never changes: one stamp serves every version.
        let stamp = Stamp::computed(&key);
        if let Some(found) = self.manifests.get(&key, &stamp) {
            return found.map_err(|why| damaged(place, why));
        }
        let read = match self.inner.read(&key) {
            // Written since the store last looked (see read_catalog).
            Err(Error::NotFound(_)) => self.inner.read_written_once(&key),
            found => found,
        };
        let parsed = match read {
            Ok(bytes) => ManifestFile::parse(&bytes).map(Arc::new).map_err(|e| e.0),
            Err(Error::NotFound(_)) => Err("a manifest the snapshot lists is not there".to_string()),
            Err(e) => return Err(e),
        };
        if let Err(why) = &parsed {
            log::warn!("{place}: {why}; the chunks it holds read as EIO");
        }
        let held = parsed.as_ref().map_or(0, |m| m.size());
        self.manifests.insert(key, stamp, parsed.clone(), held);
        parsed.map_err(|why| damaged(place, why))
    }

    /// The array holding `key` and the key below its directory.
    fn array_of<'a, 'k>(&self, catalog: &'a Catalog, key: &'k str) -> Option<(&'a str, &'a Array, &'k str)> {
        let mut dir = key;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            dir = parent;
            if let Some((name, array)) = catalog.arrays.get_key_value(dir) {
                return Some((name, array, &key[dir.len() + 1..]));
            }
        }
        catalog.arrays.get("").filter(|_| !key.is_empty()).map(|array| ("", array, key))
    }

    /// The chunk keys of `array` (in directory `dir`), as a tree, listed from its manifests once.
    fn chunk_tree(&self, dir: &str, array: &Array) -> Result<Arc<KeyTree>> {
        if let Some(tree) = &*array.listed.lock() {
            return Ok(tree.clone());
        }
        let encoding = array.encoding.as_ref().map_err(|why| damaged(self.describe(dir), why.clone()))?;
        let mut keys = Vec::new();
        for (id, _) in &array.chunks.manifests {
            for coords in self.manifest(id)?.chunks(&array.chunks.node).map_err(|e| damaged(self.describe(dir), e.0))? {
                keys.push(encoding.encode(&coords.iter().map(|&c| u64::from(c)).collect::<Vec<_>>()));
            }
        }
        let tree = Arc::new(KeyTree::of(keys.iter().enumerate().map(|(n, k)| (n, k.as_str())), &self.describe(dir)));
        *array.listed.lock() = Some(tree.clone());
        Ok(tree)
    }

    /// What `key` is.
    fn node(&self, catalog: &Catalog, key: &str) -> Result<Node> {
        let key = key.trim_matches('/');
        if let Some(&n) = catalog.tree.files.get(key) {
            return Ok(Node::Document(catalog.documents[n].clone()));
        }
        if catalog.tree.dirs.contains_key(key) {
            return Ok(Node::Dir);
        }
        let Some((dir, array, below)) = self.array_of(catalog, key) else {
            return Err(Error::NotFound(self.describe(key)));
        };
        let encoding = array.encoding.as_ref().map_err(|why| damaged(self.describe(key), why.clone()))?;
        let rank = array.chunks.grid.len();
        let Some(coords) = encoding.decode(below, rank) else {
            // A directory of chunk keys, if any chunk is below it.
            let tree = self.chunk_tree(dir, array)?;
            return if tree.dirs.contains_key(below) {
                Ok(Node::Dir)
            } else {
                Err(Error::NotFound(self.describe(key)))
            };
        };
        let coords: Option<Vec<u32>> = coords.iter().map(|&c| u32::try_from(c).ok()).collect();
        let Some(coords) = coords.filter(|c| c.iter().zip(&array.chunks.grid).all(|(c, n)| c < n)) else {
            return Err(Error::NotFound(self.describe(key)));
        };
        for (id, extents) in &array.chunks.manifests {
            if !extents.contains(&coords) {
                continue;
            }
            let manifest = self.manifest(id)?;
            match manifest.payload(&array.chunks.node, &coords) {
                Ok(Some(payload)) => return Ok(Node::Chunk(payload)),
                Ok(None) => {}
                Err(e) => {
                    return Err(self.unreadable(key, format!("{}: {}", self.inner.describe(&manifest_key(id)), e.0)));
                }
            }
        }
        Err(Error::NotFound(self.describe(key)))
    }

    /// EIO for `key`, logged.
    fn unreadable(&self, key: &str, why: String) -> Error {
        let place = self.describe(key);
        log::warn!("{place}: {why}");
        damaged(place, why)
    }

    fn attr_in(&self, catalog: &Catalog, key: &str, node: &Node) -> Attr {
        let snapshot = catalog.attr;
        let file = |size: u64| snapshot.file_inside(size, key);
        match node {
            Node::Dir => snapshot.dir_inside(key),
            Node::Document(bytes) => file(bytes.len() as u64),
            Node::Chunk(Payload::Inline(bytes)) => file(bytes.len() as u64),
            Node::Chunk(Payload::Native { length, .. } | Payload::Virtual { length, .. }) => file(*length),
        }
    }

    /// The file a virtual chunk is read from, opened once it is authorized and still the version
    /// the repository recorded.
    fn virtual_file(&self, key: &str, url: &str, checksum: &Option<Checksum>) -> Result<Box<dyn Object>> {
        if url.starts_with("vcc://") {
            return Err(self.unreadable(
                key,
                format!("{url}: a location relative to a virtual chunk container, which shardfs does not resolve"),
            ));
        }
        if !self.allowed.iter().any(|prefix| url.starts_with(prefix.as_str())) {
            return Err(self.unreadable(key, format!("{url}: not authorized (mount with --allow-virtual PREFIX)")));
        }
        let (store, target_key) = self.targets.resolve(url).map_err(|why| self.unreadable(key, why))?;
        let file = store.open(&target_key).map_err(|e| match e {
            Error::NotFound(place) => self.unreadable(key, format!("{place}, its virtual file, is not there")),
            e => self.unreadable(key, e.to_string()),
        })?;
        match checksum {
            Some(Checksum::LastModified(recorded)) => {
                let modified = file.attr().mtime.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                if modified > u64::from(recorded.0) {
                    return Err(self.unreadable(key, format!("{url}: modified after the repository recorded it")));
                }
            }
            Some(Checksum::ETag(recorded)) => {
                let recorded = recorded.0.trim_matches('"');
                if file.e_tag().as_deref().map(|e| e.trim_matches('"')) != Some(recorded) {
                    return Err(self.unreadable(key, format!("{url}: its ETag is not the one the repository recorded")));
                }
            }
            None => {}
        }
        Ok(file)
    }
}

impl ReadOnlyStore for IcechunkStore {
    /// The repository, then the key: `s3://bucket/repo/temperature/c/0/1`.
    fn describe(&self, key: &str) -> String {
        self.inner.describe(key)
    }

    fn url(&self, key: &str) -> String {
        self.inner.url(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        let catalog = self.catalog()?;
        let node = self.node(&catalog, key)?;
        Ok(self.attr_in(&catalog, key, &node))
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let catalog = self.catalog()?;
        let dir = dir.trim_matches('/');
        let Node::Dir = self.node(&catalog, dir)? else { return Err(errno(self.describe(dir), libc::ENOTDIR)) };
        let mut names: BTreeMap<String, Kind> = catalog.tree.dirs.get(dir).cloned().unwrap_or_default();
        if let Some(array) = catalog.arrays.get(dir) {
            names.extend(self.chunk_tree(dir, array)?.dirs[""].clone());
        } else if let Some((array_dir, array, below)) = self.array_of(&catalog, dir) {
            names.extend(self.chunk_tree(array_dir, array)?.dirs.get(below).cloned().unwrap_or_default());
        }
        Ok((names.into_iter().collect(), catalog.attr.stamp.derived(dir)))
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let catalog = self.catalog()?;
        let node = self.node(&catalog, key)?;
        let attr = self.attr_in(&catalog, key, &node);
        let place = self.describe(key);
        let (file, offset, length, url) = match node {
            Node::Dir => return Err(errno(place, libc::EISDIR)),
            Node::Document(bytes) | Node::Chunk(Payload::Inline(bytes)) => {
                return Ok(Box::new(BytesObject { attr, bytes, place }));
            }
            // Chunk objects are named by ID and never change: no question of which version is
            // there, where asking costs a round trip.
            Node::Chunk(Payload::Native { key: object, offset, length }) => {
                let end = offset.checked_add(length).ok_or_else(|| self.unreadable(key, "a range past 2^64".into()))?;
                let file = self.inner.open_range(&object, offset..end).map_err(|e| match e {
                    Error::NotFound(at) => self.unreadable(key, format!("{at}, its chunk object, is not there")),
                    e => self.unreadable(key, e.to_string()),
                })?;
                return Ok(Box::new(RangeObject::new(attr, 0..length, file, place)));
            }
            Node::Chunk(Payload::Virtual { url, offset, length, checksum }) => {
                (self.virtual_file(key, &url, &checksum)?, offset, length, url)
            }
        };
        let size = file.attr().size;
        match offset.checked_add(length).filter(|&end| end <= size) {
            Some(end) => Ok(Box::new(RangeObject::new(attr, offset..end, file, place))),
            None => Err(self.unreadable(
                key,
                format!("its bytes from {offset} and {length} bytes on are past the end of {url} ({size} bytes)"),
            )),
        }
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    /// A native or virtual chunk is a range of its file; inline bytes and documents are nowhere
    /// else.
    fn location(&self, key: &str) -> Result<Location> {
        let catalog = self.catalog()?;
        match self.node(&catalog, key)? {
            Node::Chunk(Payload::Native { key: object, offset, .. }) => {
                Ok(Location::At { url: self.inner.url(&object), start: Some(offset) })
            }
            Node::Chunk(Payload::Virtual { url, offset, .. }) => Ok(Location::At { url, start: Some(offset) }),
            Node::Chunk(Payload::Inline(_)) | Node::Document(_) => Ok(Location::Inline),
            Node::Dir => Err(errno(self.describe(key), libc::EISDIR)),
        }
    }
}

impl IcechunkStore {
    /// Shows `version` from now on (a writable mount pins the snapshot its session is based on).
    pub fn show(&self, version: Version) {
        let mut last = self.last.lock();
        // The snapshot already read, now named by its ID: kept, not read again.
        if let (Version::Snapshot(id), Some((_, Ok(catalog)))) = (&version, &*last)
            && catalog.snapshot == *id
        {
            *last = Some((Stamp::computed(version.to_string()), Ok(catalog.clone())));
        }
        *self.version.write() = version;
    }

    /// The snapshot shown now.
    pub fn snapshot(&self) -> Result<String> {
        Ok(self.catalog()?.snapshot.clone())
    }
}
