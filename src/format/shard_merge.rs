//! Two writers' versions of one shard merged inner chunk by inner chunk, against the version both
//! started from: an inner chunk one side changed (written, rewritten or removed) is taken from that
//! side, and where both changed one, from `ours` (the later writer's). So two writers of disjoint
//! inner chunks of one shard both keep their chunks, where a whole-shard "last writer wins" would
//! lose one side's.

use super::shard_index::{IndexSpec, ShardIndex, assemble_shard};

/// The inner chunks of a shard blob, `None` for those not stored; an absent shard has none.
fn inner_chunks<'a>(spec: &IndexSpec, blob: Option<&'a [u8]>) -> Result<Vec<Option<&'a [u8]>>, String> {
    let Some(blob) = blob else { return Ok(vec![None; spec.entries as usize]) };
    let len = blob.len() as u64;
    let range = spec.index_range(len).map_err(|e| e.to_string())?;
    let index =
        ShardIndex::decode(spec, &blob[range.start as usize..range.end as usize], len, 0).map_err(|e| e.to_string())?;
    (0..spec.entries)
        .map(|i| match index.chunk(i) {
            Ok(Some(at)) => Ok(Some(&blob[at.start as usize..at.end as usize])),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// The merge of `ours` and `theirs`, both made from `base` (`None`: no shard); `Ok(None)` when
/// the merge holds no chunk. The error says which blob cannot be read as a shard of `spec`.
pub fn merge(
    spec: &IndexSpec,
    base: Option<&[u8]>,
    ours: Option<&[u8]>,
    theirs: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, String> {
    let base = inner_chunks(spec, base).map_err(|e| format!("the version both started from: {e}"))?;
    let ours = inner_chunks(spec, ours).map_err(|e| format!("this writer's version: {e}"))?;
    let theirs = inner_chunks(spec, theirs).map_err(|e| format!("the other writer's version: {e}"))?;
    let merged: Vec<Option<&[u8]>> =
        (0..base.len()).map(|i| if ours[i] != base[i] { ours[i] } else { theirs[i] }).collect();
    Ok(merged.iter().any(Option::is_some).then(|| assemble_shard(spec, &merged)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard_index::{Endian, IndexLocation};

    fn shard(spec: &IndexSpec, chunks: &[Option<&[u8]>]) -> Vec<u8> {
        assemble_shard(spec, chunks)
    }

    #[test]
    fn each_side_keeps_the_inner_chunks_it_changed_and_ours_wins_where_both_did() {
        for location in [IndexLocation::Start, IndexLocation::End] {
            let spec = IndexSpec { entries: 4, endian: Endian::Little, checksum: true, location };
            let base = shard(&spec, &[Some(b"b0"), Some(b"b1"), None, Some(b"b3")]);
            // Ours rewrote 0, removed 3 and wrote 2; theirs rewrote 1 and 2.
            let ours = shard(&spec, &[Some(b"o0"), Some(b"b1"), Some(b"o2"), None]);
            let theirs = shard(&spec, &[Some(b"b0"), Some(b"t1"), Some(b"t2"), Some(b"b3")]);
            let merged = merge(&spec, Some(&base), Some(&ours), Some(&theirs)).unwrap().unwrap();
            let got = inner_chunks(&spec, Some(&merged)).unwrap();
            assert_eq!(got, [Some(&b"o0"[..]), Some(b"t1"), Some(b"o2"), None]);
        }
    }

    #[test]
    fn shards_new_on_both_sides_merge_and_an_empty_merge_is_no_shard() {
        let spec = IndexSpec { entries: 2, endian: Endian::Little, checksum: false, location: IndexLocation::End };
        let ours = shard(&spec, &[Some(b"o0"), None]);
        let theirs = shard(&spec, &[None, Some(b"t1")]);
        let merged = merge(&spec, None, Some(&ours), Some(&theirs)).unwrap().unwrap();
        assert_eq!(inner_chunks(&spec, Some(&merged)).unwrap(), [Some(&b"o0"[..]), Some(b"t1")]);
        let base = shard(&spec, &[Some(b"b0"), None]);
        assert_eq!(merge(&spec, Some(&base), None, Some(&base)).unwrap(), None);
    }

    #[test]
    fn a_damaged_shard_is_named() {
        let spec = IndexSpec { entries: 2, endian: Endian::Little, checksum: true, location: IndexLocation::End };
        let ours = shard(&spec, &[Some(b"o0"), None]);
        let err = merge(&spec, None, Some(&ours), Some(b"garbage")).unwrap_err();
        assert!(err.starts_with("the other writer's version: "), "{err}");
    }
}
