//! The inodes the kernel holds, by number and by path, kept small: a walk over millions of chunk
//! files leaves the kernel holding millions of inodes, and what the daemon keeps for each is what
//! such a walk costs it.
//!
//! A number starts as the hash of the inode's first path (`inode_number.rs`), but the path of an
//! inode changes with renames and one path can have several inodes (one per content version the
//! kernel still holds, and files unlinked or replaced while open). So the path of an inode is
//! never derived from its number: an index from the hash of a path to the inodes reachable by that
//! name is kept beside the table (the path itself is worked out from the inode's node, never
//! stored twice). An inode unlinked or replaced by a rename leaves the index (no lookup may answer
//! it again) and stays in the table until the kernel forgets it.
//!
//! The chunk files bound to a shard version are not kept here but in their shard version's group
//! (`chunk_groups.rs`), about 20 bytes each; this table keeps the rest, and those that left their group
//! (written through the mount, or moved by a rename) under the numbers they had.
//!
//! What one inode of the table costs: its node in a compact form (a chunk's array by number, its coordinates
//! inline), its lookup count, and for an inode bound to a content version the version's number and
//! the size the kernel was told: the version's stamp and attributes are kept once for every inode
//! bound to it (a shard version's 4,096 chunks share one). About 120 bytes with the index, where a
//! node, its path twice and a copy of the version's attributes took over 500.

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::store::{Attr, Stamp, join};
use crate::view::array::{ArrayPath, ShardPlace};
use crate::view::namespace::{Answer, Node};

use super::chunk_groups::{ChunkGroups, chunk_number, group_number, is_computed};
use super::inode_number::{next_probe, path_ino};
use super::interned::Interned;

/// A store version of a file's content, with the attributes the kernel was told for it.
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub stamp: Stamp,
    pub attr: Attr,
}

/// Chunk coordinates, inline while they are few and small (every chunk grid in practice).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Coords {
    Inline(u8, [u32; 4]),
    Boxed(Box<[u64]>),
}

impl Coords {
    fn of(coords: &[u64]) -> Self {
        match coords.iter().all(|c| *c <= u64::from(u32::MAX)) && coords.len() <= 4 {
            true => {
                let mut inline = [0; 4];
                for (slot, c) in inline.iter_mut().zip(coords) {
                    *slot = *c as u32;
                }
                Coords::Inline(coords.len() as u8, inline)
            }
            false => Coords::Boxed(coords.into()),
        }
    }

    fn to_vec(&self) -> Vec<u64> {
        match self {
            Coords::Inline(rank, inline) => inline[..*rank as usize].iter().map(|c| u64::from(*c)).collect(),
            Coords::Boxed(coords) => coords.to_vec(),
        }
    }
}

/// A node as the table keeps it: an array by its number in [`Arrays`].
#[derive(Debug)]
enum Kept {
    Stored(Box<str>),
    Document(Box<str>),
    /// Few (directories): boxed, so that they cost the chunks nothing.
    ChunkDir(Box<(u32, String, Vec<u64>)>),
    Chunk {
        array: u32,
        coords: Coords,
    },
    Consolidated(&'static str),
}

#[derive(Debug)]
struct Inode {
    kept: Kept,
    lookups: u32,
    /// The number of the content version the kernel may hold pages and a size of ([`Versions`]);
    /// 0 for directories and files whose bytes are not a store version (pending, computed).
    version: u32,
    /// The size the kernel was told for that version.
    size: u64,
    /// Written through this mount (opened for writing, created, truncated, renamed or linked
    /// onto): never bound again, since the kernel's pages hold what was written.
    written: bool,
}

/// The stamp and attributes of a bound version, less the size (which differs per chunk).
type Version = (Stamp, Attr);

/// The inodes a path leads to, oldest first (one, nearly always).
#[derive(Debug)]
enum Inos {
    One(u64),
    Many(Vec<u64>),
}

impl Inos {
    fn as_slice(&self) -> &[u64] {
        match self {
            Inos::One(ino) => std::slice::from_ref(ino),
            Inos::Many(inos) => inos,
        }
    }

    fn push(&mut self, ino: u64) {
        match self {
            Inos::One(first) => *self = Inos::Many(vec![*first, ino]),
            Inos::Many(inos) => inos.push(ino),
        }
    }

    /// Removes `ino`; true when none is left.
    fn remove(&mut self, ino: u64) -> bool {
        match self {
            Inos::One(only) => *only == ino,
            Inos::Many(inos) => {
                inos.retain(|&i| i != ino);
                if let [only] = inos[..] {
                    *self = Inos::One(only);
                }
                inos_empty(self)
            }
        }
    }
}

fn inos_empty(inos: &Inos) -> bool {
    matches!(inos, Inos::Many(v) if v.is_empty())
}

/// Every inode the kernel holds, and which of them each path leads to.
#[derive(Debug)]
pub(super) struct InodeTable {
    by_ino: HashMap<u64, Inode>,
    /// The inodes a lookup of each path may answer, by the path's hash: an entry's inodes are
    /// those whose path has that hash (two paths sharing one are told apart by their nodes).
    by_path: HashMap<u64, Inos>,
    arrays: Interned<ArrayPath>,
    versions: Interned<Version>,
    hasher: std::hash::RandomState,
    /// The chunk inodes kept by group.
    groups: ChunkGroups,
}

impl InodeTable {
    /// A table holding the root, `root_ino`, forever.
    pub fn new(root_ino: u64, root: Node) -> Self {
        let mut table = InodeTable {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            arrays: Interned::default(),
            versions: Interned::default(),
            hasher: std::hash::RandomState::new(),
            groups: ChunkGroups::default(),
        };
        let kept = table.keep(&root);
        table.by_ino.insert(root_ino, Inode { kept, lookups: 1, version: 0, size: 0, written: false });
        let hash = table.hash("");
        table.by_path.insert(hash, Inos::One(root_ino));
        table
    }

    fn hash(&self, path: &str) -> u64 {
        self.hasher.hash_one(path)
    }

    fn keep(&mut self, node: &Node) -> Kept {
        match node {
            Node::Stored(key) => Kept::Stored(key.as_str().into()),
            Node::Document(path) => Kept::Document(path.as_str().into()),
            Node::Consolidated(name) => Kept::Consolidated(name),
            Node::ChunkDir { array, dir, prefix } => {
                Kept::ChunkDir(Box::new((self.arrays.take(array), dir.clone(), prefix.clone())))
            }
            Node::Chunk { array, coords } => Kept::Chunk { array: self.arrays.take(array), coords: Coords::of(coords) },
        }
    }

    fn unkeep(&mut self, kept: &Kept) {
        match kept {
            Kept::ChunkDir(dir) => self.arrays.release(dir.0),
            Kept::Chunk { array, .. } => self.arrays.release(*array),
            Kept::Stored(_) | Kept::Document(_) | Kept::Consolidated(_) => {}
        }
    }

    fn node_of(&self, kept: &Kept) -> Node {
        let array = |n: u32| self.arrays.get(n).expect("arrays of kept nodes are kept").clone();
        match kept {
            Kept::Stored(key) => Node::Stored(key.to_string()),
            Kept::Document(path) => Node::Document(path.to_string()),
            Kept::Consolidated(name) => Node::Consolidated(name),
            Kept::ChunkDir(dir) => Node::ChunkDir { array: array(dir.0), dir: dir.1.clone(), prefix: dir.2.clone() },
            Kept::Chunk { array: n, coords } => Node::Chunk { array: array(*n), coords: coords.to_vec() },
        }
    }

    fn path_of(&self, kept: &Kept) -> String {
        match kept {
            Kept::Stored(key) | Kept::Document(key) => key.to_string(),
            Kept::Consolidated(name) => name.to_string(),
            Kept::ChunkDir(_) | Kept::Chunk { .. } => self.node_of(kept).path(),
        }
    }

    /// True when inode `ino` is kept by its group.
    fn grouped(&self, ino: u64) -> bool {
        is_computed(ino) && !self.by_ino.contains_key(&ino)
    }

    /// The node inode `ino` stands for.
    pub fn node(&self, ino: u64) -> Option<Node> {
        if self.grouped(ino) {
            let member = self.groups.member(ino)?;
            let array = self.arrays.get(member.array)?.clone();
            return Some(Node::Chunk { array, coords: member.coords });
        }
        self.by_ino.get(&ino).map(|inode| self.node_of(&inode.kept))
    }

    /// The path inode `ino` was last known by.
    pub fn path(&self, ino: u64) -> Option<String> {
        if self.grouped(ino) {
            return self.node(ino).map(|node| node.path());
        }
        self.by_ino.get(&ino).map(|inode| self.path_of(&inode.kept))
    }

    /// The version inode `ino` is bound to, with the attributes the kernel was told for it.
    pub fn bound(&self, ino: u64) -> Option<Bound> {
        let (version, size) = match self.grouped(ino) {
            true => self.groups.member(ino).map(|m| (m.version, m.size))?,
            false => self.by_ino.get(&ino).map(|inode| (inode.version, inode.size))?,
        };
        let (stamp, attr) = self.versions.get(version)?;
        Some(Bound { stamp: *stamp, attr: Attr { size, ..*attr } })
    }

    /// What the watch of inode `ino` is kept under: its group, for a chunk kept by group.
    pub fn watched_as(&self, ino: u64) -> u64 {
        match self.grouped(ino) {
            true => group_number(ino).unwrap_or(ino),
            false => ino,
        }
    }

    /// The inodes the kernel may hold that are watched as `watched` (an inode, or a group of
    /// chunk inodes).
    pub fn members(&self, watched: u64) -> Vec<u64> {
        match self.grouped(watched) {
            true => self.groups.members(watched),
            false => vec![watched],
        }
    }

    /// Moves chunk inode `ino` from its group into the table, under the same number and with its
    /// references: it is about to stop being what its number says.
    fn ungroup(&mut self, ino: u64) {
        if !self.grouped(ino) {
            return;
        }
        let (Some(node), Some(bound)) = (self.node(ino), self.bound(ino)) else { return };
        let Some((lookups, emptied)) = self.groups.take(ino) else { return };
        let kept = self.keep(&node);
        let (version, size) = self.version_of(&bound);
        self.by_ino.insert(ino, Inode { kept, lookups, version, size, written: false });
        self.index(&node.path(), ino);
        if let Some((array, version)) = emptied {
            self.arrays.release(array);
            self.versions.release(version);
        }
    }

    /// [`InodeTable::ungroup`] of every chunk inode at `path`, or below it for a directory.
    fn ungroup_at(&mut self, path: &str, is_dir: bool) {
        let below = format!("{path}/");
        let arrays = &self.arrays;
        let near = |n: u32| {
            arrays.get(n).is_some_and(|a| {
                let dir = format!("{}/", a.dir);
                dir.starts_with(&below) || below.starts_with(&dir)
            })
        };
        for ino in self.groups.held(near) {
            let Some(at) = self.path(ino) else { continue };
            if at == path || (is_dir && at.starts_with(&below)) {
                self.ungroup(ino);
            }
        }
    }

    /// True when inode `ino` stands for a store file or directory shown as it is.
    pub fn is_stored(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|inode| matches!(inode.kept, Kept::Stored(_)))
    }

    /// Binds inode `ino`, bound to version `from` (or already to `to`), to version `to` of the
    /// same content; false when it is bound to another version, or to none.
    pub fn rebound(&mut self, ino: u64, from: Stamp, to: Stamp) -> bool {
        self.ungroup(ino);
        let Some(bound) = self.bound(ino) else { return false };
        if bound.stamp != from && bound.stamp != to {
            return false;
        }
        let version = self.versions.take(&(to, Attr { size: 0, stamp: to, ..bound.attr }));
        let inode = self.by_ino.get_mut(&ino).expect("bound above");
        let old = std::mem::replace(&mut inode.version, version);
        self.versions.release(old);
        true
    }

    /// Marks inode `ino` written through this mount: from now on it shows whatever the view
    /// holds, unless it is a computed file (which cannot be written).
    pub fn unbind(&mut self, ino: u64) {
        self.ungroup(ino);
        let Some(inode) = self.by_ino.get_mut(&ino) else { return };
        if matches!(inode.kept, Kept::Consolidated(_)) {
            return;
        }
        let old = std::mem::replace(&mut inode.version, 0);
        inode.written = true;
        self.versions.release(old);
    }

    /// The attributes of inode `ino`'s own version when `answer` is about another one.
    pub fn own_version(&self, ino: u64, answer: &Answer) -> Option<Attr> {
        self.bound(ino).filter(|b| answer.content != Some(b.stamp)).map(|b| b.attr)
    }

    pub fn len(&self) -> usize {
        self.by_ino.len() + self.groups.len()
    }

    /// The inodes `path` leads to, oldest first.
    fn at(&self, path: &str) -> Vec<u64> {
        let Some(inos) = self.by_path.get(&self.hash(path)) else { return Vec::new() };
        let here = |ino: &&u64| self.by_ino.get(ino).is_some_and(|inode| self.path_of(&inode.kept) == path);
        inos.as_slice().iter().filter(here).copied().collect()
    }

    /// The newest inode `path` leads to, if the kernel holds one.
    pub fn find(&self, path: &str) -> Option<u64> {
        self.at(path).last().copied()
    }

    /// The inode of `node` at content version `bound`, with one more kernel reference: one that
    /// its path leads to and that shows that content, or a new one. `place`: where a chunk lies
    /// in its shard.
    pub fn remember(&mut self, node: Node, bound: Option<Bound>, place: Option<&ShardPlace>) -> u64 {
        let path = node.path();
        let shows = |inode: &Inode| match (inode.version, &bound) {
            (0, _) => true,
            (version, Some(new)) => self.versions.get(version).is_some_and(|(stamp, _)| *stamp == new.stamp),
            (_, None) => false,
        };
        let found = self.at(&path).into_iter().rev().find(|ino| self.by_ino.get(ino).is_some_and(shows));
        if let Some(ino) = found {
            let kept = self.keep(&node);
            let version = match (&bound, self.by_ino[&ino].written) {
                (Some(bound), false) => Some(self.version_of(bound)),
                _ => None,
            };
            let inode = self.by_ino.get_mut(&ino).expect("indexed inodes are in the table");
            inode.lookups = inode.lookups.saturating_add(1);
            let old_kept = std::mem::replace(&mut inode.kept, kept);
            let old_version = version.map(|(version, size)| {
                inode.size = size;
                std::mem::replace(&mut inode.version, version)
            });
            self.unkeep(&old_kept);
            if let Some(old) = old_version {
                self.versions.release(old);
            }
            return ino;
        }
        if let Some(ino) = self.remember_grouped(&node, bound.as_ref(), place) {
            return ino;
        }
        // The path's own number when free; another version of its content, or another path with
        // the same hash, takes another.
        let mut ino = path_ino(&path);
        while self.by_ino.contains_key(&ino) {
            ino = next_probe(ino);
        }
        let kept = self.keep(&node);
        let (version, size) = bound.as_ref().map_or((0, 0), |b| self.version_of(b));
        self.by_ino.insert(ino, Inode { kept, lookups: 1, version, size, written: false });
        self.index(&path, ino);
        ino
    }

    /// [`InodeTable::remember`] of a chunk bound to a version, in its group; `None` when it is
    /// not kept so.
    fn remember_grouped(&mut self, node: &Node, bound: Option<&Bound>, place: Option<&ShardPlace>) -> Option<u64> {
        let (Node::Chunk { array, coords }, Some(bound), Some(place)) = (node, bound, place) else { return None };
        // A number that left its group stands for what the table says.
        let ino = chunk_number(array, &bound.stamp, place, coords).filter(|ino| !self.by_ino.contains_key(ino))?;
        let array_number = self.arrays.take(array);
        let (version, size) = self.version_of(bound);
        let existed = self.groups.remember(ino, array_number, version, place, size);
        if existed != Some(false) {
            self.arrays.release(array_number);
            self.versions.release(version);
        }
        existed.map(|_| ino)
    }

    /// The number of `bound`'s version (one more reference to it), and its size.
    fn version_of(&mut self, bound: &Bound) -> (u32, u64) {
        (self.versions.take(&(bound.stamp, Attr { size: 0, ..bound.attr })), bound.attr.size)
    }

    fn index(&mut self, path: &str, ino: u64) {
        let hash = self.hash(path);
        match self.by_path.get_mut(&hash) {
            Some(inos) => inos.push(ino),
            None => drop(self.by_path.insert(hash, Inos::One(ino))),
        }
    }

    fn unindex(&mut self, path: &str, ino: u64) {
        let hash = self.hash(path);
        if self.by_path.get_mut(&hash).is_some_and(|inos| inos.remove(ino)) {
            self.by_path.remove(&hash);
        }
    }

    /// The kernel dropped `n` references to `ino`. Returns what was watched as (`ino`, or its
    /// group) when that was its last reference (its group's, for a chunk kept by group).
    pub fn forget(&mut self, ino: u64, n: u64) -> Option<u64> {
        if self.grouped(ino) {
            let watched = self.watched_as(ino);
            let (array, version) = self.groups.forget(ino, n)?;
            self.arrays.release(array);
            self.versions.release(version);
            return Some(watched);
        }
        let inode = self.by_ino.get_mut(&ino)?;
        inode.lookups = inode.lookups.saturating_sub(n.min(u64::from(u32::MAX)) as u32);
        if inode.lookups > 0 {
            return None;
        }
        let inode = self.by_ino.remove(&ino).expect("just found");
        let path = self.path_of(&inode.kept);
        self.unindex(&path, ino);
        self.unkeep(&inode.kept);
        self.versions.release(inode.version);
        self.shrink();
        Some(ino)
    }

    /// Gives memory back once the kernel forgot most of what it held (hash tables keep their
    /// largest size otherwise, and a walk repeated after the kernel dropped its caches would find
    /// memory only ever growing).
    fn shrink(&mut self) {
        if self.by_ino.capacity() > 4096 && self.by_ino.len() < self.by_ino.capacity() / 4 {
            self.by_ino.shrink_to(self.by_ino.len() * 2);
            self.by_path.shrink_to(self.by_path.len() * 2);
        }
    }

    /// `path` no longer leads to the inodes it led to (unlinked, or replaced by a rename): the
    /// kernel keeps them for handles still open, and a later file of that name gets a new inode.
    pub fn detach(&mut self, path: &str) {
        for ino in self.at(path) {
            self.unindex(path, ino);
        }
    }

    /// After a rename of `from_path` to `to`: every inode of the name now stands for the file at
    /// its new place, and, for a directory, every inode below it too, since the kernel moves a
    /// directory's cached names along with it. Returns the inodes moved.
    pub fn rebind(&mut self, from_path: &str, to: &Node, is_dir: bool) -> Vec<u64> {
        self.ungroup_at(from_path, is_dir);
        let to_path = to.path();
        self.detach(&to_path);
        let mut moved = Vec::new();
        for ino in self.at(from_path) {
            self.unindex(from_path, ino);
            let kept = self.keep(to);
            let inode = self.by_ino.get_mut(&ino).expect("indexed inodes are in the table");
            let old_kept = std::mem::replace(&mut inode.kept, kept);
            // A rename changes the file's version (its ctime, or its ETag after a copy), never
            // the bytes the kernel holds of it.
            let old_version = std::mem::replace(&mut inode.version, 0);
            inode.written = true;
            self.unkeep(&old_kept);
            self.versions.release(old_version);
            self.index(&to_path, ino);
            moved.push(ino);
        }
        if is_dir {
            let below = format!("{from_path}/");
            let inside: Vec<(u64, String)> = self
                .by_ino
                .iter()
                .map(|(ino, inode)| (*ino, self.path_of(&inode.kept)))
                .filter(|(_, path)| path.starts_with(&below))
                .collect();
            for (ino, path) in inside {
                if !self.at(&path).contains(&ino) {
                    continue;
                }
                self.unindex(&path, ino);
                let node = self.node(ino).expect("listed above").moved(from_path, &to_path);
                let kept = self.keep(&node);
                let inode = self.by_ino.get_mut(&ino).expect("listed above");
                let old_kept = std::mem::replace(&mut inode.kept, kept);
                self.unkeep(&old_kept);
                self.index(&join(&to_path, &path[below.len()..]), ino);
                moved.push(ino);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunk_key::ChunkKeyEncoding;

    fn chunk(coords: &[u64]) -> Node {
        let encoding = ChunkKeyEncoding::from_json(&serde_json::json!({"name": "default"})).unwrap();
        let array = ArrayPath { dir: "a".into(), encoding };
        Node::Chunk { array, coords: coords.to_vec() }
    }

    fn bound(stamp: u64, size: u64) -> Option<Bound> {
        let stamp = Stamp::new([stamp, 0, 0, 0, 0]);
        let attr = Attr {
            kind: crate::store::Kind::File,
            size,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            atime: std::time::UNIX_EPOCH,
            mtime: std::time::UNIX_EPOCH,
            ctime: std::time::UNIX_EPOCH,
            stamp,
        };
        Some(Bound { stamp, attr })
    }

    #[test]
    fn an_inode_is_found_by_its_path_and_its_version_and_forgotten_with_its_last_reference() {
        let mut table = InodeTable::new(1, Node::Stored(String::new()));
        let first = table.remember(chunk(&[3, 4]), bound(1, 10), None);
        assert_eq!(table.remember(chunk(&[3, 4]), bound(1, 10), None), first, "the same version: the same inode");
        let newer = table.remember(chunk(&[3, 4]), bound(2, 12), None);
        assert_ne!(newer, first, "another version: another inode");
        assert_eq!(table.find(&chunk(&[3, 4]).path()), Some(newer));
        assert_eq!(table.bound(first).map(|b| b.attr.size), Some(10));
        assert_eq!(table.bound(newer).map(|b| (b.stamp, b.attr.size)), bound(2, 12).map(|b| (b.stamp, 12)));
        assert!(table.forget(first, 1).is_none() && table.forget(first, 1) == Some(first), "two references");
        assert_eq!(table.forget(newer, 1), Some(newer));
        assert_eq!(table.len(), 1, "the root stays");
        assert!(table.arrays.is_empty() && table.versions.is_empty(), "nothing shared is left");
    }

    #[test]
    fn a_renamed_directory_takes_the_inodes_below_it_along() {
        let mut table = InodeTable::new(1, Node::Stored(String::new()));
        let dir = table.remember(Node::Stored("g".into()), None, None);
        let file = table.remember(Node::Stored("g/x".into()), None, None);
        let moved = table.rebind("g", &Node::Stored("h".into()), true);
        assert_eq!(moved.len(), 2);
        assert_eq!((table.find("h"), table.find("h/x")), (Some(dir), Some(file)));
        assert_eq!(table.find("g/x"), None);
        assert_eq!(table.path(file).as_deref(), Some("h/x"));
    }

    #[test]
    fn large_coordinates_are_kept_as_they_are() {
        let big = Coords::of(&[u64::MAX, 1]);
        assert_eq!(big.to_vec(), [u64::MAX, 1]);
        assert_eq!(Coords::of(&[1, 2, 3]).to_vec(), [1, 2, 3]);
        assert_eq!(Coords::of(&[1, 2, 3, 4, 5]).to_vec(), [1, 2, 3, 4, 5]);
    }
}
