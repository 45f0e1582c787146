//! The shard index: `n` pairs of (offset, nbytes) as u64, in C order of the inner chunk grid,
//! optionally followed by a CRC-32C of those bytes, stored at the start or the end of a shard.
//!
//! A [`ShardIndex`] is decoded once and answers per-entry questions without touching the file.
//! Entry damage (half of the empty sentinel, a range outside the data area) is found per entry so
//! that one bad entry costs that chunk alone.

use std::ops::Range;

/// Offset and nbytes of an inner chunk that was never written.
pub const EMPTY: u64 = u64::MAX;

/// Byte order of the index's u64 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

/// Where a shard keeps its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexLocation {
    Start,
    End,
}

/// How one shard's index is laid out: its size follows from the entry count and the codecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexSpec {
    pub entries: u64,
    pub endian: Endian,
    pub checksum: bool,
    pub location: IndexLocation,
}

/// Why an index could not be decoded: every chunk of the shard is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("shard is {len} bytes, too short for its {needed}-byte index")]
    Truncated { len: u64, needed: u64 },
    #[error("index checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

/// Why one index entry cannot be served: that chunk alone is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("entry {entry} has only one half of the empty sentinel")]
    HalfEmpty { entry: u64 },
    #[error("entry {entry} ({offset}+{nbytes}) lies outside the data area {start}..{end}")]
    OutOfBounds { entry: u64, offset: u64, nbytes: u64, start: u64, end: u64 },
}

impl IndexSpec {
    /// Encoded size of the index in bytes.
    pub fn encoded_len(&self) -> u64 {
        self.entries * 16 + if self.checksum { 4 } else { 0 }
    }

    /// Where the index lies inside a shard blob of `blob_len` bytes.
    pub fn index_range(&self, blob_len: u64) -> Result<Range<u64>, IndexError> {
        let needed = self.encoded_len();
        if blob_len < needed {
            return Err(IndexError::Truncated { len: blob_len, needed });
        }
        Ok(match self.location {
            IndexLocation::Start => 0..needed,
            IndexLocation::End => blob_len - needed..blob_len,
        })
    }

    /// Where chunk data may lie inside a shard blob of `blob_len` bytes.
    pub fn data_range(&self, blob_len: u64) -> Range<u64> {
        let needed = self.encoded_len().min(blob_len);
        match self.location {
            IndexLocation::Start => needed..blob_len,
            IndexLocation::End => 0..blob_len - needed,
        }
    }

    /// Encodes entries (offset, nbytes) relative to the blob's start.
    pub fn encode(&self, entries: &[(u64, u64)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len() as usize);
        for &(offset, nbytes) in entries {
            for v in [offset, nbytes] {
                out.extend_from_slice(&match self.endian {
                    Endian::Little => v.to_le_bytes(),
                    Endian::Big => v.to_be_bytes(),
                });
            }
        }
        if self.checksum {
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }
}

/// The index entries of a shard whose stored chunks lie back to back in entry order (after the
/// index when it is at the start). `None` chunks are empty.
pub fn shard_layout<C: AsRef<[u8]>>(spec: &IndexSpec, chunks: &[Option<C>]) -> Vec<(u64, u64)> {
    let mut offset = match spec.location {
        IndexLocation::Start => spec.encoded_len(),
        IndexLocation::End => 0,
    };
    let mut place = |bytes: &[u8]| {
        let entry = (offset, bytes.len() as u64);
        offset += entry.1;
        entry
    };
    chunks.iter().map(|chunk| chunk.as_ref().map_or((EMPTY, EMPTY), |bytes| place(bytes.as_ref()))).collect()
}

/// Lays out a whole shard as [`shard_layout`] says, with its index.
pub fn assemble_shard<C: AsRef<[u8]>>(spec: &IndexSpec, chunks: &[Option<C>]) -> Vec<u8> {
    let index = spec.encode(&shard_layout(spec, chunks));
    let mut out = Vec::new();
    if spec.location == IndexLocation::Start {
        out.extend_from_slice(&index);
    }
    for chunk in chunks.iter().flatten() {
        out.extend_from_slice(chunk.as_ref());
    }
    if spec.location == IndexLocation::End {
        out.extend_from_slice(&index);
    }
    out
}

/// A decoded index of one shard blob, its offsets made absolute within the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    entries: Box<[(u64, u64)]>,
    /// Absolute position of the blob in its file (non-zero for nested shards).
    base: u64,
    /// Where chunk data may lie, relative to the blob.
    data: Range<u64>,
}

impl ShardIndex {
    /// Decodes `bytes`, the index read from a blob of `blob_len` bytes starting at `base`.
    pub fn decode(spec: &IndexSpec, bytes: &[u8], blob_len: u64, base: u64) -> Result<Self, IndexError> {
        let needed = spec.encoded_len();
        if (bytes.len() as u64) < needed {
            return Err(IndexError::Truncated { len: blob_len, needed });
        }
        let table = &bytes[..spec.entries as usize * 16];
        if spec.checksum {
            let stored = u32::from_le_bytes(bytes[table.len()..table.len() + 4].try_into().expect("4 bytes"));
            let computed = crc32c::crc32c(table);
            if stored != computed {
                return Err(IndexError::Checksum { stored, computed });
            }
        }
        let word = |b: &[u8]| {
            let b: [u8; 8] = b.try_into().expect("8 bytes");
            match spec.endian {
                Endian::Little => u64::from_le_bytes(b),
                Endian::Big => u64::from_be_bytes(b),
            }
        };
        let entries = table.chunks_exact(16).map(|e| (word(&e[..8]), word(&e[8..]))).collect();
        Ok(Self { entries, base, data: spec.data_range(blob_len) })
    }

    /// Number of entries.
    pub fn entries(&self) -> u64 {
        self.entries.len() as u64
    }

    /// The absolute byte range of entry `i`'s chunk, `None` when it is empty (or past the index).
    pub fn chunk(&self, i: u64) -> Result<Option<Range<u64>>, EntryError> {
        let Some(&(offset, nbytes)) = usize::try_from(i).ok().and_then(|i| self.entries.get(i)) else {
            return Ok(None);
        };
        match (offset == EMPTY, nbytes == EMPTY) {
            (true, true) => return Ok(None),
            (false, false) => {}
            _ => return Err(EntryError::HalfEmpty { entry: i }),
        }
        let in_bounds = offset >= self.data.start && offset.checked_add(nbytes).is_some_and(|end| end <= self.data.end);
        if !in_bounds {
            return Err(EntryError::OutOfBounds {
                entry: i,
                offset,
                nbytes,
                start: self.data.start,
                end: self.data.end,
            });
        }
        Ok(Some(self.base + offset..self.base + offset + nbytes))
    }

    /// Heap bytes held by this index, for the cache's budget.
    pub fn heap_bytes(&self) -> usize {
        self.entries.len() * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(entries: u64, checksum: bool, location: IndexLocation, endian: Endian) -> IndexSpec {
        IndexSpec { entries, endian, checksum, location }
    }

    #[test]
    fn round_trips_every_layout() {
        for endian in [Endian::Little, Endian::Big] {
            for checksum in [false, true] {
                for location in [IndexLocation::Start, IndexLocation::End] {
                    let s = spec(3, checksum, location, endian);
                    let data_start = if location == IndexLocation::Start { s.encoded_len() } else { 0 };
                    let entries = [(data_start, 5), (EMPTY, EMPTY), (data_start + 5, 2)];
                    let bytes = s.encode(&entries);
                    assert_eq!(bytes.len() as u64, s.encoded_len());
                    let blob_len = 7 + s.encoded_len();
                    let index = ShardIndex::decode(&s, &bytes, blob_len, 100).unwrap();
                    assert_eq!(index.chunk(0), Ok(Some(100 + data_start..100 + data_start + 5)));
                    assert_eq!(index.chunk(1), Ok(None));
                    assert_eq!(index.chunk(2), Ok(Some(100 + data_start + 5..100 + data_start + 7)));
                }
            }
        }
    }

    #[test]
    fn assembled_shards_decode_to_their_chunks() {
        for location in [IndexLocation::Start, IndexLocation::End] {
            let s = spec(3, true, location, Endian::Big);
            let chunks = [Some(b"abc".to_vec()), None, Some(b"defgh".to_vec())];
            let shard = assemble_shard(&s, &chunks);
            let range = s.index_range(shard.len() as u64).unwrap();
            let index = ShardIndex::decode(&s, &shard[range.start as usize..], shard.len() as u64, 0).unwrap();
            for (i, chunk) in chunks.iter().enumerate() {
                let got = index.chunk(i as u64).unwrap().map(|r| shard[r.start as usize..r.end as usize].to_vec());
                assert_eq!(&got, chunk);
            }
        }
    }

    #[test]
    fn detects_checksum_mismatch() {
        let s = spec(1, true, IndexLocation::End, Endian::Little);
        let mut bytes = s.encode(&[(0, 4)]);
        bytes[3] ^= 1;
        assert!(matches!(ShardIndex::decode(&s, &bytes, 24, 0), Err(IndexError::Checksum { .. })));
    }

    #[test]
    fn detects_truncation() {
        let s = spec(4, true, IndexLocation::End, Endian::Little);
        assert_eq!(s.index_range(67), Err(IndexError::Truncated { len: 67, needed: 68 }));
        assert_eq!(s.index_range(70), Ok(2..70));
    }

    #[test]
    fn flags_damaged_entries_one_by_one() {
        let s = spec(4, false, IndexLocation::End, Endian::Little);
        let bytes = s.encode(&[(0, 10), (EMPTY, 3), (5, 6), (u64::MAX - 1, 4)]);
        let index = ShardIndex::decode(&s, &bytes, 10 + 64, 0).unwrap();
        assert_eq!(index.chunk(0), Ok(Some(0..10)));
        assert_eq!(index.chunk(1), Err(EntryError::HalfEmpty { entry: 1 }));
        assert!(matches!(index.chunk(2), Err(EntryError::OutOfBounds { entry: 2, .. })));
        assert!(matches!(index.chunk(3), Err(EntryError::OutOfBounds { entry: 3, .. })));
    }

    #[test]
    fn start_index_data_may_not_overlap_the_index() {
        let s = spec(1, false, IndexLocation::Start, Endian::Little);
        let index = ShardIndex::decode(&s, &s.encode(&[(0, 4)]), 20, 0).unwrap();
        assert!(matches!(index.chunk(0), Err(EntryError::OutOfBounds { .. })));
    }
}
