//! View paths: what each one is ([`Node`]), its attributes, its listing and its content.
//!
//! Outside sharded arrays the view is the store. Inside a sharded array directory, `zarr.json`
//! is served rewritten, shard files are hidden, and the unsharded chunk keys appear: directories
//! for each `/`-separated key prefix that has a stored chunk below it, and one file per stored
//! inner chunk inside the array bounds.
//!
//! A [`Node`] in the chunk key space names its array ([`ArrayPath`]) and its place in the chunk
//! grid, nothing more: every operation binds it to the array as the array's document is now
//! ([`Namespace::array`]), so a resized or re-created array is never served with old geometry.

use std::collections::{BTreeMap, HashSet};
use std::ops::{ControlFlow, Range};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::array::{ArrayPath, ShardPlace, ShardedArray};
use super::consolidated::Consolidated;
use super::dir_guesses::DirGuesses;
use super::documents::{ArrayState, Documents, source_of};
use super::error::{Error, Result};
use super::index_cache::IndexCache;
use super::overlay::{Overlay, PendingChunk};
use super::plain_arrays::PlainArrays;
use super::presentation::Presentation;
use super::shards::{ChunkState, Purpose, Shards, Walk, shard_prefix, shards_on_disk};
use super::sources::Sources;
use crate::format::chunk_key::KeyStyle;
use crate::format::source::SourceFormat;
use crate::store::{Attr, Kind, Need, Object, PRIVATE_DIR, Space, Stamp, Store, join};

/// A directory's listing: the entries known at once, sorted by name, then, in a directory of
/// chunk files, the stored chunks, read shard by shard with [`Namespace::chunk_files`] as the
/// listing is read, so that a directory of millions of chunks is never held in memory.
#[derive(Debug)]
pub struct Listing {
    pub entries: Vec<(String, Kind)>,
    pub chunk_files: Option<ChunkFiles>,
}

/// The stored chunk files of one directory, to be read shard by shard.
#[derive(Debug)]
pub struct ChunkFiles {
    array: Arc<ShardedArray>,
    /// The directory, relative to the array.
    dir: String,
    prefix: Vec<u64>,
    /// The shards on disk holding chunks of the directory, in the order they are read.
    shards: Vec<Vec<u64>>,
    /// Chunks with a pending write (listed with the entries) or deletion (not listed).
    pending: HashSet<Vec<u64>>,
}

/// Where reading [`ChunkFiles`] resumes: the shard's position, and how many of its chunks were
/// passed already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkCursor {
    pub shard: usize,
    pub skip: u64,
}

/// The size the view shows for a stored inner chunk of `nbytes` bytes of `array`: less its crc32c
/// when the presentation strips it (`None` when it is too short to have one).
fn shown_size(array: &ShardedArray, nbytes: u64) -> Option<u64> {
    if array.strip_crc32c { nbytes.checked_sub(4) } else { Some(nbytes) }
}

/// The bytes `range` of `file`, inner chunk `chunk` of it, without their trailing crc32c, once
/// that matches the rest.
fn checked_chunk(file: &dyn Object, range: &Range<u64>, chunk: &str) -> Result<Vec<u8>> {
    let mut bytes = file.read_exact_at(range.start, range.end - range.start)?;
    match crc32c_checked(&bytes).map(<[u8]>::len) {
        Some(len) => {
            bytes.truncate(len);
            Ok(bytes)
        }
        None => {
            let place = format!("{}: chunk {chunk}", file.place());
            log::warn!("{place}: crc32c mismatch; read as EIO");
            Err(Error::Damaged(format!("{place}: crc32c mismatch")))
        }
    }
}

/// `chunk` without its trailing crc32c, if that matches the rest.
fn crc32c_checked(chunk: &[u8]) -> Option<&[u8]> {
    let (data, crc) = chunk.split_at_checked(chunk.len().checked_sub(4)?)?;
    (crc32c::crc32c(data).to_le_bytes() == crc).then_some(data)
}

/// How long the lookup of a chunk directory waits for its exact answer (see
/// [`Namespace::dir_exists`]).
const DIR_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// True when a chunk below `prefix` of `array` is shown: pending or stored (the walk stops at the
/// first).
fn any_visible_chunk(
    store: &dyn Store,
    shards: &Shards,
    overlay: &dyn Overlay,
    array: &ShardedArray,
    prefix: &[u64],
    sources: &Sources,
) -> Result<bool> {
    let pending = overlay.chunks_under(array, prefix);
    if pending.iter().any(|(_, state)| matches!(state, PendingChunk::Written(_))) {
        return Ok(true);
    }
    let mut found = false;
    shards.for_each_chunk(store, array, prefix, sources, Walk::First, &mut |coords, _| {
        if pending.iter().any(|(c, _)| c == coords) {
            return ControlFlow::Continue(());
        }
        found = true;
        ControlFlow::Break(())
    })?;
    Ok(found)
}

/// The entry of directory `dir` (relative to the array) that leads to `path`, and whether
/// `path` goes deeper than that entry.
fn entry_towards(dir: &str, path: &str) -> Option<(String, bool)> {
    let rest = if dir.is_empty() { path } else { path.strip_prefix(dir)?.strip_prefix('/')? };
    Some(match rest.split_once('/') {
        Some((first, _)) => (first.to_string(), true),
        None => (rest.to_string(), false),
    })
}

/// One entry of the view.
#[derive(Debug, Clone)]
pub enum Node {
    /// A store entry shown as it is, at this store key (`""`: the root).
    Stored(String),
    /// A metadata document of the view, at this view path, rendered from the stored document
    /// the presentation names for it ([`Presentation::document_at`]).
    Document(String),
    /// A directory of chunk keys (`c`, `c/1`), `dir` relative to the array, fixing `prefix`.
    ChunkDir { array: ArrayPath, dir: String, prefix: Vec<u64> },
    /// A stored inner chunk.
    Chunk { array: ArrayPath, coords: Vec<u64> },
    /// The file at the root consolidating every metadata file of the view, at this name
    /// ([`Presentation::consolidated_name`]).
    Consolidated(&'static str),
}

impl Node {
    /// The node's path in the view, relative to the mount point.
    pub fn path(&self) -> String {
        match self {
            Node::Stored(key) | Node::Document(key) => key.clone(),
            Node::Consolidated(name) => name.to_string(),
            Node::ChunkDir { array, dir, .. } => join(&array.dir, dir),
            Node::Chunk { array, coords } => join(&array.dir, &array.encoding.encode(coords)),
        }
    }

    /// The same node after directory `from` (a view path above it) was renamed to `to`.
    pub fn moved(&self, from: &str, to: &str) -> Node {
        let re_rooted = |path: &str| match path.strip_prefix(from) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{to}{rest}"),
            _ => path.to_string(),
        };
        match self {
            Node::Stored(key) => Node::Stored(re_rooted(key)),
            Node::Document(path) => Node::Document(re_rooted(path)),
            Node::Consolidated(name) => Node::Consolidated(name),
            Node::ChunkDir { array, dir, prefix } => Node::ChunkDir {
                array: ArrayPath { dir: re_rooted(&array.dir).into(), encoding: array.encoding },
                dir: dir.clone(),
                prefix: prefix.clone(),
            },
            Node::Chunk { array, coords } => Node::Chunk {
                array: ArrayPath { dir: re_rooted(&array.dir).into(), encoding: array.encoding },
                coords: coords.clone(),
            },
        }
    }

    /// The node of the chunk at `coords` of `array`.
    pub fn chunk(array: &ShardedArray, coords: Vec<u64>) -> Node {
        Node::Chunk { array: array.path(), coords }
    }
}

/// One inner chunk met by [`Namespace::for_each_chunk_by_shard`].
#[derive(Debug)]
pub struct ChunkInShard<'a> {
    /// The store key of its shard.
    pub shard: &'a str,
    /// The attributes of the shard version read; `None` when it could not be read (its chunks
    /// are then all [`ChunkState::Damaged`]).
    pub shard_attr: Option<&'a Attr>,
    pub coords: &'a [u64],
    pub state: ChunkState,
}

/// What the view says of one entry: its attributes, and the store files they were read from with
/// the version of each (the entry is out of date once one of them changes).
#[derive(Debug, Clone)]
pub struct Answer {
    pub attr: Attr,
    pub sources: Vec<(String, Option<Stamp>)>,
    /// The version of the store file a file's bytes are read from (its shard's, for a chunk), or
    /// of the build of a file computed from many (the consolidated metadata); `None` for bytes
    /// this process holds (a pending chunk) and for directories.
    pub content: Option<Stamp>,
    /// For an entry of an array's chunk key space, the array's document and the version its
    /// geometry was taken from: the entry is out of date when the document changes in any way
    /// but growing the array.
    pub geometry: Option<(String, Stamp)>,
    /// For a stored chunk, where it lies in its shard.
    pub place: Option<ShardPlace>,
}

impl Answer {
    fn of_file(key: &str, attr: Attr) -> Self {
        let content = (attr.kind != Kind::Dir).then_some(attr.stamp);
        Answer { attr, sources: vec![(key.to_string(), Some(attr.stamp))], content, geometry: None, place: None }
    }

    /// An answer about `array`'s chunk key space: its document is a source too.
    fn in_array(array: &ShardedArray, attr: Attr, first: (String, Option<Stamp>), content: Option<Stamp>) -> Self {
        Answer { attr, sources: vec![first], content, geometry: array.document.clone(), place: None }
    }

    /// [`Answer::in_array`] for the stored chunk at `coords`, of shard version `stamp`.
    fn of_chunk(array: &ShardedArray, coords: &[u64], attr: Attr, shard: String, stamp: Stamp) -> Self {
        Answer { place: array.place_of(coords), ..Answer::in_array(array, attr, (shard, Some(stamp)), Some(stamp)) }
    }
}

/// What an open view file reads from.
#[derive(Debug)]
pub enum Content {
    /// A store file shown as it is.
    Stored(Box<dyn Object>),
    /// Bytes computed by the view (a rewritten document, from this version of its store file; the
    /// consolidated metadata, of this build) or held by it (a pending chunk: no version).
    Bytes(Arc<[u8]>, Option<Stamp>),
    /// One inner chunk: a byte range of a shard file.
    Chunk(Box<dyn Object>, Range<u64>),
    /// One inner chunk that ends in a crc32c: a byte range of a shard file, read whole and checked
    /// at its first read, then served without its checksum. Not at the open: a read-only mount
    /// opens what it looks up, and a walk that only stats files must not fetch their bytes.
    /// A mismatch is kept too (its message), so that it costs one read and one log line.
    Checked {
        file: Box<dyn Object>,
        range: Range<u64>,
        chunk: String,
        bytes: OnceLock<std::result::Result<Vec<u8>, String>>,
    },
}

impl Content {
    /// The version of the store file the bytes come from, as [`Answer::content`] says it.
    pub fn version(&self) -> Option<Stamp> {
        match self {
            Content::Stored(file) | Content::Chunk(file, _) | Content::Checked { file, .. } => Some(file.attr().stamp),
            Content::Bytes(_, stamp) => *stamp,
        }
    }

    /// Up to `size` bytes from `offset`; fewer only at the end of the content.
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>> {
        let in_memory = |bytes: &[u8]| {
            let start = (offset as usize).min(bytes.len());
            let end = start.saturating_add(size as usize).min(bytes.len());
            bytes[start..end].to_vec()
        };
        let (file, start, end) = match self {
            Content::Bytes(bytes, _) => return Ok(in_memory(bytes)),
            Content::Checked { file, range, chunk, bytes } => {
                if bytes.get().is_none() {
                    // Other failures are not kept: a later read tries again (a version replaced
                    // meanwhile is the caller's to handle, as for any read).
                    let _ = bytes.set(match checked_chunk(&**file, range, chunk) {
                        Ok(checked) => Ok(checked),
                        Err(Error::Damaged(why)) => Err(why),
                        Err(e) => return Err(e),
                    });
                }
                return match bytes.get().expect("set above") {
                    Ok(checked) => Ok(in_memory(checked)),
                    Err(why) => Err(Error::Damaged(why.clone())),
                };
            }
            Content::Stored(file) => (file, offset, offset.saturating_add(size as u64)),
            Content::Chunk(file, range) => {
                let start = range.start.saturating_add(offset).min(range.end);
                (file, start, start.saturating_add(size as u64).min(range.end))
            }
        };
        let mut buf = vec![0; (end - start) as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], start + filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        if filled < buf.len() && matches!(self, Content::Chunk(..)) {
            return Err(Error::Damaged(format!("{}: shard is shorter than its index says", file.place())));
        }
        buf.truncate(filled);
        Ok(buf)
    }
}

/// The view of one store.
#[derive(Debug)]
pub struct Namespace {
    store: Arc<dyn Store>,
    documents: Documents,
    shards: Arc<Shards>,
    plain_arrays: PlainArrays,
    overlay: Arc<dyn Overlay>,
    consolidated: Consolidated,
    dir_guesses: DirGuesses,
}

impl Namespace {
    /// The view of `store`, showing the pending writes of `overlay`.
    pub fn new(
        store: Arc<dyn Store>,
        presentation: Arc<dyn Presentation>,
        cache: IndexCache,
        overlay: Arc<dyn Overlay>,
    ) -> Self {
        let documents = Documents::new(source_of(&*store), presentation, cache.max_index_bytes());
        Namespace {
            store,
            documents,
            shards: Arc::new(Shards::new(cache)),
            plain_arrays: PlainArrays::default(),
            overlay,
            consolidated: Consolidated::default(),
            dir_guesses: DirGuesses::default(),
        }
    }

    /// Where the store keeps its metadata documents.
    pub fn source(&self) -> &dyn SourceFormat {
        self.documents.source()
    }

    /// What the view shows.
    pub fn presentation(&self) -> &dyn Presentation {
        self.documents.presentation()
    }

    /// True when the document at `key` changed from version `from` only by growing its array
    /// (same chunks, no dimension smaller): every chunk and chunk-key directory of the array is
    /// still what it was; only listings may have more in them.
    pub fn document_grew(&self, key: &str, from: Stamp) -> bool {
        self.store.attr(key).is_ok_and(|attr| self.documents.grew(&*self.store, key, from, &attr))
    }

    /// The stored document the view file at `path` is rendered from, if it is a metadata
    /// document of the view.
    pub fn document_at(&self, path: &str) -> Option<String> {
        self.presentation().document_at(self.source(), path)
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Remembers the outermost index of the shard at `key` as a commit of this mount wrote it
    /// (version `stamp`, `len` bytes long).
    pub fn remember_index(
        &self,
        key: &str,
        len: u64,
        stamp: Stamp,
        index: Arc<crate::format::shard_index::ShardIndex>,
    ) {
        self.shards.remember_index(key, len, stamp, index);
    }

    /// The sharded array whose directory is the store key `dir`, if the view shows one there, as
    /// its document is now.
    pub fn array_at(&self, dir: &str) -> Result<Option<Arc<ShardedArray>>> {
        self.documents.array_at(&*self.store, dir)
    }

    /// What the document of the array whose directory is `dir` says now.
    pub fn array_state(&self, dir: &str) -> Result<ArrayState> {
        self.documents.state_at(&*self.store, dir)
    }

    /// The array a node names, as its document is now; NotFound when there is none any more, or
    /// one whose chunk keys are spelled otherwise, so that the node's name means nothing there.
    pub fn array(&self, at: &ArrayPath) -> Result<Arc<ShardedArray>> {
        self.array_at(&at.dir)?.filter(|array| array.view_keys == at.encoding).ok_or(Error::NotFound)
    }

    /// The array the chunk at `coords` is in; NotFound when it is outside the array as it is now
    /// (or of another rank).
    pub fn array_of_chunk(&self, at: &ArrayPath, coords: &[u64]) -> Result<Arc<ShardedArray>> {
        let array = self.array(at)?;
        if coords.len() != array.rank() || !array.in_bounds(coords) {
            return Err(Error::NotFound);
        }
        Ok(array)
    }

    /// The array the chunk-key directory fixing `prefix` is in; NotFound when the directory is
    /// outside the array as it is now (or could not be one at its rank).
    fn array_of_dir(&self, at: &ArrayPath, prefix: &[u64]) -> Result<Arc<ShardedArray>> {
        let array = self.array(at)?;
        if prefix.len() >= array.rank() || !array.in_bounds(prefix) {
            return Err(Error::NotFound);
        }
        Ok(array)
    }

    /// Calls `visit` with every stored chunk of `array` (inside its bounds), from indexes alone.
    pub fn for_each_stored_chunk(
        &self,
        array: &ShardedArray,
        visit: &mut dyn FnMut(&[u64]) -> ControlFlow<()>,
    ) -> Result<()> {
        self.shards
            .for_each_chunk(&*self.store, array, &[], &Sources::default(), Walk::Every, &mut |coords, _| visit(coords))
    }

    /// Calls `visit` with every stored or damaged inner chunk of `array` inside its bounds, shard
    /// by shard in shard order. Every index of a shard is taken from one version of it, so a
    /// chunk's range is valid for that version. Pending writes are not shown.
    pub fn for_each_chunk_by_shard(
        &self,
        array: &ShardedArray,
        mut visit: impl FnMut(ChunkInShard) -> ControlFlow<()>,
    ) -> Result<()> {
        let sources = Sources::default();
        let mut shards = shards_on_disk(&*self.store, array, &[], &sources)?;
        shards.sort();
        for shard in shards {
            let key = array.shard_key(&shard);
            let walked = self.shards.for_each_chunk_of(
                &*self.store,
                array,
                &shard,
                &[],
                &sources,
                false,
                |coords, state, attr| visit(ChunkInShard { shard: &key, shard_attr: attr, coords, state }),
            );
            if walked.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// The root directory of the view.
    pub fn root(&self) -> Node {
        Node::Stored(String::new())
    }

    /// The entry `name` of directory `parent`, with what the view says of it.
    pub fn child(&self, parent: &Node, name: &str) -> Result<(Node, Answer)> {
        let (node, answer) = self.entry(parent, name)?;
        Ok((node, answer?))
    }

    /// The entry `name` of directory `parent`, and what the view says of it or why that cannot be
    /// had: a chunk of a damaged shard is still an entry of its directory, one that cannot be read.
    pub fn entry(&self, parent: &Node, name: &str) -> Result<(Node, Result<Answer>)> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::NotFound);
        }
        match parent {
            Node::Stored(dir) => {
                if let Some(consolidated) = self.consolidated_at(dir).filter(|c| *c == name) {
                    let node = Node::Consolidated(consolidated);
                    let answer = self.answer(&node)?;
                    return Ok((node, Ok(answer)));
                }
                if (dir.is_empty() && name == PRIVATE_DIR) || self.presentation().hides(name) {
                    return Err(Error::NotFound);
                }
                if let Some(array) = self.documents.array_at(&*self.store, dir)? {
                    if let Some(found) = self.virtual_child(&array, "", name)? {
                        return Ok(found);
                    }
                    if array.is_shard_name(name) {
                        return Err(Error::NotFound);
                    }
                }
                let node = self.backing_node(join(dir, name))?;
                let answer = self.answer(&node)?;
                Ok((node, Ok(answer)))
            }
            Node::ChunkDir { array, dir, prefix } => {
                let array = self.array_of_dir(array, prefix)?;
                match self.virtual_child(&array, dir, name)? {
                    Some(found) => Ok(found),
                    None => {
                        let scratch = Node::Stored(array.scratch_key(&join(dir, name)));
                        let answer = self.answer(&scratch)?;
                        Ok((scratch, Ok(answer)))
                    }
                }
            }
            Node::Document(_) | Node::Chunk { .. } | Node::Consolidated(_) => Err(Error::NotADirectory),
        }
    }

    /// The name of the consolidated metadata file in directory `dir`: only at the root, and only
    /// when the root has a document to start from.
    pub fn consolidated_at(&self, dir: &str) -> Option<&'static str> {
        let name = self.presentation().consolidated_name()?;
        let root = self.source().document_key("")?;
        (dir.is_empty() && self.store.attr(&root).is_ok_and(|a| a.kind == Kind::File)).then_some(name)
    }

    fn backing_node(&self, path: String) -> Result<Node> {
        if let Some(key) = self.document_at(&path)
            && self.store.attr(&key)?.kind == Kind::File
        {
            return Ok(Node::Document(path));
        }
        Ok(Node::Stored(path))
    }

    fn virtual_child(&self, array: &ShardedArray, dir: &str, name: &str) -> Result<Option<(Node, Result<Answer>)>> {
        let rel = join(dir, name);
        let enc = &array.view_keys;
        if let Some(coords) = enc.decode(&rel, array.rank()) {
            if !array.in_bounds(&coords) {
                return Ok(None);
            }
            return match self.chunk_answer(array, &coords) {
                Err(Error::NotFound) => Ok(None),
                answer => Ok(Some((Node::chunk(array, coords), answer))),
            };
        }
        match enc.decode_dir(&rel, array.rank()) {
            Some(prefix) if array.in_bounds(&prefix) && self.dir_exists(array, &rel, &prefix)? => {
                let answer = self.chunk_dir_answer(array);
                Ok(Some((Node::ChunkDir { array: array.path(), dir: rel, prefix }, answer)))
            }
            _ => Ok(None),
        }
    }

    /// True when the chunk-key directory `dir` fixing `prefix` has a chunk below it or was made
    /// through the view.
    ///
    /// The exact answer reads the indexes of the shards below, one after another; when it has not
    /// come within [`DIR_GRACE`] (a shard's request stalled), a shard file below is taken for a
    /// chunk, so that a slow shard holds up no lookup through the directory (the kernel makes
    /// every other lookup of the same name wait for this one). The exact walk goes on by itself.
    fn dir_exists(&self, array: &ShardedArray, dir: &str, prefix: &[u64]) -> Result<bool> {
        let below = format!("{dir}/");
        let path = join(&array.dir, dir);
        if self.dir_guesses.holds(&path) || self.overlay.dirs(array).iter().any(|d| d == dir || d.starts_with(&below)) {
            return Ok(true);
        }
        let (store, shards, overlay) = (self.store.clone(), self.shards.clone(), self.overlay.clone());
        let (owned, owned_prefix) = (Arc::new(array.clone()), prefix.to_vec());
        let (sender, answer) = std::sync::mpsc::channel();
        let walk = move || {
            let found = any_visible_chunk(&*store, &shards, &*overlay, &owned, &owned_prefix, &Sources::default());
            let _ = sender.send(found);
        };
        if std::thread::Builder::new().name("shardfs-dir".into()).spawn(walk).is_err() {
            return self.any_chunk(array, prefix, &Sources::default());
        }
        match answer.recv_timeout(DIR_GRACE) {
            Ok(found) => found,
            Err(_) => {
                let shards = shards_on_disk(&*self.store, array, &shard_prefix(array, prefix), &Sources::default())?;
                if !shards.is_empty() {
                    self.dir_guesses.keep(&path);
                }
                Ok(!shards.is_empty())
            }
        }
    }

    /// Forgets that the chunk directory `dir` of `array` was taken to be there: it was removed.
    pub fn forget_dir_guess(&self, array: &ShardedArray, dir: &str) {
        self.dir_guesses.forget(&join(&array.dir, dir));
    }

    fn any_chunk(&self, array: &ShardedArray, prefix: &[u64], sources: &Sources) -> Result<bool> {
        any_visible_chunk(&*self.store, &self.shards, &*self.overlay, array, prefix, sources)
    }

    /// Every chunk the view shows under `prefix`: pending writes first, then stored chunks that
    /// no pending write replaces or deletes.
    fn for_each_visible_chunk(
        &self,
        array: &ShardedArray,
        prefix: &[u64],
        sources: &Sources,
        walk: Walk,
        visit: &mut dyn FnMut(&[u64]) -> ControlFlow<()>,
    ) -> Result<()> {
        let pending = self.overlay.chunks_under(array, prefix);
        for (coords, state) in &pending {
            if matches!(state, PendingChunk::Written(_)) && visit(coords).is_break() {
                return Ok(());
            }
        }
        self.shards.for_each_chunk(&*self.store, array, prefix, sources, walk, &mut |coords, _| {
            if pending.iter().any(|(c, _)| c == coords) { ControlFlow::Continue(()) } else { visit(coords) }
        })
    }

    /// The attributes the view shows for `node`.
    pub fn attr(&self, node: &Node) -> Result<Attr> {
        self.answer(node).map(|answer| answer.attr)
    }

    /// What the view says of `node`: its attributes and where they were read from.
    pub fn answer(&self, node: &Node) -> Result<Answer> {
        match node {
            Node::Stored(key) => {
                let attr = self.store.attr(key)?;
                let mut answer = Answer::of_file(key, attr);
                answer.sources.extend(self.governing_documents(key));
                Ok(answer)
            }
            Node::Document(path) => {
                let key = self.document_at(path).ok_or(Error::NotFound)?;
                let attr = self.store.attr(&key)?;
                let doc = self.documents.get(&*self.store, &key, &attr)?;
                let served = doc.served(path, &key, self.presentation()).ok_or(Error::NotFound)?;
                let size = served.map_or(attr.size, |content| content.len() as u64);
                Ok(Answer::of_file(&key, Attr { size, ..attr }))
            }
            Node::ChunkDir { array, prefix, .. } => self.chunk_dir_answer(&*self.array_of_dir(array, prefix)?),
            Node::Chunk { array, coords } => self.chunk_answer(&*self.array_of_chunk(array, coords)?, coords),
            Node::Consolidated(_) => {
                let root = self.source().document_key("").ok_or(Error::NotFound)?;
                let attr = self.store.attr(&root)?;
                let built = self.consolidated.get(&*self.store, &self.documents)?;
                let attr = Attr { size: built.bytes.len() as u64, ..attr };
                Ok(Answer {
                    attr,
                    sources: built.sources.clone(),
                    content: Some(built.stamp),
                    geometry: None,
                    place: None,
                })
            }
        }
    }

    /// The documents that decide what the store entry at `key` is in the view, with their
    /// versions: the array document each directory above it would have, nearest first, up to the
    /// first one that exists. Were one of them to change (an array made sharded, or a directory
    /// made an array), the entry could become a chunk, or be hidden as a shard.
    fn governing_documents(&self, key: &str) -> Vec<(String, Option<Stamp>)> {
        let mut found = Vec::new();
        let mut dir = key;
        while !dir.is_empty() {
            dir = crate::store::parent_key(dir);
            let Some(document) = self.source().document_key(dir) else { continue };
            let stamp = self.store.attr(&document).ok().map(|a| a.stamp);
            found.push((document, stamp));
            if stamp.is_some() {
                break;
            }
        }
        found
    }

    fn chunk_dir_answer(&self, array: &ShardedArray) -> Result<Answer> {
        let attr = self.store.attr(&array.dir)?;
        let first = (array.dir.to_string(), Some(attr.stamp));
        Ok(Answer::in_array(array, Attr { kind: Kind::Dir, nlink: 2, ..attr }, first, None))
    }

    fn chunk_answer(&self, array: &ShardedArray, coords: &[u64]) -> Result<Answer> {
        let shard = array.shard_key(&array.meta.sharding.locate(coords).shard);
        match self.overlay.chunk(array, coords) {
            Some(PendingChunk::Written(buffer)) => {
                let dir = self.store.attr(&array.dir)?;
                let now = std::time::SystemTime::now();
                let size = buffer.read().len() as u64;
                let attr = Attr { kind: Kind::File, size, perm: 0o644, nlink: 1, mtime: now, ctime: now, ..dir };
                // A pending chunk's attributes are not its shard's: what counts is the shard
                // version a commit will change.
                let stamp = self.store.attr(&shard).ok().map(|a| a.stamp);
                Ok(Answer::in_array(array, attr, (shard, stamp), None))
            }
            Some(PendingChunk::Deleted) => Err(Error::NotFound),
            None => {
                let found = self.shards.locate(&*self.store, array, coords, Purpose::Stat)?.ok_or(Error::NotFound)?;
                let size = shown_size(array, found.range.end - found.range.start).ok_or_else(|| {
                    Error::Damaged(format!("{}: chunk {} too short for its crc32c", shard, array.chunk_key(coords)))
                })?;
                let attr = Attr { size, nlink: 1, ..found.shard };
                Ok(Answer::of_chunk(array, coords, attr, shard, found.shard.stamp))
            }
        }
    }

    /// Every name and kind in directory `node`: [`Namespace::list_from`] with its chunk files.
    pub fn list(&self, node: &Node) -> Result<Vec<(String, Kind)>> {
        let sources = Sources::default();
        let listing = self.list_from(node, &sources)?;
        let mut entries = listing.entries;
        if let Some(files) = &listing.chunk_files {
            self.chunk_files(files, ChunkCursor::default(), &sources, |name, _, _, _| {
                entries.push((name.to_string(), Kind::File));
                ControlFlow::Continue(())
            });
        }
        Ok(entries)
    }

    /// The listing of directory `node`, recording in `sources` every store file it was read from:
    /// it is out of date once one of them changes (and so are the chunk files read later).
    pub fn list_from(&self, node: &Node, sources: &Sources) -> Result<Listing> {
        let document = |array: &ShardedArray| {
            if let Some((key, stamp)) = &array.document {
                sources.record(key, Some(*stamp));
            }
        };
        match node {
            Node::Stored(dir) => {
                let (mut entries, stamp) = self.store.list(dir)?;
                sources.record(dir, Some(stamp));
                entries.retain(|(name, _)| !(self.presentation().hides(name) || dir.is_empty() && name == PRIVATE_DIR));
                self.add_rendered_files(dir, &mut entries, sources)?;
                if let Some(name) = self.consolidated_at(dir) {
                    entries.push((name.to_string(), Kind::File));
                }
                let mut chunk_files = None;
                if let Some(array) = self.documents.array_at(&*self.store, dir)? {
                    document(&array);
                    entries.retain(|(name, _)| !array.is_shard_name(name));
                    let listing = self.virtual_list(&array, "", &[], sources)?;
                    entries.extend(listing.entries);
                    chunk_files = listing.chunk_files;
                }
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(Listing { entries, chunk_files })
            }
            Node::ChunkDir { array, dir, prefix } => {
                let array = self.array_of_dir(array, prefix)?;
                document(&array);
                self.virtual_list(&array, dir, prefix, sources)
            }
            Node::Document(_) | Node::Chunk { .. } | Node::Consolidated(_) => Err(Error::NotADirectory),
        }
    }

    /// Adds to the entries of directory `dir` the metadata files the presentation renders from
    /// the document there that are not stored under their own names (a Zarr v2 view's
    /// `.zarray`).
    fn add_rendered_files(&self, dir: &str, entries: &mut Vec<(String, Kind)>, sources: &Sources) -> Result<()> {
        let Some(key) = self.source().document_key(dir).filter(|key| crate::store::parent_key(key) == dir) else {
            return Ok(());
        };
        let attr = match self.store.attr(&key) {
            Ok(attr) if attr.kind == Kind::File => attr,
            Ok(_) | Err(crate::store::Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        sources.record(&key, Some(attr.stamp));
        for (name, _) in &self.documents.get(&*self.store, &key, &attr)?.files {
            if !entries.iter().any(|(stored, _)| stored == name) {
                entries.push((name.clone(), Kind::File));
            }
        }
        Ok(())
    }

    fn virtual_list(&self, array: &Arc<ShardedArray>, dir: &str, prefix: &[u64], sources: &Sources) -> Result<Listing> {
        let mut names = BTreeMap::new();
        for made in self.overlay.dirs(array) {
            if let Some((name, _)) = entry_towards(dir, &made) {
                names.insert(name, Kind::Dir);
            }
        }
        let enc = &array.view_keys;
        let top_of_c = dir.is_empty() && enc.style == KeyStyle::Default && enc.separator == '/';
        let mut chunk_files = None;
        if top_of_c && array.rank() > 0 {
            // Every key starts with "c/": one chunk anywhere is enough to show the directory.
            if self.any_chunk(array, prefix, sources)? {
                names.insert("c".to_string(), Kind::Dir);
            }
        } else if array.rank() > 0 && !top_of_c && (enc.separator != '/' || prefix.len() + 1 == array.rank()) {
            // Every chunk here is a file of this directory: pending ones are listed now, stored ones
            // read shard by shard as the listing is read.
            let pending = self.overlay.chunks_under(array, prefix);
            for (coords, state) in &pending {
                if matches!(state, PendingChunk::Written(_))
                    && let Some((name, _)) = entry_towards(dir, &array.chunk_key(coords))
                {
                    names.insert(name, Kind::File);
                }
            }
            let mut shards = shards_on_disk(&*self.store, array, &shard_prefix(array, prefix), sources)?;
            shards.sort();
            chunk_files = Some(ChunkFiles {
                array: array.clone(),
                dir: dir.to_string(),
                prefix: prefix.to_vec(),
                shards,
                pending: pending.into_iter().map(|(coords, _)| coords).collect(),
            });
        } else {
            self.for_each_visible_chunk(array, prefix, sources, Walk::Every, &mut |coords| {
                if let Some((name, deeper)) = entry_towards(dir, &array.chunk_key(coords)) {
                    names.insert(name, if deeper { Kind::Dir } else { Kind::File });
                }
                ControlFlow::Continue(())
            })?;
        }
        Ok(Listing { entries: names.into_iter().collect(), chunk_files })
    }

    /// Passes the stored chunk files of a listing to `visit`, from `from` on, shard by shard in
    /// index order: each one's name, node, answer (or why there is none) and the cursor just
    /// after it. Every shard read is recorded in `sources`. Stops where `visit` says.
    pub fn chunk_files(
        &self,
        files: &ChunkFiles,
        from: ChunkCursor,
        sources: &Sources,
        mut visit: impl FnMut(&str, Node, Result<Answer>, ChunkCursor) -> ControlFlow<()>,
    ) {
        let array = &files.array;
        for (position, shard) in files.shards.iter().enumerate().skip(from.shard) {
            self.shards.walk_at(&*self.store, array, &files.shards, position, position == from.shard);
            let skip = if position == from.shard { from.skip } else { 0 };
            let mut passed = 0;
            let walked = self.shards.for_each_chunk_of(
                &*self.store,
                array,
                shard,
                &files.prefix,
                sources,
                true,
                |coords: &[u64], state, shard_attr: Option<&Attr>| {
                    passed += 1;
                    if passed <= skip || files.pending.contains(coords) {
                        return ControlFlow::Continue(());
                    }
                    let Some((name, _)) = entry_towards(&files.dir, &array.chunk_key(coords)) else {
                        return ControlFlow::Continue(());
                    };
                    let answer = match (state, shard_attr) {
                        (ChunkState::Stored(range), Some(shard_attr))
                            if shown_size(array, range.end - range.start).is_some() =>
                        {
                            let size = shown_size(array, range.end - range.start).unwrap_or_default();
                            let attr = Attr { size, nlink: 1, ..*shard_attr };
                            Ok(Answer::of_chunk(array, coords, attr, array.shard_key(shard), shard_attr.stamp))
                        }
                        _ => Err(Error::Damaged(format!("{}: chunk of a damaged shard", array.shard_key(shard)))),
                    };
                    let node = Node::chunk(array, coords.to_vec());
                    visit(&name, node, answer, ChunkCursor { shard: position, skip: passed })
                },
            );
            if walked.is_break() {
                return;
            }
        }
    }

    /// Opens `node` for a reader.
    pub fn open(&self, node: &Node) -> Result<Content> {
        self.open_for(node, Purpose::Read)
    }

    /// Opens `node` for a writer to read what it is about to change: as [`Namespace::open`],
    /// but a chunk's shards ahead are not fetched for it ([`Purpose::Rewrite`]).
    pub fn open_to_rewrite(&self, node: &Node) -> Result<Content> {
        self.open_for(node, Purpose::Rewrite)
    }

    /// Opens `node` at a read-only mount's lookup, for the reads that may follow: as
    /// [`Namespace::open`], but the reader is followed only once it reads
    /// ([`Namespace::reader_at`], [`Purpose::Held`]).
    pub fn open_held(&self, node: &Node) -> Result<Content> {
        self.open_for(node, Purpose::Held)
    }

    /// Takes note that a reader is at `node`, a chunk file: once its reads go on in order through
    /// an array (or scatter over a small one), the files ahead are asked for ([`super::read_ahead::ReadAhead`]).
    pub fn reader_at(&self, node: &Node) {
        match node {
            Node::Stored(key) => {
                if let Some((array, coords)) = self.plain_arrays.chunk_of(&*self.store, key) {
                    self.shards.read_ahead().reached_plain(&*self.store, &array, &coords);
                }
            }
            Node::Chunk { array, coords } => {
                if let Ok(array) = self.array_of_chunk(array, coords) {
                    self.shards.read_ahead().reached(&*self.store, &array, coords);
                }
            }
            _ => {}
        }
    }

    fn open_for(&self, node: &Node, purpose: Purpose) -> Result<Content> {
        match node {
            Node::Stored(key) => {
                if purpose == Purpose::Read {
                    self.reader_at(node);
                }
                Ok(Content::Stored(self.store.open(key)?))
            }
            Node::Document(path) => {
                let key = self.document_at(path).ok_or(Error::NotFound)?;
                let file = self.store.open(&key)?;
                let doc = self.documents.get(&*self.store, &key, file.attr())?;
                match doc.served(path, &key, self.presentation()).ok_or(Error::NotFound)? {
                    Some(content) => Ok(Content::Bytes(content, Some(file.attr().stamp))),
                    None => Ok(Content::Stored(file)),
                }
            }
            Node::ChunkDir { .. } => Err(Error::IsADirectory),
            Node::Consolidated(_) => {
                let built = self.consolidated.get(&*self.store, &self.documents)?;
                Ok(Content::Bytes(built.bytes.clone(), Some(built.stamp)))
            }
            Node::Chunk { array, coords } => {
                let array = &self.array_of_chunk(array, coords)?;
                match self.overlay.chunk(array, coords) {
                    Some(PendingChunk::Written(buffer)) => {
                        return Ok(Content::Bytes(buffer.read().as_slice().into(), None));
                    }
                    Some(PendingChunk::Deleted) => return Err(Error::NotFound),
                    None => {}
                }
                if purpose == Purpose::Read {
                    self.shards.read_ahead().reached(&*self.store, array, coords);
                }
                let found = self.shards.locate(&*self.store, array, coords, purpose)?.ok_or(Error::NotFound)?;
                let file = found.file.expect("opened on request");
                if !array.strip_crc32c {
                    // A chunk file is read whole, as a rule: an object store fetches it at once,
                    // whatever pieces the reader then asks for; a writer's, and nothing after it.
                    let need = if purpose == Purpose::Rewrite { Need::Alone } else { Need::InOrder };
                    file.will_need(found.range.clone(), need);
                    return Ok(Content::Chunk(file, found.range));
                }
                Ok(Content::Checked {
                    file,
                    range: found.range,
                    chunk: array.chunk_key(coords),
                    bytes: OnceLock::new(),
                })
            }
        }
    }

    /// The target of a symbolic link, as stored.
    pub fn read_link(&self, node: &Node) -> Result<PathBuf> {
        match node {
            Node::Stored(key) => Ok(self.store.read_link(key)?),
            _ => Err(Error::NotFound),
        }
    }

    /// Space figures of the filesystem under the store.
    pub fn space(&self) -> Result<Space> {
        Ok(self.store.space()?)
    }
}
