//! `shardfs refs`: the view as a kerchunk reference file (version 1), for machines that cannot
//! mount it (no FUSE). Every metadata file of the view is inlined as the view serves it, every
//! inner chunk is a `[shard URL, offset, length]` reference to its bytes inside its shard (less a
//! trailing crc32c where the presentation strips it), and every other file the view shows as it
//! is stored is a `[URL]` reference to the whole file. Where the store's files are ranges of
//! bigger files (a zip store's entries, [`Store::location`]), references name the bigger file
//! and the range there: `[zip URL, offset, length]`.
//!
//! A reference file is a snapshot that nothing checks later: a reference to bytes that are not the
//! chunk would be read as data. So what references cannot say is refused, with one line naming the
//! file, rather than written: a damaged shard or index entry (the view reads EIO there; a reference
//! file could only leave the chunk out, which reads as fill value), a symbolic link or special
//! file, and a store that changed while it was walked. Each shard's indexes are read once, from
//! one version of the shard, and once the walk is done every shard and document it used is
//! checked to be still that version.

use std::collections::HashMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Arc;

use base64::Engine;

use crate::store::{Kind, Location, Stamp, Store, join};
use crate::view::array::ShardedArray;
use crate::view::documents::source_of;
use crate::view::error::Error as ViewError;
use crate::view::index_cache::IndexCache;
use crate::view::namespace::{ChunkInShard, Content, Namespace, Node};
use crate::view::overlay::NoOverlay;
use crate::view::presentation::{Presentation, ZarrV2, ZarrV3};
use crate::view::shards::ChunkState;

/// Writes the reference file of `store`'s view (Zarr `zarr_format` 2 or 3) to `out`. On an error
/// (one line naming the file and the cause) what was written is not a complete JSON document.
pub fn refs_command(store: Arc<dyn Store>, zarr_format: u8, out: &mut dyn Write) -> Result<(), String> {
    let presentation: Arc<dyn Presentation> = if zarr_format == 2 { Arc::new(ZarrV2) } else { Arc::new(ZarrV3) };
    if let Some(why) = presentation.cannot_show(&*source_of(&*store)) {
        return Err(format!("{}: {why}", store.url("")));
    }
    if store.synthesized() {
        return Err(format!(
            "{}: BLZ data cannot be referenced (short last chunks exist only in the view)",
            store.url("")
        ));
    }
    let ns = Namespace::new(store.clone(), presentation, IndexCache::default(), Arc::new(NoOverlay));
    let mut refs = Refs { ns: &ns, out, first: true, used: HashMap::new(), consolidated: Vec::new() };
    refs.write(b"{\"version\":1,\"refs\":{")?;
    refs.dir(&ns.root(), "")?;
    // Checked before the document is closed, so that refused references are never valid JSON.
    refs.check_unchanged()?;
    refs.write(b"\n}}\n")?;
    refs.out.flush().map_err(|e| format!("cannot write the references: {e}"))
}

/// One walk of the view, writing references as it goes.
struct Refs<'a> {
    ns: &'a Namespace,
    out: &'a mut dyn Write,
    first: bool,
    /// Every shard and document the references were taken from, with the version read.
    used: HashMap<String, Stamp>,
    /// Consolidated metadata files inlined (the v2 view's `.zmetadata`), with what was inlined.
    consolidated: Vec<(Node, Vec<u8>)>,
}

impl Refs<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.out.write_all(bytes).map_err(|e| format!("cannot write the references: {e}"))
    }

    /// Writes the reference of view path `path`.
    fn entry(&mut self, path: &str, reference: serde_json::Value) -> Result<(), String> {
        let line = format!("{}\n{}:{}", if self.first { "" } else { "," }, serde_json::Value::from(path), reference);
        self.first = false;
        self.write(line.as_bytes())
    }

    /// Remembers that the references rely on `key` being at version `stamp`; refuses when an
    /// earlier step of the walk read another version of it.
    fn rely_on(&mut self, key: &str, stamp: Stamp) -> Result<(), String> {
        match self.used.insert(key.to_string(), stamp) {
            Some(before) if before != stamp => Err(self.changed(key)),
            _ => Ok(()),
        }
    }

    fn changed(&self, key: &str) -> String {
        format!("{}: changed while the references were made; run again once the store is quiet", self.url(key))
    }

    fn url(&self, key: &str) -> String {
        self.ns.store().url(key)
    }

    /// Where another program finds the bytes of store file `key`.
    fn location(&self, key: &str) -> Result<Location, String> {
        self.ns.store().location(key).map_err(|e| format!("{e}, which a reference file cannot express"))
    }

    /// References for everything the view shows in directory `node`, whose view path is `path`.
    fn dir(&mut self, node: &Node, path: &str) -> Result<(), String> {
        let failed = |e: ViewError| format!("{}: {e}", self.describe_path(path));
        // Chunk files are left to the shard walk below, which reads each shard once.
        let listing = self.ns.list_from(node, &Default::default()).map_err(failed)?;
        for (name, _) in listing.entries {
            let child_path = join(path, &name);
            let (child, answer) = match self.ns.entry(node, &name) {
                Ok(found) => found,
                // Gone since the listing: the store is changing under the walk.
                Err(ViewError::NotFound) => return Err(self.changed(&child_path)),
                Err(e) => return Err(format!("{}: {e}", self.describe_path(&child_path))),
            };
            match child {
                Node::ChunkDir { .. } | Node::Chunk { .. } => {}
                Node::Stored(ref key) => {
                    let attr = answer.map_err(|e| format!("{}: {e}", self.url(key)))?.attr;
                    match attr.kind {
                        Kind::Dir => self.dir(&child, &child_path)?,
                        Kind::File => {
                            let reference = match self.location(key)? {
                                Location::At { url, start: None } => serde_json::json!([url]),
                                Location::At { url, start: Some(start) } => serde_json::json!([url, start, attr.size]),
                                Location::Inline => {
                                    inline(self.ns.store().read(key).map_err(|e| format!("{}: {e}", self.url(key)))?)
                                }
                            };
                            self.entry(&child_path, reference)?
                        }
                        Kind::Symlink => {
                            return Err(format!(
                                "{}: a symbolic link, which a reference file cannot express",
                                self.url(key)
                            ));
                        }
                        Kind::Other => {
                            return Err(format!(
                                "{}: not a regular file, which a reference file cannot express",
                                self.url(key)
                            ));
                        }
                    }
                }
                Node::Document(_) => self.document(&child, &child_path)?,
                Node::Consolidated(_) => {
                    let failed = |e: ViewError| format!("{}: {e}", self.url(""));
                    let size = self.ns.answer(&child).map_err(failed)?.attr.size;
                    let (bytes, _) = self.read(&child, size).map_err(failed)?;
                    self.consolidated.push((child, bytes.clone()));
                    self.entry(&child_path, inline(bytes))?;
                }
            }
        }
        if let Node::Stored(dir) = node
            && let Some(array) = self.ns.array_at(dir).map_err(|e| format!("{}: {e}", self.url(dir)))?
        {
            self.chunks(&array)?;
        }
        Ok(())
    }

    fn describe_path(&self, path: &str) -> String {
        self.ns.document_at(path).map_or_else(|| self.url(path), |key| self.url(&key))
    }

    /// The inline reference of a metadata file of the view: its content as the view serves it.
    fn document(&mut self, node: &Node, path: &str) -> Result<(), String> {
        let key = self.ns.document_at(path).ok_or_else(|| self.changed(path))?;
        let failed = |e: ViewError| format!("{}: {e}", self.url(&key));
        let answer = self.ns.answer(node).map_err(failed)?;
        let (bytes, content) = self.read(node, answer.attr.size).map_err(failed)?;
        // The rendering was taken from the version opened; a newer one since the answer is a
        // change under the walk (the final check finds it too).
        let stamp = content.version().unwrap_or(answer.attr.stamp);
        self.rely_on(&key, stamp)?;
        if bytes.len() as u64 != answer.attr.size {
            return Err(self.changed(&key));
        }
        self.entry(path, inline(bytes))
    }

    /// The content of view file `node`, up to `size` bytes, and the content opened.
    fn read(&self, node: &Node, size: u64) -> Result<(Vec<u8>, Content), ViewError> {
        let content = self.ns.open(node)?;
        let mut bytes = Vec::new();
        while (bytes.len() as u64) < size {
            let piece = content.read(bytes.len() as u64, 1 << 20)?;
            if piece.is_empty() {
                break;
            }
            bytes.extend_from_slice(&piece);
        }
        Ok((bytes, content))
    }

    /// The references of every stored inner chunk of `array`, from one reading of each shard.
    fn chunks(&mut self, array: &ShardedArray) -> Result<(), String> {
        if let Some((key, stamp)) = &array.document {
            self.rely_on(key, *stamp)?;
        }
        let ns = self.ns;
        let mut refused = Ok(());
        // Where the shard at hand is, found once per shard.
        let mut shard_at: Option<(String, Location)> = None;
        let walked = ns.for_each_chunk_by_shard(array, |chunk: ChunkInShard| {
            let (shard, path) = (chunk.shard, join(&array.dir, &array.chunk_key(chunk.coords)));
            refused = match (chunk.state, chunk.shard_attr) {
                (ChunkState::Stored(range), Some(attr)) => {
                    let len = range.end - range.start;
                    let located = match &shard_at {
                        Some((key, at)) if key == shard => Ok(at.clone()),
                        _ => self.location(shard).inspect(|at| shard_at = Some((shard.to_string(), at.clone()))),
                    };
                    match (if array.strip_crc32c { len.checked_sub(4) } else { Some(len) }, located) {
                        (_, Err(e)) => Err(e),
                        (Some(len), Ok(Location::At { url, start })) => {
                            self.rely_on(shard, attr.stamp).and_then(|()| {
                                self.entry(&path, serde_json::json!([url, start.unwrap_or(0) + range.start, len]))
                            })
                        }
                        (_, Ok(Location::Inline)) => Err(format!(
                            "{}: held in the store itself, so its chunks have no place",
                            ns.store().url(shard)
                        )),
                        (None, _) => Err(format!(
                            "{}: chunk {path} is {len} bytes, too short for its crc32c",
                            ns.store().url(shard)
                        )),
                    }
                }
                _ => Err(format!(
                    "{}: damaged (see shardfs check), so chunk {path} cannot be referenced",
                    ns.store().url(shard)
                )),
            };
            if refused.is_err() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        walked.map_err(|e| format!("{}: {e}", self.url(&array.dir)))?;
        refused
    }

    /// Refuses when a shard or document the references were taken from is no longer the version
    /// read: the references may then point to bytes that are not the chunk.
    fn check_unchanged(&self) -> Result<(), String> {
        // Consolidated metadata is computed from every document: it must still be what was
        // inlined, which was then built from the same versions as the documents inlined.
        for (node, inlined) in &self.consolidated {
            let failed = |e: ViewError| format!("{}: {e}", self.url(""));
            let size = self.ns.answer(node).map_err(failed)?.attr.size;
            if self.read(node, size).map_err(failed)?.0 != *inlined {
                return Err(format!(
                    "{}: its metadata changed while the references were made; run again",
                    self.url("")
                ));
            }
        }
        let mut used: Vec<_> = self.used.iter().collect();
        used.sort_by(|a, b| a.0.cmp(b.0));
        for (key, stamp) in used {
            match self.ns.store().attr(key) {
                Ok(now) if now.stamp == *stamp => {}
                Ok(_) | Err(crate::store::Error::NotFound(_)) => return Err(self.changed(key)),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
}

/// An inline reference: the text itself when it is UTF-8 (and cannot be taken for base64),
/// otherwise `base64:` and its base64.
fn inline(bytes: Vec<u8>) -> serde_json::Value {
    match String::from_utf8(bytes) {
        Ok(text) if !text.starts_with("base64:") => text.into(),
        Ok(text) => base64_ref(text.as_bytes()),
        Err(e) => base64_ref(e.as_bytes()),
    }
}

fn base64_ref(bytes: &[u8]) -> serde_json::Value {
    format!("base64:{}", base64::engine::general_purpose::STANDARD.encode(bytes)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_text_stays_text_unless_it_looks_like_base64() {
        assert_eq!(inline(b"{\"zarr_format\":3}".to_vec()), serde_json::json!("{\"zarr_format\":3}"));
        assert_eq!(inline(b"base64:x".to_vec()), serde_json::json!("base64:YmFzZTY0Ong="));
        assert_eq!(inline(vec![0xff, 0]), serde_json::json!("base64:/wA="));
    }
}
