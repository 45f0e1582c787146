//! The shard file of a BLZ array as the sharded view reads it: the source file's bytes as they
//! are, then (when the array's last chunk is stored short) that chunk decoded, padded with the
//! fill value and stored as a memcpyed blosc buffer, then an index of (offset, nbytes) pairs
//! pointing at each chunk's blosc buffer. Bytes of a Bloscpack chunk with a checksum are served
//! only once the whole chunk matched its digest (a mismatch is EIO and one log line per version).

use std::sync::Arc;

use super::arrays::{Array, Source, combine, damaged};
use crate::format::blz::{bcolz, blosc};
use crate::format::shard_index::EMPTY;
use crate::store::cache::{Cache, Shared};
use crate::store::{Attr, Error, Kind, Object, Result, Store};

/// What the shared cache remembers of a chunk of a source file version.
#[derive(Debug, Clone)]
pub enum Cached {
    /// Verified compressed bytes, or a decoded last chunk as a memcpyed buffer.
    Bytes(Shared),
    /// A carray chunk's index entry.
    Entry(u64, u64),
    /// Why the chunk cannot be served (logged once).
    Failed(Arc<str>),
}

/// Cache key: the source file's key, the chunk, and what is kept (0 verified, 1 decoded, 2 entry).
pub type ChunkKey = (String, u64, u8);

pub type ChunkCache = Cache<ChunkKey, Cached>;

/// One shard file of a BLZ array, opened.
#[derive(Debug)]
pub struct ShardObject {
    attr: Attr,
    place: String,
    file_key: String,
    file: Box<dyn Object>,
    array: Arc<Array>,
    /// The shard's number (a carray's chunk; 0 for a Bloscpack file).
    shard: u64,
    file_len: u64,
    /// Where the index starts; the memcpyed last chunk, if any, lies between the file and it.
    index_at: u64,
    /// A carray chunk's index entry.
    entry: (u64, u64),
    cache: Arc<ChunkCache>,
}

impl ShardObject {
    /// Opens shard `shard` of `array`; `None` when the source file changed since `array` was
    /// read (the caller reads the array again).
    pub fn open(store: &dyn Store, array: Arc<Array>, shard: u64, cache: Arc<ChunkCache>) -> Result<Option<Self>> {
        let file_key = array.shard_file(shard);
        let place = store.describe(&file_key);
        let file = match store.open(&file_key) {
            Ok(file) => file,
            Err(Error::NotFound(_)) => return Err(damaged(place, "chunk file is missing")),
            Err(e) => return Err(e),
        };
        let file_len = file.attr().size;
        let is_blp = matches!(array.source, Source::Blp { .. });
        if is_blp && file.attr().stamp != array.stamp {
            return Ok(None);
        }
        let stamp = if is_blp { array.stamp } else { combine(&[file.attr().stamp, array.stamp]) };
        let last = if is_blp { array.nchunks.saturating_sub(1) } else { shard };
        let tail = if array.is_short(last) { blosc::memcpyed_len(array.chunk_bytes) } else { 0 };
        let entries = if is_blp { array.nchunks } else { 1 };
        let index_at = file_len + tail;
        let attr = Attr { kind: Kind::File, size: index_at + 16 * entries, nlink: 1, stamp, ..*file.attr() };
        let mut object =
            ShardObject { attr, place, file_key, file, array, shard, file_len, index_at, entry: (EMPTY, 0), cache };
        if !is_blp {
            object.entry = object.carray_entry();
        }
        Ok(Some(object))
    }

    /// The attributes a carray chunk's shard has, from its chunk file's and the array's.
    pub fn carray_attr(array: &Array, file: &Attr, shard: u64) -> Attr {
        let tail = if array.is_short(shard) { blosc::memcpyed_len(array.chunk_bytes) } else { 0 };
        let stamp = combine(&[file.stamp, array.stamp]);
        Attr { kind: Kind::File, size: file.size + tail + 16, nlink: 1, stamp, ..*file }
    }

    /// The attributes of a Bloscpack file's one shard.
    pub fn blp_attr(array: &Array, file: &Attr) -> Attr {
        let tail = if array.short_last.is_some() { blosc::memcpyed_len(array.chunk_bytes) } else { 0 };
        Attr { kind: Kind::File, size: file.size + tail + 16 * array.nchunks, nlink: 1, ..*file }
    }

    fn cached(&self, kind: u8, make: impl FnOnce() -> std::result::Result<Vec<u8>, String>) -> Result<Shared> {
        let key = (self.file_key.clone(), self.chunk_number(), kind);
        let found = self.cache.get_or(key, self.attr.stamp, || match make() {
            Ok(bytes) => {
                let n = bytes.len();
                (Cached::Bytes(bytes.into()), n)
            }
            Err(why) => {
                log::warn!("{}: {why}; read as EIO", self.place);
                (Cached::Failed(why.into()), 0)
            }
        });
        match found {
            Cached::Bytes(bytes) => Ok(bytes),
            Cached::Failed(why) => Err(damaged(self.place.clone(), why.to_string())),
            Cached::Entry(..) => Err(damaged(self.place.clone(), "cache mix-up")),
        }
    }

    /// The chunk a cached value is about: the carray's chunk, or the Bloscpack file's last one.
    fn chunk_number(&self) -> u64 {
        match self.array.source {
            Source::Blp { .. } => self.array.nchunks.saturating_sub(1),
            Source::Carray { .. } => self.shard,
        }
    }

    /// A carray chunk's entry, from its chunk file's headers (once per version).
    fn carray_entry(&self) -> (u64, u64) {
        let key = (self.file_key.clone(), self.shard, 2);
        let found = self.cache.get_or(key, self.attr.stamp, || {
            let entry = self.read_carray_entry();
            if let Err(why) = &entry {
                log::warn!("{}: {why}; read as EIO", self.place);
            }
            (entry.map_or_else(|why| Cached::Failed(why.into()), |(o, n)| Cached::Entry(o, n)), 0)
        });
        match found {
            Cached::Entry(offset, nbytes) => (offset, nbytes),
            _ => (EMPTY, 0),
        }
    }

    fn read_carray_entry(&self) -> std::result::Result<(u64, u64), String> {
        let header = self.carray_chunk()?;
        if self.array.is_short(self.shard) {
            Ok((self.file_len, blosc::memcpyed_len(self.array.chunk_bytes)))
        } else {
            Ok((bcolz::CHUNK_HEADER_LEN, header.ctbytes as u64))
        }
    }

    /// The blosc header of a carray's chunk, checked against its file and the array.
    fn carray_chunk(&self) -> std::result::Result<blosc::Header, String> {
        let head = self.file.read_exact_at(0, self.file_len.min(32)).map_err(|e| e.to_string())?;
        bcolz::check_chunk_header(&head).map_err(|e| e.to_string())?;
        let header = blosc::Header::parse(&head[16..]).map_err(|e| e.to_string())?;
        let end = bcolz::CHUNK_HEADER_LEN + header.ctbytes as u64;
        let expected = match &self.array.short_last {
            Some(short) if self.array.is_short(self.shard) => short.stored,
            _ => self.array.chunk_bytes,
        };
        if end > self.file_len {
            return Err(format!(
                "chunk of {} bytes runs past the end of its {}-byte file",
                header.ctbytes, self.file_len
            ));
        }
        if header.nbytes as u64 != expected {
            return Err(format!("chunk holds {} bytes, {expected} expected", header.nbytes));
        }
        Ok(header)
    }

    /// The short last chunk, decoded, padded and memcpyed.
    fn tail(&self) -> Result<Shared> {
        self.cached(1, || {
            let short = self.array.short_last.as_ref().ok_or("no short chunk")?;
            let compressed = match &self.array.source {
                Source::Blp { chunks, checksum, .. } => {
                    let last = self.array.nchunks.saturating_sub(1) as usize;
                    let chunk = chunks.get(last).ok_or("the last chunk is damaged")?;
                    let ct = chunk.blosc.ctbytes as u64;
                    let bytes =
                        self.file.read_exact_at(chunk.start, ct + checksum.size()).map_err(|e| e.to_string())?;
                    let (data, digest) = bytes.split_at(ct as usize);
                    checksum.verify(data, digest).map_err(|e| format!("last chunk: {e}"))?;
                    data.to_vec()
                }
                Source::Carray { .. } => {
                    let ct = self.carray_chunk()?.ctbytes as u64;
                    self.file.read_exact_at(bcolz::CHUNK_HEADER_LEN, ct).map_err(|e| e.to_string())?
                }
            };
            let mut data =
                blosc::decompress(&compressed, short.stored as usize).map_err(|e| format!("last chunk: {e}"))?;
            while (data.len() as u64) < self.array.chunk_bytes {
                data.extend_from_slice(&short.fill);
            }
            data.truncate(self.array.chunk_bytes as usize);
            Ok(blosc::memcpyed(self.array.typesize, &data))
        })
    }

    /// Reads from the source file, through the verified copy of a checksummed chunk.
    fn read_file(&self, out: &mut [u8], at: u64) -> Result<usize> {
        let limit = out.len().min((self.file_len - at) as usize);
        let Source::Blp { by_start, checksum, .. } = &self.array.source else {
            return self.file.read_at(&mut out[..limit], at);
        };
        if checksum.size() == 0 {
            return self.file.read_at(&mut out[..limit], at);
        }
        let next = by_start.partition_point(|(start, _, _)| *start <= at);
        if next > 0 {
            let (start, end, i) = by_start[next - 1];
            if at < end {
                let verified = self.cached_chunk(i, start, end, *checksum, self.array.nchunks as usize)?;
                let from = (at - start) as usize;
                let n = limit.min(verified.len() - from);
                out[..n].copy_from_slice(&verified[from..from + n]);
                return Ok(n);
            }
        }
        let until = by_start.get(next).map_or(self.file_len, |(start, _, _)| *start);
        let n = limit.min((until - at) as usize);
        self.file.read_at(&mut out[..n], at)
    }

    fn cached_chunk(
        &self,
        i: usize,
        start: u64,
        end: u64,
        checksum: crate::format::blz::checksum::Checksum,
        n: usize,
    ) -> Result<Shared> {
        let key = (self.file_key.clone(), i as u64, 0);
        let found = self.cache.get_or(key, self.attr.stamp, || {
            let read = self.file.read_exact_at(start, end - start + checksum.size()).map_err(|e| e.to_string());
            let verified = read.and_then(|bytes| {
                let (data, digest) = bytes.split_at((end - start) as usize);
                checksum.verify(data, digest).map(|()| data.to_vec()).map_err(|e| e.to_string())
            });
            match verified {
                Ok(data) => {
                    let len = data.len();
                    (Cached::Bytes(data.into()), len)
                }
                Err(why) => {
                    log::warn!("{}: chunk {i} of {n}: {why}; read as EIO", self.place);
                    (Cached::Failed(why.into()), 0)
                }
            }
        });
        match found {
            Cached::Bytes(bytes) => Ok(bytes),
            Cached::Failed(why) => Err(damaged(format!("{}: chunk {i}", self.place), why.to_string())),
            Cached::Entry(..) => Err(damaged(self.place.clone(), "cache mix-up")),
        }
    }

    /// Index bytes from `at` (relative to the index's start).
    fn read_index(&self, out: &mut [u8], at: u64) -> usize {
        let mut filled = 0;
        let mut pos = at;
        while filled < out.len() && pos + self.index_at < self.attr.size {
            let entry = pos / 16;
            let (offset, nbytes) = match self.array.source {
                Source::Blp { .. } => self.array.blp_entry(entry as usize),
                Source::Carray { .. } => self.entry,
            };
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&offset.to_le_bytes());
            bytes[8..].copy_from_slice(&nbytes.to_le_bytes());
            let from = (pos % 16) as usize;
            let n = (16 - from).min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&bytes[from..from + n]);
            filled += n;
            pos += n as u64;
        }
        filled
    }
}

impl Object for ShardObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let at = offset + filled as u64;
            if at >= self.attr.size {
                break;
            }
            let out = &mut buf[filled..];
            let n = if at < self.file_len {
                self.read_file(out, at)?
            } else if at < self.index_at {
                let tail = self.tail()?;
                let from = (at - self.file_len) as usize;
                let n = out.len().min(tail.len() - from);
                out[..n].copy_from_slice(&tail[from..from + n]);
                n
            } else {
                self.read_index(out, at - self.index_at)
            };
            if n == 0 {
                break;
            }
            filled += n;
        }
        Ok(filled)
    }

    fn place(&self) -> String {
        self.place.clone()
    }
}
