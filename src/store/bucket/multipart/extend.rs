//! A new version of an S3 object made of the first bytes of the version before it, copied inside
//! the server, and new bytes after them: a multipart upload whose first parts are
//! `UploadPartCopy` of that version (`x-amz-copy-source-if-match`: the bytes copied are that
//! version's or none), whose last parts are the new bytes, completed with `If-Match` on that
//! version (nothing is stored unless the object is still that version). What crosses the network
//! is the new bytes and a few small requests, whatever the object's size.
//!
//! S3 wants every part but the last to be 5 MiB or more ([`super::PART`]) and a copied part to be
//! 5 GiB at most: the bytes kept are copied in parts of equal size below that, and an object
//! keeping less than [`super::PART`] cannot be made so (its caller writes it whole).

use futures_util::{StreamExt, TryStreamExt};
use object_store::PutResult;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;

use super::super::extender::Extender;
use super::super::metered::timed;
use super::{Condition, Failed, Multipart, PART, gather, put_part, tag};

/// The most bytes one `UploadPartCopy` copies.
const MOST_COPIED: u64 = 5 << 30;

impl Multipart {
    /// Stores at `path` the first `kept` bytes of its version `e_tag`, copied inside the server,
    /// then `tail`; only over version `e_tag` ([`Failed::Refused`] otherwise, and when the
    /// version to copy is gone). With `note` (not empty) as the object's note
    /// (`x-amz-meta-shardfsnote`), stored with it.
    pub async fn extend(
        &self,
        path: &Path,
        e_tag: &str,
        kept: u64,
        tail: &[&[u8]],
        note: &str,
    ) -> Result<PutResult, Failed> {
        if kept < PART as u64 {
            return Err(Failed::Other(format!("{kept} bytes kept: less than a part ({PART})")));
        }
        let id = self.create(path, note).await?;
        let id = &id;
        let extended = async {
            let copies = kept.div_ceil(MOST_COPIED);
            let each = kept.div_ceil(copies);
            let size: usize = tail.iter().map(|p| p.len()).sum();
            let count = size.div_ceil(PART).max(1);
            let copied = futures_util::stream::iter(0..copies)
                .map(|n| self.copy_part(path, id, n as usize, e_tag, n * each..((n + 1) * each).min(kept)))
                .buffered(super::PARTS_AT_ONCE);
            let sent = futures_util::stream::iter(0..count)
                .map(|n| async move {
                    let _slot = self.parts.acquire().await.expect("never closed");
                    let bytes = gather(tail, n * PART, ((n + 1) * PART).min(size));
                    let part = copies as usize + n;
                    put_part(&self.client, path, id, part, bytes)
                        .await
                        .map_err(|e| Failed::Other(super::super::one_line(&e)))
                })
                .buffered(super::PARTS_AT_ONCE);
            // The copies and the new bytes go at once: each is a round trip of its own.
            let (copied, sent): (Vec<PartId>, Vec<PartId>) =
                futures_util::future::try_join(copied.try_collect(), sent.try_collect()).await?;
            let parts: Vec<PartId> = copied.into_iter().chain(sent).collect();
            self.complete(path, id, &parts, kept + size as u64, Condition::ETag(e_tag)).await
        }
        .await;
        if extended.is_err() {
            // Best effort: an upload left behind costs storage until the bucket's lifecycle rule.
            let _ = timed("multipart", self.client.abort_multipart(path, id)).await;
        }
        extended
    }

    /// Starts an upload to `path` (CreateMultipartUpload) with `note` as its note when not empty:
    /// the upload's ID. object_store starts uploads with no user metadata.
    pub(super) async fn create(&self, path: &Path, note: &str) -> Result<String, Failed> {
        let name = format!("x-amz-meta-{}", crate::store::bucket::exchange::NOTE);
        let header = [(name.as_str(), note)];
        let headers: &[(&str, &str)] = if note.is_empty() { &[] } else { &header };
        let (status, text) =
            self.send("multipart", || self.signed("POST", path, &[("uploads", "")], headers, "")).await?;
        match (status, tag(&text, "UploadId")) {
            (200, Some(id)) => Ok(id),
            _ => Err(Failed::Other(format!("starting an upload: {status}: {}", tag(&text, "Code").unwrap_or(text)))),
        }
    }

    /// Part `n` (from 0) of upload `id`: bytes `range` of version `e_tag` of the object at `path`,
    /// copied inside the server.
    async fn copy_part(
        &self,
        path: &Path,
        id: &str,
        n: usize,
        e_tag: &str,
        range: std::ops::Range<u64>,
    ) -> Result<PartId, Failed> {
        let source = self.copy_source(path)?;
        let range = format!("bytes={}-{}", range.start, range.end - 1);
        let number = (n + 1).to_string();
        let headers = [
            ("x-amz-copy-source", source.as_str()),
            ("x-amz-copy-source-range", range.as_str()),
            ("x-amz-copy-source-if-match", e_tag),
        ];
        let query = [("partNumber", number.as_str()), ("uploadId", id)];
        let (status, text) = self.send("copy", || self.signed("PUT", path, &query, &headers, "")).await?;
        let code = tag(&text, "Code");
        match (status, code.as_deref(), tag(&text, "ETag")) {
            (200, None, Some(e_tag)) => Ok(PartId { content_id: e_tag.replace("&quot;", "\"") }),
            // The version to copy is no longer there: another writer replaced it (S3 answers 412;
            // a server that looks at the range first, 416; one whose object is gone, 404).
            (412 | 416 | 404, _, _) | (_, Some("PreconditionFailed" | "InvalidRange" | "NoSuchKey"), _) => {
                Err(Failed::Refused)
            }
            _ => Err(Failed::Other(format!("copying part {number}: {status}: {}", code.unwrap_or(text)))),
        }
    }

    /// Asks the server, with an upload to `path` copying a part of the object there, whether it
    /// refuses a copy whose `x-amz-copy-source-if-match` names another version (`bogus`).
    pub(super) async fn refuses_copies_of_other_versions(&self, path: &Path, bogus: &str) -> bool {
        let id = match self.create(path, "").await {
            Ok(id) => id,
            Err(Failed::Refused | Failed::Other(_)) => return false,
        };
        let copied = self.copy_part(path, &id, 0, bogus, 0..1).await;
        let _ = timed("multipart", self.client.abort_multipart(path, &id)).await;
        match copied {
            Err(Failed::Refused) => true,
            Ok(_) => false,
            Err(Failed::Other(e)) => {
                log::info!("copies of parts cannot be checked ({e}); shards go up whole");
                false
            }
        }
    }

    /// The `x-amz-copy-source` naming the object at `path`: `BUCKET/KEY`, percent-encoded.
    fn copy_source(&self, path: &Path) -> Result<String, Failed> {
        let mut url = url::Url::parse("http://source/").expect("a valid URL");
        url.path_segments_mut()
            .map_err(|_| Failed::Other("no path".into()))?
            .pop_if_empty()
            .push(&self.bucket)
            .extend(path.parts());
        Ok(url.path().trim_start_matches('/').to_string())
    }
}

/// S3's way: the multipart upload above; `Multipart::probe` asks about completions under
/// conditions and copies of parts at once.
#[async_trait::async_trait]
impl Extender for Multipart {
    async fn probe(&self, path: &Path, e_tag: &str) {
        Multipart::probe(self, path, e_tag).await
    }

    fn keeps(&self, kept: u64) -> bool {
        self.completes_only_over() && kept >= PART as u64
    }

    async fn extend(
        &self,
        path: &Path,
        e_tag: &str,
        kept: u64,
        tail: &[&[u8]],
        note: &str,
    ) -> Result<PutResult, Failed> {
        Multipart::extend(self, path, e_tag, kept, tail, note).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_source_is_bucket_and_key_percent_encoded() {
        let client = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_endpoint("http://127.0.0.1:1")
            .with_allow_http(true)
            .build()
            .unwrap();
        let multipart =
            Multipart::new(std::sync::Arc::new(client), "b", "http://127.0.0.1:1/b", "us-east-1", false).unwrap();
        let source = multipart.copy_source(&Path::parse("arr/c/0 1/ä").unwrap()).unwrap();
        assert_eq!(source, "b/arr/c/0%201/%C3%A4");
    }
}
