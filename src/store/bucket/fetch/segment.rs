//! One GET of a byte range of one object version, streamed: its bytes arrive in order, each
//! reader waits only for the bytes it wants, and the GET fetches only so far ahead of what its
//! readers have read before it waits for them (the server's connection stays open meanwhile, and
//! TCP holds the rest back).
//!
//! A segment holds the pieces of the reply as they came (no copy); pieces its readers have passed
//! can be dropped to make room ([`Segment::drop_read`]), and a reader of a dropped byte is told
//! so, to fetch it again. A GET that ends early (a stall, a reset, a short body, or cut for lack of
//! readers) leaves the bytes it brought: they are the right bytes of the right version, and a
//! reader of bytes beyond them asks again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::store::Error;

/// How long after the last read of a segment read to its end the slower threads of a pool may
/// still be reading the chunks before the last one: the furthest read is no one's but the
/// fastest thread's.
const SLOWER_THREADS: Duration = Duration::from_secs(1);

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
    /// The first byte held: pieces before it were dropped.
    base: u64,
    /// The pieces of the reply from `base` on, in order, each with its first byte's offset.
    pieces: VecDeque<(u64, Bytes)>,
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
        self.pieces.back().map_or(self.base, |(at, piece)| at + piece.len() as u64)
    }

    /// Copies `[at, to)` (all arrived and held) into `buf`.
    fn copy(&self, at: u64, to: u64, buf: &mut [u8]) {
        let mut i = self.pieces.partition_point(|(start, piece)| start + piece.len() as u64 <= at);
        let mut at = at;
        let mut out = 0;
        while at < to {
            let (start, piece) = &self.pieces[i];
            let within = (at - start) as usize;
            let n = ((to - at) as usize).min(piece.len() - within);
            buf[out..out + n].copy_from_slice(&piece[within..within + n]);
            out += n;
            at += n as u64;
            i += 1;
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

    /// The end of the furthest read of the run.
    pub fn frontier(&self) -> u64 {
        self.frontier.load(Ordering::SeqCst)
    }

    /// Takes note of a read of the run up to `end`.
    pub fn read_to(&self, end: u64) {
        self.frontier.fetch_max(end, Ordering::SeqCst);
        *self.last_read.lock() = Instant::now();
    }
}

/// The segments fetched at once for one read's bytes (the pieces of a chunk). To make room for
/// its own later pieces, a piece its reader is in stays until read through; for anybody else's
/// bytes, they all go once any of them was read from, as one GET of the chunk would (a reader who
/// read a chunk's first bytes only, `head`, leaves the later pieces unread), and when it last read
/// is when each of them was last read (the least recently read go first).
#[derive(Debug, Default)]
pub struct Group {
    last_read: Mutex<Option<Instant>>,
}

/// One streamed GET of `start..end` of one version.
#[derive(Debug)]
pub struct Segment {
    pub start: u64,
    /// The run it is fetched ahead of, if any: it fetches a window ahead of that run's readers
    /// rather than of its own.
    follows: Option<Arc<Follow>>,
    /// The read's pieces it is one of, if any.
    group: Option<Arc<Group>>,
    data: Mutex<Data>,
    arrived: Condvar,
    /// Woken when readers read on or wait, so that a GET waiting for them goes on.
    pub(super) read_on: tokio::sync::Notify,
}

impl Segment {
    /// A segment for `start..end` whose maker wants the bytes up to `wanted_end` at least, ahead
    /// of the readers of the run `follows`, if given.
    pub fn new(start: u64, end: u64, wanted_end: u64, follows: Option<Arc<Follow>>) -> Self {
        let data = Data {
            end,
            base: start,
            pieces: VecDeque::new(),
            wanted_end,
            frontier: start,
            outcome: None,
            waiting: 0,
            last_read: Instant::now(),
            counted: true,
            unread: true,
        };
        let (arrived, read_on) = (Condvar::new(), tokio::sync::Notify::new());
        Segment { start, follows, group: None, data: Mutex::new(data), arrived, read_on }
    }

    /// The segment as one of the pieces of `group`.
    pub fn in_group(self, group: Option<Arc<Group>>) -> Self {
        Segment { group, ..self }
    }

    /// True when `self` and `other` are pieces of one read.
    pub fn same_group(&self, other: &Segment) -> bool {
        matches!((&self.group, &other.group), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
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
                if let Some(group) = &self.group {
                    *group.last_read.lock() = Some(Instant::now());
                }
                self.read_on.notify_one();
                return Got::Copied((to - at) as usize);
            }
            if let Some(outcome) = &data.outcome {
                // Ended before `to` (its end is where it got to): why.
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

    /// True once a reader read from it (or from a piece of its group); with `through`, only once
    /// its readers read up to the last byte it holds (bytes past them are what they read next) and
    /// then [`SLOWER_THREADS`] went by. Also true when nobody read from it (or from the run it
    /// follows) for `idle`: fetched ahead for a reader who went elsewhere.
    pub fn spent(&self, through: bool, idle: Duration) -> bool {
        let group_read = self.group.as_ref().is_some_and(|group| group.last_read.lock().is_some());
        let read = {
            let data = self.data.lock();
            let read_through = data.frontier >= data.filled() && data.last_read.elapsed() >= SLOWER_THREADS;
            (!data.unread || group_read) && (!through || read_through)
        };
        read || self.last_read().elapsed() >= idle
    }

    /// When a reader last read from it, or from the run it follows, or from its group.
    pub fn last_read(&self) -> Instant {
        let own = self.data.lock().last_read;
        let own = self.follows.as_ref().map_or(own, |run| own.max(*run.last_read.lock()));
        self.group.as_ref().and_then(|group| *group.last_read.lock()).map_or(own, |group| own.max(group))
    }

    /// Takes `piece`, the next bytes the GET brought, up to the end asked for, counting them in
    /// `held` unless let go: how many it took (fewer only from a faulty reply, which ran long).
    pub fn append(&self, piece: Bytes, held: &AtomicU64) -> u64 {
        let mut data = self.data.lock();
        let at = data.filled();
        let room = (data.end - at).min(piece.len() as u64);
        if room > 0 {
            data.pieces.push_back((at, piece.slice(..room as usize)));
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

    /// Drops the pieces the readers (of the run it follows, for a lane) have read past by more
    /// than `margin` (the slower threads of a pool read a little behind the others), and stops
    /// counting them in `held`.
    pub fn drop_read(&self, margin: u64, held: &AtomicU64) {
        let mut data = self.data.lock();
        let frontier = self.follows.as_ref().map_or(data.frontier, |run| run.frontier());
        let frontier = frontier.max(data.frontier);
        let mut freed = 0;
        while let Some(end) = data.pieces.front().map(|(start, piece)| start + piece.len() as u64) {
            if end + margin > frontier {
                break;
            }
            freed += end - data.base;
            data.pieces.pop_front();
            data.base = end;
        }
        if data.counted {
            held.fetch_sub(freed, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(range: std::ops::Range<u64>) -> Bytes {
        range.map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
    }

    #[test]
    fn bytes_are_read_as_they_arrive_and_dropped_once_read_past() {
        let held = AtomicU64::new(0);
        let segment = Segment::new(1000, 4000, 1000, None);
        assert_eq!(segment.append(pattern(1000..2000), &held), 1000);
        assert_eq!(segment.append(pattern(2000..2070), &held), 70);
        let mut buf = vec![0; 100];
        assert!(matches!(segment.read(1950, &mut buf), Got::Copied(100)));
        assert_eq!(buf, pattern(1950..2050), "across two pieces");
        segment.drop_read(1000, &held);
        assert_eq!(held.load(Ordering::SeqCst), 1070, "read past, but within the margin");
        segment.drop_read(0, &held);
        assert_eq!(held.load(Ordering::SeqCst), 70, "the first piece was read past");
        assert!(matches!(segment.read(1000, &mut buf), Got::Gone));
        assert_eq!(segment.append(pattern(2070..4000), &held), 1930);
        assert_eq!(segment.append(pattern(4000..4001), &held), 0, "nothing past the end");
        segment.finish(Ok(()));
        let mut rest = vec![0; 2000];
        assert!(matches!(segment.read(2000, &mut rest), Got::Copied(2000)));
        assert_eq!(rest, pattern(2000..4000));
        assert_eq!(held.load(Ordering::SeqCst), 2000);
        segment.let_go(&held);
        segment.let_go(&held);
        assert_eq!(held.load(Ordering::SeqCst), 0, "let go once");
    }

    #[test]
    fn a_get_that_ended_early_serves_what_it_brought_then_fails() {
        let segment = Segment::new(0, 100, 100, None);
        segment.append(pattern(0..40), &AtomicU64::new(0));
        segment.finish(Err(Error::NotFound("k".into())));
        let mut buf = vec![0; 60];
        assert!(matches!(segment.read(20, &mut buf), Got::Copied(20)));
        assert!(matches!(segment.read(40, &mut buf), Got::Failed(Error::NotFound(_))));
        assert!(!segment.covers(40) && segment.covers(39));
    }

    #[test]
    fn a_reader_waits_only_for_its_own_bytes() {
        let segment = Arc::new(Segment::new(0, 1 << 30, 0, None));
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut buf = vec![0; 10];
                matches!(segment.read(5, &mut buf), Got::Copied(10)) && buf == pattern(5..15)
            });
            while !segment.awaited() {
                std::thread::yield_now();
            }
            segment.append(pattern(0..15), &AtomicU64::new(0));
            assert!(reader.join().unwrap());
        });
        assert!(!segment.finished());
    }

    #[test]
    fn the_get_goes_on_while_less_than_a_window_is_ahead_of_the_readers() {
        let segment = Segment::new(0, 1 << 20, 100, None);
        let window = |read: u64| read.max(50);
        assert!(segment.demanded(), "its maker wants 100");
        segment.append(pattern(0..100), &AtomicU64::new(0));
        assert!(!segment.demanded() && !segment.wanted(window), "a window of 50 past the start is held");
        let mut buf = vec![0; 50];
        segment.read(50, &mut buf);
        assert!(segment.wanted(window), "100 read: as much again wanted");
        segment.append(pattern(100..200), &AtomicU64::new(0));
        assert!(!segment.wanted(window));
    }

    #[test]
    fn a_lane_fetches_a_window_ahead_of_the_run_it_follows() {
        let run = Arc::new(Follow::new(0));
        let lane = Segment::new(1000, 2000, 1000, Some(run.clone()));
        let window = |read: u64| read.max(100);
        assert!(!lane.wanted(window), "the run's readers are 1000 before it");
        run.read_to(600);
        assert!(lane.wanted(window), "600 read: as much again ahead reaches it");
        lane.append(pattern(1000..1200), &AtomicU64::new(0));
        assert!(!lane.wanted(window));
    }
}
