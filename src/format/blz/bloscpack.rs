//! Bloscpack files (format version 3): the 32-byte header, the metadata section (its own header,
//! possibly zlib-compressed JSON, padding, a digest), the offsets, and the chunks after them, each
//! a blosc buffer followed by its digest. What numpy array a file holds comes from its metadata
//! (`{"dtype": "'<i4'", "shape": [...], "order": "C", "container": "numpy"}`); without one it is
//! the 1-D uint8 array of its bytes. Chunks split the flattened array by bytes, so a file maps to
//! a chunked array only when a chunk holds whole rows.

use std::io::Read;

use serde_json::Value;

use super::blosc;
use super::checksum::Checksum;
use super::dtype::Dtype;
use super::{Result, damaged, refused};

/// The size of the file header, and of the metadata header.
pub const HEADER_LEN: usize = 32;

/// Offsets slots (chunks and spare slots) a file may have: 2^24, as for a shard index.
pub const MAX_CHUNKS: i64 = 1 << 24;

/// The largest metadata section read.
pub const MAX_META_SIZE: u32 = 16 << 20;

/// A Bloscpack file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub offsets: bool,
    pub metadata: bool,
    pub checksum: Checksum,
    pub typesize: u8,
    /// Uncompressed bytes per chunk; -1: unknown or non-uniform.
    pub chunk_size: i32,
    pub last_chunk: i32,
    pub nchunks: i64,
    pub max_app_chunks: i64,
}

fn le<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes[at..at + N].try_into().expect("length checked")
}

impl Header {
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let Some(h) = bytes.get(..HEADER_LEN) else {
            return damaged(format!("file of {} bytes is too short for a Bloscpack header", bytes.len()));
        };
        if &h[..4] != b"blpk" {
            return damaged("no Bloscpack magic (blpk)");
        }
        if h[4] != 3 {
            return damaged(format!("Bloscpack format version {} is not 3", h[4]));
        }
        if h[5] & !0x03 != 0 {
            return damaged(format!("Bloscpack options {:#04x} set unknown bits", h[5]));
        }
        let header = Header {
            offsets: h[5] & 0x01 != 0,
            metadata: h[5] & 0x02 != 0,
            checksum: Checksum::from_id(h[6])?,
            typesize: h[7],
            chunk_size: i32::from_le_bytes(le(h, 8)),
            last_chunk: i32::from_le_bytes(le(h, 12)),
            nchunks: i64::from_le_bytes(le(h, 16)),
            max_app_chunks: i64::from_le_bytes(le(h, 24)),
        };
        if header.nchunks < -1 || header.max_app_chunks < 0 || header.chunk_size < -1 || header.last_chunk < -1 {
            return damaged("negative sizes or counts in the Bloscpack header");
        }
        if header.nchunks.saturating_add(header.max_app_chunks) > MAX_CHUNKS {
            return refused(format!("{} chunks and spare slots exceed the limit of {MAX_CHUNKS}", header.nchunks));
        }
        Ok(header)
    }

    /// Offsets slots stored after the metadata.
    fn offset_slots(&self) -> u64 {
        if self.offsets { (self.nchunks.max(0) + self.max_app_chunks) as u64 } else { 0 }
    }
}

/// The metadata section's own header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaHeader {
    pub checksum: Checksum,
    /// 0 none, 1 zlib.
    pub codec: u8,
    pub meta_size: u32,
    pub max_meta_size: u32,
    pub meta_comp_size: u32,
}

impl MetaHeader {
    pub fn parse(bytes: &[u8]) -> Result<MetaHeader> {
        let Some(h) = bytes.get(..HEADER_LEN) else { return damaged("metadata header cut short") };
        if &h[..8] != b"JSON\0\0\0\0" {
            return refused("metadata is not JSON");
        }
        let u32_at = |at| u32::from_le_bytes(le(h, at));
        let meta = MetaHeader {
            checksum: Checksum::from_id(h[9])?,
            codec: h[10],
            meta_size: u32_at(12),
            max_meta_size: u32_at(16),
            meta_comp_size: u32_at(20),
        };
        if meta.codec > 1 {
            return damaged(format!("metadata codec {} is unknown", meta.codec));
        }
        if meta.meta_comp_size > meta.max_meta_size
            || meta.max_meta_size > MAX_META_SIZE
            || meta.meta_size > MAX_META_SIZE
        {
            return damaged(format!("metadata sizes {} of {} do not fit", meta.meta_comp_size, meta.max_meta_size));
        }
        Ok(meta)
    }

    /// The section's length after its header: the metadata, its padding and its digest.
    pub fn body_len(&self) -> u64 {
        self.max_meta_size as u64 + self.checksum.size()
    }

    /// The metadata JSON from the section's body.
    pub fn decode(&self, body: &[u8]) -> Result<Value> {
        let stored = self.meta_comp_size as usize;
        let Some(data) = body.get(..stored) else { return damaged("metadata cut short") };
        let at = self.max_meta_size as usize;
        if let Some(digest) = body.get(at..at + self.checksum.size() as usize) {
            self.checksum.verify(data, digest).or_else(|_| damaged("metadata checksum mismatch"))?;
        } else {
            return damaged("metadata digest cut short");
        }
        let json = if self.codec == 1 {
            let mut out = Vec::new();
            let limit = self.meta_size as u64;
            flate2::read::ZlibDecoder::new(data)
                .take(limit)
                .read_to_end(&mut out)
                .or_else(|e| damaged(format!("metadata does not inflate: {e}")))?;
            if out.len() as u64 != limit {
                return damaged(format!("metadata inflates to {} bytes, not {limit}", out.len()));
            }
            out
        } else {
            data.to_vec()
        };
        serde_json::from_slice(&json).or_else(|e| damaged(format!("metadata is not JSON: {e}")))
    }
}

/// How many bytes from the start of a file hold its header, metadata and offsets, given at least
/// its first 64 bytes (the header, and the metadata header when there is one).
pub fn prefix_len(first: &[u8]) -> Result<u64> {
    let header = Header::parse(first)?;
    let mut len = HEADER_LEN as u64;
    if header.metadata {
        len += HEADER_LEN as u64 + MetaHeader::parse(&first[HEADER_LEN.min(first.len())..])?.body_len();
    }
    Ok(len + header.offset_slots() * 8)
}

/// What a file's prefix (its first [`prefix_len`] bytes) says.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefix {
    pub header: Header,
    pub metadata: Option<Value>,
    /// Offsets of the chunks (not the spare slots), when the file has them.
    pub offsets: Option<Vec<i64>>,
    /// Where the first chunk starts when there are no offsets.
    pub data_start: u64,
}

impl Prefix {
    pub fn parse(bytes: &[u8]) -> Result<Prefix> {
        let header = Header::parse(bytes)?;
        let mut at = HEADER_LEN;
        let mut metadata = None;
        if header.metadata {
            let meta = MetaHeader::parse(&bytes[at.min(bytes.len())..])?;
            at += HEADER_LEN;
            let body = bytes
                .get(at..at + meta.body_len() as usize)
                .ok_or_else(|| super::BlzError::Damaged("file ends inside its metadata".into()))?;
            metadata = Some(meta.decode(body)?);
            at += body.len();
        }
        let mut offsets = None;
        if header.offsets {
            let n = header.nchunks.max(0) as usize;
            let Some(table) = bytes.get(at..at + n * 8) else { return damaged("file ends inside its offsets") };
            offsets = Some(table.chunks_exact(8).map(|o| i64::from_le_bytes(o.try_into().expect("eight"))).collect());
            at += header.offset_slots() as usize * 8;
        }
        Ok(Prefix { header, metadata, offsets, data_start: at as u64 })
    }

    /// The numpy array a file of `file_len` bytes holds: its type, shape and rows per chunk.
    pub fn array(&self, file_len: u64) -> Result<ArrayShape> {
        let h = &self.header;
        if h.chunk_size == -1 || h.nchunks == -1 || h.last_chunk == -1 {
            return refused("chunk size -1: non-uniform chunks");
        }
        if h.nchunks == 0 || h.chunk_size == 0 || h.last_chunk == 0 {
            return refused("no data");
        }
        if h.last_chunk > h.chunk_size {
            return damaged(format!("last chunk of {} bytes is larger than a chunk ({})", h.last_chunk, h.chunk_size));
        }
        let total = (h.nchunks as u64 - 1) * h.chunk_size as u64 + h.last_chunk as u64;
        if self.data_start + h.nchunks as u64 * (blosc::HEADER_LEN as u64 + h.checksum.size()) > file_len {
            return damaged(format!("{} chunks cannot fit in a file of {} bytes", h.nchunks, file_len));
        }
        let numpy = self.metadata.as_ref().filter(|m| m.get("container").and_then(Value::as_str) == Some("numpy"));
        let (dtype, shape) = match numpy {
            None => (Dtype::parse("|u1")?, vec![total]),
            Some(meta) => {
                let dtype = meta
                    .get("dtype")
                    .and_then(Value::as_str)
                    .ok_or(super::BlzError::Refused("metadata has no dtype string".into()))?;
                let dtype = Dtype::parse(dtype)?;
                let shape: Option<Vec<u64>> =
                    meta.get("shape").and_then(Value::as_array).and_then(|s| s.iter().map(Value::as_u64).collect());
                let shape = shape
                    .filter(|s| !s.is_empty())
                    .ok_or(super::BlzError::Refused("metadata shape is not a non-empty list of sizes".into()))?;
                if shape.len() > 1 && meta.get("order").and_then(Value::as_str) != Some("C") {
                    return refused(format!("order {} is not C", meta.get("order").unwrap_or(&Value::Null)));
                }
                (dtype, shape)
            }
        };
        let row_bytes = shape[1..].iter().try_fold(dtype.size as u64, |n, d| n.checked_mul(*d)).unwrap_or(0);
        let bytes = shape[0].checked_mul(row_bytes);
        if bytes != Some(total) {
            return refused(format!(
                "metadata shape {shape:?} of {} ({:?} bytes) disagrees with the header's {total} bytes (appended to without updating it?)",
                dtype.name, bytes
            ));
        }
        if h.chunk_size as u64 > blosc::MAX_CHUNK {
            return refused(format!("chunks of {} bytes are larger than {} bytes", h.chunk_size, blosc::MAX_CHUNK));
        }
        if row_bytes == 0 || !(h.chunk_size as u64).is_multiple_of(row_bytes) {
            return refused(format!("chunks of {} bytes do not hold whole rows of {row_bytes} bytes", h.chunk_size));
        }
        Ok(ArrayShape { dtype, shape, chunk_rows: h.chunk_size as u64 / row_bytes, row_bytes })
    }

    /// Where chunk `i` starts, from the offsets, if the file has them.
    pub fn offset(&self, i: usize) -> Option<i64> {
        self.offsets.as_ref().and_then(|o| o.get(i).copied())
    }
}

/// A Bloscpack file as a chunked array.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayShape {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub chunk_rows: u64,
    pub row_bytes: u64,
}

/// One chunk found in a file: its blosc buffer (`start..start + ctbytes`), then its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: u64,
    pub blosc: blosc::Header,
}

/// The chunks of a file, each found (`Some`) or damaged (`None`), with the first damage found
/// and how many chunks it cost in all. Kept small: a damaged file costs no memory per message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkTable {
    pub chunks: Vec<Option<Chunk>>,
    pub damaged: usize,
    pub first_damage: Option<String>,
}

/// The chunks of a file of `file_len` bytes, reading each chunk's blosc header with
/// `read_header(at)` (16 bytes, or fewer at the end of the file). With offsets each chunk is found
/// on its own; without, a damaged chunk hides the ones after it (the walk stops there, so a
/// header claiming millions of chunks in a small file costs nothing).
pub fn chunks(prefix: &Prefix, file_len: u64, mut read_header: impl FnMut(u64) -> Option<Vec<u8>>) -> ChunkTable {
    let h = &prefix.header;
    let n = h.nchunks.max(0) as usize;
    let digest = h.checksum.size();
    let mut table = ChunkTable::default();
    let mut next = prefix.data_start;
    for i in 0..n {
        let start = match prefix.offset(i) {
            Some(o) if o < prefix.data_start as i64 => Err(format!("chunk {i}: offset {o} points into the header")),
            Some(o) => Ok(o as u64),
            None => Ok(next),
        };
        let expected = if i + 1 == n { h.last_chunk } else { h.chunk_size } as u32;
        let chunk = start.and_then(|start| {
            let bytes = read_header(start).ok_or(format!("chunk {i}: offset {start} is past the end of the file"))?;
            let blosc = blosc::Header::parse(&bytes).map_err(|e| format!("chunk {i} at {start}: {e}"))?;
            let end = start + blosc.ctbytes as u64 + digest;
            if blosc.nbytes != expected {
                Err(format!("chunk {i} holds {} bytes, the header says {expected}", blosc.nbytes))
            } else if end > file_len {
                Err(format!("chunk {i} ({start}..{end}) runs past the end of the file ({file_len} bytes)"))
            } else {
                Ok(Chunk { start, blosc })
            }
        });
        match chunk {
            Ok(chunk) => {
                next = chunk.start + chunk.blosc.ctbytes as u64 + digest;
                table.chunks.push(Some(chunk));
            }
            Err(why) => {
                table.first_damage.get_or_insert(why);
                if prefix.offsets.is_none() {
                    table.damaged += n - i;
                    break;
                }
                table.damaged += 1;
                table.chunks.push(None);
            }
        }
    }
    table
}

impl ChunkTable {
    /// Chunk `i`, if it was found.
    pub fn get(&self, i: usize) -> Option<&Chunk> {
        self.chunks.get(i).and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as bloscpack writes it: header, optional metadata, optional offsets, chunks of
    /// memcpyed blosc buffers with digests.
    pub(crate) fn file(data: &[u8], chunk: usize, meta: Option<&str>, offsets: bool, checksum: u8) -> Vec<u8> {
        let pieces: Vec<&[u8]> = data.chunks(chunk).collect();
        let sum = Checksum::from_id(checksum).unwrap();
        let mut out = b"blpk\x03".to_vec();
        out.push(u8::from(offsets) | if meta.is_some() { 2 } else { 0 });
        out.extend_from_slice(&[checksum, 1]);
        out.extend_from_slice(&(chunk as i32).to_le_bytes());
        out.extend_from_slice(&(pieces.last().unwrap().len() as i32).to_le_bytes());
        out.extend_from_slice(&(pieces.len() as i64).to_le_bytes());
        out.extend_from_slice(&2i64.to_le_bytes());
        if let Some(meta) = meta {
            let max = meta.len() as u32 * 2;
            out.extend_from_slice(b"JSON\0\0\0\0\0\x01\0\0");
            for v in [meta.len() as u32, max, meta.len() as u32] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(meta.as_bytes());
            out.resize(out.len() + meta.len(), 0);
            out.extend_from_slice(&Checksum::Adler32.digest(meta.as_bytes()));
        }
        let table = out.len();
        if offsets {
            out.resize(out.len() + (pieces.len() + 2) * 8, 0xff);
        }
        for (i, piece) in pieces.iter().enumerate() {
            if offsets {
                let at = out.len() as i64;
                out[table + i * 8..table + i * 8 + 8].copy_from_slice(&at.to_le_bytes());
            }
            let buffer = blosc::memcpyed(1, piece);
            out.extend_from_slice(&sum.digest(&buffer));
            let digest_at = out.len() - sum.size() as usize;
            out.splice(digest_at..digest_at, buffer);
        }
        out
    }

    fn walk(bytes: &[u8]) -> (Prefix, ChunkTable) {
        let prefix = Prefix::parse(&bytes[..prefix_len(&bytes[..64.min(bytes.len())]).unwrap() as usize]).unwrap();
        let chunks = chunks(&prefix, bytes.len() as u64, |at| {
            bytes.get(at as usize..(at as usize + 16).min(bytes.len())).map(<[u8]>::to_vec)
        });
        (prefix, chunks)
    }

    fn found(table: &ChunkTable, n: usize) -> Vec<bool> {
        (0..n).map(|i| table.get(i).is_some()).collect()
    }

    #[test]
    fn metadata_that_claims_to_inflate_past_the_limit_is_damage() {
        let mut header = b"JSON\0\0\0\0\0\x01\0\0".to_vec();
        for v in [u32::MAX, 64, 32] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        header.extend_from_slice(&[0; 8]);
        assert!(matches!(MetaHeader::parse(&header), Err(super::super::BlzError::Damaged(_))));
    }

    #[test]
    fn numpy_metadata_gives_shape_dtype_and_rows() {
        let data: Vec<u8> = (0..120).collect();
        let meta = r#"{"dtype": "'<i4'", "shape": [10, 3], "order": "C", "container": "numpy"}"#;
        for offsets in [true, false] {
            let bytes = file(&data, 24, Some(meta), offsets, 6);
            let (prefix, chunks) = walk(&bytes);
            let array = prefix.array(bytes.len() as u64).unwrap();
            assert_eq!((array.shape.clone(), array.chunk_rows, array.dtype.name), (vec![10, 3], 2, "int32"));
            assert_eq!(found(&chunks, 5), [true; 5]);
            let c = chunks.get(4).unwrap();
            assert_eq!(&bytes[c.start as usize + 16..c.start as usize + 40], &data[96..]);
        }
    }

    #[test]
    fn without_metadata_a_file_is_bytes() {
        let bytes = file(&[7; 100], 30, None, false, 1);
        let (prefix, chunks) = walk(&bytes);
        let array = prefix.array(bytes.len() as u64).unwrap();
        assert_eq!((array.shape, array.chunk_rows, array.dtype.name), (vec![100], 30, "uint8"));
        assert_eq!(found(&chunks, 4), [true; 4]);
        assert_eq!(chunks.get(3).unwrap().blosc.nbytes, 10);
    }

    #[test]
    fn refusals() {
        let data = [0u8; 120];
        let array = |meta: &str, chunk| {
            let bytes = file(&data, chunk, Some(meta), true, 0);
            Prefix::parse(&bytes).unwrap().array(bytes.len() as u64)
        };
        let grown = r#"{"dtype": "'<i4'", "shape": [20, 3], "order": "C", "container": "numpy"}"#;
        assert!(matches!(array(grown, 24), Err(super::super::BlzError::Refused(_))));
        let rows = r#"{"dtype": "'<i4'", "shape": [10, 3], "order": "C", "container": "numpy"}"#;
        assert!(matches!(array(rows, 20), Err(super::super::BlzError::Refused(_))));
        let object = r#"{"dtype": "'|O'", "shape": [120], "order": "C", "container": "numpy"}"#;
        assert!(matches!(array(object, 20), Err(super::super::BlzError::Refused(_))));
        let mut unknown = file(&data, 20, None, true, 0);
        unknown[8..12].copy_from_slice(&(-1i32).to_le_bytes());
        assert!(matches!(Prefix::parse(&unknown).unwrap().array(1 << 20), Err(super::super::BlzError::Refused(_))));
    }

    #[test]
    fn damage_costs_the_chunks_it_touches() {
        let data: Vec<u8> = (0..100).collect();
        let mut bytes = file(&data, 25, None, true, 6);
        // An offset past the end: that chunk alone.
        let table = 32;
        bytes[table + 8..table + 16].copy_from_slice(&10_000i64.to_le_bytes());
        let (_, chunks) = walk(&bytes);
        assert_eq!(found(&chunks, 4), [true, false, true, true]);
        assert_eq!(chunks.damaged, 1);
        // Truncated, without offsets: the chunks from the cut on.
        let bytes = file(&data, 25, None, false, 6);
        let (_, chunks) = walk(&bytes[..bytes.len() - 80]);
        assert_eq!(found(&chunks, 4), [true, true, false, false]);
        assert_eq!((chunks.damaged, chunks.chunks.len()), (2, 2));
        // A header claiming millions of chunks in a small file: the walk stops at the first.
        let mut huge = file(&data, 25, None, false, 0);
        huge[16..24].copy_from_slice(&((1i64 << 24) - 2).to_le_bytes());
        let (prefix, chunks) = walk(&huge);
        assert_eq!((chunks.chunks.len(), chunks.damaged), (4, (1 << 24) - 6));
        assert!(matches!(prefix.array(huge.len() as u64), Err(super::super::BlzError::Damaged(_))));
        // A bad magic or a bad metadata digest: nothing.
        let mut bad = file(&data, 25, Some(r#"{"a": 1}"#), false, 0);
        assert!(Prefix::parse(&bad).is_ok());
        let last = 32 + 32 + 16 + 3;
        bad[last] ^= 1;
        assert!(Prefix::parse(&bad).is_err());
        bad[0] = b'x';
        assert!(Header::parse(&bad).is_err());
    }
}
