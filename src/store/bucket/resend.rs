//! The requests shardfs signs and sends itself, where object_store has no call for them (S3's
//! conditional completions, copies of parts and conditional deletes; Azure's blocks copied from a
//! URL and block lists): sent again, after a growing pause, while the network or the server
//! fails, and counted like object_store's own.

use std::time::Instant;

use object_store::client::{HttpClient, HttpRequest};

use super::metered::by_status;
use crate::metrics;

/// Why a request of our own (an upload, a copy, a removal) did not happen.
#[derive(Debug)]
pub enum Failed {
    /// The condition did not hold: another writer got there first.
    Refused,
    /// Anything else, with object_store's error or the server's answer.
    Other(String),
}

/// The text of the first `<name>` element of an XML answer.
pub(super) fn tag(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..end].to_string())
}

/// An answer that is not a failure of the network or the server.
pub(super) struct Answer {
    pub status: u16,
    pub text: String,
    pub e_tag: Option<String>,
}

/// Sends the request `make` makes through `http`, again while the network or the server fails
/// (5xx, or an error in a 200's body, as S3 may answer a completion), up to
/// [`super::TRIES`] times: the first answer that is not such a failure. For requests that may
/// be sent twice.
pub(super) async fn send<F, R>(http: &HttpClient, kind: &'static str, make: F) -> Result<Answer, Failed>
where
    F: Fn() -> R,
    R: std::future::Future<Output = Result<HttpRequest, Failed>>,
{
    let mut last = String::new();
    for attempt in 0..super::TRIES as u32 {
        if attempt > 0 {
            tokio::time::sleep(crate::store::backoff(attempt)).await;
        }
        let request = make().await?;
        let start = Instant::now();
        let answered = http.execute(request).await;
        let status = answered.as_ref().ok().map(|reply| reply.status().as_u16());
        metrics::request(kind, by_status(status), start.elapsed());
        let reply = match answered {
            Ok(reply) => reply,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        let status = reply.status().as_u16();
        let e_tag = reply.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_string);
        match reply.into_body().bytes().await {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                match (status, tag(&text, "Code").as_deref()) {
                    (500.., code)
                    | (_, code @ Some("InternalError" | "SlowDown" | "ServiceUnavailable" | "ServerBusy")) => {
                        last = format!("{status}: {}", code.unwrap_or_default());
                    }
                    _ => return Ok(Answer { status, text, e_tag }),
                }
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(Failed::Other(last))
}
