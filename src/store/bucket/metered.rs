//! Every request a bucket store makes through object_store, counted for the metrics: an
//! `ObjectStore` around the service's client, so that the store's own code stays as it is and no
//! request goes uncounted (the few that [`super::multipart`] signs itself count through [`timed`]
//! and [`by_status`]).

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

use crate::metrics;

/// How a request that object_store answered ended, as the metrics label it.
fn outcome<T>(result: &Result<T>) -> &'static str {
    result.as_ref().map_or_else(failure, |_| "ok")
}

/// The label of a request that failed with `e`.
fn failure(e: &object_store::Error) -> &'static str {
    use object_store::Error::*;
    match e {
        NotFound { .. } => "not_found",
        Precondition { .. } => "precondition_failed",
        AlreadyExists { .. } => "already_exists",
        NotModified { .. } => "not_modified",
        PermissionDenied { .. } | Unauthenticated { .. } => "denied",
        _ => "error",
    }
}

/// How a request signed here ended, by its answer's status (`None`: no answer came).
pub(super) fn by_status(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "ok",
        Some(304) => "not_modified",
        Some(401 | 403) => "denied",
        Some(404) => "not_found",
        Some(409) => "conflict",
        Some(412) => "precondition_failed",
        _ => "error",
    }
}

/// Awaits `request`, counted as one request of `kind`.
pub(super) async fn timed<T>(kind: &'static str, request: impl Future<Output = Result<T>>) -> Result<T> {
    let start = Instant::now();
    let result = request.await;
    metrics::request(kind, outcome(&result), start.elapsed());
    result
}

/// A client whose requests are counted.
#[derive(Debug)]
pub struct Metered(pub Arc<dyn ObjectStore>);

impl fmt::Display for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A stream of a GET's body whose bytes are counted as they arrive.
fn counting(body: BoxStream<'static, Result<Bytes>>) -> BoxStream<'static, Result<Bytes>> {
    body.inspect(|piece| {
        if let Ok(bytes) = piece {
            metrics::received(bytes.len() as u64);
        }
    })
    .boxed()
}

/// A listing, counted as one request when it ends, fails, or is dropped by a reader that took
/// what it wanted (its pages are not seen here).
struct Listed {
    inner: BoxStream<'static, Result<ObjectMeta>>,
    start: Instant,
    counted: bool,
}

impl Listed {
    fn new(inner: BoxStream<'static, Result<ObjectMeta>>) -> Self {
        Listed { inner, start: Instant::now(), counted: false }
    }

    fn count(&mut self, outcome: &'static str) {
        if !self.counted {
            self.counted = true;
            metrics::request("list", outcome, self.start.elapsed());
        }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.count("ok");
    }
}

impl Stream for Listed {
    type Item = Result<ObjectMeta>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let next = this.inner.poll_next_unpin(cx);
        let ended = match &next {
            Poll::Ready(None) => Some("ok"),
            Poll::Ready(Some(Err(e))) => Some(failure(e)),
            _ => None,
        };
        if let Some(ended) = ended {
            this.count(ended);
        }
        next
    }
}

#[async_trait]
impl ObjectStore for Metered {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let len = payload.content_length() as u64;
        let result = timed("put", self.0.put_opts(location, payload, opts)).await;
        if result.is_ok() {
            metrics::sent(len);
        }
        result
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        timed("multipart", self.0.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let kind = if options.head { "head" } else { "get" };
        let mut result = timed(kind, self.0.get_opts(location, options)).await?;
        result.payload = match result.payload {
            GetResultPayload::Stream(body) => GetResultPayload::Stream(counting(body)),
            other => other,
        };
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let result = timed("get", self.0.get_ranges(location, ranges)).await;
        if let Ok(pieces) = &result {
            metrics::received(pieces.iter().map(|p| p.len() as u64).sum());
        }
        result
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        // One location at a time, as the store deletes: each answer is one request's.
        let mut since = Instant::now();
        self.0
            .delete_stream(locations)
            .inspect(move |deleted| {
                metrics::request("delete", outcome(deleted), since.elapsed());
                since = Instant::now();
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        Listed::new(self.0.list(prefix)).boxed()
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        Listed::new(self.0.list_with_offset(prefix, offset)).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        timed("list", self.0.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        timed("copy", self.0.copy_opts(from, to, options)).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        timed("rename", self.0.rename_opts(from, to, options)).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    use super::*;

    fn count(kind: &str, outcome: &str) -> u64 {
        let snapshot = metrics::snapshot();
        snapshot.requests.iter().filter(|((k, o), _)| *k == kind && *o == outcome).map(|(_, n)| n).sum()
    }

    #[test]
    fn requests_and_bytes_are_counted_by_kind_and_outcome() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Metered(Arc::new(InMemory::new()));
        let path = Path::from("metered/a");
        let before = metrics::snapshot();
        let (puts, heads_missing, deletes) = (count("put", "ok"), count("head", "not_found"), count("delete", "ok"));
        runtime.block_on(async {
            store.put(&path, PutPayload::from_static(b"12345")).await.unwrap();
            assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap().as_ref(), b"12345");
            assert!(store.head(&Path::from("metered/none")).await.is_err());
            store.delete(&path).await.unwrap();
            assert_eq!(store.list(Some(&Path::from("metered"))).count().await, 0);
        });
        let lists = count("list", "ok");
        // A reader that takes one entry and drops the rest still made the request.
        runtime.block_on(async {
            store.put(&path, PutPayload::from_static(b"1")).await.unwrap();
            assert_eq!(store.list(None).take(1).count().await, 1);
        });
        assert!(count("list", "ok") > lists, "counted when dropped");
        let after = metrics::snapshot();
        assert!(count("put", "ok") > puts);
        assert!(count("head", "not_found") > heads_missing);
        assert!(count("delete", "ok") > deletes);
        assert!(count("list", "ok") >= 1);
        assert!(after.bytes_sent >= before.bytes_sent + 5);
        assert!(after.bytes_received >= before.bytes_received + 5);
    }
}
