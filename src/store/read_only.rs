//! Stores nothing can be written to (BLZ data, a zip file, a kerchunk reference set): a
//! [`ReadOnlyStore`] says how to read; every change fails with EROFS, named by
//! [`ReadOnlyStore::describe`], and the mount is read-only.

use std::fmt::Debug;
use std::path::PathBuf;

use super::{Attr, Error, Kind, Location, Lock, Object, OpenFile, OpenHow, PutMode, Result, Space, Stamp, Store};

/// The reading half of [`Store`]; the writing half is refused.
pub trait ReadOnlyStore: Send + Sync + Debug {
    /// As [`Store::describe`].
    fn describe(&self, key: &str) -> String;
    /// As [`Store::url`].
    fn url(&self, key: &str) -> String;
    /// As [`Store::attr`].
    fn attr(&self, key: &str) -> Result<Attr>;
    /// As [`Store::list`].
    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)>;
    /// As [`Store::open`].
    fn open(&self, key: &str) -> Result<Box<dyn Object>>;
    /// As [`Store::space`].
    fn space(&self) -> Result<Space>;

    /// As [`Store::read_link`]: by default, no key is a link.
    fn read_link(&self, key: &str) -> Result<PathBuf> {
        Err(errno(self.describe(key), libc::EINVAL))
    }

    /// As [`Store::synthesized`].
    fn synthesized(&self) -> bool {
        false
    }

    /// As [`Store::location`].
    fn location(&self, key: &str) -> Result<Location> {
        Ok(Location::At { url: self.url(key), start: None })
    }
}

/// The error `errno` for `place`.
pub fn errno(place: String, errno: i32) -> Error {
    Error::Io { place, source: std::io::Error::from_raw_os_error(errno) }
}

/// The error for an entry that cannot be read as stored (damaged, or pointing nowhere): EIO, with
/// its cause.
pub fn damaged(place: String, why: impl Into<String>) -> Error {
    Error::Io { place, source: std::io::Error::other(why.into()) }
}

impl<T: ReadOnlyStore> Store for T {
    fn describe(&self, key: &str) -> String {
        ReadOnlyStore::describe(self, key)
    }

    fn url(&self, key: &str) -> String {
        ReadOnlyStore::url(self, key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        ReadOnlyStore::attr(self, key)
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        ReadOnlyStore::list(self, dir)
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        ReadOnlyStore::open(self, key)
    }

    fn read_link(&self, key: &str) -> Result<PathBuf> {
        ReadOnlyStore::read_link(self, key)
    }

    fn space(&self) -> Result<Space> {
        ReadOnlyStore::space(self)
    }

    fn put(&self, key: &str, _pieces: &[&[u8]], _mode: PutMode) -> Result<Option<Stamp>> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn delete(&self, key: &str) -> Result<()> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn rename(&self, from: &str, _to: &str) -> Result<()> {
        Err(errno(self.describe(from), libc::EROFS))
    }

    fn make_dir(&self, key: &str, _mode: u32) -> Result<()> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn make_dirs(&self, key: &str) -> Result<()> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn can_append(&self) -> bool {
        false
    }

    fn open_file(&self, key: &str, _how: OpenHow) -> Result<Box<dyn OpenFile>> {
        Err(errno(self.describe(key), libc::EROFS))
    }

    fn lock(&self, _slot: u64) -> Result<Box<dyn Lock>> {
        Err(errno(self.describe(""), libc::EROFS))
    }

    fn check_writes(&self) -> Result<()> {
        Err(errno(self.describe(""), libc::EROFS))
    }

    fn synthesized(&self) -> bool {
        ReadOnlyStore::synthesized(self)
    }

    fn read_only(&self) -> bool {
        true
    }

    fn location(&self, key: &str) -> Result<Location> {
        ReadOnlyStore::location(self, key)
    }
}
