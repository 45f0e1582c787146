//! The `sharding_indexed` codec: which arrays shardfs can show unsharded, and where each inner
//! chunk lives inside its shard.
//!
//! Nested sharding (an inner codec chain that starts with `sharding_indexed` again) becomes a list
//! of levels; the view shows the innermost chunks, and an innermost chunk is found by walking one
//! index per level.

use super::error::Unsupported;
use serde_json::Value;

use super::shard_index::{Endian, IndexLocation, IndexSpec};

/// Indexes larger than this are refused: one index of 2^24 entries is already 256 MiB.
pub const MAX_INDEX_ENTRIES: u64 = 1 << 24;

/// One level of sharding: the chunk shape inside a shard of the level above, and its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// Inner chunk shape of this level, in array elements.
    pub chunk_shape: Vec<u64>,
    /// Inner chunks per shard along each dimension at this level.
    pub chunks_per_shard: Vec<u64>,
    pub index: IndexSpec,
}

/// The sharding of one array: the shard shape and one [`Level`] per nested `sharding_indexed`
/// (none for an unsharded array: each stored chunk is a "shard" of one chunk, its whole file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharding {
    pub shard_shape: Vec<u64>,
    /// Outermost first.
    pub levels: Vec<Level>,
    /// The codecs of the innermost chunks: the codecs of the equivalent unsharded array.
    pub inner_codecs: Vec<Value>,
}

/// Where one innermost chunk lives: which shard, and which entry of each level's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub shard: Vec<u64>,
    /// The entry number at each level, outermost first.
    pub entries: Vec<u64>,
}

impl Sharding {
    /// Reads an array's codec chain. `Ok(None)`: not sharded. `Err`: sharded in a way that has no
    /// faithful unsharded view (the reason is meant for a log line).
    pub fn from_codecs(shard_shape: &[u64], codecs: &[Value]) -> Result<Option<Self>, Unsupported> {
        let Some(first) = codecs.first() else {
            return Err("empty codec chain".into());
        };
        if codec_name(first) != Some("sharding_indexed") {
            if let Some(pos) = codecs.iter().position(|c| codec_name(c) == Some("sharding_indexed")) {
                return Err(format!(
                    "codec {:?} comes before sharding_indexed, so inner chunks are not stored as such",
                    codec_name(&codecs[pos - 1]).unwrap_or("?")
                )
                .into());
            }
            return Ok(None);
        }
        let mut levels = Vec::new();
        let mut outer_shape = shard_shape.to_vec();
        let mut chain = codecs;
        loop {
            if chain.len() > 1 {
                return Err(format!(
                    "codec {:?} after sharding_indexed encodes whole shards, so inner chunks cannot be read alone",
                    codec_name(&chain[1]).unwrap_or("?")
                )
                .into());
            }
            let config = chain[0].get("configuration").ok_or("sharding_indexed has no configuration")?;
            let level = parse_level(&outer_shape, config)?;
            outer_shape = level.chunk_shape.clone();
            levels.push(level);
            let inner = config.get("codecs").and_then(Value::as_array).ok_or("sharding_indexed has no codecs")?;
            match inner.first() {
                Some(c) if codec_name(c) == Some("sharding_indexed") => chain = inner,
                Some(_) => {
                    if inner.iter().any(|c| codec_name(c) == Some("sharding_indexed")) {
                        return Err("inner codecs put sharding_indexed after another codec".into());
                    }
                    return Ok(Some(Self { shard_shape: shard_shape.to_vec(), levels, inner_codecs: inner.clone() }));
                }
                None => return Err("sharding_indexed has an empty inner codec chain".into()),
            }
        }
    }

    /// The chunks of an unsharded array: no levels, each chunk stored whole at its own key.
    pub fn unsharded(chunk_shape: &[u64], codecs: &[Value]) -> Self {
        Sharding { shard_shape: chunk_shape.to_vec(), levels: Vec::new(), inner_codecs: codecs.to_vec() }
    }

    /// The innermost chunk shape: the chunk shape of the equivalent unsharded array.
    pub fn chunk_shape(&self) -> &[u64] {
        self.levels.last().map_or(&self.shard_shape, |l| &l.chunk_shape)
    }

    /// Innermost chunks per shard along each dimension.
    pub fn chunks_per_shard(&self) -> Vec<u64> {
        self.shard_shape.iter().zip(self.chunk_shape()).map(|(s, c)| s / c).collect()
    }

    /// Where the innermost chunk at grid coordinates `chunk` lives.
    pub fn locate(&self, chunk: &[u64]) -> Location {
        let per_shard = self.chunks_per_shard();
        let shard = chunk.iter().zip(&per_shard).map(|(g, r)| g / r).collect();
        let within: Vec<u64> = chunk.iter().zip(&per_shard).map(|(g, r)| g % r).collect();
        let inner = self.chunk_shape();
        let entries = self
            .levels
            .iter()
            .map(|level| {
                let mut entry = 0;
                for d in 0..within.len() {
                    let unit = level.chunk_shape[d] / inner[d];
                    entry = entry * level.chunks_per_shard[d] + (within[d] / unit) % level.chunks_per_shard[d];
                }
                entry
            })
            .collect();
        Location { shard, entries }
    }

    /// The innermost chunk grid coordinates of every entry combination in shard `shard`, in the
    /// order of [`Location::entries`]: the inverse of [`Sharding::locate`].
    pub fn chunk_of(&self, shard: &[u64], entries: &[u64]) -> Vec<u64> {
        let per_shard = self.chunks_per_shard();
        let inner = self.chunk_shape();
        let mut chunk: Vec<u64> = shard.iter().zip(&per_shard).map(|(s, r)| s * r).collect();
        for (level, &entry) in self.levels.iter().zip(entries) {
            let mut rest = entry;
            for d in (0..chunk.len()).rev() {
                let local = rest % level.chunks_per_shard[d];
                rest /= level.chunks_per_shard[d];
                chunk[d] += local * (level.chunk_shape[d] / inner[d]);
            }
        }
        chunk
    }
}

fn parse_level(outer_shape: &[u64], config: &Value) -> Result<Level, Unsupported> {
    let chunk_shape =
        shape(config.get("chunk_shape")).ok_or("sharding_indexed chunk_shape is not a list of integers")?;
    if chunk_shape.len() != outer_shape.len() {
        return Err(
            format!("inner chunk_shape {chunk_shape:?} has another rank than shard shape {outer_shape:?}").into()
        );
    }
    if chunk_shape.iter().zip(outer_shape).any(|(c, s)| *c == 0 || s % c != 0) {
        return Err(format!("inner chunk_shape {chunk_shape:?} does not divide shard shape {outer_shape:?}").into());
    }
    let chunks_per_shard: Vec<u64> = outer_shape.iter().zip(&chunk_shape).map(|(s, c)| s / c).collect();
    let entries = chunks_per_shard
        .iter()
        .try_fold(1u64, |n, c| n.checked_mul(*c).filter(|n| *n <= MAX_INDEX_ENTRIES))
        .ok_or_else(|| {
            format!("{chunks_per_shard:?} chunks per shard exceed the limit of {MAX_INDEX_ENTRIES} index entries")
        })?;
    let location = match config.get("index_location") {
        None => IndexLocation::End,
        Some(Value::String(s)) if s == "end" => IndexLocation::End,
        Some(Value::String(s)) if s == "start" => IndexLocation::Start,
        Some(other) => return Err(format!("unknown index_location {other}").into()),
    };
    let index_codecs =
        config.get("index_codecs").and_then(Value::as_array).ok_or("sharding_indexed has no index_codecs")?;
    let (endian, checksum) = match index_codecs.as_slice() {
        [bytes] => (bytes_endian(bytes)?, false),
        [bytes, crc] if codec_name(crc) == Some("crc32c") => (bytes_endian(bytes)?, true),
        _ => {
            return Err(format!(
                "index_codecs {} are not bytes optionally followed by crc32c",
                Value::Array(index_codecs.clone())
            )
            .into());
        }
    };
    Ok(Level { chunk_shape, chunks_per_shard, index: IndexSpec { entries, endian, checksum, location } })
}

fn bytes_endian(codec: &Value) -> Result<Endian, Unsupported> {
    if codec_name(codec) != Some("bytes") {
        return Err(format!("index codec {codec} is not bytes").into());
    }
    match codec.get("configuration").and_then(|c| c.get("endian")) {
        None => Ok(Endian::Little),
        Some(Value::String(s)) if s == "little" => Ok(Endian::Little),
        Some(Value::String(s)) if s == "big" => Ok(Endian::Big),
        Some(other) => Err(format!("unknown endian {other}").into()),
    }
}

/// The name of a codec entry.
pub fn codec_name(codec: &Value) -> Option<&str> {
    codec.get("name").and_then(Value::as_str)
}

/// A JSON list of non-negative integers.
pub fn shape(value: Option<&Value>) -> Option<Vec<u64>> {
    value?.as_array()?.iter().map(Value::as_u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sharded(inner: Value, codecs: Value) -> Value {
        json!({"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}})
    }

    fn bytes() -> Value {
        json!([{"name": "bytes", "configuration": {"endian": "little"}}])
    }

    #[test]
    fn unsharded_chains_are_not_sharding() {
        assert_eq!(Sharding::from_codecs(&[4], bytes().as_array().unwrap()), Ok(None));
    }

    #[test]
    fn reads_one_level() {
        let s = Sharding::from_codecs(&[8, 6], &[sharded(json!([4, 3]), bytes())]).unwrap().unwrap();
        assert_eq!(s.chunk_shape(), &[4, 3]);
        assert_eq!(
            s.levels[0].index,
            IndexSpec { entries: 4, endian: Endian::Little, checksum: true, location: IndexLocation::End }
        );
        assert_eq!(s.inner_codecs, bytes().as_array().unwrap().clone());
        assert_eq!(s.locate(&[3, 1]), Location { shard: vec![1, 0], entries: vec![3] });
        assert_eq!(s.chunk_of(&[1, 0], &[3]), vec![3, 1]);
    }

    #[test]
    fn nested_levels_locate_and_invert() {
        let nested = sharded(json!([8, 8]), json!([sharded(json!([2, 4]), bytes())]));
        let s = Sharding::from_codecs(&[16, 16], &[nested]).unwrap().unwrap();
        assert_eq!(s.levels.len(), 2);
        assert_eq!(s.chunk_shape(), &[2, 4]);
        for g0 in 0..16 {
            for g1 in 0..8 {
                let loc = s.locate(&[g0, g1]);
                assert_eq!(s.chunk_of(&loc.shard, &loc.entries), vec![g0, g1]);
            }
        }
        // chunk (5, 3): shard (0, 0); level 0 chunk (1, 1) -> entry 3; inside it (1, 1) of 4x2 -> 3.
        assert_eq!(s.locate(&[5, 3]), Location { shard: vec![0, 0], entries: vec![3, 3] });
    }

    #[test]
    fn refuses_what_cannot_be_shown_unsharded() {
        let gz = json!({"name": "gzip", "configuration": {"level": 1}});
        let transpose = json!({"name": "transpose", "configuration": {"order": [1, 0]}});
        let inner = sharded(json!([2, 2]), bytes());
        assert!(Sharding::from_codecs(&[4, 4], &[inner.clone(), gz]).unwrap_err().0.contains("gzip"));
        assert!(Sharding::from_codecs(&[4, 4], &[transpose, inner]).unwrap_err().0.contains("transpose"));
        assert!(Sharding::from_codecs(&[4, 4], &[sharded(json!([3, 2]), bytes())]).unwrap_err().0.contains("divide"));
        assert!(Sharding::from_codecs(&[4, 4], &[sharded(json!([2]), bytes())]).unwrap_err().0.contains("rank"));
        let huge = sharded(json!([1, 1]), bytes());
        assert!(Sharding::from_codecs(&[1 << 13, 1 << 13], &[huge]).unwrap_err().0.contains("limit"));
    }
}
