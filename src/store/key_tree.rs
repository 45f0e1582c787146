//! The directory tree a flat set of keys implies (a zip file's entries, a reference set's keys):
//! which entry each file key is, and what each directory lists. Stores whose keys are names in
//! a table, not files in directories, list and look up through it.

use std::collections::{BTreeMap, HashMap};

use super::Kind;

/// The files and directories of a set of keys.
#[derive(Debug, Default)]
pub struct KeyTree {
    /// The entry of each file key.
    pub files: HashMap<String, usize>,
    /// What each directory key lists (`""`: the root), by name.
    pub dirs: HashMap<String, BTreeMap<String, Kind>>,
}

impl KeyTree {
    /// The tree of `names`, each an entry's number and its key (a directory's ends in `/`; the
    /// directories above every key are implied). Names that cannot be keys (absolute, with empty,
    /// `.` or `..` components) are left out, a file whose name a directory also takes is left
    /// out, and of two entries with one name the later counts, each with a log line naming the
    /// store `place`.
    pub fn of<'a>(names: impl IntoIterator<Item = (usize, &'a str)>, place: &str) -> KeyTree {
        let mut tree = KeyTree::default();
        let KeyTree { files, dirs } = &mut tree;
        dirs.insert(String::new(), BTreeMap::new());
        for (n, name) in names {
            let (path, is_dir) = match name.strip_suffix('/') {
                Some(dir) => (dir, true),
                None => (name, false),
            };
            let bad = |part: &str| part.is_empty() || part == "." || part == "..";
            if path.is_empty() && !is_dir || !path.is_empty() && path.split('/').any(bad) {
                log::warn!("{place}: entry {name:?} is not shown: its name cannot be a key");
                continue;
            }
            // Every directory above the entry, and the entry itself when it is one.
            let parts: Vec<&str> = if path.is_empty() { Vec::new() } else { path.split('/').collect() };
            let dir_parts = if is_dir { parts.len() } else { parts.len() - 1 };
            for depth in 0..dir_parts {
                let (parent, name, key) = (parts[..depth].join("/"), parts[depth], parts[..=depth].join("/"));
                if files.remove(&key).is_some() {
                    log::warn!("{place}: entry {key} is not shown: a directory of the same name is");
                }
                dirs.entry(parent).or_default().insert(name.to_string(), Kind::Dir);
                dirs.entry(key).or_default();
            }
            if !is_dir {
                let (parent, name) = (parts[..parts.len() - 1].join("/"), parts[parts.len() - 1]);
                if dirs.contains_key(path) {
                    log::warn!("{place}: entry {path} is not shown: a directory of the same name is");
                } else if files.insert(path.to_string(), n).is_some() {
                    log::warn!("{place}: entry {path} is stored twice; the later one is shown");
                } else {
                    dirs.entry(parent).or_default().insert(name.to_string(), Kind::File);
                }
            }
        }
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_implied_and_bad_names_left_out() {
        let names = ["zarr.json", "a/c/0/0", "b/", "a/zarr.json", "../x", "/abs", "a//y", "a/c/0/0", "a/c"];
        let KeyTree { files, dirs } = KeyTree::of(names.iter().copied().enumerate(), "z.zip");
        let mut keys: Vec<_> = files.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        keys.sort();
        assert_eq!(keys, [("a/c/0/0", 7), ("a/zarr.json", 3), ("zarr.json", 0)]);
        let root: Vec<_> = dirs[""].iter().map(|(n, k)| (n.as_str(), *k)).collect();
        assert_eq!(root, [("a", Kind::Dir), ("b", Kind::Dir), ("zarr.json", Kind::File)]);
        assert_eq!(dirs["a/c"].keys().collect::<Vec<_>>(), ["0"]);
        assert!(dirs["b"].is_empty());
    }
}
