//! Shards on disk: finding an array's shards, reading their indexes through the [`IndexCache`],
//! and locating inner chunks, nested levels included. Reads of chunk data never happen here:
//! a located chunk is a byte range of a shard file.

use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use super::array::ShardedArray;
use super::error::{Error, Result};
use super::index_cache::IndexCache;
use super::read_ahead::ReadAhead;
use super::retries::Retries;
use super::sources::Sources;
use crate::format::shard_index::ShardIndex;
use crate::format::sharding::Level;
use crate::store::{self, Attr, Kind, Need, Object, Stamp, Store, join, lock};

/// Why a chunk is located, which decides what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A lookup: the shard's index read, the shard not opened.
    Stat,
    /// A reader's open: the shard opened, and the reader's way through the array followed, so
    /// that the shards ahead of it are asked for.
    Read,
    /// A read-only mount's lookup, which opens the file for the reads that may come with no
    /// open (`fs/unopened.rs`): the shard opened as for a reader, but the reader's way through
    /// the array followed at its first read, not here. `ls -l` looks up every file it lists, in
    /// order, and reads none: taken for a reader, it had the shards ahead of it fetched.
    Held,
    /// A writer's read of the chunk it is about to change (an open without `O_TRUNC`): the shard
    /// opened, nothing asked for ahead. A writer goes through the chunks in order too (and looks
    /// them up in order), and would fetch whole the shards it is replacing.
    Rewrite,
}

/// An inner chunk found in its shard.
#[derive(Debug)]
pub struct Located {
    /// The chunk's bytes within the shard file.
    pub range: Range<u64>,
    /// The shard file's attributes (the chunk shows the shard's owner, mode and times).
    pub shard: Attr,
    /// The shard file, open, when the caller asked for it: `range` is valid for this very file.
    pub file: Option<Box<dyn Object>>,
}

/// What a listing learns of one inner chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkState {
    /// The chunk is stored at this byte range of the shard file (absolute, nested levels
    /// included), in the shard version the walk read.
    Stored(Range<u64>),
    /// Its index entry is damaged: the chunk is listed, and reading it fails.
    Damaged,
}

/// One shard being read: its attributes, and the file once opened.
struct OpenShard<'a> {
    /// Keeps this process's commits off the shard while it is read.
    _reading: parking_lot::RwLockReadGuard<'static, ()>,
    store: &'a dyn Store,
    key: String,
    attr: Attr,
    file: Option<Box<dyn Object>>,
    /// Set when opening found a newer file version than the one first stat'ed.
    changed: bool,
}

impl<'a> OpenShard<'a> {
    /// The shard at `key`, stat'ed but not opened; `None` when there is none.
    fn stat(store: &'a dyn Store, key: String) -> Result<Option<Self>> {
        let reading = lock::reading(&key);
        match store.attr(&key) {
            Ok(attr) => Self::checked(reading, store, key, attr, None),
            Err(store::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The shard at `key`, opened.
    fn open(store: &'a dyn Store, key: String) -> Result<Option<Self>> {
        let reading = lock::reading(&key);
        match store.open(&key) {
            Ok(file) => {
                let attr = *file.attr();
                Self::checked(reading, store, key, attr, Some(file))
            }
            Err(store::Error::NotFound(_)) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                Err(Error::Damaged(format!("{}: shard is a symbolic link", store.describe(&key))))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn checked(
        reading: parking_lot::RwLockReadGuard<'static, ()>,
        store: &'a dyn Store,
        key: String,
        attr: Attr,
        file: Option<Box<dyn Object>>,
    ) -> Result<Option<Self>> {
        if attr.kind != Kind::File {
            return Err(Error::Damaged(format!("{}: shard is not a regular file", store.describe(&key))));
        }
        Ok(Some(OpenShard { _reading: reading, store, key, attr, file, changed: false }))
    }

    /// Opens the shard afresh, at the version there now: from here on it reads that one.
    fn reopen(&mut self) -> Result<()> {
        let file = self.store.open(&self.key)?;
        self.attr = *file.attr();
        self.file = Some(file);
        Ok(())
    }

    fn file(&mut self) -> Result<&dyn Object> {
        if self.file.is_none() {
            let file = self.store.open(&self.key)?;
            if file.attr().stamp != self.attr.stamp {
                self.attr = *file.attr();
                self.changed = true;
            }
            self.file = Some(file);
        }
        Ok(self.file.as_deref().expect("just opened"))
    }

    fn damaged(&self, cause: impl std::fmt::Display) -> Error {
        Error::Damaged(format!("{}: {cause}", self.store.describe(&self.key)))
    }
}

/// Shard access for every array of one store, sharing one index cache.
#[derive(Debug)]
pub struct Shards {
    cache: Arc<IndexCache>,
    read_ahead: ReadAhead,
}

/// Shards whose indexes a listing asks for ahead of the one it reads.
const INDEXES_AHEAD: usize = 16;

/// How far a walk through an array's chunks ([`Shards::for_each_chunk`]) is to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Likely no further than its first chunks (is there any?): shards are listed and read one
    /// at a time.
    First,
    /// Through every chunk (a listing): the shards are listed first, and the indexes of the next
    /// ones asked for ahead of the one read.
    Every,
}

impl Shards {
    pub fn new(cache: IndexCache) -> Self {
        Shards { cache: Arc::new(cache), read_ahead: ReadAhead::default() }
    }

    /// Where readers of every array have got to, shared by arrays shown as stored.
    pub fn read_ahead(&self) -> &ReadAhead {
        &self.read_ahead
    }

    /// Remembers the outermost index of the shard at `key`, version `stamp`, `len` bytes long, as
    /// a commit of this mount wrote it: its chunks' lookups need not read it back.
    pub fn remember_index(&self, key: &str, len: u64, stamp: Stamp, index: Arc<ShardIndex>) {
        self.cache.insert((key.to_string(), 0, len), stamp, Ok(index));
    }

    /// Takes note that a walk through the chunks of `shards` of `array` (a listing), shard by
    /// shard in this order, is about to read the index of the one at `position` (`starting`
    /// there: the first of a batch of entries). The outer indexes of the next [`INDEXES_AHEAD`]
    /// are asked for in the background, those not in the cache: on an object store each costs a
    /// round trip, and `ls` of a directory of 100 shards would otherwise wait for 100 of them one
    /// after another.
    pub fn walk_at(
        &self,
        store: &dyn Store,
        array: &ShardedArray,
        shards: &[Vec<u64>],
        position: usize,
        starting: bool,
    ) {
        let Some(outer) = array.meta.sharding.levels.first().map(|level| level.index) else { return };
        for shard in &shards[indexes_ahead(position, starting, shards.len())] {
            let key = array.shard_key(shard);
            let cache = self.cache.clone();
            store.prefetch(
                &key.clone(),
                Box::new(move |file| {
                    let size = file.attr().size;
                    if cache.get(&(key, 0, size), &file.attr().stamp).is_none()
                        && let Ok(index) = outer.index_range(size)
                    {
                        file.prefetch(index);
                    }
                }),
            );
        }
    }

    /// Finds the inner chunk at grid coordinates `coords`: `Ok(None)` when it is not stored.
    /// Unless `purpose` is a stat, the shard file comes back open and the range is valid for that
    /// file. A reader's way through the array is the caller's to report ([`ReadAhead::reached`]).
    pub fn locate(
        &self,
        store: &dyn Store,
        array: &ShardedArray,
        coords: &[u64],
        purpose: Purpose,
    ) -> Result<Option<Located>> {
        let open = purpose != Purpose::Stat;
        let location = array.meta.sharding.locate(coords);
        let key = array.shard_key(&location.shard);
        let shard = if open { OpenShard::open(store, key)? } else { OpenShard::stat(store, key)? };
        let Some(mut shard) = shard else { return Ok(None) };
        // A shard replaced between stat and open, or while its index was read, is walked again
        // from the top, so that every level's index comes from the same file version.
        let mut retries = Retries::default();
        loop {
            shard.changed = false;
            match self.walk(&mut shard, array, &location.entries) {
                Ok(range) if !shard.changed => {
                    return Ok(range.map(|range| Located { range, shard: shard.attr, file: shard.file }));
                }
                Ok(_) | Err(Error::Store(store::Error::Changed(_))) => {}
                Err(e) => return Err(e),
            }
            if !retries.again() {
                return Err(shard.damaged("shard keeps changing while being read"));
            }
            shard.reopen()?;
        }
    }

    fn walk(&self, shard: &mut OpenShard, array: &ShardedArray, entries: &[u64]) -> Result<Option<Range<u64>>> {
        let mut blob = 0..shard.attr.size;
        for (level, &entry) in array.meta.sharding.levels.iter().zip(entries) {
            let index = self.index(shard, level, &blob, None)?;
            if shard.changed {
                return Ok(None);
            }
            match index.chunk(entry) {
                Ok(Some(range)) => blob = range,
                Ok(None) => return Ok(None),
                Err(e) => return Err(shard.damaged(e)),
            }
        }
        Ok(Some(blob))
    }

    /// The decoded index of the blob `blob` of `shard` at `level`, from cache or from the file,
    /// read as `need` says (a listing's outer index: [`Need::Only`], not the rest of a small shard
    /// with it; none for a lookup or open, whose reader likely reads chunks of it next).
    fn index(
        &self,
        shard: &mut OpenShard,
        level: &Level,
        blob: &Range<u64>,
        need: Option<Need>,
    ) -> Result<Arc<ShardIndex>> {
        let key = (shard.key.clone(), blob.start, blob.end);
        if let Some(decoded) = self.cache.get(&key, &shard.attr.stamp) {
            return decoded.map_err(|e| shard.damaged(e));
        }
        let spec = level.index;
        let blob_len = blob.end - blob.start;
        let decoded = match spec.index_range(blob_len) {
            Err(e) => Err(e),
            Ok(range) => {
                // The blob's range is of the version stat'ed: a newer file found at open is walked
                // again from the top, never read at the old version's offsets (nor its index
                // cached under the new version's stamp).
                shard.file()?;
                if shard.changed {
                    return Err(store::Error::Changed(shard.store.describe(&shard.key)).into());
                }
                let at = blob.start + range.start;
                let len = range.end - range.start;
                if let Some(need) = need {
                    shard.file()?.will_need(at..at + len, need);
                }
                let bytes = match shard.file()?.read_exact_at(at, len) {
                    Ok(bytes) => bytes,
                    // The caller opens the shard again, after a wait: opened at once, the version
                    // found would likely be gone as well by the time it is read.
                    Err(changed @ store::Error::Changed(_)) => {
                        shard.changed = true;
                        return Err(changed.into());
                    }
                    Err(store::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Err(shard.damaged("shard shrank while its index was read"));
                    }
                    Err(e) => return Err(e.into()),
                };
                ShardIndex::decode(&spec, &bytes, blob_len, blob.start).map(Arc::new)
            }
        };
        match &decoded {
            Err(e) => log::warn!("{}: {e}; its chunks read as EIO", shard.store.describe(&shard.key)),
            Ok(index) => log_damaged_entries(shard, index),
        }
        self.cache.insert(key, shard.attr.stamp, decoded.clone());
        decoded.map_err(|e| shard.damaged(e))
    }

    /// Calls `visit` for every stored or damaged inner chunk of `array` inside the array bounds
    /// whose leading coordinates are `prefix`, reading shard indexes only. Where an index cannot
    /// be read (a damaged shard, a shard that is not a regular file), every chunk it may hold is
    /// visited as [`ChunkState::Damaged`]: the view then says EIO for them rather than letting a
    /// reader take them for missing chunks, which would read as fill value. `visit` may stop the
    /// walk. Every directory listed and shard read is recorded in `sources`.
    pub fn for_each_chunk(
        &self,
        store: &dyn Store,
        array: &ShardedArray,
        prefix: &[u64],
        sources: &Sources,
        walk: Walk,
        visit: &mut dyn FnMut(&[u64], ChunkState) -> ControlFlow<()>,
    ) -> Result<()> {
        let shard_prefix = shard_prefix(array, prefix);
        match walk {
            // Shard by shard as the directories are listed: a walk that stops at the first chunk
            // (is there any?) lists no more than it needs.
            Walk::First => {
                walk_shards_on_disk(store, array, &shard_prefix, sources, &mut |shard| {
                    self.for_each_chunk_of(store, array, shard, prefix, sources, false, |c, s, _| visit(c, s))
                })?;
            }
            Walk::Every => {
                let shards = shards_on_disk(store, array, &shard_prefix, sources)?;
                for (position, shard) in shards.iter().enumerate() {
                    self.walk_at(store, array, &shards, position, position == 0);
                    if self
                        .for_each_chunk_of(store, array, shard, prefix, sources, true, |c, s, _| visit(c, s))
                        .is_break()
                    {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Shards::for_each_chunk`] for the one shard at shard coordinates `shard`, in index order;
    /// `visit` also gets the shard file's attributes when it could be read. A `listing` reads the
    /// shard's outer index alone: a lookup (is there a chunk?) may be a reader's, who then likely
    /// reads chunks of a small shard fetched whole with its index.
    #[expect(clippy::too_many_arguments, reason = "the walk's place and purpose, each its own")]
    pub fn for_each_chunk_of(
        &self,
        store: &dyn Store,
        array: &ShardedArray,
        shard: &[u64],
        prefix: &[u64],
        sources: &Sources,
        listing: bool,
        mut visit: impl FnMut(&[u64], ChunkState, Option<&Attr>) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        let key = array.shard_key(shard);
        let opened = match self.read_indexes(store, array, &key, shard, listing) {
            Ok(Some(opened)) => {
                sources.record(&key, Some(opened.attr.stamp));
                Some(opened)
            }
            Ok(None) => {
                sources.record(&key, None);
                return ControlFlow::Continue(());
            }
            Err(e) => {
                log::warn!("{e}; its chunks read as EIO");
                sources.record(&key, store.attr(&key).ok().map(|a| a.stamp));
                None
            }
        };
        let attr = opened.as_ref().map(|s| s.attr);
        let blob = attr.map(|a| 0..a.size);
        let visit = &mut |c: &[u64], s| visit(c, s, attr.as_ref());
        ShardWalk { shards: self, array, shard: opened, coords: shard, prefix, visit, indexes_only: false, listing }
            .level(0, blob, &mut Vec::new())
    }

    /// The shard at `key` (shard coordinates `coords`), opened, with every index of one version
    /// of it read into the cache, so that a walk then visits its chunks from that version alone.
    /// A version replaced while its indexes were read is read again from the top: listed as it
    /// was, its chunks would show as damaged, present where there are none.
    fn read_indexes<'s>(
        &self,
        store: &'s dyn Store,
        array: &ShardedArray,
        key: &str,
        coords: &[u64],
        listing: bool,
    ) -> Result<Option<OpenShard<'s>>> {
        let mut retries = Retries::default();
        loop {
            let Some(mut opened) = OpenShard::open(store, key.to_string())? else { return Ok(None) };
            let blob = Some(0..opened.attr.size);
            let mut read = ShardWalk {
                shards: self,
                array,
                shard: Some(opened),
                coords,
                prefix: &[],
                visit: &mut |_, _| ControlFlow::Continue(()),
                indexes_only: true,
                listing,
            };
            let _ = read.level(0, blob, &mut Vec::new());
            opened = read.shard.take().expect("the walk keeps its shard");
            if !opened.changed || !retries.again() {
                opened.changed = false;
                return Ok(Some(opened));
            }
        }
    }
}

/// The places among `len` shards whose indexes a walk at `position` asks for: the next
/// [`INDEXES_AHEAD`] from there when it starts there, else the last of those one step on.
fn indexes_ahead(position: usize, starting: bool, len: usize) -> Range<usize> {
    let end = position.saturating_add(INDEXES_AHEAD);
    let start = if starting { position } else { end - 1 };
    start.min(len)..end.min(len)
}

/// The shard coordinates fixed by chunk-grid leading coordinates `prefix`.
pub fn shard_prefix(array: &ShardedArray, prefix: &[u64]) -> Vec<u64> {
    prefix.iter().zip(array.meta.sharding.chunks_per_shard()).map(|(c, r)| c / r).collect()
}

/// Shard coordinates of the shards on disk whose leading coordinates are `shard_prefix`; the
/// directories listed are recorded in `sources`.
pub fn shards_on_disk(
    store: &dyn Store,
    array: &ShardedArray,
    shard_prefix: &[u64],
    sources: &Sources,
) -> Result<Vec<Vec<u64>>> {
    let mut found = Vec::new();
    walk_shards_on_disk(store, array, shard_prefix, sources, &mut |shard| {
        found.push(shard.to_vec());
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// Calls `visit` for the shard coordinates of every shard on disk whose leading coordinates are
/// `shard_prefix`, listing directories only as far as the walk goes (`visit` may stop it); the
/// directories listed are recorded in `sources`.
fn walk_shards_on_disk(
    store: &dyn Store,
    array: &ShardedArray,
    shard_prefix: &[u64],
    sources: &Sources,
    visit: &mut dyn FnMut(&[u64]) -> ControlFlow<()>,
) -> Result<()> {
    let enc = &array.meta.key_encoding;
    let rank = array.rank();
    if enc.separator == '/' && rank > 0 {
        if shard_prefix.len() == rank {
            let _ = visit(shard_prefix);
        } else {
            let dir = join(&array.dir, &enc.dir_key(shard_prefix));
            let _stopped = walk_shard_tree(store, array, &dir, &mut shard_prefix.to_vec(), sources, visit)?;
        }
        return Ok(());
    }
    for (name, _) in list_or_empty(store, &array.dir, sources)? {
        if let Some(coords) = enc.decode(&name, rank)
            && coords.starts_with(shard_prefix)
            && coords.iter().zip(&array.shard_grid).all(|(c, g)| c < g)
            && visit(&coords).is_break()
        {
            break;
        }
    }
    Ok(())
}

/// Walks the shard directory tree of a `/`-separated key encoding below `dir`.
fn walk_shard_tree(
    store: &dyn Store,
    array: &ShardedArray,
    dir: &str,
    coords: &mut Vec<u64>,
    sources: &Sources,
    visit: &mut dyn FnMut(&[u64]) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    let depth = coords.len();
    for (name, kind) in list_or_empty(store, dir, sources)? {
        let Some(c) = array.meta.key_encoding.component(depth, &name).filter(|c| *c < array.shard_grid[depth]) else {
            continue;
        };
        coords.push(c);
        let walked = if depth + 1 == array.rank() {
            visit(coords)
        } else if kind == Kind::Dir {
            walk_shard_tree(store, array, &join(dir, &name), coords, sources, visit)?
        } else {
            ControlFlow::Continue(())
        };
        coords.pop();
        if walked.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

fn list_or_empty(store: &dyn Store, dir: &str, sources: &Sources) -> Result<Vec<(String, Kind)>> {
    match store.list(dir) {
        Ok((entries, stamp)) => {
            sources.record(dir, Some(stamp));
            Ok(entries)
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
            sources.record(dir, store.attr(dir).ok().map(|a| a.stamp));
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

/// The state of one listing walk through one shard.
struct ShardWalk<'w, 's> {
    shards: &'w Shards,
    array: &'w ShardedArray,
    /// `None` when the shard could not be opened: all its chunks are damaged.
    shard: Option<OpenShard<'s>>,
    coords: &'w [u64],
    prefix: &'w [u64],
    visit: &'w mut dyn FnMut(&[u64], ChunkState) -> ControlFlow<()>,
    /// Reads the indexes of every level into the cache and visits no chunk: the innermost
    /// level's entries are not gone through ([`Shards::read_indexes`]).
    indexes_only: bool,
    /// A listing's walk: the outer index is read alone ([`Need::Only`]), not with the rest of a
    /// small shard. Inner indexes are read as a reader's would be: a small shard's come whole
    /// at the first, where each alone would cost a round trip.
    listing: bool,
}

#[cfg(test)]
thread_local! {
    /// The innermost index entries [`ShardWalk::level`] went through on this thread.
    static LEAF_ENTRIES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl ShardWalk<'_, '_> {
    /// Visits the chunks of the blob at `blob` on level `depth`; `None` means the blob is
    /// unreadable, so every chunk it may hold is damaged.
    fn level(&mut self, depth: usize, blob: Option<Range<u64>>, entries: &mut Vec<u64>) -> ControlFlow<()> {
        let levels = &self.array.meta.sharding.levels;
        if levels.is_empty() {
            // An unsharded array: the "shard" is the chunk.
            let state = blob.map_or(ChunkState::Damaged, ChunkState::Stored);
            let chunk = self.coords;
            if chunk.starts_with(self.prefix) && self.array.in_bounds(chunk) {
                (self.visit)(chunk, state)?;
            }
            return ControlFlow::Continue(());
        }
        let index = match (&mut self.shard, blob) {
            // Once the shard was found replaced, the ranges this walk took from its outer index
            // mean nothing in the new version: the rest of it is listed as unreadable (a read
            // locates the chunk afresh) rather than from a mix of two versions.
            (Some(shard), Some(_)) if shard.changed => None,
            (Some(shard), Some(blob)) => {
                let need = (self.listing && depth == 0).then_some(Need::Only);
                self.shards.index(shard, &levels[depth], &blob, need).ok().filter(|_| !shard.changed)
            }
            _ => None,
        };
        let leaf = depth + 1 == levels.len();
        if leaf && self.indexes_only {
            return ControlFlow::Continue(());
        }
        for entry in 0..levels[depth].index.entries {
            #[cfg(test)]
            LEAF_ENTRIES.with(|n| n.set(n.get() + u64::from(leaf)));
            let found = index.as_ref().map(|i| i.chunk(entry));
            let state = match found {
                Some(Ok(None)) => continue,
                Some(Ok(Some(range))) if leaf => ChunkState::Stored(range),
                _ if leaf => ChunkState::Damaged,
                Some(Ok(Some(range))) => {
                    entries.push(entry);
                    self.level(depth + 1, Some(range), entries)?;
                    entries.pop();
                    continue;
                }
                _ => {
                    entries.push(entry);
                    self.level(depth + 1, None, entries)?;
                    entries.pop();
                    continue;
                }
            };
            entries.push(entry);
            let chunk = self.array.meta.sharding.chunk_of(self.coords, entries);
            entries.pop();
            if chunk.starts_with(self.prefix) && self.array.in_bounds(&chunk) {
                (self.visit)(&chunk, state)?;
            }
        }
        ControlFlow::Continue(())
    }
}

/// One log line per index version that has damaged entries, naming the first.
fn log_damaged_entries(shard: &OpenShard, index: &ShardIndex) {
    let mut damaged = (0..index.entries()).filter_map(|i| index.chunk(i).err());
    if let Some(first) = damaged.next() {
        log::warn!(
            "{}: {} damaged index entries ({first}); those chunks read as EIO",
            shard.store.describe(&shard.key),
            1 + damaged.count()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_asks_for_every_index_once_ahead_of_it() {
        let asked: Vec<usize> = (0..40).flat_map(|at| indexes_ahead(at, at == 0, 40)).collect();
        assert_eq!(asked, (0..40).collect::<Vec<_>>());
        let asked: Vec<usize> = (0..5).flat_map(|at| indexes_ahead(at, at == 0, 5)).collect();
        assert_eq!(asked, (0..5).collect::<Vec<_>>());
        // A batch of entries starting again where the last one stopped asks again (the store
        // fetches what it does not hold yet).
        assert_eq!(indexes_ahead(20, true, 40), 20..36);
    }

    #[test]
    fn listing_a_shards_chunks_goes_through_its_innermost_index_once() {
        // The walk that reads a shard's indexes first stops above the innermost level: going
        // through its every entry there too made `find` twice as slow (35f087a).
        let array = crate::view::array::test_array(&[64], &[1], &[64]);
        let dir = std::env::temp_dir().join(format!("shardfs-walk-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/c")).unwrap();
        let chunks: Vec<Option<[u8; 1]>> = (0..64).map(|i| Some([i as u8])).collect();
        let shard = crate::format::shard_index::assemble_shard(&array.meta.sharding.levels[0].index, &chunks);
        std::fs::write(dir.join("a/c/0"), shard).unwrap();
        let store = crate::store::local::LocalStore::open(&dir).unwrap();
        let shards = Shards::new(IndexCache::new(1 << 20));
        let mut visited = 0;
        LEAF_ENTRIES.with(|n| n.set(0));
        let _ = shards.for_each_chunk_of(&store, &array, &[0], &[], &Sources::default(), true, |_, _, _| {
            visited += 1;
            ControlFlow::Continue(())
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(visited, 64);
        assert_eq!(LEAF_ENTRIES.with(|n| n.get()), 64);
    }
}
