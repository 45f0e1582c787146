//! A new version of an Azure blob made of the first bytes of the version before it, copied inside
//! the server, and new bytes after them: the bytes kept staged as blocks by `Put Block From URL`
//! from the blob's own URL (`x-ms-source-range`, and `x-ms-source-if-match` on the version read:
//! the bytes copied are that version's or none), the new bytes staged by `Put Block`, and the
//! blocks committed by `Put Block List` with `If-Match` on that version (nothing is stored unless
//! the blob is still that version) and the note as `x-ms-meta-*`. What crosses the network is the
//! new bytes and a few small requests, whatever the blob's size. object_store has none of these
//! requests: they are signed here with its credentials and `AzureAuthorizer`, and sent through
//! its HTTP client. So is `Delete Blob` with `If-Match`, the store's DELETE of one version only.
//!
//! Azure reads the source of a copy as a client would: a shared key does not authorize it, so
//! the source URL carries a service SAS for reading the blob, signed with that key by
//! object_store's `Signer` (an hour); a SAS credential, itself (it must allow reading); a bearer
//! token goes as `x-ms-copy-source-authorization`, which Azure takes for Microsoft Entra ID
//! tokens. Whether it all works with the mount's credential is found by [`Blocks::probe`] (a copy
//! of the version there must succeed and one of another version be refused); where it does not
//! (an Azurite without scripts/azurite.patch, a SAS that cannot read), shards are written whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::azure::{AzureAuthorizer, AzureCredential, MicrosoftAzure};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{ClientOptions, PutResult};

use super::conditional_delete::ConditionalDelete;
use super::extender::Extender;
use super::resend::{Failed, tag};
use crate::metrics;

/// A version keeping fewer bytes than this is written whole: as on S3 (a part's least there), the
/// requests of a copy cost more than sending so few bytes.
const LEAST_KEPT: u64 = 5 << 20;
/// The most bytes one `Put Block From URL` copies. Azure takes 4000 MiB in a block, but a copy
/// is one request under the client's time limit: smaller copies go several at once.
const MOST_COPIED: u64 = 256 << 20;
/// The most new bytes one `Put Block` sends, several at once.
const MOST_SENT: usize = 8 << 20;
/// Blocks staged at once, for one commit.
const AT_ONCE: usize = 8;
/// How long the SAS that lets the server read the source lasts: longer than any commit's copies.
const SOURCE_SAS: Duration = Duration::from_secs(3600);

/// Blocks of one Azure container's blobs, staged and committed.
#[derive(Debug)]
pub struct Blocks {
    client: Arc<MicrosoftAzure>,
    http: HttpClient,
    /// The container's URL (`https://ACCOUNT.blob.core.windows.net/CONTAINER`, or an emulator's
    /// `http://HOST:PORT/ACCOUNT/CONTAINER`), blobs' paths below it.
    container_url: String,
    account: String,
    /// The server copies a version's range into a block, and refuses to copy another version than
    /// the one its `x-ms-source-if-match` names: asked once, by [`Blocks::probe`].
    copies: AtomicBool,
}

impl Blocks {
    /// Blocks through `client` to the container at `container_url` of `account`.
    pub fn new(client: Arc<MicrosoftAzure>, account: &str, container_url: &str) -> Result<Self, String> {
        let options = ClientOptions::new().with_allow_http(container_url.starts_with("http://"));
        let http = ReqwestConnector::default().connect(&options).map_err(|e| e.to_string())?;
        Ok(Blocks {
            client,
            http,
            container_url: container_url.trim_end_matches('/').to_string(),
            account: account.to_string(),
            copies: AtomicBool::new(false),
        })
    }

    /// Stages block `id` of the blob at `path`: bytes `range` of its version `e_tag`, copied
    /// inside the server.
    async fn copy_block(&self, path: &Path, id: &str, e_tag: &str, range: std::ops::Range<u64>) -> Result<(), Failed> {
        let credential = self.credential().await?;
        let (source, authorization) = match &*credential {
            AzureCredential::AccessKey(_) => {
                let signed = self.client.signed_url(http::Method::GET, path, SOURCE_SAS).await;
                (signed.map_err(|e| Failed::Other(super::one_line(&e)))?.to_string(), None)
            }
            AzureCredential::SASToken(pairs) => {
                let mut url = self.url(path, &[])?;
                url.query_pairs_mut().extend_pairs(pairs);
                (url.to_string(), None)
            }
            AzureCredential::BearerToken(token) => (self.url(path, &[])?.to_string(), Some(format!("Bearer {token}"))),
        };
        let range = format!("bytes={}-{}", range.start, range.end - 1);
        let mut headers = vec![
            ("x-ms-copy-source", source.as_str()),
            ("x-ms-source-range", range.as_str()),
            ("x-ms-source-if-match", e_tag),
        ];
        if let Some(authorization) = &authorization {
            headers.push(("x-ms-copy-source-authorization", authorization.as_str()));
        }
        let query = [("comp", "block"), ("blockid", id)];
        let (status, text) = self.send("copy", || self.signed("PUT", path, &query, &headers, Bytes::new())).await?;
        let code = tag(&text, "Code");
        match (status, code.as_deref()) {
            (201, _) => Ok(()),
            // The version to copy is no longer there: another writer replaced it (Azure answers
            // 412, its code ConditionNotMet, SourceConditionNotMet or CannotVerifyCopySource; one
            // whose blob is gone, 404).
            (412 | 404, _) | (_, Some("ConditionNotMet" | "SourceConditionNotMet" | "BlobNotFound")) => {
                Err(Failed::Refused)
            }
            _ => Err(Failed::Other(format!("copying a block: {status}: {}", code.unwrap_or(text)))),
        }
    }

    /// Stages block `id` of the blob at `path`: `bytes`.
    async fn put_block(&self, path: &Path, id: &str, bytes: Bytes) -> Result<(), Failed> {
        let query = [("comp", "block"), ("blockid", id)];
        let len = bytes.len() as u64;
        let (status, text) = self.send("multipart", || self.signed("PUT", path, &query, &[], bytes.clone())).await?;
        match status {
            201 => {
                metrics::sent(len);
                Ok(())
            }
            _ => Err(Failed::Other(format!("sending a block: {status}: {}", tag(&text, "Code").unwrap_or(text)))),
        }
    }

    /// Commits blocks `ids`, in order, as the blob at `path`, over its version `e_tag` only, with
    /// `note` (when not empty) as its note.
    async fn commit(&self, path: &Path, ids: &[String], e_tag: &str, note: &str) -> Result<PutResult, Failed> {
        let mut body = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for id in ids {
            body.push_str(&format!("<Uncommitted>{id}</Uncommitted>"));
        }
        body.push_str("</BlockList>");
        let name = format!("x-ms-meta-{}", super::exchange::NOTE);
        let mut headers = vec![("If-Match", e_tag)];
        if !note.is_empty() {
            headers.push((name.as_str(), note));
        }
        let query = [("comp", "blocklist")];
        let body = Bytes::from(body);
        let (status, text, e_tag) =
            self.send_for_e_tag("multipart", || self.signed("PUT", path, &query, &headers, body.clone())).await?;
        let code = tag(&text, "Code");
        match (status, code.as_deref(), e_tag) {
            (201, _, Some(e_tag)) => {
                Ok(PutResult { e_tag: Some(e_tag), version: None, extensions: Default::default() })
            }
            // Another writer stored a version first (412; its commit also dropped the blocks staged
            // here, which a server that looks at them first answers InvalidBlockList). A 412 to a
            // commit sent again after its answer was lost may be this commit's own: the shard is
            // then read and merged again, and nothing is lost.
            (412, _, _) | (_, Some("ConditionNotMet" | "InvalidBlockList"), _) => Err(Failed::Refused),
            _ => Err(Failed::Other(format!("committing blocks: {status}: {}", code.unwrap_or(text)))),
        }
    }

    /// The mount's credential, as object_store has it now.
    async fn credential(&self) -> Result<Arc<AzureCredential>, Failed> {
        self.client.credentials().get_credential().await.map_err(|e| Failed::Other(super::one_line(&e)))
    }

    /// The URL of the blob at `path`, with `query`.
    fn url(&self, path: &Path, query: &[(&str, &str)]) -> Result<url::Url, Failed> {
        let mut url = url::Url::parse(&self.container_url).map_err(|e| Failed::Other(e.to_string()))?;
        url.path_segments_mut().map_err(|_| Failed::Other("a container URL with no path".into()))?.extend(path.parts());
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// A `method` request (with `body`) to the blob at `path`, with `query` and `headers`,
    /// authorized as object_store authorizes its own.
    async fn signed(
        &self,
        method: &str,
        path: &Path,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<HttpRequest, Failed> {
        let url = self.url(path, query)?;
        // Shared Key signs the length: it must be in the request when it is signed.
        let mut request =
            http::Request::builder().method(method).uri(url.as_str()).header("Content-Length", body.len().to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request: HttpRequest = request.body(body.into()).map_err(|e| Failed::Other(e.to_string()))?;
        let credential = self.credential().await?;
        AzureAuthorizer::new(&credential, &self.account)
            .try_authorize(&mut request)
            .map_err(|e| Failed::Other(super::one_line(&e)))?;
        Ok(request)
    }

    /// [`Blocks::send_for_e_tag`] without the ETag.
    async fn send<F, R>(&self, kind: &'static str, make: F) -> Result<(u16, String), Failed>
    where
        F: Fn() -> R,
        R: std::future::Future<Output = Result<HttpRequest, Failed>>,
    {
        self.send_for_e_tag(kind, make).await.map(|(status, text, _)| (status, text))
    }

    /// Sends the request `make` makes ([`super::resend`]): the status, body and ETag of the
    /// answer.
    async fn send_for_e_tag<F, R>(&self, kind: &'static str, make: F) -> Result<(u16, String, Option<String>), Failed>
    where
        F: Fn() -> R,
        R: std::future::Future<Output = Result<HttpRequest, Failed>>,
    {
        super::resend::send(&self.http, kind, make).await.map(|answer| (answer.status, answer.text, answer.e_tag))
    }
}

#[async_trait]
impl ConditionalDelete for Blocks {
    async fn delete_at(&self, path: &Path, e_tag: &str) -> Result<bool, Failed> {
        let headers = [("If-Match", e_tag)];
        let (status, text) = self.send("delete", || self.signed("DELETE", path, &[], &headers, Bytes::new())).await?;
        match status {
            200..=299 | 404 => Ok(true),
            412 => Ok(false),
            _ => Err(Failed::Other(format!("{status}: {}", tag(&text, "Code").unwrap_or(text)))),
        }
    }
}

#[async_trait]
impl Extender for Blocks {
    async fn probe(&self, path: &Path, e_tag: &str) {
        let bogus = format!("\"not-{}\"", e_tag.trim_matches('"'));
        let (own, other) = futures_util::future::join(
            self.copy_block(path, &block_id(), e_tag, 0..1),
            self.copy_block(path, &block_id(), &bogus, 0..1),
        )
        .await;
        let why = match (own, other) {
            (Ok(()), Err(Failed::Refused)) => None,
            (Ok(()), Ok(())) => Some("the server copies blocks of another version than the one asked for".to_string()),
            (Err(Failed::Refused), _) => Some("the server refuses to copy a block of the version there".to_string()),
            (Ok(()), Err(Failed::Other(e))) | (Err(Failed::Other(e)), _) => {
                Some(format!("blocks cannot be copied from a blob's URL ({e})"))
            }
        };
        if let Some(why) = &why {
            log::info!("{why}; shards go up whole");
        }
        let copies = why.is_none();
        self.copies.store(copies, Ordering::Relaxed);
    }

    fn keeps(&self, kept: u64) -> bool {
        self.copies.load(Ordering::Relaxed) && kept >= LEAST_KEPT
    }

    async fn extend(
        &self,
        path: &Path,
        e_tag: &str,
        kept: u64,
        tail: &[&[u8]],
        note: &str,
    ) -> Result<PutResult, Failed> {
        if kept < LEAST_KEPT {
            return Err(Failed::Other(format!("{kept} bytes kept: fewer than {LEAST_KEPT}")));
        }
        let copies = kept.div_ceil(MOST_COPIED);
        let each = kept.div_ceil(copies);
        let size: usize = tail.iter().map(|p| p.len()).sum();
        let sent = size.div_ceil(MOST_SENT);
        // Every block a name of its own: the blocks another writer stages on the blob meanwhile
        // are in the same list of uncommitted blocks.
        let ids: Vec<String> = (0..copies as usize + sent).map(|_| block_id()).collect();
        let copied = futures_util::stream::iter(0..copies)
            .map(|n| self.copy_block(path, &ids[n as usize], e_tag, n * each..((n + 1) * each).min(kept)))
            .buffered(AT_ONCE);
        let put = futures_util::stream::iter(0..sent)
            .map(|n| {
                let bytes = super::multipart::gather(tail, n * MOST_SENT, ((n + 1) * MOST_SENT).min(size));
                self.put_block(path, &ids[copies as usize + n], bytes)
            })
            .buffered(AT_ONCE);
        // The copies and the new bytes go at once: each is a round trip of its own.
        futures_util::future::try_join(copied.try_collect::<Vec<()>>(), put.try_collect::<Vec<()>>()).await?;
        self.commit(path, &ids, e_tag, note).await
    }
}

/// A new block ID: random, base64 of 32 hex digits (as object_store names its blocks: a blob's
/// block IDs must all be one length).
fn block_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    let (high, low) = (RandomState::new().hash_one(Instant::now()), RandomState::new().hash_one(Instant::now()));
    base64::engine::general_purpose::STANDARD.encode(format!("{high:016x}{low:016x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ids_are_of_one_length_and_differ() {
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|_| block_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.len() == 44));
    }
}
