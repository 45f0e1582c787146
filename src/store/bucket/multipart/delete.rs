//! S3's DELETE only of the version named (`If-Match`, which S3 and compatible servers decide with
//! the removal; see [`super::super::conditional_delete`]), made with the uploads' signed requests.

use object_store::path::Path;

use super::super::conditional_delete::ConditionalDelete;
use super::{Failed, Multipart, tag};

#[async_trait::async_trait]
impl ConditionalDelete for Multipart {
    async fn delete_at(&self, path: &Path, e_tag: &str) -> Result<bool, Failed> {
        let headers = [("if-match", e_tag)];
        let (status, text) = self.send("delete", || self.signed("DELETE", path, &[], &headers, "")).await?;
        match status {
            200..=299 | 404 => Ok(true),
            412 => Ok(false),
            _ => Err(Failed::Other(format!("{status}: {}", tag(&text, "Code").unwrap_or(text)))),
        }
    }
}
