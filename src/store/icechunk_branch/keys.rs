//! Which keys an Icechunk session takes, as Icechunk reads them: a node's `zarr.json`, or a chunk
//! key of the default encoding.

use crate::format::metadata::ZARR_JSON;
use crate::store::PRIVATE_DIR;

/// True for a key the Icechunk session takes: a node's `zarr.json`, or a chunk key.
pub(super) fn is_zarr_key(key: &str) -> bool {
    is_document(key) || chunk_key(key).is_some()
}

/// The array directory (`""`: the root) and coordinates of `key`, a chunk key of the default
/// encoding (`c`, then one number per dimension, written as Zarr writes numbers), as Icechunk reads
/// it: the last `c` component ends the array's path.
pub(super) fn chunk_key(key: &str) -> Option<(String, Vec<u32>)> {
    let parts: Vec<&str> = key.split('/').collect();
    let c = parts.iter().rposition(|p| *p == "c")?;
    let canonical =
        |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (*p == "0" || !p.starts_with('0'));
    let coords: Option<Vec<u32>> =
        parts[c + 1..].iter().map(|p| canonical(p).then(|| p.parse().ok()).flatten()).collect();
    Some((parts[..c].join("/"), coords?))
}

/// True for a node's `zarr.json`.
pub(super) fn is_document(key: &str) -> bool {
    key == ZARR_JSON || key.ends_with("/zarr.json")
}

/// True for keys of shardfs's own directory ([`PRIVATE_DIR`]): this process's scratch files.
pub(super) fn is_private(key: &str) -> bool {
    key.strip_prefix(PRIVATE_DIR).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zarr_keys_are_documents_and_chunk_keys_as_icechunk_reads_them() {
        for key in ["zarr.json", "a/zarr.json", "a/c/0/1", "a/b/c/12", "c/0", "c", "arc/c/3", "a/c/0/c"] {
            assert!(is_zarr_key(key), "{key}");
        }
        for key in ["notes.txt", "a/c/x", "arc/0", "a/c/0/", "a/0.1", "a/c/99999999999", "a/c/01"] {
            assert!(!is_zarr_key(key), "{key}");
        }
        assert_eq!(chunk_key("a/b/c/1/20"), Some(("a/b".to_string(), vec![1, 20])));
        assert_eq!(chunk_key("c/7"), Some((String::new(), vec![7])));
        // The last `c` ends the array's path, as Icechunk splits keys.
        assert_eq!(chunk_key("a/c/0/c"), Some(("a/c/0".to_string(), vec![])));
    }
}
