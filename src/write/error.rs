//! The write layer's error: why a commit, or the storing of a document, did not happen.

use crate::store;

/// Why a commit did not happen. The shard keeps its last good state in every case.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A metadata document written through the view cannot be stored as it must be (sharded);
    /// the message names the file and the reason.
    #[error("{0}")]
    Refused(String),
    /// The shard on disk is damaged; writing over it could lose what is still readable.
    #[error("{0}")]
    Damaged(String),
    /// The array's document was replaced by one whose chunks mean something else (or by none)
    /// since the chunks were written: committing them would put them in the wrong places.
    #[error(
        "{array}: the array's zarr.json changed (chunk grid, codecs or data type) since {dropped} pending chunk writes were made; they were dropped, not committed"
    )]
    Stale { array: String, dropped: usize },
}
