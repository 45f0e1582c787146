//! A branch of an Icechunk repository as a writable store: what plain-Zarr tools write through
//! the view becomes Icechunk commits on the branch.
//!
//! Reads come from [`IcechunkStore`], pinned to the snapshot the writable session is based on,
//! with this mount's uncommitted changes over it (the overlay). Writes go to a session of the
//! `icechunk` crate: a chunk written is uploaded as a native chunk object at once and recorded in
//! the session; a `zarr.json` written becomes a node or a metadata update; a chunk deleted becomes
//! a deleted chunk. Nothing reaches the branch until a sync point ([`Store::sync_all`]: `fsync` of
//! a file or a directory, unmount; [`Store::sync_idle`]: `--commit-idle-ms` without a write), where
//! the session becomes one commit, all or nothing. If another writer moved the branch meanwhile,
//! the commit is rebased onto the new tip ([`Rebase`]): disjoint changes both land, where both
//! wrote one chunk this mount's write wins, except that a shard both wrote is first merged inner
//! chunk by inner chunk ([`crate::format::shard_merge`]), so that neither writer's inner chunks
//! are lost; and a change that cannot be rebased (the other writer deleted or redefined the
//! array, or the shards are nested) fails the sync with EIO, commits nothing, and is given up.
//!
//! After a commit the view is pinned to the new snapshot; with nothing uncommitted it follows the
//! branch as other writers move it. Files that are neither a `zarr.json` nor a chunk key (an
//! atomic writer's temporary file) are held in this process ([`super::held`]) until renamed onto a Zarr key; one
//! left at a sync point is refused with EIO naming it, as a repository has no place for it.
//!
//! - [`keys`]: which keys a session takes, as Icechunk reads them.
//! - [`uploads`]: chunks recorded by uploads in the background, which a commit waits for.
//! - [`merge`]: shards merged with the branch's tip before a commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use icechunk::Repository;
use icechunk::session::{SessionError, SessionErrorKind};

mod keys;
mod merge;
mod uploads;

use super::held::{Held, HeldFile, HeldHandle, new_stamp};
use keys::{chunk_key, is_document, is_private, is_zarr_key};
use merge::{Merge, raced};

use super::icechunk::IcechunkStore;
use super::icechunk_rebase::Rebase;
use super::read_only::{damaged, errno};
use super::{Attr, BytesObject, Error, Kind, Lock, Object, OpenFile, OpenHow, PutMode, Result, Space, Stamp, Store};
use crate::format::icechunk::Version;
use crate::format::metadata::ZARR_JSON;
use crate::store::{lock, parent_key};

/// How many times a commit is rebased onto a branch other writers keep moving before it fails.
const REBASE_ATTEMPTS: u16 = 20;

/// Bytes of writes held until committed that make a commit due, as --commit-idle-ms does: the
/// memory a mount writing without a pause holds stays below about twice this.
const UNCOMMITTED: usize = 1 << 30;

/// Chunk uploads in flight at once (as many as zarr-python's and Icechunk's own writers keep).
const UPLOADS: usize = 16;

/// How many times shards are merged with the branch's tip before a commit, when other writers
/// keep committing shards this mount wrote.
const MERGE_ROUNDS: u32 = 5;

/// How often a mount with nothing uncommitted asks where the branch is.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// A change not yet committed, as the view sees it.
#[derive(Debug, Clone)]
enum Change {
    Written {
        bytes: Arc<[u8]>,
        stamp: Stamp,
        modified: SystemTime,
    },
    /// An empty `zarr.json` (made by `cp` or a shell's `>` before its content): shown, and
    /// recorded in the session once it has content.
    Placeholder {
        stamp: Stamp,
        modified: SystemTime,
    },
    Deleted,
}

#[derive(Debug)]
struct State {
    /// The snapshot shown under the overlay (the session's base).
    base: String,
    /// The session taking this mount's writes; made at the first write after a commit.
    session: Option<icechunk::Store>,
    overlay: BTreeMap<String, Change>,
    held: BTreeMap<String, HeldFile>,
    /// Directories made and not (yet) holding anything the overlay or the snapshot shows.
    dirs: BTreeSet<String>,
    last_write: Instant,
    tip_asked: Instant,
    /// Counts for the default commit message: chunks written, chunks deleted, documents.
    counts: [usize; 3],
    /// Per shard merged with another writer's since the session began: the version merged in,
    /// which the next merge of it starts from.
    merge_bases: HashMap<String, Option<Vec<u8>>>,
    /// Chunks whose upload failed: recorded again before any commit.
    unrecorded: BTreeSet<String>,
    /// Bytes of the writes in the overlay, held until committed.
    uncommitted: usize,
}

impl State {
    /// Records `change` at `key` in the overlay.
    fn change(&mut self, key: &str, change: Change) {
        let size = |c: &Change| if let Change::Written { bytes, .. } = c { bytes.len() } else { 0 };
        self.uncommitted += size(&change);
        if let Some(before) = self.overlay.insert(key.to_string(), change) {
            self.uncommitted -= size(&before);
        }
    }
}

/// A branch of an Icechunk repository, written through sessions of the `icechunk` crate.
#[derive(Debug)]
pub struct BranchStore {
    shown: IcechunkStore,
    /// Where the repository is written, opened for writing by the first thing that needs it
    /// (a write, a look at the branch's tip): a mount that only reads never asks for it.
    storage: Arc<dyn icechunk::Storage + Send + Sync>,
    repository: OnceLock<std::result::Result<Repository, String>>,
    branch: String,
    message: Option<String>,
    runtime: tokio::runtime::Runtime,
    state: parking_lot::Mutex<State>,
    /// Writes in flight hold it shared; a commit holds it alone, so that no write lands in a
    /// session while it becomes a commit.
    gate: parking_lot::RwLock<()>,
    /// Makes every stamp of a change new.
    changes: Arc<AtomicU64>,
    /// Writes and deletes of one key take turns (a stripe per key): the session records them in
    /// the order the overlay shows them.
    turns: Vec<parking_lot::Mutex<()>>,
    /// Chunk uploads in flight, the newest of each key's: a write returns once its chunk is held,
    /// and a commit waits for them all.
    uploads: parking_lot::Mutex<HashMap<String, tokio::task::JoinHandle<std::result::Result<(), String>>>>,
    /// At most [`UPLOADS`] of them at once.
    slots: Arc<tokio::sync::Semaphore>,
}

impl BranchStore {
    /// Branch `branch` of the repository `shown` reads (the same repository `storage` writes),
    /// its commits named `message` (or a summary of what changed).
    pub fn open(
        shown: IcechunkStore,
        storage: Arc<dyn icechunk::Storage + Send + Sync>,
        branch: &str,
        message: Option<String>,
    ) -> std::result::Result<Self, String> {
        let place = shown.describe("");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardfs-icechunk")
            .enable_all()
            .build()
            .map_err(|e| format!("{place}: cannot start the Icechunk writer: {e}"))?;
        // The tip `shown` found, named by its ID from now on.
        let tip = shown.snapshot().map_err(|e| e.to_string())?;
        shown.show(Version::Snapshot(tip.clone()));
        let now = Instant::now();
        let state = State {
            base: tip,
            session: None,
            overlay: BTreeMap::new(),
            held: BTreeMap::new(),
            dirs: BTreeSet::new(),
            last_write: now,
            tip_asked: now,
            counts: [0; 3],
            merge_bases: HashMap::new(),
            unrecorded: BTreeSet::new(),
            uncommitted: 0,
        };
        Ok(BranchStore {
            shown,
            storage,
            repository: OnceLock::new(),
            branch: branch.to_string(),
            message,
            runtime,
            state: parking_lot::Mutex::new(state),
            gate: parking_lot::RwLock::new(()),
            changes: Arc::new(AtomicU64::new(0)),
            turns: (0..64).map(|_| parking_lot::Mutex::new(())).collect(),
            uploads: parking_lot::Mutex::new(HashMap::new()),
            slots: Arc::new(tokio::sync::Semaphore::new(UPLOADS)),
        })
    }

    fn new_stamp(&self, key: &str) -> Stamp {
        new_stamp(&self.changes, key)
    }

    /// The turn of `key` (see [`BranchStore::turns`]).
    fn turn(&self, key: &str) -> parking_lot::MutexGuard<'_, ()> {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        self.turns[(h.finish() % self.turns.len() as u64) as usize].lock()
    }

    /// The repository, opened for writing; EIO, logged, when it could not be.
    fn repository(&self) -> Result<&Repository> {
        let opened = self.repository.get_or_init(|| {
            let opened = self.runtime.block_on(Repository::open(self.storage.clone()).execute()).map_err(|e| {
                format!("{}: cannot open the repository for writing: {}", self.shown.describe(""), one_line(&e))
            });
            // Once: every write after fails the same way.
            if let Err(why) = &opened {
                log::warn!("{why}; writes fail with EIO");
            }
            opened
        });
        opened.as_ref().map_err(|why| damaged(self.shown.describe(""), why.clone()))
    }

    /// The session taking writes, made (on the branch's tip, which the view is then pinned to)
    /// when there is none.
    fn session(&self) -> Result<icechunk::Store> {
        let mut state = self.state.lock();
        if let Some(session) = &state.session {
            return Ok(session.clone());
        }
        let session = self.runtime.block_on(self.repository()?.writable_session(&self.branch)).map_err(|e| {
            self.failed("", format!("cannot start a session on branch {}: {}", self.branch, one_line(&e)))
        })?;
        let base = session.snapshot_id().to_string();
        if base != state.base {
            // Every version the view holds is of the old base now: conditional writes based on
            // it fail as changed, and the writer reads the new one.
            self.shown.show(Version::Snapshot(base.clone()));
            state.base = base;
        }
        let store = icechunk::Store::from_session_and_config(Arc::new(tokio::sync::RwLock::new(session)), 16);
        state.session = Some(store.clone());
        // Made for a write: the commit that will hold it is --commit-idle-ms away from now.
        state.last_write = Instant::now();
        Ok(store)
    }

    /// EIO for `key`, logged.
    fn failed(&self, key: &str, why: String) -> Error {
        let place = self.shown.describe(key);
        log::warn!("{place}: {why}");
        damaged(place, why)
    }

    /// The attributes the view shows: the snapshot's, writable by their owner.
    fn writable(attr: Attr) -> Attr {
        Attr { perm: attr.perm | 0o200, ..attr }
    }

    fn file_attr(&self, size: u64, stamp: Stamp, mtime: SystemTime) -> Result<Attr> {
        let root = self.shown.attr("")?;
        Ok(Attr {
            kind: Kind::File,
            size,
            perm: (root.perm & 0o666) | 0o200,
            nlink: 1,
            stamp,
            mtime,
            ctime: mtime,
            atime: mtime,
            ..root
        })
    }

    /// What this mount changed at `key` and not yet committed (a held file, a write, a deletion),
    /// with its bytes: `None` when the snapshot shown answers for it.
    /// `bytes` says whether they are wanted: a held file's are copied.
    fn changed(&self, state: &State, key: &str, bytes: bool) -> Option<Result<(Attr, Arc<[u8]>)>> {
        let none = || Arc::from(&[][..]);
        let (content, size, stamp, modified): (Arc<[u8]>, usize, Stamp, SystemTime) =
            match (state.held.get(key), state.overlay.get(key)) {
                (Some(file), _) => {
                    let held = file.lock();
                    let content = if bytes { held.bytes.as_slice().into() } else { none() };
                    (content, held.bytes.len(), held.stamp, held.modified)
                }
                (None, Some(Change::Written { bytes, stamp, modified })) => {
                    (bytes.clone(), bytes.len(), *stamp, *modified)
                }
                (None, Some(Change::Placeholder { stamp, modified })) => (none(), 0, *stamp, *modified),
                (None, Some(Change::Deleted)) => return Some(Err(Error::NotFound(self.describe(key)))),
                (None, None) => return None,
            };
        Some(self.file_attr(size as u64, stamp, modified).map(|attr| (attr, content)))
    }

    /// [`Store::put`] of bytes already gathered.
    fn put_bytes(&self, key: &str, bytes: Arc<[u8]>, mode: PutMode) -> Result<Option<Stamp>> {
        let key = key.trim_matches('/');
        // Past twice the uncommitted bytes that make a commit due, writers wait for it (outside
        // the gate, which the commit takes), unless commits keep failing.
        let waiting = Instant::now();
        while self.state.lock().uncommitted >= 2 * UNCOMMITTED && waiting.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _writing = self.gate.read_recursive();
        if !is_zarr_key(key) {
            return Err(self
                .failed(key, "neither a zarr.json nor a chunk key, so not a file an Icechunk commit can hold".into()));
        }
        // The session first: starting one may move the view to a newer base, and the condition
        // is then checked against what is there now.
        self.session()?;
        let _turn = self.turn(key);
        match (self.attr(key), mode) {
            (Ok(_), PutMode::Create) => return Err(Error::Changed(self.describe(key))),
            (Ok(attr), PutMode::Update(stamp)) if attr.stamp != stamp => {
                return Err(Error::Changed(self.describe(key)));
            }
            (Err(Error::NotFound(_)), PutMode::Update(_)) => return Err(Error::Changed(self.describe(key))),
            (Err(Error::NotFound(_)) | Ok(_), _) => {}
            (Err(e), _) => return Err(e),
        }
        let stamp = self.new_stamp(key);
        let modified = SystemTime::now();
        let change = if bytes.is_empty() && is_document(key) {
            Change::Placeholder { stamp, modified }
        } else {
            self.record(key, &bytes)?;
            Change::Written { bytes, stamp, modified }
        };
        let mut state = self.state.lock();
        if matches!(change, Change::Written { .. }) {
            state.counts[if is_document(key) { 2 } else { 0 }] += 1;
        }
        state.change(key, change);
        state.held.remove(key);
        state.last_write = Instant::now();
        Ok(Some(stamp))
    }

    /// True when the overlay, a held file or a made directory is at or below `dir`.
    fn holds_below(state: &State, dir: &str) -> bool {
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let under = |keys: &mut dyn Iterator<Item = &String>| keys.take(1).any(|k| k.starts_with(&prefix));
        under(&mut state.overlay.range(prefix.clone()..).filter(|(_, c)| !matches!(c, Change::Deleted)).map(|(k, _)| k))
            || under(&mut state.held.range(prefix.clone()..).map(|(k, _)| k))
            || state.dirs.contains(dir)
            || under(&mut state.dirs.range(prefix.clone()..))
    }

    /// Commits the session, if it holds changes: one commit on the branch, rebased onto its tip if
    /// another writer moved it.
    fn commit(&self) -> Result<()> {
        self.adopt()?;
        let _alone = self.gate.write();
        let (session, message) = {
            let state = self.state.lock();
            // A file some handle holds open may yet be renamed onto a Zarr key (an atomic
            // writer's temporary file, synced before its rename).
            let stranded: Vec<&String> = state
                .held
                .iter()
                .filter(|(k, f)| !is_private(k) && Arc::strong_count(f) == 1)
                .map(|(k, _)| k)
                .collect();
            if !stranded.is_empty() {
                let names = stranded.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
                return Err(self.failed(
                    "",
                    format!("{names}: neither a zarr.json nor a chunk key, so not a file an Icechunk commit can hold"),
                ));
            }
            let Some(session) = state.session.clone() else { return Ok(()) };
            let [chunks, deleted, documents] = state.counts;
            let message = self.message.clone().unwrap_or_else(|| {
                format!(
                    "shardfs: {chunks} chunk{} written, {deleted} deleted, {documents} zarr.json written",
                    plural(chunks)
                )
            });
            (session, message)
        };
        let sharded = self.sharded_arrays();
        let mut round = 1;
        let committed = loop {
            let merged_with = match self.merge_with_tip(&session, &sharded) {
                Ok(merged_with) => merged_with,
                Err(Merge::Failed(e)) => return Err(e),
                Err(Merge::Impossible(why)) => return Err(self.give_up(why)),
            };
            self.all_uploaded()?;
            let rebase = Rebase { sharded: sharded.clone(), merged_with };
            let committed = self.runtime.block_on(async {
                let session = session.session();
                let mut session = session.write().await;
                if !session.has_uncommitted_changes() {
                    return Ok(None);
                }
                session.commit(message.clone()).rebase(&rebase, REBASE_ATTEMPTS).execute().await.map(Some)
            });
            match committed {
                // Another writer committed a shard this mount wrote since the merge: merge again.
                Err(e) if round < MERGE_ROUNDS && raced(&e, &sharded) => round += 1,
                committed => break committed,
            }
        };
        let mut state = self.state.lock();
        match committed {
            Ok(snapshot) => {
                if let Some(snapshot) = snapshot {
                    let snapshot = snapshot.to_string();
                    log::info!("{}: committed snapshot {snapshot} on branch {}", self.shown.describe(""), self.branch);
                    self.shown.show(Version::Snapshot(snapshot.clone()));
                    state.base = snapshot;
                }
                Self::forget_changes(&mut state);
                state.tip_asked = Instant::now();
                Ok(())
            }
            Err(e) if matches!(e.kind, SessionErrorKind::RebaseFailed { .. }) => {
                drop(state);
                Err(self.give_up(why(&e)))
            }
            Err(e) => {
                Err(self.failed("", format!("commit on branch {} failed, nothing committed: {}", self.branch, why(&e))))
            }
        }
    }

    /// Forgets the session and what it held (committed, or given up).
    fn forget_changes(state: &mut State) {
        state.session = None;
        state.overlay.retain(|_, change| matches!(change, Change::Placeholder { .. }));
        state.uncommitted = 0;
        state.counts = [0; 3];
        state.merge_bases.clear();
        state.unrecorded.clear();
    }

    /// Gives up the changes a commit cannot hold (another writer's commit leaves no place for
    /// them), as an aborted transaction is: the view shows the branch again, later writes commit,
    /// and the error says why.
    fn give_up(&self, why: String) -> Error {
        {
            let mut state = self.state.lock();
            Self::forget_changes(&mut state);
            state.tip_asked = Instant::now() - FOLLOW_EVERY;
        }
        for (_, upload) in self.uploads.lock().drain() {
            upload.abort();
        }
        self.follow();
        self.failed(
            "",
            format!("commit on branch {} failed, nothing committed, the changes given up: {why}", self.branch),
        )
    }

    /// Files written at chunk keys before their array's zarr.json (`cp -r` copies `c/` first as
    /// often as not) were held as plain files: once the array is there, and no handle holds them
    /// open, they are chunks.
    fn adopt(&self) -> Result<()> {
        let held: Vec<(String, HeldFile)> = {
            let state = self.state.lock();
            let closed = state.held.iter().filter(|(k, f)| !is_private(k) && Arc::strong_count(f) == 1);
            closed.filter(|(k, _)| chunk_key(k).is_some()).map(|(k, f)| (k.clone(), f.clone())).collect()
        };
        for (key, file) in held {
            let Some((dir, _)) = chunk_key(&key) else { continue };
            if !self.is_array(&dir) {
                continue;
            }
            let bytes = file.lock().bytes.clone();
            self.put(&key, &[&bytes], PutMode::Overwrite)?;
        }
        Ok(())
    }

    /// True when the directory `dir` holds an array's `zarr.json`.
    fn is_array(&self, dir: &str) -> bool {
        let doc = self.read(&super::join(dir, ZARR_JSON)).ok();
        let doc = doc.and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
        doc.is_some_and(|d| d.get("node_type").and_then(|t| t.as_str()) == Some("array"))
    }

    /// With nothing uncommitted, shows the branch's tip if another writer moved it.
    /// Asked as the view is used (at most once per [`FOLLOW_EVERY`]), so that an idle mount asks
    /// its store nothing.
    fn follow(&self) {
        let asked_at = {
            let mut state = self.state.lock();
            if state.session.is_some() || state.tip_asked.elapsed() < FOLLOW_EVERY {
                return;
            }
            state.tip_asked = Instant::now();
            state.base.clone()
        };
        // Through the reading store, which asks again only when the file naming the branch
        // changed: a mount that reads needs no repository opened for writing.
        let tip = match self.shown.tip(&self.branch) {
            Ok(tip) => tip,
            Err(e) => return log::warn!("branch {}: {e}", self.branch),
        };
        let mut state = self.state.lock();
        // Not over a commit of this mount's, or a session, made meanwhile: the tip asked for
        // may be older than either.
        if state.session.is_none() && state.base == asked_at && tip != state.base {
            self.shown.show(Version::Snapshot(tip.clone()));
            state.base = tip;
        }
    }

    fn held(&self, key: &str) -> Option<HeldFile> {
        self.state.lock().held.get(key).cloned()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Why a commit failed, naming the arrays and groups a failed rebase could not carry over.
fn why(e: &SessionError) -> String {
    match &e.kind {
        SessionErrorKind::RebaseFailed { conflicts, .. } => {
            let names: Vec<String> = conflicts.iter().map(|c| format!("{c:?}")).collect();
            format!("another writer's commit conflicts with this mount's changes: {}", names.join("; "))
        }
        _ => one_line(e),
    }
}

#[derive(Debug)]
struct BranchLock(#[allow(dead_code)] parking_lot::RwLockWriteGuard<'static, ()>);

impl Lock for BranchLock {}

impl Store for BranchStore {
    fn describe(&self, key: &str) -> String {
        self.shown.describe(key)
    }

    fn url(&self, key: &str) -> String {
        self.shown.url(key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        let key = key.trim_matches('/');
        self.follow();
        let state = self.state.lock();
        if let Some(found) = self.changed(&state, key, false) {
            return found.map(|(attr, _)| attr);
        }
        let below = Self::holds_below(&state, key);
        drop(state);
        match self.shown.attr(key) {
            Err(Error::NotFound(_)) if below => {
                Ok(Attr { kind: Kind::Dir, nlink: 2, ..Self::writable(self.shown.attr("")?) })
            }
            found => found.map(Self::writable),
        }
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let dir = dir.trim_matches('/');
        self.follow();
        // The snapshot's listing and the overlay of one moment: a commit in between (which
        // empties the overlay into a new snapshot) means listing again.
        let mut rounds = 0;
        let (mut names, stamp, state) = loop {
            let base = self.state.lock().base.clone();
            let listed = self.shown.list(dir);
            let state = self.state.lock();
            rounds += 1;
            if state.base != base && rounds < 5 {
                continue;
            }
            match listed {
                Err(Error::NotFound(_)) if Self::holds_below(&state, dir) => {
                    break (Vec::new(), Stamp::computed(dir), state);
                }
                found => {
                    let (names, stamp) = found?;
                    break (names, stamp, state);
                }
            }
        };
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let mut entries: BTreeMap<String, Kind> = names.drain(..).collect();
        let child = |key: &str| -> Option<(String, bool)> {
            let rest = key.strip_prefix(&prefix)?;
            match rest.split_once('/') {
                Some((name, _)) => Some((name.to_string(), true)),
                None if !rest.is_empty() => Some((rest.to_string(), false)),
                None => None,
            }
        };
        for (key, change) in state.overlay.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)) {
            match (child(key), change) {
                (Some((name, false)), Change::Deleted) => drop(entries.remove(&name)),
                (Some((name, is_dir)), Change::Written { .. } | Change::Placeholder { .. }) => {
                    entries.insert(name, if is_dir { Kind::Dir } else { Kind::File });
                }
                _ => {}
            }
        }
        for key in state.held.keys().chain(state.dirs.iter()) {
            if let Some((name, is_dir)) = child(key) {
                let made_dir = state.dirs.contains(key.as_str()) && !is_dir;
                entries.insert(name, if is_dir || made_dir { Kind::Dir } else { Kind::File });
            }
        }
        let version = self.changes.load(Ordering::Relaxed);
        Ok((entries.into_iter().collect(), stamp.derived((version, &state.base))))
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let key = key.trim_matches('/');
        let place = self.describe(key);
        // The attributes and the bytes of one moment.
        let state = self.state.lock();
        match self.changed(&state, key, true) {
            Some(found) => {
                let (attr, bytes) = found?;
                Ok(Box::new(BytesObject { attr, bytes, place }))
            }
            None => {
                drop(state);
                self.shown.open(key)
            }
        }
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        Err(errno(self.describe(key), libc::EINVAL))
    }

    fn space(&self) -> Result<Space> {
        self.shown.space()
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        let bytes: Arc<[u8]> = match pieces {
            [one] => Arc::from(*one),
            _ => pieces.concat().into(),
        };
        self.put_bytes(key, bytes, mode)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let key = key.trim_matches('/');
        let _writing = self.gate.read_recursive();
        if self.state.lock().held.remove(key).is_some() {
            self.changes.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if !is_zarr_key(key) {
            return Err(Error::NotFound(self.describe(key)));
        }
        // The session first, as for a write: what is deleted is what the session's base shows.
        let session = self.session()?;
        let _turn = self.turn(key);
        self.attr(key)?;
        if is_document(key) {
            let dir = parent_key(key);
            if self.list(dir)?.0.iter().any(|(name, _)| name != ZARR_JSON) {
                return Err(errno(self.describe(key), libc::ENOTEMPTY));
            }
        }
        drop(self.uploaded(key));
        self.runtime.block_on(session.delete(key)).map_err(|e| self.failed(key, one_line(&e)))?;
        let mut state = self.state.lock();
        state.unrecorded.remove(key);
        if !is_document(key) {
            state.counts[1] += 1;
        }
        state.change(key, Change::Deleted);
        state.last_write = Instant::now();
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (from, to) = (from.trim_matches('/'), to.trim_matches('/'));
        // One commit holds both halves, or neither.
        let _writing = self.gate.read_recursive();
        if let Some(file) = self.held(from)
            && !is_zarr_key(to)
        {
            let mut state = self.state.lock();
            state.held.remove(from);
            state.held.insert(to.to_string(), file);
            self.changes.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // As across filesystems: mv copies a directory's files one by one.
        if self.attr(from)?.kind == Kind::Dir {
            return Err(errno(self.describe(from), libc::EXDEV));
        }
        let content: Arc<[u8]> = match self.held(from) {
            // An atomic writer's temporary file, renamed onto its chunk: copied once.
            Some(file) => Arc::from(file.lock().bytes.as_slice()),
            None => self.read(from)?.into(),
        };
        self.put_bytes(to, content, PutMode::Overwrite)?;
        self.delete(from)
    }

    fn make_dir(&self, key: &str, _mode: u32) -> Result<()> {
        let key = key.trim_matches('/');
        if self.attr(key).is_ok() {
            return Err(errno(self.describe(key), libc::EEXIST));
        }
        self.state.lock().dirs.insert(key.to_string());
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        let mut dir = key.trim_matches('/');
        let mut state = self.state.lock();
        while !dir.is_empty() {
            state.dirs.insert(dir.to_string());
            dir = parent_key(dir);
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        let key = key.trim_matches('/');
        if !self.list(key)?.0.is_empty() {
            return Err(errno(self.describe(key), libc::ENOTEMPTY));
        }
        self.state.lock().dirs.remove(key);
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn can_append(&self) -> bool {
        false
    }

    fn open_file(&self, key: &str, how: OpenHow) -> Result<Box<dyn OpenFile>> {
        let key = key.trim_matches('/');
        let file = match self.held(key) {
            Some(file) => file,
            None => {
                let bytes = match self.read(key) {
                    Ok(bytes) if !how.truncate => bytes,
                    Ok(_) => Vec::new(),
                    Err(Error::NotFound(_)) if how.create.is_some() => Vec::new(),
                    Err(e) => return Err(e),
                };
                let file = Arc::new(parking_lot::Mutex::new(Held {
                    bytes,
                    stamp: self.new_stamp(key),
                    modified: SystemTime::now(),
                }));
                self.state.lock().held.insert(key.to_string(), file.clone());
                self.changes.fetch_add(1, Ordering::Relaxed);
                file
            }
        };
        if how.truncate {
            file.lock().bytes.clear();
        }
        let attr = self.file_attr(0, self.new_stamp(key), SystemTime::now())?;
        Ok(Box::new(HeldHandle { key: self.describe(key), file, attr, changes: self.changes.clone() }))
    }

    fn lock(&self, slot: u64) -> Result<Box<dyn Lock>> {
        Ok(Box::new(BranchLock(lock::writing(slot))))
    }

    fn sync_all(&self) -> Result<()> {
        self.commit()
    }

    fn syncs_as_one(&self) -> bool {
        true
    }

    fn sync_idle(&self, idle: Duration) {
        let due = {
            let state = self.state.lock();
            state.session.is_some() && (state.last_write.elapsed() >= idle || state.uncommitted >= UNCOMMITTED)
        };
        if due && let Err(e) = self.commit() {
            log::warn!("{e}");
        }
    }

    fn location(&self, key: &str) -> Result<super::Location> {
        self.shown.location(key)
    }
}
