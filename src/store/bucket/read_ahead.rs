//! Read-ahead for object stores: a reader going through a shard in order (cat, cp -r, tar, a Zarr
//! reader walking a region) would otherwise cost one request per chunk. Each object remembers
//! where its last read ended; a read that starts near there (within 256 KiB) is sequential, and
//! fetches a window beyond what it asked for: 1 MiB the first time, doubling while reads stay
//! sequential, up to 16 MiB, as mountpoint-s3's prefetcher does; an object of at most 4 MiB read
//! a second time is fetched whole. Windows are kept in a cache
//! bounded by bytes and keyed by object and version, so a window is never served for another
//! version of the object.

use std::num::NonZeroUsize;
use std::ops::Range;

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;

use crate::store::Stamp;

const FIRST_WINDOW: u64 = 1 << 20;
const LARGEST_WINDOW: u64 = 16 << 20;
/// An object at most this large read a second time is fetched whole (a shard of small chunks
/// being read by a Zarr reader, whose reads come from a pool in no particular order).
const SMALL_OBJECT: u64 = 4 << 20;
/// A read this close to where the last one ended, before or after, continues the stream.
const NEAR: u64 = 256 << 10;
/// How many objects' read positions are remembered.
const STREAMS: usize = 4096;

#[derive(Debug)]
struct Stream {
    stamp: Stamp,
    /// Where a sequential reader reads next.
    next: u64,
    /// The window the next sequential miss fetches (0: none yet).
    window: u64,
    /// The last window fetched, from `start`.
    fetched: Option<(u64, Bytes)>,
}

#[derive(Debug)]
struct State {
    streams: LruCache<String, Stream>,
    /// Bytes held in windows.
    held: usize,
}

/// The read positions and fetched windows of every object read.
#[derive(Debug)]
pub struct ReadAhead {
    state: Mutex<State>,
    budget: usize,
}

impl ReadAhead {
    /// Keeps at most `budget` bytes of windows; 0 turns read-ahead off.
    pub fn new(budget: usize) -> Self {
        let streams = LruCache::new(NonZeroUsize::new(STREAMS).expect("non-zero"));
        ReadAhead { state: Mutex::new(State { streams, held: 0 }), budget }
    }

    /// The bytes `wanted` of version `stamp` of object `key` (`size` bytes long), from a window
    /// fetched before or with `fetch(range)`, which may be asked for more than `wanted`.
    pub fn read<E>(
        &self,
        key: &str,
        stamp: Stamp,
        size: u64,
        wanted: Range<u64>,
        fetch: impl FnOnce(Range<u64>) -> Result<Bytes, E>,
    ) -> Result<Bytes, E> {
        let range = {
            let mut state = self.state.lock();
            let stream = state.streams.get_mut(key).filter(|s| s.stamp == stamp);
            match stream {
                Some(stream) => {
                    if let Some((start, bytes)) = &stream.fetched
                        && *start <= wanted.start
                        && wanted.end <= start + bytes.len() as u64
                    {
                        let hit = bytes.slice((wanted.start - start) as usize..(wanted.end - start) as usize);
                        stream.next = wanted.end;
                        return Ok(hit);
                    }
                    // Readers with several reads in flight (a Zarr reader's thread pool, the
                    // kernel's own read-ahead) arrive a little out of order: near counts.
                    let sequential =
                        wanted.start + NEAR >= stream.next && wanted.start <= stream.next + stream.window.max(NEAR);
                    stream.window =
                        if sequential { (stream.window * 2).clamp(FIRST_WINDOW, LARGEST_WINDOW) } else { 0 };
                    if size <= SMALL_OBJECT {
                        // A second read of a small object: the rest of it costs no more.
                        0..size
                    } else {
                        wanted.start..wanted.end.max(wanted.start + stream.window).min(size)
                    }
                }
                None => wanted.clone(),
            }
        };
        let range = if range.end - range.start > self.budget as u64 { wanted.clone() } else { range };
        let bytes = fetch(range.clone())?;
        let from = ((wanted.start - range.start) as usize).min(bytes.len());
        let to = ((wanted.end - range.start) as usize).clamp(from, bytes.len());
        let hit = bytes.slice(from..to);
        let wanted_len = to - from;
        let mut state = self.state.lock();
        let keep = bytes.len() > wanted_len;
        let held = if keep { bytes.len() } else { 0 };
        let stream = Stream { stamp, next: wanted.end, window: 0, fetched: keep.then_some((range.start, bytes)) };
        let previous = state.streams.get(key).filter(|s| s.stamp == stamp).map(|s| s.window);
        let stream = Stream { window: previous.unwrap_or(0), ..stream };
        // The entry replaced, or the least recently used one pushed out: its window goes too.
        if let Some((_, old)) = state.streams.push(key.to_string(), stream) {
            state.held -= old.fetched.map_or(0, |(_, b)| b.len());
        }
        state.held += held;
        while state.held > self.budget {
            // Windows go oldest first; the read positions stay.
            let Some(victim) = state.streams.iter_mut().rev().find_map(|(_, s)| s.fetched.take()) else { break };
            state.held -= victim.1.len();
        }
        Ok(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn stamp(n: u64) -> Stamp {
        Stamp::new([n, 0, 0, 0, 0])
    }

    /// Reads `ranges` of a 64 MiB object through `ahead`, returning the ranges fetched.
    fn fetched(ahead: &ReadAhead, version: u64, ranges: &[Range<u64>]) -> Vec<Range<u64>> {
        let log = RefCell::new(Vec::new());
        for range in ranges {
            let bytes = ahead
                .read("k", stamp(version), 64 << 20, range.clone(), |r| {
                    log.borrow_mut().push(r.clone());
                    Ok::<_, ()>(Bytes::from((r.start..r.end).map(|i| i as u8).collect::<Vec<_>>()))
                })
                .unwrap();
            let expected: Vec<u8> = (range.start..range.end).map(|i| i as u8).collect();
            assert_eq!(&bytes[..], &expected[..], "the bytes of {range:?}");
        }
        log.into_inner()
    }

    #[test]
    fn sequential_reads_fetch_growing_windows_and_are_served_from_them() {
        let ahead = ReadAhead::new(64 << 20);
        let chunks: Vec<Range<u64>> = (0..2000u64).map(|i| i * 1000..(i + 1) * 1000).collect();
        let fetched = fetched(&ahead, 1, &chunks);
        assert_eq!(fetched[0], 0..1000, "the first read fetches what it asks");
        assert_eq!(fetched[1], 1000..1000 + (1 << 20));
        assert_eq!(fetched.len(), 3, "2 MB of 1 kB chunks in three requests: {fetched:?}");
    }

    #[test]
    fn random_reads_fetch_only_what_they_ask_and_versions_never_mix() {
        let ahead = ReadAhead::new(64 << 20);
        let far = [50 << 20..(50 << 20) + 1000, 100..200, 9 << 20..(9 << 20) + 100];
        assert_eq!(fetched(&ahead, 1, &far), far);
        fetched(&ahead, 1, &[0..10, 10..20]);
        let again = fetched(&ahead, 2, &[20..30, 30..40]);
        assert_eq!(again[0], 20..30, "another version fetches again");
    }

    #[test]
    fn a_small_object_read_twice_is_fetched_whole() {
        let ahead = ReadAhead::new(64 << 20);
        let log = RefCell::new(Vec::new());
        for wanted in [5000..6000, 90_000..91_000, 50..60] {
            let bytes = ahead
                .read("small", stamp(1), 100_000, wanted.clone(), |r| {
                    log.borrow_mut().push(r.clone());
                    Ok::<_, ()>(Bytes::from((r.start..r.end).map(|i| (i % 251) as u8).collect::<Vec<_>>()))
                })
                .unwrap();
            assert_eq!(bytes.to_vec(), (wanted.start..wanted.end).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        }
        assert_eq!(log.into_inner(), [5000..6000, 0..100_000]);
    }

    #[test]
    fn windows_of_streams_pushed_out_are_no_longer_counted() {
        let ahead = ReadAhead::new(64 << 20);
        fetched(&ahead, 1, &[0..10, 10..20]);
        for i in 0..STREAMS as u64 + 1 {
            let key = format!("other{i}");
            ahead
                .read(&key, stamp(1), 100, 0..10, |r| Ok::<_, ()>(Bytes::from(vec![0; (r.end - r.start) as usize])))
                .unwrap();
        }
        assert_eq!(ahead.state.lock().held, 0);
    }

    #[test]
    fn windows_stay_within_the_budget() {
        let ahead = ReadAhead::new(1 << 20);
        fetched(&ahead, 1, &[0..10, 10..20, 20..30]);
        assert!(ahead.state.lock().held <= 1 << 20);
    }
}
