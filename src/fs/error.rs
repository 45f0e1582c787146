//! The filesystem layer's error, which the errors of the layers below convert into; `fuse.rs`
//! alone turns it into an errno.

use crate::store;
use crate::view::error as view;
use crate::write::error::CommitError;

/// Why a filesystem operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The view has no such entry.
    #[error("no such entry")]
    NotFound,
    /// Data in the store is damaged; the message names the file and the cause.
    #[error("{0}")]
    Damaged(String),
    /// The store failed; the error names the key as the store shows it.
    #[error(transparent)]
    Store(store::Error),
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
    /// A write or truncate past the largest file held in memory while written (a chunk or a
    /// metadata document); the message names the file.
    #[error("{0}")]
    TooLarge(String),
    /// The file was opened in an array whose document has since changed so that the file no
    /// longer means the same chunk; the message names the array.
    #[error("{0}")]
    Stale(String),
    /// A commit found what it writes over replaced by another writer at every attempt (a shard,
    /// or a document); the message names the key.
    #[error("{0}: replaced by another writer at every attempt to commit")]
    Contended(String),
}

impl From<view::Error> for Error {
    fn from(e: view::Error) -> Self {
        match e {
            view::Error::NotFound => Error::NotFound,
            view::Error::Damaged(msg) => Error::Damaged(msg),
            view::Error::Store(e) => Error::Store(e),
            view::Error::NotADirectory => Error::NotADirectory,
            view::Error::IsADirectory => Error::IsADirectory,
        }
    }
}

impl From<store::Error> for Error {
    fn from(e: store::Error) -> Self {
        view::Error::from(e).into()
    }
}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Self {
        match e {
            // Not the store's "changed" of a read, whose version is gone (ESTALE): a write that
            // lost to other writers every time failed, and its caller is to hear EIO.
            CommitError::Store(store::Error::Changed(place)) => Error::Contended(place),
            CommitError::Store(e) => e.into(),
            CommitError::Damaged(msg) => Error::Damaged(msg),
            CommitError::Refused(msg) => Error::Invalid(msg),
            stale @ CommitError::Stale { .. } => Error::Stale(stale.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
