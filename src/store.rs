//! The backing store, behind one seam: the [`Store`] trait, over `/`-separated keys relative to
//! the store's root (`""` is the root), never paths. Everything above this layer reaches the
//! backing store only through it.
//!
//! - [`local`]: a directory on a local filesystem, confined with `openat2`, locked with OFD locks.
//! - [`scratch`]: a wrapper that holds the temporary files made inside chunk-key directories in
//!   memory (over [`local`], which would write them to disk).
//! - [`held`]: plain files held in memory ([`scratch`]'s, an Icechunk branch's).
//! - [`blz`]: a directory of BLZ data (Bloscpack files, bcolz directories) as a read-only store of
//!   sharded Zarr v3 arrays, with synthesized documents.
//! - [`bucket`]: a prefix of an object store bucket (S3 and compatibles), with conditional writes
//!   and no appends; or a path of a web server (`https://`), read-only.
//! - [`lock`]: lock slots of shard keys, and the in-process stripes that keep readers off a shard
//!   this process is appending to.
//! - [`unlisted`]: a store whose server answers lookups by name but cannot list (a plain web
//!   server), with directories derived from the Zarr documents it holds.
//! - [`read_only`]: the half of [`Store`] a store nothing can be written to implements (the
//!   other half fails with EROFS).
//! - [`zip`]: a zip file in another store (an OME-Zarr `.ozx`, zarr-python's `ZipStore`) as a
//!   read-only store of its entries.
//! - [`icechunk`]: one version (branch, tag or snapshot) of an Icechunk repository as a read-only
//!   store: each node's `zarr.json`, each chunk inline, native or virtual.
//! - [`icechunk_branch`]: a branch of an Icechunk repository as a writable store: writes become
//!   commits of a session of the `icechunk` crate, rebased by [`icechunk_rebase`].
//! - [`database`]: a database of Zarr keys (zarr-python 2's `SQLiteStore`) as an object store,
//!   served through [`bucket`].
//! - [`references`]: a kerchunk reference set (JSON or parquet) as a read-only store of the keys
//!   it describes, read from the files it refers to.
//! - [`targets`]: the stores the files that references name are read from, by URL.
//! - [`range`]: a range of another file as a file of its own.
//! - [`key_tree`]: the directories a flat set of keys implies (zip entries, references).
//! - [`cache`]: a byte-bounded cache of values made from one file version.
//! - [`faulty`]: a wrapper that stops every write after a given number of bytes, for crash tests.
//! - [`conformance`]: the checks every implementation passes.
//! - [`world`]: the clock, pauses and threads of machines taking turns through an [`exchange`],
//!   real or simulated.
//!
//! A store reads byte ranges of an opened file version ([`Object`]), lists directories with their
//! version, writes whole files atomically and durably ([`Store::put`], optionally only over a
//! given version or only where nothing is), deletes and renames, and takes advisory locks. A store
//! that [`Store::can_append`] also opens files for writing in place ([`OpenFile`]), which the
//! journaled append commit needs.

pub mod blz;
pub mod bucket;
pub mod cache;
pub mod conformance;
pub mod database;
pub mod exchange;
pub mod faulty;
pub mod held;
pub mod icechunk;
pub mod icechunk_branch;
pub mod icechunk_rebase;
pub mod key_tree;
pub mod local;
pub mod lock;
pub mod memory_budget;
pub mod range;
pub mod read_only;
pub mod references;
pub mod scratch;
pub mod targets;
pub mod unlisted;
pub mod world;
pub mod zip;

use std::fmt::Debug;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub use bucket::BucketStore;
pub use local::LocalStore;

/// The directory at the store root where shardfs keeps its own files (journal, locks, temporary
/// shards). Zarr readers never look at it, and the view does not show it.
pub const PRIVATE_DIR: &str = "__shardfs";

/// Where the view keeps files made inside chunk-key directories (an atomic writer's temporary
/// file), which exist only in the view until renamed onto a chunk key. A store that holds files
/// before storing them (an object store) keeps these in the process alone.
pub const SCRATCH_DIR: &str = "__shardfs/scratch";

/// File type of a store entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// The identity and version of a store entry, opaque to everything above the store: equal stamps
/// mean the same version, and data cached from one is stale once the entry's stamp differs. A
/// local store makes it of the file's device, inode, size and times; an object store can make it
/// of the object's ETag or generation and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp([u64; 5]);

impl Stamp {
    /// A stamp of the store's own making.
    pub fn new(words: [u64; 5]) -> Self {
        Stamp(words)
    }

    /// The words a store made this stamp of (with [`Stamp::new`]), for that store to read back.
    pub fn words(&self) -> [u64; 5] {
        self.0
    }

    /// The stamp of a file the view computes (the consolidated metadata), made of `from`: its
    /// bytes.
    pub fn computed(from: impl std::hash::Hash) -> Stamp {
        Stamp([0; 5]).derived(from)
    }

    /// The stamp of a part of this version (an entry of a zip file): it changes when this does.
    pub fn derived(&self, part: impl std::hash::Hash) -> Stamp {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let word = |k: u64| {
            let mut h = DefaultHasher::new();
            (k, self.0, &part).hash(&mut h);
            h.finish()
        };
        Stamp([word(0), word(1), word(2), word(3), word(4)])
    }
}

/// What the view needs to know of one store entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attr {
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub stamp: Stamp,
}

impl Attr {
    /// A directory inside the file these attributes are of (a zip's, a reference set's, a
    /// repository's): readable and enterable wherever the file is readable, its version derived
    /// from the file's and `part`.
    pub fn dir_inside(&self, part: impl std::hash::Hash) -> Attr {
        let readable = self.perm & 0o444;
        Attr {
            kind: Kind::Dir,
            size: 0,
            perm: readable | (readable >> 2),
            nlink: 2,
            stamp: self.stamp.derived(part),
            ..*self
        }
    }

    /// A file of `size` bytes inside the file these attributes are of, read-only, its version
    /// derived from the file's and `part`.
    pub fn file_inside(&self, size: u64, part: impl std::hash::Hash) -> Attr {
        Attr { kind: Kind::File, size, perm: self.perm & 0o444, nlink: 1, stamp: self.stamp.derived(part), ..*self }
    }
}

/// Space figures of the filesystem under the store, for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Space {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Why a store operation failed. Each error names the key as the store shows it (a local path, a
/// URL), so that a message built from it needs no more context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// A conditional [`Store::put`] found the key at another version, or present.
    #[error("{0}: changed by someone else since it was read")]
    Changed(String),
    #[error("{place}: {source}")]
    Io { place: String, source: io::Error },
    /// Stopped by [`faulty::FaultyStore`], as a killed process would be.
    #[error("{0}: stopped by an injected crash")]
    Crashed(String),
}

impl Error {
    /// The error of an I/O call on `place`; a missing entry becomes [`Error::NotFound`].
    pub fn io(place: String, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound { Error::NotFound(place) } else { Error::Io { place, source } }
    }

    /// The operating system's error number, when the failure had one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::NotFound(_) => Some(libc::ENOENT),
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Changed(_) | Error::Crashed(_) => None,
        }
    }

    /// The same error again, for each caller who waited on one request.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::NotFound(place) => Error::NotFound(place.clone()),
            Error::Changed(place) => Error::Changed(place.clone()),
            Error::Crashed(place) => Error::Crashed(place.clone()),
            Error::Io { place, source } => {
                let source = match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                };
                Error::Io { place: place.clone(), source }
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// How [`Store::put`] may replace what is at the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// Whatever is there.
    Overwrite,
    /// Only if nothing is there ([`Error::Changed`] otherwise).
    Create,
    /// Only if the key is still at this version ([`Error::Changed`] otherwise).
    Update(Stamp),
}

/// How [`Store::open_file`] opens a file for writing in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenHow {
    /// Create the file with these permission bits if it is missing.
    pub create: Option<u32>,
    /// Cut the file to nothing first.
    pub truncate: bool,
}

/// What to do with a file opened in the background ([`Store::prefetch`]).
pub type Then = Box<dyn FnOnce(&dyn Object) + Send>;

/// What a reader announcing a range ([`Object::will_need`]) goes on to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Perhaps more in order (a reader of an array's chunks, one after another): once such reads
    /// follow each other, the rest of the object may be fetched ahead of them.
    InOrder,
    /// That range alone (a writer reading the chunk it is about to change): its next reads are
    /// no sign of a reader going on in order.
    Alone,
    /// That range and nothing else, not even the rest of a small object fetched whole at its
    /// first read (a commit reading the index of a shard it extends by copy: the store keeps its
    /// chunks, which never cross the network).
    Only,
}

/// One version of a file, opened for reading: every read comes from that version.
pub trait Object: Send + Sync + Debug {
    /// The attributes of the version opened.
    fn attr(&self) -> &Attr;

    /// Reads into `buf` from `offset`; fewer bytes only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;

    /// The `len` bytes at `offset`; an error when the file is shorter.
    fn read_exact_at(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0; len as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match self.read_at(&mut buf[filled..], offset + filled as u64)? {
                0 => {
                    let short = io::Error::new(io::ErrorKind::UnexpectedEof, "file is shorter than expected");
                    return Err(Error::Io { place: self.place(), source: short });
                }
                n => filled += n,
            }
        }
        Ok(buf)
    }

    /// How the file is named in messages.
    fn place(&self) -> String;

    /// The version's entity tag as its server names it (an object's ETag), for references that
    /// recorded one; `None` where the store has none.
    fn e_tag(&self) -> Option<String> {
        None
    }

    /// A hint that `range` will be read soon (as posix_fadvise's WILLNEED): a store whose reads
    /// cost a round trip fetches all of it at the first read there, and, as [`Need`] says,
    /// perhaps what follows. Reads are correct without it.
    fn will_need(&self, _range: Range<u64>, _need: Need) {}

    /// A hint that `range`, and likely what follows it, will be read soon by someone else: a store
    /// whose reads cost a round trip starts fetching it now, in the background.
    fn prefetch(&self, _range: Range<u64>) {}
}

/// Bytes held in memory (a synthesized document, an inflated entry), as an opened file.
#[derive(Debug)]
pub struct BytesObject {
    pub attr: Attr,
    pub bytes: Arc<[u8]>,
    pub place: String,
}

impl Object for BytesObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let start = (offset as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - start);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        Ok(n)
    }

    fn place(&self) -> String {
        self.place.clone()
    }
}

/// A file opened for writing in place (stores that [`Store::can_append`]).
pub trait OpenFile: Send + Sync + Debug {
    /// Its attributes now.
    fn attr(&self) -> Result<Attr>;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;
    /// Writes all of `data` at `offset`.
    fn write_at(&self, data: &[u8], offset: u64) -> Result<()>;
    /// Writes all of `data` at the end of the file.
    fn append(&self, data: &[u8]) -> Result<()>;
    fn set_len(&self, len: u64) -> Result<()>;
    /// Makes the file's data and attributes durable.
    fn sync(&self) -> Result<()>;
}

/// A held advisory lock; dropping it releases the lock (in the thread that took it).
pub trait Lock: Debug {}

/// A backing store.
pub trait Store: Send + Sync + Debug {
    /// How messages name `key`: a local path, a URL.
    fn describe(&self, key: &str) -> String;

    /// Where a program other than shardfs reads the file at `key`: an absolute path for a local
    /// store, `s3://BUCKET/KEY` for an object store (for reference files, `shardfs refs`).
    fn url(&self, key: &str) -> String;

    /// Attributes of the entry at `key` (a symbolic link is reported, not followed).
    fn attr(&self, key: &str) -> Result<Attr>;

    /// True when the entry at `key` is still the version `stamp`; may answer `false` when it
    /// cannot tell cheaply (the caller then asks [`Store::attr`]).
    fn is_unchanged(&self, key: &str, stamp: &Stamp) -> bool {
        self.attr(key).is_ok_and(|attr| attr.stamp == *stamp)
    }

    /// The names and kinds in directory `dir`, with the directory's version (taken before its
    /// entries are read, so that a change while listing shows as a newer version). Names that are
    /// not UTF-8 are left out with a log line.
    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)>;

    /// Opens the current version of the file at `key` for reading.
    fn open(&self, key: &str) -> Result<Box<dyn Object>>;

    /// The bytes `range` of the file at `key`, opened as a file of its own, for files that never
    /// change once written (an Icechunk repository's chunk objects, named by ID): a store whose
    /// every question costs a round trip asks nothing before the first read, and reads from
    /// whatever version is there. A range past the file's end is an error (at open, or at the
    /// read where the store finds it).
    fn open_range(&self, key: &str, range: Range<u64>) -> Result<Box<dyn Object>> {
        let file = self.open(key)?;
        let place = self.describe(key);
        if range.end > file.attr().size || range.start > range.end {
            let why = format!("bytes {}..{} wanted of a file {} bytes long", range.start, range.end, file.attr().size);
            return Err(read_only::damaged(place, why));
        }
        let attr = Attr { size: range.end - range.start, ..*file.attr() };
        Ok(Box::new(range::RangeObject::new(attr, range, file, place)))
    }

    /// About to ask for the attributes of every one of `keys`: a store whose every question
    /// costs a round trip and that can answer many at once (an object store listing below them)
    /// does so now, and [`Store::attr`] answers from that. A hint.
    fn refresh(&self, _keys: &[&str]) {}

    /// Opens `key` in the background where opening and reading cost round trips, and hands the
    /// file to `then`, to say what of it will be read ([`Object::prefetch`]); where reads are local,
    /// nothing. A hint: a missing file or a failure is no one's concern.
    fn prefetch(&self, _key: &str, _then: Then) {}

    /// The whole content of the file at `key`.
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let object = self.open(key)?;
        object.read_exact_at(0, object.attr().size)
    }

    /// The whole content of the file at `key`, which never changes once written (an Icechunk
    /// repository's snapshot or manifest, named by its ID), asked of the server itself: a store that
    /// remembers what it has seen (an object store's listings) may remember the file's absence from
    /// before it was written, and something that names it says it is there now.
    fn read_written_once(&self, key: &str) -> Result<Vec<u8>> {
        self.read(key)
    }

    /// The target of the symbolic link at `key`, as stored.
    fn read_link(&self, key: &str) -> Result<PathBuf>;

    /// Space figures of what holds the store.
    fn space(&self) -> Result<Space>;

    /// Replaces the file at `key` with `pieces` back to back, atomically (a reader sees the old
    /// file or the new one) and durably, creating missing directories above it. Returns the
    /// version written when the store can name it exactly (a local file's, an object's ETag the
    /// server answered), which is then the version a later open of `key` finds, unless another
    /// writer replaced it meanwhile.
    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>>;

    /// Removes the file at `key`, durably.
    fn delete(&self, key: &str) -> Result<()>;

    /// Removes the file at `key` if it is still at version `stamp` ([`Error::Changed`] otherwise),
    /// durably, and says whether it did. A store whose locks reach every writer (a local store's
    /// OFD locks) checks the version under the caller's lock; a store that cannot remove only a
    /// given version (an object store: its delete is unconditional, its locks this process's)
    /// removes nothing and answers false.
    fn delete_version(&self, key: &str, stamp: &Stamp) -> Result<bool> {
        if self.attr(key)?.stamp != *stamp {
            return Err(Error::Changed(self.describe(key)));
        }
        self.delete(key).map(|()| true)
    }

    /// Removes the file at `key`, not necessarily durably: after a crash it may be there again
    /// (for files whose return is harmless, as a finished append's journal record).
    fn discard(&self, key: &str) -> Result<()> {
        self.delete(key)
    }

    /// The content of the file at `key`, which is removed: a file renamed onto a chunk key becomes
    /// a pending chunk. A store that holds the file in memory hands its bytes over, uncopied.
    fn take(&self, key: &str) -> Result<Vec<u8>> {
        let content = self.read(key)?;
        self.delete(key)?;
        Ok(content)
    }

    /// Moves the file at `from` to `to`, replacing a file there, atomically and durably.
    fn rename(&self, from: &str, to: &str) -> Result<()>;

    /// Gives the file at `from` the second name `to`, durably; [`Error::Changed`] when `to` exists.
    /// zarr-python creates a key exclusively this way (link(2) of a temporary file, then unlink).
    /// A store without links stores a copy made with one conditional [`Store::put`].
    fn link(&self, from: &str, to: &str) -> Result<()> {
        let content = self.read(from)?;
        self.put(to, &[&content], PutMode::Create).map(drop)
    }

    /// Makes directory `key` with permission bits `mode`.
    fn make_dir(&self, key: &str, mode: u32) -> Result<()>;

    /// Makes directory `key` and the missing ones above it.
    fn make_dirs(&self, key: &str) -> Result<()>;

    /// Removes the empty directory `key`.
    fn remove_dir(&self, key: &str) -> Result<()>;

    /// True when files can be opened for writing in place ([`Store::open_file`]) and appended to.
    fn can_append(&self) -> bool;

    /// Whether [`Store::put_extending`] can make a new version of a file that keeps its first
    /// `kept` bytes: it copies them inside the store (an object store's server-side copy), so
    /// that a new version costs only its new bytes on the network.
    fn can_keep(&self, kept: u64) -> bool {
        let _ = kept;
        false
    }

    /// Replaces the file at `key`, only while it is at version `over` ([`Error::Changed`]
    /// otherwise, and when that version is gone), with its first `kept` bytes as they are in
    /// `over`, copied inside the store, then `tail`; atomically and durably, as [`Store::put`].
    /// `note`, when not empty, is stored with the version written in the same write (read back
    /// with [`exchange::Exchange::note`]). Only where [`Store::can_keep`] allows `kept`.
    fn put_extending(&self, key: &str, over: &Stamp, kept: u64, tail: &[&[u8]], note: &str) -> Result<Option<Stamp>> {
        let _ = (over, kept, tail, note);
        Err(Error::Io { place: self.describe(key), source: io::Error::from(io::ErrorKind::Unsupported) })
    }

    /// Where many machines writing this store take turns, when its own locks reach no further
    /// than this process and its server can make writes conditional (an object store).
    fn exchange(&self) -> Option<&dyn exchange::Exchange> {
        None
    }

    /// Opens the file at `key` for writing in place.
    fn open_file(&self, key: &str, how: OpenHow) -> Result<Box<dyn OpenFile>>;

    /// Takes the exclusive lock of lock slot `slot` (see [`lock::slot`]), waiting for it: two
    /// processes, or two threads, never hold one slot at once.
    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>>;

    /// Makes durable every file written through [`Store::open_file`] and not yet synced, where the
    /// store holds them until then (an object store).
    fn sync_all(&self) -> Result<()> {
        Ok(())
    }

    /// True when the store makes nothing durable but everything at once (an Icechunk branch, where
    /// one commit holds all a mount changed): `fsync` of any file is then [`Store::sync_all`] of
    /// every pending write. Elsewhere each file is durable once stored.
    fn syncs_as_one(&self) -> bool {
        false
    }

    /// [`Store::sync_all`] for the files no write has changed for `idle`; failures are logged, and
    /// left for the next sync to report.
    fn sync_idle(&self, _idle: std::time::Duration) {}

    /// Checks, before a writable mount, that the store keeps the promises commits rely on (an
    /// object store asks its server to refuse a conditional write that must fail).
    fn check_writes(&self) -> Result<()> {
        Ok(())
    }

    /// Removes what interrupted writes of processes that are gone left behind (a local store's
    /// temporary files), never what a live process is still writing; returns what it removed.
    fn clean_up(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// After a clean unmount: removes what of [`PRIVATE_DIR`] holds nothing (empty directories,
    /// and a lock file no process holds a lock in), so that a store left alone has no trace of
    /// shardfs. Never a file in use: what another live process (a second mount) keeps there
    /// stays, and so does the directory holding it. Stores without directories have nothing to do.
    fn tidy_private_dir(&self) -> Result<()> {
        Ok(())
    }

    /// True when the store's files are made by shardfs from files of another format (BLZ data):
    /// not every byte of them is in a file another program could read at its [`Store::url`]
    /// (`shardfs refs` refuses the store).
    fn synthesized(&self) -> bool {
        false
    }

    /// True when nothing can be written to the store (BLZ data, a zip file): it is mounted
    /// read-only, and every change fails with EROFS.
    fn read_only(&self) -> bool {
        false
    }

    /// Where a program other than shardfs finds the bytes of the file at `key`: by default the
    /// whole of its [`Store::url`]; a store whose files are ranges of a bigger file (a zip's
    /// entries) names that file and where the range starts, or says why no program could read
    /// them in place (a compressed entry).
    fn location(&self, key: &str) -> Result<Location> {
        Ok(Location::At { url: self.url(key), start: None })
    }
}

/// Where the bytes of a store file are for another program (`shardfs refs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A file at `url`: the whole of it, or, with `start`, its bytes from there on.
    At { url: String, start: Option<u64> },
    /// In no file but the store's own (a reference set's inline values): a reference carries
    /// the bytes themselves.
    Inline,
}

/// The key of the directory holding `key` (`""`: the root).
pub fn parent_key(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// The last component of `key`.
pub fn file_name(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(_, name)| name)
}

/// Joins a store key and a name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") }
}

/// A random pause before try `attempt + 1` of something that may succeed when tried again (a
/// server's passing failure, writers racing for one object), up to 10 ms doubled per try: clients
/// trying at once fall out of step, as they would not if each tried again at once.
pub fn backoff(attempt: u32) -> std::time::Duration {
    use std::hash::{BuildHasher, RandomState};
    let ceiling = 10u64 << attempt.min(6);
    std::time::Duration::from_millis(RandomState::new().hash_one(attempt) % ceiling)
}

/// Pieces this small are gathered into one write; bigger ones are written from where they are.
pub const GATHER: usize = 256 << 10;

/// Writes `pieces` back to back from `offset` with `write(bytes, at)`, in a few large writes and
/// without copying big pieces: many small chunks would each cost a system call, and big ones a
/// copy.
pub fn write_gathered<E>(
    mut offset: u64,
    pieces: &[&[u8]],
    mut write: impl FnMut(&[u8], u64) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut gathered = Vec::new();
    for piece in pieces {
        if !gathered.is_empty() && gathered.len() + piece.len() > GATHER {
            write(&gathered, offset)?;
            offset += gathered.len() as u64;
            gathered.clear();
        }
        if piece.len() >= GATHER {
            write(piece, offset)?;
            offset += piece.len() as u64;
        } else {
            gathered.extend_from_slice(piece);
        }
    }
    if !gathered.is_empty() {
        write(&gathered, offset)?;
    }
    Ok(())
}
