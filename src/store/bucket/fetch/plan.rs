//! What a read or a prefetch fetches, as GETs of byte ranges of one version ([`Plan`]s): a small
//! object whole, or its index and the rest beside it; a read's own bytes or its chunk's; the rest
//! of an object as lanes once its readers go on in order. The segments already fetched or being
//! fetched bound every plan: two never hold the same bytes.

use std::ops::Range;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::segment::{Follow, Group};
use super::{Fetcher, Kind, LANE, LANES, NEAR, PIECE, PIECES, POOL, Reader, SMALL_OBJECT, TAIL_FIRST, Version};
use crate::store::Need;

/// Which bytes a new segment is to fetch.
pub(super) struct Plan {
    pub(super) range: Range<u64>,
    /// The bytes its maker wants now, fetched without waiting for readers.
    pub(super) wanted_end: u64,
    /// The run it is fetched ahead of (a lane), if any.
    pub(super) follows: Option<Arc<Follow>>,
    /// Who it is fetched for: a read's own bytes (every piece of them: each comes as a reader
    /// waits, in a GET made now, so that all of them come from the version its first came from)
    /// are [`Kind::Demand`].
    pub(super) kind: Kind,
    /// The read's pieces it is one of ([`Fetcher::pieces`]).
    pub(super) group: Option<Arc<Group>>,
    /// Its request, taken already: the pieces of a read are asked for at once or not at all.
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

impl Fetcher {
    /// What to fetch for a read of `wanted` finding nothing at `at`: a small object up to its
    /// first bytes fetched, when nothing before `at` was ([`small_object`]) and the range hinted
    /// is not one read [`Need::Only`]; when the readers go
    /// on in order, the rest of the object (from the first byte not fetched yet of their run) as
    /// [`LANES`] GETs at once, the first for the read; else the range hinted, or the read's own
    /// bytes, in [`Fetcher::pieces`] (for a read far behind its run: onwards, in one GET).
    pub(super) fn plan(
        &self,
        version: &Version,
        reader: &Reader,
        at: u64,
        wanted: &Range<u64>,
        hint: Option<(&Range<u64>, Need)>,
        run: Option<(u64, Arc<Follow>)>,
    ) -> Vec<Plan> {
        let size = reader.size;
        let only = matches!(hint, Some((_, Need::Only)));
        let hint = hint.map(|(range, _)| range);
        if size <= SMALL_OBJECT && !only && version.segments.range(..=at).next().is_none() {
            return small_object(version, size, &(at..wanted.end), true);
        }
        // A chunk larger than a window comes a window at a time: a read's own bytes come room or
        // not, and a chunk of gigabytes would take them all.
        let hinted_end =
            hint.map_or(wanted.end, |h| h.end.min(at.saturating_add(self.inner.largest_window)).max(wanted.end));
        let Some((run_start, follow)) = run else {
            return self.pieces(version, size, at..hinted_end);
        };
        // A read further behind its run's readers than bytes are kept for them (a pool's slow
        // thread) gets a GET of its own, a window ahead of it alone: lanes there would follow the
        // run, whose readers are past them, so their bytes would be dropped as they came, before
        // it read them; and its next reads of the chunk, unhinted, go on in that GET.
        if at.saturating_add(self.inner.kept_behind()) < follow.frontier() {
            return vec![planned(version, size, at, size, hinted_end)];
        }
        // Back to the start of the run, over bytes nobody fetches yet (a neighbour's chunk that
        // a slower thread of the pool reads next).
        // Not further back than such a pool reads, though: bytes before that were read already
        // (and dropped to make room).
        let before = version.segments.range(..=at).next_back().map_or(0, |(_, s)| s.end().min(at));
        let pool = POOL.saturating_mul(hinted_end - at).saturating_add(NEAR);
        let from = before.max(run_start).max(at.saturating_sub(pool)).min(at);
        let rest = planned(version, size, from, size, size).range;
        let mut plans = lanes(rest, follow);
        // The lane holding the read's first byte comes first, the read's own: what it waits for
        // comes without waiting for room.
        let own = plans.iter().position(|lane| lane.range.contains(&at)).unwrap_or(0);
        plans.swap(0, own);
        plans[0].wanted_end = hinted_end.min(plans[0].range.end);
        plans[0].kind = Kind::Demand;
        plans
    }
}

impl Fetcher {
    /// A read's own bytes, `range` (its chunk, when the view hinted it), as up to [`PIECES`] GETs
    /// at once of [`PIECE`] bytes at least: a connection brings a few MiB no faster than its round
    /// trip and its pace allow (4 MiB at 20 MB/s is 0.2 s, at 90 MB/s 45 ms), so a chunk this
    /// large comes in a quarter of the time in pieces, and a reader going through chunks in order
    /// (`cat`) waits less for its first, before its run's lanes begin. Pieces end where bytes
    /// fetched already begin.
    ///
    /// The pieces take their requests now, all at once, and no more than leave a quarter of the
    /// requests free: pieces asked for one after another would find the version replaced
    /// meanwhile and fail a reader in the middle of a chunk whose first bytes it was served, and
    /// one chunk would keep every other read waiting. Where fewer are free, the range is one GET,
    /// waiting for its request as any.
    pub(super) fn pieces(&self, version: &Version, size: u64, range: Range<u64>) -> Vec<Plan> {
        let len = range.end.min(size).saturating_sub(range.start);
        let spare = self.inner.requests.available_permits().saturating_sub(self.inner.max_requests.div_ceil(4));
        let mut count = (len / PIECE).clamp(1, PIECES).min(spare as u64);
        let mut permits = match count > 1 {
            true => self.inner.requests.clone().try_acquire_many_owned(count as u32).ok(),
            false => None,
        };
        if permits.is_none() {
            count = 1;
        }
        let group = permits.as_ref().map(|_| Arc::new(Group::default()));
        let piece = len.div_ceil(count).max(1);
        let mut plans = Vec::new();
        let mut start = range.start;
        while start < range.end.min(size) {
            let plan = planned(version, size, start, start.saturating_add(piece).min(range.end), range.end);
            let permit = permits.as_mut().and_then(|permits| permits.split(1));
            start = plan.range.end;
            plans.push(Plan { group: group.clone(), permit, ..plan });
            // Bytes fetched already begin there: the read goes on in them, and plans again past them.
            if not_fetched_from(version, start) != start {
                break;
            }
        }
        plans
    }
}

/// `range` as [`LANES`] GETs at once of [`LANE`] bytes at least, each fetched a window ahead of
/// the readers of the run they follow.
pub(super) fn lanes(range: Range<u64>, follows: Arc<Follow>) -> Vec<Plan> {
    // As many lanes of [`LANE`] as fit, [`LANES`] at most, the bytes left over shared among them:
    // a lane of the few bytes past the last (a shard's index) would be a GET for nothing.
    let len = range.end - range.start;
    let lane = len.div_ceil((len / LANE).clamp(1, LANES));
    let starts = (range.start..range.end).step_by(lane as usize);
    let plans = starts.map(|start| {
        let end = range.end.min(start + lane);
        let follows = Some(follows.clone());
        Plan { range: start..end, wanted_end: start, follows, kind: Kind::Ahead, group: None, permit: None }
    });
    plans.collect()
}

/// The first byte from `at` on that no segment of `version` holds or brings.
pub(super) fn not_fetched_from(version: &Version, mut at: u64) -> u64 {
    while let Some(segment) = version.segments.range(..=at).next_back().map(|(_, s)| s).filter(|s| s.covers(at)) {
        at = segment.end();
    }
    at
}

/// What to fetch of an object of at most [`SMALL_OBJECT`] bytes for a read (or a prefetch) of
/// `first`, when nothing of it was fetched up to there: all of it up to the first bytes fetched,
/// in one GET (a shard of small chunks: its chunks and index at once). But where nothing of it
/// was fetched at all, a read of its end (a shard's index, a zip's central directory) gets a GET
/// of its own, so that it waits a round trip, not for every byte before it: a lookup of a chunk
/// directory, or of any chunk of a shard fetched ahead, waits on that shard's index, and every
/// reader of paths below it on that lookup. The rest comes in a GET beside it `with_rest` (a
/// read: chunks are read next), not for a prefetch, which asks for what it wants (a listing's:
/// the index alone).
pub(super) fn small_object(version: &Version, size: u64, first: &Range<u64>, with_rest: bool) -> Vec<Plan> {
    if version.segments.is_empty() && first.start >= TAIL_FIRST && first.end == size {
        let mut plans = vec![planned(version, size, first.start, size, size)];
        if with_rest {
            plans.push(Plan { kind: Kind::Ahead, ..planned(version, size, 0, first.start, first.start) });
        }
        return plans;
    }
    vec![planned(version, size, 0, size, size)]
}

/// `start..end` (within `size`) cut short where the next segment of `version` starts: segments
/// never hold the same bytes.
pub(super) fn planned(version: &Version, size: u64, start: u64, end: u64, wanted_end: u64) -> Plan {
    let mut end = end.min(size);
    if let Some((&next, _)) = version.segments.range(start + 1..).next() {
        end = end.min(next);
    }
    // Nor where one that begins before, whose first bytes were dropped, holds bytes again.
    if let Some((_, before)) = version.segments.range(..=start).next_back()
        && before.held_from() > start
    {
        end = end.min(before.held_from());
    }
    debug_assert!(start < end, "a segment of {start}..{end}");
    Plan {
        range: start..end,
        wanted_end: wanted_end.min(end),
        follows: None,
        kind: Kind::Demand,
        group: None,
        permit: None,
    }
}
