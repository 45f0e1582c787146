//! The one error type of the filesystem layers. Each variant says what went wrong in terms of the
//! store; `fuse.rs` alone turns them into errno values.

use std::io;

/// Why a filesystem operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The view has no such entry.
    #[error("no such entry")]
    NotFound,
    /// Data on disk is damaged; the message names the file and the cause.
    #[error("{0}")]
    Damaged(String),
    /// The backing store failed; `path` is relative to the store's root.
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("read-only view")]
    ReadOnly,
    /// The operation makes no sense at this place of the view (a chunk outside the array, a
    /// chunk key of the wrong rank, a document change that cannot be stored sharded).
    #[error("{0}")]
    Invalid(String),
    #[error("already exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    /// A rename the view cannot do in place (a whole chunk directory); `mv` then copies.
    #[error("cannot be renamed in place")]
    CrossDevice,
    #[error("stale file handle")]
    BadHandle,
    /// The file was opened in an array whose document has since changed so that the file no
    /// longer means the same chunk; the message names the array.
    #[error("{0}")]
    Stale(String),
}

impl From<crate::store::Error> for Error {
    fn from(e: crate::store::Error) -> Self {
        use crate::store::Error as Store;
        match e {
            Store::NotFound(_) => Error::NotFound,
            Store::Io { place, source } => Error::Io { path: place, source },
            changed @ Store::Changed(_) => {
                Error::Io { path: changed.to_string(), source: io::Error::from_raw_os_error(libc::EAGAIN) }
            }
            crashed @ Store::Crashed(_) => Error::Damaged(crashed.to_string()),
        }
    }
}

impl Error {
    /// Wraps an I/O error with the store path it concerns.
    pub fn io(path: &str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            return Error::NotFound;
        }
        Error::Io { path: path.to_string(), source }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
