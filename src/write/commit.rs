//! One shard update. Under the shard's lock, the current index is read from the file itself (not
//! from any cache), the changes are applied, and then:
//! - index at the end: the new chunk bytes and a fresh index are appended after the shard's end,
//!   journaled so that a torn append rolls back; the replaced bytes and the old index become
//!   unused space;
//! - index at the start, or no shard yet: a whole new shard is written to `__shardfs/tmp/`,
//!   fsync'd, and renamed over the old one;
//! - no chunk left: the shard is deleted, as zarr-python and tensorstore do.
//!
//! Every outcome is durable when [`commit`] returns.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::crash_point::{CrashPoint, Step};
use super::journal::{self, AppendRecord, sync_dir, tmp_dir};
use super::lock::{ShardLock, lock_slot};
use crate::format::shard_index::{EMPTY, IndexLocation, IndexSpec, ShardIndex, assemble_shard, shard_layout};
use crate::store::{DirStore, parent_key};

/// New content per index entry: `Some(bytes)` stores, `None` empties the entry. The bytes are
/// borrowed where they can be (a pending chunk's buffer), so that a commit copies each chunk
/// only into the file.
pub type Changes<'a> = BTreeMap<u64, Option<Cow<'a, [u8]>>>;

/// What a commit did to the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Appended {
        old_len: u64,
        new_len: u64,
    },
    Rewritten,
    Created,
    Deleted,
    Unchanged,
    /// Rewritten without unused space.
    Compacted {
        old_len: u64,
        new_len: u64,
    },
}

/// Why a commit did not happen. The shard keeps its last good state in every case.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// The shard on disk is damaged; writing over it could lose what is still readable.
    #[error("{0}")]
    Damaged(String),
    /// The fault-injection hook stopped the commit.
    #[error("commit stopped by an injected crash")]
    Crashed,
    /// The array's document was replaced by one whose chunks mean something else (or by none)
    /// since the chunks were written: committing them would put them in the wrong places.
    #[error(
        "{array}: the array's zarr.json changed (chunk grid, codecs or data type) since {dropped} pending chunk writes were made; they were dropped, not committed"
    )]
    Stale { array: String, dropped: usize },
}

impl From<CommitError> for crate::error::Error {
    fn from(e: CommitError) -> Self {
        use crate::error::Error;
        match e {
            CommitError::Io { path, source } => Error::Io { path, source },
            CommitError::Damaged(msg) => Error::Damaged(msg),
            CommitError::Crashed => Error::Damaged("commit stopped by an injected crash".into()),
            stale @ CommitError::Stale { .. } => Error::Stale(stale.to_string()),
        }
    }
}

/// Turns a failed step on the shard at `key` into a [`CommitError`] naming the shard.
fn failure(store: &DirStore, key: &str) -> impl Fn(Step) -> CommitError {
    let shown = store.path(key).display().to_string();
    move |step| match step {
        Step::Crashed => CommitError::Crashed,
        Step::Io(source) => CommitError::Io { path: shown.clone(), source },
    }
}

/// Applies `changes` to the shard at store key `key`, whose outermost index is laid out as
/// `spec` says.
pub fn commit(
    store: &DirStore,
    key: &str,
    spec: &IndexSpec,
    changes: &Changes,
    crash: &mut CrashPoint,
) -> Result<Outcome, CommitError> {
    let fail = failure(store, key);
    let slot = lock_slot(key);
    let _lock = ShardLock::acquire(store, slot).map_err(|e| fail(Step::Io(e)))?;
    commit_locked(store, key, slot, spec, changes, crash)
}

/// New content per innermost chunk of a nested shard, keyed by its entry at every level
/// (outermost first): `Some(bytes)` stores, `None` empties.
pub type NestedChanges<'a> = BTreeMap<Vec<u64>, Option<Cow<'a, [u8]>>>;

/// Applies `changes` to a shard with one index spec per level (outermost first). Each inner
/// shard that holds a changed chunk is rebuilt whole from the shard as it is under the lock, and
/// then committed as an outer chunk like any other.
pub fn commit_levels(
    store: &DirStore,
    key: &str,
    specs: &[IndexSpec],
    changes: &NestedChanges,
    crash: &mut CrashPoint,
) -> Result<Outcome, CommitError> {
    let shown = store.path(key).display().to_string();
    let fail = |source: std::io::Error| CommitError::Io { path: shown.clone(), source };
    let slot = lock_slot(key);
    let _lock = ShardLock::acquire(store, slot).map_err(&fail)?;
    let mut by_outer: BTreeMap<u64, NestedChanges> = BTreeMap::new();
    for (path, content) in changes {
        by_outer.entry(path[0]).or_default().insert(path[1..].to_vec(), content.clone());
    }
    let mut outer = Changes::new();
    if specs.len() == 1 {
        outer = by_outer.into_iter().map(|(entry, mut inner)| (entry, inner.remove(&Vec::new()).flatten())).collect();
    } else {
        let file = match store.open_file(key) {
            Ok(file) => Some(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(e)),
        };
        let current = match &file {
            Some(file) => {
                let len = file.metadata().map_err(&fail)?.len();
                read_entries(file, &specs[0], len).map_err(|e| match e {
                    Ok(reason) => CommitError::Damaged(format!("{shown}: {reason}; not writing over it")),
                    Err(io) => fail(io),
                })?
            }
            None => vec![None; specs[0].entries as usize],
        };
        for (entry, inner) in by_outer {
            let blob = match (&file, &current[entry as usize]) {
                (Some(file), Some(range)) => Some(read_range(file, range).map_err(&fail)?),
                _ => None,
            };
            let rebuilt = rebuild(&specs[1..], blob, &inner).map_err(|reason| {
                CommitError::Damaged(format!("{shown}: inner shard {entry}: {reason}; not writing over it"))
            })?;
            outer.insert(entry, rebuilt.map(Cow::Owned));
        }
    }
    commit_locked(store, key, slot, &specs[0], &outer, crash)
}

/// An inner shard laid out by `specs` (its own level first) with `changes` applied; `None` when
/// no chunk is left in it.
fn rebuild(specs: &[IndexSpec], blob: Option<Vec<u8>>, changes: &NestedChanges) -> Result<Option<Vec<u8>>, String> {
    let spec = &specs[0];
    let mut chunks: Vec<Option<Vec<u8>>> = vec![None; spec.entries as usize];
    if let Some(blob) = blob {
        let len = blob.len() as u64;
        let range = spec.index_range(len).map_err(|e| e.to_string())?;
        let index = ShardIndex::decode(spec, &blob[range.start as usize..range.end as usize], len, 0)
            .map_err(|e| e.to_string())?;
        for (i, chunk) in chunks.iter_mut().enumerate() {
            *chunk = index
                .chunk(i as u64)
                .map_err(|e| e.to_string())?
                .map(|r| blob[r.start as usize..r.end as usize].to_vec());
        }
    }
    let mut by_entry: BTreeMap<u64, NestedChanges> = BTreeMap::new();
    for (path, content) in changes {
        by_entry.entry(path[0]).or_default().insert(path[1..].to_vec(), content.clone());
    }
    for (entry, mut inner) in by_entry {
        let slot = &mut chunks[entry as usize];
        *slot = if specs.len() == 1 {
            inner.remove(&Vec::new()).flatten().map(Cow::into_owned)
        } else {
            rebuild(&specs[1..], slot.take(), &inner)?
        };
    }
    Ok(chunks.iter().any(Option::is_some).then(|| assemble_shard(spec, &chunks)))
}

/// [`commit`] with the shard's lock already held.
fn commit_locked(
    store: &DirStore,
    key: &str,
    slot: u64,
    spec: &IndexSpec,
    changes: &Changes,
    crash: &mut CrashPoint,
) -> Result<Outcome, CommitError> {
    let shown = store.path(key).display().to_string();
    let fail = failure(store, key);
    let opened = store.open_file_rw(key);
    let file = match opened {
        Ok(file) => Some(file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(fail(Step::Io(e))),
    };
    let Some(file) = file else {
        let chunks: Vec<Option<&[u8]>> =
            (0..spec.entries).map(|i| changes.get(&i).and_then(|c| c.as_deref())).collect();
        if chunks.iter().all(Option::is_none) {
            return Ok(Outcome::Unchanged);
        }
        replace(store, key, slot, spec, &chunks, crash).map_err(&fail)?;
        return Ok(Outcome::Created);
    };
    let meta = file.metadata().map_err(|e| fail(Step::Io(e)))?;
    if !meta.is_file() {
        return Err(CommitError::Damaged(format!("{shown}: shard is not a regular file")));
    }
    let len = meta.len();
    let current = read_entries(&file, spec, len).map_err(|e| match e {
        Ok(reason) => CommitError::Damaged(format!("{shown}: {reason}; not writing over it")),
        Err(io) => fail(Step::Io(io)),
    })?;
    let kept = |i: u64| !changes.contains_key(&i) && current[i as usize].is_some();
    let stays_empty = (0..spec.entries).all(|i| !kept(i) && changes.get(&i).is_none_or(Option::is_none));
    if stays_empty {
        crash.step(|| std::fs::remove_file(&*store.beneath(key)?)).map_err(&fail)?;
        store.beneath(parent_key(key)).and_then(|dir| sync_dir(&dir)).map_err(|e| fail(Step::Io(e)))?;
        return Ok(Outcome::Deleted);
    }
    if spec.location == IndexLocation::Start {
        let mut chunks = Vec::with_capacity(spec.entries as usize);
        for i in 0..spec.entries {
            chunks.push(match (changes.get(&i), &current[i as usize]) {
                (Some(new), _) => new.as_deref().map(Cow::Borrowed),
                (None, Some(range)) => Some(Cow::Owned(read_range(&file, range).map_err(|e| fail(Step::Io(e)))?)),
                (None, None) => None,
            });
        }
        replace(store, key, slot, spec, &chunks, crash).map_err(&fail)?;
        return Ok(Outcome::Rewritten);
    }
    append(store, key, slot, &file, len, spec, &current, changes, crash).map_err(&fail)
}

/// Rewrites the shard at `key` without unused space (replaced chunks and old indexes left by
/// appends), atomically: readers see the old shard or the new one, never a mix.
pub fn compact(store: &DirStore, key: &str, spec: &IndexSpec, crash: &mut CrashPoint) -> Result<Outcome, CommitError> {
    let shown = store.path(key).display().to_string();
    let fail = failure(store, key);
    let slot = lock_slot(key);
    let _lock = ShardLock::acquire(store, slot).map_err(|e| fail(Step::Io(e)))?;
    let file = match store.open_file(key) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::Unchanged),
        Err(e) => return Err(fail(Step::Io(e))),
    };
    let old_len = file.metadata().map_err(|e| fail(Step::Io(e)))?.len();
    let current = read_entries(&file, spec, old_len).map_err(|e| match e {
        Ok(reason) => CommitError::Damaged(format!("{shown}: {reason}; not compacting it")),
        Err(io) => fail(Step::Io(io)),
    })?;
    let live: u64 = current.iter().flatten().map(|r| r.end - r.start).sum();
    let new_len = live + spec.encoded_len();
    if new_len == old_len {
        return Ok(Outcome::Unchanged);
    }
    let mut chunks = Vec::with_capacity(current.len());
    for range in &current {
        chunks.push(match range {
            Some(range) => Some(read_range(&file, range).map_err(|e| fail(Step::Io(e)))?),
            None => None,
        });
    }
    replace(store, key, slot, spec, &chunks, crash).map_err(&fail)?;
    Ok(Outcome::Compacted { old_len, new_len })
}

/// The current entries of the shard (absolute ranges), or `Err(Ok(reason))` when it is damaged.
#[allow(clippy::type_complexity)]
fn read_entries(
    file: &File,
    spec: &IndexSpec,
    len: u64,
) -> Result<Vec<Option<std::ops::Range<u64>>>, Result<String, std::io::Error>> {
    let range = spec.index_range(len).map_err(|e| Ok(e.to_string()))?;
    let mut bytes = vec![0; (range.end - range.start) as usize];
    file.read_exact_at(&mut bytes, range.start).map_err(Err)?;
    let index = ShardIndex::decode(spec, &bytes, len, 0).map_err(|e| Ok(e.to_string()))?;
    (0..spec.entries).map(|i| index.chunk(i).map_err(|e| Ok(e.to_string()))).collect()
}

fn read_range(file: &File, range: &std::ops::Range<u64>) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; (range.end - range.start) as usize];
    file.read_exact_at(&mut buf, range.start)?;
    Ok(buf)
}

#[allow(clippy::too_many_arguments)]
fn append(
    store: &DirStore,
    key: &str,
    slot: u64,
    file: &File,
    old_len: u64,
    spec: &IndexSpec,
    current: &[Option<std::ops::Range<u64>>],
    changes: &Changes,
    crash: &mut CrashPoint,
) -> Result<Outcome, Step> {
    let mut appended: Vec<&[u8]> = Vec::new();
    let mut end = old_len;
    let mut entries = Vec::with_capacity(current.len());
    for (i, range) in current.iter().enumerate() {
        entries.push(match (changes.get(&(i as u64)), range) {
            (Some(Some(bytes)), _) => {
                appended.push(bytes);
                let offset = end;
                end += bytes.len() as u64;
                (offset, bytes.len() as u64)
            }
            (Some(None), _) | (None, None) => (EMPTY, EMPTY),
            (None, Some(range)) => (range.start, range.end - range.start),
        });
    }
    let index = spec.encode(&entries);
    appended.push(&index);
    let new_len = end + index.len() as u64;
    let crc32c = appended.iter().fold(0, |crc, piece| crc32c::crc32c_append(crc, piece));
    let record = AppendRecord { shard: key.to_string(), old_len, new_len, crc32c };
    let record_path = journal::begin(store, slot, &record, crash)?;
    let written = write_back_to_back(crash, file, old_len, &appended).and_then(|()| Ok(file.sync_data()?));
    if let Err(Step::Io(e)) = &written {
        // A failed append (a full disk) is undone at once, so that the shard is never left torn
        // while the daemon lives; if even that fails, the record stays for recovery.
        if file.set_len(old_len).and_then(|()| file.sync_all()).is_ok() {
            let _ = std::fs::remove_file(&record_path);
        }
        log::warn!("{}: append failed and was rolled back: {e}", store.path(key).display());
    }
    written?;
    journal::end(&record_path, crash)?;
    Ok(Outcome::Appended { old_len, new_len })
}

/// Writes a whole new shard beside the old one and renames it over, durably.
fn replace<C: AsRef<[u8]>>(
    store: &DirStore,
    key: &str,
    slot: u64,
    spec: &IndexSpec,
    chunks: &[Option<C>],
    crash: &mut CrashPoint,
) -> Result<(), Step> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    store.create_dirs(&tmp_dir())?;
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let tmp = store.path(&tmp_dir()).join(format!("{slot:016x}-{}-{n}", std::process::id()));
    let file = File::create(&tmp)?;
    let index = spec.encode(&shard_layout(spec, chunks));
    let data = chunks.iter().flatten().map(AsRef::as_ref);
    let pieces: Vec<&[u8]> = match spec.location {
        IndexLocation::Start => std::iter::once(&index[..]).chain(data).collect(),
        IndexLocation::End => data.chain(std::iter::once(&index[..])).collect(),
    };
    write_back_to_back(crash, &file, 0, &pieces)?;
    file.sync_all()?;
    store.create_dirs(parent_key(key))?;
    let target = store.beneath(key)?;
    crash.step(|| std::fs::rename(&tmp, &*target))?;
    sync_dir(&store.beneath(parent_key(key))?)?;
    Ok(())
}

/// Pieces this small are gathered into one write; bigger ones are written from where they are.
const GATHER: usize = 256 << 10;

/// Writes `pieces` back to back from `offset`, with a few large writes and without copying big
/// pieces: many small chunks would each cost a system call, and big ones a copy.
fn write_back_to_back(crash: &mut CrashPoint, file: &File, mut offset: u64, pieces: &[&[u8]]) -> Result<(), Step> {
    let mut gathered = Vec::new();
    for piece in pieces {
        if !gathered.is_empty() && gathered.len() + piece.len() > GATHER {
            crash.write_at(file, &gathered, offset)?;
            offset += gathered.len() as u64;
            gathered.clear();
        }
        if piece.len() >= GATHER {
            crash.write_at(file, piece, offset)?;
            offset += piece.len() as u64;
        } else {
            gathered.extend_from_slice(piece);
        }
    }
    if !gathered.is_empty() {
        crash.write_at(file, &gathered, offset)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_written_back_to_back_and_a_crash_leaves_a_prefix() {
        let big = vec![7u8; GATHER + 3];
        let pieces: [&[u8]; 5] = [b"ab", &big, b"c", &big[..GATHER - 1], b"de"];
        let whole = pieces.concat();
        let path = std::env::temp_dir().join(format!("shardfs-back-to-back-{}", std::process::id()));
        for stop in [None, Some(1), Some(GATHER as u64), Some(whole.len() as u64 - 1)] {
            let file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let mut crash = stop.map_or_else(CrashPoint::never, CrashPoint::after);
            let result = write_back_to_back(&mut crash, &file, 5, &pieces);
            let written = std::fs::read(&path).unwrap();
            assert_eq!(written[..5], [0; 5]);
            match stop {
                None => assert!(result.is_ok() && written[5..] == whole[..]),
                Some(n) => assert!(matches!(result, Err(Step::Crashed)) && written[5..] == whole[..n as usize]),
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
