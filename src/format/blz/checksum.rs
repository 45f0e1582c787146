//! The digests Bloscpack writes after each compressed chunk and after its metadata (by id:
//! 0 none, 1 adler32, 2 crc32, 3 md5, 4 sha1, 5 sha224, 6 sha256, 7 sha384, 8 sha512), as
//! bloscpack computes them (zlib's adler32 and crc32 as little-endian u32, hashlib digests).

use sha2::Digest;

use super::{Result, damaged};

/// One of Bloscpack's checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    None,
    Adler32,
    Crc32,
    Md5,
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl Checksum {
    pub fn from_id(id: u8) -> Result<Checksum> {
        use Checksum::*;
        const ALL: [Checksum; 9] = [None, Adler32, Crc32, Md5, Sha1, Sha224, Sha256, Sha384, Sha512];
        match ALL.get(id as usize) {
            Some(c) => Ok(*c),
            Option::None => damaged(format!("checksum id {id} is unknown")),
        }
    }

    /// The digest's length in bytes.
    pub fn size(self) -> u64 {
        use Checksum::*;
        match self {
            None => 0,
            Adler32 | Crc32 => 4,
            Md5 => 16,
            Sha1 => 20,
            Sha224 => 28,
            Sha256 => 32,
            Sha384 => 48,
            Sha512 => 64,
        }
    }

    pub fn name(self) -> &'static str {
        use Checksum::*;
        match self {
            None => "none",
            Adler32 => "adler32",
            Crc32 => "crc32",
            Md5 => "md5",
            Sha1 => "sha1",
            Sha224 => "sha224",
            Sha256 => "sha256",
            Sha384 => "sha384",
            Sha512 => "sha512",
        }
    }

    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        use Checksum::*;
        match self {
            None => Vec::new(),
            Adler32 => adler2::adler32_slice(data).to_le_bytes().to_vec(),
            Crc32 => crc32fast::hash(data).to_le_bytes().to_vec(),
            Md5 => md5::Md5::digest(data).to_vec(),
            Sha1 => sha1::Sha1::digest(data).to_vec(),
            Sha224 => sha2::Sha224::digest(data).to_vec(),
            Sha256 => sha2::Sha256::digest(data).to_vec(),
            Sha384 => sha2::Sha384::digest(data).to_vec(),
            Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }

    /// Checks `data` against its stored digest.
    pub fn verify(self, data: &[u8], stored: &[u8]) -> Result<()> {
        if self.digest(data) == stored { Ok(()) } else { damaged(format!("{} checksum mismatch", self.name())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_zlib_and_hashlib() {
        // Values from Python: struct.pack('<I', zlib.adler32(b'abc')), zlib.crc32, hashlib.
        assert_eq!(Checksum::Adler32.digest(b"abc"), 0x024d0127u32.to_le_bytes());
        assert_eq!(Checksum::Crc32.digest(b"abc"), 0x352441c2u32.to_le_bytes());
        let sha = Checksum::Sha256.digest(b"abc");
        assert_eq!(&sha[..4], &[0xba, 0x78, 0x16, 0xbf]);
        for id in 0..9 {
            let c = Checksum::from_id(id).unwrap();
            assert_eq!(c.digest(b"x").len() as u64, c.size(), "{}", c.name());
        }
        assert!(Checksum::from_id(9).is_err());
        assert!(Checksum::Md5.verify(b"abc", &Checksum::Md5.digest(b"abd")).is_err());
    }
}
