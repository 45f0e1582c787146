//! Filesystem operations on the view in plain types (inode numbers, [`Attr`], [`DirEntry`],
//! handles), so that they can be tested without FUSE. `fuse.rs` adapts them to the kernel.
//!
//! Inode numbers come from the view path (`inode_number.rs`). The table of paths the kernel holds
//! follows its lookup/forget counts, so memory follows the kernel's cache, not the size of the
//! store.
//!
//! An inode of a file stands for one version of its content. The kernel keeps pages and a size
//! per inode: were one inode to show a new version, the kernel could serve old pages cut to the
//! new size, a mix of two versions. So a lookup that finds a file at another version than the
//! inode the kernel holds for its name answers a new inode; the old one keeps its version's
//! attributes, and opening it fails with ESTALE, upon which the kernel looks the name up again
//! (the VFS retries a failed open once, revalidating every name). An open pins the version it
//! found: reads through it come from that version or fail. Files written through this mount are
//! not bound to a version: the kernel's pages hold what was written.

mod chunk_groups;
pub mod error;
mod freshness;
mod inode_number;
mod inode_table;
mod interned;
mod listing_attributes;
mod unopened;
mod write_ops;

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::metrics;
use crate::store::{Attr, Kind, OpenFile, Space, Stamp, Store, join};
use crate::view::array::ShardedArray;
use crate::view::error::Result as ViewResult;
use crate::view::index_cache::IndexCache;
use crate::view::namespace::{Answer, ChunkCursor, ChunkFiles, Namespace, Node};
use crate::view::overlay::{Buffer, NoOverlay};
use crate::view::presentation::Presentation;
use crate::view::reading::Reading;
use crate::view::sources::Sources;
use crate::write::pending::{COMMITTERS, Pending, Policy};
use chunk_groups::{chunk_number, is_computed};
use freshness::{Change, Freshness, Unwatched};
use inode_number::path_ino;
use inode_table::{Bound, InodeTable};
use listing_attributes::ListingAttributes;
use unopened::Unopened;

pub use error::{Error, Result};
pub use listing_attributes::Attributes;
pub use write_ops::OpenMode;

/// The root directory's inode number, fixed by FUSE.
pub const ROOT_INO: u64 = 1;

/// Looking up a file of a read-only mount whose version is replaced between the answer and the
/// open is tried this many times.
const LOOKUP_ATTEMPTS: u32 = 3;

/// One directory entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub name: String,
    pub kind: Kind,
}

/// A directory's listing while the kernel reads it: its node, the entries it had when read from
/// offset 0, and its chunk files, read as the listing is read (at directory offsets from
/// [`CHUNK_OFFSETS`] on).
///
/// Kept by directory inode, not by open handle: the kernel sends no opendir or releasedir
/// (zero-message opendir) and keeps a listing once read (`FOPEN_CACHE_DIR`), so a warm walk over
/// a thousand directories asks the daemon nothing. An opendir and a releasedir per directory, and
/// a listing at every opendir, made a warm `find` over 256 chunk directories 1.8x plain files. A
/// listing goes when the kernel reads past its end (its last call), when the directory is
/// forgotten, or when a read from offset 0 replaces it.
#[derive(Debug)]
struct DirListing {
    ino: u64,
    node: Node,
    path: String,
    entries: Vec<DirEntry>,
    chunk_files: Option<ChunkFiles>,
}

/// Directory offsets from here on stand for a [`ChunkCursor`]: shard position in bits 32..62,
/// chunks passed in that shard in bits 0..32. One index level holds at most 2^24 entries, so only
/// nested sharding can pass more than 2^32 chunks of one shard in one directory (with 64 GiB of
/// index); such a listing ends there.
const CHUNK_OFFSETS: u64 = 1 << 62;

fn chunk_offset(cursor: ChunkCursor) -> Option<u64> {
    let fits = (cursor.shard as u64) < 1 << 30 && cursor.skip <= u64::from(u32::MAX);
    fits.then_some(CHUNK_OFFSETS | ((cursor.shard as u64) << 32) | cursor.skip)
}

/// Where the chunk files resume after directory offset `offset`.
fn chunk_cursor(offset: u64) -> ChunkCursor {
    if offset < CHUNK_OFFSETS {
        return ChunkCursor::default();
    }
    ChunkCursor { shard: ((offset & !CHUNK_OFFSETS) >> 32) as usize, skip: offset & 0xffff_ffff }
}

/// The number a lookup of chunk file `name` of `dir` will give it, as a listing shows it: its
/// place in its shard version's group, else its path's.
fn listed_ino(dir: &DirListing, name: &str, node: &Node, answer: &ViewResult<Answer>) -> u64 {
    let grouped = match (node, answer) {
        (Node::Chunk { array, coords }, Ok(Answer { content: Some(stamp), place: Some(place), .. })) => {
            chunk_number(array, stamp, place, coords)
        }
        _ => None,
    };
    grouped.unwrap_or_else(|| path_ino(&join(&dir.path, name)))
}

/// `watched`, by what each inode or group is watched as, for each inode the kernel may hold.
fn each_member<T: Copy>(inodes: &InodeTable, watched: Vec<(u64, T)>) -> Vec<(u64, T)> {
    watched.into_iter().flat_map(|(n, what)| inodes.members(n).into_iter().map(move |ino| (ino, what))).collect()
}

/// An inode whose cached answers in the kernel are out of date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    pub ino: u64,
    /// Its directory's inode and its name, for a file whose very existence may have changed (a
    /// chunk or a document): the kernel forgets the name too. Directories keep their names, so
    /// that the kernel does not drop everything cached below them.
    pub entry: Option<(u64, String)>,
    /// What of the inode itself the kernel drops.
    pub content: Dropped,
}

/// What the kernel drops of an inode's own cached answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Nothing: only its name is out of date (it leads to a version replaced since).
    Nothing,
    /// Its attributes: nothing changed, but the kernel is to ask before it uses its pages
    /// again (which it drops then if their file changed).
    Attributes,
    /// Its attributes and pages (a directory's: its listing).
    Everything,
}

/// How a writable filesystem stores writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// When pending chunk writes are committed.
    pub policy: Policy,
    /// `--shard-new`: inner chunks per shard (one number: every dimension) for arrays created
    /// through the view, which are then stored sharded; `None` stores them as written.
    pub shard_new: Option<Vec<u64>>,
}

/// An open file.
#[derive(Debug)]
enum Handle {
    /// Opened for reading only.
    Read(Reading),
    /// A chunk opened for writing: its whole content, shared with the pending overlay, and the
    /// array as its document was when the file was opened.
    Chunk { array: Arc<ShardedArray>, coords: Vec<u64>, buffer: Buffer, append: bool },
    /// A store file shown as it is, opened for writing.
    Stored { file: Box<dyn OpenFile>, append: bool },
    /// A metadata document of the view (at this view path) opened for writing: stored,
    /// translated, when it is closed or fsync'd.
    /// `placeholder`: created by this handle, so the store holds an empty document until its
    /// content is stored; a refused content removes it again.
    Document { path: String, buffer: Mutex<Vec<u8>>, dirty: AtomicBool, append: bool, placeholder: AtomicBool },
}

/// The filesystem: a [`Namespace`] plus the inode and handle tables the kernel protocol needs,
/// and, when writable, the pending writes and their background committer.
#[derive(Debug)]
pub struct ShardFs {
    ns: Arc<Namespace>,
    pending: Option<Arc<Pending>>,
    /// `--shard-new`: inner chunks per shard for arrays created through the view.
    shard_new: Option<Vec<u64>>,
    stop_committer: Arc<AtomicBool>,
    /// Set when a document was stored through the view, until the watcher's next pass.
    document_stored: AtomicBool,
    inodes: Mutex<InodeTable>,
    freshness: Freshness,
    files: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Directory listings being read, by directory inode.
    listings: Mutex<HashMap<u64, Arc<DirListing>>>,
    /// Which readers' listings carry their files' attributes.
    listing_attributes: ListingAttributes,
    /// Read-only mounts: files opened at their lookup, for reads that come with no handle.
    unopened: Unopened,
    next_handle: AtomicU64,
}

impl ShardFs {
    /// A read-only filesystem over `store`, shown as `presentation` says.
    pub fn read_only(store: Arc<dyn Store>, presentation: Arc<dyn Presentation>, cache: IndexCache) -> Self {
        Self::build(Namespace::new(store, presentation, cache, Arc::new(NoOverlay)), None)
    }

    /// A writable filesystem over `store`: chunk writes are committed to shards as the options'
    /// policy says, shards past the threshold and idle ones by a background thread.
    pub fn writable(
        store: Arc<dyn Store>,
        presentation: Arc<dyn Presentation>,
        cache: IndexCache,
        options: WriteOptions,
    ) -> Self {
        let policy = options.policy;
        let pending = Arc::new(Pending::new(policy, !store.can_append()));
        let ns = Namespace::new(store, presentation, cache, pending.clone());
        let mut fs = Self::build(ns, Some(pending.clone()));
        fs.shard_new = options.shard_new;
        let tick = (policy.idle / 4).max(std::time::Duration::from_millis(50));
        for n in 0..COMMITTERS {
            let (stop, ns, pending) = (fs.stop_committer.clone(), fs.ns.clone(), pending.clone());
            std::thread::Builder::new()
                .name(format!("shardfs-commit-{n}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match pending.take_due(tick) {
                            // A failure stays with the shard for its next fsync or close.
                            Some(key) => drop(pending.commit_shard(&ns, &key)),
                            // One of them keeps time: idle shards, and idle files the store holds.
                            None if n == 0 => {
                                pending.idle_due();
                                ns.store().sync_idle(policy.idle);
                            }
                            None => {}
                        }
                    }
                })
                .expect("spawning a commit thread");
        }
        fs
    }

    fn build(ns: Namespace, pending: Option<Arc<Pending>>) -> Self {
        let inodes = InodeTable::new(ROOT_INO, ns.root());
        ShardFs {
            ns: Arc::new(ns),
            pending,
            shard_new: None,
            stop_committer: Arc::default(),
            document_stored: AtomicBool::new(false),
            inodes: Mutex::new(inodes),
            freshness: Freshness::default(),
            files: Mutex::default(),
            listings: Mutex::default(),
            listing_attributes: ListingAttributes::default(),
            unopened: Unopened::default(),
            next_handle: AtomicU64::new(1),
        }
    }

    fn node(&self, ino: u64) -> Result<Node> {
        self.inodes.lock().node(ino).ok_or(Error::BadHandle)
    }

    /// Finds `name` in directory `parent`; the kernel now holds one more reference to it.
    pub fn lookup(&self, parent: u64, name: &str) -> Result<(u64, Attr)> {
        let parent = self.node(parent)?;
        let mut attempt = 1;
        loop {
            let (node, answer) = self.ns.child(&parent, name)?;
            // The reads of a read-only mount come with no open: the version looked up is opened
            // now, so that it can still be read if it is replaced before they come. One replaced
            // between the answer and the open is looked up again.
            let held = match (self.is_read_only(), answer.attr.kind, answer.content) {
                (true, Kind::File, Some(stamp)) => match Reading::held(&self.ns, node.clone()) {
                    Ok(reading) if reading.version() == Some(stamp) => Some(reading),
                    Ok(_) if attempt < LOOKUP_ATTEMPTS => {
                        attempt += 1;
                        continue;
                    }
                    _ => None,
                },
                _ => None,
            };
            let ino = self.remember_told(node, &answer);
            if let Some(reading) = held {
                self.unopened.hold(ino, Arc::new(reading));
            }
            return Ok((ino, answer.attr));
        }
    }

    /// [`ShardFs::remember`] for a node whose attributes the kernel is about to be told: the
    /// inode is bound to the version of the content the answer describes.
    fn remember_told(&self, node: Node, answer: &Answer) -> u64 {
        let bound = answer.content.map(|stamp| Bound { stamp, attr: answer.attr });
        let ino = {
            let mut inodes = self.inodes.lock();
            let ino = inodes.remember(node, bound, answer.place.as_ref());
            metrics::inodes(inodes.len());
            ino
        };
        self.watch(ino, answer);
        ino
    }

    /// Watches the store files `answer` about `ino` was read from (its group's, for a chunk kept
    /// by group).
    fn watch(&self, ino: u64, answer: &Answer) {
        let watched = self.inodes.lock().watched_as(ino);
        self.freshness.watch(watched, &answer.sources, answer.geometry.as_ref());
    }

    /// [`ShardFs::remember_told`] for a file written through this mount.
    fn remember_written(&self, node: Node, answer: &Answer) -> u64 {
        let ino = self.remember(node, None);
        self.unbind(ino);
        self.watch(ino, answer);
        ino
    }

    /// True when inode `ino` of `node`, bound to version `from` of its content, may stand for
    /// version `to`: this mount's own commits replaced the one with the other without changing its
    /// chunk, so its bytes and size are the same. The inode is then bound to `to`.
    fn catch_up(&self, ino: u64, node: &Node, from: Stamp, to: Option<Stamp>) -> bool {
        let (Some(pending), Node::Chunk { array, coords }, Some(to)) = (&self.pending, node, to) else { return false };
        let Ok(Some(array)) = self.ns.array_at(&array.dir) else { return false };
        if !pending.kept_by_own_commits(&array, coords, from, to) {
            return false;
        }
        // Bound to yet another version meanwhile, or written through this mount: asked again.
        self.inodes.lock().rebound(ino, from, to)
    }

    /// Marks inode `ino` written through this mount: from now on it shows whatever the view holds.
    /// A computed file cannot be written (EROFS): it stays bound to its version.
    fn unbind(&self, ino: u64) {
        self.inodes.lock().unbind(ino);
    }

    /// True once a document was stored through the view since the last call: a pass of the
    /// watcher is due at once.
    pub fn document_stored(&self) -> bool {
        self.document_stored.swap(false, Ordering::Relaxed)
    }

    /// Stats every store file the kernel's cached answers were read from, and returns the inodes
    /// whose answers are out of date. Called periodically by the adapter, which invalidates them.
    /// Answers given `told_within` ago or longer are the kernel's to ask about again (it keeps
    /// them that long): their inodes stop being watched, their attributes and listings dropped.
    pub fn stale(&self, told_within: Duration) -> Vec<Stale> {
        // Collected first: the keys only lapsed inodes were read from are not asked about below.
        let lapsed: Vec<(u64, bool)> = self.freshness.lapsed(told_within);
        let stamp_of = |key: &str| self.ns.store().attr(key).ok().map(|a| a.stamp);
        // This mount's own commits change no byte the kernel holds: invalidating every cached
        // chunk of a committed shard would only cost lookups (and contend with the writer).
        for key in self.pending.as_ref().map(|p| p.take_committed()).unwrap_or_default() {
            self.freshness.rebase(&key, stamp_of(&key));
        }
        let keys = self.freshness.keys();
        self.ns.store().refresh(&keys.iter().map(|k| &**k).collect::<Vec<_>>());
        let source = self.ns.source();
        let classify = |key: &str, before: Option<Stamp>| match before {
            _ if !source.is_document(key) => Change::Content,
            Some(before) if self.ns.document_grew(key, before) => Change::Grew,
            _ => Change::Document,
        };
        let changed = self.freshness.changed(stamp_of, classify);
        let unwatched = self.freshness.take_unwatched();
        let inodes = self.inodes.lock();
        let entry_of = |path: &str| {
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
            inodes.find(parent).map(|p| (p, name.to_string()))
        };
        let changed = each_member(&inodes, changed).into_iter().filter_map(|(ino, document_changed)| {
            let path = inodes.path(ino)?;
            // Files go with their names, which may now stand for nothing or for another file.
            // So does every entry whose metadata document changed: its path may now be a chunk
            // of a new array, or a plain file, and the next lookup classifies it afresh. Store
            // directories otherwise keep their names, so that the kernel does not drop all it
            // holds below one each time a file is added to it.
            // A file bound to a version goes too: its name now leads to the new version's inode.
            let goes = document_changed || !inodes.is_stored(ino) || inodes.bound(ino).is_some();
            Some(Stale { ino, entry: goes.then(|| entry_of(&path)).flatten(), content: Dropped::Everything })
        });
        let unwatched = each_member(&inodes, unwatched).into_iter().filter_map(|(ino, what)| {
            let path = inodes.path(ino)?;
            match what {
                // Only while the name still leads to it: once looked up again to a newer inode,
                // dropping the name would cost that inode its pages and, were the kernel to
                // forget it, the file held open for its reads. A chunk kept by group cannot be
                // told from a newer one by its name: its name goes (costing the newer its pages).
                Unwatched::Name if inodes.find(&path) == Some(ino) || is_computed(ino) => {
                    Some(Stale { ino, entry: Some(entry_of(&path)?), content: Dropped::Nothing })
                }
                Unwatched::Name => None,
                Unwatched::Attributes => Some(Stale { ino, entry: None, content: Dropped::Everything }),
            }
        });
        let lapsed = each_member(&inodes, lapsed).into_iter().map(|(ino, listed)| {
            let content = if listed { Dropped::Everything } else { Dropped::Attributes };
            Stale { ino, entry: None, content }
        });
        changed.chain(unwatched).chain(lapsed).collect()
    }

    /// The inode of `node` at content version `bound`, with one more kernel reference.
    fn remember(&self, node: Node, bound: Option<Bound>) -> u64 {
        let mut inodes = self.inodes.lock();
        let ino = inodes.remember(node, bound, None);
        metrics::inodes(inodes.len());
        ino
    }

    /// After a rename, the kernel knows the renamed file by its old inode under the new name, and
    /// the names below a renamed directory by their old inodes: they now stand for the files at
    /// their new places. Answers are watched again when the kernel next asks for attributes, as
    /// the next pass has it do.
    fn rebind(&self, from_path: &str, to: &Node, is_dir: bool) {
        for ino in self.inodes.lock().rebind(from_path, to, is_dir) {
            self.freshness.unwatch_until_dropped(ino, Unwatched::Attributes);
        }
    }

    /// `path` was unlinked: a file made there later is another inode.
    fn detach(&self, path: &str) {
        self.inodes.lock().detach(path);
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut inodes = self.inodes.lock();
        if ino == ROOT_INO {
            return;
        }
        let forgotten = inodes.forget(ino, n);
        metrics::inodes(inodes.len());
        // Under the table's lock: once the number is free, a lookup of the same path takes it
        // for a new inode, whose watch and held file must not go with the old one's. (The kernel
        // forgets a chunk inode of a group all at once, though the group stays.)
        if let Some(watched) = forgotten {
            self.freshness.unwatch(watched);
        }
        if forgotten.is_some() || is_computed(ino) {
            self.unopened.forget(ino);
        }
        if forgotten.is_some() {
            self.listings.lock().remove(&ino);
        }
    }

    /// Number of directory listings kept between the kernel's reads of them.
    pub fn listings_kept(&self) -> usize {
        self.listings.lock().len()
    }

    /// Number of inodes the kernel holds references to (of references, for chunk inodes kept by
    /// group).
    pub fn known_inodes(&self) -> usize {
        self.inodes.lock().len()
    }

    /// The attributes of `ino`: of its own version, for an inode bound to one that was replaced
    /// (its name now leads to another inode).
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        let answer = self.ns.answer(&node)?;
        let own = {
            let inodes = self.inodes.lock();
            inodes.own_version(ino, &answer).zip(inodes.bound(ino).map(|b| b.stamp))
        };
        if let Some((own, stamp)) = own
            && !self.catch_up(ino, &node, stamp, answer.content)
        {
            let watched = self.inodes.lock().watched_as(ino);
            self.freshness.unwatch_until_dropped(watched, Unwatched::Name);
            return Ok(own);
        }
        self.watch(ino, &answer);
        Ok(answer.attr)
    }

    /// The listing of directory `ino` for a read from `offset`: read afresh from the store at
    /// offset 0 (or when the one being read is gone), else the one being read, so that offsets
    /// stay positions in one listing. Chunk files are read shard by shard as the listing is read.
    fn dir_listing(&self, ino: u64, offset: u64) -> Result<Arc<DirListing>> {
        if offset != 0
            && let Some(listing) = self.listings.lock().get(&ino)
        {
            return Ok(listing.clone());
        }
        let (node, path) = {
            let inodes = self.inodes.lock();
            (inodes.node(ino).ok_or(Error::BadHandle)?, inodes.path(ino).ok_or(Error::BadHandle)?)
        };
        let sources = Sources::default();
        let listing = self.ns.list_from(&node, &sources)?;
        // The kernel keeps the listing: it is watched like any other answer.
        self.freshness.watch_listing(ino, sources.into_vec());
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let mut entries = Vec::with_capacity(listing.entries.len() + 2);
        entries.push(DirEntry { ino, name: ".".into(), kind: Kind::Dir });
        entries.push(DirEntry { ino: path_ino(parent), name: "..".into(), kind: Kind::Dir });
        entries.extend(listing.entries.into_iter().map(|(name, kind)| DirEntry {
            ino: path_ino(&join(&path, &name)),
            name,
            kind,
        }));
        let listing = Arc::new(DirListing { ino, node, path, entries, chunk_files: listing.chunk_files });
        self.listings.lock().insert(ino, listing.clone());
        Ok(listing)
    }

    /// Drops `listing` once read to its end (unless a newer one took its place).
    fn listing_read(&self, listing: &Arc<DirListing>) {
        let mut listings = self.listings.lock();
        if listings.get(&listing.ino).is_some_and(|kept| Arc::ptr_eq(kept, listing)) {
            listings.remove(&listing.ino);
        }
    }

    /// Passes the chunk files of `dir` from directory offset `offset` on to `visit`, with the
    /// offset after each; the shards read join the listing's watched sources.
    fn chunk_files(
        &self,
        dir: &DirListing,
        offset: u64,
        mut visit: impl FnMut(&str, Node, ViewResult<Answer>, u64) -> ControlFlow<()>,
    ) {
        let Some(files) = &dir.chunk_files else { return };
        let sources = Sources::default();
        self.ns.chunk_files(files, chunk_cursor(offset), &sources, |name, node, attr, next| match chunk_offset(next) {
            Some(next) => visit(name, node, attr, next),
            None => {
                log::warn!("{}: listing ends after 2^32 chunks of one shard", dir.path);
                ControlFlow::Break(())
            }
        });
        self.freshness.watch_listing(dir.ino, sources.into_vec());
    }

    /// Passes the entries of directory `ino` from position `offset` to `add`, with the offset
    /// of the entry after each, until `add` says the reply is full.
    pub fn readdir(&self, ino: u64, offset: u64, mut add: impl FnMut(&DirEntry, u64) -> bool) -> Result<()> {
        let dir = self.dir_listing(ino, offset)?;
        let mut taken = false;
        let mut add = |entry: &DirEntry, next| {
            let full = add(entry, next);
            taken |= !full;
            full
        };
        for (i, entry) in dir.entries.iter().enumerate().skip(offset as usize) {
            if add(entry, i as u64 + 1) {
                return Ok(());
            }
        }
        let mut full = false;
        self.chunk_files(&dir, offset, |name, node, answer, next| {
            let entry =
                DirEntry { ino: listed_ino(&dir, name, &node, &answer), name: name.to_string(), kind: Kind::File };
            full = add(&entry, next);
            if full { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        if !full && !taken {
            self.listing_read(&dir);
        }
        Ok(())
    }

    /// [`ShardFs::readdir`] that also passes each entry's attributes, sparing the kernel one
    /// lookup per entry (`ls -l`, `du`): [`ShardFs::readdirplus_with`] with [`Attributes::All`].
    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        add: impl FnMut(&DirEntry, Option<&Attr>, u64) -> bool,
    ) -> Result<()> {
        self.readdirplus_with(ino, offset, Attributes::All, add)
    }

    /// [`ShardFs::readdir`] that also passes the attributes of the entries `attributes` says. The
    /// kernel holds a reference to every entry passed with attributes but `.` and `..`; one passed
    /// with `None` it takes by name alone (node id 0), and caches nothing for: an entry
    /// `attributes` leaves out, or one whose attributes cannot be had (a chunk of a damaged shard,
    /// which the next stat must ask for again to get its error). Entries to be passed with
    /// attributes that are gone since the listing was read are skipped; those passed by name are
    /// passed as [`ShardFs::readdir`] passes them.
    pub fn readdirplus_with(
        &self,
        ino: u64,
        offset: u64,
        attributes: Attributes,
        mut add: impl FnMut(&DirEntry, Option<&Attr>, u64) -> bool,
    ) -> Result<()> {
        let dir = self.dir_listing(ino, offset)?;
        let mut taken = false;
        let mut add = |entry: &DirEntry, attr: Option<&Attr>, next| {
            let full = add(entry, attr, next);
            taken |= !full;
            full
        };
        // Tells the kernel of one entry; true when its reply is full.
        let add: &mut dyn FnMut(&DirEntry, Option<&Attr>, u64) -> bool = &mut add;
        let with_attr = |kind: Kind| attributes == Attributes::All || kind == Kind::Dir;
        let pass = |add: &mut dyn FnMut(&DirEntry, Option<&Attr>, u64) -> bool,
                    entry: &DirEntry,
                    node: Node,
                    answer: ViewResult<Answer>,
                    next: u64|
         -> bool {
            let Ok(answer) = answer else {
                return add(entry, None, next);
            };
            let ino = self.remember_told(node, &answer);
            let full = add(&DirEntry { ino, ..entry.clone() }, Some(&answer.attr), next);
            if full {
                // The kernel did not take this entry, so it holds no reference to it.
                self.forget(ino, 1);
            }
            full
        };
        for (i, entry) in dir.entries.iter().enumerate().skip(offset as usize) {
            let next = i as u64 + 1;
            if entry.name == "." || entry.name == ".." || !with_attr(entry.kind) {
                // The kernel takes neither attributes nor a reference for `.` and `..`.
                if add(entry, None, next) {
                    return Ok(());
                }
                continue;
            }
            match self.ns.entry(&dir.node, &entry.name) {
                Ok((node, answer)) => {
                    if pass(add, entry, node, answer, next) {
                        return Ok(());
                    }
                }
                Err(e) => log::debug!("readdirplus: {}: {e}", entry.name),
            }
        }
        let mut full = false;
        self.chunk_files(&dir, offset, |name, node, answer, next| {
            let entry =
                DirEntry { ino: listed_ino(&dir, name, &node, &answer), name: name.to_string(), kind: Kind::File };
            full = match with_attr(Kind::File) {
                true => pass(add, &entry, node, answer, next),
                false => add(&entry, None, next),
            };
            if full { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        if !full && !taken {
            self.listing_read(&dir);
        }
        Ok(())
    }

    /// What a listing of directory `dir` read by thread `reader` carries (`listing_attributes.rs`).
    pub fn listing_attributes(&self, reader: u32, dir: u64) -> Attributes {
        self.listing_attributes.for_listing(reader, dir, self.known_inodes())
    }

    /// A reply of a listing of directory `dir` read by thread `reader` gave `with` files with
    /// their attributes and `without` by name alone.
    pub fn listing_gave(&self, reader: u32, dir: u64, with: usize, without: usize) {
        self.listing_attributes.gave(reader, dir, with, without);
    }

    /// Thread `reader` looked up an entry of kind `kind` in directory `parent`: a file looked up
    /// in a directory it listed tells that it stats what it lists.
    pub fn looked_up_by(&self, reader: u32, parent: u64, kind: Kind) {
        if kind != Kind::Dir {
            self.listing_attributes.looked_up(reader, parent);
        }
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(handle));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.files.lock().get(&fh).cloned().ok_or(Error::BadHandle)
    }

    /// True when the filesystem rejects every write.
    pub fn is_read_only(&self) -> bool {
        self.pending.is_none()
    }

    /// Reads file `ino` with no open handle (a read-only mount answers no open): from the
    /// version its inode is bound to, as an open of it would, so the bytes agree with the size and
    /// pages the kernel holds for that inode: through the file opened at its lookup while that is
    /// held, else opened now (ESTALE once that version was replaced).
    pub fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let bound = self.inodes.lock().bound(ino).map(|b| b.stamp);
        let held = bound.and_then(|stamp| self.unopened.get(ino, stamp));
        let reading = match held {
            Some(reading) => reading,
            None => {
                let reading = Arc::new(self.open_reading(ino, self.node(ino)?)?);
                self.unopened.hold(ino, reading.clone());
                reading
            }
        };
        Ok(reading.read(&self.ns, offset, size)?)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        match &*self.handle(fh)? {
            Handle::Read(reading) => Ok(reading.read(&self.ns, offset, size)?),
            Handle::Chunk { buffer, .. } => {
                let buffer = buffer.read();
                let start = (offset as usize).min(buffer.len());
                let end = start.saturating_add(size as usize).min(buffer.len());
                Ok(buffer[start..end].to_vec())
            }
            Handle::Document { buffer, .. } => {
                let buffer = buffer.lock();
                let start = (offset as usize).min(buffer.len());
                let end = start.saturating_add(size as usize).min(buffer.len());
                Ok(buffer[start..end].to_vec())
            }
            Handle::Stored { file, .. } => {
                let mut buf = vec![0; size as usize];
                let n = file.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok(buf)
            }
        }
    }

    pub fn release(&self, fh: u64) {
        let Some(handle) = self.files.lock().remove(&fh) else { return };
        if let Err(e) = self.store_if_dirty(&handle) {
            log::warn!("closing a file: {e}");
        }
        let closed = match (&*handle, &self.pending) {
            (Handle::Chunk { array, coords, .. }, Some(pending)) => Some((pending, array.clone(), coords.clone())),
            _ => None,
        };
        // Once the handle is gone the chunk's buffer is the pending write's alone.
        drop(handle);
        if let Some((pending, array, coords)) = closed {
            pending.closed(&array, &coords);
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        Ok(self.ns.read_link(&self.node(ino)?)?.as_os_str().as_bytes().to_vec())
    }

    pub fn statfs(&self) -> Result<Space> {
        Ok(self.ns.space()?)
    }
}

impl Drop for ShardFs {
    fn drop(&mut self) {
        self.stop_committer.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_cursors_survive_the_trip_through_a_directory_offset_or_end_the_listing() {
        for cursor in [ChunkCursor { shard: 0, skip: 1 }, ChunkCursor { shard: (1 << 30) - 1, skip: u32::MAX.into() }] {
            assert_eq!(chunk_cursor(chunk_offset(cursor).unwrap()), cursor);
        }
        assert_eq!(chunk_offset(ChunkCursor { shard: 0, skip: 1 << 32 }), None);
        assert_eq!(chunk_offset(ChunkCursor { shard: 1 << 30, skip: 0 }), None);
        assert_eq!(chunk_cursor(7), ChunkCursor::default());
    }
}
