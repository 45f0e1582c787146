//! `https://HOST/PATH` and `http://HOST/PATH` URLs: a Zarr store on a plain web server, read-only.
//!
//! The server is reached through `object_store`'s `HttpStore`: reads are ranged GETs carrying
//! If-Match with the ETag of the version opened (as for any bucket store), and listings are
//! WebDAV `PROPFIND` requests with `Depth: 1`. Whether the server answers those is asked once,
//! before mounting: a server that does not (nginx without its dav_ext module, most static file
//! servers) is wrapped in [`UnlistedStore`], whose listings come from the Zarr documents. The
//! store never writes, whatever WebDAV methods the server would accept.

use std::sync::Arc;
use std::time::Duration;

use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreExt};

use super::{Abilities, BucketStore, Caching, Service, one_line};

/// A web server: a "server" in messages, never written to, listing only where it has WebDAV.
const SERVICE: Service =
    Service { name: "HTTP", bucket: "server", updates_name_generation: false, abilities: Abilities::ALL };
use crate::format::metadata::ZARR_JSON;
use crate::store::unlisted::UnlistedStore;
use crate::store::{Store, join};

/// How long the probes made before mounting may take.
const PROBE: Duration = Duration::from_secs(10);

/// The origin (`http://HOST:PORT`) and the path below it of an `http://` or `https://` URL;
/// `None` when `url` is not one.
pub fn parse_url(url: &str) -> Option<(&str, &str)> {
    let scheme_len = ["http://", "https://"].iter().find(|s| url.starts_with(**s))?.len();
    let rest = &url[scheme_len..];
    let host_len = rest.find('/').unwrap_or(rest.len());
    if host_len == 0 || rest.contains(['?', '#']) {
        return None;
    }
    Some((&url[..scheme_len + host_len], rest[host_len..].trim_matches('/')))
}

/// Opens the store at `url` (`https://HOST/PATH`), read-only; the error is one line naming the URL.
pub fn open(url: &str, caching: Caching) -> Result<Arc<dyn Store>, String> {
    let (origin, path) =
        parse_url(url).ok_or_else(|| format!("{url}: not an http(s)://HOST/PATH URL (no query or fragment)"))?;
    // The client's base is the origin, not the store's URL: PROPFIND answers name every entry by
    // its path from the origin, and keys must be read back under the names listings give.
    let objects = HttpBuilder::new()
        .with_url(origin)
        .with_retry(super::retry())
        .with_config(ClientConfigKey::AllowHttp, "true")
        .with_config(ClientConfigKey::Timeout, "30s")
        .with_config(ClientConfigKey::ConnectTimeout, "5s")
        .build()
        .map_err(|e| format!("{url}: {}", one_line(&e)))?;
    let objects: Arc<dyn ObjectStore> = Arc::new(objects);
    let store_url = format!("{origin}{}{path}", if path.is_empty() { "" } else { "/" });
    let list = probe(&objects, path, &store_url)?;
    let service = Service { abilities: Abilities { write: false, list, addressed: true }, ..SERVICE };
    let store = BucketStore::of_service(service, objects, path, &store_url, caching)
        .map_err(|e| format!("{store_url}: {e}"))?;
    if list {
        Ok(Arc::new(store))
    } else {
        log::info!("{store_url}: the server does not list directories (WebDAV PROPFIND); listings come from zarr.json");
        Ok(Arc::new(UnlistedStore::new(Arc::new(store))))
    }
}

/// Whether the server lists the store's root with PROPFIND; an error when it cannot be reached.
/// A server that answers a HEAD of the root document but not the PROPFIND cannot list, whatever
/// its refusal looks like (405, 501, 403, or a page that is no WebDAV answer).
fn probe(objects: &Arc<dyn ObjectStore>, path: &str, url: &str) -> Result<bool, String> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("{url}: {e}"))?;
    let root = (!path.is_empty()).then(|| Path::from(path));
    let listed =
        runtime.block_on(async { tokio::time::timeout(PROBE, objects.list_with_delimiter(root.as_ref())).await });
    let why = match listed {
        Ok(Ok(_)) => return Ok(true),
        Ok(Err(e)) => one_line(&e),
        Err(_) => format!("no answer within {} s", PROBE.as_secs()),
    };
    let document = Path::from(join(path, ZARR_JSON));
    match runtime.block_on(async { tokio::time::timeout(PROBE, objects.head(&document)).await }) {
        Ok(Ok(_) | Err(object_store::Error::NotFound { .. })) => {
            log::debug!("{url}: PROPFIND failed: {why}");
            Ok(false)
        }
        Ok(Err(e)) => Err(format!("{url}: cannot reach the server: {}", one_line(&e))),
        Err(_) => Err(format!("{url}: cannot reach the server: no answer within {} s", PROBE.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_origin_and_a_path() {
        assert_eq!(parse_url("https://h.org/a/b/"), Some(("https://h.org", "a/b")));
        assert_eq!(parse_url("http://127.0.0.1:8080/x"), Some(("http://127.0.0.1:8080", "x")));
        assert_eq!(parse_url("http://h"), Some(("http://h", "")));
        assert_eq!(parse_url("http:///x"), None);
        assert_eq!(parse_url("http://h/x?y=1"), None);
        assert_eq!(parse_url("s3://b/x"), None);
    }
}
