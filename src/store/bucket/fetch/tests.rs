//! Tests of the fetcher against a fake object source that records, gates, stalls and fails
//! its GETs.

use super::plan::lanes;
use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// A source of object bytes that records its GETs, can hold them at a gate, and can fail.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Range<u64>>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// GETs wait here for a permit each before their first byte, when set.
    gate: Option<Arc<Semaphore>>,
    /// Each piece of a reply takes this long.
    delay: Duration,
    /// The next GETs fail with an I/O error, this many of them.
    failures: AtomicUsize,
    /// Every GET answers that the version was replaced.
    changed: AtomicBool,
    /// Replies stop after this many bytes and then stall, when set.
    stall_after: Option<u64>,
    /// Replies bring this many bytes more than asked, when set.
    surplus: Option<u64>,
}

/// The bytes `range` of version `seed`: byte `i` is `(i + seed) % 251`, so that bytes from
/// another place or version differ.
fn bytes(seed: u64, range: Range<u64>) -> Vec<u8> {
    let cycle: Vec<u8> = (0..251u8).chain(0..251u8).collect();
    let mut out = Vec::with_capacity((range.end - range.start) as usize);
    let mut phase = ((range.start + seed) % 251) as usize;
    while out.len() < out.capacity() {
        let n = (251 - phase).min(out.capacity() - out.len());
        out.extend_from_slice(&cycle[phase..phase + n]);
        phase = 0;
    }
    out
}

/// The bytes of a reply that arrive at once, as a server sends them.
const SENT: u64 = 64 << 10;

/// Counts a reply in flight until dropped.
struct InFlight(Arc<Fake>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    fn gated() -> Arc<Self> {
        Arc::new(Fake { gate: Some(Arc::new(Semaphore::new(0))), ..Default::default() })
    }

    fn open(&self) {
        if let Some(gate) = &self.gate {
            gate.add_permits(1 << 20);
        }
    }

    fn calls(&self) -> Vec<Range<u64>> {
        self.calls.lock().clone()
    }

    /// A reader of version `seed` of object "k", `size` bytes long.
    fn reader(self: &Arc<Self>, seed: u64, size: u64) -> Reader {
        let fake = self.clone();
        let get: Get = Arc::new(move |range: Range<u64>| {
            let fake = fake.clone();
            Box::pin(async move {
                fake.calls.lock().push(range.clone());
                let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                fake.most_in_flight.fetch_max(now, Ordering::SeqCst);
                if let Some(gate) = &fake.gate {
                    gate.acquire().await.expect("open").forget();
                }
                if fake.changed.load(Ordering::SeqCst) {
                    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return Err(Error::Changed("k".into()));
                }
                if fake.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return Err(Error::Io { place: "k".into(), source: io::Error::other("reset") });
                }
                let end = range.end + fake.surplus.unwrap_or(0);
                let stop = fake.stall_after.map_or(end, |n| end.min(range.start + n));
                let starts: Vec<u64> = (range.start..stop).step_by(SENT as usize).collect();
                let (delay, stalls) = (fake.delay, stop < end);
                let pieces = futures_util::stream::iter(starts).then(move |at| async move {
                    tokio::time::sleep(delay).await;
                    Ok(Bytes::from(bytes(seed, at..(at + SENT).min(stop))))
                });
                let stall = futures_util::stream::once(async move {
                    if stalls {
                        std::future::pending::<()>().await;
                    }
                    None
                })
                .filter_map(|x: Option<Result<Bytes>>| async move { x });
                // In flight until the reply is dropped, read to its end or not.
                let guard = InFlight(fake.clone());
                Ok(pieces.chain(stall).map(move |piece| (&guard, piece).1).boxed())
            })
        });
        Reader::new(VersionId { key: "k".into(), e_tag: format!("\"{seed}\"") }, size, get)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn quick() -> Timing {
    Timing { idle: Duration::from_millis(300), stall: Duration::from_millis(300) }
}

/// Reads `range` through `fetcher`, checking the bytes against version `seed`.
fn read(fetcher: &Fetcher, reader: &Reader, seed: u64, range: Range<u64>) -> Result<()> {
    let mut buf = vec![0; (range.end - range.start) as usize];
    let n = fetcher.read(reader, range.clone(), &mut buf)?;
    assert_eq!(n, buf.len());
    assert!(buf == bytes(seed, range.clone()), "the bytes of {range:?} of version {seed}");
    Ok(())
}

/// Reads `range` through `fetcher` 128 KiB at a time, as FUSE asks, checking the bytes.
fn read_through(fetcher: &Fetcher, reader: &Reader, seed: u64, range: Range<u64>) {
    for at in range.step_by(128 << 10) {
        read(fetcher, reader, seed, at..at + (128 << 10)).unwrap();
    }
}

/// Reads version `seed` of `fake`, `size` bytes, as a Zarr reader's pool of `threads` does:
/// each thread takes the next chunk of `chunk` bytes, tells the fetcher it will need it, reads
/// it 128 KiB at a time (as FUSE asks), then rests `rest`.
fn read_in_a_pool(
    fetcher: &Fetcher,
    fake: &Arc<Fake>,
    seed: u64,
    size: u64,
    chunk: u64,
    threads: usize,
    rest: Duration,
) {
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i * chunk >= size {
                        break;
                    }
                    let reader = fake.reader(seed, size);
                    let range = i * chunk..(i + 1) * chunk;
                    fetcher.will_need(&reader, range.clone(), Need::InOrder);
                    read_through(fetcher, &reader, seed, range);
                    std::thread::sleep(rest);
                }
            });
        }
    });
}

/// Waits until `fake` has been asked for `n` GETs; if it never is, opens its gate (so that
/// readers waiting behind it end and the test fails rather than hangs) and fails.
/// `n` ranges of `each` bytes following each other from `start`.
fn even(start: u64, n: u64, each: u64) -> Vec<Range<u64>> {
    (0..n).map(|i| start + i * each..start + (i + 1) * each).collect()
}

/// The ranges asked for, in the order of their first bytes.
fn sorted(mut calls: Vec<Range<u64>>) -> Vec<Range<u64>> {
    calls.sort_by_key(|r| r.start);
    calls
}

fn until_asked(fake: &Fake, n: usize) {
    for _ in 0..1000 {
        if fake.calls.lock().len() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    fake.open();
    panic!("only {:?} asked for", fake.calls());
}

#[test]
fn two_readers_of_one_range_share_one_get() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Fake::gated();
    let (a, b) = (fake.reader(1, 100 << 20), fake.reader(1, 100 << 20));
    std::thread::scope(|s| {
        let first = s.spawn(|| read(&fetcher, &a, 1, 1000..200_000));
        until_asked(&fake, 1);
        let second = s.spawn(|| read(&fetcher, &b, 1, 5000..100_000));
        std::thread::sleep(Duration::from_millis(50));
        fake.open();
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
    });
    assert_eq!(fake.calls(), [1000..200_000], "the second read waited for the first one's GET");
}

#[test]
fn a_range_said_to_be_needed_is_fetched_at_its_first_read_in_pieces_whatever_reads_come() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 16 << 20);
    let chunk = (1 << 20) + 17..(5 << 20) + 3;
    fetcher.will_need(&reader, chunk.clone(), Need::InOrder);
    std::thread::sleep(Duration::from_millis(20));
    assert!(fake.calls().is_empty(), "nothing is fetched before the first read");
    let mut at = chunk.start;
    while at < chunk.end {
        let end = chunk.end.min(at + (128 << 10));
        read(&fetcher, &reader, 1, at..end).unwrap();
        at = end;
    }
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert!(calls.len() as u64 <= PIECES && calls.iter().all(|r| r.end - r.start >= PIECE), "{calls:?}");
    assert_eq!((calls[0].start, calls[calls.len() - 1].end), (chunk.start, chunk.end), "the chunk: {calls:?}");
    assert!(calls.windows(2).all(|w| w[0].end == w[1].start), "each byte once: {calls:?}");
}

#[test]
fn pieces_of_a_read_end_where_bytes_fetched_already_begin() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    // Bytes asked for ahead (not a read: no reader going on in order from them).
    fetcher.prefetch(&reader, (2 << 20)..(3 << 20));
    fetcher.will_need(&reader, 0..8 << 20, Need::InOrder);
    read(&fetcher, &reader, 1, 0..8 << 20).unwrap();
    let calls = sorted(fake.calls());
    assert_eq!(calls[..2], [0..2 << 20, 2 << 20..3 << 20], "a piece up to the bytes fetched: {calls:?}");
    assert!(calls.windows(2).all(|w| w[0].end == w[1].start), "each byte once: {calls:?}");
}

#[test]
fn a_reader_of_the_first_bytes_of_a_long_get_does_not_wait_for_its_end() {
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake { delay: Duration::from_millis(5), ..Default::default() });
    let reader = fake.reader(1, 64 << 20);
    fetcher.will_need(&reader, 0..60 << 20, Need::InOrder);
    let start = std::time::Instant::now();
    read(&fetcher, &reader, 1, 0..SENT).unwrap();
    // 960 pieces of 5 ms make the whole reply (four GETs of 240); the first one alone is due.
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(sorted(fake.calls()), even(0, PIECES, 15 << 20));
}

/// Reads chunk `i` (64 KiB) of version `seed` from a handle of its own, as a Zarr reader does.
fn read_chunk(fetcher: &Fetcher, fake: &Arc<Fake>, seed: u64, size: u64, i: u64) {
    let reader = fake.reader(seed, size);
    let chunk = i * (64 << 10)..(i + 1) * (64 << 10);
    fetcher.will_need(&reader, chunk.clone(), Need::InOrder);
    read(fetcher, &reader, seed, chunk).unwrap();
}

#[test]
fn the_chunks_of_a_shard_read_in_order_cost_two_gets() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    // The rest after the first chunk is one lane.
    let size = 2 * LANE;
    for i in 0..size / (64 << 10) {
        read_chunk(&fetcher, &fake, 1, size, i);
    }
    assert_eq!(fake.calls(), [0..64 << 10, 64 << 10..size], "the first chunk, then the rest of the shard");
    let scattered = Arc::new(Fake::default());
    for i in [5000, 100, 3700, 9000] {
        read_chunk(&fetcher, &scattered, 3, 1 << 30, i);
    }
    let calls = scattered.calls();
    assert_eq!(calls.len(), 4, "chunks out of order: each its own");
    assert!(calls.iter().all(|r| r.end - r.start == 64 << 10), "{calls:?}");
}

#[test]
fn a_thread_pool_reading_neighbouring_chunks_in_any_order_is_in_order() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = 2 * LANE;
    for i in [0, 2, 1, 3, 5, 4, 6, 7] {
        read_chunk(&fetcher, &fake, 1, size, i);
    }
    let calls = fake.calls();
    assert!(calls.len() <= 2, "{calls:?}");
    assert_eq!(calls.last().unwrap().end, size, "the rest of the shard from the first gap: {calls:?}");
}

#[test]
fn a_reader_going_on_in_order_gets_the_rest_in_lanes_and_memory_stays_within_the_budget() {
    let rt = runtime();
    let budget = 8 << 20;
    let fetcher = Fetcher::new(budget, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    // Past its first read, as many bytes as the lanes of [`LANE`] take.
    let size = LANES * LANE + (128 << 10);
    let reader = fake.reader(3, size);
    let mut at = 0;
    while at < size {
        let end = size.min(at + (128 << 10));
        read(&fetcher, &reader, 3, at..end).unwrap();
        assert!(fetcher.held() <= budget as u64 + LANES * SENT, "{} held", fetcher.held());
        at = end;
    }
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert_eq!(calls[0], 0..128 << 10, "the first read: {calls:?}");
    assert_eq!(calls.len() as u64, 1 + LANES, "then the rest in lanes: {calls:?}");
    assert!(calls.windows(2).all(|w| w[0].end == w[1].start) && calls.last().unwrap().end == size, "{calls:?}");
}

#[test]
fn a_get_nobody_reads_on_from_stops_a_window_ahead_and_is_cut() {
    let rt = runtime();
    let fetcher = Fetcher::with_timing(64 << 20, 2, rt.handle().clone(), quick());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 1 << 30);
    read(&fetcher, &reader, 1, 0..4096).unwrap();
    read(&fetcher, &reader, 1, 4096..8192).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let held = fetcher.held();
    assert!(held <= 2 * FIRST_WINDOW, "a window ahead, not the object: {held} {:?}", fake.calls());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fake.in_flight.load(Ordering::SeqCst), 0, "cut after the idle time");
    // Its request is free again: two others go through at once.
    let other = fake.reader(2, 1 << 30);
    read(&fetcher, &other, 2, 100 << 20..(100 << 20) + 10).unwrap();
    read(&fetcher, &reader, 1, 8192..16384).unwrap();
}

#[test]
fn shards_read_in_order_after_a_prefetch_of_the_next_ones_cost_one_get_each() {
    // As the view asks when a reader goes through an array in order: four shards of 32 MiB,
    // the next ones asked for while the first is read, chunk by chunk (1 MiB each) by a pool
    // of four threads, with half of them held in memory at most.
    let rt = runtime();
    let budget = 64 << 20;
    let fetcher = Fetcher::new(budget, 16, rt.handle().clone());
    let fake = Arc::new(Fake { delay: Duration::from_micros(300), ..Default::default() });
    let (shards, size, chunk) = (4u64, 32u64 << 20, 1u64 << 20);
    for seed in 1..shards {
        fetcher.prefetch(&fake.reader(seed, size), 0..size);
    }
    for seed in 0..shards {
        read_in_a_pool(&fetcher, &fake, seed, size, chunk, 4, Duration::ZERO);
        assert!(fetcher.held() <= budget as u64 + 4 * chunk, "{} held", fetcher.held());
    }
    // A prefetched shard: its first lane, then the rest in lanes once its reader goes on.
    // The first shard: the first chunk read, then the rest in lanes, and a GET more when the
    // pool's second chunk read is the one before (a loaded machine runs the threads in any
    // order).
    let lanes_after = |from: u64| ((size - from) / LANE).clamp(1, LANES);
    let calls = fake.calls();
    assert!(
        calls.len() as u64 <= (shards - 1) * (1 + lanes_after(LANE)) + 2 + lanes_after(chunk),
        "a GET per lane of each shard: {calls:?}"
    );
}

#[test]
fn shards_asked_for_ahead_do_not_push_out_the_bytes_a_reader_reads_next() {
    // A reader going through an array in order: the next shard arrived whole before its
    // reader came, the ones after it are asked for and wait for room, and a pool of ten
    // threads reads the first chunk by chunk (1 MiB), slower than the network. The shards
    // asked for later wait for room rather than take the bytes the pool reads next, which
    // would be fetched again. (Shards asked for and never read are cut: not this test's.)
    let rt = runtime();
    // Half of it holds five of the six shards asked for: the sixth waits for room.
    let budget = 80 << 20;
    let patient = Timing { idle: Duration::from_secs(600), ..Timing::default() };
    let fetcher = Fetcher::with_timing(budget, 16, rt.handle().clone(), patient);
    let (size, chunk) = (LANE, 1u64 << 20);
    let fakes: Vec<Arc<Fake>> = (0..6).map(|_| Arc::new(Fake::default())).collect();
    fetcher.prefetch(&fakes[0].reader(0, size), 0..size);
    for _ in 0..1000 {
        if fetcher.held() == size {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fetcher.held(), size, "the next shard arrived whole");
    for seed in 1..6 {
        fetcher.prefetch(&fakes[seed as usize].reader(seed, size), 0..size);
    }
    // Until they fill the half of the memory that bytes nobody reads yet may take.
    for _ in 0..1000 {
        if fetcher.held() >= budget as u64 / 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(fetcher.held() >= budget as u64 / 2, "{} held: no room is wanted", fetcher.held());
    read_in_a_pool(&fetcher, &fakes[0], 0, size, chunk, 10, Duration::from_millis(50));
    assert_eq!(fakes[0].calls(), [0..size], "the shard read: its prefetch alone");
    assert!(fetcher.held() <= budget as u64, "{} held", fetcher.held());
}

#[test]
fn bytes_fetched_ahead_that_nobody_came_for_make_room_once_idle() {
    let rt = runtime();
    let budget = 4 << 20;
    let fetcher = Fetcher::with_timing(budget, 16, rt.handle().clone(), quick());
    let fake = Arc::new(Fake::default());
    // Two shards asked for ahead fill the half of the budget prefetches may take; their
    // reader went elsewhere.
    for seed in 1..=2 {
        fetcher.prefetch(&fake.reader(seed, 1 << 20), 0..1 << 20);
    }
    until_asked(&fake, 2);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(fetcher.held(), 2 << 20);
    let third = fake.reader(3, 1 << 20);
    fetcher.prefetch(&third, 0..1 << 20);
    read(&fetcher, &third, 3, 0..1 << 20).unwrap();
    assert!(fetcher.held() <= budget as u64 / 2, "{} held: the idle ones went", fetcher.held());
    assert_eq!(fake.calls().len(), 3);
}

#[test]
fn a_read_of_bytes_dropped_from_a_running_get_leaves_that_get_to_its_readers() {
    let rt = runtime();
    let fetcher = Fetcher::new(8 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = LANES * LANE + (128 << 10);
    let reader = fake.reader(1, size);
    read_through(&fetcher, &reader, 1, 0..20 << 20);
    assert_eq!(fake.calls().len() as u64, 1 + LANES, "the first read, then lanes");
    // The kernel reads an early page again: its bytes were dropped to make room.
    read(&fetcher, &reader, 1, 128 << 10..256 << 10).unwrap();
    read_through(&fetcher, &reader, 1, 20 << 20..40 << 20);
    let calls = fake.calls();
    assert_eq!(calls.len() as u64, 2 + LANES, "the page again, and the lanes go on: {calls:?}");
    // The page's own GET fetches a first window ahead of its reader too.
    assert!(fetcher.held() <= (8 << 20) + FIRST_WINDOW + LANES * SENT, "{} held", fetcher.held());
}

#[test]
fn a_read_far_behind_its_run_keeps_its_bytes_until_it_read_them() {
    // A pool's slow thread comes to a chunk whose bytes were dropped long ago, the run's
    // other readers far ahead: its GET's bytes are its own to read, not dropped on arrival as
    // bytes the run read past (which cost a GET per retry, then EIO).
    let rt = runtime();
    let fetcher = Fetcher::new(8 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = LANES * LANE + (128 << 10);
    let reader = fake.reader(1, size);
    read_through(&fetcher, &reader, 1, 0..40 << 20);
    let before = fake.calls().len();
    // Chunks 2 MiB apart, some with their hint (a file opened), some not (its hint taken by
    // a first read that found bytes still there, its next reads finding them dropped).
    for round in 0..8u64 {
        let chunk = (round << 21)..(round << 21) + (1 << 20);
        if round % 2 == 0 {
            fetcher.will_need(&reader, chunk.clone(), Need::InOrder);
        }
        read_through(&fetcher, &reader, 1, chunk);
    }
    let calls = fake.calls();
    let behind = &calls[before..];
    assert!(behind.len() <= 8, "a GET per chunk far behind at most: {behind:?}");
    assert!(behind.iter().all(|r| r.end - r.start >= 1 << 20), "each a chunk or more: {behind:?}");
    assert!(behind.iter().all(|r| r.end <= 40 << 20), "none of lanes ahead of the run: {behind:?}");
}

#[test]
fn a_large_range_comes_in_pieces_at_once_and_its_later_reads_cost_nothing() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    fetcher.will_need(&reader, 0..20 << 20, Need::InOrder);
    read(&fetcher, &reader, 1, 0..128 << 10).unwrap();
    read(&fetcher, &reader, 1, (7 << 20)..(9 << 20)).unwrap();
    assert_eq!(sorted(fake.calls()), even(0, PIECES, 5 << 20));
}

#[test]
fn the_rest_of_an_object_is_cut_in_lanes_with_no_bytes_left_over() {
    const M: u64 = 1 << 20;
    let follow = Arc::new(Follow::new(0));
    let cut = |range: Range<u64>| lanes(range, follow.clone()).into_iter().map(|p| p.range).collect::<Vec<_>>();
    // A 128 MiB shard read from its second lane on, its index of 516 bytes at the end: the
    // lanes follow each other, and the bytes left over are shared, a byte apart at most.
    let rest = LANE..128 * M + 516;
    let pieces = cut(rest.clone());
    assert_eq!(pieces.len() as u64, ((rest.end - rest.start) / LANE).min(LANES), "{pieces:?}");
    assert_eq!((pieces[0].start, pieces[pieces.len() - 1].end), (rest.start, rest.end));
    assert!(pieces.windows(2).all(|w| w[0].end == w[1].start), "{pieces:?}");
    let lengths: Vec<u64> = pieces.iter().map(|r| r.end - r.start).collect();
    assert!(lengths.iter().all(|&n| n >= LANE && n <= lengths[0] && n + 1 >= lengths[0]), "{lengths:?}");
    assert_eq!(cut(0..LANES * LANE), even(0, LANES, LANE));
    assert_eq!(cut(0..LANE + LANE / 2), [0..LANE + LANE / 2]);
    assert_eq!(cut(0..5), [0..5]);
    assert_eq!(cut(0..100 * LANES * LANE), even(0, LANES, 100 * LANE));
}

#[test]
fn two_readers_going_on_in_order_far_apart_in_one_object_each_get_lanes() {
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = 1 << 30;
    // Two `cp`s of one object, or two readers of its two halves, taking turns.
    let (first, second) = (fake.reader(1, size), fake.reader(1, size));
    for i in 0..64u64 {
        read(&fetcher, &first, 1, i << 17..(i + 1) << 17).unwrap();
        read(&fetcher, &second, 1, (512 << 20) + (i << 17)..(512 << 20) + ((i + 1) << 17)).unwrap();
    }
    let calls = fake.calls();
    assert!(calls.len() <= 2 * (1 + LANES as usize), "each its first read, then lanes: {calls:?}");
}

#[test]
fn a_reader_of_chunks_here_and_there_is_not_taken_for_one_going_on_in_order() {
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 1 << 30);
    // Chunks of 1 MiB picked at random: the last is near the first, but three reads went
    // elsewhere since, none of them going on from another.
    for at in [0u64, 512, 256, 2] {
        let chunk = (at << 20)..((at + 1) << 20);
        fetcher.will_need(&reader, chunk.clone(), Need::InOrder);
        read(&fetcher, &reader, 1, chunk.start..chunk.start + (128 << 10)).unwrap();
    }
    assert_eq!(fake.calls().len(), 4, "a GET of each chunk, no lanes: {:?}", fake.calls());
}

#[test]
fn a_chunk_larger_than_the_budget_is_fetched_a_window_at_a_time() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 1 << 30);
    fetcher.will_need(&reader, 0..1 << 30, Need::InOrder);
    read(&fetcher, &reader, 1, 0..128 << 10).unwrap();
    assert_eq!(sorted(fake.calls()), even(0, PIECES, 8 << 20), "half the budget, not the whole chunk");
    assert!(fetcher.held() <= 64 << 20);
}

#[test]
fn gets_in_flight_stay_within_max_requests_and_background_ones_leave_room() {
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 4, rt.handle().clone());
    let fake = Fake::gated();
    let readers: Vec<Reader> = (10..14).map(|seed| fake.reader(seed, 1 << 30)).collect();
    for reader in &readers {
        fetcher.prefetch(reader, 0..1 << 20);
    }
    until_asked(&fake, 3);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fake.calls().len(), 3, "background GETs take 3 of the 4 requests");
    let other = fake.reader(2, 1 << 30);
    std::thread::scope(|s| {
        let waiting = s.spawn(|| read(&fetcher, &other, 2, 900 << 20..(900 << 20) + 10));
        until_asked(&fake, 4);
        fake.open();
        waiting.join().unwrap().unwrap();
    });
    for (reader, seed) in readers.iter().zip(10..) {
        read(&fetcher, reader, seed, 0..1 << 20).unwrap();
    }
    assert!(fake.most_in_flight.load(Ordering::SeqCst) <= 4);
    assert_eq!(fake.calls().len(), 5, "4 prefetches and the other read");
}

#[test]
fn a_lane_a_reader_waits_on_does_not_queue_behind_prefetches() {
    let rt = runtime();
    // Four requests, three for GETs nobody waited on when they were made: the prefetches of
    // three shards ahead, held by a slow server, take those three.
    let fetcher = Fetcher::new(256 << 20, 4, rt.handle().clone());
    let ahead = Fake::gated();
    for seed in 1..=3 {
        fetcher.prefetch(&ahead.reader(seed, 1 << 20), 0..1 << 20);
    }
    until_asked(&ahead, 3);
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(9, 64 << 20);
    read(&fetcher, &reader, 9, 0..128 << 10).unwrap();
    // Going on in order: the rest of the object comes in lanes, and the reader reads the third.
    read(&fetcher, &reader, 9, 128 << 10..256 << 10).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| done.send(read(&fetcher, &reader, 9, 32 << 20..(32 << 20) + (128 << 10))).unwrap());
        let got = finished.recv_timeout(Duration::from_secs(5));
        ahead.open();
        assert!(matches!(got, Ok(Ok(()))), "the read of a lane waited for the prefetches: {got:?}");
    });
}

#[test]
fn gets_waiting_for_their_readers_leave_their_requests_to_other_reads() {
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 4, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    // A reader going on in order, who then stops (a `cp` to a slow disk): its lanes wait for
    // it with their connections open.
    let slow = fake.reader(1, 1 << 30);
    for i in 0..4u64 {
        read(&fetcher, &slow, 1, i << 17..(i + 1) << 17).unwrap();
    }
    until_asked(&fake, 1 + LANES as usize);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(fake.in_flight.load(Ordering::SeqCst), LANES as usize, "{:?}", fake.calls());
    let start = std::time::Instant::now();
    read(&fetcher, &fake.reader(2, 1 << 30), 2, 500 << 20..(500 << 20) + 10).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2), "waited {:?} for a request", start.elapsed());
    read(&fetcher, &slow, 1, 4 << 17..8 << 17).unwrap();
}

#[test]
fn memory_stays_within_the_budget_across_objects() {
    let rt = runtime();
    let budget = 4 << 20;
    let fetcher = Fetcher::new(budget, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    for i in 0..50u64 {
        let reader = fake.reader(i, 3 << 20);
        read(&fetcher, &reader, i, 0..128 << 10).unwrap();
        // Beyond the budget: what readers want of GETs still running (16 at most), each a
        // whole object; not every object read so far.
        assert!(fetcher.held() <= budget as u64 + 16 * (3 << 20), "{} held", fetcher.held());
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(fetcher.held() <= budget as u64 + SENT, "{} held once every GET ended", fetcher.held());
}

#[test]
fn versions_never_mix() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let (old, new) = (fake.reader(1, 10 << 20), fake.reader(2, 10 << 20));
    fetcher.will_need(&old, 0..1 << 20, Need::InOrder);
    read(&fetcher, &old, 1, 0..1000).unwrap();
    read(&fetcher, &new, 2, 0..1000).unwrap();
    read(&fetcher, &old, 1, 500..1500).unwrap();
    assert_eq!(fake.calls().len(), 2, "one GET per version");
}

#[test]
fn a_replaced_version_fails_every_reader_waiting() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Fake::gated();
    fake.changed.store(true, Ordering::SeqCst);
    let (a, b) = (fake.reader(1, 10 << 20), fake.reader(1, 10 << 20));
    fetcher.will_need(&a, 0..SENT, Need::InOrder);
    std::thread::scope(|s| {
        let first = s.spawn(|| read(&fetcher, &a, 1, 0..1000));
        until_asked(&fake, 1);
        let second = s.spawn(|| read(&fetcher, &b, 1, 2000..3000));
        std::thread::sleep(Duration::from_millis(50));
        fake.open();
        assert!(matches!(first.join().unwrap(), Err(Error::Changed(_))));
        assert!(matches!(second.join().unwrap(), Err(Error::Changed(_))));
    });
    assert_eq!(fake.calls().len(), 1);
    assert_eq!(fetcher.held(), 0, "nothing of a replaced version is kept");
}

#[test]
fn bytes_of_a_version_fetched_before_it_was_replaced_still_serve_its_readers() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    fetcher.will_need(&reader, 0..4 << 20, Need::InOrder);
    read(&fetcher, &reader, 1, 0..1000).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    fake.changed.store(true, Ordering::SeqCst);
    assert!(matches!(read(&fetcher, &reader, 1, 40 << 20..(40 << 20) + 10), Err(Error::Changed(_))));
    read(&fetcher, &fake.reader(1, 64 << 20), 1, 1000..(4 << 20)).unwrap();
}

#[test]
fn a_failed_fetch_is_asked_again() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake { failures: AtomicUsize::new(1), ..Default::default() });
    let reader = fake.reader(1, 1 << 30);
    read(&fetcher, &reader, 1, 0..1000).unwrap();
    assert_eq!(fake.calls().iter().filter(|r| **r == (0..1000)).count(), 2);
    let failing = Arc::new(Fake { failures: AtomicUsize::new(10), ..Default::default() });
    let reader = failing.reader(2, 1 << 30);
    assert!(matches!(read(&fetcher, &reader, 2, 0..1000), Err(Error::Io { .. })));
    assert_eq!(failing.calls().len(), TRIES, "given up after {TRIES} tries");
}

#[test]
fn a_stalled_get_serves_what_it_brought_and_the_rest_is_asked_again() {
    let rt = runtime();
    let fetcher = Fetcher::with_timing(64 << 20, 16, rt.handle().clone(), quick());
    let stalling = Arc::new(Fake { stall_after: Some(3 * SENT), ..Default::default() });
    let reader = stalling.reader(1, 1 << 30);
    fetcher.will_need(&reader, 0..8 * SENT, Need::InOrder);
    read(&fetcher, &reader, 1, 0..SENT).unwrap();
    let start = std::time::Instant::now();
    read(&fetcher, &reader, 1, 2 * SENT..5 * SENT).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(250), "waited for the stall to be seen");
    let calls = stalling.calls();
    assert_eq!(calls[0], 0..8 * SENT);
    assert!(calls.iter().any(|r| r.start == 3 * SENT), "the rest asked from where the first GET stopped: {calls:?}");
}

#[test]
fn a_read_fetched_for_itself_alone_asks_again_when_a_reply_runs_long_and_never_serves_it() {
    let rt = runtime();
    // No budget: each read its own GET. The first three replies fail on the way, then every
    // reply runs long: none is ever served.
    let fetcher = Fetcher::new(0, 16, rt.handle().clone());
    let flaky = Arc::new(Fake { failures: AtomicUsize::new(3), ..Default::default() });
    read(&fetcher, &flaky.reader(1, 1 << 20), 1, 100..5000).unwrap();
    assert_eq!(flaky.calls().len(), 4, "tried again after each failure");
    let long = Arc::new(Fake { surplus: Some(64), ..Default::default() });
    let mut buf = vec![0; 4900];
    assert!(fetcher.read(&long.reader(1, 1 << 20), 100..5000, &mut buf).is_err());
    assert_eq!(long.calls().len(), TRIES, "given up after {TRIES} tries");
}

#[test]
fn bytes_beyond_the_range_asked_are_never_served() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let long = Arc::new(Fake { surplus: Some(64), ..Default::default() });
    let reader = long.reader(1, 1 << 30);
    // Every reply runs 64 bytes long: what lies within the range is served, the rest never.
    read(&fetcher, &reader, 1, 0..SENT / 2).unwrap();
    let mut buf = vec![0; 10];
    assert!(fetcher.read(&reader, SENT / 2..SENT / 2 + 10, &mut buf).is_ok());
    assert_eq!(buf, bytes(1, SENT / 2..SENT / 2 + 10));
}

#[test]
fn a_small_object_is_fetched_whole_at_its_first_read() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let (index, chunk, other) = (fake.reader(1, 100_000), fake.reader(1, 100_000), fake.reader(1, 100_000));
    read(&fetcher, &index, 1, 99_000..100_000).unwrap();
    fetcher.will_need(&chunk, 10..5000, Need::InOrder);
    read(&fetcher, &chunk, 1, 10..5000).unwrap();
    read(&fetcher, &other, 1, 50_000..60_000).unwrap();
    assert_eq!(fake.calls(), [0..100_000]);
}

#[test]
fn a_range_read_only_of_a_small_object_fetches_that_range_and_nothing_around_it() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    // A commit reads the index of a 6 MiB shard it extends: the store copies its chunks.
    let size = 6 << 20;
    let index = size - 1028..size;
    let reader = fake.reader(1, size);
    fetcher.will_need(&reader, index.clone(), Need::Only);
    read(&fetcher, &reader, 1, index.clone()).unwrap();
    assert_eq!(fake.calls(), std::slice::from_ref(&index));
    // Rewritten whole after all, its chunks come as a read of them asks.
    read(&fetcher, &reader, 1, 1000..5000).unwrap();
    assert_eq!(sorted(fake.calls()), [0..index.start, index]);
}

/// A writer reading the chunks of a small shard it is about to change (`Need::Alone`, as
/// `Namespace::open_to_rewrite` hints), the shard's index known already (as after this mount's
/// own commit, `Shards::remember_index`): the shard comes whole at the first read, in one GET,
/// not one GET per chunk read.
#[test]
fn a_writer_reading_chunks_of_a_small_shard_alone_fetches_the_shard_in_one_get() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = 4 << 20;
    for i in 0..4u64 {
        // Each chunk opened by the writer afresh: a reader of its own, hinted alone.
        let reader = fake.reader(1, size);
        let chunk = i << 20..(i << 20) + (1 << 20) - 2000;
        fetcher.will_need(&reader, chunk.clone(), Need::Alone);
        read(&fetcher, &reader, 1, chunk).unwrap();
    }
    assert_eq!(fake.calls(), [0..size], "one GET of the whole small shard");
}

/// A fetcher whose source's replies all stall after their first MiB, for 5 s: a shard of
/// 4 MiB fetched whole would never bring its index, at its end.
fn stalling_after_a_mib(rt: &tokio::runtime::Runtime) -> (Fetcher, Arc<Fake>) {
    let timing = Timing { stall: Duration::from_secs(5), ..quick() };
    let fetcher = Fetcher::with_timing(64 << 20, 16, rt.handle().clone(), timing);
    (fetcher, Arc::new(Fake { stall_after: Some(1 << 20), ..Default::default() }))
}

#[test]
fn a_first_read_at_the_end_of_a_small_object_waits_only_for_its_own_get() {
    let rt = runtime();
    let (fetcher, fake) = stalling_after_a_mib(&rt);
    let size = 4 << 20;
    let index = size - 1028..size;
    read(&fetcher, &fake.reader(1, size), 1, index.clone()).unwrap();
    let chunk = fake.reader(1, size);
    fetcher.will_need(&chunk, 1000..5000, Need::InOrder);
    read(&fetcher, &chunk, 1, 1000..5000).unwrap();
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert_eq!(calls, [0..index.start, index], "two GETs: the rest came beside the index");
}

#[test]
fn a_small_shard_prefetched_brings_its_index_without_waiting_for_its_chunks() {
    let rt = runtime();
    let (fetcher, fake) = stalling_after_a_mib(&rt);
    // The view asks for the index of a shard ahead first, then for all of it.
    let size = 4 << 20;
    let index = size - 1028..size;
    let reader = fake.reader(1, size);
    fetcher.prefetch(&reader, index.clone());
    fetcher.prefetch(&reader, 0..size);
    read(&fetcher, &fake.reader(1, size), 1, index.clone()).unwrap();
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert_eq!(calls, [0..index.start, index], "two GETs: the index came in one of its own");
}

#[test]
fn a_listing_asking_for_a_small_shards_index_fetches_the_index_alone() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let size = 4 << 20;
    let index = size - 1028..size;
    fetcher.prefetch(&fake.reader(1, size), index.clone());
    read(&fetcher, &fake.reader(1, size), 1, index.clone()).unwrap();
    assert_eq!(fake.calls(), std::slice::from_ref(&index), "a listing's lookups read no chunks");
    // A reader of its chunks after all gets all of them in one GET.
    for i in [3, 0, 40] {
        read_chunk(&fetcher, &fake, 1, size, i);
    }
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert_eq!(calls, [0..index.start, index]);
}

#[test]
fn a_prefetch_is_read_without_a_get_of_its_own() {
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 1 << 30);
    fetcher.prefetch(&reader, (1 << 30) - 1000..1 << 30);
    fetcher.prefetch(&reader, 0..1 << 30);
    until_asked(&fake, 2);
    read(&fetcher, &reader, 1, (1 << 30) - 500..(1 << 30) - 100).unwrap();
    for i in 0..32 {
        read_chunk(&fetcher, &fake, 1, 1 << 30, i);
    }
    let mut calls = fake.calls();
    calls.sort_by_key(|r| r.start);
    assert_eq!(calls, [0..LANE, (1 << 30) - 1000..1 << 30], "the prefetches alone: a lane of the start");
}

#[test]
fn without_a_budget_reads_fetch_just_what_they_ask() {
    let rt = runtime();
    let fetcher = Fetcher::new(0, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 1 << 30);
    fetcher.will_need(&reader, 0..1 << 20, Need::InOrder);
    read(&fetcher, &reader, 1, 0..1000).unwrap();
    read(&fetcher, &reader, 1, 1000..2000).unwrap();
    assert_eq!(fake.calls(), [0..1000, 1000..2000]);
    assert_eq!(fetcher.held(), 0);
}

/// Holds every background request of `fetcher` (`n` of them) with prefetches a gated server
/// never answers, as a `cat`'s lanes streaming at full speed do (twelve lanes, twelve
/// background requests at the default sixteen). Returns the gated fake, to open at the end.
fn hold_background_requests(fetcher: &Fetcher, n: u64) -> Arc<Fake> {
    let busy = Fake::gated();
    let reader = busy.reader(77, 1 << 30);
    for i in 0..n {
        fetcher.prefetch(&reader, i * LANE..(i + 1) * LANE);
    }
    until_asked(&busy, n as usize);
    busy
}

#[test]
fn a_chunk_whose_first_read_was_served_is_not_failed_by_a_later_replacement() {
    // Every piece of a chunk is asked for at its first read, whatever requests other readers'
    // lanes hold: a piece asked for only once the reader reached it would find the version
    // replaced meanwhile, and fail the reader in the middle of its chunk (EIO: its first
    // bytes were served).
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
    let busy = hold_background_requests(&fetcher, 12);
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    fetcher.will_need(&reader, 0..4 << 20, Need::InOrder);
    read(&fetcher, &reader, 1, 0..128 << 10).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let asked = fake.calls();
    // The object is replaced now: its GETs from here on answer Changed.
    fake.changed.store(true, Ordering::SeqCst);
    let later = read(&fetcher, &reader, 1, (3 << 20)..(3 << 20) + (128 << 10));
    busy.open();
    assert!(later.is_ok(), "the chunk's later bytes failed ({later:?}); GETs made at its first read: {asked:?}");
}

/// Another reader's GET of a small object (8 MiB), stalled before its end with 7.5 MiB held:
/// its bytes stay while the source and reader returned are kept.
fn fill_with_a_stalled_get(fetcher: &Fetcher) -> (Arc<Fake>, Reader) {
    let filler = Arc::new(Fake { stall_after: Some(15 << 19), ..Default::default() });
    let other = filler.reader(5, 8 << 20);
    read(fetcher, &other, 5, 0..64 << 10).unwrap();
    for _ in 0..200 {
        if fetcher.held() >= 15 << 19 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (filler, other)
}

#[test]
fn a_chunk_read_at_random_under_a_full_budget_is_not_fetched_again_piece_by_piece() {
    // With the budget full (here a GET that holds 7.5 of 8 MiB, not yet ended), a chunk's
    // pieces come room or not, as one GET of it would, and the later ones do not push out the
    // one its reader is in: pieces cut or dropped would be asked again as lanes over the rest
    // of the object.
    let rt = runtime();
    let timing = Timing { idle: Duration::from_millis(300), stall: Duration::from_secs(600) };
    let fetcher = Fetcher::with_timing(8 << 20, 16, rt.handle().clone(), timing);
    let _filler = fill_with_a_stalled_get(&fetcher);
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    fetcher.will_need(&reader, 0..4 << 20, Need::InOrder);
    // The reader reads its chunk 64 KiB at a time, its first MiB slowly (decoding as it goes).
    for at in (0..4u64 << 20).step_by(64 << 10) {
        read(&fetcher, &reader, 1, at..at + (64 << 10)).unwrap();
        if at < 1 << 20 {
            std::thread::sleep(Duration::from_millis(40));
        }
    }
    let calls = sorted(fake.calls());
    assert!(calls.len() as u64 <= PIECES, "{} GETs for one chunk of 4 MiB: {calls:?}", calls.len());
}

#[test]
fn a_pool_reading_chunks_of_one_large_object_at_random_stays_within_the_budget() {
    // Review 2, finding 1. Four threads read whole chunks of 4 MiB at random from one shard
    // of 1 GiB (one version), as a Zarr reader of a region of a large shard does. Each
    // chunk comes as four Demand pieces; while they arrive, `make_room` may evict segments
    // of the same version only once read through and idle for SLOWER_THREADS (1 s), so
    // every chunk read in the last second stays: held grows with the rate of reading, not
    // the budget, and stays there once reading stops (nothing is evicted until the next
    // fetch). Before the pieces (952b9b1), a chunk's one Demand GET evicted any ended
    // segment read from, and held stayed within the budget and the chunks in flight.
    let rt = runtime();
    let budget = 16u64 << 20;
    let fetcher = Fetcher::new(budget as usize, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let (size, chunk, threads, reads) = (1u64 << 30, 4u64 << 20, 4u64, 48u64);
    let next = AtomicU64::new(0);
    let peak = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= reads {
                        break;
                    }
                    // Picks are far apart (any 16 in a row at least 14 chunks): no read goes on
                    // another's run (within `POOL` chunks of one of the last few, it would).
                    let i = (n * 121) % (size / chunk);
                    let reader = fake.reader(1, size);
                    let range = i * chunk..(i + 1) * chunk;
                    fetcher.will_need(&reader, range.clone(), Need::InOrder);
                    read_through(&fetcher, &reader, 1, range);
                    peak.fetch_max(fetcher.held(), Ordering::SeqCst);
                }
            });
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let (peak, held) = (peak.load(Ordering::SeqCst), fetcher.held());
    let calls = fake.calls().len();
    assert!(peak <= budget + threads * chunk, "{peak} held at most, budget {budget} ({calls} GETs)");
    assert!(held <= budget + chunk, "{held} held once every read ended, budget {budget}");
}

#[test]
fn chunks_read_in_part_do_not_hold_their_later_pieces_beyond_the_budget() {
    // Review 2, finding 2. Readers open chunk files (4 MiB, each of another shard of 64 MiB)
    // and read their first 128 KiB only (`head`, `file`, a reader killed or that decides
    // from a chunk's header). Each first read asks for the chunk's four pieces as Demand: the
    // three later ones come room or not, and, never read from, make no room until nobody came
    // for them for `Timing::idle` (5 s): held grows by 3 MiB a chunk, whatever the budget,
    // and stays. Before the pieces (952b9b1) the chunk was one Demand GET, read from, so
    // evicted by the next read's GET; at 16b3a97 the later pieces were Ahead and waited for
    // room.
    let rt = runtime();
    let budget = 16u64 << 20;
    let fetcher = Fetcher::new(budget as usize, 16, rt.handle().clone());
    let fake = Arc::new(Fake::default());
    let (size, chunk) = (64u64 << 20, 4u64 << 20);
    for seed in 0..32u64 {
        let reader = fake.reader(seed, size);
        fetcher.will_need(&reader, 0..chunk, Need::InOrder);
        read(&fetcher, &reader, seed, 0..128 << 10).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let held = fetcher.held();
    assert!(held <= budget + chunk, "{held} held, budget {budget}, {} GETs", fake.calls().len());
}

#[test]
fn a_chunk_whose_first_read_was_served_is_not_failed_by_a_later_replacement_under_few_requests() {
    // Review 2, finding 3. eb11ed6 makes every piece Demand so that all are asked for at the
    // first read, from the version the first came from. They are asked for at once only when
    // as many requests are free: with `--max-requests 4` and three other reads in flight (at
    // the default 16: a Zarr pool's four threads reading chunks at random ask for sixteen
    // pieces), the pieces come one after another, each waiting for a request until the one
    // before ends. Meanwhile the chunk's first bytes were served; the object is replaced;
    // the next piece's GET answers Changed and the reader fails in the middle of its chunk.
    // Before the pieces (952b9b1) a chunk was one GET: it never failed after its first bytes
    // were served.
    let rt = runtime();
    let fetcher = Fetcher::new(64 << 20, 4, rt.handle().clone());
    // Other readers' reads, held by a slow server: three requests of the four.
    let busy = Fake::gated();
    let others: Vec<Reader> = (0..3).map(|i| busy.reader(7 + i, 1 << 30)).collect();
    let shared = &fetcher;
    std::thread::scope(|s| {
        let waiting: Vec<_> = others
            .iter()
            .zip(7..)
            .map(|(other, seed)| s.spawn(move || read(shared, other, seed, 500 << 20..(500 << 20) + 10)))
            .collect();
        until_asked(&busy, 3);
        // 64 KiB each 10 ms (6.4 MB/s, a slow connection): a piece of 1 MiB takes 160 ms.
        // The pieces queue for the one request in the order their tasks first run, so the
        // piece the first read is in may come last, after the others: a few chunks are tried
        // until one's first read is served before its last piece was asked for.
        let (mut fake, mut reader, mut asked, mut seed) = (Arc::new(Fake::default()), None, Vec::new(), 0);
        for attempt in 20..26 {
            seed = attempt;
            fake = Arc::new(Fake { delay: Duration::from_millis(10), ..Default::default() });
            let chunk = fake.reader(seed, 64 << 20);
            fetcher.will_need(&chunk, 0..4 << 20, Need::InOrder);
            read(&fetcher, &chunk, seed, 0..128 << 10).unwrap();
            asked = fake.calls();
            reader = Some(chunk);
            if asked.len() < 4 {
                break;
            }
        }
        let reader = reader.unwrap();
        // The object is replaced now: its GETs from here on answer Changed.
        fake.changed.store(true, Ordering::SeqCst);
        let mut later = Ok(());
        for at in (128u64 << 10..4 << 20).step_by(128 << 10) {
            later = read(&fetcher, &reader, seed, at..at + (128 << 10));
            if later.is_err() {
                break;
            }
        }
        busy.open();
        for other in waiting {
            other.join().unwrap().unwrap();
        }
        assert!(later.is_ok(), "the chunk's later bytes failed ({later:?}); GETs made at its first read: {asked:?}");
    });
}

#[test]
fn review3_a_slower_reader_within_the_bytes_kept_behind_is_not_starved_by_the_last_pass() {
    // Review 3. A reader goes on in order (no hint: a checked chunk, a file read whole) to
    // 16 MiB; a slower one of its run reads 15..16 MiB, within the bytes kept behind the
    // run (2 MiB at a budget of 8). Another reader's GET holds most of the budget, not yet
    // ended. The last pass of `make_room` drops the bytes behind the run's frontier with no
    // margin: the slower reader's lane (it follows the run, whose frontier is past it) loses
    // each piece as the next arrives, so a 128 KiB read across two pieces finds them Gone,
    // and each retry is one more GET: 17 GETs (64 KiB ones, and 3 MiB ones dropped unread) for
    // this 1 MiB at e29910f; 1 GET at its parent. (With TRIES Gones in a row, EIO.)
    let rt = runtime();
    let timing = Timing { idle: Duration::from_secs(600), stall: Duration::from_secs(600) };
    let fetcher = Fetcher::with_timing(8 << 20, 16, rt.handle().clone(), timing);
    let fake = Arc::new(Fake::default());
    let reader = fake.reader(1, 64 << 20);
    read_through(&fetcher, &reader, 1, 0..16 << 20);
    std::thread::sleep(Duration::from_millis(200));
    let _filler = fill_with_a_stalled_get(&fetcher);
    std::thread::sleep(Duration::from_millis(300));
    let before = fake.calls().len();
    let slower = fake.reader(1, 64 << 20);
    let mut failed = None;
    for at in (15u64 << 20..16 << 20).step_by(128 << 10) {
        if let Err(e) = read(&fetcher, &slower, 1, at..at + (128 << 10)) {
            failed = Some((at, e));
            break;
        }
    }
    let calls = fake.calls()[before..].to_vec();
    assert!(failed.is_none(), "the slower reader failed: {failed:?}; GETs: {}", calls.len());
    assert!(calls.len() <= 2, "{} GETs for 1 MiB kept behind the run: {calls:?}", calls.len());
}

#[test]
fn a_chunk_read_in_pieces_leaves_a_request_to_another_reader() {
    // Review 2, finding 4. The pieces of a chunk are Demand since eb11ed6: they take no
    // background permit, so one first read takes PIECES requests at once, all of
    // `--max-requests 4` (at the default 16, four readers' chunks do: a Zarr pool's four
    // threads reading chunks at random). While the server is slow to answer them, a read of
    // anything else (a shard's index, another file) queues behind every piece, on a request
    // semaphore that serves in order: it waits for the whole chunk. Before the pieces
    // (952b9b1) a chunk was one GET and took one request; the docs promise that "a read of
    // something else gets through".
    let rt = runtime();
    let fetcher = Fetcher::new(256 << 20, 4, rt.handle().clone());
    let slow = Fake::gated();
    let chunk = slow.reader(1, 64 << 20);
    fetcher.will_need(&chunk, 0..4 << 20, Need::InOrder);
    let fake = Arc::new(Fake::default());
    let other = fake.reader(2, 1 << 30);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let first = s.spawn(|| read(&fetcher, &chunk, 1, 0..128 << 10));
        until_asked(&slow, 1);
        std::thread::sleep(Duration::from_millis(100));
        let asked = slow.calls();
        s.spawn(|| done.send(read(&fetcher, &other, 2, 500 << 20..(500 << 20) + 10)).unwrap());
        let got = finished.recv_timeout(Duration::from_secs(2));
        slow.open();
        first.join().unwrap().unwrap();
        assert!(matches!(got, Ok(Ok(()))), "another read waited for a chunk's pieces {asked:?}: {got:?}");
    });
}

#[test]
fn segments_are_ordered_by_times_read_once_each_though_readers_move_them_meanwhile() {
    // Room is made going through the segments least recently read first, by a time their
    // readers move on while the segments are ordered. Read at each comparison, the times gave no
    // order, and the sort panicked in the task fetching bytes a reader waited on (a mount of a
    // local database reading values ahead, one run in three). Here each look at a key finds
    // it later than the last, as a segment read at every look would be.
    let looks = AtomicU64::new(0);
    let mut segments: Vec<u64> = (0..40).collect();
    oldest_first(&mut segments, |_| looks.fetch_add(1, Ordering::SeqCst));
    assert_eq!(looks.load(Ordering::SeqCst), 40, "each time read once");
    assert_eq!(segments, (0..40).collect::<Vec<_>>(), "in the order their times were read");
}
