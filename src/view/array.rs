//! One sharded array as the view shows it: the grid of innermost chunks, their keys, and the keys
//! of the shards that hold them; and [`ArrayPath`], how a view entry names its array without
//! keeping a copy of it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::format::chunk_key::ChunkKeyEncoding;
use crate::format::source::ShardedArrayMeta;
use crate::view::presentation::ChunkView;

use crate::store::{SCRATCH_DIR, Stamp, join};

/// Names an array by where its chunks live and the chunk key encoding the name of an entry was
/// read with. View entries keep this, never the array's geometry, which can change under them
/// (a resize, or an array deleted and created again): every operation takes the array as its
/// document is now ([`crate::view::namespace::Namespace::array`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArrayPath {
    pub dir: Arc<str>,
    pub encoding: ChunkKeyEncoding,
}

/// Where an inner chunk lies in its shard: the shard's first chunk, and how many chunks the shard
/// spans along each dimension. Chunks of one shard version share everything but their offset, so
/// the filesystem numbers them from it (`fs/chunk_groups.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardPlace {
    pub origin: Vec<u64>,
    pub per_shard: Vec<u64>,
}

impl ShardPlace {
    /// The position of the chunk at `coords` in the shard, in C order; `None` outside it.
    pub fn offset(&self, coords: &[u64]) -> Option<u64> {
        if coords.len() != self.origin.len() {
            return None;
        }
        let mut offset: u64 = 0;
        for ((c, o), n) in coords.iter().zip(&self.origin).zip(&self.per_shard) {
            let within = c.checked_sub(*o).filter(|w| w < n)?;
            offset = offset.checked_mul(*n)?.checked_add(within)?;
        }
        Some(offset)
    }

    /// The coordinates of the chunk at position `offset` ([`ShardPlace::offset`]'s inverse).
    pub fn coords(&self, mut offset: u64) -> Vec<u64> {
        let mut coords = vec![0; self.origin.len()];
        for d in (0..coords.len()).rev() {
            let n = self.per_shard[d].max(1);
            coords[d] = self.origin[d] + offset % n;
            offset /= n;
        }
        coords
    }
}

/// A sharded array found at `dir` (a store key), shown unsharded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedArray {
    pub dir: Arc<str>,
    pub meta: ShardedArrayMeta,
    /// Innermost chunks along each dimension: the unsharded array's chunk grid.
    pub grid: Vec<u64>,
    /// Shards along each dimension.
    pub shard_grid: Vec<u64>,
    /// The store key and version of the document the array was read from, when known: answers
    /// about its chunks are out of date once that document changes.
    pub document: Option<(String, Stamp)>,
    /// The chunk key encoding the view names inner chunks with (the presentation's choice; the
    /// stored shards keep `meta.key_encoding`).
    pub view_keys: ChunkKeyEncoding,
    /// Each inner chunk ends in a crc32c that the view checks and leaves out (the presentation's
    /// choice).
    pub strip_crc32c: bool,
}

impl ShardedArray {
    pub fn new(dir: &str, meta: ShardedArrayMeta) -> Self {
        let grid = meta.shape.iter().zip(meta.sharding.chunk_shape()).map(|(s, c)| s.div_ceil(*c)).collect();
        let shard_grid = meta.shape.iter().zip(&meta.sharding.shard_shape).map(|(s, c)| s.div_ceil(*c)).collect();
        let view_keys = meta.key_encoding;
        ShardedArray { dir: dir.into(), meta, grid, shard_grid, document: None, view_keys, strip_crc32c: false }
    }

    /// The same array, its inner chunks shown as `chunks` says.
    pub fn shown_with(self, chunks: ChunkView) -> Self {
        ShardedArray { view_keys: chunks.keys, strip_crc32c: chunks.strip_crc32c, ..self }
    }

    /// How view entries name this array.
    pub fn path(&self) -> ArrayPath {
        ArrayPath { dir: self.dir.clone(), encoding: self.view_keys }
    }

    /// True when chunks written to `other` (an earlier version of this array's document) are the
    /// same chunks here, stored at the same places: only the shape may have changed.
    pub fn same_chunks(&self, other: &ShardedArray) -> bool {
        std::ptr::eq(self, other) || (self.dir == other.dir && self.meta.same_chunks(&other.meta))
    }

    /// The same array, known to be read from the document at `key`, version `stamp`.
    pub fn read_from(self, key: &str, stamp: Stamp) -> Self {
        ShardedArray { document: Some((key.to_string(), stamp)), ..self }
    }

    pub fn rank(&self) -> usize {
        self.grid.len()
    }

    /// True when the chunk (or the leading coordinates of one) lies inside the array.
    pub fn in_bounds(&self, coords: &[u64]) -> bool {
        coords.iter().zip(&self.grid).all(|(c, g)| c < g)
    }

    /// Where the chunk at `coords` lies in its shard.
    pub fn place_of(&self, coords: &[u64]) -> Option<ShardPlace> {
        let per_shard = self.meta.sharding.chunks_per_shard();
        let origin =
            coords.iter().zip(&per_shard).map(|(c, n)| c.checked_div(*n).map(|s| s * n)).collect::<Option<_>>()?;
        Some(ShardPlace { origin, per_shard })
    }

    /// How many inner chunks of the array shard `shard` holds (fewer at the array's far edges).
    pub fn chunks_in_shard(&self, shard: &[u64]) -> u64 {
        let per_shard = self.meta.sharding.chunks_per_shard();
        let along = |d: usize| per_shard[d].min(self.grid[d].saturating_sub(shard[d] * per_shard[d]));
        (0..self.rank()).map(along).product()
    }

    /// The view key of an inner chunk, relative to the array directory.
    pub fn chunk_key(&self, coords: &[u64]) -> String {
        self.view_keys.encode(coords)
    }

    /// The store key of the shard at shard coordinates `shard`.
    pub fn shard_key(&self, shard: &[u64]) -> String {
        join(&self.dir, &self.meta.key_encoding.encode(shard))
    }

    /// Where a file that is not a chunk, made through the view inside a chunk-key directory
    /// (`rel` relative to the array; an atomic writer's temporary file), is kept: under the store's
    /// private directory, since chunk-key directories exist only in the view.
    pub fn scratch_key(&self, rel: &str) -> String {
        let mut hasher = DefaultHasher::new();
        join(&self.dir, rel).hash(&mut hasher);
        format!("{SCRATCH_DIR}/{:016x}", hasher.finish())
    }

    /// True when `name`, an entry of the array directory, belongs to the shard key space, so the
    /// view hides it.
    pub fn is_shard_name(&self, name: &str) -> bool {
        let enc = &self.meta.key_encoding;
        !name.is_empty() && (enc.decode(name, self.rank()).is_some() || enc.decode_dir(name, self.rank()).is_some())
    }
}

/// A sharded array `a` of `shape` uint8 in chunks of `chunks`, shards of `shards`, its chunks and
/// index bytes alone (for tests).
#[cfg(test)]
pub(crate) fn test_array(shape: &[u64], chunks: &[u64], shards: &[u64]) -> ShardedArray {
    use crate::format::metadata::interpret;
    use crate::format::source::Interpretation;
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shards}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": chunks,
            "codecs": [{"name": "bytes"}], "index_codecs": [{"name": "bytes"}]}}]
    });
    let Interpretation::ShardedArray { array, .. } = interpret(&serde_json::to_vec(&doc).unwrap()) else {
        panic!("a sharded array")
    };
    ShardedArray::new("a", array)
}
