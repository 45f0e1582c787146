//! Where the files that references point into are (a kerchunk reference set's, an Icechunk
//! repository's virtual chunks): each URL resolved to a store and a key in it.
//! A URL with a scheme (`s3://bucket/key`, `https://host/path`) is a key of the store at its
//! scheme and authority; `file://PATH` and an absolute path are a file of the local directory
//! holding it; a relative URL is resolved against the reference set's own location (fsspec would
//! take the working directory, which a daemon's is not). Stores are opened once per root, by the
//! opener the mount gives (this layer knows no option of any object store).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::store::Store;

/// Opens the store at a root: a URL's scheme and authority (`s3://bucket`), or a local directory.
pub type OpenRoot = Box<dyn Fn(&str) -> Result<Arc<dyn Store>, String> + Send + Sync>;

/// The stores that referenced URLs are read from.
pub struct Targets {
    /// Where relative URLs are resolved from: the reference set's directory, a path or a URL.
    base: String,
    open_root: OpenRoot,
    roots: Mutex<HashMap<String, Arc<dyn Store>>>,
}

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Targets").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Targets {
    pub fn new(base: String, open_root: OpenRoot) -> Targets {
        Targets { base, open_root, roots: Mutex::new(HashMap::new()) }
    }

    /// The store holding `url`, and its key there; the error says why it cannot be reached.
    pub fn resolve(&self, url: &str) -> Result<(Arc<dyn Store>, String), String> {
        let (root, key) = split(url, &self.base)?;
        if let Some(store) = self.roots.lock().get(&root) {
            return Ok((store.clone(), key));
        }
        // Opening may take a while (a client to build); others wait for no lock meanwhile. A
        // failure is not kept: the directory or bucket may be there next time.
        let store = (self.open_root)(&root).map_err(|e| format!("{url}: {e}"))?;
        Ok((self.roots.lock().entry(root).or_insert(store).clone(), key))
    }
}

/// The root and key of `url`, a relative one taken from `base`.
fn split(url: &str, base: &str) -> Result<(String, String), String> {
    if let Some(path) = url.strip_prefix("file://") {
        return local(path, url);
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
        let key = key.trim_start_matches('/');
        if authority.is_empty() || key.is_empty() || scheme.contains('/') {
            return Err(format!("{url}: not the URL of a file"));
        }
        return Ok((format!("{scheme}://{authority}"), key.to_string()));
    }
    if url.starts_with('/') {
        return local(url, url);
    }
    if url.is_empty() {
        return Err("an empty URL".into());
    }
    if base.contains("://") {
        split(&format!("{}/{url}", base.trim_end_matches('/')), "")
    } else {
        local(&Path::new(base).join(url).to_string_lossy(), url)
    }
}

/// A local file's directory and name.
fn local(path: &str, url: &str) -> Result<(String, String), String> {
    let path = Path::new(path);
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) if path.is_absolute() => Ok((dir.to_string_lossy().into_owned(), name.to_string())),
        _ => Err(format!("{url}: not the path of a file")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_a_root_and_a_key() {
        let cases = [
            ("s3://bucket/a/b.nc", "/refs", ("s3://bucket", "a/b.nc")),
            ("https://host:8080/data/f.h5", "/refs", ("https://host:8080", "data/f.h5")),
            ("file:///data/f.h5", "/refs", ("/data", "f.h5")),
            ("/data/f.h5", "/refs", ("/data", "f.h5")),
            ("f.h5", "/refs", ("/refs", "f.h5")),
            ("sub/f.h5", "/refs", ("/refs/sub", "f.h5")),
            ("../f.h5", "/refs/x", ("/refs/x/..", "f.h5")),
            ("f.h5", "s3://bucket/refs", ("s3://bucket", "refs/f.h5")),
        ];
        for (url, base, (root, key)) in cases {
            assert_eq!(split(url, base), Ok((root.to_string(), key.to_string())), "{url}");
        }
        for url in ["s3://bucket", "s3:///key", "", "file://relative", "https://host/"] {
            assert!(split(url, "/refs").is_err(), "{url}");
        }
    }
}
