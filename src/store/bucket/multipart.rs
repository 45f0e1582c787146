//! Large objects go up to S3 as multipart uploads: parts of [`PART`] bytes, several at once across
//! the store ([`PARTS_AT_ONCE`]), because a connection carries only so much (about 90 MB/s on S3,
//! less at a long round trip) and a shard of hundreds of MiB sent through one takes seconds. A
//! shard commit is conditional (only over the version read, or only where there is none), and so
//! is its upload: the CompleteMultipartUpload request carries `If-Match` or `If-None-Match: *`,
//! which S3 honours since 2024. object_store sends the parts but cannot add those headers to the
//! completion, so that one request is signed and sent here, with object_store's own signer,
//! credentials and HTTP client. Whether the server refuses a completion over an object, and one
//! over another version, is asked once, when the mount is checked for writes
//! ([`Multipart::probe`]); an upload under a condition the server does not honour there (moto
//! ignores `If-Match` on a completion, and honours `If-None-Match: *`) is a single PUT instead,
//! slower but never lost.
//!
//! Each part is copied out of the shard's pieces when its upload starts, so an upload holds at
//! most [`PARTS_AT_ONCE`] parts in memory, never the whole shard. A completion whose answer was
//! lost is sent again; when the upload is gone by then, the object is taken for this upload's
//! when its size and ETag are those the parts make (S3's ETag of a multipart object is the MD5 of
//! the parts' MD5s, then `-` and their count; each part's MD5 is the ETag its upload answered,
//! not hashed here: hashing each part before sending it held the parts back one after another).

mod delete;
mod extend;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use object_store::MultipartId;
use object_store::aws::{AmazonS3, AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ClientOptions, PutPayload, PutResult};

use super::metered::{by_status, timed};
use crate::metrics;

/// Objects at least this large go up in parts.
pub const SMALLEST: u64 = 16 << 20;
/// The size of each part but the last: S3's least, so that a shard goes up over as many
/// connections at once as it can (S3 takes at most 10,000 parts: bigger objects get bigger ones).
pub const PART: usize = 5 << 20;
/// Parts uploaded at once, across the store: what they hold in memory, and the connections used.
/// Two 64 MiB shards (13 parts each) go up at once; with 16, 256 MiB to S3 at 20 ms took 1.66-1.83 s
/// where 32 took 1.41-1.58 s (`scripts/bench_wan_write.py --workloads bulk`).
pub const PARTS_AT_ONCE: usize = 32;
/// The most parts one upload may have.
const MOST_PARTS: usize = 10_000;

/// What a completion asks of the object it replaces.
#[derive(Clone, Copy, Debug)]
pub enum Condition<'a> {
    /// Nothing: it replaces whatever is there.
    None,
    /// Only where no object is.
    Absent,
    /// Only over the version with this ETag.
    ETag(&'a str),
}

pub use super::resend::Failed;
pub(super) use super::resend::tag;

/// Multipart uploads to one S3 bucket.
#[derive(Debug)]
pub struct Multipart {
    client: Arc<AmazonS3>,
    /// `None`: requests are not signed (`--no-sign-request`).
    credentials: Option<AwsCredentialProvider>,
    http: HttpClient,
    /// The bucket's URL, objects' paths below it.
    bucket_url: String,
    /// The bucket's name, as a copy names its source.
    bucket: String,
    region: String,
    /// The server refuses a completion over an object (`If-None-Match: *`), and one over another
    /// version (`If-Match`): asked once, by [`Multipart::probe`].
    creates: AtomicBool,
    updates: AtomicBool,
    /// The server refuses to copy a part of a version its `x-amz-copy-source-if-match` does not
    /// name: asked once, by [`Multipart::probe`].
    copies: AtomicBool,
    /// Parts in flight, across the store.
    parts: tokio::sync::Semaphore,
}

impl Multipart {
    /// Uploads through `client` to the bucket at `bucket_url` in `region`.
    pub fn new(
        client: Arc<AmazonS3>,
        bucket: &str,
        bucket_url: &str,
        region: &str,
        signed: bool,
    ) -> Result<Self, String> {
        let options = ClientOptions::new().with_allow_http(bucket_url.starts_with("http://"));
        let http = ReqwestConnector::default().connect(&options).map_err(|e| e.to_string())?;
        Ok(Multipart {
            credentials: signed.then(|| client.credentials().clone()),
            client,
            http,
            bucket_url: bucket_url.trim_end_matches('/').to_string(),
            bucket: bucket.to_string(),
            region: region.to_string(),
            creates: AtomicBool::new(false),
            updates: AtomicBool::new(false),
            copies: AtomicBool::new(false),
            parts: tokio::sync::Semaphore::new(PARTS_AT_ONCE),
        })
    }

    /// True when an upload under `condition` of `size` bytes should go up in parts.
    pub fn fits(&self, size: u64, condition: Condition) -> bool {
        let honoured = match condition {
            Condition::None => true,
            Condition::Absent => self.creates.load(Ordering::Relaxed),
            Condition::ETag(_) => self.updates.load(Ordering::Relaxed),
        };
        size >= SMALLEST && honoured
    }

    /// True when the server refuses to complete an upload over another version than the one its
    /// `If-Match` names, and to copy a part of another version than the one its
    /// `x-amz-copy-source-if-match` names (as [`Multipart::probe`] found): only then may a new
    /// version be made of an old one's bytes ([`Multipart::extend`]). A server ignoring the
    /// second could copy a newer version's bytes under an index made for the one read.
    pub fn completes_only_over(&self) -> bool {
        self.updates.load(Ordering::Relaxed) && self.copies.load(Ordering::Relaxed)
    }

    /// Asks the server, with uploads to `path` (where an object with ETag `e_tag` is), whether it
    /// refuses to complete one where an object is and one over another version; uploads under
    /// each condition go up in parts from then on only if it does.
    pub async fn probe(&self, path: &Path, e_tag: &str) {
        let bogus = format!("\"not-{}\"", e_tag.trim_matches('"'));
        let check = |condition, honoured: &'static str| async move {
            match self.upload(path, &[b"probe"], condition, "").await {
                Err(Failed::Refused) => true,
                Ok(_) => false,
                Err(Failed::Other(e)) => {
                    log::info!("multipart uploads {honoured} cannot be checked ({e}); shards go up whole");
                    false
                }
            }
        };
        // All at once: each is three round trips, and a writable mount waits for them to start.
        let (creates, updates, copies) = futures_util::future::join3(
            check(Condition::Absent, "if none"),
            check(Condition::ETag(&bogus), "if match"),
            self.refuses_copies_of_other_versions(path, &bogus),
        )
        .await;
        self.creates.store(creates, Ordering::Relaxed);
        self.updates.store(updates, Ordering::Relaxed);
        self.copies.store(copies, Ordering::Relaxed);
    }

    /// Uploads `pieces`, back to back, as the object at `path`, under `condition`, with `note` (when
    /// not empty) as its note.
    pub async fn upload(
        &self,
        path: &Path,
        pieces: &[&[u8]],
        condition: Condition<'_>,
        note: &str,
    ) -> Result<PutResult, Failed> {
        let other = |e: object_store::Error| Failed::Other(super::one_line(&e));
        // object_store starts uploads with no user metadata: one with a note is started here.
        let id = match note.is_empty() {
            true => timed("multipart", self.client.create_multipart(path)).await.map_err(other)?,
            false => self.create(path, note).await?,
        };
        let id = &id;
        let uploaded = async {
            let size: usize = pieces.iter().map(|p| p.len()).sum();
            let part = PART.max(size.div_ceil(MOST_PARTS));
            let count = size.div_ceil(part).max(1);
            let parts: Vec<PartId> = futures_util::stream::iter(0..count)
                .map(|n| async move {
                    let _slot = self.parts.acquire().await.expect("never closed");
                    let bytes = gather(pieces, n * part, ((n + 1) * part).min(size));
                    put_part(&self.client, path, id, n, bytes).await
                })
                .buffered(PARTS_AT_ONCE)
                .try_collect()
                .await
                .map_err(other)?;
            self.complete(path, id, &parts, size as u64, condition).await
        }
        .await;
        if uploaded.is_err() {
            // Best effort: an upload left behind costs storage until the bucket's lifecycle rule.
            let _ = timed("multipart", self.client.abort_multipart(path, id)).await;
        }
        uploaded
    }

    /// Completes upload `id` of `parts` under `condition`, sending it again while its answer is
    /// lost; once the upload is gone, it succeeded if the object is what the parts make.
    async fn complete(
        &self,
        path: &Path,
        id: &str,
        parts: &[PartId],
        size: u64,
        condition: Condition<'_>,
    ) -> Result<PutResult, Failed> {
        let mut body = String::from("<CompleteMultipartUpload>");
        for (n, part) in parts.iter().enumerate() {
            body.push_str(&format!("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", n + 1, part.content_id));
        }
        body.push_str("</CompleteMultipartUpload>");
        let mut last = String::new();
        for attempt in 0..super::TRIES as u32 {
            if attempt > 0 {
                tokio::time::sleep(crate::store::backoff(attempt)).await;
            }
            let request = self.completion(path, id, &body, condition).await?;
            let start = Instant::now();
            let answered = self.http.execute(request).await;
            let status = answered.as_ref().ok().map(|reply| reply.status().as_u16());
            metrics::request("multipart", by_status(status), start.elapsed());
            let reply = match answered {
                Ok(reply) => reply,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let status = reply.status();
            let text = match reply.into_body().bytes().await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            // S3 may answer 200 and put an error in the body.
            let code = tag(&text, "Code");
            match (status.as_u16(), code.as_deref()) {
                (200, None) => {
                    let e_tag = tag(&text, "ETag").map(|t| t.replace("&quot;", "\""));
                    return Ok(PutResult { e_tag, version: None, extensions: Default::default() });
                }
                (412 | 409, _) | (_, Some("PreconditionFailed" | "ConditionalRequestConflict")) => {
                    return Err(Failed::Refused);
                }
                (404, _) | (_, Some("NoSuchUpload")) if attempt > 0 => {
                    return self.own_upload(path, parts, size).await;
                }
                (500.., _) | (_, Some("InternalError" | "SlowDown" | "ServiceUnavailable")) => {
                    last = format!("{status}: {}", code.unwrap_or_default());
                }
                _ => return Err(Failed::Other(format!("{status}: {}", code.unwrap_or_else(|| text.clone())))),
            }
        }
        Err(Failed::Other(last))
    }

    /// The object at `path` when it is the one `parts` make (a completion whose answer was lost).
    async fn own_upload(&self, path: &Path, parts: &[PartId], size: u64) -> Result<PutResult, Failed> {
        let digests: Option<Vec<Vec<u8>>> = parts.iter().map(|p| md5_of_e_tag(&p.content_id)).collect();
        let Some(digests) = digests else {
            return Err(Failed::Other("the completion's answer was lost, and the parts' ETags are not MD5s: whether it was stored is not known".into()));
        };
        let digests: Vec<&[u8]> = digests.iter().map(Vec::as_slice).collect();
        let want = format!("{}-{}", super::requests::md5_hex(&digests), parts.len());
        match timed("head", object_store::ObjectStoreExt::head(&*self.client, path)).await {
            Ok(meta) if meta.size == size && meta.e_tag.as_deref().map(super::metadata::bare_e_tag) == Some(&want) => {
                Ok(PutResult { e_tag: meta.e_tag, version: meta.version, extensions: Default::default() })
            }
            // Someone else's object: this upload lost to it.
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Err(Failed::Refused),
            Err(e) => Err(Failed::Other(super::one_line(&e))),
        }
    }

    /// The signed CompleteMultipartUpload request.
    async fn completion(
        &self,
        path: &Path,
        id: &str,
        body: &str,
        condition: Condition<'_>,
    ) -> Result<HttpRequest, Failed> {
        let header = match condition {
            Condition::None => None,
            Condition::Absent => Some(("If-None-Match", "*")),
            Condition::ETag(e_tag) => Some(("If-Match", e_tag)),
        };
        self.signed("POST", path, &[("uploadId", id)], header.as_slice(), body).await
    }

    /// A request of `method` about the object at `path`, with `query` and `headers`, signed as
    /// object_store signs its own.
    pub(super) async fn signed(
        &self,
        method: &str,
        path: &Path,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<HttpRequest, Failed> {
        let mut url = url::Url::parse(&self.bucket_url).map_err(|e| Failed::Other(e.to_string()))?;
        url.path_segments_mut().map_err(|_| Failed::Other("a bucket URL with no path".into()))?.extend(path.parts());
        if !query.is_empty() {
            // S3 takes `?uploads` with no value; an empty value is the same to it and to SigV4.
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = http::Request::builder().method(method).uri(url.as_str());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request: HttpRequest =
            request.body(Bytes::from(body.to_string()).into()).map_err(|e| Failed::Other(e.to_string()))?;
        if let Some(credentials) = &self.credentials {
            let credential = credentials.get_credential().await.map_err(|e| Failed::Other(super::one_line(&e)))?;
            AwsAuthorizer::new(&credential, "s3", &self.region)
                .try_authorize(&mut request, None)
                .map_err(|e| Failed::Other(super::one_line(&e)))?;
        }
        Ok(request)
    }

    /// Sends the request `make` makes ([`super::resend`]): the status and the body of the answer.
    /// For requests that may be sent twice.
    pub(super) async fn send<F, R>(&self, kind: &'static str, make: F) -> Result<(u16, String), Failed>
    where
        F: Fn() -> R,
        R: std::future::Future<Output = Result<HttpRequest, Failed>>,
    {
        super::resend::send(&self.http, kind, make).await.map(|answer| (answer.status, answer.text))
    }
}

/// Uploads part `n` of upload `id`, counted.
async fn put_part(
    client: &AmazonS3,
    path: &Path,
    id: &MultipartId,
    n: usize,
    bytes: Bytes,
) -> object_store::Result<PartId> {
    let len = bytes.len() as u64;
    let part = timed("multipart", client.put_part(path, id, n, PutPayload::from(bytes))).await;
    if part.is_ok() {
        metrics::sent(len);
    }
    part
}

/// Bytes `start..end` of `pieces` laid back to back.
pub(super) fn gather(pieces: &[&[u8]], start: usize, end: usize) -> Bytes {
    let mut out = Vec::with_capacity(end - start);
    let mut at = 0;
    for piece in pieces {
        let (from, to) = (start.max(at), end.min(at + piece.len()));
        if from < to {
            out.extend_from_slice(&piece[from - at..to - at]);
        }
        at += piece.len();
        if at >= end {
            break;
        }
    }
    Bytes::from(out)
}

/// The 16 bytes of the MD5 an ETag spells in hex (quoted or not); `None` when it does not (an
/// object encrypted with a key of the server's has an ETag of another kind).
fn md5_of_e_tag(e_tag: &str) -> Option<Vec<u8>> {
    let hex = e_tag.trim_matches('"');
    if hex.len() != 32 {
        return None;
    }
    (0..32).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_gathered_across_pieces() {
        let pieces: [&[u8]; 3] = [b"abc", b"", b"defgh"];
        assert_eq!(gather(&pieces, 0, 8), Bytes::from_static(b"abcdefgh"));
        assert_eq!(gather(&pieces, 2, 5), Bytes::from_static(b"cde"));
        assert_eq!(gather(&pieces, 3, 4), Bytes::from_static(b"d"));
    }

    #[test]
    fn part_e_tags_are_read_as_md5s() {
        let md5 = md5_of_e_tag("\"0123456789abcdef0123456789ABCDEF\"").unwrap();
        assert_eq!(md5.len(), 16);
        assert_eq!((md5[0], md5[15]), (0x01, 0xef));
        assert_eq!(md5_of_e_tag("0123456789abcdef0123456789abcdef"), Some(md5));
        assert_eq!(md5_of_e_tag("\"0123456789abcdef0123456789abcdeg\""), None);
        assert_eq!(md5_of_e_tag("\"abc\""), None);
        assert_eq!(md5_of_e_tag("\"0123456789abcdef0123456789abcdéf\""), None);
    }

    #[test]
    fn answers_are_read_by_tag() {
        let ok = "<CompleteMultipartUploadResult><ETag>&quot;abc-2&quot;</ETag></CompleteMultipartUploadResult>";
        assert_eq!(tag(ok, "ETag").as_deref(), Some("&quot;abc-2&quot;"));
        assert_eq!(tag(ok, "Code"), None);
        assert_eq!(
            tag("<Error><Code>PreconditionFailed</Code></Error>", "Code").as_deref(),
            Some("PreconditionFailed")
        );
    }
}
