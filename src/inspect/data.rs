//! `shardfs check --data`: every stored inner chunk read and decoded with its array's codecs
//! ([`ChunkCodecs`]), each failure named by shard and chunk key. The index walk of
//! [`super::scan_with`] finds the chunks; this decodes one.

use std::ops::Range;

use crate::format::codecs::ChunkCodecs;
use crate::store::{self, Object, join};
use crate::view::array::ShardedArray;

/// How far a scan reads a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Indexes only (`check`, `info`).
    Indexes,
    /// Indexes and every stored inner chunk, decoded (`check --data`).
    Data,
}

/// The decoding of one array's inner chunks, or why they cannot be decoded.
pub(super) fn codecs_of(array: &ShardedArray) -> Result<ChunkCodecs, String> {
    let sharding = &array.meta.sharding;
    if sharding.inner_codecs.is_empty() {
        // The draft layout keeps a numcodecs compressor and filters instead of a codec chain.
        return Err("chunks of the draft layout are not decoded".into());
    }
    ChunkCodecs::new(&sharding.inner_codecs, &array.meta.chunk_format, sharding.chunk_shape()).map_err(|e| e.0)
}

/// One stored inner chunk to decode: where it is, and which chunk it is.
pub(super) struct StoredChunk<'a> {
    pub file: &'a dyn Object,
    pub range: Range<u64>,
    pub array: &'a ShardedArray,
    pub shard: &'a [u64],
    /// The entry at each sharding level, outermost first.
    pub entries: &'a [u64],
}

impl StoredChunk<'_> {
    /// The problem line for this chunk (after the shard's name), or `None` when it decodes; the
    /// store's error when the shard was replaced since it was opened.
    pub(super) fn fault(&self, codecs: &ChunkCodecs) -> Result<Option<String>, store::Error> {
        let fault = match self.file.read_exact_at(self.range.start, self.range.end - self.range.start) {
            Ok(bytes) => match codecs.fault(&bytes) {
                Some(fault) => fault,
                None => return Ok(None),
            },
            // Not damage: the shard was replaced while read, and is scanned again.
            Err(changed @ store::Error::Changed(_)) => return Err(changed),
            Err(e) => format!("cannot read: {e}"),
        };
        let coords = self.array.meta.sharding.chunk_of(self.shard, self.entries);
        let key = join(&self.array.dir, &self.array.chunk_key(&coords));
        Ok(Some(format!("chunk {key} (bytes {}..{}): {fault}", self.range.start, self.range.end)))
    }
}
