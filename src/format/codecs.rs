//! Decoding a stored inner chunk with its array's codecs, as far as needed to tell whether its
//! bytes are intact (`shardfs check --data`): a trailing crc32c is verified, gzip, zstd and blosc
//! are decompressed (gzip's CRC-32 and a zstd frame's checksum, when it has one, are verified by
//! the decoders), and the result must be exactly as long as the chunk shape and data type say
//! (`transpose` keeps the length). Values are never interpreted, so a changed byte in a chunk
//! stored raw, with no checksum, cannot be noticed: nothing in the format says what it was.

use std::io::Read;

use serde_json::Value;

use super::blz::blosc;
use super::error::Unsupported;
use super::sharding::codec_name;

/// The most a chunk may decode to: larger chunks are not decoded, so that one bad document cannot
/// make the check allocate without bound.
pub const MAX_DECODED: u64 = 1 << 30;

/// One bytes-to-bytes codec, undone in reverse order of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Crc32c,
    Gzip,
    Zstd,
    Blosc,
}

/// How to undo the codecs of one array's inner chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkCodecs {
    /// Bytes-to-bytes codecs in decoding order (the last of the chain first).
    steps: Vec<Step>,
    /// The decoded length (`bytes` codec: elements times element size); `None` for variable-length
    /// encodings, whose decoded length only the values tell.
    expected: Option<u64>,
}

impl ChunkCodecs {
    /// The decoding of chunks of `chunk_shape` elements of `data_type` stored with `codecs` (the
    /// inner codecs of a sharded array). `Err`: a chain this cannot decode, with the reason.
    pub fn new(codecs: &[Value], data_type: &Value, chunk_shape: &[u64]) -> Result<Self, Unsupported> {
        let name = |codec: &Value| codec_name(codec).unwrap_or("?").to_string();
        let to_bytes = codecs
            .iter()
            .position(|c| codec_name(c) != Some("transpose"))
            .ok_or("the codec chain has no array-to-bytes codec")?;
        let elements = chunk_shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
        let expected = match codec_name(&codecs[to_bytes]) {
            Some("bytes") => {
                let size =
                    element_size(data_type).ok_or_else(|| format!("the size of data type {data_type} is not known"))?;
                let len = elements
                    .and_then(|n| n.checked_mul(size))
                    .filter(|len| *len <= MAX_DECODED)
                    .ok_or_else(|| format!("chunks of {chunk_shape:?} x {size} bytes exceed {MAX_DECODED} bytes"))?;
                Some(len)
            }
            Some("vlen-utf8" | "vlen-bytes") => None,
            _ => return Err(format!("codec {:?} is not one shardfs decodes", name(&codecs[to_bytes])).into()),
        };
        let mut steps = Vec::new();
        for codec in codecs[to_bytes + 1..].iter().rev() {
            steps.push(match codec_name(codec) {
                Some("crc32c") => Step::Crc32c,
                Some("gzip") => Step::Gzip,
                Some("zstd") => Step::Zstd,
                Some("blosc") => Step::Blosc,
                _ => return Err(format!("codec {:?} is not one shardfs decodes", name(codec)).into()),
            });
        }
        Ok(ChunkCodecs { steps, expected })
    }

    /// True when a changed byte of a stored chunk is always noticed: the chain ends in a checksum
    /// (crc32c, or gzip's own CRC-32 of the data, which leaves out only the header's time and OS
    /// bytes, which no reader uses).
    pub fn detects_every_change(&self) -> bool {
        matches!(self.steps.first(), Some(Step::Crc32c | Step::Gzip))
    }

    /// What is wrong with the stored chunk `stored`, or `None` when it decodes as it should.
    pub fn fault(&self, stored: &[u8]) -> Option<String> {
        // A damaged chunk can claim any size; this bounds what decoding it may allocate.
        let limit = self.expected.map_or(MAX_DECODED, |e| e.saturating_mul(2).saturating_add(1 << 16)).min(MAX_DECODED);
        let mut data = std::borrow::Cow::Borrowed(stored);
        for step in &self.steps {
            data = match undo(*step, &data, limit) {
                Ok(next) => std::borrow::Cow::Owned(next),
                Err(fault) => return Some(fault),
            };
        }
        match self.expected {
            Some(expected) if data.len() as u64 != expected => {
                Some(format!("decodes to {} bytes, {expected} expected", data.len()))
            }
            _ => None,
        }
    }
}

/// The bytes `data` stands for one step back, or what is wrong with them.
fn undo(step: Step, data: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    match step {
        Step::Crc32c => {
            let Some(body_len) = data.len().checked_sub(4) else {
                return Err(format!("{} bytes, shorter than its crc32c", data.len()));
            };
            let (body, crc) = data.split_at(body_len);
            let stored = u32::from_le_bytes(crc.try_into().expect("four bytes"));
            let computed = crc32c::crc32c(body);
            if stored != computed {
                return Err(format!("crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"));
            }
            Ok(body.to_vec())
        }
        Step::Gzip => read_limited("gzip", flate2::read::MultiGzDecoder::new(data), limit),
        Step::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(data).map_err(|e| format!("zstd: {e}"))?;
            read_limited("zstd", decoder, limit)
        }
        Step::Blosc => {
            let header = blosc::Header::parse(data).map_err(|e| format!("blosc: {e}"))?;
            if u64::from(header.nbytes) > limit {
                return Err(format!("blosc: holds {} bytes, more than the {limit} expected at most", header.nbytes));
            }
            blosc::decompress(data, header.nbytes as usize).map_err(|e| format!("blosc: {e}"))
        }
    }
}

/// Everything `reader` decodes, failing past `limit` bytes.
fn read_limited(codec: &str, reader: impl Read, limit: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    reader.take(limit + 1).read_to_end(&mut out).map_err(|e| format!("{codec}: {e}"))?;
    if out.len() as u64 > limit {
        return Err(format!("{codec}: decodes to more than the {limit} bytes expected at most"));
    }
    Ok(out)
}

/// The size in bytes of one element of a Zarr v3 data type, when it has a fixed one.
fn element_size(data_type: &Value) -> Option<u64> {
    match data_type {
        Value::String(name) => match name.as_str() {
            "bool" | "int8" | "uint8" => Some(1),
            "int16" | "uint16" | "float16" => Some(2),
            "int32" | "uint32" | "float32" => Some(4),
            "int64" | "uint64" | "float64" | "complex64" => Some(8),
            "complex128" => Some(16),
            raw => raw.strip_prefix('r')?.parse::<u64>().ok().filter(|bits| *bits > 0 && bits % 8 == 0).map(|b| b / 8),
        },
        Value::Object(object) => {
            let config = object.get("configuration");
            match object.get("name").and_then(Value::as_str)? {
                "numpy.datetime64" | "numpy.timedelta64" => Some(8),
                "structured" => config?
                    .get("fields")?
                    .as_array()?
                    .iter()
                    .try_fold(0u64, |sum, field| sum.checked_add(element_size(field.as_array()?.get(1)?)?)),
                _ => config?.get("length_bytes")?.as_u64(),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn codecs(rest: &[Value]) -> Vec<Value> {
        let mut chain = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
        chain.extend_from_slice(rest);
        chain
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(5));
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn with_crc(data: &[u8]) -> Vec<u8> {
        [data, &crc32c::crc32c(data).to_le_bytes()].concat()
    }

    #[test]
    fn every_byte_flipped_under_a_checksum_is_found_unless_it_changes_no_data() {
        let raw: Vec<u8> = (0..48u8).map(|i| i % 5).collect();
        let gz = ChunkCodecs::new(&codecs(&[json!({"name": "gzip"})]), &json!("uint16"), &[4, 6]).unwrap();
        let crc = ChunkCodecs::new(&codecs(&[json!({"name": "crc32c"})]), &json!("uint16"), &[4, 6]).unwrap();
        let decode_gzip = |stored: &[u8]| read_limited("gzip", flate2::read::MultiGzDecoder::new(stored), 1000);
        for (codec, stored) in [(&gz, gzip(&raw)), (&crc, with_crc(&raw))] {
            assert!(codec.detects_every_change());
            assert_eq!(codec.fault(&stored), None);
            for at in 0..stored.len() {
                let mut flipped = stored.clone();
                flipped[at] ^= 0x10;
                // gzip's header time and OS byte, and a deflate stream's padding bits, are not
                // data and no checksum covers them: flipping them changes no byte read.
                let harmless = codec == &gz && decode_gzip(&flipped).is_ok_and(|data| data == raw);
                assert!(codec.fault(&flipped).is_some() || harmless, "byte {at} of {codec:?}");
            }
        }
        assert!(crc.fault(&with_crc(&raw)[..3]).unwrap().contains("shorter than its crc32c"));
    }

    #[test]
    fn decoded_lengths_must_match_the_chunk() {
        let gz = ChunkCodecs::new(&codecs(&[json!({"name": "gzip"})]), &json!("uint16"), &[4, 6]).unwrap();
        assert_eq!(gz.fault(&gzip(&[0; 47])).unwrap(), "decodes to 47 bytes, 48 expected");
        assert!(gz.fault(&gzip(&[0; 1 << 20])).unwrap().contains("more than"));
        let raw = ChunkCodecs::new(&codecs(&[]), &json!("float64"), &[3]).unwrap();
        assert!(!raw.detects_every_change());
        assert_eq!(raw.fault(&[0; 24]), None);
        assert_eq!(raw.fault(&[0; 23]).unwrap(), "decodes to 23 bytes, 24 expected");
        let transposed = [json!({"name": "transpose", "configuration": {"order": [1, 0]}})];
        let chain: Vec<Value> = transposed.iter().cloned().chain(codecs(&[json!({"name": "crc32c"})])).collect();
        let t = ChunkCodecs::new(&chain, &json!("int32"), &[2, 2]).unwrap();
        assert_eq!(t.fault(&with_crc(&[7; 16])), None);
    }

    #[test]
    fn zstd_and_blosc_decompress_to_the_expected_length() {
        let data: Vec<u8> = (0..400u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let zstd_codec = ChunkCodecs::new(&codecs(&[json!({"name": "zstd"})]), &json!("uint32"), &[400]).unwrap();
        let frame = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(zstd_codec.fault(&frame), None);
        assert!(zstd_codec.fault(&frame[..frame.len() - 3]).is_some());
        assert!(zstd_codec.fault(&[frame.clone(), vec![1, 2, 3]].concat()).is_some(), "garbage after the frame");
        let blosc_codec = ChunkCodecs::new(&codecs(&[json!({"name": "blosc"})]), &json!("uint32"), &[400]).unwrap();
        let memcpyed = blosc::memcpyed(4, &data);
        assert_eq!(blosc_codec.fault(&memcpyed), None);
        let short = ChunkCodecs::new(&codecs(&[json!({"name": "blosc"})]), &json!("uint32"), &[399]).unwrap();
        assert_eq!(short.fault(&memcpyed).unwrap(), "decodes to 1600 bytes, 1596 expected");
        assert!(blosc_codec.fault(&memcpyed[..20]).unwrap().starts_with("blosc: "));
    }

    #[test]
    fn chains_and_types_it_cannot_decode_are_refused_with_the_reason() {
        let unknown = ChunkCodecs::new(&codecs(&[json!({"name": "lzma"})]), &json!("uint8"), &[4]).unwrap_err();
        assert!(unknown.0.contains("\"lzma\""), "{unknown}");
        assert!(ChunkCodecs::new(&codecs(&[]), &json!("mystery"), &[4]).unwrap_err().0.contains("mystery"));
        assert!(ChunkCodecs::new(&codecs(&[]), &json!("uint64"), &[1 << 40]).unwrap_err().0.contains("exceed"));
        let vlen = ChunkCodecs::new(&[json!({"name": "vlen-utf8"}), json!({"name": "zstd"})], &json!("string"), &[4]);
        assert_eq!(vlen.unwrap().expected, None);
        assert_eq!(element_size(&json!("r24")), Some(3));
        assert_eq!(
            element_size(&json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}})),
            Some(12)
        );
        let fields = json!({"name": "structured", "configuration": {"fields": [["a", "int16"], ["b", "float64"]]}});
        assert_eq!(element_size(&fields), Some(10));
    }
}
