//! kerchunk reference sets, as kerchunk and VirtualiZarr write them and fsspec's
//! `ReferenceFileSystem` reads them, as pure functions over bytes: a map from store keys to bytes
//! held inline, or to a byte range (or the whole) of a file at a URL. No I/O: fetching the
//! reference files and the referenced bytes is the store's business
//! ([`crate::store::references`]).
//!
//! - this file: the JSON reference file (version 0: the map itself; version 1: `refs`, with URLs
//!   made of `templates`), and the value forms of both.
//! - [`generated`]: version 1's `gen`, keys made by iterating over dimensions.
//! - [`parquet`]: the parquet layout (`.zmetadata` and `VAR/refs.N.parq` record files), and which
//!   record and row hold a chunk key.

pub mod generated;
pub mod parquet;

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Map, Value};

/// Why a reference set, or one reference in it, cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RefError(pub String);

pub type Result<T> = std::result::Result<T, RefError>;

fn bad(why: impl Into<String>) -> RefError {
    RefError(why.into())
}

/// What a key of a reference set holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// The bytes themselves.
    Inline(Arc<[u8]>),
    /// `len` bytes of the file at `url` from `start`; no `len`: the whole file.
    Range { url: Arc<str>, start: u64, len: Option<u64> },
    /// A value that cannot be read, and why: the key is there, and reading it fails.
    Bad(String),
}

/// Interns URLs, which thousands of references share.
#[derive(Debug, Default)]
pub struct Urls(HashMap<String, Arc<str>>);

impl Urls {
    pub fn get(&mut self, url: &str) -> Arc<str> {
        if let Some(url) = self.0.get(url) {
            return url.clone();
        }
        let shared: Arc<str> = url.into();
        self.0.insert(url.to_string(), shared.clone());
        shared
    }
}

/// The references of a JSON reference file, in its order (a key given twice: the later counts,
/// as in a JSON object). Fails only when the file as a whole cannot be read; a value that cannot
/// be is a [`Reference::Bad`] at its key.
pub fn parse_json(bytes: &[u8]) -> Result<Vec<(String, Reference)>> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(doc) = doc else { return Err(bad("not a JSON object")) };
    let mut urls = Urls::default();
    match doc.get("version") {
        None => Ok(doc.iter().map(|(key, value)| (key.clone(), reference(value, &Map::new(), &mut urls))).collect()),
        Some(version) if version.as_u64() == Some(1) => {
            let templates = match doc.get("templates") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(templates)) => templates.clone(),
                Some(_) => return Err(bad("\"templates\" is not a JSON object")),
            };
            let mut refs = match doc.get("gen") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(entries)) => generated::expand(entries, &templates, &mut urls)?,
                Some(_) => return Err(bad("\"gen\" is not a JSON array")),
            };
            match doc.get("refs") {
                None | Some(Value::Null) => {}
                Some(Value::Object(map)) => {
                    refs.extend(map.iter().map(|(key, value)| (key.clone(), reference(value, &templates, &mut urls))))
                }
                Some(_) => return Err(bad("\"refs\" is not a JSON object")),
            }
            Ok(refs)
        }
        Some(version) => Err(bad(format!("reference format version {version}; shardfs reads versions 0 and 1"))),
    }
}

/// What one value of a reference map means: a string is the bytes (`base64:` and their base64,
/// or the text), a list a URL and perhaps a range of it, an object a JSON document.
fn reference(value: &Value, templates: &Map<String, Value>, urls: &mut Urls) -> Reference {
    match value {
        Value::String(text) => match text.strip_prefix("base64:") {
            Some(encoded) => match base64::engine::general_purpose::STANDARD.decode(encoded) {
                Ok(bytes) => Reference::Inline(bytes.into()),
                Err(e) => Reference::Bad(format!("inline base64 that does not decode: {e}")),
            },
            None => Reference::Inline(text.as_bytes().into()),
        },
        Value::Object(_) => Reference::Inline(value.to_string().into_bytes().into()),
        Value::Array(parts) => {
            let url = match parts.first() {
                Some(Value::String(url)) => match fill_templates(url, templates) {
                    Ok(url) => urls.get(&url),
                    Err(e) => return Reference::Bad(e.0),
                },
                Some(Value::Null) => {
                    return Reference::Bad("no URL (fsspec's target= option, which shardfs does not take)".into());
                }
                _ => return Reference::Bad(format!("{value} does not start with a URL")),
            };
            match parts.len() {
                1 => Reference::Range { url, start: 0, len: None },
                3 => match (parts[1].as_u64(), parts[2].as_u64()) {
                    (Some(start), Some(len)) => Reference::Range { url, start, len: Some(len) },
                    _ => Reference::Bad(format!("{value}: the offset and length are not whole numbers")),
                },
                _ => Reference::Bad(format!("{value} is neither [url] nor [url, offset, length]")),
            }
        }
        other => Reference::Bad(format!("{other} is not a reference")),
    }
}

/// `url` with each `{{name}}` replaced by template `name`, as fsspec's simple templates do.
pub fn fill_templates(url: &str, templates: &Map<String, Value>) -> Result<String> {
    if templates.is_empty() || !url.contains("{{") {
        return Ok(url.to_string());
    }
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(open) = rest.find("{{") {
        let close = rest[open..].find("}}").ok_or_else(|| bad(format!("{url}: a {{{{ with no }}}}")))? + open;
        let name = &rest[open + 2..close];
        let value = templates.get(name).and_then(Value::as_str).ok_or_else(|| {
            bad(format!("{url}: no template named {name:?} (fsspec's simple templates: {{{{name}}}} alone)"))
        })?;
        out.push_str(&rest[..open]);
        out.push_str(value);
        rest = &rest[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(url: &str, start: u64, len: Option<u64>) -> Reference {
        Reference::Range { url: url.into(), start, len }
    }

    #[test]
    fn version_0_is_the_map_itself() {
        let refs = parse_json(
            br#"{".zgroup": "{\"zarr_format\":2}", "a/0": ["f.h5", 10, 20], "a/1": ["f.h5"],
            "b": "base64:AAEC", "c": {"zarr_format": 2}}"#,
        )
        .unwrap();
        assert_eq!(refs[0], (".zgroup".into(), Reference::Inline(br#"{"zarr_format":2}"#[..].into())));
        assert_eq!(refs[1].1, range("f.h5", 10, Some(20)));
        assert_eq!(refs[2].1, range("f.h5", 0, None));
        assert_eq!(refs[3].1, Reference::Inline([0u8, 1, 2][..].into()));
        assert_eq!(refs[4].1, Reference::Inline(br#"{"zarr_format":2}"#[..].into()));
    }

    #[test]
    fn version_1_fills_templates_in_urls() {
        let refs = parse_json(
            br#"{"version": 1, "templates": {"u": "s3://bucket/long/path"},
                 "refs": {"a/0": ["{{u}}/f.nc", 1, 2], "a/1": ["{{v}}/f.nc", 1, 2], "x": "\u0007"}}"#,
        )
        .unwrap();
        assert_eq!(refs[0].1, range("s3://bucket/long/path/f.nc", 1, Some(2)));
        assert!(matches!(&refs[1].1, Reference::Bad(why) if why.contains("no template named \"v\"")));
        assert_eq!(refs[2].1, Reference::Inline([7u8][..].into()));
    }

    #[test]
    fn bad_values_are_bad_at_their_key_and_bad_files_fail() {
        let refs =
            parse_json(br#"{"a": [1, 2], "b": ["f", -1, 2], "c": ["f", 1], "d": 5, "e": "base64:!!", "f": [null]}"#)
                .unwrap();
        assert!(refs.iter().all(|(_, r)| matches!(r, Reference::Bad(_))), "{refs:?}");
        for (doc, why) in [
            (&b"[1]"[..], "not a JSON object"),
            (b"{\"version\": 2}", "version 2"),
            (b"{", "not JSON"),
            (b"{\"version\": 1, \"refs\": []}", "\"refs\""),
        ] {
            assert!(parse_json(doc).unwrap_err().0.contains(why), "{why}");
        }
    }
}
