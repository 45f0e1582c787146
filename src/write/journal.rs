//! The append journal: before a commit appends to a shard, it records durably where the shard
//! ended and where it will end, with a CRC-32C of the bytes it will append. A crash mid-append
//! leaves a record behind, and [`recover`] then either keeps the append (complete, checksum
//! matches) or truncates the shard back to its old end, which still holds the old index.
//!
//! Records live in `__shardfs/journal/`, named `<lock slot>-<old end>`, so that recovery can take
//! the shard's lock without reading the record, and the newest record of a shard (the largest old
//! end) is the one that counts. Recovery also has the store remove what interrupted writes of
//! processes that are gone left behind ([`Store::clean_up`]: a local store's temporary files).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::store::{self, OpenHow, PRIVATE_DIR, PutMode, Store, join};

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

/// Writes `record` durably before the append it describes. Returns the record's key.
pub fn begin(store: &dyn Store, slot: u64, record: &AppendRecord) -> Result<String, store::Error> {
    let key = join(&journal_dir(), &format!("{slot:016x}-{}", record.old_len));
    let bytes = serde_json::to_vec(record).expect("a record always serialises");
    store.put(&key, &[&bytes], PutMode::Overwrite)?;
    Ok(key)
}

/// Drops the record of a finished append. It need not be durable: a leftover record of a
/// complete append is recognised by its checksum.
pub fn end(store: &dyn Store, record: &str) -> Result<(), store::Error> {
    store.discard(record)
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
    /// A leftover of an interrupted write of a process that is gone, removed.
    Removed(String),
}

/// Finishes or rolls back every interrupted commit in the store, and removes leftover temporary
/// files. Safe beside a running mount: each shard is handled under its lock, and a record that
/// disappears meanwhile belongs to a commit that finished.
pub fn recover(store: &dyn Store) -> Result<Vec<Recovery>, store::Error> {
    let slot_of = |name: &str| name.split('-').next().and_then(|s| u64::from_str_radix(s, 16).ok());
    let journal = journal_dir();
    let mut done: Vec<Recovery> = store.clean_up()?.into_iter().map(Recovery::Removed).collect();
    let slots: BTreeSet<u64> = list_names(store, &journal)?.iter().filter_map(|n| slot_of(n)).collect();
    for slot in slots {
        let _lock = store.lock(slot)?;
        let prefix = format!("{slot:016x}-");
        let names: Vec<String> = list_names(store, &journal)?.into_iter().filter(|n| n.starts_with(&prefix)).collect();
        let newest = names
            .iter()
            .filter_map(|n| serde_json::from_slice::<AppendRecord>(&store.read(&join(&journal, n)).ok()?).ok())
            .max_by_key(|r| r.old_len);
        if let Some(record) = newest {
            done.push(settle(store, &record)?);
        }
        for name in names {
            match store.delete(&join(&journal, &name)) {
                Ok(()) | Err(store::Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(done)
}

fn settle(store: &dyn Store, record: &AppendRecord) -> Result<Recovery, store::Error> {
    let key = record.shard.clone();
    let file = match store.open_file(&key, OpenHow::default()) {
        Ok(file) => file,
        Err(store::Error::NotFound(_)) => return Ok(Recovery::Skipped(key, "shard is gone".into())),
        Err(e) => return Err(e),
    };
    let len = file.attr()?.size;
    if len == record.new_len {
        let mut appended = vec![0; (record.new_len - record.old_len) as usize];
        let mut filled = 0;
        while filled < appended.len() {
            match file.read_at(&mut appended[filled..], record.old_len + filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        if filled == appended.len() && crc32c::crc32c(&appended) == record.crc32c {
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
    file.sync()?;
    Ok(Recovery::RolledBack(key))
}

/// The names in directory `dir`; none when it does not exist.
pub fn list_names(store: &dyn Store, dir: &str) -> Result<Vec<String>, store::Error> {
    match store.list(dir) {
        Ok((entries, _)) => Ok(entries.into_iter().map(|(name, _)| name).collect()),
        Err(store::Error::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
