//! The BLZ family (Bloscpack files, bcolz carrays and ctables) as pure functions over bytes and
//! JSON: headers, metadata, offsets, and the sharded Zarr v3 document that describes each array
//! (byte-level facts: `shared/reference/blz.md` of the project, and the README).
//!
//! - [`blosc`]: the 16-byte blosc 1.x chunk header, decompression (c-blosc, only ever for an
//!   array's short last chunk) and uncompressed ("memcpyed") blosc buffers.
//! - [`checksum`]: the digests Bloscpack puts after each chunk and its metadata.
//! - [`bloscpack`]: a Bloscpack file's header, metadata section and offsets.
//! - [`bcolz`]: a bcolz carray's `meta/sizes`, `meta/storage` and per-chunk file header, and a
//!   ctable's `__rootdirs__`.
//! - [`dtype`]: numpy type strings as Zarr v3 data types, and fill values as bytes.
//! - [`document`]: the sharded Zarr v3 `zarr.json` of an array, and of a group.

pub mod bcolz;
pub mod blosc;
pub mod bloscpack;
pub mod checksum;
pub mod document;
pub mod dtype;

/// Why BLZ data cannot be shown: the message is meant for a log line after the file's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlzError {
    /// The bytes are not what the format says (a damaged or truncated file).
    #[error("{0}")]
    Damaged(String),
    /// Well formed, but not something a Zarr array can show (object dtype, non-uniform chunks...).
    #[error("{0}")]
    Refused(String),
}

pub type Result<T> = std::result::Result<T, BlzError>;

pub(crate) fn damaged<T>(message: impl Into<String>) -> Result<T> {
    Err(BlzError::Damaged(message.into()))
}

pub(crate) fn refused<T>(message: impl Into<String>) -> Result<T> {
    Err(BlzError::Refused(message.into()))
}
