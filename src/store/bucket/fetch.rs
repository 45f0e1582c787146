//! Fetching object bytes: ranged GETs of one object version made on the store's runtime, shared
//! by every reader that wants them, and kept in memory for a while.
//!
//! On an object store each request costs a round trip (10-50 ms), and throughput comes from many
//! requests in flight, so:
//! - bytes live in *parts* keyed by object, ETag and range: a read waits for the parts that hold
//!   its bytes, and asks only for what no part holds or is fetching yet, so two readers of one
//!   range cost one GET, and another version's bytes are never served;
//! - a range is fetched as parts of at most [`PART`] bytes, each its own GET, in parallel (as
//!   mountpoint-s3's prefetcher does);
//! - a reader may say which range it will read ([`Fetcher::will_need`], from a chunk's location in
//!   its shard): its first read in that range fetches all of it (up to a window), so a chunk read
//!   in 128 KiB pieces costs one GET. Not at the hint itself: a file opened again while the
//!   kernel still holds its pages is opened but not read, and would cost a GET for nothing;
//! - a reader going on in order (within [`NEAR`] of where it was) gets a window fetched ahead in
//!   the background, 1 MiB at first and doubling while it keeps up, up to half the budget; a new
//!   window is asked for only when less than half of one is left ahead, so GETs stay large;
//! - a small object ([`SMALL_OBJECT`], 8 MiB) read a second time is fetched whole (a shard of
//!   small chunks, read by a Zarr reader's thread pool in no particular order);
//! - a range hinted right after its neighbour (the next chunk of a shard, read from another
//!   handle) has the ranges beyond it fetched ahead, twice what was read in order so far, and
//!   all the rest of an object that fits in a window;
//! - memory is bounded by the budget (`--read-ahead-size`): fetched parts go least recently used
//!   first, and parts read to their end before the others; a background fetch is made only within
//!   the budget, a read's own bytes always;
//! - GETs in flight are bounded (`--max-requests`), and background GETs leave a quarter of them
//!   to reads that are waiting, so that a prefetch never holds up a reader of something else.
//!
//! A FUSE thread waits only for the parts holding the bytes it asked for, never for a prefetch.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use lru::LruCache;
use parking_lot::{Condvar, Mutex};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::store::{Error, Result};

/// The largest single GET: larger ranges are fetched as parts of this size, in parallel.
pub const PART: u64 = 8 << 20;
/// The first window fetched ahead of a reader going on in order.
const FIRST_WINDOW: u64 = 1 << 20;
/// The largest window, whatever the budget.
const LARGEST_WINDOW: u64 = 256 << 20;
/// An object at most this large read a second time is fetched whole: one GET. A shard of small
/// chunks is read by a Zarr reader's thread pool many chunks at once and in no particular order,
/// each chunk a GET of its own otherwise; its index was the first read. (A shard of 4 MiB of
/// data is a little over 4 MiB with its index.)
const SMALL_OBJECT: u64 = PART;
/// A read this close to where the last one ended, before or after, continues the stream: readers
/// with several reads in flight (a thread pool, the kernel's own read-ahead) arrive out of order.
const NEAR: u64 = 256 << 10;

/// The future of one ranged GET of a version.
pub type GetFuture = Pin<Box<dyn Future<Output = Result<Bytes>> + Send>>;
/// How to GET a range of one version (checked for version and length: see `requests`).
pub type Get = Arc<dyn Fn(Range<u64>) -> GetFuture + Send + Sync>;

/// One version of one object.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct VersionId {
    pub key: String,
    pub e_tag: String,
}

/// One open handle's reading of an object version: its own stream position, so that readers of
/// several chunks of one shard do not reset each other's windows.
pub struct Reader {
    version: Arc<VersionId>,
    size: u64,
    get: Get,
    stream: Mutex<Stream>,
}

impl Reader {
    /// A reader of `version`, `size` bytes long, whose ranges `get` fetches.
    pub fn new(version: VersionId, size: u64, get: Get) -> Self {
        Reader { version: Arc::new(version), size, get, stream: Mutex::default() }
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Reader").field("version", &self.version).field("size", &self.size).finish_non_exhaustive()
    }
}

/// Where a reader is, and how far ahead of it to fetch.
#[derive(Debug, Default)]
struct Stream {
    /// False until the first read or hint: a first read is not taken as sequential.
    started: bool,
    /// Where a sequential reader reads next.
    next: u64,
    /// How far ahead of the reader to fetch (0: not reading in order).
    window: u64,
    /// The range the reader said it will read: nothing beyond it is fetched ahead.
    hinted: Option<Range<u64>>,
    /// True until the first read after the hint, which fetches the range hinted.
    hint_pending: bool,
}

impl Stream {
    /// The range hinted, when `wanted` is the first read since the hint and inside it.
    fn take_hint(&mut self, wanted: &Range<u64>) -> Option<Range<u64>> {
        let pending = std::mem::take(&mut self.hint_pending);
        let hinted = self.hinted.as_ref().filter(|_| pending)?;
        let inside = hinted.start <= wanted.start && wanted.end <= hinted.end;
        inside.then(|| hinted.clone())
    }

    /// Takes note of a read of `wanted`; the range to have fetched ahead of it, if any, and how
    /// far the reader may read.
    fn plan(&mut self, wanted: &Range<u64>, size: u64, largest: u64) -> Option<(Range<u64>, u64)> {
        let sequential = self.started
            && wanted.start.saturating_add(NEAR) >= self.next
            && wanted.start <= self.next.saturating_add(self.window.max(NEAR));
        self.started = true;
        if !sequential {
            self.window = 0;
            self.next = wanted.end;
            return None;
        }
        self.window = self.window.saturating_mul(2).clamp(FIRST_WINDOW.min(largest), largest);
        self.next = self.next.max(wanted.end);
        let limit = match &self.hinted {
            Some(hinted) if hinted.start <= wanted.start && wanted.end <= hinted.end => hinted.end,
            _ => size,
        };
        let ahead = wanted.end..limit.min(wanted.end.saturating_add(self.window));
        (!ahead.is_empty()).then_some((ahead, limit))
    }
}

/// Bytes of one version being fetched or fetched.
#[derive(Debug)]
struct Part {
    range: Range<u64>,
    outcome: Mutex<Option<std::result::Result<Bytes, Arc<Error>>>>,
    ready: Condvar,
}

impl Part {
    fn new(range: Range<u64>) -> Arc<Self> {
        Arc::new(Part { range, outcome: Mutex::new(None), ready: Condvar::new() })
    }

    fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// The part's bytes, once fetched.
    fn wait(&self) -> Result<Bytes> {
        let mut outcome = self.outcome.lock();
        loop {
            match &*outcome {
                Some(Ok(bytes)) => return Ok(bytes.clone()),
                Some(Err(e)) => return Err(copy_of(e)),
                None => self.ready.wait(&mut outcome),
            }
        }
    }

    fn settle(&self, outcome: std::result::Result<Bytes, Arc<Error>>) {
        *self.outcome.lock() = Some(outcome);
        self.ready.notify_all();
    }
}

/// The same error again, for each reader that waited on one fetch.
fn copy_of(e: &Error) -> Error {
    match e {
        Error::NotFound(place) => Error::NotFound(place.clone()),
        Error::Changed(place) => Error::Changed(place.clone()),
        Error::Crashed(place) => Error::Crashed(place.clone()),
        Error::Io { place, source } => {
            let source = match source.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(source.kind(), source.to_string()),
            };
            Error::Io { place: place.clone(), source }
        }
    }
}

/// Where the ranges hinted by the readers of one version have got to: Zarr readers read the
/// chunks of a shard in order, each from a handle of its own (often from a thread pool, a few
/// at once), and neighbouring chunks read one after the other are fetched ahead together.
#[derive(Debug)]
struct Run {
    /// Where the ranges hinted in order began.
    start: u64,
    /// The end of the furthest range hinted.
    next: u64,
    /// How far beyond a range hinted to fetch (0: not in order).
    window: u64,
}

impl Run {
    /// A version none of whose ranges was hinted yet.
    fn new() -> Self {
        Run { start: u64::MAX, next: u64::MAX, window: 0 }
    }

    /// Takes note of the first read of `hinted`; how far beyond it to fetch, if anything: twice
    /// what was read in order so far, so the window grows as the readers keep up.
    fn advance(&mut self, hinted: &Range<u64>, largest: u64) -> u64 {
        let slack = self.window.max(NEAR);
        let in_order =
            hinted.start.saturating_add(slack) >= self.next && hinted.start <= self.next.saturating_add(slack);
        if in_order {
            self.next = self.next.max(hinted.end);
            let read = self.next.saturating_sub(self.start);
            self.window = read.saturating_mul(2).clamp(FIRST_WINDOW.min(largest), largest);
        } else {
            (self.start, self.next, self.window) = (hinted.start, hinted.end, 0);
        }
        self.window
    }
}

/// How many versions' runs are remembered.
const RUNS: usize = 4096;

#[derive(Debug)]
struct State {
    /// Every part in flight or fetched, by version and first byte; parts of one version never
    /// overlap (new ones only fill gaps).
    versions: HashMap<Arc<VersionId>, BTreeMap<u64, Arc<Part>>>,
    /// The fetched parts (not those in flight), least recently used first out.
    fetched: LruCache<(Arc<VersionId>, u64), ()>,
    /// Bytes of the parts in `versions`.
    held: u64,
    runs: LruCache<Arc<VersionId>, Run>,
}

impl State {
    /// Makes background parts for `from..end` of `version` (where a reader of `window` bytes
    /// ahead may read up to `limit`), when less than half a window is held ahead of `from`.
    fn ahead(
        &mut self,
        version: &Arc<VersionId>,
        from: u64,
        end: u64,
        window: u64,
        limit: u64,
        budget: u64,
    ) -> Vec<Arc<Part>> {
        let mut made = Vec::new();
        let covered = self.covered_from(version, from);
        if covered >= end || covered - from >= window / 2 {
            return made;
        }
        // Whole parts once the window holds some, rather than a small one at the end of each
        // window as the reader moves on.
        let mut end = end;
        if window >= PART {
            end = covered.saturating_add((end - covered).div_ceil(PART) * PART).min(limit);
        }
        let rest = covered..end;
        let want = self.missing(version, &rest);
        let room = self.room(budget, want);
        if room > 0 {
            self.cover(version, rest, room, &mut made);
        }
        made
    }

    /// The parts of `version` holding bytes of `range`, in order, after making parts for the
    /// gaps, up to `allowance` bytes of them; the new parts go to `made`.
    fn cover(
        &mut self,
        version: &Arc<VersionId>,
        range: Range<u64>,
        mut allowance: u64,
        made: &mut Vec<Arc<Part>>,
    ) -> Vec<Arc<Part>> {
        if range.is_empty() {
            return Vec::new();
        }
        let parts = self.versions.entry(version.clone()).or_default();
        let first = parts.range(..=range.start).next_back().map(|(_, p)| p).filter(|p| p.range.end > range.start);
        let existing: Vec<Arc<Part>> =
            first.into_iter().chain(parts.range(range.start + 1..range.end).map(|(_, p)| p)).cloned().collect();
        let mut found = Vec::new();
        let mut at = range.start;
        let mut fill = |gap: Range<u64>, found: &mut Vec<Arc<Part>>, allowance: &mut u64| {
            let mut start = gap.start;
            while start < gap.end && *allowance > 0 {
                let end = gap.end.min(start + PART).min(start.saturating_add(*allowance));
                let part = Part::new(start..end);
                parts.insert(start, part.clone());
                self.held += end - start;
                *allowance -= end - start;
                made.push(part.clone());
                found.push(part);
                start = end;
            }
        };
        for part in existing {
            if part.range.start > at {
                fill(at..part.range.start, &mut found, &mut allowance);
            }
            at = part.range.end;
            found.push(part);
        }
        if at < range.end {
            fill(at..range.end, &mut found, &mut allowance);
        }
        found.sort_by_key(|p| p.range.start);
        found
    }

    /// How many bytes of `range` of `version` no part holds.
    fn missing(&self, version: &Arc<VersionId>, range: &Range<u64>) -> u64 {
        let Some(parts) = self.versions.get(version).filter(|_| !range.is_empty()) else {
            return range.end.saturating_sub(range.start);
        };
        let first = parts.range(..=range.start).next_back().map(|(_, p)| p).filter(|p| p.range.end > range.start);
        let held: u64 = first
            .into_iter()
            .chain(parts.range(range.start + 1..range.end).map(|(_, p)| p))
            .map(|p| p.range.end.min(range.end) - p.range.start.max(range.start))
            .sum();
        (range.end - range.start) - held
    }

    /// Where the bytes held of `version` from `at` on without a gap end.
    fn covered_from(&self, version: &Arc<VersionId>, mut at: u64) -> u64 {
        let Some(parts) = self.versions.get(version) else { return at };
        if let Some((_, part)) = parts.range(..=at).next_back()
            && part.range.end > at
        {
            at = part.range.end;
        }
        while let Some(part) = parts.get(&at) {
            at = part.range.end;
        }
        at
    }

    /// True when some part of `version` is held or in flight.
    fn knows(&self, version: &Arc<VersionId>) -> bool {
        self.versions.get(version).is_some_and(|parts| !parts.is_empty())
    }

    /// Drops fetched parts, least recently used first, until at most `target` bytes are held or
    /// only parts in flight are left.
    fn evict_to(&mut self, target: u64) {
        while self.held > target {
            let Some(((version, start), ())) = self.fetched.pop_lru() else { break };
            self.remove(&version, start);
        }
    }

    /// Room for up to `want` bytes more within `budget`, made by dropping fetched parts.
    fn room(&mut self, budget: u64, want: u64) -> u64 {
        self.evict_to(budget.saturating_sub(want));
        budget.saturating_sub(self.held).min(want)
    }

    fn remove(&mut self, version: &Arc<VersionId>, start: u64) {
        let Some(parts) = self.versions.get_mut(version) else { return };
        if let Some(part) = parts.remove(&start) {
            self.held -= part.len();
        }
        if parts.is_empty() {
            self.versions.remove(version);
        }
    }

    /// Drops every part of `version` (it was replaced: nothing more of it can be fetched).
    fn forget(&mut self, version: &Arc<VersionId>) {
        let Some(parts) = self.versions.remove(version) else { return };
        for (start, part) in parts {
            self.held -= part.len();
            self.fetched.pop(&(version.clone(), start));
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    budget: u64,
    /// The largest window fetched ahead of one reader.
    largest_window: u64,
    /// Every GET holds one of these while it runs.
    requests: Arc<Semaphore>,
    /// Background GETs (nobody waiting on them yet) hold one of these too.
    background: Arc<Semaphore>,
}

impl Inner {
    /// The permits for one GET; `None` only if the semaphores were closed, which they never are.
    async fn permits(&self, background: bool) -> Option<(Option<OwnedSemaphorePermit>, OwnedSemaphorePermit)> {
        let background = match background {
            true => Some(self.background.clone().acquire_owned().await.ok()?),
            false => None,
        };
        Some((background, self.requests.clone().acquire_owned().await.ok()?))
    }

    /// Records how the fetch of `part` ended and hands the outcome to whoever waits for it.
    fn finish(&self, version: &Arc<VersionId>, part: &Arc<Part>, outcome: Result<Bytes>) {
        {
            let mut state = self.state.lock();
            let start = part.range.start;
            let current =
                state.versions.get(version).and_then(|parts| parts.get(&start)).is_some_and(|p| Arc::ptr_eq(p, part));
            match &outcome {
                Ok(_) if current => {
                    state.fetched.put((version.clone(), start), ());
                    state.evict_to(self.budget);
                }
                Err(Error::Changed(_)) => state.forget(version),
                // A later read asks again.
                Err(_) if current => state.remove(version, start),
                _ => {}
            }
        }
        if let Err(e) = &outcome {
            log::debug!("fetching bytes {:?} of {}: {e}", part.range, version.key);
        }
        part.settle(outcome.map_err(Arc::new));
    }
}

/// Settles a part whose fetch was dropped before it ended (the runtime shutting down), so that
/// nobody waits for it forever.
struct Settle {
    inner: Arc<Inner>,
    version: Arc<VersionId>,
    part: Arc<Part>,
    done: bool,
}

impl Drop for Settle {
    fn drop(&mut self) {
        if !self.done {
            let gone = io::Error::new(io::ErrorKind::Interrupted, "the fetch was dropped");
            let place = self.version.key.clone();
            self.inner.finish(&self.version, &self.part, Err(Error::Io { place, source: gone }));
        }
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
        let max_requests = max_requests.max(1);
        let runs = LruCache::new(std::num::NonZeroUsize::new(RUNS).expect("non-zero"));
        let state = State { versions: HashMap::new(), fetched: LruCache::unbounded(), held: 0, runs };
        let budget = budget as u64;
        let inner = Inner {
            state: Mutex::new(state),
            budget,
            largest_window: (budget / 2).min(LARGEST_WINDOW),
            requests: Arc::new(Semaphore::new(max_requests)),
            background: Arc::new(Semaphore::new((max_requests - max_requests / 4).max(1))),
        };
        Fetcher { inner: Arc::new(inner), runtime }
    }

    /// A permit for a GET made elsewhere (a whole object), counted with the others.
    pub async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.requests.clone().acquire_owned().await.ok()
    }

    /// Bytes held now, in flight or fetched.
    pub fn held(&self) -> u64 {
        self.inner.state.lock().held
    }

    /// Takes note that `reader` will read `range`: its first read there fetches all of it (as
    /// much as fits in a window; the rest follows as the reader goes on).
    pub fn will_need(&self, reader: &Reader, range: Range<u64>) {
        let range = range.start..range.end.min(reader.size);
        if self.inner.budget == 0 || range.is_empty() {
            return;
        }
        let window = (range.end - range.start).min(self.inner.largest_window);
        let mut stream = reader.stream.lock();
        *stream = Stream { started: true, next: range.start, window, hinted: Some(range), hint_pending: true };
    }

    /// Reads the bytes `wanted` of `reader`'s version (within its size) into the start of `buf`,
    /// waiting only for the parts that hold them.
    pub fn read(&self, reader: &Reader, wanted: Range<u64>, buf: &mut [u8]) -> Result<usize> {
        let len = (wanted.end - wanted.start) as usize;
        let Some(buf) = buf.get_mut(..len) else {
            return Err(Error::Io { place: reader.version.key.clone(), source: io::Error::other("buffer too small") });
        };
        if self.inner.budget == 0 {
            let inner = &self.inner;
            let bytes = self.runtime.block_on(async {
                let _permits = inner.permits(false).await;
                (reader.get)(wanted.clone()).await
            })?;
            if bytes.len() != len {
                let wrong = io::Error::new(io::ErrorKind::InvalidData, "a read came back of the wrong length");
                return Err(Error::Io { place: reader.version.key.clone(), source: wrong });
            }
            return copy_into(buf, &bytes, &reader.version);
        }
        let (found, demand, background) = {
            let mut stream = reader.stream.lock();
            let largest = self.inner.largest_window;
            let budget = self.inner.budget;
            let hinted = stream.take_hint(&wanted);
            let ahead = stream.plan(&wanted, reader.size, largest);
            let window = stream.window;
            drop(stream);
            let mut state = self.inner.state.lock();
            let version = &reader.version;
            let fetch = match &hinted {
                _ if reader.size <= SMALL_OBJECT && state.knows(version) => 0..reader.size,
                Some(hinted) => {
                    // The whole range hinted (up to a window) when it fits in the budget: a
                    // read's own bytes always go, the rest is fetched ahead.
                    let end = hinted.end.min(wanted.start.saturating_add(largest)).max(wanted.end);
                    let whole = wanted.start..end;
                    let want = state.missing(version, &whole);
                    if state.room(budget, want) >= want { whole } else { wanted.clone() }
                }
                None => wanted.clone(),
            };
            let mut demand = Vec::new();
            let found = state.cover(version, fetch, u64::MAX, &mut demand);
            let mut background = Vec::new();
            if let Some((ahead, limit)) = ahead {
                background = state.ahead(version, wanted.end, ahead.end, window, limit, budget);
            }
            if let Some(hinted) = hinted {
                // A range hinted right after its neighbour: the chunks beyond it are fetched
                // ahead, all the rest of an object that fits in a window.
                let window = state.runs.get_or_insert_mut(version.clone(), Run::new);
                let window = window.advance(&hinted, largest);
                if window > 0 {
                    let end = if reader.size <= largest { reader.size } else { hinted.end.saturating_add(window) };
                    let end = end.min(reader.size);
                    let window = window.max(end.saturating_sub(hinted.end));
                    background.extend(state.ahead(version, hinted.end, end, window, reader.size, budget));
                }
            }
            state.evict_to(self.inner.budget);
            let found: Vec<_> =
                found.into_iter().filter(|p| p.range.end > wanted.start && p.range.start < wanted.end).collect();
            (found, demand, background)
        };
        self.spawn(reader, demand, false);
        self.spawn(reader, background, true);
        let mut filled = 0;
        for part in &found {
            let bytes = part.wait()?;
            if bytes.len() as u64 != part.len() {
                let short = io::Error::new(io::ErrorKind::InvalidData, "a part came back of the wrong length");
                return Err(Error::Io { place: reader.version.key.clone(), source: short });
            }
            let from = wanted.start.max(part.range.start);
            let to = wanted.end.min(part.range.end);
            let piece = bytes.slice((from - part.range.start) as usize..(to - part.range.start) as usize);
            filled += copy_into(&mut buf[(from - wanted.start) as usize..], &piece, &reader.version)?;
            if to == part.range.end {
                // Read to its end: the first to go when room is needed, before parts not yet read.
                self.inner.state.lock().fetched.demote(&(reader.version.clone(), part.range.start));
            }
        }
        if filled != len {
            let gap = io::Error::other("the parts fetched do not cover the read");
            return Err(Error::Io { place: reader.version.key.clone(), source: gap });
        }
        Ok(len)
    }

    /// Fetches `parts` of `reader`'s version on the runtime.
    fn spawn(&self, reader: &Reader, parts: Vec<Arc<Part>>, background: bool) {
        for part in parts {
            let why = if background { "ahead" } else { "for a read" };
            log::trace!("fetching bytes {:?} of {} {why}", part.range, reader.version.key);
            let inner = self.inner.clone();
            let version = reader.version.clone();
            let get = reader.get.clone();
            self.runtime.spawn(async move {
                let mut settle =
                    Settle { inner: inner.clone(), version: version.clone(), part: part.clone(), done: false };
                let outcome = match inner.permits(background).await {
                    Some(_permits) => get(part.range.clone()).await,
                    None => {
                        Err(Error::Io { place: version.key.clone(), source: io::Error::other("no requests allowed") })
                    }
                };
                settle.done = true;
                inner.finish(&version, &part, outcome);
            });
        }
    }
}

/// Copies `piece` to the start of `buf`.
fn copy_into(buf: &mut [u8], piece: &[u8], version: &VersionId) -> Result<usize> {
    let Some(to) = buf.get_mut(..piece.len()) else {
        let long = io::Error::new(io::ErrorKind::InvalidData, "more bytes came back than asked for");
        return Err(Error::Io { place: version.key.clone(), source: long });
    };
    to.copy_from_slice(piece);
    Ok(piece.len())
}

#[cfg(test)]
// The GETs made are lists of ranges, some of one range.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    /// A source of object bytes that records its GETs, can hold them at a gate, and can fail.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<Range<u64>>>,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
        /// GETs wait here for a permit each, when set.
        gate: Option<Arc<Semaphore>>,
        /// GETs take this long.
        delay: Duration,
        /// The next GETs fail with an I/O error, this many of them.
        failures: AtomicUsize,
        /// Every GET answers that the version was replaced.
        changed: AtomicBool,
    }

    /// The bytes `range` of version `seed`: byte `i` is `(i + seed) % 251`, so that bytes from
    /// another place or version differ (made by copying, as debug builds are slow per byte).
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
                    tokio::time::sleep(fake.delay).await;
                    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if fake.changed.load(Ordering::SeqCst) {
                        return Err(Error::Changed("k".into()));
                    }
                    if fake.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                        return Err(Error::Io { place: "k".into(), source: io::Error::other("reset") });
                    }
                    Ok(Bytes::from(bytes(seed, range)))
                })
            });
            Reader::new(VersionId { key: "k".into(), e_tag: format!("\"{seed}\"") }, size, get)
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    /// Reads `range` through `fetcher`, checking the bytes against version `seed`.
    fn read(fetcher: &Fetcher, reader: &Reader, seed: u64, range: Range<u64>) -> Result<()> {
        let mut buf = vec![0; (range.end - range.start) as usize];
        let n = fetcher.read(reader, range.clone(), &mut buf)?;
        assert_eq!(n, buf.len());
        assert!(buf == bytes(seed, range.clone()), "the bytes of {range:?} of version {seed}");
        Ok(())
    }

    /// Waits until `fake` has been asked for `n` GETs; if it never is, opens its gate (so that
    /// readers waiting behind it end and the test fails rather than hangs) and fails.
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
        let (a, b) = (fake.reader(1, 10 << 20), fake.reader(1, 10 << 20));
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
    fn a_range_said_to_be_needed_is_one_get_whatever_pieces_are_read() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        let reader = fake.reader(1, 16 << 20);
        let chunk = (1 << 20) + 17..(5 << 20) + 3;
        fetcher.will_need(&reader, chunk.clone());
        std::thread::sleep(Duration::from_millis(20));
        assert!(fake.calls().is_empty(), "nothing is fetched before the first read");
        let mut at = chunk.start;
        while at < chunk.end {
            let end = chunk.end.min(at + (128 << 10));
            read(&fetcher, &reader, 1, at..end).unwrap();
            at = end;
        }
        assert_eq!(fake.calls(), [chunk], "one GET of the whole chunk");
    }

    /// Reads chunk `i` (64 KiB) of version `seed` from a handle of its own, as a Zarr reader does.
    fn read_chunk(fetcher: &Fetcher, fake: &Arc<Fake>, seed: u64, size: u64, i: u64) {
        let reader = fake.reader(seed, size);
        let chunk = i * (64 << 10)..(i + 1) * (64 << 10);
        fetcher.will_need(&reader, chunk.clone());
        read(fetcher, &reader, seed, chunk).unwrap();
    }

    #[test]
    fn neighbouring_chunks_read_in_order_are_fetched_ahead_together() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        for i in 0..256 {
            read_chunk(&fetcher, &fake, 1, 16 << 20, i);
        }
        let calls = fake.calls();
        assert!(calls.len() <= 4, "the first two chunks, then the rest of the shard: {calls:?}");
        for i in 0..64 {
            read_chunk(&fetcher, &fake, 2, 1 << 30, i);
        }
        let large: Vec<_> = fake.calls()[calls.len()..].to_vec();
        assert!(large.len() <= 8, "in windows of a large one: {large:?}");
        let furthest = large.iter().map(|r| r.end).max().unwrap();
        assert!(furthest <= 16 << 20, "4 MiB read, not much more fetched ahead: {large:?}");
        let scattered = Arc::new(Fake::default());
        for i in [5000, 100, 3700, 9000] {
            read_chunk(&fetcher, &scattered, 3, 1 << 30, i);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(scattered.calls().len(), 4, "chunks out of order: each its own");
    }

    #[test]
    fn a_large_range_is_fetched_as_parts_in_parallel() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Fake::gated();
        let reader = fake.reader(1, 64 << 20);
        fetcher.will_need(&reader, 0..20 << 20);
        std::thread::scope(|s| {
            let first = s.spawn(|| read(&fetcher, &reader, 1, 0..128 << 10));
            until_asked(&fake, 3);
            std::thread::sleep(Duration::from_millis(20));
            let in_flight = fake.in_flight.load(Ordering::SeqCst);
            fake.open();
            assert_eq!(in_flight, 3, "all parts in flight at once, and nothing more");
            first.join().unwrap().unwrap();
        });
        read(&fetcher, &reader, 1, (7 << 20)..(9 << 20)).unwrap();
        let mut calls = fake.calls();
        calls.sort_by_key(|r| r.start);
        assert_eq!(calls, [0..8 << 20, 8 << 20..16 << 20, 16 << 20..20 << 20]);
    }

    #[test]
    fn a_reader_going_on_in_order_gets_growing_windows_of_large_gets() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake { delay: Duration::from_millis(2), ..Default::default() });
        let size = 100 << 20;
        let reader = fake.reader(3, size);
        let mut at = 0;
        while at < size {
            let end = size.min(at + (128 << 10));
            read(&fetcher, &reader, 3, at..end).unwrap();
            at = end;
        }
        let calls = fake.calls();
        assert!(calls.len() <= 24, "100 MiB in 128 KiB reads: {} GETs: {calls:?}", calls.len());
        assert!(calls.iter().all(|r| r.end - r.start <= PART), "no GET over a part: {calls:?}");
        let small = calls.iter().filter(|r| r.end - r.start < 512 << 10).count();
        assert_eq!(small, 2, "only the first two reads' own bytes are fetched in small GETs: {calls:?}");
        assert!(fetcher.held() <= 64 << 20);
    }

    #[test]
    fn gets_in_flight_stay_within_max_requests_and_background_ones_leave_room() {
        let rt = runtime();
        let fetcher = Fetcher::new(256 << 20, 4, rt.handle().clone());
        let fake = Fake::gated();
        let reader = fake.reader(1, 128 << 20);
        let mut ahead = Vec::new();
        fetcher.inner.state.lock().cover(&reader.version, 0..64 << 20, u64::MAX, &mut ahead);
        fetcher.spawn(&reader, ahead, true);
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
        read(&fetcher, &reader, 1, 0..64 << 20).unwrap();
        assert!(fake.most_in_flight.load(Ordering::SeqCst) <= 4);
        assert_eq!(fake.calls().len(), 9, "8 parts and the other read");
    }

    #[test]
    fn memory_stays_within_the_budget() {
        let rt = runtime();
        let budget = 4 << 20;
        let fetcher = Fetcher::new(budget, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        let reader = fake.reader(1, 1 << 30);
        for i in 0..200u64 {
            let start = i * (3 << 20);
            fetcher.will_need(&reader, start..start + (1 << 20));
            read(&fetcher, &reader, 1, start..start + (128 << 10)).unwrap();
            read(&fetcher, &reader, 1, start + (128 << 10)..start + (256 << 10)).unwrap();
            assert!(fetcher.held() <= budget as u64, "{} held", fetcher.held());
        }
        let sequential = fake.reader(2, 1 << 30);
        for i in 0..400u64 {
            read(&fetcher, &sequential, 2, i * (128 << 10)..(i + 1) * (128 << 10)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(fetcher.held() <= budget as u64, "{} held", fetcher.held());
    }

    #[test]
    fn versions_never_mix() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        let (old, new) = (fake.reader(1, 10 << 20), fake.reader(2, 10 << 20));
        fetcher.will_need(&old, 0..1 << 20);
        read(&fetcher, &old, 1, 0..1000).unwrap();
        read(&fetcher, &new, 2, 0..1000).unwrap();
        read(&fetcher, &old, 1, 500..1500).unwrap();
        assert_eq!(fake.calls().len(), 2, "one GET per version");
    }

    #[test]
    fn a_replaced_version_fails_every_reader_waiting_and_is_forgotten() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake { gate: Some(Arc::new(Semaphore::new(0))), ..Default::default() });
        fake.changed.store(true, Ordering::SeqCst);
        let (a, b) = (fake.reader(1, 10 << 20), fake.reader(1, 10 << 20));
        fetcher.will_need(&a, 0..4 << 20);
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
    fn a_failed_fetch_is_asked_again_by_the_next_read() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake { failures: AtomicUsize::new(1), ..Default::default() });
        let reader = fake.reader(1, 1 << 30);
        assert!(matches!(read(&fetcher, &reader, 1, 0..1000), Err(Error::Io { .. })));
        read(&fetcher, &reader, 1, 0..1000).unwrap();
        assert_eq!(fake.calls().iter().filter(|r| **r == (0..1000)).count(), 2);
    }

    #[test]
    fn a_small_object_read_a_second_time_is_fetched_whole() {
        let rt = runtime();
        let fetcher = Fetcher::new(64 << 20, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        let (index, chunk, other) = (fake.reader(1, 100_000), fake.reader(1, 100_000), fake.reader(1, 100_000));
        read(&fetcher, &index, 1, 99_000..100_000).unwrap();
        fetcher.will_need(&chunk, 10..5000);
        read(&fetcher, &chunk, 1, 10..5000).unwrap();
        read(&fetcher, &other, 1, 50_000..60_000).unwrap();
        assert_eq!(fake.calls(), [99_000..100_000, 0..99_000]);
    }

    #[test]
    fn without_a_budget_reads_fetch_just_what_they_ask() {
        let rt = runtime();
        let fetcher = Fetcher::new(0, 16, rt.handle().clone());
        let fake = Arc::new(Fake::default());
        let reader = fake.reader(1, 1 << 30);
        fetcher.will_need(&reader, 0..1 << 20);
        read(&fetcher, &reader, 1, 0..1000).unwrap();
        read(&fetcher, &reader, 1, 1000..2000).unwrap();
        assert_eq!(fake.calls(), [0..1000, 1000..2000]);
        assert_eq!(fetcher.held(), 0);
    }
}
