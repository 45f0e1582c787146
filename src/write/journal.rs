//! The append journal: before a commit appends to a shard, it records durably where the shard
//! ended and where it will end, with a CRC-32C of the bytes it will append. A crash mid-append
//! leaves a record behind, and [`recover`] then either keeps the append (complete, checksum
//! matches) or truncates the shard back to its old end, which still holds the old index.
//!
//! Records live in `__shardfs/journal/`, named `<lock slot>-<old end>`, so that recovery can take
//! the shard's lock without reading the record, and the newest record of a shard (the largest old
//! end) is the one that counts. Temporary shards of rename-commits live in `__shardfs/tmp/`,
//! named `<lock slot>-...`, and are removed by recovery under the same lock.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PRIVATE_DIR;
use super::crash_point::{CrashPoint, Step};
use super::lock::ShardLock;
use crate::store::DirStore;

/// One append in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendRecord {
    /// Store key of the shard.
    pub shard: String,
    pub old_len: u64,
    pub new_len: u64,
    /// CRC-32C of the appended bytes `old_len..new_len`.
    pub crc32c: u32,
}

/// Directory of the journal records, relative to the store root.
pub fn journal_dir() -> String {
    format!("{PRIVATE_DIR}/journal")
}

/// Directory of temporary shards, relative to the store root.
pub fn tmp_dir() -> String {
    format!("{PRIVATE_DIR}/tmp")
}

/// Writes `record` durably before the append it describes. Returns the record's path.
pub fn begin(store: &DirStore, slot: u64, record: &AppendRecord, crash: &mut CrashPoint) -> Result<PathBuf, Step> {
    store.create_dirs(&journal_dir())?;
    let dir = store.path(&journal_dir());
    let path = dir.join(format!("{slot:016x}-{}", record.old_len));
    let bytes = serde_json::to_vec(record).expect("a record always serialises");
    let file = File::create(&path)?;
    let written =
        crash.write_at(&file, &bytes, 0).and_then(|()| Ok(file.sync_all()?)).and_then(|()| Ok(sync_dir(&dir)?));
    if let Err(Step::Io(_)) = &written {
        // Nothing was appended yet: a record that could not be written is simply dropped.
        let _ = std::fs::remove_file(&path);
    }
    written.map(|()| path)
}

/// Drops the record of a finished append. It need not be durable: a leftover record of a
/// complete append is recognised by its checksum.
pub fn end(path: &Path, crash: &mut CrashPoint) -> Result<(), Step> {
    crash.step(|| std::fs::remove_file(path))
}

/// fsyncs a directory, making the creation, rename or removal of its entries durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What recovery did to one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The append was complete; the shard is unchanged.
    Kept(String),
    /// The append was torn; the shard was truncated back to its old end.
    RolledBack(String),
    /// The shard no longer matches the record (shorter than its old end, or gone); left as is.
    Skipped(String, String),
}

/// Finishes or rolls back every interrupted commit in the store, and removes leftover temporary
/// shards. Safe beside a running mount: each shard is handled under its lock, and a record that
/// disappears meanwhile belongs to a commit that finished.
pub fn recover(store: &DirStore) -> io::Result<Vec<Recovery>> {
    let mut slots: BTreeMap<u64, ()> = BTreeMap::new();
    for dir in [journal_dir(), tmp_dir()] {
        for name in list_names(&store.path(&dir))? {
            if let Some(slot) = name.split('-').next().and_then(|s| u64::from_str_radix(s, 16).ok()) {
                slots.insert(slot, ());
            }
        }
    }
    let mut done = Vec::new();
    for slot in slots.into_keys() {
        let _lock = ShardLock::acquire(store, slot)?;
        let prefix = format!("{slot:016x}-");
        let tmp = store.path(&tmp_dir());
        for name in list_names(&tmp)?.into_iter().filter(|n| n.starts_with(&prefix)) {
            std::fs::remove_file(tmp.join(name))?;
        }
        let journal = store.path(&journal_dir());
        let names: Vec<String> = list_names(&journal)?.into_iter().filter(|n| n.starts_with(&prefix)).collect();
        let newest = names
            .iter()
            .filter_map(|n| serde_json::from_slice::<AppendRecord>(&std::fs::read(journal.join(n)).ok()?).ok())
            .max_by_key(|r| r.old_len);
        if let Some(record) = newest {
            done.push(settle(store, &record)?);
        }
        for name in names {
            std::fs::remove_file(journal.join(name))?;
        }
        if !done.is_empty() {
            sync_dir(&journal)?;
        }
    }
    Ok(done)
}

fn settle(store: &DirStore, record: &AppendRecord) -> io::Result<Recovery> {
    let key = record.shard.clone();
    let opened = store.open_file_rw(&key);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Recovery::Skipped(key, "shard is gone".into())),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len == record.new_len {
        let mut appended = vec![0; (record.new_len - record.old_len) as usize];
        file.read_exact_at(&mut appended, record.old_len)?;
        if crc32c::crc32c(&appended) == record.crc32c {
            return Ok(Recovery::Kept(key));
        }
    }
    if len < record.old_len {
        return Ok(Recovery::Skipped(
            key,
            format!("shard is {len} bytes, shorter than its old end {}", record.old_len),
        ));
    }
    file.set_len(record.old_len)?;
    file.sync_all()?;
    Ok(Recovery::RolledBack(key))
}

fn list_names(dir: &Path) -> io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
