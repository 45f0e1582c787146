//! The server's clock as this process last heard it: the newest `Date` header among the answers
//! of a store's client (every HTTP/1.1 server sends one; S3, Azure and GCS do).
//!
//! A commit in doubt must know how long it stalled, and its own clocks cannot always tell: a VM
//! paused with its clock stopped wakes believing no time passed. The server's clock went on. A
//! `Date` seen before a request was sent is no later than the server's time when it arrived, and
//! one seen after an answer is no earlier than the server's time when it was made (to the
//! second), so the difference bounds from above how long anything took in between, on the clock
//! that also stamps the exchange's objects (`Last-Modified`), by which their lifetimes run out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// The newest `Date` a store's server answered with.
#[derive(Debug, Default)]
pub struct ServerClock {
    /// Whole seconds since the Unix epoch; 0 until an answer with a `Date` came.
    newest: AtomicU64,
}

impl ServerClock {
    /// The server's time as of its newest answer, to the second (rounded down, as `Date` is).
    pub fn now(&self) -> Option<SystemTime> {
        match self.newest.load(Ordering::Acquire) {
            0 => None,
            secs => Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
        }
    }

    /// Takes in an answer's `Date` header (an HTTP-date, RFC 9110 5.6.7); one that does not
    /// parse is left out.
    fn saw(&self, date: &[u8]) {
        let parsed = std::str::from_utf8(date).ok().and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok());
        if let Some(secs) = parsed.and_then(|t| u64::try_from(t.timestamp()).ok()).filter(|s| *s > 0) {
            self.newest.fetch_max(secs, Ordering::AcqRel);
        }
    }
}

/// object_store's own HTTP client, with the `Date` of every answer about bucket `bucket` (a
/// container, on Azure) taken into `clock`. The client also asks for credentials (STS, instance
/// metadata, Azure AD), on other machines with clocks of their own: their answers are left out,
/// as the newest date wins and one clock ahead would hide the server's.
#[derive(Debug)]
pub struct DatedConnector {
    pub clock: Arc<ServerClock>,
    pub bucket: String,
}

impl HttpConnector for DatedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Dated { inner, clock: self.clock.clone(), bucket: self.bucket.clone() }))
    }
}

#[derive(Debug)]
struct Dated {
    inner: HttpClient,
    clock: Arc<ServerClock>,
    bucket: String,
}

impl Dated {
    /// Whether `uri` names the bucket: its host (virtual-hosted style), or one of its path's first
    /// two parts (path style; an emulator's account comes first).
    fn about_bucket(&self, uri: &http::Uri) -> bool {
        let hosted = uri.host().and_then(|h| h.strip_prefix(self.bucket.as_str())).is_some_and(|h| h.starts_with('.'));
        hosted || uri.path().trim_start_matches('/').split('/').take(2).any(|part| part == self.bucket)
    }
}

#[async_trait]
impl HttpService for Dated {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let about_bucket = self.about_bucket(request.uri());
        let answer = self.inner.execute(request).await?;
        if let Some(date) = answer.headers().get(http::header::DATE).filter(|_| about_bucket) {
            self.clock.saw(date.as_bytes());
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_date_an_answer_gave() {
        let clock = ServerClock::default();
        assert_eq!(clock.now(), None);
        clock.saw(b"Sun, 06 Dec 2026 06:03:44 GMT");
        clock.saw(b"Sun, 06 Dec 2026 06:03:40 GMT");
        clock.saw(b"not a date");
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_537_024);
        assert_eq!(clock.now(), Some(at));
        clock.saw(b"Sun, 06 Dec 2026 06:05:44 GMT");
        assert_eq!(clock.now(), Some(at + Duration::from_secs(120)));
    }

    #[test]
    fn only_answers_about_the_bucket_tell_its_servers_time() {
        let dated = Dated {
            inner: ReqwestConnector::default().connect(&ClientOptions::new()).expect("a client"),
            clock: Arc::default(),
            bucket: "data".into(),
        };
        let about = |uri: &str| dated.about_bucket(&uri.parse().expect("a URI"));
        assert!(about("https://data.s3.eu-west-1.amazonaws.com/a/zarr.json"));
        assert!(about("http://127.0.0.1:9000/data/a/zarr.json"));
        assert!(about("http://127.0.0.1:10000/devstoreaccount1/data/a"), "Azurite names its account first");
        assert!(about("https://acct.blob.core.windows.net/data?restype=container"));
        assert!(!about("https://sts.amazonaws.com/?Action=AssumeRoleWithWebIdentity"));
        assert!(!about("http://169.254.169.254/latest/api/token"));
        assert!(!about("http://169.254.170.2/v2/credentials/abc"));
        assert!(!about("https://login.microsoftonline.com/tenant/oauth2/v2.0/token"));
        assert!(!about("https://database.s3.amazonaws.com/x/y"));
        assert!(!about("http://127.0.0.1:9000/dataset/x"));
    }
}
