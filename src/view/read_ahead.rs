//! Files asked for ahead of a reader going through an array. A Zarr reader reads a
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
//!
//! A small array is asked for whole: once its opens, close together in time and in any order
//! (zarr-python's first reads may jump between rows of shards), reach the chunks of [`SCATTERED`]
//! shards of an array of at most [`FEW_SHARDS`], the other shards are asked for at once (and not
//! again for [`ASK_AGAIN`]), as zarr-python reading the array's own keys asks for its whole
//! selection. Without it each shard was fetched at its first read or two rows of shards ahead of
//! it, a few at a time over half a second (docs/benchmarks.md, `tiles` at 20 ms). Of a shard larger
//! than [`WHOLE_SHARD`] only the index is asked for so, and a reader going on in order still has
//! its bytes asked for ahead.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// Shards a reader opens chunks of, in any order, before the rest of a small array is asked for:
/// two could be a viewer's neighbouring tiles across a shard's edge.
const SCATTERED: usize = 3;
/// The most shards an array may have to be asked for whole: a few hundred MiB at most of small
/// shards (of a larger shard, only its index, [`WHOLE_SHARD`]).
const FEW_SHARDS: u64 = 64;
/// Opens this close after each other are one reader's; after a pause as long, opens are a new
/// reader's (a viewer's next look at a few tiles is no reader of the whole array).
const BURST_GAP: Duration = Duration::from_secs(1);
/// A shard of an array asked for whole is fetched ahead whole when at most this large (a store
/// fetches a shard of small chunks whole at its first read anyway); of a larger one, only its index:
/// its bytes come as readers reach them, rather than a first lane of each of 64 large shards, far
/// more than a store keeps for bytes nobody asked for yet.
const WHOLE_SHARD: u64 = 8 << 20;
/// An array asked for whole is not asked for whole again this soon: a reader that reads a plane,
/// computes for a few seconds and reads the next would otherwise have it asked for at every plane,
/// and what was fetched and then dropped to make room fetched again each time.
const ASK_AGAIN: Duration = Duration::from_secs(30);

/// Where the readers of one array have got to.
#[derive(Debug)]
struct Progress {
    run: Run,
    burst: Burst,
}

/// Readers going on in order through an array.
#[derive(Debug)]
struct Run {
    /// The furthest chunk opened, as its place in C order of the chunk grid.
    last: u64,
    /// Chunks opened in order so far.
    in_order: u32,
    /// The chunks up to this place have had their files asked for.
    asked_until: u64,
    /// The files asked for (places in C order of the file grid).
    asked: HashSet<u64>,
}

/// Opens of an array close together in time, in any order.
#[derive(Debug)]
struct Burst {
    last_open: Instant,
    /// The files opened (places in C order of the file grid), up to [`SCATTERED`].
    opened: HashSet<u64>,
    /// When the array was last asked for whole.
    whole_asked: Option<Instant>,
}

impl Burst {
    fn starting_at(now: Instant) -> Self {
        Burst { last_open: now, opened: HashSet::new(), whole_asked: None }
    }

    /// Takes note of an open of the file at `file` at `now`: whether the array is now to be asked
    /// for whole.
    fn opened(&mut self, file: u64, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_open) > BURST_GAP {
            self.opened.clear();
        }
        self.last_open = now;
        match self.whole_asked {
            Some(at) if now.saturating_duration_since(at) < ASK_AGAIN => return false,
            Some(_) => {
                self.whole_asked = None;
                self.opened.clear();
            }
            None => {}
        }
        self.opened.insert(file);
        if self.opened.len() < SCATTERED {
            return false;
        }
        self.whole_asked = Some(now);
        true
    }
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
    /// The most files an array may have to be asked for whole.
    few_files: u64,
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
            few_files: FEW_SHARDS,
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
            // Not measured yet: an array shown as stored is followed in order only.
            few_files: 0,
        }
    }

    /// The file holding the chunk at `coords`.
    fn file_of(&self, coords: &[u64]) -> Vec<u64> {
        coords.iter().zip(&self.per_file).map(|(c, n)| c / n.max(&1)).collect()
    }
}

/// The files a reader's open has asked for: those ahead of a reader going on in order, and the
/// rest of a small array asked for whole.
#[derive(Debug, Default)]
struct Asked {
    ahead: Vec<Vec<u64>>,
    whole: Vec<Vec<u64>>,
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
    /// asks `store` for the shards of the chunks after it when the reader goes on in order, or for
    /// the rest of a small array's shards when the reader's opens are scattered over them.
    pub fn reached(&self, store: &dyn Store, array: &ShardedArray, chunk: &[u64]) {
        let asked = self.files_ahead(&Layout::of_sharded(array), chunk, Instant::now());
        let Some(outer) = array.meta.sharding.levels.first().map(|level| level.index) else { return };
        let ahead = asked.ahead.into_iter().map(|shard| (shard, false));
        for (shard, whole) in ahead.chain(asked.whole.into_iter().map(|shard| (shard, true))) {
            store.prefetch(
                &array.shard_key(&shard),
                Box::new(move |file| {
                    let size = file.attr().size;
                    if let Ok(index) = outer.index_range(size) {
                        file.prefetch(index);
                    }
                    if !whole || size <= WHOLE_SHARD {
                        file.prefetch(0..size);
                    }
                }),
            );
        }
    }

    /// Takes note that a reader opened the chunk file at grid coordinates `chunk` of `array`, an
    /// array shown as stored, and asks `store` for the chunk files after it when the reader goes
    /// on in order.
    pub fn reached_plain(&self, store: &dyn Store, array: &PlainArray, chunk: &[u64]) {
        let asked = self.files_ahead(&Layout::of_plain(array), chunk, Instant::now());
        for file in asked.ahead.into_iter().chain(asked.whole) {
            store.prefetch(
                &array.chunk_key(&file),
                Box::new(|file| {
                    let size = file.attr().size;
                    file.prefetch(0..size);
                }),
            );
        }
    }

    /// Takes note that a reader opened the chunk at grid coordinates `chunk` of `layout` at `now`:
    /// the files to ask for now (each once while the reader goes on).
    fn files_ahead(&self, layout: &Layout, chunk: &[u64], now: Instant) -> Asked {
        let Some(place) = c_order(chunk, layout.grid) else { return Asked::default() };
        // Grids come from documents on disk: too many chunks to count are no order to follow.
        let count = |shape: &[u64]| shape.iter().try_fold(1u64, |n, s| n.checked_mul(*s));
        let (Some(chunks), Some(per_file), Some(files)) =
            (count(layout.grid), count(&layout.per_file), count(layout.file_grid))
        else {
            return Asked::default();
        };
        let mut arrays = self.arrays.lock();
        let fresh = || Progress { run: Run::starting_at(place), burst: Burst::starting_at(now) };
        let Progress { run, burst } = arrays.get_or_insert_mut(layout.dir.clone(), fresh);
        let mut asked = Asked { ahead: run.went_on(layout, place, chunks, per_file), whole: Vec::new() };
        if files <= layout.few_files
            && let Some(file) = c_order(&layout.file_of(chunk), layout.file_grid)
            && burst.opened(file, now)
        {
            // Not taken for asked ahead: of a large shard only the index is, and a reader going on
            // in order still wants its first bytes asked for when it comes near.
            for at in 0..files {
                if !burst.opened.contains(&at) && !run.asked.contains(&at) {
                    asked.whole.push(coords_of(at, layout.file_grid));
                }
            }
        }
        if run.asked.len() > ASKED {
            run.asked.clear();
        }
        asked
    }
}

impl Run {
    fn starting_at(place: u64) -> Self {
        Run { last: place, in_order: 1, asked_until: place, asked: HashSet::new() }
    }

    /// Takes note that a reader opened the chunk at `place` (in C order of `layout`'s grid of
    /// `chunks` chunks, `per_file` to a file): the files ahead to ask for now, when readers go on
    /// in order.
    fn went_on(&mut self, layout: &Layout, place: u64, chunks: u64, per_file: u64) -> Vec<Vec<u64>> {
        if place <= self.last {
            // Reads of chunks opened before (a pool's slower threads, the kernel reading a file
            // it opened long ago) are no step back; only a new pass from further back than the
            // files asked for starts over.
            if place.saturating_add(layout.ahead.0.saturating_mul(per_file)) < self.last {
                *self = Run::starting_at(place);
            }
            return Vec::new();
        }
        if place > self.last + SLACK {
            *self = Run::starting_at(place);
            return Vec::new();
        }
        self.last = place;
        self.in_order += 1;
        if self.in_order < IN_ORDER {
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
        let mut next = self.asked_until.max(place);
        let mut steps = 0;
        while next <= until && steps < MOST_STEPS {
            let coords = coords_of(next, layout.grid);
            let file = layout.file_of(&coords);
            if let Some(at) = c_order(&file, layout.file_grid)
                && self.asked.insert(at)
            {
                files.push(file);
            }
            // The chunks after it in its row up to the file's edge are in the same file.
            let along = coords.last().copied().unwrap_or(0);
            let edge = ((along / per_file_along_last + 1) * per_file_along_last).min(row);
            next += edge - along;
            steps += 1;
        }
        self.asked_until = next.min(until + 1);
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

    /// The files asked for when a reader opens `chunk` of `a`, all opens at one moment.
    fn opened(ahead: &ReadAhead, a: &ShardedArray, chunk: &[u64]) -> Vec<Vec<u64>> {
        opened_at(ahead, a, chunk, Duration::ZERO)
    }

    /// The same, `after` a moment fixed for every test.
    fn opened_at(ahead: &ReadAhead, a: &ShardedArray, chunk: &[u64], after: Duration) -> Vec<Vec<u64>> {
        let asked = asked_at(ahead, a, chunk, after);
        asked.ahead.into_iter().chain(asked.whole).collect()
    }

    fn asked_at(ahead: &ReadAhead, a: &ShardedArray, chunk: &[u64], after: Duration) -> Asked {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ahead.files_ahead(&Layout::of_sharded(a), chunk, *START.get_or_init(Instant::now) + after)
    }

    #[test]
    fn shards_asked_for_whole_are_still_asked_ahead_of_a_reader_going_on_in_order() {
        // Row 0 read in order enters its third shard at [0, 16], where the array is asked for
        // whole: of a large shard that is its index alone, so the reader going on still has each
        // shard not asked ahead yet asked ahead when it comes near.
        let a = array(&[32, 32], &[1, 1], &[8, 8]);
        let ahead = ReadAhead::default();
        let (mut whole, mut later) = (Vec::new(), Vec::new());
        for i in 0..32 {
            for j in 0..32 {
                let asked = asked_at(&ahead, &a, &[i, j], Duration::ZERO);
                if whole.is_empty() {
                    whole = asked.whole;
                } else {
                    assert!(asked.whole.is_empty(), "asked for whole once");
                    later.extend(asked.ahead);
                }
            }
        }
        assert!(!whole.is_empty() && whole.iter().all(|shard| later.contains(shard)), "{whole:?} ahead: {later:?}");
    }

    #[test]
    fn a_reader_going_on_in_order_has_the_next_shards_asked_for_once() {
        // 1-D: 16 chunks in 4 shards.
        let a = array(&[16], &[1], &[4]);
        let ahead = ReadAhead::default();
        assert!(opened(&ahead, &a, &[0]).is_empty());
        assert!(opened(&ahead, &a, &[1]).is_empty(), "two in order could be a coincidence");
        assert_eq!(opened(&ahead, &a, &[2]), [[0], [1], [2], [3]], "the shard entered and three more");
        assert!(opened(&ahead, &a, &[3]).is_empty() && opened(&ahead, &a, &[5]).is_empty(), "once");
        assert!(opened(&ahead, &a, &[4]).is_empty(), "a pool's slower thread is no step back");
    }

    #[test]
    fn chunks_far_apart_are_no_order() {
        let a = array(&[1024], &[1], &[4]);
        let ahead = ReadAhead::default();
        for place in [0, 200, 400, 600, 3] {
            assert!(opened(&ahead, &a, &[place]).is_empty(), "{place}");
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
            asked.extend(opened(&ahead, &a, &[0, j]));
        }
        asked.sort();
        assert_eq!(asked, [[0, 0], [0, 1], [1, 0], [1, 1]]);
    }

    #[test]
    fn a_reader_opening_shards_of_a_small_array_out_of_order_has_the_rest_asked_for_at_once() {
        // 32x32 chunks in 4x4 shards of 8x8 chunks (`tiles` of the wan benchmark): zarr-python's
        // first opens jumping between rows of shards.
        let a = array(&[32, 32], &[1, 1], &[8, 8]);
        let ahead = ReadAhead::default();
        assert!(opened(&ahead, &a, &[0, 0]).is_empty());
        assert!(opened(&ahead, &a, &[24, 0]).is_empty(), "two could be a viewer's neighbouring tiles");
        let mut asked = opened(&ahead, &a, &[16, 1]);
        asked.sort();
        let rest: Vec<Vec<u64>> = (0..4)
            .flat_map(|i| (0..4).map(move |j| vec![i, j]))
            .filter(|s| ![[0, 0], [3, 0], [2, 0]].contains(&[s[0], s[1]]))
            .collect();
        assert_eq!(asked, rest, "every shard not opened yet");
        assert!(opened(&ahead, &a, &[8, 0]).is_empty() && opened(&ahead, &a, &[31, 31]).is_empty(), "once");
    }

    #[test]
    fn an_array_of_more_than_few_shards_is_not_asked_for_whole() {
        let asked = |shards: u64| {
            let (a, ahead) = (array(&[shards], &[1], &[1]), ReadAhead::default());
            [0, 20, 40].iter().map(|&c| opened(&ahead, &a, &[c]).len()).collect::<Vec<_>>()
        };
        assert_eq!(asked(FEW_SHARDS), [0, 0, FEW_SHARDS as usize - 3]);
        assert_eq!(asked(FEW_SHARDS + 1), [0, 0, 0]);
    }

    #[test]
    fn an_array_asked_for_whole_is_not_asked_again_before_a_while() {
        let a = array(&[32, 32], &[1, 1], &[8, 8]);
        let ahead = ReadAhead::default();
        let burst = |after: Duration| {
            [[0, 0], [24, 0], [16, 8]].iter().map(|c| opened_at(&ahead, &a, c, after).len()).sum::<usize>()
        };
        assert_eq!(burst(Duration::ZERO), 13);
        assert_eq!(burst(BURST_GAP * 2), 0, "a reader back after a pause");
        assert_eq!(burst(ASK_AGAIN + BURST_GAP * 4), 13, "and once more a while later");
    }

    #[test]
    fn opens_far_apart_in_time_are_no_reader_of_the_whole_array() {
        let a = array(&[32, 32], &[1, 1], &[8, 8]);
        let ahead = ReadAhead::default();
        for (n, chunk) in [[0, 0], [24, 0], [16, 0], [8, 8]].iter().enumerate() {
            let after = (BURST_GAP + Duration::from_millis(1)) * n as u32;
            assert!(opened_at(&ahead, &a, chunk, after).is_empty(), "{chunk:?}");
        }
    }

    #[test]
    fn a_reader_going_on_in_order_through_many_shards_is_followed_in_order_only() {
        // 16x16 shards of 2x2 chunks, more than are asked for whole: row 0 read in order enters
        // a shard every two chunks, and the shards of the next rows are asked for, not all.
        let a = array(&[32, 32], &[1, 1], &[2, 2]);
        let ahead = ReadAhead::default();
        let asked: usize = (0..12).map(|j| opened(&ahead, &a, &[0, j]).len()).sum();
        assert!(asked > 0 && asked <= 2 * MOST_AHEAD as usize, "{asked} shards asked for");
    }

    #[test]
    fn a_grid_of_more_chunks_than_can_be_counted_is_followed_by_no_one() {
        let a = array(&[1 << 40, 1 << 40], &[1, 1], &[1, 2]);
        let ahead = ReadAhead::default();
        for j in 0..4 {
            assert!(opened(&ahead, &a, &[0, j]).is_empty());
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
