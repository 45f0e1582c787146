//! Where many machines writing one store take turns: a few small objects beside the data, always
//! asked of the server (never a cache), each change conditional, and a short note stored with a
//! file version in the same atomic write as its bytes. The shared-commit protocol
//! (`write::shared_commit`) is built of these; a store whose own locks reach every writer (a
//! local directory) has none.
//!
//! Keys are the store's own keys below [`EXCHANGE_DIR`], which no reader of the data looks at.

use std::time::SystemTime;

use super::world::{RealWorld, World};
use super::{PutMode, Result, Stamp};

/// The directory of the objects writers take turns with (below the private directory, which the
/// view never shows and Zarr readers never open).
pub const EXCHANGE_DIR: &str = "__shardfs/exchange";

/// A file of an exchange directory as listed: its name, and when it was stored by the server's
/// clock (one clock for every machine, where theirs may disagree).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub stored: SystemTime,
}

/// A version of an exchange object as the server has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its version tag (an ETag).
    pub tag: String,
    /// Its length in bytes.
    pub len: u64,
}

/// A file's current version and the note stored with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Noted {
    pub stamp: Stamp,
    /// Empty when it has none.
    pub note: String,
}

/// The conditional primitives of a store many machines write at once (an object store).
pub trait Exchange: Send + Sync {
    /// Stores `bytes` at `key` only where nothing is: its version tag, or `None` when something
    /// was there first.
    fn create(&self, key: &str, bytes: &[u8]) -> Result<Option<String>>;

    /// Replaces what is at `key` only while it is at version `tag`: the new tag, or `None` when
    /// it is at another version (or gone).
    fn replace(&self, key: &str, bytes: &[u8], tag: &str) -> Result<Option<String>>;

    /// The version of `key` as the server has it now; `None`: nothing there.
    fn head(&self, key: &str) -> Result<Option<Version>>;

    /// The bytes at `key` now; `None`: nothing there.
    fn read(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// The files directly in directory `dir` as the server lists them now.
    fn list(&self, dir: &str) -> Result<Vec<Listed>>;

    /// Removes `key`; nothing there is no error.
    fn remove(&self, key: &str) -> Result<()>;

    /// Whether the server decides [`Exchange::remove_at`]'s condition with the removal (S3's
    /// conditional DELETE, where a probe found it honoured). Elsewhere an object that must
    /// only ever be replaced at the version its writer saw is never removed.
    fn removes_at(&self) -> bool;

    /// Removes `key` only while it is at version `tag` ([`super::Error::Changed`] at another;
    /// nothing there is no error); only where [`Exchange::removes_at`].
    fn remove_at(&self, key: &str, tag: &str) -> Result<()>;

    /// The note stored with the current version of the file at `key`, and that version; `None`:
    /// no such file. Asked of the server.
    fn note(&self, key: &str) -> Result<Option<Noted>>;

    /// [`super::Store::put`] with `note` stored with the version written, in the same atomic
    /// write.
    fn put_noted(&self, key: &str, pieces: &[&[u8]], mode: PutMode, note: &str) -> Result<Option<Stamp>>;

    /// Forgets what this process knows of the file at `key`: another machine changed it.
    fn forget(&self, key: &str);

    /// The server's clock as of its newest answer to this process (its `Date`), where it tells
    /// it: no later than the server's time at any request sent after, no earlier (to the second)
    /// than at any answer taken before. The clock [`Listed::stored`] is told by.
    fn server_time(&self) -> Option<SystemTime> {
        None
    }

    /// The clock, pauses and threads its users take turns by: the machine's own, or a
    /// simulation's.
    fn world(&self) -> &dyn World {
        &RealWorld
    }
}
