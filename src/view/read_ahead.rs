//! Shards asked for ahead of a reader going through an array in order. A Zarr reader reads a
//! selection chunk by chunk in C order of the chunk grid (a thread pool a few at once, in any
//! order among them), and so do `cat`, `cp` and `tar` of a chunk directory. Once three chunks a
//! reader opens follow each other (lookups do not count, nor a writer's opens: a writer looks
//! up and opens, in order, the chunks it is about to replace), the shards holding the next chunks
//! in that order are asked
//! for in the background ([`Store::prefetch`]): their indexes, and their bytes from the first on,
//! so that a store whose reads cost a round trip brings each in one GET of its own, several at
//! once, while the reader is still at the ones before. How much of them is fetched ahead is the
//! store's to bound (its read-ahead memory). Where reads are local the store ignores the hint,
//! and this costs a lookup per chunk.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::array::ShardedArray;
use crate::store::Store;

/// Chunks a thread pool reads at once, in any order: this far apart they still follow each
/// other.
const SLACK: u64 = 8;
/// Chunks opened in order before the shards ahead are asked for: two could be a coincidence.
const IN_ORDER: u32 = 3;
/// The shards holding the next this many shards' worth of chunks are asked for, or two rows of
/// shards' worth (a 2-D array read row by row: the next row is under way before the reader
/// enters it), up to [`MOST_AHEAD`].
const SHARDS_AHEAD: u64 = 3;
const MOST_AHEAD: u64 = 8;
/// How many arrays' readers are followed.
const ARRAYS: usize = 1024;
/// Shards remembered as asked for, per array; past this they are forgotten.
const ASKED: usize = 4096;
/// Runs of chunks walked at most per chunk opened, to find the shards ahead.
const MOST_STEPS: u32 = 4096;

/// Where the readers of one array have got to.
#[derive(Debug)]
struct Progress {
    /// The furthest chunk opened, as its place in C order of the chunk grid.
    last: u64,
    /// Chunks opened in order so far.
    in_order: u32,
    /// The chunks up to this place have had their shards asked for.
    asked_until: u64,
    /// The shards asked for (places in C order of the shard grid).
    asked: HashSet<u64>,
}

/// The readers' progress through every array, by array directory.
#[derive(Debug)]
pub struct ReadAhead {
    arrays: Mutex<LruCache<Arc<str>, Progress>>,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead { arrays: Mutex::new(LruCache::new(NonZeroUsize::new(ARRAYS).expect("non-zero"))) }
    }
}

impl ReadAhead {
    /// Takes note that a reader opened the chunk at grid coordinates `chunk` of `array`, and
    /// asks `store` for the shards of the chunks after it when the reader goes on in order.
    pub fn reached(&self, store: &dyn Store, array: &ShardedArray, chunk: &[u64]) {
        let shards = self.shards_ahead(array, chunk);
        let Some(outer) = array.meta.sharding.levels.first().map(|level| level.index) else { return };
        for shard in shards {
            store.prefetch(
                &array.shard_key(&shard),
                Box::new(move |file| {
                    let size = file.attr().size;
                    if let Ok(index) = outer.index_range(size) {
                        file.prefetch(index);
                    }
                    file.prefetch(0..size);
                }),
            );
        }
    }

    /// Takes note that a reader opened the chunk at grid coordinates `chunk` of `array`: the
    /// shards to ask for now (each once while the reader goes on in order).
    fn shards_ahead(&self, array: &ShardedArray, chunk: &[u64]) -> Vec<Vec<u64>> {
        let Some(place) = c_order(chunk, &array.grid) else { return Vec::new() };
        // Grids come from documents on disk: too many chunks to count are no order to follow.
        let count = |shape: &[u64]| shape.iter().try_fold(1u64, |n, s| n.checked_mul(*s));
        let (Some(chunks), Some(per_shard)) = (count(&array.grid), count(&array.meta.sharding.chunks_per_shard()))
        else {
            return Vec::new();
        };
        let mut arrays = self.arrays.lock();
        let fresh = || Progress { last: place, in_order: 1, asked_until: place, asked: HashSet::new() };
        let progress = arrays.get_or_insert_mut(array.dir.clone(), fresh);
        if place <= progress.last {
            // Reads of chunks opened before (a pool's slower threads, the kernel reading a file
            // it opened long ago) are no step back; only a new pass from further back than the
            // shards asked for starts over.
            if place.saturating_add(SHARDS_AHEAD.saturating_mul(per_shard)) < progress.last {
                *progress = fresh();
            }
            return Vec::new();
        }
        if place > progress.last + SLACK {
            *progress = fresh();
            return Vec::new();
        }
        progress.last = place;
        progress.in_order += 1;
        if progress.in_order < IN_ORDER {
            return Vec::new();
        }
        // Two rows of shards ahead (a 2-D reader entering a row of shards has the next one under
        // way), at least [`SHARDS_AHEAD`], at most [`MOST_AHEAD`].
        let shards_per_row = array.shard_grid.last().copied().unwrap_or(1);
        let ahead = shards_per_row.saturating_mul(2).clamp(SHARDS_AHEAD, MOST_AHEAD).saturating_mul(per_shard);
        let until = place.saturating_add(ahead).min(chunks.saturating_sub(1));
        let per_shard_along_last = array.meta.sharding.chunks_per_shard().last().copied().unwrap_or(1).max(1);
        let row = array.grid.last().copied().unwrap_or(1).max(1);
        let mut shards = Vec::new();
        let mut next = progress.asked_until.max(place);
        let mut steps = 0;
        while next <= until && steps < MOST_STEPS {
            let coords = coords_of(next, &array.grid);
            let shard = array.meta.sharding.locate(&coords).shard;
            if let Some(at) = c_order(&shard, &array.shard_grid)
                && progress.asked.insert(at)
            {
                shards.push(shard);
            }
            // The chunks after it in its row up to the shard's edge are in the same shard.
            let along = coords.last().copied().unwrap_or(0);
            let edge = ((along / per_shard_along_last + 1) * per_shard_along_last).min(row);
            next += edge - along;
            steps += 1;
        }
        progress.asked_until = next.min(until + 1);
        if progress.asked.len() > ASKED {
            progress.asked.clear();
        }
        shards
    }
}

/// The place of `coords` in the C order of a grid of `shape`, when inside it.
fn c_order(coords: &[u64], shape: &[u64]) -> Option<u64> {
    if coords.len() != shape.len() || coords.iter().zip(shape).any(|(c, s)| c >= s) {
        return None;
    }
    coords.iter().zip(shape).try_fold(0u64, |place, (c, s)| place.checked_mul(*s)?.checked_add(*c))
}

/// The coordinates of place `place` in the C order of a grid of `shape`.
fn coords_of(mut place: u64, shape: &[u64]) -> Vec<u64> {
    let mut coords = vec![0; shape.len()];
    for (c, s) in coords.iter_mut().zip(shape).rev() {
        *c = place % s;
        place /= s;
    }
    coords
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::array::test_array as array;

    #[test]
    fn a_reader_going_on_in_order_has_the_next_shards_asked_for_once() {
        // 1-D: 16 chunks in 4 shards.
        let a = array(&[16], &[1], &[4]);
        let ahead = ReadAhead::default();
        assert!(ahead.shards_ahead(&a, &[0]).is_empty());
        assert!(ahead.shards_ahead(&a, &[1]).is_empty(), "two in order could be a coincidence");
        assert_eq!(ahead.shards_ahead(&a, &[2]), [[0], [1], [2], [3]], "the shard entered and three more");
        assert!(ahead.shards_ahead(&a, &[3]).is_empty() && ahead.shards_ahead(&a, &[5]).is_empty(), "once");
        assert!(ahead.shards_ahead(&a, &[4]).is_empty(), "a pool's slower thread is no step back");
    }

    #[test]
    fn chunks_far_apart_are_no_order() {
        let a = array(&[64], &[1], &[4]);
        let ahead = ReadAhead::default();
        for place in [0, 20, 40, 60, 3] {
            assert!(ahead.shards_ahead(&a, &[place]).is_empty(), "{place}");
        }
    }

    #[test]
    fn rows_of_a_2d_array_ask_for_the_shards_of_the_rows_ahead() {
        // 8x8 chunks in 2x2 shards of 4x4 chunks: reading row 0 in order reaches, 3 shards of
        // chunks ahead (48 chunks: rows 0 to 6), the shards of both shard rows.
        let a = array(&[8, 8], &[1, 1], &[4, 4]);
        let ahead = ReadAhead::default();
        let mut asked = Vec::new();
        for j in 0..3 {
            asked.extend(ahead.shards_ahead(&a, &[0, j]));
        }
        asked.sort();
        assert_eq!(asked, [[0, 0], [0, 1], [1, 0], [1, 1]]);
    }

    #[test]
    fn a_grid_of_more_chunks_than_can_be_counted_is_followed_by_no_one() {
        let a = array(&[1 << 40, 1 << 40], &[1, 1], &[1, 2]);
        let ahead = ReadAhead::default();
        for j in 0..4 {
            assert!(ahead.shards_ahead(&a, &[0, j]).is_empty());
        }
    }

    #[test]
    fn places_in_c_order_go_both_ways() {
        let shape = [4, 3, 5];
        for place in 0..60 {
            assert_eq!(c_order(&coords_of(place, &shape), &shape), Some(place));
        }
        assert_eq!(c_order(&[1, 2, 3], &shape), Some(15 + 2 * 5 + 3));
        assert_eq!(c_order(&[4, 0, 0], &shape), None);
        assert_eq!(c_order(&[0, 0], &shape), None);
    }
}
