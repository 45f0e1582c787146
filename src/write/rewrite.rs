//! The rewrite commit strategy: a whole new shard, index and chunks back to back, written with one
//! atomic [`Store::put`] only over the version the commit read (or only where there was none), so
//! that readers see the old shard or the new one, and a writer that got there first is never
//! overwritten. A shard written this way holds no unused bytes.

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
    let data = chunks.iter().flatten().map(AsRef::as_ref);
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
