//! Blosc 1.x chunks: the 16-byte header every chunk starts with, decompression (through c-blosc,
//! built by the `blosc-src` crate with lz4, zlib and zstd), and uncompressed "memcpyed" buffers,
//! which every blosc decoder reads without a codec: flag 0x02, ctbytes = nbytes + 16.

use super::{Result, damaged};

/// The size of a blosc 1.x header.
pub const HEADER_LEN: usize = 16;

/// The largest chunk shown: a short last chunk is decoded into memory whole.
pub const MAX_CHUNK: u64 = 256 << 20;

const FLAG_BYTE_SHUFFLE: u8 = 0x01;
const FLAG_MEMCPYED: u8 = 0x02;
const FLAG_BIT_SHUFFLE: u8 = 0x04;

/// The fields of a blosc 1.x chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub flags: u8,
    pub typesize: u8,
    /// Uncompressed size.
    pub nbytes: u32,
    pub blocksize: u32,
    /// Compressed size, header included: the chunk's whole length.
    pub ctbytes: u32,
}

impl Header {
    /// Reads the header at the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let Some(h) = bytes.get(..HEADER_LEN) else {
            return damaged(format!("blosc header cut short ({} of {HEADER_LEN} bytes)", bytes.len()));
        };
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("four bytes"));
        let header = Header {
            version: h[0],
            flags: h[2],
            typesize: h[3],
            nbytes: u32_at(4),
            blocksize: u32_at(8),
            ctbytes: u32_at(12),
        };
        if !(1..=2).contains(&header.version) {
            return damaged(format!("blosc format version {} is not 1 or 2", header.version));
        }
        if (header.ctbytes as usize) < HEADER_LEN {
            return damaged(format!("blosc chunk of {} bytes is shorter than its header", header.ctbytes));
        }
        if header.flags & FLAG_MEMCPYED != 0 && header.ctbytes as u64 != header.nbytes as u64 + HEADER_LEN as u64 {
            return damaged(format!("memcpyed blosc chunk of {} bytes holds {} bytes", header.ctbytes, header.nbytes));
        }
        Ok(header)
    }

    /// The compressor's name as Zarr's `blosc` codec spells it (lz4 and lz4hc share a format).
    pub fn cname(&self) -> Result<&'static str> {
        match self.flags >> 5 {
            0 => Ok("blosclz"),
            1 => Ok("lz4"),
            2 => Ok("snappy"),
            3 => Ok("zlib"),
            4 => Ok("zstd"),
            other => damaged(format!("blosc compressor {other} is unknown")),
        }
    }

    /// The shuffle as Zarr v3's `blosc` codec spells it.
    pub fn shuffle(&self) -> &'static str {
        if self.flags & FLAG_BIT_SHUFFLE != 0 {
            "bitshuffle"
        } else if self.flags & FLAG_BYTE_SHUFFLE != 0 {
            "shuffle"
        } else {
            "noshuffle"
        }
    }
}

/// Decompresses the blosc chunk `chunk` (exactly its ctbytes), checking that it holds `expected`
/// bytes.
pub fn decompress(chunk: &[u8], expected: usize) -> Result<Vec<u8>> {
    let header = Header::parse(chunk)?;
    if header.ctbytes as usize != chunk.len() {
        return damaged(format!("blosc chunk says {} bytes, {} given", header.ctbytes, chunk.len()));
    }
    if header.nbytes as usize != expected {
        return damaged(format!("blosc chunk holds {} bytes, {expected} expected", header.nbytes));
    }
    let mut nbytes = 0usize;
    // SAFETY: `chunk` is a live slice of `chunk.len()` bytes and `nbytes` a valid out-pointer;
    // validate reads no more than the length given.
    let valid = unsafe { blosc_src::blosc_cbuffer_validate(chunk.as_ptr().cast(), chunk.len(), &mut nbytes) };
    if valid != 0 || nbytes != expected {
        return damaged("blosc chunk fails c-blosc's validation");
    }
    let mut out = vec![0u8; expected];
    // SAFETY: validated above, so c-blosc reads within `chunk`; it writes at most `out.len()`
    // bytes into `out`, which is that long. The context call takes no global lock.
    let n = unsafe { blosc_src::blosc_decompress_ctx(chunk.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1) };
    if n < 0 || n as usize != expected {
        return damaged(format!("blosc chunk does not decompress (c-blosc says {n})"));
    }
    Ok(out)
}

/// The length of the memcpyed buffer holding `nbytes` bytes.
pub fn memcpyed_len(nbytes: u64) -> u64 {
    nbytes + HEADER_LEN as u64
}

/// `data` as an uncompressed blosc buffer of `typesize`-byte items.
pub fn memcpyed(typesize: u8, data: &[u8]) -> Vec<u8> {
    let n = data.len() as u32;
    let mut out = Vec::with_capacity(data.len() + HEADER_LEN);
    out.extend_from_slice(&[2, 1, FLAG_MEMCPYED, typesize]);
    for field in [n, n, n + HEADER_LEN as u32] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memcpyed_buffer_decompresses_to_its_data() {
        let data: Vec<u8> = (0..=255).collect();
        let buffer = memcpyed(4, &data);
        assert_eq!(buffer.len() as u64, memcpyed_len(256));
        let header = Header::parse(&buffer).unwrap();
        assert_eq!((header.nbytes, header.ctbytes, header.typesize), (256, 272, 4));
        assert_eq!(decompress(&buffer, 256).unwrap(), data);
    }

    #[test]
    fn damaged_chunks_are_errors_not_panics() {
        let buffer = memcpyed(1, b"hello world");
        assert!(decompress(&buffer, 10).is_err());
        assert!(decompress(&buffer[..20], 11).is_err());
        assert!(Header::parse(&buffer[..8]).is_err());
        let mut bad = buffer.clone();
        bad[12] = 3;
        assert!(Header::parse(&bad).is_err());
        let mut garbage = buffer;
        garbage[2] = 0x20; // lz4 over plain text
        assert!(decompress(&garbage, 11).is_err());
    }

    #[test]
    fn flags_name_the_codec_and_shuffle() {
        let header = Header { version: 2, flags: 0x81 | 0x04, typesize: 4, nbytes: 0, blocksize: 0, ctbytes: 16 };
        assert_eq!((header.cname().unwrap(), header.shuffle()), ("zstd", "bitshuffle"));
        let header = Header { flags: 0x21, ..header };
        assert_eq!((header.cname().unwrap(), header.shuffle()), ("lz4", "shuffle"));
    }
}
