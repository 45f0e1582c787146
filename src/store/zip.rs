//! A zip file in another store as a read-only store of its entries: an OME-Zarr zipped store
//! (`.ozx`, RFC-9: stored entries, ZIP64, `zarr.json` first) or zarr-python's `ZipStore`, on a
//! local disk or in a bucket alike (the zip is a key of any [`Store`]). The view above sees keys
//! and never knows of zip.
//!
//! The central directory is read once per version of the zip file, in one read (plus one for the
//! end records), and kept while the zip's stamp stays the same. A stored entry is a byte range of
//! the zip file, read in place; where that range starts comes from the entry's local header, read
//! once when it is first opened. A deflated entry is inflated whole (up to [`MAX_INFLATED`]), its
//! CRC-32 checked, and kept in a byte-bounded cache. Every entry's stamp derives from the zip's,
//! so a changed zip file changes them all. Damage costs what it holds: a damaged central
//! directory makes every key EIO (and refuses the mount), a bad local header or an entry past
//! the end makes that entry EIO, each with one log line per version.
//!
//! - [`directory`]: one version's central directory, indexed.

pub mod directory;

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use directory::{Directory, Failure};
use parking_lot::Mutex;

use super::cache::{Cache, Shared};
use super::read_only::{ReadOnlyStore, damaged, errno};
use super::{Attr, BytesObject, Error, Kind, Location, Need, Object, Result, Space, Stamp};
use crate::format::zip::{DEFLATED, STORED};

/// The largest entry inflated: a bigger deflated entry reads as EIO.
pub const MAX_INFLATED: u64 = 256 << 20;

/// Memory for inflated entries.
pub const INFLATED_BUDGET: usize = 64 << 20;

/// The suffixes of zip files mounted as stores.
pub const SUFFIXES: [&str; 2] = [".zip", ".ozx"];

/// The first bytes of a zip file that holds entries, and of an empty one.
pub const MAGIC: [&[u8]; 2] = [b"PK\x03\x04", b"PK\x05\x06"];

/// The directory of the zip version last read, or why it could not be read.
type LastRead = (Stamp, std::result::Result<Arc<Directory>, String>);

/// A zip file as a read-only store.
#[derive(Debug)]
pub struct ZipStore {
    inner: Arc<dyn super::Store>,
    /// The zip file's key in `inner`.
    zip: String,
    last: Mutex<Option<LastRead>>,
    inflated: Cache<usize, std::result::Result<Shared, String>>,
}

/// `key` without empty components: a directory's key may end in `/`, or hold `//`, as a path of
/// a local store may.
fn normal(key: &str) -> std::borrow::Cow<'_, str> {
    if key.starts_with('/') || key.ends_with('/') || key.contains("//") {
        key.split('/').filter(|part| !part.is_empty()).collect::<Vec<_>>().join("/").into()
    } else {
        key.into()
    }
}

/// What a key of the zip is.
enum Node {
    Dir,
    File(usize),
}

impl ZipStore {
    /// The zip file at `zip` in `inner`, its central directory read; the error is one line naming
    /// the zip file and why it cannot be read.
    pub fn open(inner: Arc<dyn super::Store>, zip: &str) -> std::result::Result<Self, String> {
        let store =
            ZipStore { inner, zip: zip.to_string(), last: Mutex::new(None), inflated: Cache::new(INFLATED_BUDGET) };
        store.directory().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// The central directory of the zip file as it is now, read again when it changed.
    fn directory(&self) -> Result<Arc<Directory>> {
        let zip_attr = self.inner.attr(&self.zip)?;
        let mut last = self.last.lock();
        if let Some((stamp, read)) = &*last
            && *stamp == zip_attr.stamp
        {
            return read.clone().map_err(|why| damaged(self.inner.describe(&self.zip), why));
        }
        let file = self.inner.open(&self.zip)?;
        let stamp = file.attr().stamp;
        let read = match Directory::read(file) {
            Ok(directory) => Ok(Arc::new(directory)),
            Err(Failure::Store(e)) => return Err(e),
            Err(Failure::Damaged(why)) => {
                let why = format!("not a readable zip file: {why}");
                log::warn!("{}: {why}", self.inner.describe(&self.zip));
                Err(why)
            }
        };
        *last = Some((stamp, read.clone()));
        read.map_err(|why| damaged(self.inner.describe(&self.zip), why))
    }

    /// What `key` is.
    fn node(&self, directory: &Directory, key: &str) -> Result<Node> {
        let key = &*normal(key);
        if let Some(&n) = directory.files.get(key) {
            Ok(Node::File(n))
        } else if directory.dirs.contains_key(key) {
            Ok(Node::Dir)
        } else {
            Err(Error::NotFound(self.describe(key)))
        }
    }

    fn attr_in(&self, directory: &Directory, key: &str) -> Result<Attr> {
        let zip = *directory.file.attr();
        Ok(match self.node(directory, key)? {
            Node::Dir => zip.dir_inside(key),
            Node::File(n) => zip.file_inside(directory.entries[n].size, n),
        })
    }

    /// Entry `n`'s bytes inflated, from cache or from the zip.
    fn inflate(&self, directory: &Directory, n: usize) -> Result<Shared> {
        let entry = &directory.entries[n];
        let place = self.describe(&entry.name);
        if let Some(done) = self.inflated.get(&n, &directory.stamp()) {
            return done.map_err(|why| damaged(place, why));
        }
        let start = directory.data_start(n)?;
        let compressed = directory.file.read_exact_at(start, entry.compressed_size)?;
        let mut bytes = Vec::with_capacity(entry.size as usize);
        let inflated = flate2::read::DeflateDecoder::new(&compressed[..]).take(entry.size + 1).read_to_end(&mut bytes);
        let done = match inflated {
            Err(e) => Err(format!("cannot inflate: {e}")),
            Ok(_) if bytes.len() as u64 != entry.size => {
                Err(format!("inflates to {} bytes, not the {} its directory says", bytes.len(), entry.size))
            }
            Ok(_) if crc32fast::hash(&bytes) != entry.crc32 => Err("CRC-32 mismatch".to_string()),
            Ok(_) => Ok(Shared::from(bytes)),
        };
        if let Err(why) = &done {
            log::warn!("{place}: {why}; it reads as EIO");
        }
        let held = done.as_ref().map_or(0, |b| b.len());
        self.inflated.insert(n, directory.stamp(), done.clone(), held);
        done.map_err(|why| damaged(place, why))
    }
}

impl ReadOnlyStore for ZipStore {
    /// The zip file's name, then the entry's: `/data/image.ozx/0/zarr.json`.
    fn describe(&self, key: &str) -> String {
        super::join(&self.inner.describe(&self.zip), key)
    }

    fn url(&self, key: &str) -> String {
        super::join(&self.inner.url(&self.zip), key)
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        self.attr_in(&*self.directory()?, key)
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        let directory = self.directory()?;
        match self.node(&directory, dir)? {
            Node::Dir => {
                let names = directory.dirs[&*normal(dir)].iter().map(|(name, kind)| (name.clone(), *kind)).collect();
                Ok((names, directory.stamp().derived(dir)))
            }
            Node::File(_) => Err(errno(self.describe(dir), libc::ENOTDIR)),
        }
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let directory = self.directory()?;
        let attr = self.attr_in(&directory, key)?;
        let place = self.describe(key);
        let Node::File(n) = self.node(&directory, key)? else { return Err(errno(place, libc::EISDIR)) };
        let entry = &directory.entries[n];
        if entry.encrypted {
            log::warn!("{place}: encrypted, which shardfs cannot read");
            return Err(damaged(place, "encrypted"));
        }
        match entry.method {
            STORED if entry.compressed_size != entry.size => Err(damaged(
                place,
                format!("stored, but {} bytes long compressed and {} not", entry.compressed_size, entry.size),
            )),
            STORED => {
                let start = directory.data_start(n)?;
                Ok(Box::new(EntryObject { attr, start, directory, place }))
            }
            DEFLATED if entry.size > MAX_INFLATED => {
                log::warn!("{place}: deflated and {} bytes, more than the {MAX_INFLATED} inflated", entry.size);
                Err(damaged(place, "deflated entry too large to inflate"))
            }
            DEFLATED => Ok(Box::new(BytesObject { attr, bytes: self.inflate(&directory, n)?, place })),
            method => {
                log::warn!("{place}: compression method {method}, which shardfs cannot read (stored and deflated)");
                Err(damaged(place, format!("compression method {method}")))
            }
        }
    }

    fn space(&self) -> Result<Space> {
        self.inner.space()
    }

    /// A stored entry's bytes are a range of the zip file; a deflated one's are nowhere as such.
    fn location(&self, key: &str) -> Result<Location> {
        let directory = self.directory()?;
        let Node::File(n) = self.node(&directory, key)? else { return Err(errno(self.describe(key), libc::EISDIR)) };
        let entry = &directory.entries[n];
        if entry.method != STORED || entry.encrypted {
            return Err(damaged(self.describe(key), "compressed in the zip file, so no range of it holds these bytes"));
        }
        Ok(Location::At { url: self.inner.url(&self.zip), start: Some(directory.data_start(n)?) })
    }
}

/// A stored entry, opened: reads are reads of its range of the zip file version.
#[derive(Debug)]
struct EntryObject {
    attr: Attr,
    /// Where the entry's data starts in the zip file.
    start: u64,
    directory: Arc<Directory>,
    place: String,
}

impl EntryObject {
    /// The part of `len` bytes at `offset` of the entry that it holds, as a range of the zip.
    fn in_zip(&self, offset: u64, len: u64) -> Range<u64> {
        let end = offset.saturating_add(len).min(self.attr.size);
        let offset = offset.min(end);
        self.start + offset..self.start + end
    }
}

impl Object for EntryObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let range = self.in_zip(offset, buf.len() as u64);
        let n = (range.end - range.start) as usize;
        if n == 0 {
            return Ok(0);
        }
        // The range lies before the central directory, which the zip version holds: a short read
        // is the file shrinking under its stamp.
        let mut filled = 0;
        while filled < n {
            match self.directory.file.read_at(&mut buf[filled..n], range.start + filled as u64)? {
                0 => return Err(damaged(self.place.clone(), "the zip file is shorter than its directory says")),
                read => filled += read,
            }
        }
        Ok(n)
    }

    fn place(&self) -> String {
        self.place.clone()
    }

    fn will_need(&self, range: Range<u64>, need: Need) {
        self.directory.file.will_need(self.in_zip(range.start, range.end.saturating_sub(range.start)), need);
    }
}
