//! The inodes the kernel holds, by number and by path.
//!
//! A number starts as the hash of the inode's first path (`inode_number.rs`), but the path of an
//! inode changes with renames and one path can have several inodes (one per content version the
//! kernel still holds, and files unlinked or replaced while open). So the path of an inode is
//! never derived from its number: an index from path to the inodes reachable by that name is kept
//! beside the table. An inode unlinked or replaced by a rename leaves the index (no lookup may
//! answer it again) and stays in the table until the kernel forgets it.

use std::collections::HashMap;

use crate::store::{Attr, Stamp, join};
use crate::view::namespace::{Answer, Node};

use super::inode_number::{next_probe, path_ino};

#[derive(Debug)]
pub(super) struct Inode {
    pub node: Node,
    pub path: String,
    lookups: u64,
    /// The version of the content the kernel may hold pages and a size of; `None` for
    /// directories and files whose bytes are not a store version (pending, computed).
    pub bound: Option<Bound>,
    /// Written through this mount (opened for writing, created, truncated, renamed or linked
    /// onto): never bound again, since the kernel's pages hold what was written.
    pub written: bool,
}

/// A store version of a file's content, with the attributes the kernel was told for it.
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub stamp: Stamp,
    pub attr: Attr,
}

impl Inode {
    /// True when this inode can stand for the content `bound` describes. An inode bound to a
    /// version shows no other content, not even content of no version (a chunk written and not
    /// yet committed): the kernel's pages of it hold the version's bytes.
    fn shows(&self, bound: Option<&Bound>) -> bool {
        match (&self.bound, bound) {
            (None, _) => true,
            (Some(mine), Some(new)) => mine.stamp == new.stamp,
            (Some(_), None) => false,
        }
    }

    /// The attributes of this inode's own version when `answer` is about another one.
    pub fn own_version(&self, answer: &Answer) -> Option<Attr> {
        self.bound.as_ref().filter(|b| answer.content != Some(b.stamp)).map(|b| b.attr)
    }
}

/// Every inode the kernel holds, and which of them each path leads to.
#[derive(Debug)]
pub(super) struct InodeTable {
    by_ino: HashMap<u64, Inode>,
    /// The inodes a lookup of each path may answer, oldest first.
    by_path: HashMap<String, Vec<u64>>,
}

impl InodeTable {
    /// A table holding the root, `root_ino`, forever.
    pub fn new(root_ino: u64, root: Node) -> Self {
        let inode = Inode { node: root, path: String::new(), lookups: 1, bound: None, written: false };
        InodeTable {
            by_ino: HashMap::from([(root_ino, inode)]),
            by_path: HashMap::from([(String::new(), vec![root_ino])]),
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.by_ino.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.by_ino.get_mut(&ino)
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    /// The newest inode `path` leads to, if the kernel holds one.
    pub fn find(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).and_then(|inos| inos.last().copied())
    }

    /// The inode of `node` at content version `bound`, with one more kernel reference: one that
    /// its path leads to and that shows that content, or a new one.
    pub fn remember(&mut self, node: Node, bound: Option<Bound>) -> u64 {
        let path = node.path();
        let found = self.by_path.get(&path).and_then(|inos| {
            inos.iter().rev().copied().find(|ino| self.by_ino.get(ino).is_some_and(|i| i.shows(bound.as_ref())))
        });
        if let Some(ino) = found {
            let inode = self.by_ino.get_mut(&ino).expect("indexed inodes are in the table");
            inode.lookups += 1;
            inode.node = node;
            if !inode.written && bound.is_some() {
                inode.bound = bound;
            }
            return ino;
        }
        // The path's own number when free; another version of its content, or another path with
        // the same hash, takes another.
        let mut ino = path_ino(&path);
        while self.by_ino.contains_key(&ino) {
            ino = next_probe(ino);
        }
        self.by_path.entry(path.clone()).or_default().push(ino);
        self.by_ino.insert(ino, Inode { node, path, lookups: 1, bound, written: false });
        ino
    }

    /// The kernel dropped `n` references to `ino`; true when that was its last.
    pub fn forget(&mut self, ino: u64, n: u64) -> bool {
        let Some(inode) = self.by_ino.get_mut(&ino) else { return false };
        inode.lookups = inode.lookups.saturating_sub(n);
        if inode.lookups > 0 {
            return false;
        }
        let inode = self.by_ino.remove(&ino).expect("just found");
        self.unindex(&inode.path, ino);
        true
    }

    /// `path` no longer leads to the inodes it led to (unlinked, or replaced by a rename): the
    /// kernel keeps them for handles still open, and a later file of that name gets a new inode.
    pub fn detach(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// After a rename of `from_path` to `to`: every inode of the name now stands for the file at
    /// its new place, and, for a directory, every inode below it too, since the kernel moves a
    /// directory's cached names along with it. Returns the inodes moved.
    pub fn rebind(&mut self, from_path: &str, to: &Node, is_dir: bool) -> Vec<u64> {
        let to_path = to.path();
        self.detach(&to_path);
        let mut moved = Vec::new();
        for ino in self.by_path.remove(from_path).unwrap_or_default() {
            let Some(inode) = self.by_ino.get_mut(&ino) else { continue };
            inode.node = to.clone();
            inode.path = to_path.clone();
            // A rename changes the file's version (its ctime, or its ETag after a copy), never
            // the bytes the kernel holds of it.
            inode.bound = None;
            inode.written = true;
            self.by_path.entry(to_path.clone()).or_default().push(ino);
            moved.push(ino);
        }
        if is_dir {
            let below = format!("{from_path}/");
            let paths: Vec<String> = self.by_path.keys().filter(|p| p.starts_with(&below)).cloned().collect();
            for path in paths {
                let new_path = join(&to_path, &path[below.len()..]);
                for ino in self.by_path.remove(&path).unwrap_or_default() {
                    let Some(inode) = self.by_ino.get_mut(&ino) else { continue };
                    inode.path = new_path.clone();
                    inode.node = inode.node.moved(from_path, &to_path);
                    self.by_path.entry(new_path.clone()).or_default().push(ino);
                    moved.push(ino);
                }
            }
        }
        moved
    }

    fn unindex(&mut self, path: &str, ino: u64) {
        if let Some(inos) = self.by_path.get_mut(path) {
            inos.retain(|&i| i != ino);
            if inos.is_empty() {
                self.by_path.remove(path);
            }
        }
    }
}
