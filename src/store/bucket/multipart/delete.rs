//! A DELETE only of the version named (`If-Match`, which S3 and compatible servers decide with
//! the removal), which object_store cannot ask for: made with the uploads' signed requests. The
//! lease of the turn-taking commits is removed so, never a lease another machine took over.

use object_store::path::Path;

use super::{Failed, Multipart, tag};

impl Multipart {
    /// Removes `path` only while its ETag is `e_tag`: true when it was removed (or nothing is
    /// there), false when another version is.
    pub async fn delete_at(&self, path: &Path, e_tag: &str) -> Result<bool, Failed> {
        let headers = [("if-match", e_tag)];
        let (status, text) = self.send("delete", || self.signed("DELETE", path, &[], &headers, "")).await?;
        match status {
            200..=299 | 404 => Ok(true),
            412 => Ok(false),
            _ => Err(Failed::Other(format!("{status}: {}", tag(&text, "Code").unwrap_or(text)))),
        }
    }
}
