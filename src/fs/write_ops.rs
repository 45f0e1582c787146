//! Opening and changing files through the view. Chunks of sharded arrays are written into
//! in-memory buffers that the pending overlay shares with the view (read-your-writes), and reach
//! their shard by group commit; everything else is the store's own files and directories, changed
//! in place. A non-chunk file made inside a chunk-key directory (an atomic writer's temporary
//! file) lives under `__shardfs/scratch/` until it is renamed onto a chunk key.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};

use super::{Handle, ShardFs};
use crate::fs::error::{Error, Result};
use crate::store::{self, Attr, Kind, OpenHow, PRIVATE_DIR, PutMode, join, parent_key};
use crate::view::array::ShardedArray;
use crate::view::namespace::Node;
use crate::view::overlay::{Buffer, Overlay, PendingChunk};
use crate::view::reading::Reading;
use crate::write::document::store_document;
use crate::write::pending::Pending;

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    pub write: bool,
    pub truncate: bool,
    pub append: bool,
}

/// What a name in a directory of the view stands for, for the operations that change it.
enum Target {
    Chunk(Arc<ShardedArray>, Vec<u64>),
    /// A chunk key of the array outside its bounds: it can be deleted (zarr-python 2 deletes the
    /// chunks outside a shrunk array after storing the smaller shape), never written.
    ChunkOutside(Arc<ShardedArray>, Vec<u64>),
    ChunkDir(Arc<ShardedArray>, String, Vec<u64>),
    /// A metadata document of the view, at this view path: written through the view, it is
    /// translated back.
    Document(String),
    /// A file or directory of the store shown as it is, at this key.
    Stored(String),
    /// The consolidated metadata file, computed from the documents: what is written to it is
    /// dropped (zarr-python 2 and xarray write one after changing metadata; the view's own is
    /// already up to date).
    Consolidated(&'static str),
}

impl ShardFs {
    fn pending(&self) -> Result<&Arc<Pending>> {
        self.pending.as_ref().ok_or(Error::ReadOnly)
    }

    fn target(&self, parent: &Node, name: &str) -> Result<Target> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::Invalid(format!("{name:?} is not a file name")));
        }
        match parent {
            Node::Stored(dir) => {
                if dir.is_empty() && name == PRIVATE_DIR {
                    return Err(Error::Invalid(format!("{PRIVATE_DIR} is reserved for shardfs")));
                }
                if let Some(consolidated) = self.ns.consolidated_at(dir).filter(|c| *c == name) {
                    return Ok(Target::Consolidated(consolidated));
                }
                // A stored file the view hides (a Zarr v2 view's zarr.json) is written only
                // through the view files rendered from it.
                if self.ns.presentation().hides(name) {
                    log::warn!("{}: hidden by this view, so not written through it", join(dir, name));
                    return Err(Error::Invalid(format!("{}: hidden by this view", join(dir, name))));
                }
                if self.ns.document_at(&join(dir, name)).is_some() {
                    return Ok(Target::Document(join(dir, name)));
                }
                if let Some(array) = self.ns.array_at(dir)? {
                    if let Some(target) = chunk_target(&array, name)? {
                        return Ok(target);
                    }
                    if array.is_shard_name(name) {
                        return Err(Error::Invalid(format!("{name}: a shard key of {}", array.dir)));
                    }
                }
                Ok(Target::Stored(join(dir, name)))
            }
            Node::ChunkDir { array, dir, .. } => {
                let array = self.ns.array(array)?;
                let rel = join(dir, name);
                Ok(chunk_target(&array, &rel)?.unwrap_or_else(|| Target::Stored(array.scratch_key(&rel))))
            }
            Node::Document(_) | Node::Chunk { .. } | Node::Consolidated(_) => Err(Error::NotADirectory),
        }
    }

    /// The node a store key is shown as.
    fn store_node(&self, key: &str) -> Node {
        if self.ns.document_at(key).is_some() { Node::Document(key.to_string()) } else { Node::Stored(key.to_string()) }
    }

    /// The whole current content of a file of the view.
    fn chunk_bytes(&self, node: &Node) -> Result<Vec<u8>> {
        let content = self.ns.open_to_rewrite(node)?;
        let mut out = Vec::new();
        loop {
            let piece = content.read(out.len() as u64, 1 << 20)?;
            if piece.is_empty() {
                return Ok(out);
            }
            out.extend(piece);
        }
    }

    /// The whole current content of a chunk opened for writing, from whichever shard version is
    /// newest: such a handle is bound to no version, so a version replaced while it was read (by
    /// other machines' commits, however many) is no error to its writer, only a reason to read
    /// the newest again.
    fn newest_chunk_bytes(&self, node: &Node) -> Result<Vec<u8>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.chunk_bytes(node) {
                Err(Error::Store(store::Error::Changed(why)) | Error::Stale(why)) if attempt < READS_OF_NEWEST => {
                    log::debug!("{why}; reading the newest version");
                    std::thread::sleep(store::backoff(attempt));
                }
                read => return read,
            }
        }
    }

    /// Records a chunk's new state and commits its shard at once when the policy says so.
    fn publish(&self, array: &Arc<ShardedArray>, coords: &[u64], state: PendingChunk) -> Result<()> {
        let pending = self.pending()?;
        if let Some(shard) = pending.set(array, coords, state) {
            pending.commit_shard(&self.ns, &shard)?;
        }
        pending.make_room();
        Ok(())
    }

    /// Opens file `ino` as `mode` says.
    pub fn open(&self, ino: u64, mode: OpenMode) -> Result<u64> {
        let node = self.node(ino)?;
        if !mode.write {
            return Ok(self.add_handle(Handle::Read(self.open_reading(ino, node)?)));
        }
        self.pending()?;
        self.unbind(ino);
        let handle = match &node {
            Node::Chunk { array, coords } => {
                let array = &self.ns.array_of_chunk(array, coords)?;
                // The buffer is published at once, so that a truncate or a second open of the same
                // chunk works on this very buffer.
                let buffer = match self.ns_overlay_chunk(array, coords) {
                    Some(PendingChunk::Written(buffer)) => buffer,
                    _ => {
                        Arc::new(RwLock::new(if mode.truncate { Vec::new() } else { self.newest_chunk_bytes(&node)? }))
                    }
                };
                if mode.truncate {
                    buffer.write().clear();
                }
                self.publish(array, coords, PendingChunk::Written(buffer.clone()))?;
                Handle::Chunk { array: array.clone(), coords: coords.clone(), buffer, append: mode.append }
            }
            Node::Document(key) => {
                let content = if mode.truncate { Vec::new() } else { self.chunk_bytes(&node)? };
                Handle::Document {
                    path: key.clone(),
                    buffer: Mutex::new(content),
                    dirty: AtomicBool::new(mode.truncate),
                    append: mode.append,
                    placeholder: AtomicBool::new(false),
                }
            }
            Node::Stored(key) => {
                if self.ns.attr(&node)?.kind == Kind::Dir {
                    return Err(Error::IsADirectory);
                }
                let file = self.ns.store().open_file(key, OpenHow { create: None, truncate: mode.truncate })?;
                Handle::Stored { file, append: mode.append }
            }
            Node::ChunkDir { .. } => return Err(Error::IsADirectory),
            Node::Consolidated(_) => return Err(Error::ReadOnly),
        };
        Ok(self.add_handle(handle))
    }

    /// Opens `node` for reading at the version inode `ino` is bound to: ESTALE when that version
    /// was replaced, so that the kernel looks the name up again and finds the new version's inode.
    pub(super) fn open_reading(&self, ino: u64, node: Node) -> Result<Reading> {
        let bound = self.inodes.lock().bound(ino).map(|b| b.stamp);
        let reading = Reading::open(&self.ns, node.clone(), bound.is_some())?;
        match bound {
            Some(stamp) if reading.version() != Some(stamp) && !self.catch_up(ino, &node, stamp, reading.version()) => {
                Err(Error::Stale(format!("{}: replaced since it was looked up", reading.path())))
            }
            _ => Ok(reading),
        }
    }

    fn ns_overlay_chunk(&self, array: &ShardedArray, coords: &[u64]) -> Option<PendingChunk> {
        self.pending.as_ref()?.chunk(array, coords)
    }

    /// The array a chunk file opened in `opened` is in now, when the chunk still means the same
    /// there: writes through a file opened before its array changed under it are refused (ESTALE),
    /// never put where the chunk key now means another part of the array.
    fn current(&self, opened: &ShardedArray, coords: &[u64]) -> Result<Arc<ShardedArray>> {
        match self.ns.array_at(&opened.dir)? {
            Some(current) if current.same_chunks(opened) && current.in_bounds(coords) => Ok(current),
            _ => Err(Error::Stale(format!(
                "{}: the array's zarr.json changed since {} was opened",
                self.ns.store().describe(&opened.dir),
                opened.chunk_key(coords)
            ))),
        }
    }

    /// Creates and opens file `name` in directory `parent`.
    pub fn create(&self, parent: u64, name: &str, mode: u32, open: OpenMode) -> Result<(u64, Attr, u64)> {
        self.pending()?;
        let target = self.target(&self.node(parent)?, name)?;
        let (node, handle) = match target {
            Target::Chunk(array, coords) => {
                let buffer: Buffer = Arc::default();
                self.publish(&array, &coords, PendingChunk::Written(buffer.clone()))?;
                let handle =
                    Handle::Chunk { array: array.clone(), coords: coords.clone(), buffer, append: open.append };
                (Node::chunk(&array, coords), handle)
            }
            Target::Stored(key) => {
                let store = self.ns.store();
                self.make_scratch_dir(&key)?;
                let file = store.open_file(&key, OpenHow { create: Some(mode), truncate: open.truncate })?;
                (self.store_node(&key), Handle::Stored { file, append: open.append })
            }
            Target::Consolidated(_) => return Err(Error::ReadOnly),
            Target::Document(path) => {
                self.creates_documents(&path)?;
                // The document exists (empty) from now on; its content is stored at close.
                match self.ns.store().put(&self.document_key(&path)?, &[], PutMode::Create) {
                    Ok(_) | Err(store::Error::Changed(_)) => {}
                    Err(e) => return Err(e.into()),
                }
                let buffer = Mutex::new(Vec::new());
                let handle = Handle::Document {
                    path: path.clone(),
                    buffer,
                    dirty: AtomicBool::new(true),
                    append: open.append,
                    placeholder: AtomicBool::new(true),
                };
                (Node::Document(path), handle)
            }
            Target::ChunkDir(..) => return Err(Error::Invalid(format!("{name} is a chunk-key directory"))),
            Target::ChunkOutside(array, _) => return Err(outside(&array, name)),
        };
        let answer = self.ns.answer(&node)?;
        let ino = self.remember_written(node, &answer);
        Ok((ino, answer.attr, self.add_handle(handle)))
    }

    /// Writes `data` at `offset` (at the end for files opened to append).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        match &*self.handle(fh)? {
            Handle::Chunk { array, coords, buffer, append } => {
                let current = self.current(array, coords)?;
                write_into(&mut buffer.write(), *append, offset, data)
                    .map_err(|e| e.of(&join(&array.dir, &array.chunk_key(coords))))?;
                self.publish(&current, coords, PendingChunk::Written(buffer.clone()))?;
            }
            Handle::Stored { file, append } => {
                if *append {
                    file.append(data)?
                } else {
                    file.write_at(data, offset)?
                }
            }
            Handle::Document { path, buffer, dirty, append, .. } => {
                write_into(&mut buffer.lock(), *append, offset, data).map_err(|e| e.of(path))?;
                dirty.store(true, Ordering::Relaxed);
            }
            Handle::Read(_) => return Err(Error::BadHandle),
        }
        Ok(data.len() as u32)
    }

    /// Truncates or extends file `ino` (through `fh` when given) to `size` bytes.
    pub fn set_size(&self, ino: u64, fh: Option<u64>, size: u64) -> Result<Attr> {
        self.pending()?;
        self.unbind(ino);
        let node = self.node(ino)?;
        let handle = fh.map(|fh| self.handle(fh)).transpose()?;
        match (&node, handle.as_deref()) {
            (_, Some(Handle::Stored { file, .. })) => file.set_len(size)?,
            (_, Some(Handle::Document { path, buffer, dirty, .. })) => {
                buffer.lock().resize(held_len(size).map_err(|e| e.of(path))?, 0);
                dirty.store(true, Ordering::Relaxed);
            }
            (Node::Document(key), _) => {
                let mut content = self.chunk_bytes(&node)?;
                content.resize(held_len(size).map_err(|e| e.of(key))?, 0);
                self.store_document(key, &content)?;
            }
            (Node::Chunk { array, coords }, handle) => {
                let array = &self.ns.array_of_chunk(array, coords)?;
                if let Some(Handle::Chunk { array: opened, .. }) = handle {
                    self.current(opened, coords)?;
                }
                let buffer = match (handle, self.ns_overlay_chunk(array, coords)) {
                    (Some(Handle::Chunk { buffer, .. }), _) => buffer.clone(),
                    (_, Some(PendingChunk::Written(buffer))) => buffer,
                    _ => Arc::new(RwLock::new(self.chunk_bytes(&node)?)),
                };
                buffer.write().resize(held_len(size).map_err(|e| e.of(&node.path()))?, 0);
                self.publish(array, coords, PendingChunk::Written(buffer))?;
            }
            (Node::Stored(key), _) => {
                let file = self.ns.store().open_file(key, OpenHow { create: None, truncate: size == 0 })?;
                file.set_len(size)?;
            }
            (Node::ChunkDir { .. }, _) => return Err(Error::IsADirectory),
            (Node::Consolidated(_), _) => return Err(Error::ReadOnly),
        }
        let answer = self.ns.answer(&node)?;
        self.watch(ino, &answer);
        Ok(answer.attr)
    }

    /// Removes file `name` of directory `parent`.
    pub fn unlink(&self, parent: u64, name: &str) -> Result<()> {
        self.pending()?;
        let parent_node = self.node(parent)?;
        self.unlinked(&parent_node, name)?;
        self.detach(&join(&parent_node.path(), name));
        Ok(())
    }

    fn unlinked(&self, parent_node: &Node, name: &str) -> Result<()> {
        match self.target(parent_node, name)? {
            Target::Chunk(array, coords) => {
                self.ns.attr(&Node::chunk(&array, coords.clone()))?;
                self.publish(&array, &coords, PendingChunk::Deleted)
            }
            // As unlink(2): durable once the directory is (a directory fsync commits everything).
            Target::Stored(key) => Ok(self.ns.store().discard(&key)?),
            Target::Document(path) => {
                self.creates_documents(&path)?;
                let key = self.document_key(&path)?;
                // What was written to the array goes first, deletions too (`rm -r` of an array
                // unlinks its chunks, then its document): once the document is gone, pending
                // chunks no longer belong to an array and could not be committed any more.
                if let Some(dir) = self.ns.source().array_dir(&key) {
                    self.pending()?.commit_below(&self.ns, &dir)?;
                }
                Ok(self.ns.store().delete(&key)?)
            }
            Target::ChunkOutside(array, coords) => self.publish(&array, &coords, PendingChunk::Deleted),
            Target::ChunkDir(..) => Err(Error::IsADirectory),
            Target::Consolidated(_) => Err(Error::ReadOnly),
        }
    }

    /// Makes directory `name` in `parent`.
    pub fn mkdir(&self, parent: u64, name: &str, mode: u32) -> Result<(u64, Attr)> {
        let pending = self.pending()?;
        let parent_node = self.node(parent)?;
        let node = match self.target(&parent_node, name)? {
            Target::ChunkDir(array, dir, prefix) => {
                if self.ns.child(&parent_node, name).is_ok() {
                    return Err(Error::Exists);
                }
                pending.add_dir(&array, &dir);
                Node::ChunkDir { array: array.path(), dir, prefix }
            }
            Target::Stored(key) => {
                self.ns.store().make_dir(&key, mode)?;
                Node::Stored(key)
            }
            Target::Chunk(..) | Target::ChunkOutside(..) | Target::Document(_) | Target::Consolidated(_) => {
                return Err(Error::Invalid(format!("{name} cannot be a directory")));
            }
        };
        let answer = self.ns.answer(&node)?;
        Ok((self.remember_told(node, &answer), answer.attr))
    }

    /// Removes the empty directory `name` of `parent`.
    pub fn rmdir(&self, parent: u64, name: &str) -> Result<()> {
        let parent_node = self.node(parent)?;
        self.removed_dir(&parent_node, name)?;
        self.detach(&join(&parent_node.path(), name));
        Ok(())
    }

    fn removed_dir(&self, parent_node: &Node, name: &str) -> Result<()> {
        let pending = self.pending()?;
        match self.target(parent_node, name)? {
            Target::ChunkDir(array, dir, prefix) => {
                let node = Node::ChunkDir { array: array.path(), dir: dir.clone(), prefix };
                self.ns.child(parent_node, name)?;
                if !self.ns.list(&node)?.is_empty() {
                    return Err(Error::NotEmpty);
                }
                pending.remove_dir(&array, &dir);
                self.ns.forget_dir_guess(&array, &dir);
                Ok(())
            }
            Target::Stored(key) => {
                // Shards below whose every chunk was deleted through the view go (and with them
                // their directories) before the directory does, or it would not be empty.
                pending.commit_below(&self.ns, &key)?;
                Ok(self.ns.store().remove_dir(&key)?)
            }
            Target::Chunk(..) | Target::ChunkOutside(..) | Target::Document(_) | Target::Consolidated(_) => {
                Err(Error::NotADirectory)
            }
        }
    }

    /// Renames `name` of `parent` to `new_name` of `new_parent`, replacing a file there.
    pub fn rename(&self, parent: u64, name: &str, new_parent: u64, new_name: &str) -> Result<()> {
        self.pending()?;
        let from = self.target(&self.node(parent)?, name)?;
        let to = self.target(&self.node(new_parent)?, new_name)?;
        let (from_node, to_node) = (self.target_node(&from), self.target_node(&to));
        let is_dir = matches!(from, Target::Stored(_)) && self.ns.attr(&from_node)?.kind == Kind::Dir;
        if is_dir {
            // Pending chunks belong to their array's path: they reach their shards before the
            // shards move, never a directory that no longer exists.
            self.commit_all()?;
        }
        self.move_content(from, to)?;
        self.rebind(&from_node.path(), &to_node, is_dir);
        Ok(())
    }

    /// Gives file `ino` the new name `new_name` in `new_parent` (link(2)), failing with EEXIST when
    /// the name exists: zarr-python creates keys exclusively by linking a temporary file to them.
    /// Store files get a real second name where the store has links; anything else (a chunk, or
    /// a file linked onto a chunk key or a metadata document) gets a copy of its content.
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &str) -> Result<(u64, Attr)> {
        self.pending()?;
        let node = self.node(ino)?;
        let parent_node = self.node(new_parent)?;
        let to = self.target(&parent_node, new_name)?;
        if self.ns.child(&parent_node, new_name).is_ok() {
            return Err(Error::Exists);
        }
        let exists = |e: store::Error| match e {
            store::Error::Changed(_) => Error::Exists,
            e => e.into(),
        };
        match (&node, &to) {
            (Node::Stored(key), _) if self.ns.attr(&node)?.kind == Kind::Dir => {
                return Err(Error::Invalid(format!("{key}: a directory cannot be linked")));
            }
            (Node::Stored(key), Target::Stored(new_key)) => {
                self.make_scratch_dir(new_key)?;
                self.ns.store().link(key, new_key).map_err(exists)?
            }
            (Node::ChunkDir { .. } | Node::Consolidated(_), _) => {
                return Err(Error::Invalid(format!("{}: cannot be linked", node.path())));
            }
            _ => {
                let content = self.chunk_bytes(&node)?;
                match &to {
                    Target::Chunk(array, coords) => {
                        self.publish(array, coords, PendingChunk::Written(Arc::new(RwLock::new(content))))?;
                    }
                    Target::Document(path) => self.store_document(path, &content)?,
                    Target::Stored(key) => {
                        self.make_scratch_dir(key)?;
                        self.ns.store().put(key, &[&content], PutMode::Create).map_err(exists)?;
                    }
                    Target::Consolidated(_) => return Err(Error::ReadOnly),
                    Target::ChunkDir(..) => return Err(Error::Invalid(format!("{new_name} is a chunk-key directory"))),
                    Target::ChunkOutside(array, _) => return Err(outside(array, new_name)),
                }
            }
        }
        let new_node = self.target_node(&to);
        let answer = self.ns.answer(&new_node)?;
        Ok((self.remember_written(new_node, &answer), answer.attr))
    }

    /// A file made inside a chunk-key directory lives in the private directory's scratch space,
    /// whose directories are made as they are needed.
    fn make_scratch_dir(&self, key: &str) -> Result<()> {
        if key.starts_with(PRIVATE_DIR) {
            self.ns.store().make_dirs(parent_key(key))?;
        }
        Ok(())
    }

    /// Moves `from`'s content to `to`, then removes `from`. A file moved onto a chunk key is
    /// removed first: the chunk is then only recorded as pending (in memory), so a failure to
    /// remove it (a store's passing fault) fails the rename with nothing changed, where removing
    /// it last would fail a rename already done.
    fn move_content(&self, from: Target, to: Target) -> Result<()> {
        let store = self.ns.store();
        let content = match &from {
            Target::Stored(key) if matches!(to, Target::Stored(_)) => {
                let Target::Stored(new_key) = &to else { unreachable!() };
                return Ok(store.rename(key, new_key)?);
            }
            Target::Stored(key) if matches!(to, Target::Chunk(..)) => {
                let content = store.take(key)?;
                let Target::Chunk(array, coords) = &to else { unreachable!() };
                return self.publish(array, coords, PendingChunk::Written(Arc::new(RwLock::new(content))));
            }
            Target::Stored(key) => store.read(key)?,
            Target::Chunk(array, coords) => self.chunk_bytes(&Node::chunk(array, coords.clone()))?,
            // A document moved elsewhere would lose its translation; a copy keeps it.
            Target::ChunkDir(..) | Target::Document(_) | Target::Consolidated(_) => return Err(Error::CrossDevice),
            Target::ChunkOutside(array, coords) => return Err(outside(array, &array.chunk_key(coords))),
        };
        match &to {
            Target::Chunk(array, coords) => {
                self.publish(array, coords, PendingChunk::Written(Arc::new(RwLock::new(content))))?;
            }
            Target::Document(key) => self.store_document(key, &content)?,
            Target::Stored(key) => {
                store.put(key, &[&content], PutMode::Overwrite)?;
            }
            Target::Consolidated(name) => log::info!("{name}: a consolidated file written through the view is dropped"),
            Target::ChunkDir(..) => return Err(Error::CrossDevice),
            Target::ChunkOutside(array, coords) => return Err(outside(array, &array.chunk_key(coords))),
        }
        match from {
            Target::Chunk(array, coords) => self.publish(&array, &coords, PendingChunk::Deleted),
            Target::Stored(key) => Ok(store.delete(&key)?),
            Target::ChunkDir(..) | Target::ChunkOutside(..) | Target::Document(_) | Target::Consolidated(_) => {
                unreachable!("refused above")
            }
        }
    }

    /// Makes what was written to `fh` durable: a chunk's whole shard is committed.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        match &*self.handle(fh)? {
            Handle::Chunk { array, coords, .. } => {
                self.current(array, coords)?;
                self.pending()?.commit_chunk_shard(&self.ns, array, coords)?
            }
            Handle::Stored { file, .. } => file.sync()?,
            Handle::Document { .. } => self.store_if_dirty(&*self.handle(fh)?)?,
            Handle::Read(_) => {}
        }
        if self.ns.store().syncs_as_one() {
            self.commit_all()?;
        }
        Ok(())
    }

    /// True when file `ino` is computed from many store files at once (the consolidated
    /// metadata): the kernel should not keep its pages, which this mount's own writes of a
    /// document make stale before any watcher pass could say so.
    pub fn uncached(&self, ino: u64) -> bool {
        matches!(self.node(ino), Ok(Node::Consolidated(_)))
    }

    /// True when closing `fh` has something to do: a written document is stored at close, and a
    /// chunk's close reports a failed commit of its shard. Every other close is left to the
    /// kernel alone (no FLUSH request), which saves a round trip per file written.
    pub fn flushes_at_close(&self, fh: u64) -> bool {
        match self.handle(fh).as_deref() {
            Ok(Handle::Document { .. }) => true,
            Ok(Handle::Chunk { array, coords, .. }) => {
                self.pending.as_ref().is_some_and(|p| p.has_error(array, coords))
                    || self.current(array, coords).is_err()
            }
            Ok(Handle::Stored { .. } | Handle::Read(_)) | Err(_) => false,
        }
    }

    /// Called at each close: stores a written document, and reports a failed commit of a chunk's
    /// shard.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let handle = self.handle(fh)?;
        if let Handle::Chunk { array, coords, .. } = &*handle {
            self.current(array, coords)?;
        }
        if let Handle::Chunk { array, coords, .. } = &*handle
            && let Some((errno, message)) = self.pending()?.take_error(array, coords)
        {
            let source = std::io::Error::from_raw_os_error(errno.unwrap_or(libc::EIO));
            return Err(Error::Store(store::Error::Io { place: message, source }));
        }
        self.store_if_dirty(&handle)
    }

    /// Stores a document handle's content if it changed since it was last stored.
    pub(super) fn store_if_dirty(&self, handle: &Handle) -> Result<()> {
        if let Handle::Document { path, buffer, dirty, placeholder, .. } = handle
            && dirty.swap(false, Ordering::Relaxed)
        {
            let content = buffer.lock().clone();
            if let Err(e) = self.store_document(path, &content) {
                dirty.store(true, Ordering::Relaxed);
                if placeholder.swap(false, Ordering::Relaxed) {
                    self.remove_placeholder(path);
                }
                return Err(e);
            }
            placeholder.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Removes the empty document a create stored at `path` once its content was refused, so that
    /// a refused write leaves the store as it was. A document someone filled meanwhile stays.
    fn remove_placeholder(&self, path: &str) {
        let Ok(key) = self.document_key(path) else { return };
        let store = self.ns.store();
        let removed = match store.attr(&key) {
            Ok(attr) if attr.size == 0 => match store.delete_version(&key, &attr.stamp) {
                // A store that cannot remove one version alone: the document is empty, remove it.
                Ok(false) => store.delete(&key),
                done => done.map(drop),
            },
            _ => Ok(()),
        };
        if let Err(e) = removed {
            log::warn!("{}: the empty document of a refused create stays: {e}", store.describe(&key));
        }
    }

    /// Refuses to create or delete the metadata file at `path` when the view renders several
    /// files from one stored document (a Zarr v2 view's `.zarray` and `.zattrs`).
    fn creates_documents(&self, path: &str) -> Result<()> {
        if self.ns.presentation().creates_documents() {
            return Ok(());
        }
        log::warn!("{path}: metadata files of this view are not created or deleted; use the Zarr v3 view");
        Err(Error::Invalid(format!("{path}: create and delete arrays and groups through the Zarr v3 view")))
    }

    /// The stored document the view's metadata file at `path` is rendered from.
    fn document_key(&self, path: &str) -> Result<String> {
        self.ns.document_at(path).ok_or(Error::NotFound)
    }

    fn store_document(&self, path: &str, content: &[u8]) -> Result<()> {
        let key = &self.document_key(path)?;
        let dir = self.ns.source().array_dir(key);
        let before = dir.as_deref().map(|dir| self.ns.array_at(dir)).transpose()?.flatten();
        store_document(
            self.ns.store(),
            self.ns.source(),
            self.ns.presentation(),
            path,
            key,
            content,
            self.shard_new.as_deref(),
        )?;
        if let (Some(before), Some(dir)) = (before, &dir) {
            self.delete_outside(&before, dir)?;
        }
        // What the kernel holds of the array's chunks may be out of date now (a shrink): the
        // watcher need not wait for its next pass.
        self.document_stored.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// After a shrink stored through the view, deletes the chunks of the array as it was (`before`),
    /// stored or pending, that now lie outside it, as zarr-python and tensorstore do when they
    /// resize, so that a later grow reads the fill value there, as on a plain store resized by them.
    /// (zarr-python 2 deletes them itself, but only after storing the smaller shape, when the view
    /// no longer shows them.)
    fn delete_outside(&self, before: &ShardedArray, dir: &str) -> Result<()> {
        let Some(after) = self.ns.array_at(dir)?.filter(|after| after.same_chunks(before)) else { return Ok(()) };
        if after.grid.iter().zip(&before.grid).all(|(a, b)| a >= b) {
            return Ok(());
        }
        let pending = self.pending()?.chunks_under(before, &[]).into_iter().map(|(coords, _)| coords);
        let mut outside: Vec<Vec<u64>> = pending.filter(|coords| !after.in_bounds(coords)).collect();
        self.ns.for_each_stored_chunk(before, &mut |coords| {
            if !after.in_bounds(coords) {
                outside.push(coords.to_vec());
            }
            std::ops::ControlFlow::Continue(())
        })?;
        for coords in outside {
            self.publish(&after, &coords, PendingChunk::Deleted)?;
        }
        Ok(())
    }

    /// Commits every pending write, and makes every file written durable where the store holds
    /// them until synced (fsync of a directory, and unmount).
    pub fn commit_all(&self) -> Result<()> {
        let Some(pending) = &self.pending else { return Ok(()) };
        let committed = pending.commit_all(&self.ns);
        self.ns.store().sync_all()?;
        Ok(committed?)
    }
}

impl ShardFs {
    /// The node the view shows for a target.
    fn target_node(&self, target: &Target) -> Node {
        match target {
            Target::Chunk(array, coords) | Target::ChunkOutside(array, coords) => Node::chunk(array, coords.clone()),
            Target::ChunkDir(array, dir, prefix) => {
                Node::ChunkDir { array: array.path(), dir: dir.clone(), prefix: prefix.clone() }
            }
            Target::Stored(key) | Target::Document(key) => self.store_node(key),
            Target::Consolidated(name) => Node::Consolidated(name),
        }
    }
}

/// How often a chunk opened for writing is read again when the shard version read was replaced
/// meanwhile: each try reads the newest, so only a shard replaced this often within the backoff
/// (a few seconds in all) fails the open.
const READS_OF_NEWEST: u32 = 12;

/// The error for writing the chunk key `name` outside the bounds of `array`.
fn outside(array: &ShardedArray, name: &str) -> Error {
    Error::Invalid(format!("{name}: chunk outside the bounds of {}", array.dir))
}

/// The chunk or chunk-key directory `rel` (relative to the array) stands for, if any.
fn chunk_target(array: &Arc<ShardedArray>, rel: &str) -> Result<Option<Target>> {
    let enc = &array.view_keys;
    if let Some(coords) = enc.decode(rel, array.rank()) {
        if !array.in_bounds(&coords) {
            return Ok(Some(Target::ChunkOutside(array.clone(), coords)));
        }
        return Ok(Some(Target::Chunk(array.clone(), coords)));
    }
    match enc.decode_dir(rel, array.rank()) {
        Some(prefix) if !rel.is_empty() => {
            if !array.in_bounds(&prefix) {
                return Err(Error::Invalid(format!("{rel}: outside the chunk grid of {}", array.dir)));
            }
            Ok(Some(Target::ChunkDir(array.clone(), rel.to_string(), prefix)))
        }
        _ => Ok(None),
    }
}

/// The largest file held in memory while it is written (a chunk, a metadata document): a write
/// or truncate past it fails (EFBIG) instead of taking the daemon's memory with it.
const LARGEST_HELD: u64 = 1 << 30;

/// A held file's length past [`LARGEST_HELD`], to be named with [`TooLong::of`].
struct TooLong(u64);

impl TooLong {
    fn of(&self, path: &str) -> Error {
        Error::TooLarge(format!("{path}: {} bytes is more than a file written here may hold ({LARGEST_HELD})", self.0))
    }
}

/// `len` as a length a held file may have.
fn held_len(len: u64) -> std::result::Result<usize, TooLong> {
    if len > LARGEST_HELD { Err(TooLong(len)) } else { Ok(len as usize) }
}

/// Writes `data` into a file's buffer at `offset` (at its end when appending). Sequential writes,
/// the common case, extend the buffer without zero-filling it first.
fn write_into(buffer: &mut Vec<u8>, append: bool, offset: u64, data: &[u8]) -> std::result::Result<(), TooLong> {
    let at = if append { buffer.len() as u64 } else { offset };
    let end = held_len(at.saturating_add(data.len() as u64))?;
    let at = at as usize;
    if at == buffer.len() {
        buffer.extend_from_slice(data);
        return Ok(());
    }
    if buffer.len() < end {
        buffer.resize(end, 0);
    }
    buffer[at..end].copy_from_slice(data);
    Ok(())
}
