//! A delta: the chunk changes one mount waits to see in a shard, as an immutable object beside it
//! that the lease holder folds in (see [`super::shared_commit`]). Its bytes are shardfs's own:
//!
//! ```text
//! "shardfs delta 1\n"
//! u32 count                                  (little-endian, as every number here)
//! count x { u8 depth, depth x u64 entry,     (the chunk's index entry at each level, outermost first)
//!           u8 kind, [u64 len, len bytes] }  (kind 0: the chunk emptied; 1: these bytes stored)
//! ```
//!
//! A delta is read from the store, where anything may have happened to it: decoding checks every
//! length and every entry against the shard's layout, and fails with the reason.

use std::borrow::Cow;

use super::shard::NestedChanges;
use crate::format::shard_index::IndexSpec;

const MAGIC: &[u8] = b"shardfs delta 1\n";

/// The bytes of a delta holding `changes`.
pub fn encode(changes: &NestedChanges) -> Vec<u8> {
    let size: usize = changes.iter().map(|(path, c)| 10 + 8 * path.len() + c.as_ref().map_or(0, |c| c.len())).sum();
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for (path, content) in changes {
        out.push(path.len() as u8);
        for entry in path {
            out.extend_from_slice(&entry.to_le_bytes());
        }
        match content {
            None => out.push(0),
            Some(bytes) => {
                out.push(1);
                out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
    }
    out
}

/// Reads the bytes of a shard's delta, whose levels are laid out as `specs` say.
pub fn decode<'a>(bytes: &'a [u8], specs: &[IndexSpec]) -> Result<NestedChanges<'a>, String> {
    let mut rest = bytes.strip_prefix(MAGIC).ok_or("not a shardfs delta")?;
    let count = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
    let mut changes = NestedChanges::new();
    for _ in 0..count {
        let depth = take(&mut rest, 1)?[0] as usize;
        if depth != specs.len() {
            return Err(format!("a chunk {depth} levels deep in a shard of {} levels", specs.len()));
        }
        let mut path = Vec::with_capacity(depth);
        for spec in specs {
            let entry = u64::from_le_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
            if entry >= spec.entries {
                return Err(format!("entry {entry} of an index of {}", spec.entries));
            }
            path.push(entry);
        }
        let content = match take(&mut rest, 1)?[0] {
            0 => None,
            1 => {
                let len = u64::from_le_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
                let len = usize::try_from(len).map_err(|_| "a chunk longer than memory")?;
                Some(Cow::Borrowed(take(&mut rest, len)?))
            }
            kind => return Err(format!("unknown change kind {kind}")),
        };
        changes.insert(path, content);
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the last change", rest.len()));
    }
    Ok(changes)
}

/// The next `n` bytes of `rest`, which moves past them.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err("cut short".to_string());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shard_index::{Endian, IndexLocation, IndexSpec};

    fn spec(entries: u64) -> IndexSpec {
        IndexSpec { entries, endian: Endian::Little, checksum: false, location: IndexLocation::End }
    }

    #[test]
    fn decodes_what_it_encodes_and_refuses_every_cut() {
        let specs = [spec(4), spec(2)];
        let mut changes = NestedChanges::new();
        changes.insert(vec![3, 1], Some(Cow::Borrowed(&b"chunk"[..])));
        changes.insert(vec![0, 0], None);
        changes.insert(vec![1, 0], Some(Cow::Borrowed(&b""[..])));
        let bytes = encode(&changes);
        assert_eq!(decode(&bytes, &specs).unwrap(), changes);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], &specs).is_err(), "cut at {cut}");
        }
        assert!(decode(&bytes, &[spec(4)]).is_err(), "another depth");
        assert!(decode(&bytes, &[spec(3), spec(2)]).is_err(), "an entry past the index");
    }
}
