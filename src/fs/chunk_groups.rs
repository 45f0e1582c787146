//! Inodes of chunk files numbered from where they live, so that one costs the daemon about 20 bytes: a
//! walk over 10^8 chunk files leaves the kernel holding millions of inodes, and a table entry for
//! each (its node, path index and watch, about 400 bytes) made such a walk cost gigabytes.
//!
//! The chunk files of one shard version the kernel was told about form a group: the shard's
//! place, the array and the version are kept once for all of them. A chunk's number is its group's
//! number (a hash of the array, the shard's place and the version) and its offset in the shard, so
//! its node and version are worked out from the number, and a listing gives each chunk the number
//! a lookup will (`d_ino` agrees with `st_ino`, and runs of chunks are numbered in order, as
//! `inode_number.rs` explains). What stays per inode is its offset, the size the kernel was told
//! (for the attributes of an inode whose version was replaced since) and the kernel's references
//! to it, in a B-tree by offset (a shard's chunks may be looked up in any order), until the
//! kernel forgets it. The group goes with its last reference. Two groups whose numbers collide
//! cannot both be held: the second one's chunks are kept in the table.
//!
//! An inode that stops being what its number says (written through the mount, or moved by a
//! rename) leaves its group for the table, under the same number, with its references
//! ([`ChunkGroups::take`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::store::Stamp;
use crate::view::array::{ArrayPath, ShardPlace};

/// Set in every computed number; clear in every number of the table (`inode_number.rs`).
pub const COMPUTED: u64 = 1 << 62;
/// Bits of a number that hold the chunk's offset in its shard.
const OFFSET_BITS: u32 = 24;
/// The offset that stands for the group itself (its watch), never a chunk's.
const GROUP_OFFSET: u64 = (1 << OFFSET_BITS) - 1;
/// Group numbers are below this (38 bits).
const GROUPS: u64 = 1 << (62 - OFFSET_BITS);

/// One shard version's chunk files that the kernel holds.
#[derive(Debug)]
struct Group {
    /// The array's number in the table's interned arrays.
    array: u32,
    /// The version's number in the table's interned versions.
    version: u32,
    place: ShardPlace,
    /// The kernel's references to all of the group's inodes.
    lookups: u64,
    /// The chunks the kernel holds, by offset.
    told: BTreeMap<u32, Told>,
}

/// A chunk the kernel holds.
#[derive(Debug, Clone, Copy)]
struct Told {
    /// The size it was told.
    size: u32,
    /// Its references (never 0: a chunk forgotten, or that left the group, is no longer here).
    lookups: u32,
}

/// The groups the kernel holds inodes of, by number.
#[derive(Debug, Default)]
pub(super) struct ChunkGroups {
    groups: HashMap<u64, Group>,
    /// The sum of the groups' `lookups`, kept as they change: asked for at every listing and
    /// every inode the kernel takes or lets go, too often to add up.
    references: usize,
}

/// The number of the chunk at `coords`, at `place` in version `stamp` of its shard, of `array`;
/// `None` when its offset does not fit.
pub fn chunk_number(array: &ArrayPath, stamp: &Stamp, place: &ShardPlace, coords: &[u64]) -> Option<u64> {
    let offset = place.offset(coords).filter(|o| *o < GROUP_OFFSET)?;
    let mut hasher = DefaultHasher::new();
    (array, stamp, &place.origin).hash(&mut hasher);
    Some(number(hasher.finish() % GROUPS, offset))
}

/// A chunk inode's group and offset.
fn split(ino: u64) -> Option<(u64, u64)> {
    is_computed(ino).then_some(((ino & !(1 << 63) & !COMPUTED) >> OFFSET_BITS, ino & GROUP_OFFSET))
}

fn number(group: u64, offset: u64) -> u64 {
    (1 << 63) | COMPUTED | (group << OFFSET_BITS) | offset
}

/// The number a group is watched by.
pub fn group_number(ino: u64) -> Option<u64> {
    split(ino).map(|(group, _)| number(group, GROUP_OFFSET))
}

/// True for a number of this scheme (a chunk's, or a group's watch).
pub fn is_computed(ino: u64) -> bool {
    ino & COMPUTED != 0
}

/// What a chunk inode stands for: its array's and version's numbers, its coordinates, and the
/// size the kernel was told.
pub(super) struct Member {
    pub array: u32,
    pub version: u32,
    pub coords: Vec<u64>,
    pub size: u64,
}

impl ChunkGroups {
    /// Chunk number `ino` ([`chunk_number`]), `size` bytes, of array number `array` at version
    /// number `version` (interned, each taken once for this call) at `place`, with one more kernel
    /// reference; `None` when the chunk cannot be kept so (too large, or another group holds the
    /// number), and the caller keeps it. `Some(true)` when the group existed, in which case the
    /// caller releases its two numbers.
    pub fn remember(&mut self, ino: u64, array: u32, version: u32, place: &ShardPlace, size: u64) -> Option<bool> {
        let (id, offset) = split(ino)?;
        let size = u32::try_from(size).ok()?;
        let existed = match self.groups.get(&id) {
            Some(g) if (g.array, g.version, &g.place) == (array, version, place) => true,
            Some(_) => return None,
            None => {
                let told = BTreeMap::new();
                self.groups.insert(id, Group { array, version, place: place.clone(), lookups: 0, told });
                false
            }
        };
        let group = self.groups.get_mut(&id).expect("just found or made");
        group.lookups += 1;
        self.references += 1;
        let told = group.told.entry(offset as u32).or_insert(Told { size, lookups: 0 });
        told.size = size;
        told.lookups = told.lookups.saturating_add(1);
        Some(existed)
    }

    /// What chunk inode `ino` stands for.
    pub fn member(&self, ino: u64) -> Option<Member> {
        let (id, offset) = split(ino)?;
        let group = self.groups.get(&id)?;
        let told = group.told.get(&(offset as u32))?;
        Some(Member {
            array: group.array,
            version: group.version,
            coords: group.place.coords(offset),
            size: u64::from(told.size),
        })
    }

    /// The chunk inodes of the group watched as `watched` (a group's number) the kernel may hold.
    pub fn members(&self, watched: u64) -> Vec<u64> {
        let Some((id, _)) = split(watched) else { return Vec::new() };
        let Some(group) = self.groups.get(&id) else { return Vec::new() };
        group.told.keys().map(|offset| number(id, u64::from(*offset))).collect()
    }

    /// The chunk inodes the kernel holds of the arrays (by number) `of` accepts.
    pub fn held(&self, of: impl Fn(u32) -> bool) -> Vec<u64> {
        let groups = self.groups.iter().filter(|(_, g)| of(g.array));
        groups.flat_map(|(id, g)| g.told.keys().map(|offset| number(*id, u64::from(*offset)))).collect()
    }

    /// Takes chunk inode `ino` out of its group, to be kept elsewhere under the same number: its
    /// references, and whether that left the group empty (then its array's and version's numbers
    /// are the caller's to release).
    pub fn take(&mut self, ino: u64) -> Option<(u32, Option<(u32, u32)>)> {
        let (id, offset) = split(ino)?;
        let lookups = self.groups.get_mut(&id)?.told.remove(&(offset as u32))?.lookups;
        Some((lookups, self.drop_references(id, u64::from(lookups))))
    }

    /// The kernel dropped `n` references to `ino`: the array's and version's numbers to release
    /// when that was its group's last.
    pub fn forget(&mut self, ino: u64, n: u64) -> Option<(u32, u32)> {
        let (id, offset) = split(ino)?;
        let group = self.groups.get_mut(&id)?;
        let told = group.told.get_mut(&(offset as u32))?;
        let n = n.min(u64::from(told.lookups));
        told.lookups -= n as u32;
        if told.lookups == 0 {
            group.told.remove(&(offset as u32));
        }
        self.drop_references(id, n)
    }

    /// Drops `n` of group `id`'s references: its array's and version's numbers when they were
    /// its last, and the group with them.
    fn drop_references(&mut self, id: u64, n: u64) -> Option<(u32, u32)> {
        let group = self.groups.get_mut(&id)?;
        let n = n.min(group.lookups);
        group.lookups -= n;
        self.references -= n as usize;
        if group.lookups > 0 {
            return None;
        }
        let group = self.groups.remove(&id).expect("just found");
        if self.groups.capacity() > 1024 && self.groups.len() < self.groups.capacity() / 4 {
            self.groups.shrink_to(self.groups.len() * 2);
        }
        Some((group.array, group.version))
    }

    /// How many references to chunk inodes the kernel holds (the number of inodes, but for the
    /// few it looked up more than once).
    pub fn len(&self) -> usize {
        self.references
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunk_key::ChunkKeyEncoding;

    fn place(origin: &[u64]) -> ShardPlace {
        ShardPlace { origin: origin.to_vec(), per_shard: vec![4, 8] }
    }

    fn array() -> ArrayPath {
        ArrayPath {
            dir: "a".into(),
            encoding: ChunkKeyEncoding::from_json(&serde_json::json!({"name": "default"})).unwrap(),
        }
    }

    fn stamp(n: u64) -> Stamp {
        Stamp::new([n, 0, 0, 0, 0])
    }

    #[test]
    fn a_chunk_is_found_again_from_its_number_until_its_group_is_forgotten() {
        let mut groups = ChunkGroups::default();
        let a = chunk_number(&array(), &stamp(1), &place(&[4, 8]), &[5, 9]).unwrap();
        assert!(is_computed(a));
        assert_eq!(groups.remember(a, 1, 1, &place(&[4, 8]), 100), Some(false));
        let b = chunk_number(&array(), &stamp(1), &place(&[4, 8]), &[7, 15]).unwrap();
        assert_eq!(b - a, 2 * 8 + 6, "numbered by offset in the shard");
        assert_eq!(groups.remember(b, 1, 1, &place(&[4, 8]), 7), Some(true));
        assert_eq!(groups.remember(b, 1, 1, &place(&[4, 8]), 7), Some(true));
        assert_eq!(groups.len(), 3, "references, the kernel's second lookup of b too");
        let member = groups.member(b).unwrap();
        assert_eq!((member.coords, member.size), (vec![7, 15], 7));
        assert_eq!(groups.members(group_number(a).unwrap()), [a, b]);
        let other = chunk_number(&array(), &stamp(2), &place(&[4, 8]), &[5, 9]).unwrap();
        assert_ne!(group_number(other), group_number(a), "another version: another group");
        assert_eq!(groups.forget(a, 5), None, "no more than it holds");
        assert_eq!(groups.len(), 2);
        assert_eq!(groups.forget(b, 2), Some((1, 1)), "the group's last reference");
        assert!(groups.member(a).is_none() && groups.members(group_number(a).unwrap()).is_empty());
        assert_eq!(groups.len(), 0);
    }

    #[test]
    fn chunks_that_cannot_be_numbered_are_left_to_the_table() {
        let mut groups = ChunkGroups::default();
        let a = chunk_number(&array(), &stamp(1), &place(&[0, 0]), &[0, 0]).unwrap();
        assert_eq!(groups.remember(a, 1, 1, &place(&[0, 0]), 1 << 32), None, "too large");
        assert_eq!(chunk_number(&array(), &stamp(1), &place(&[0, 0]), &[4, 0]), None, "outside the shard");
        assert_eq!(groups.remember(a, 1, 1, &place(&[0, 0]), 1), Some(false));
        assert_eq!(groups.remember(a, 1, 2, &place(&[0, 0]), 1), None, "a number another group holds");
        let wide = ShardPlace { origin: vec![0], per_shard: vec![1 << 30] };
        assert_eq!(chunk_number(&array(), &stamp(1), &wide, &[GROUP_OFFSET]), None);
        assert!(chunk_number(&array(), &stamp(1), &wide, &[GROUP_OFFSET - 1]).is_some());
    }
}
