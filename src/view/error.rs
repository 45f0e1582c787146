//! The view layer's error: why a view path could not be resolved, listed or read.

use crate::store;

/// Why a view operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The view has no such entry.
    #[error("no such entry")]
    NotFound,
    /// Data in the store is damaged; the message names the file and the cause.
    #[error("{0}")]
    Damaged(String),
    /// The store failed.
    #[error(transparent)]
    Store(store::Error),
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
}

impl From<store::Error> for Error {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::NotFound(_) => Error::NotFound,
            crashed @ store::Error::Crashed(_) => Error::Damaged(crashed.to_string()),
            other => Error::Store(other),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
