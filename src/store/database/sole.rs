//! Versions of a database that this process alone has open (LevelDB's lock, GNU dbm's writer
//! lock, a Berkeley DB mount's `flock`): nothing but this mount changes its values while it is open, so a value's version needs
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

/// The database files and directories this process has open, by device and inode.
static OPEN: parking_lot::Mutex<std::collections::BTreeSet<(u64, u64)>> =
    parking_lot::Mutex::new(std::collections::BTreeSet::new());

/// This process's one open of a database file or directory, given up when dropped.
///
/// The locks of LevelDB and Kyoto Cabinet (and GNU dbm's where it falls back from `flock`) are
/// fcntl locks, which are the process's and go with the first close of any descriptor of the file
/// in the process: a second open here (refused or not, by any spelling of the path) would close
/// one, and another process could then write the database under this mount. So a second open is
/// refused before the library is asked. Held as the last field of a store, so that it is given up
/// after the database closes.
pub struct Registered((u64, u64));

impl Registered {
    /// Registers the open of `path`, named `name` in the error when it is open here already.
    pub fn open(path: &std::path::Path, name: &str) -> Result<Registered, String> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| format!("{name}: {e}"))?;
        let id = (meta.dev(), meta.ino());
        if !OPEN.lock().insert(id) {
            return Err(format!("{name}: already open in this process"));
        }
        Ok(Registered(id))
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        OPEN.lock().remove(&self.0);
    }
}
