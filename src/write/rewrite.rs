//! The rewrite commit strategy: a whole new shard, index and chunks back to back, written with one
//! atomic [`Store::put`] only over the version the commit read (or only where there was none), so
//! that readers see the old shard or the new one, and a writer that got there first is never
//! overwritten. A shard written this way holds no unused bytes but, where many machines take
//! turns, 16 that make its version unique ([`nonce`]).

use std::sync::Arc;

use super::shard::Written;
use crate::format::shard_index::{IndexLocation, IndexSpec, ShardIndex, shard_layout};
use crate::store::exchange::Exchange;
use crate::store::{self, PutMode, Stamp, Store};

/// A note stored with the shard version a commit writes, through the store's exchange (see
/// `shared_commit`).
pub type Note<'a> = (&'a dyn Exchange, &'a str);

/// Writes the shard at `key` holding `chunks` (one per index entry), replacing version `over`
/// (`None`: there must be no shard yet), with `note` when given; the shard written, when
/// [`Store::put`] names its version.
pub fn put_shard<C: AsRef<[u8]>>(
    store: &dyn Store,
    key: &str,
    spec: &IndexSpec,
    chunks: &[Option<C>],
    over: Option<Stamp>,
    note: Option<Note>,
) -> Result<Option<Written>, store::Error> {
    let index = spec.encode(&shard_layout(spec, chunks));
    // Where many machines take turns by ETag, which S3 makes the MD5 of the bytes, a version
    // never has an earlier one's bytes (see [`nonce`]).
    let nonce = nonce();
    let unique: &[u8] = if note.is_some() { &nonce } else { &[] };
    let data = chunks.iter().flatten().map(AsRef::as_ref).chain(std::iter::once(unique));
    let pieces: Vec<&[u8]> = match spec.location {
        IndexLocation::Start => std::iter::once(&index[..]).chain(data).collect(),
        IndexLocation::End => data.chain(std::iter::once(&index[..])).collect(),
    };
    let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
    let mode = over.map_or(PutMode::Create, PutMode::Update);
    let put = match note {
        Some((exchange, note)) => exchange.put_noted(key, &pieces, mode, note)?,
        None => store.put(key, &pieces, mode)?,
    };
    let Some(stamp) = put else { return Ok(None) };
    let index = ShardIndex::decode(spec, &index, len, 0).expect("an index just encoded decodes");
    Ok(Some(Written { stamp, len, index: Arc::new(index) }))
}

/// How many bytes [`nonce`] makes.
pub const NONCE_LEN: usize = 16;

/// 16 bytes no other version holds, stored after a shard's chunks where no index names them. A
/// shard's bytes follow from its chunks, so without them a shard returned to an earlier content
/// gets the earlier ETag back (S3's is the MD5 of the bytes), and a holder that stalled with that
/// ETag would write over a version it never read (ABA).
pub fn nonce() -> [u8; NONCE_LEN] {
    use std::hash::{BuildHasher, RandomState};
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let (a, b) = (RandomState::new().hash_one(now), RandomState::new().hash_one(now));
    let mut out = [0; NONCE_LEN];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}
