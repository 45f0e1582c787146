//! The simulated object store: objects with S3's semantics where the commit code relies on them.
//! Writes are conditional and atomic per key; an ETag is a hash of the bytes alone (so a version
//! whose bytes equal an earlier one's has its ETag, as on S3); user metadata (the note) is stored
//! with a version in the same write; a listing tells when each object was stored by the server's
//! clock; a copy keeps bytes of the version named, and fails when it is gone.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Version {
    pub bytes: Arc<Vec<u8>>,
    pub note: String,
    pub e_tag: u64,
    pub stored: Duration,
}

pub struct Server {
    pub objects: BTreeMap<String, Version>,
    /// Whether it makes a version of copied bytes (S3's multipart copy) from this many on.
    pub copies_from: Option<u64>,
    /// Whether a DELETE can be made conditional (S3's `If-Match`).
    pub deletes_at: bool,
    /// Every version stored at this key, in order, with when.
    pub watched: String,
    pub history: Vec<(Arc<Vec<u8>>, Duration)>,
}

/// A write's condition.
#[derive(Clone, Copy)]
pub enum Condition {
    None,
    Absent,
    At(u64),
}

pub fn e_tag(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

impl Server {
    pub fn new(watched: &str, copies_from: Option<u64>, deletes_at: bool) -> Server {
        let watched = watched.to_string();
        Server { objects: BTreeMap::new(), copies_from, deletes_at, watched, history: Vec::new() }
    }

    /// Stores `bytes` at `key` if `condition` holds: the new version's ETag, or `None`.
    pub fn put(&mut self, key: &str, bytes: Vec<u8>, condition: Condition, note: &str, now: Duration) -> Option<u64> {
        let current = self.objects.get(key).map(|v| v.e_tag);
        let holds = match condition {
            Condition::None => true,
            Condition::Absent => current.is_none(),
            Condition::At(tag) => current == Some(tag),
        };
        if key == self.watched && std::env::var_os("REVIEW61_TRACE").is_some() {
            eprintln!(
                "           SERVER PUT {key} over {current:x?} cond {} -> {:x} ({} bytes) {} note={note}",
                match condition {
                    Condition::None => "none".to_string(),
                    Condition::Absent => "absent".to_string(),
                    Condition::At(t) => format!("at {t:x}"),
                },
                e_tag(&bytes),
                bytes.len(),
                if holds { "STORED" } else { "refused" }
            );
        }
        if !holds {
            return None;
        }
        let bytes = Arc::new(bytes);
        if key == self.watched {
            self.history.push((bytes.clone(), now));
        }
        let e_tag = e_tag(&bytes);
        self.objects.insert(key.to_string(), Version { bytes, note: note.to_string(), e_tag, stored: now });
        Some(e_tag)
    }

    /// A new version of `key` made of the first `kept` bytes of version `over` and `tail`, only
    /// while `key` is at `over`.
    pub fn extend(&mut self, key: &str, over: u64, kept: u64, tail: &[u8], note: &str, now: Duration) -> Option<u64> {
        let current = self.objects.get(key).filter(|v| v.e_tag == over && v.bytes.len() as u64 >= kept)?;
        let mut bytes = current.bytes[..kept as usize].to_vec();
        bytes.extend_from_slice(tail);
        self.put(key, bytes, Condition::At(over), note, now)
    }

    /// The names in directory `dir` and when each was stored.
    pub fn list(&self, dir: &str) -> Vec<(String, Duration)> {
        let prefix = format!("{dir}/");
        self.objects
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, v)| {
                let name = &k[prefix.len()..];
                (!name.contains('/')).then(|| (name.to_string(), v.stored))
            })
            .collect()
    }

    /// Every key below `prefix`.
    pub fn keys_below(&self, prefix: &str) -> Vec<String> {
        self.objects.keys().filter(|k| k.starts_with(prefix)).cloned().collect()
    }
}
