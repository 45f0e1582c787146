//! Fetching object bytes: GETs of one object version made on the store's runtime, streamed to the
//! readers that wait for them, shared by every reader that wants them, and kept in memory for a
//! while.
//!
//! On an object store each request costs a round trip (10-50 ms) and a connection carries about
//! 90 MB/s, so a reader should cost few requests, have several in flight when it reads much, and
//! never wait for more bytes than it asked for:
//! - a [`segment`] is one GET of a byte range of one version (object and ETag), streamed: its bytes
//!   arrive in order and a reader waits only for those it wants, so a GET can run long without
//!   making anybody wait for its end; bytes are kept by version, so another version's bytes are
//!   never served, and two readers of one range cost one GET;
//! - what a read fetches: an object of at most [`SMALL_OBJECT`] whole at its first read (a shard of
//!   small chunks: index and chunks in one GET), unless it reads a range [`Need::Only`] (a commit
//!   that reads the index of a shard it extends: the store copies the rest); the whole chunk of a
//!   chunk file, whose range the view tells ([`Fetcher::will_need`]), a few GETs at once when it
//!   is large and requests are free (a quarter of them stay free for other reads); once readers
//!   go on in order (reads following each other, or the next chunks of a shard, a thread pool's few at
//!   once in any order) the rest of the object as [`LANES`] GETs at once; a read further behind
//!   them than bytes are kept for them (a pool's slow thread) a GET of its own, a window ahead of
//!   it alone;
//! - a segment fetches ahead of its readers (of the run, for a lane nobody reads from yet) by as
//!   much again as they have read (at least 1 MiB, at most half the budget), then waits for
//!   them: the connection stays open and TCP holds the rest back, so a reader going on costs no
//!   new request, and one that stops costs at most a window of bytes; a segment nobody read from
//!   for [`Timing::idle`] is cut there;
//! - [`Fetcher::prefetch`] starts a segment nobody waits on yet (the index and first bytes of the
//!   next shards of an array read in order, as the view sees it; a small shard's index in a GET
//!   of its own, as at a first read of it, and nothing more for a listing, which wants indexes);
//! - memory: the bytes held are kept within the budget (`--read-ahead-size`; half of it for bytes
//!   nobody asked for yet) by dropping bytes readers have passed, then segments ended and read
//!   from (read to their end, to make room for bytes fetched ahead), least recently read first;
//!   bytes fetched ahead and not read yet stay, until nobody
//!   came for them for [`Timing::idle`] (a reader who went elsewhere); a segment a reader waits
//!   on always gets its bytes, others wait for room;
//! - GETs in flight are bounded (`--max-requests`); GETs nobody waits on yet (lanes ahead,
//!   prefetches) take at most three quarters of them, so that a read of something else gets
//!   through while readers going on in order hold their lanes open; one a reader came to wait
//!   for before it got its request needs only a request, not to queue behind the prefetches;
//! - a GET that stalls for [`Timing::stall`] or ends early leaves the bytes it brought (the right
//!   bytes of the right version) and fails; a reader of the bytes beyond asks again, a few times.
//!
//! A FUSE thread waits only for the bytes it asked for.

mod plan;
pub mod segment;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, Either};
use futures_util::stream::BoxStream;
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::plan::{Plan, not_fetched_from, planned, small_object};
use self::segment::{Follow, Got, Segment};
use super::TRIES;
use crate::store::{Error, Need, Result};

/// An object at most this large is fetched whole at its first read: one GET for a shard of small
/// chunks and its index, which a Zarr reader reads many chunks of at once, in no particular order.
pub const SMALL_OBJECT: u64 = 8 << 20;
/// A small object's first read at its end comes in a GET of its own when at least this many
/// bytes come before it: fewer come in about a round trip anyway (1 MiB at 20 MB/s is 50 ms).
const TAIL_FIRST: u64 = 1 << 20;
/// The least a segment fetches ahead of its readers.
const FIRST_WINDOW: u64 = 1 << 20;
/// A reader going on in order gets the rest of the object as this many GETs at once, each of at
/// least [`LANE`] bytes; a prefetch gets the first lane. A connection carries about 90 MB/s on
/// S3, less at a long round trip: throughput comes from several at once (boto3 has ten). Where
/// each connection carries 20 MB/s (docs/benchmarks.md), eight lanes of 16 MiB read `big` 2.5-3x
/// faster than four of 32 MiB, for more than twice the requests; ten of 12 MiB made `cat` as
/// fast as boto3 for a while, then 1.17-1.30x its time; twelve of 8 MiB, with a first chunk in
/// [`PIECES`], 1.00-1.06x (docs/benchmarks-history.md), the twelve within the three quarters of
/// the default `--max-requests` that GETs ahead may take.
const LANES: u64 = 12;
const LANE: u64 = 8 << 20;
/// A read that goes on no run (a first read, one at random) gets its bytes as this many GETs at
/// once, each of at least [`PIECE`] bytes (fewer bytes come in about a round trip anyway).
const PIECES: u64 = 4;
const PIECE: u64 = 1 << 20;
/// The largest window, whatever the budget.
const LARGEST_WINDOW: u64 = 256 << 20;
/// A read this close to where the last ones ended, before or after, goes on in order: readers
/// with several reads in flight (the kernel's own read-ahead) arrive out of order.
const NEAR: u64 = 256 << 10;
/// Ranges this many of their own lengths apart still go on in order: a Zarr reader's thread pool
/// reads a few neighbouring chunks at once, arriving in any order.
const POOL: u64 = 8;
/// Bytes read past are kept this long behind the furthest read of a segment (a quarter of the
/// budget at most), for the slower threads of a pool reading chunks a few at once: zarr-python
/// reads ten at once, 40 MiB of 4 MiB chunks.
const BEHIND: u64 = 64 << 20;
/// Readers going on in order in one object, far apart, followed at once.
const RUNS: usize = 4;
/// How many versions' runs and segments are remembered.
const VERSIONS: usize = 4096;

/// A stream of the bytes of one GET, in order.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;
/// How to GET a range of one version: the reply's stream, once its headers were checked for the
/// version and range (see `requests`).
pub type Get = Arc<dyn Fn(Range<u64>) -> BoxFuture<'static, Result<ByteStream>> + Send + Sync>;

/// One version of one object.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct VersionId {
    pub key: String,
    pub e_tag: String,
}

/// One open handle's reading of an object version.
pub struct Reader {
    version: Arc<VersionId>,
    size: u64,
    get: Get,
    /// The range the handle said it will read, and what it reads next, until its first read.
    hinted: Mutex<Option<(Range<u64>, Need)>>,
    /// The range hinted last, kept after its first read: bytes of it dropped before they were
    /// read are fetched again as the rest of it.
    chunk: Mutex<Option<Range<u64>>>,
}

impl Reader {
    /// A reader of `version`, `size` bytes long, whose ranges `get` fetches.
    pub fn new(version: VersionId, size: u64, get: Get) -> Self {
        Reader { version: Arc::new(version), size, get, hinted: Mutex::new(None), chunk: Mutex::new(None) }
    }

    /// The ETag of the version read.
    pub fn e_tag(&self) -> &str {
        &self.version.e_tag
    }

    /// The range hinted, when `wanted` is the first read since the hint and inside it.
    fn take_hint(&self, wanted: &Range<u64>) -> Option<(Range<u64>, Need)> {
        let (hinted, need) = self.hinted.lock().take()?;
        (hinted.start <= wanted.start && wanted.end <= hinted.end).then_some((hinted, need))
    }

    /// The rest of the range hinted from `at`, when `at` is inside it.
    fn rest_of_chunk(&self, at: u64) -> Option<Range<u64>> {
        self.chunk.lock().as_ref().filter(|chunk| chunk.contains(&at)).map(|chunk| at..chunk.end)
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Reader").field("version", &self.version).field("size", &self.size).finish_non_exhaustive()
    }
}

/// Where some readers of one version have got to, reading in order: Zarr readers read the chunks
/// of a shard in order, each from a handle of its own (a read-only mount opens no handle at all),
/// a few at once from a thread pool.
#[derive(Debug)]
struct Run {
    /// Where the ranges read in order begin and end.
    span: Range<u64>,
    /// How far its readers have got, for the lanes fetched ahead of them.
    follow: Arc<Follow>,
    /// Whether a read went on from its first: until then it is one read, perhaps at random.
    went_on: bool,
}

impl Run {
    /// True when a first read of `hinted` (a chunk's range, or a read's own) goes on from the
    /// ranges of this run.
    fn goes_on(&self, hinted: &Range<u64>) -> bool {
        let slack = POOL * (hinted.end - hinted.start) + NEAR;
        hinted.start.saturating_add(slack) >= self.span.start && hinted.start <= self.span.end.saturating_add(slack)
    }
}

/// What is known of one version: its segments, by first byte, and its readers' runs, the one
/// that went on last at the end: [`RUNS`] at most, so that readers far apart in one object (two
/// `cp`s of it, a pool's workers each given a part) each go on in order.
#[derive(Debug)]
struct Version {
    segments: BTreeMap<u64, Arc<Segment>>,
    runs: Vec<Run>,
}

impl Version {
    /// Takes note of the first read of `hinted`: the run it goes on (its span the start of the
    /// ranges read, and where its readers are), the one it is nearest the end of when several;
    /// else a new run starts there. Of the runs no read went on from yet, only the last one
    /// made stays beside it (a second reader's first read comes before the first reader's
    /// second; reads here and there are not taken for readers going on in order, as the more
    /// such runs were kept, the likelier); the one that went on longest ago goes when there
    /// are [`RUNS`].
    fn advance(&mut self, hinted: &Range<u64>) -> Option<(u64, Arc<Follow>)> {
        let nearest = self
            .runs
            .iter()
            .enumerate()
            .filter(|(_, run)| run.goes_on(hinted))
            .min_by_key(|(_, run)| run.span.end.abs_diff(hinted.start))
            .map(|(at, _)| at);
        let Some(on) = nearest else {
            let last_unsure = self.runs.iter().rposition(|run| !run.went_on);
            let mut at = 0;
            self.runs.retain(|run| {
                at += 1;
                run.went_on || Some(at - 1) == last_unsure
            });
            if self.runs.len() >= RUNS {
                self.runs.remove(0);
            }
            let follow = Arc::new(Follow::new(hinted.start));
            self.runs.push(Run { span: hinted.clone(), follow, went_on: false });
            return None;
        };
        let mut run = self.runs.remove(on);
        run.span = run.span.start.min(hinted.start)..run.span.end.max(hinted.end);
        run.went_on = true;
        let went_on = (run.span.start, run.follow.clone());
        self.runs.push(run);
        Some(went_on)
    }
}

/// How long GETs may wait, settable for tests.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A segment nobody read from for this long, with nothing more wanted of it, is cut there.
    pub idle: Duration,
    /// A GET that brings nothing for this long fails (a stalled connection).
    pub stall: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing { idle: Duration::from_secs(5), stall: Duration::from_secs(3) }
    }
}

/// Who a segment is fetched for, which decides what it may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A reader waits for its first bytes: the bytes its maker wants come, room or not.
    Demand,
    /// Ahead of a reader going on in order (a lane), or a small object's rest beside its index: as
    /// there is room in the budget, with at most three quarters of the requests until a reader
    /// waits.
    Ahead,
    /// Asked for before any reader came (the view's next shards): within half the budget, and
    /// with at most three quarters of the requests.
    Background,
}

#[derive(Debug)]
struct Inner {
    versions: Mutex<lru::LruCache<Arc<VersionId>, Version>>,
    /// Bytes held by every segment.
    held: AtomicU64,
    budget: u64,
    /// The most a segment fetches ahead of its readers.
    largest_window: u64,
    /// Every GET holds one of these while it runs.
    requests: Arc<Semaphore>,
    /// How many there are.
    max_requests: usize,
    /// GETs nobody waited on when they were made (lanes ahead, prefetches) hold one of these too.
    background: Arc<Semaphore>,
    timing: Timing,
}

impl Inner {
    /// How far behind the furthest read bytes read past are kept (see [`BEHIND`]).
    fn kept_behind(&self) -> u64 {
        BEHIND.min(self.budget / 4)
    }

    /// How far a segment fetches ahead of readers who read `read` bytes from it.
    fn window(&self, read: u64) -> u64 {
        read.clamp(FIRST_WINDOW.min(self.largest_window), self.largest_window)
    }

    /// Makes room for `wanted` more bytes of `keep` within the budget (half of it for a background
    /// fetch), going through the segments least recently read first: an ended one that nobody
    /// waits on goes whole once read from (for bytes that no reader waits on or asked for, only
    /// once read to its end: bytes fetched ahead may not push out what readers are about to read;
    /// nor may a read's later pieces push out the piece it is in, of `keep`'s group), or once
    /// nobody came for it for [`Timing::idle`]; of others (`keep` too) the pieces their readers (a
    /// lane's: its run's) have passed by more than [`BEHIND`].
    /// Bytes fetched ahead and not read yet stay while readers may come: they are what readers
    /// read next. True when there is room.
    fn make_room(&self, keep: &Arc<Segment>, wanted: u64, kind: Kind) -> bool {
        // Bytes nobody reads yet take half the budget at most: the other half is the readers'.
        let budget = if kind == Kind::Background { self.budget / 2 } else { self.budget };
        if self.held.load(Ordering::SeqCst) + wanted <= budget {
            return true;
        }
        // A sixteenth more than needed goes, so that the pieces that follow fit without a look
        // through every segment each.
        let fits = || self.held.load(Ordering::SeqCst) + wanted + budget / 16 <= budget;
        let for_a_reader = keep.awaited() || (kind == Kind::Demand && keep.demanded());
        let mut versions = self.versions.lock();
        let mut all: Vec<(Arc<VersionId>, Arc<Segment>)> = versions
            .iter()
            .flat_map(|(v, version)| version.segments.values().map(move |s| (v.clone(), s.clone())))
            .collect();
        oldest_first(&mut all, |(_, s)| s.last_read());
        for (version, segment) in all {
            if fits() {
                break;
            }
            if !Arc::ptr_eq(&segment, keep)
                && segment.finished()
                && !segment.awaited()
                && segment.spent(!for_a_reader || segment.same_group(keep), self.timing.idle)
            {
                if let Some(known) = versions.peek_mut(&version) {
                    // Its key is where it began, or where it held bytes from when a segment
                    // took its place (see `start`).
                    known.segments.retain(|_, s| !Arc::ptr_eq(s, &segment));
                    segment.let_go(&self.held);
                }
            } else {
                segment.drop_read(self.kept_behind(), &self.held);
            }
        }
        self.held.load(Ordering::SeqCst) + wanted <= budget
    }

    /// Stops counting the bytes of a version no longer remembered.
    fn release(&self, gone: Version) {
        for segment in gone.segments.values() {
            segment.let_go(&self.held);
        }
    }

    /// Runs the GET of `segment` of `version` to its end, or until nobody wants more of it.
    async fn run(
        self: Arc<Self>,
        version: Arc<VersionId>,
        segment: Arc<Segment>,
        get: Get,
        kind: Kind,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let outcome = self.stream(&version, &segment, get, kind, permit).await;
        // A version replaced on the server fails this and every later GET of it; the bytes of it
        // fetched before stay right for readers of that version, until they are evicted.
        if let Err(e) = &outcome {
            log::debug!("fetching bytes {}.. of {}: {e}", segment.start, version.key);
        }
        segment.finish(outcome);
    }

    /// The GET of `segment` of the object at `key`, run until it ends or nobody wants more; its
    /// request `taken` already, if given.
    async fn stream(
        &self,
        version: &VersionId,
        segment: &Arc<Segment>,
        get: Get,
        kind: Kind,
        taken: Option<OwnedSemaphorePermit>,
    ) -> Result<()> {
        let place = || version.key.clone();
        let no_permits = || Error::Io { place: place(), source: io::Error::other("no requests allowed") };
        let mut permits = match taken {
            Some(permit) => Some((None, permit)),
            None => Some(self.permits(segment, kind != Kind::Demand).await.ok_or_else(no_permits)?),
        };
        let end = segment.end();
        let mut bytes = get(segment.start..end).await?;
        let mut at = segment.start;
        while at < end {
            if !self.ready(segment, kind) {
                // A GET waiting for its readers brings nothing meanwhile: its request is another's
                // until they come (its connection stays open).
                permits = None;
                if !self.wait_for_readers(segment, kind).await {
                    return Ok(());
                }
            }
            if permits.is_none() {
                permits = Some(self.permits(segment, kind != Kind::Demand).await.ok_or_else(no_permits)?);
            }
            let piece = match tokio::time::timeout(self.timing.stall, bytes.next()).await {
                Ok(Some(piece)) => piece?,
                Ok(None) => {
                    let short =
                        format!("the server sent {} bytes where {} were due", at - segment.start, end - segment.start);
                    return Err(Error::Io {
                        place: place(),
                        source: io::Error::new(io::ErrorKind::InvalidData, short),
                    });
                }
                Err(_) => {
                    let why = format!("no bytes for {:.1} s", self.timing.stall.as_secs_f64());
                    return Err(Error::Io { place: place(), source: io::Error::new(io::ErrorKind::TimedOut, why) });
                }
            };
            self.make_room(segment, piece.len() as u64, kind);
            let len = piece.len() as u64;
            let added = segment.append(piece, &self.held);
            at += added;
            if added < len {
                let long = io::Error::new(io::ErrorKind::InvalidData, "the server sent more bytes than were due");
                return Err(Error::Io { place: place(), source: long });
            }
        }
        Ok(())
    }

    /// True when the segment's GET is to go on now: a reader waits for its bytes, its maker
    /// wants more, or its readers want more ahead and there is room for it.
    fn ready(&self, segment: &Arc<Segment>, kind: Kind) -> bool {
        segment.awaited()
            || (segment.demanded() && kind == Kind::Demand)
            || ((segment.demanded() || segment.wanted(|read| self.window(read))) && self.make_room(segment, 0, kind))
    }

    /// Waits until the segment's GET is to go on ([`Inner::ready`]); false when nobody read from
    /// it for [`Timing::idle`]: it is to be cut.
    async fn wait_for_readers(&self, segment: &Arc<Segment>, kind: Kind) -> bool {
        loop {
            if self.ready(segment, kind) {
                return true;
            }
            if segment.last_read().elapsed() >= self.timing.idle {
                return false;
            }
            // Readers wake it when they read on; room made elsewhere is seen at the next look.
            let _ = tokio::time::timeout(Duration::from_millis(20), segment.read_on.notified()).await;
        }
    }

    /// The permits for one GET of `segment`; `None` only if the semaphores were closed, which they
    /// never are. A GET nobody waited on when it was made (`background`) takes one of those for
    /// such GETs too, unless a reader comes to wait for it first: the lanes a reader waits on do
    /// not queue behind prefetches of shards it reads later.
    async fn permits(
        &self,
        segment: &Segment,
        background: bool,
    ) -> Option<(Option<OwnedSemaphorePermit>, OwnedSemaphorePermit)> {
        let background = match background && !segment.awaited() {
            true => {
                let permit = Box::pin(self.background.clone().acquire_owned());
                match futures_util::future::select(permit, Box::pin(until_awaited(segment))).await {
                    Either::Left((permit, _)) => Some(permit.ok()?),
                    Either::Right(((), _)) => None,
                }
            }
            false => None,
        };
        Some((background, self.requests.clone().acquire_owned().await.ok()?))
    }
}

/// The fetches and fetched bytes of one store.
#[derive(Debug)]
pub struct Fetcher {
    inner: Arc<Inner>,
    runtime: Handle,
}

impl Fetcher {
    /// Keeps at most `budget` bytes (0: nothing kept, nothing fetched ahead) and makes at most
    /// `max_requests` GETs at once, on `runtime`.
    pub fn new(budget: usize, max_requests: usize, runtime: Handle) -> Self {
        Self::with_timing(budget, max_requests, runtime, Timing::default())
    }

    /// [`Fetcher::new`] with other time limits.
    pub fn with_timing(budget: usize, max_requests: usize, runtime: Handle, timing: Timing) -> Self {
        let max_requests = max_requests.max(1);
        let budget = budget as u64;
        let inner = Inner {
            versions: Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(VERSIONS).expect("non-zero"))),
            held: AtomicU64::new(0),
            budget,
            largest_window: (budget / 2).min(LARGEST_WINDOW),
            requests: Arc::new(Semaphore::new(max_requests)),
            max_requests,
            background: Arc::new(Semaphore::new((max_requests - max_requests.div_ceil(4)).max(1))),
            timing,
        };
        Fetcher { inner: Arc::new(inner), runtime }
    }

    /// A permit for a GET made elsewhere (a whole object), counted with the others.
    pub async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.requests.clone().acquire_owned().await.ok()
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.inner.held.load(Ordering::SeqCst)
    }

    /// Takes note that `reader` will read `range`: its first read there fetches all of it, and
    /// goes on a run of reads in order unless the reader reads it [`Need::Alone`] or
    /// [`Need::Only`]. Not fetched at the hint itself: a file opened again while the kernel still
    /// holds its pages is opened but not read, and would cost a GET for nothing.
    pub fn will_need(&self, reader: &Reader, range: Range<u64>, need: Need) {
        let range = range.start..range.end.min(reader.size);
        if !range.is_empty() {
            *reader.chunk.lock() = Some(range.clone());
            *reader.hinted.lock() = Some((range, need));
        }
    }

    /// Starts fetching `range` of `reader`'s version now, in the background, from its first byte
    /// not fetched or being fetched yet, a lane of it at most (the index, or the first bytes of a
    /// shard about to be read: the rest comes in lanes as its readers go on); of a small object,
    /// as a read would, but without the rest beside its index ([`small_object`]). Its bytes are
    /// fetched as there is room for them, within half the budget.
    pub fn prefetch(&self, reader: &Reader, range: Range<u64>) {
        let range = range.start..range.end.min(reader.size);
        if self.inner.budget == 0 || range.is_empty() {
            return;
        }
        let mut versions = self.inner.versions.lock();
        let (version, gone) = remembered(&mut versions, &reader.version);
        let from = not_fetched_from(version, range.start);
        if from < range.end {
            if reader.size <= SMALL_OBJECT && version.segments.range(..=from).next().is_none() {
                for plan in small_object(version, reader.size, &(from..range.end), false) {
                    self.start(version, reader, Plan { kind: Kind::Background, ..plan });
                }
            } else {
                let end = range.end.min(from + LANE);
                let plan = planned(version, reader.size, from, end, end);
                self.start(version, reader, Plan { kind: Kind::Background, ..plan });
            }
        }
        drop(versions);
        if let Some(gone) = gone {
            self.inner.release(gone);
        }
    }

    /// Reads the bytes `wanted` of `reader`'s version (within its size) into the start of `buf`,
    /// waiting only for those.
    pub fn read(&self, reader: &Reader, wanted: Range<u64>, buf: &mut [u8]) -> Result<usize> {
        let len = (wanted.end - wanted.start) as usize;
        let Some(buf) = buf.get_mut(..len) else {
            return Err(Error::Io { place: reader.version.key.clone(), source: io::Error::other("buffer too small") });
        };
        if self.inner.budget == 0 {
            return self.read_directly(reader, wanted, buf);
        }
        let (hint, need) = reader.take_hint(&wanted).unzip();
        // The run the read goes on, once known: where it began, and where its readers are; none
        // for a range read alone.
        let mut in_order = None;
        let mut at = wanted.start;
        let mut misses = 0;
        while at < wanted.end {
            let segment = {
                let mut versions = self.inner.versions.lock();
                let (version, gone) = remembered(&mut versions, &reader.version);
                let run = in_order
                    .get_or_insert_with(|| match need {
                        Some(Need::Alone | Need::Only) => None,
                        _ => version.advance(hint.as_ref().unwrap_or(&wanted)),
                    })
                    .clone();
                let found = version.segments.range(..=at).next_back().map(|(_, s)| s).filter(|s| s.covers(at)).cloned();
                crate::metrics::cache("fetch", found.is_some());
                let segment = match found {
                    Some(segment) => segment,
                    None => {
                        // Bytes of its chunk dropped before this reader read them (to make room
                        // for other readers'): the rest of the chunk, not lanes ahead.
                        let again = if hint.is_none() { reader.rest_of_chunk(at) } else { None };
                        let (hint, run) = match &again {
                            Some(rest) => (Some(rest), None),
                            None => (hint.as_ref(), run),
                        };
                        // `again` comes only for a read with no hint of its own: its need is none.
                        let hint = hint.map(|h| (h, need.unwrap_or(Need::InOrder)));
                        let mut plans = self.plan(version, reader, at, &wanted, hint, run).into_iter();
                        let first = plans.next().expect("a plan for the read's own bytes");
                        let segment = self.start(version, reader, first);
                        for other in plans {
                            self.start(version, reader, other);
                        }
                        segment
                    }
                };
                drop(versions);
                if let Some(gone) = gone {
                    self.inner.release(gone);
                }
                segment
            };
            let from = (at - wanted.start) as usize;
            match segment.read(at, &mut buf[from..]) {
                Got::Copied(n) => {
                    at += n as u64;
                    misses = 0;
                    if let Some(Some((_, follow))) = &in_order {
                        follow.read_to(at);
                    }
                }
                Got::Failed(changed @ Error::Changed(_)) => return Err(changed),
                Got::Failed(e) if misses + 1 >= TRIES => return Err(e),
                Got::Gone if misses + 1 >= TRIES => {
                    let lost = io::Error::other("the bytes fetched were dropped before they could be read");
                    return Err(Error::Io { place: reader.version.key.clone(), source: lost });
                }
                Got::Failed(_) => {
                    misses += 1;
                    std::thread::sleep(crate::store::backoff(misses as u32));
                }
                Got::Gone => misses += 1,
            }
        }
        Ok(len)
    }

    /// Makes and starts the segment `plan` asks for.
    fn start(&self, version: &mut Version, reader: &Reader, plan: Plan) -> Arc<Segment> {
        let (kind, permit) = (plan.kind, plan.permit);
        let segment = Segment::new(plan.range.start, plan.range.end, plan.wanted_end, plan.follows);
        let segment = Arc::new(segment.in_group(plan.group));
        if let Some(replaced) = version.segments.insert(plan.range.start, segment.clone()) {
            // One whose first bytes were dropped (the new one ends where its bytes begin again),
            // or one that ended without a byte at its start: what it still holds or brings stays,
            // under its first byte held.
            let from = replaced.held_from();
            if from < replaced.end() && plan.range.end <= from {
                version.segments.insert(from, replaced);
            } else {
                replaced.let_go(&self.inner.held);
            }
        }
        log::trace!("fetching bytes {:?} of {} (wanted to {})", plan.range, reader.version.key, plan.wanted_end);
        let inner = self.inner.clone();
        let (id, get, running) = (reader.version.clone(), reader.get.clone(), segment.clone());
        self.runtime.spawn(async move {
            // Ends the segment however the task ends, so that nobody waits for it forever (a
            // runtime shutting down drops its tasks).
            struct Ended(Arc<Segment>, String);
            impl Drop for Ended {
                fn drop(&mut self) {
                    let gone = io::Error::new(io::ErrorKind::Interrupted, "the fetch was dropped");
                    self.0.finish(Err(Error::Io { place: self.1.clone(), source: gone }));
                }
            }
            let _ended = Ended(running.clone(), id.key.clone());
            inner.run(id, running, get, kind, permit).await;
        });
        segment
    }

    /// A read's own bytes, fetched for it alone (no budget): a reply cut short, running long or
    /// failing on the way is asked again, up to [`TRIES`] times in all, and never served.
    fn read_directly(&self, reader: &Reader, wanted: Range<u64>, buf: &mut [u8]) -> Result<usize> {
        let inner = &self.inner;
        let mut attempt = 1;
        loop {
            let fetched = self.runtime.block_on(async {
                let _permit = inner.requests.clone().acquire_owned().await;
                let mut stream = (reader.get)(wanted.clone()).await?;
                let mut all = Vec::with_capacity(buf.len());
                while let Some(piece) = stream.next().await {
                    all.extend_from_slice(&piece?);
                }
                if all.len() != buf.len() {
                    let wrong = io::Error::new(io::ErrorKind::InvalidData, "a read came back of the wrong length");
                    return Err(Error::Io { place: reader.version.key.clone(), source: wrong });
                }
                Ok::<_, Error>(all)
            });
            match fetched {
                Ok(bytes) => {
                    buf.copy_from_slice(&bytes);
                    return Ok(buf.len());
                }
                Err(e @ (Error::Changed(_) | Error::NotFound(_))) => return Err(e),
                Err(e) if attempt >= TRIES => return Err(e),
                Err(e) => {
                    log::debug!("{}: try {attempt} of {TRIES}: {e}", reader.version.key);
                    std::thread::sleep(crate::store::backoff(attempt as u32));
                    attempt += 1;
                }
            }
        }
    }
}

/// Returns once a reader waits for bytes of `segment` (readers waiting wake `read_on`).
async fn until_awaited(segment: &Segment) {
    while !segment.awaited() {
        let _ = tokio::time::timeout(Duration::from_millis(20), segment.read_on.notified()).await;
    }
}

/// The entry of `id` in `versions`, made if missing; and the version it pushed out, if any, whose
/// bytes are to stop being counted.
fn remembered<'a>(
    versions: &'a mut lru::LruCache<Arc<VersionId>, Version>,
    id: &Arc<VersionId>,
) -> (&'a mut Version, Option<Version>) {
    let mut gone = None;
    if !versions.contains(id) {
        gone = versions.push(id.clone(), Version { segments: BTreeMap::new(), runs: Vec::new() }).map(|(_, v)| v);
    }
    (versions.get_mut(id).expect("just made"), gone)
}

/// Orders `items` by `key`, the oldest first, looking at each item's key once: the times segments
/// were last read move on while they are ordered, and a sort looking at them at each comparison
/// sees no order, which `slice::sort` answers with a panic.
fn oldest_first<T, K: Ord>(items: &mut [T], key: impl FnMut(&T) -> K) {
    items.sort_by_cached_key(key);
}

#[cfg(test)]
// The GETs made are lists of ranges, some of one range.
#[allow(clippy::single_range_in_vec_init)]
mod tests;
