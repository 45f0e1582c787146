//! Files asked for ahead of a reader going through an array in order. A Zarr reader reads a
//! selection chunk by chunk in C order of the chunk grid (a thread pool a few at once, in any
//! order among them), and so do `cat`, `cp` and `tar` of a chunk directory. Once three chunks a
//! reader opens follow each other (lookups do not count, nor a writer's opens: a writer looks
//! up and opens, in order, the chunks it is about to replace), the files holding the next chunks
//! in that order are asked for in the background ([`Store::prefetch`]): the shards of a sharded
//! array (their indexes, and their bytes from the first on), or the chunk files themselves of an
//! array the view shows as stored ([`PlainArray`]: Zarr v2 arrays, v3 ones without sharding). So
//! a store whose reads cost a round trip (an object store) or a pass through a library (a
//! database) brings each in a read of its own, several at once, while the reader is still at
//! the ones before. How much of them is fetched ahead is the store's to bound (its read-ahead
//! memory). Where reads are local the store ignores the hint, and this costs a lookup per chunk.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::array::ShardedArray;
use super::plain_arrays::PlainArray;
use crate::store::Store;

/// Chunks a thread pool reads at once, in any order: this far apart they still follow each
/// other.
const SLACK: u64 = 8;
/// Chunks opened in order before the shards ahead are asked for: two could be a coincidence.
const IN_ORDER: u32 = 3;
/// The files holding the next this many files' worth of chunks are asked for, or two rows of
/// files' worth (a 2-D array read row by row: the next row is under way before the reader
/// enters it), up to [`MOST_AHEAD`].
const FILES_AHEAD: u64 = 3;
const MOST_AHEAD: u64 = 8;
/// The same for the chunk files of an array shown as stored: each is one chunk, often tens of
/// KiB, and on an object store a round trip or two (its HEAD once its listing is stale, its
/// GET): a shard's worth of them ahead keeps the requests a mount makes at once busy.
const CHUNK_FILES_AHEAD: u64 = 16;
const MOST_CHUNK_FILES_AHEAD: u64 = 32;
/// How many arrays' readers are followed.
const ARRAYS: usize = 1024;
/// Files remembered as asked for, per array; past this they are forgotten.
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
    /// The chunks up to this place have had their files asked for.
    asked_until: u64,
    /// The files asked for (places in C order of the file grid).
    asked: HashSet<u64>,
}

/// What a reader is followed through: an array's chunk grid, and the files its chunks are
/// grouped in (shards; for an array shown as stored, each chunk its own file).
struct Layout<'a> {
    dir: &'a Arc<str>,
    grid: &'a [u64],
    /// Chunks along each dimension of one file.
    per_file: Vec<u64>,
    /// Files along each dimension.
    file_grid: &'a [u64],
    /// How many files' worth of chunks are asked for ahead, at least and at most.
    ahead: (u64, u64),
}

impl<'a> Layout<'a> {
    fn of_sharded(array: &'a ShardedArray) -> Self {
        let per_file = array.meta.sharding.chunks_per_shard();
        Layout {
            dir: &array.dir,
            grid: &array.grid,
            per_file,
            file_grid: &array.shard_grid,
            ahead: (FILES_AHEAD, MOST_AHEAD),
        }
    }

    fn of_plain(array: &'a PlainArray) -> Self {
        let ahead = (CHUNK_FILES_AHEAD, MOST_CHUNK_FILES_AHEAD);
        Layout {
            dir: &array.dir,
            grid: &array.grid,
            per_file: vec![1; array.grid.len()],
            file_grid: &array.grid,
            ahead,
        }
    }

    /// The file holding the chunk at `coords`.
    fn file_of(&self, coords: &[u64]) -> Vec<u64> {
        coords.iter().zip(&self.per_file).map(|(c, n)| c / n.max(&1)).collect()
    }
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
        let shards = self.files_ahead(&Layout::of_sharded(array), chunk);
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

    /// Takes note that a reader opened the chunk file at grid coordinates `chunk` of `array`, an
    /// array shown as stored, and asks `store` for the chunk files after it when the reader goes
    /// on in order.
    pub fn reached_plain(&self, store: &dyn Store, array: &PlainArray, chunk: &[u64]) {
        for file in self.files_ahead(&Layout::of_plain(array), chunk) {
            store.prefetch(
                &array.chunk_key(&file),
                Box::new(|file| {
                    let size = file.attr().size;
                    file.prefetch(0..size);
                }),
            );
        }
    }

    /// Takes note that a reader opened the chunk at grid coordinates `chunk` of `layout`: the
    /// files to ask for now (each once while the reader goes on in order).
    fn files_ahead(&self, layout: &Layout, chunk: &[u64]) -> Vec<Vec<u64>> {
        let Some(place) = c_order(chunk, layout.grid) else { return Vec::new() };
        // Grids come from documents on disk: too many chunks to count are no order to follow.
        let count = |shape: &[u64]| shape.iter().try_fold(1u64, |n, s| n.checked_mul(*s));
        let (Some(chunks), Some(per_file)) = (count(layout.grid), count(&layout.per_file)) else {
            return Vec::new();
        };
        let mut arrays = self.arrays.lock();
        let fresh = || Progress { last: place, in_order: 1, asked_until: place, asked: HashSet::new() };
        let progress = arrays.get_or_insert_mut(layout.dir.clone(), fresh);
        if place <= progress.last {
            // Reads of chunks opened before (a pool's slower threads, the kernel reading a file
            // it opened long ago) are no step back; only a new pass from further back than the
            // files asked for starts over.
            if place.saturating_add(layout.ahead.0.saturating_mul(per_file)) < progress.last {
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
        // Two rows of files ahead (a 2-D reader entering a row of files has the next one under
        // way), at least [`FILES_AHEAD`], at most [`MOST_AHEAD`].
        let files_per_row = layout.file_grid.last().copied().unwrap_or(1);
        let (least, most) = layout.ahead;
        let ahead = files_per_row.saturating_mul(2).clamp(least, most).saturating_mul(per_file);
        let until = place.saturating_add(ahead).min(chunks.saturating_sub(1));
        let per_file_along_last = layout.per_file.last().copied().unwrap_or(1).max(1);
        let row = layout.grid.last().copied().unwrap_or(1).max(1);
        let mut files = Vec::new();
        let mut next = progress.asked_until.max(place);
        let mut steps = 0;
        while next <= until && steps < MOST_STEPS {
            let coords = coords_of(next, layout.grid);
            let file = layout.file_of(&coords);
            if let Some(at) = c_order(&file, layout.file_grid)
                && progress.asked.insert(at)
            {
                files.push(file);
            }
            // The chunks after it in its row up to the file's edge are in the same file.
            let along = coords.last().copied().unwrap_or(0);
            let edge = ((along / per_file_along_last + 1) * per_file_along_last).min(row);
            next += edge - along;
            steps += 1;
        }
        progress.asked_until = next.min(until + 1);
        if progress.asked.len() > ASKED {
            progress.asked.clear();
        }
        files
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
        assert!(ahead.files_ahead(&Layout::of_sharded(&a), &[0]).is_empty());
        assert!(ahead.files_ahead(&Layout::of_sharded(&a), &[1]).is_empty(), "two in order could be a coincidence");
        assert_eq!(
            ahead.files_ahead(&Layout::of_sharded(&a), &[2]),
            [[0], [1], [2], [3]],
            "the shard entered and three more"
        );
        assert!(
            ahead.files_ahead(&Layout::of_sharded(&a), &[3]).is_empty()
                && ahead.files_ahead(&Layout::of_sharded(&a), &[5]).is_empty(),
            "once"
        );
        assert!(ahead.files_ahead(&Layout::of_sharded(&a), &[4]).is_empty(), "a pool's slower thread is no step back");
    }

    #[test]
    fn chunks_far_apart_are_no_order() {
        let a = array(&[64], &[1], &[4]);
        let ahead = ReadAhead::default();
        for place in [0, 20, 40, 60, 3] {
            assert!(ahead.files_ahead(&Layout::of_sharded(&a), &[place]).is_empty(), "{place}");
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
            asked.extend(ahead.files_ahead(&Layout::of_sharded(&a), &[0, j]));
        }
        asked.sort();
        assert_eq!(asked, [[0, 0], [0, 1], [1, 0], [1, 1]]);
    }

    #[test]
    fn a_grid_of_more_chunks_than_can_be_counted_is_followed_by_no_one() {
        let a = array(&[1 << 40, 1 << 40], &[1, 1], &[1, 2]);
        let ahead = ReadAhead::default();
        for j in 0..4 {
            assert!(ahead.files_ahead(&Layout::of_sharded(&a), &[0, j]).is_empty());
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
