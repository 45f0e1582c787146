//! The seam between a bucket store and a DELETE only of the version named (`If-Match`, decided
//! by the server with the removal), which object_store cannot ask for: sent as a request the
//! store signs itself, by S3's multipart client (`multipart/delete.rs`) or Azure's blocks client
//! ([`super::azure_blocks`]). The leases of the turn-taking commits are removed so, never one
//! another machine took over; a probe at mount tells whether the server honours the condition.

use async_trait::async_trait;
use object_store::path::Path;

use super::resend::Failed;

#[async_trait]
pub trait ConditionalDelete: std::fmt::Debug + Send + Sync {
    /// Removes `path` only while its ETag is `e_tag`: true when it was removed (or nothing is
    /// there), false when another version is.
    async fn delete_at(&self, path: &Path, e_tag: &str) -> Result<bool, Failed>;
}
