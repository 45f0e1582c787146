//! BLZ arrays read from the backing store: a Bloscpack file (one shard holding every chunk, its
//! chunk table from the header, the offsets or a walk over chunk headers) or a bcolz carray (one
//! shard per chunk file), each with its sharded `zarr.json`, the version it was read from, and
//! where its bytes are. Refused arrays (not shown) and damaged ones (shown, reads fail) are told
//! apart, each with one log line per version.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::format::blz::bcolz::{self, Carray};
use crate::format::blz::bloscpack::{self, Prefix};
use crate::format::blz::checksum::Checksum;
use crate::format::blz::document::{ArrayDoc, Blosc, UNKNOWN_CLEVEL};
use crate::format::blz::dtype::Dtype;
use crate::format::blz::{BlzError, blosc};
use crate::format::shard_index::EMPTY;
use crate::store::{Attr, Error, Kind, Result, Stamp, Store, join};

/// A stamp standing for several versions at once: it changes when any of them does.
pub fn combine(stamps: &[Stamp]) -> Stamp {
    let word = |k: u64| {
        let mut h = DefaultHasher::new();
        (k, stamps).hash(&mut h);
        h.finish()
    };
    Stamp::new([word(0), word(1), word(2), word(3), word(4)])
}

/// Where an array's bytes are.
#[derive(Debug)]
pub enum Source {
    /// A Bloscpack file: its chunks, each found (start, blosc header) or why not.
    Blp {
        file: String,
        file_len: u64,
        checksum: Checksum,
        chunks: bloscpack::ChunkTable,
        /// The chunks found, as (start, end of the blosc buffer, chunk number), by start.
        by_start: Vec<(u64, u64, usize)>,
    },
    /// A bcolz carray directory.
    Carray { dir: String, carray: Carray },
}

/// A short last chunk, shown as a full chunk.
#[derive(Debug, Clone)]
pub struct ShortLast {
    /// Its uncompressed size as stored.
    pub stored: u64,
    /// One item of the fill value, repeated to pad it.
    pub fill: Vec<u8>,
}

/// One BLZ array, as read from one version of its files.
#[derive(Debug)]
pub struct Array {
    pub source: Source,
    /// The version of everything the description was read from.
    pub stamp: Stamp,
    /// Attributes of the array's directory in the view.
    pub attr: Attr,
    /// The sharded `zarr.json`, or why the array cannot be described (every read of it is EIO).
    pub doc: std::result::Result<Vec<u8>, String>,
    pub rank: usize,
    /// Shard files: 1 for a Bloscpack file, one per chunk for a carray.
    pub shards: u64,
    /// Bytes of a full chunk, uncompressed.
    pub chunk_bytes: u64,
    pub typesize: u8,
    /// Set when the last chunk is stored shorter than a full one.
    pub short_last: Option<ShortLast>,
    /// Chunks in the array.
    pub nchunks: u64,
}

impl Array {
    /// An array whose files are damaged as `why` says: listed, with no chunks, its document EIO.
    fn damaged(source: Source, stamp: Stamp, attr: Attr, why: String) -> Array {
        Array {
            source,
            stamp,
            attr,
            doc: Err(why),
            rank: 1,
            shards: 0,
            chunk_bytes: 0,
            typesize: 1,
            short_last: None,
            nchunks: 0,
        }
    }

    /// Bytes of memory the description holds, for the cache's bound.
    pub fn heap_bytes(&self) -> usize {
        let doc = self.doc.as_ref().map_or(0, Vec::len);
        let chunks = match &self.source {
            Source::Blp { chunks, by_start, .. } => chunks.chunks.len() * 32 + by_start.len() * 24,
            Source::Carray { .. } => 0,
        };
        doc + chunks + 256
    }

    /// True when chunk `i` is the short last chunk.
    pub fn is_short(&self, i: u64) -> bool {
        self.short_last.is_some() && i + 1 == self.nchunks
    }

    /// Where the shard of chunk(s) `shard` lives, for messages and reads.
    pub fn shard_file(&self, shard: u64) -> String {
        match &self.source {
            Source::Blp { file, .. } => file.clone(),
            Source::Carray { dir, .. } => join(dir, &bcolz::chunk_file(shard)),
        }
    }

    /// The index entry of a Bloscpack file's chunk `i` in its shard of `file_len` bytes (the
    /// memcpyed last chunk goes right after the file's bytes); a damaged chunk gets a half-empty
    /// entry, which the view reads as EIO.
    pub fn blp_entry(&self, i: usize) -> (u64, u64) {
        let Source::Blp { chunks, file_len, .. } = &self.source else { return (EMPTY, 0) };
        match chunks.get(i) {
            Some(_) if self.is_short(i as u64) => (*file_len, blosc::memcpyed_len(self.chunk_bytes)),
            Some(chunk) => (chunk.start, chunk.blosc.ctbytes as u64),
            None => (EMPTY, 0),
        }
    }
}

/// Reads the Bloscpack file at `key`. `Ok(None)`: refused (logged).
pub fn read_blp(store: &dyn Store, key: &str) -> Result<Option<Array>> {
    let file = store.open(key)?;
    let attr = *file.attr();
    let len = attr.size;
    let place = store.describe(key);
    let dir_attr = Attr { kind: Kind::Dir, perm: attr.perm | (attr.perm & 0o444) >> 2, nlink: 2, ..attr };
    let damaged = |why: String| {
        log::warn!("{place}: {why}; its array reads as EIO");
        Array::damaged(
            Source::Blp {
                file: key.into(),
                file_len: len,
                checksum: Checksum::None,
                chunks: Default::default(),
                by_start: Vec::new(),
            },
            attr.stamp,
            dir_attr,
            why,
        )
    };
    let first = file.read_exact_at(0, len.min(64))?;
    let prefix = match bloscpack::prefix_len(&first).and_then(|n| {
        if n > len {
            Err(BlzError::Damaged(format!("file of {len} bytes ends inside its {n}-byte header")))
        } else {
            Ok(n)
        }
    }) {
        Ok(n) => Prefix::parse(&file.read_exact_at(0, n)?),
        Err(e) => Err(e),
    };
    let (prefix, shape) = match prefix.and_then(|p| p.array(len).map(|a| (p, a))) {
        Ok(found) => found,
        Err(BlzError::Refused(why)) => {
            log::warn!("{place}: not shown: {why}");
            return Ok(None);
        }
        Err(BlzError::Damaged(why)) => return Ok(Some(damaged(why))),
    };
    let chunks = bloscpack::chunks(&prefix, len, |at| {
        (at < len).then(|| file.read_exact_at(at, (len - at).min(blosc::HEADER_LEN as u64)).ok()).flatten()
    });
    if let Some(first) = &chunks.first_damage {
        log::warn!("{place}: {} damaged chunks ({first}); those read as EIO", chunks.damaged);
    }
    let header = prefix.header;
    let blosc_header = chunks.chunks.iter().flatten().next().map(|c| c.blosc);
    let blosc = Blosc {
        cname: blosc_header.and_then(|h| h.cname().ok()).unwrap_or("blosclz").to_string(),
        clevel: UNKNOWN_CLEVEL,
        shuffle: blosc_header.map_or("noshuffle", |h| h.shuffle()),
        typesize: blosc_header.map_or(header.typesize, |h| h.typesize),
    };
    let nchunks = header.nchunks as u64;
    let mut chunk_shape = shape.shape.clone();
    chunk_shape[0] = shape.chunk_rows;
    let mut shard_shape = chunk_shape.clone();
    shard_shape[0] = shape.chunk_rows * nchunks;
    let attributes = match &prefix.metadata {
        Some(Value::Object(meta)) if meta.get("container").and_then(Value::as_str) != Some("numpy") => meta.clone(),
        _ => Map::new(),
    };
    let doc = ArrayDoc {
        shape: shape.shape.clone(),
        shard_shape,
        chunk_shape,
        dtype: shape.dtype,
        fill_value: shape.dtype.fill_value(&json!(0)),
        blosc,
        attributes,
    };
    let short = header.last_chunk < header.chunk_size;
    let mut by_start: Vec<(u64, u64, usize)> = chunks
        .chunks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.as_ref().map(|c| (c.start, c.start + c.blosc.ctbytes as u64, i)))
        .collect();
    by_start.sort_unstable();
    Ok(Some(Array {
        source: Source::Blp { file: key.into(), file_len: len, checksum: header.checksum, chunks, by_start },
        stamp: attr.stamp,
        attr: dir_attr,
        doc: Ok(doc.to_json()),
        rank: shape.shape.len(),
        shards: 1,
        chunk_bytes: header.chunk_size as u64,
        typesize: doc.blosc.typesize,
        short_last: short
            .then(|| ShortLast { stored: header.last_chunk as u64, fill: vec![0; shape.dtype.size as usize] }),
        nchunks,
    }))
}

/// The files a carray's description is read from.
const CARRAY_META: [&str; 3] = [bcolz::SIZES, bcolz::STORAGE, bcolz::ATTRS];

/// The version of the carray at `dir` now, without reading it.
pub fn carray_stamp(store: &dyn Store, dir: &str) -> Result<Stamp> {
    let mut stamps = vec![store.attr(dir)?.stamp];
    for name in CARRAY_META {
        match store.attr(&join(dir, name)) {
            Ok(attr) => stamps.push(attr.stamp),
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(combine(&stamps))
}

/// Reads the carray at `dir`. `Ok(None)`: refused (logged).
pub fn read_carray(store: &dyn Store, dir: &str) -> Result<Option<Array>> {
    let dir_attr = store.attr(dir)?;
    let mut stamps = vec![dir_attr.stamp];
    let mut contents = Vec::new();
    let mut oversized = None;
    for name in CARRAY_META {
        match store.open(&join(dir, name)) {
            Ok(file) if file.attr().size > bcolz::MAX_META_FILE => {
                stamps.push(file.attr().stamp);
                oversized = Some(format!("{name} is larger than {} bytes", bcolz::MAX_META_FILE));
                contents.push(Vec::new());
            }
            Ok(file) => {
                stamps.push(file.attr().stamp);
                contents.push(file.read_exact_at(0, file.attr().size)?);
            }
            Err(Error::NotFound(_)) if name == bcolz::ATTRS => contents.push(Vec::new()),
            Err(e) => return Err(e),
        }
    }
    let stamp = combine(&stamps);
    let place = store.describe(dir);
    let attr = Attr { stamp, ..dir_attr };
    let parsed = match oversized {
        Some(why) => Err(BlzError::Damaged(why)),
        None => Carray::parse(&contents[0], &contents[1])
            .and_then(|c| bcolz::attributes(&contents[2]).map(|attrs| (c, attrs))),
    };
    let (carray, attributes) = match parsed {
        Ok(found) => found,
        Err(BlzError::Refused(why)) => {
            log::warn!("{place}: not shown: {why}");
            return Ok(None);
        }
        Err(BlzError::Damaged(why)) => {
            log::warn!("{place}: {why}; its array reads as EIO");
            let carray = Carray {
                shape: vec![0],
                dtype: Dtype::parse("|u1").expect("a known type"),
                chunklen: 1,
                dflt: json!(0),
                dflt_bytes: vec![0],
                clevel: None,
                cname: None,
            };
            return Ok(Some(Array::damaged(Source::Carray { dir: dir.into(), carray }, stamp, attr, why)));
        }
    };
    // Codec settings from the first chunk's header; cparams when it cannot be read.
    let first = store.open(&join(dir, &bcolz::chunk_file(0))).and_then(|f| f.read_exact_at(0, 32));
    let header =
        first.ok().and_then(|b| bcolz::check_chunk_header(&b).and_then(|()| blosc::Header::parse(&b[16..])).ok());
    let cname = match (header.and_then(|h| h.cname().ok()), carray.cname.as_deref()) {
        (Some("lz4"), Some("lz4hc")) => "lz4hc".to_string(),
        (Some(from_header), _) => from_header.to_string(),
        (None, from_cparams) => from_cparams.unwrap_or("blosclz").to_string(),
    };
    let typesize = header.map_or(carray.dtype.size, |h| h.typesize);
    let blosc = Blosc {
        cname,
        clevel: carray.clevel.unwrap_or(UNKNOWN_CLEVEL),
        shuffle: header.map_or("shuffle", |h| h.shuffle()),
        typesize,
    };
    let mut chunk_shape = carray.shape.clone();
    chunk_shape[0] = carray.chunklen;
    let doc = ArrayDoc {
        shape: carray.shape.clone(),
        shard_shape: chunk_shape.clone(),
        chunk_shape,
        dtype: carray.dtype,
        fill_value: carray.dtype.fill_value(&carray.dflt),
        blosc,
        attributes,
    };
    let nchunks = carray.nchunks();
    let chunk_bytes = carray.chunklen * carray.row_bytes();
    let short = nchunks > 0 && carray.rows_in(nchunks - 1) < carray.chunklen;
    let short_last = short.then(|| ShortLast {
        stored: carray.rows_in(nchunks - 1) * carray.row_bytes(),
        fill: carray.dflt_bytes.clone(),
    });
    Ok(Some(Array {
        rank: carray.shape.len(),
        source: Source::Carray { dir: dir.into(), carray },
        stamp,
        attr,
        doc: Ok(doc.to_json()),
        shards: nchunks,
        chunk_bytes,
        typesize,
        short_last,
        nchunks,
    }))
}

/// `message` as a store error naming `place` (EIO for the reader).
pub fn damaged(place: String, message: impl Into<String>) -> Error {
    Error::Io { place, source: std::io::Error::other(message.into()) }
}
