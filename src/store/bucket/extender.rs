//! The seam between a bucket store and the ways a service has of making a new version of an
//! object from the first bytes of the version before it, copied inside the server, and new bytes
//! after them (`Store::can_keep`, `Store::put_extending`): S3's multipart upload copying parts
//! ([`super::multipart`], `multipart/extend.rs`), Azure's blocks staged from the blob's own URL
//! ([`super::azure_blocks`]). Each is asked once per mount whether its server does it, and
//! refuses to copy any version but the one read; where it does not, shards are written whole.

use async_trait::async_trait;
use object_store::PutResult;
use object_store::path::Path;

use super::resend::Failed;

#[async_trait]
pub trait Extender: std::fmt::Debug + Send + Sync {
    /// Asks the server, with the object at `path` (whose version is `e_tag`, a few bytes long),
    /// whether it extends versions and refuses to copy one it was not asked to; what it answers
    /// holds for the mount.
    async fn probe(&self, path: &Path, e_tag: &str);

    /// True when a new version keeping the first `kept` bytes of the one before it is made by
    /// [`Extender::extend`] (as [`Extender::probe`] found; `kept` large enough to be worth it).
    fn keeps(&self, kept: u64) -> bool;

    /// Stores at `path` the first `kept` bytes of its version `e_tag`, copied inside the server,
    /// then `tail`; only over version `e_tag` ([`Failed::Refused`] otherwise, and when the version
    /// to copy is gone). With `note` (not empty) as the object's note, stored with it.
    async fn extend(
        &self,
        path: &Path,
        e_tag: &str,
        kept: u64,
        tail: &[&[u8]],
        note: &str,
    ) -> Result<PutResult, Failed>;
}
