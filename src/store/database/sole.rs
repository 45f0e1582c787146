//! Versions of a database that this process alone has open (LevelDB's lock, GNU dbm's writer
//! lock): nothing but this mount changes its values while it is open, so a value's version needs
//! no help from the database. It is an epoch, new at each open, with the number of this mount's
//! write that wrote the value (0 for a value as found). Whoever reads a value and its version
//! holds a read lock of these versions, and whoever writes a write lock, so a version always
//! names the bytes read with it.

use std::collections::HashMap;

/// The versions of the values this mount wrote.
pub struct Versions {
    /// New at each open: versions of two opens never coincide.
    epoch: u64,
    /// The number of this mount's last write of each key it wrote.
    written: HashMap<Vec<u8>, u64>,
    writes: u64,
}

impl Versions {
    /// The versions of a database just opened at `path`.
    pub fn new(path: &std::path::Path) -> Versions {
        use std::hash::{BuildHasher, RandomState};
        let epoch = RandomState::new().hash_one((std::time::SystemTime::now(), path));
        Versions { epoch, written: HashMap::new(), writes: 0 }
    }

    /// The version of the value at `key` now.
    pub fn of(&self, key: &[u8]) -> String {
        format!("{:x}.{}", self.epoch, self.written.get(key).copied().unwrap_or(0))
    }

    /// Notes a write of `key`, and returns its version.
    pub fn wrote(&mut self, key: &[u8]) -> String {
        self.writes += 1;
        self.written.insert(key.to_vec(), self.writes);
        self.of(key)
    }
}
