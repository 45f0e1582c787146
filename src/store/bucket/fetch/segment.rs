//! One GET of a byte range of one object version, streamed: its bytes arrive in order, each
//! reader waits only for the bytes it wants, and the GET fetches only so far ahead of what its
//! readers have read before it waits for them (the server's connection stays open meanwhile, and
//! TCP holds the rest back).
//!
//! A segment's bytes are held in blocks of [`BLOCK`] bytes; blocks its readers have passed can be
//! dropped to make room ([`Segment::drop_read`]), and a reader of a dropped byte is told so, to
//! fetch it again. A GET that ends early (a stall, a reset, a short body, or cut for lack of
//! readers) leaves the bytes it brought: they are the right bytes of the right version, and a
//! reader of bytes beyond them asks again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};

use crate::store::Error;

/// The unit in which bytes are held and dropped.
pub const BLOCK: usize = 1 << 20;

/// What a read of a segment got.
#[derive(Debug)]
pub enum Got {
    /// This many bytes were copied: all those asked for up to the segment's end, or as many as
    /// the GET brought before it ended early.
    Copied(usize),
    /// The byte asked for is not held and will not be: dropped to make room, or beyond where the
    /// GET ended. Fetch it again.
    Gone,
    /// The GET failed before bringing the byte asked for.
    Failed(Error),
}

#[derive(Debug)]
struct Data {
    /// Where the bytes end: the end asked for, or where the GET ended early.
    end: u64,
    /// The first byte held: blocks before it were dropped.
    base: u64,
    /// Full blocks from `base` on.
    blocks: VecDeque<Bytes>,
    /// The bytes after the full blocks.
    tail: BytesMut,
    /// The GET brings the bytes up to here without waiting for readers: what its maker wants.
    wanted_end: u64,
    /// The end of the furthest read so far: the GET fetches ahead of it, and bytes before it
    /// may go to make room.
    frontier: u64,
    /// How the GET ended; `None` while it runs.
    outcome: Option<Result<(), Error>>,
    /// Readers waiting for bytes not arrived yet.
    waiting: usize,
    /// When a reader last read from it (or it was made).
    last_read: Instant,
    /// True while its bytes count against the fetcher's budget: until it is let go.
    counted: bool,
    /// True until a reader read from it.
    unread: bool,
}

impl Data {
    fn filled(&self) -> u64 {
        self.base + (self.blocks.len() * BLOCK + self.tail.len()) as u64
    }

    /// Copies `[at, to)` (all arrived and held) into `buf`.
    fn copy(&self, at: u64, to: u64, buf: &mut [u8]) {
        let mut at = at;
        let mut out = 0;
        while at < to {
            let offset = (at - self.base) as usize;
            let (block, within) = (offset / BLOCK, offset % BLOCK);
            let source: &[u8] = match self.blocks.get(block) {
                Some(bytes) => bytes,
                None => &self.tail,
            };
            let n = ((to - at) as usize).min(source.len() - within);
            buf[out..out + n].copy_from_slice(&source[within..within + n]);
            out += n;
            at += n as u64;
        }
    }
}

/// How far the readers of a run in order have got, for segments fetched ahead of them (lanes of
/// one run) that have no readers of their own yet.
#[derive(Debug)]
pub struct Follow {
    /// Where the run began.
    pub start: u64,
    /// The end of the furthest read of the run.
    frontier: AtomicU64,
    /// When a reader of the run last read.
    last_read: Mutex<Instant>,
}

impl Follow {
    pub fn new(start: u64) -> Self {
        Follow { start, frontier: AtomicU64::new(start), last_read: Mutex::new(Instant::now()) }
    }

    /// Takes note of a read of the run up to `end`.
    pub fn read_to(&self, end: u64) {
        self.frontier.fetch_max(end, Ordering::SeqCst);
        *self.last_read.lock() = Instant::now();
    }
}

/// One streamed GET of `start..end` of one version.
#[derive(Debug)]
pub struct Segment {
    pub start: u64,
    /// The run it is fetched ahead of, if any: it fetches a window ahead of that run's readers
    /// rather than of its own.
    follows: Option<std::sync::Arc<Follow>>,
    data: Mutex<Data>,
    arrived: Condvar,
    /// Woken when readers read on or wait, so that a GET waiting for them goes on.
    pub(super) read_on: tokio::sync::Notify,
}

impl Segment {
    /// A segment for `start..end` whose maker wants the bytes up to `wanted_end` at least, ahead
    /// of the readers of the run `follows`, if given.
    pub fn new(start: u64, end: u64, wanted_end: u64, follows: Option<std::sync::Arc<Follow>>) -> Self {
        let data = Data {
            end,
            base: start,
            blocks: VecDeque::new(),
            tail: BytesMut::new(),
            wanted_end,
            frontier: start,
            outcome: None,
            waiting: 0,
            last_read: Instant::now(),
            counted: true,
            unread: true,
        };
        Segment { start, follows, data: Mutex::new(data), arrived: Condvar::new(), read_on: tokio::sync::Notify::new() }
    }

    /// Where the segment's bytes end (or will, while the GET runs).
    pub fn end(&self) -> u64 {
        self.data.lock().end
    }

    /// True when `at` is among the bytes the segment holds or will bring.
    pub fn covers(&self, at: u64) -> bool {
        let data = self.data.lock();
        data.base <= at && at < data.end
    }

    /// Copies the bytes from `at` on into `buf`, waiting for them to arrive.
    pub fn read(&self, at: u64, buf: &mut [u8]) -> Got {
        let mut data = self.data.lock();
        loop {
            if at < data.base {
                return Got::Gone;
            }
            let to = (at + buf.len() as u64).min(data.end);
            let filled = data.filled();
            if at < to && filled >= to {
                data.copy(at, to, buf);
                data.frontier = data.frontier.max(to);
                data.last_read = Instant::now();
                data.unread = false;
                drop(data);
                self.read_on.notify_one();
                return Got::Copied((to - at) as usize);
            }
            if let Some(outcome) = &data.outcome {
                // Ended before `to`: what it brought from `at` on, else why not.
                if at < filled {
                    data.copy(at, filled, buf);
                    data.last_read = Instant::now();
                    data.unread = false;
                    return Got::Copied((filled - at) as usize);
                }
                return match outcome {
                    Err(e) => Got::Failed(e.duplicate()),
                    Ok(()) => Got::Gone,
                };
            }
            if at >= to {
                return Got::Gone;
            }
            data.waiting += 1;
            self.read_on.notify_one();
            self.arrived.wait(&mut data);
            data.waiting -= 1;
        }
    }

    /// True when a reader waits for bytes not arrived yet, or its maker wants more: the GET goes
    /// on, room or not.
    pub fn demanded(&self) -> bool {
        let data = self.data.lock();
        data.waiting > 0 || data.filled() < data.wanted_end.min(data.end)
    }

    /// True when less than `window(read)` is held ahead of the furthest read, where `read` is how
    /// much was read from the segment: the GET goes on if there is room.
    pub fn wanted(&self, window: impl Fn(u64) -> u64) -> bool {
        let data = self.data.lock();
        let (frontier, start) = match &self.follows {
            // Its own readers count once there are any.
            Some(run) if data.unread => (run.frontier.load(Ordering::SeqCst), run.start),
            Some(run) => (run.frontier.load(Ordering::SeqCst).max(data.frontier), run.start),
            None => (data.frontier, self.start),
        };
        data.filled() < (frontier + window(frontier.saturating_sub(start))).min(data.end)
    }

    /// True when a reader waits for bytes not arrived yet.
    pub fn awaited(&self) -> bool {
        self.data.lock().waiting > 0
    }

    /// True until a reader read from it.
    pub fn unread(&self) -> bool {
        self.data.lock().unread
    }

    /// When a reader last read from it, or from the run it follows.
    pub fn last_read(&self) -> Instant {
        let own = self.data.lock().last_read;
        self.follows.as_ref().map_or(own, |run| own.max(*run.last_read.lock()))
    }

    /// Takes `bytes`, the next ones the GET brought, up to the end asked for, counting them in
    /// `held` unless let go: how many it took (fewer only from a faulty reply, which ran long).
    pub fn append(&self, bytes: &[u8], held: &AtomicU64) -> u64 {
        let mut data = self.data.lock();
        let room = (data.end - data.filled()).min(bytes.len() as u64);
        let mut rest = &bytes[..room as usize];
        while !rest.is_empty() {
            if data.tail.capacity() == 0 {
                data.tail.reserve(BLOCK);
            }
            let n = rest.len().min(BLOCK - data.tail.len());
            data.tail.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if data.tail.len() == BLOCK {
                let full = std::mem::take(&mut data.tail).freeze();
                data.blocks.push_back(full);
            }
        }
        if data.counted {
            held.fetch_add(room, Ordering::SeqCst);
        }
        drop(data);
        self.arrived.notify_all();
        room
    }

    /// Ends the GET: done when every byte arrived, else cut where it got to (`Ok`: nobody wanted
    /// more) or failed. Readers waiting are woken.
    pub fn finish(&self, outcome: Result<(), Error>) {
        let mut data = self.data.lock();
        if data.outcome.is_none() {
            data.end = data.filled();
            data.outcome = Some(outcome);
        }
        drop(data);
        self.arrived.notify_all();
    }

    /// True once the GET ended.
    pub fn finished(&self) -> bool {
        self.data.lock().outcome.is_some()
    }

    /// Stops counting its bytes in `held`: it was let go (readers holding it may still finish).
    pub fn let_go(&self, held: &AtomicU64) {
        let mut data = self.data.lock();
        if std::mem::take(&mut data.counted) {
            held.fetch_sub(data.filled() - data.base, Ordering::SeqCst);
        }
    }

    /// The first byte it still holds or will bring (bytes before it were dropped).
    pub fn held_from(&self) -> u64 {
        self.data.lock().base
    }

    /// Drops the whole blocks the readers have read past by more than `margin` (the slower
    /// threads of a pool read a little behind the others), and stops counting them in `held`.
    pub fn drop_read(&self, margin: u64, held: &AtomicU64) {
        let mut data = self.data.lock();
        let mut freed = 0;
        while data.base + BLOCK as u64 + margin <= data.frontier && !data.blocks.is_empty() {
            data.blocks.pop_front();
            data.base += BLOCK as u64;
            freed += BLOCK as u64;
        }
        if data.counted {
            held.fetch_sub(freed, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(range: std::ops::Range<u64>) -> Vec<u8> {
        range.map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn bytes_are_read_as_they_arrive_and_dropped_once_read_past() {
        let held = AtomicU64::new(0);
        let segment = Segment::new(1000, 1000 + 3 * BLOCK as u64, 1000, None);
        let all = pattern(1000..1000 + 3 * BLOCK as u64);
        assert_eq!(segment.append(&all[..BLOCK + 70], &held), BLOCK as u64 + 70);
        let mut buf = vec![0; 100];
        assert!(matches!(segment.read(1000 + BLOCK as u64 - 50, &mut buf), Got::Copied(100)));
        assert_eq!(buf, pattern(1000 + BLOCK as u64 - 50..1000 + BLOCK as u64 + 50).as_slice()[..100]);
        segment.drop_read(BLOCK as u64, &held);
        assert_eq!(held.load(Ordering::SeqCst), BLOCK as u64 + 70, "read past, but within the margin");
        segment.drop_read(0, &held);
        assert_eq!(held.load(Ordering::SeqCst), 70, "the first block was read past");
        assert!(matches!(segment.read(1000, &mut buf), Got::Gone));
        assert_eq!(segment.append(&all[BLOCK + 70..], &held), (2 * BLOCK - 70) as u64);
        assert_eq!(segment.append(b"x", &held), 0, "nothing past the end");
        segment.finish(Ok(()));
        let mut rest = vec![0; 2 * BLOCK];
        let at = 1000 + BLOCK as u64;
        assert!(matches!(segment.read(at, &mut rest), Got::Copied(n) if n == 2 * BLOCK));
        assert!(rest == all[BLOCK..]);
        assert_eq!(held.load(Ordering::SeqCst), 2 * BLOCK as u64);
        segment.let_go(&held);
        segment.let_go(&held);
        assert_eq!(held.load(Ordering::SeqCst), 0, "let go once");
        segment.append(b"x", &held);
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_get_that_ended_early_serves_what_it_brought_then_fails() {
        let segment = Segment::new(0, 100, 100, None);
        segment.append(&pattern(0..40), &AtomicU64::new(0));
        segment.finish(Err(Error::NotFound("k".into())));
        let mut buf = vec![0; 60];
        assert!(matches!(segment.read(20, &mut buf), Got::Copied(20)));
        assert!(matches!(segment.read(40, &mut buf), Got::Failed(Error::NotFound(_))));
        assert!(!segment.covers(40) && segment.covers(39));
    }

    #[test]
    fn a_reader_waits_only_for_its_own_bytes() {
        let segment = std::sync::Arc::new(Segment::new(0, 1 << 30, 0, None));
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut buf = vec![0; 10];
                matches!(segment.read(5, &mut buf), Got::Copied(10)) && buf == pattern(5..15)
            });
            while !segment.awaited() {
                std::thread::yield_now();
            }
            segment.append(&pattern(0..15), &AtomicU64::new(0));
            assert!(reader.join().unwrap());
        });
        assert!(!segment.finished());
    }

    #[test]
    fn the_get_goes_on_while_less_than_a_window_is_ahead_of_the_readers() {
        let segment = Segment::new(0, 1 << 20, 100, None);
        let window = |read: u64| read.max(50);
        assert!(segment.demanded(), "its maker wants 100");
        segment.append(&pattern(0..100), &AtomicU64::new(0));
        assert!(!segment.demanded() && !segment.wanted(window), "a window of 50 past the start is held");
        let mut buf = vec![0; 50];
        segment.read(50, &mut buf);
        assert!(segment.wanted(window), "100 read: as much again wanted");
        segment.append(&pattern(100..200), &AtomicU64::new(0));
        assert!(!segment.wanted(window));
    }

    #[test]
    fn a_lane_fetches_a_window_ahead_of_the_run_it_follows() {
        let run = std::sync::Arc::new(Follow::new(0));
        let lane = Segment::new(1000, 2000, 1000, Some(run.clone()));
        let window = |read: u64| read.max(100);
        assert!(!lane.wanted(window), "the run's readers are 1000 before it");
        run.read_to(600);
        assert!(lane.wanted(window), "600 read: as much again ahead reaches it");
        lane.append(&pattern(1000..1200), &AtomicU64::new(0));
        assert!(!lane.wanted(window));
    }
}
