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
//!   small chunks: index and chunks in one GET); the whole chunk of a chunk file, whose range the
//!   view tells ([`Fetcher::will_need`]), a few GETs at once when it is large and requests are
//!   free (a quarter of them stay free for other reads); once readers go on
//!   in order (reads following each other, or the next chunks of a shard, a thread pool's few at
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
        all.sort_by_key(|(_, s)| s.last_read());
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
    /// goes on a run of reads in order unless the reader reads it [`Need::Alone`]. Not fetched at
    /// the hint itself: a file opened again while the kernel still holds its pages is opened but
    /// not read, and would cost a GET for nothing.
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
                        Some(Need::Alone) => None,
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

#[cfg(test)]
// The GETs made are lists of ranges, some of one range.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
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
        assert!(
            calls.iter().any(|r| r.start == 3 * SENT),
            "the rest asked from where the first GET stopped: {calls:?}"
        );
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

    #[test]
    fn a_chunk_read_at_random_under_a_full_budget_is_not_fetched_again_piece_by_piece() {
        // With the budget full (here a GET that holds 7.5 of 8 MiB, not yet ended), a chunk's
        // pieces come room or not, as one GET of it would, and the later ones do not push out the
        // one its reader is in: pieces cut or dropped would be asked again as lanes over the rest
        // of the object.
        let rt = runtime();
        let timing = Timing { idle: Duration::from_millis(300), stall: Duration::from_secs(600) };
        let fetcher = Fetcher::with_timing(8 << 20, 16, rt.handle().clone(), timing);
        // Another reader's GET of a small object, stalled before its end: its bytes stay.
        let filler = Arc::new(Fake { stall_after: Some(15 << 19), ..Default::default() });
        let other = filler.reader(5, 8 << 20);
        read(&fetcher, &other, 5, 0..64 << 10).unwrap();
        for _ in 0..200 {
            if fetcher.held() >= 15 << 19 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
            assert!(
                later.is_ok(),
                "the chunk's later bytes failed ({later:?}); GETs made at its first read: {asked:?}"
            );
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
        let filler = Arc::new(Fake { stall_after: Some(15 << 19), ..Default::default() });
        let other = filler.reader(5, 8 << 20);
        read(&fetcher, &other, 5, 0..64 << 10).unwrap();
        for _ in 0..200 {
            if fetcher.held() >= 15 << 19 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
}
