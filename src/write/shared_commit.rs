//! Commits into a shard that other machines write at the same time (an object store: every
//! commit is a new shard version, put only over the version read). Were each machine to read the
//! shard, rewrite it and try again whenever another got there first, N machines would upload
//! about N^2/2 shards and the last could wait through N failed tries. Instead they take turns
//! through the store's [`Exchange`], in `__shardfs/exchange/<shard key>/`:
//!
//! - **lease**: a committer first creates `lease` (only where there is none). Its holder reads
//!   the shard, folds in the waiting deltas (at most [`MOST_NOTED`], oldest first) and its own
//!   changes, puts the shard over the version read, removes the deltas it folded, and removes the
//!   lease: its writer waits for that round alone, and deltas still waiting are folded by their
//!   own waiters, each taking the lease in turn. Uncontended, that is the commit of
//!   old plus the lease's two requests and the two reads below.
//! - **delta**: a committer that finds the lease held uploads its changes as an immutable
//!   `delta-<time>-<n>` object (about its own chunks' bytes, never the shard) and waits. Its
//!   commit is done when its delta is gone: a delta is removed only once a stored shard version
//!   holds it. When the lease is gone it takes the lease itself; when the lease has not changed
//!   for [`LEASE_TIMEOUT`] (its holder died or stalled) it takes it over, replacing it only at
//!   the version it saw, so that one waiter does. Over a shard the store extends by copy
//!   ([`super::extend`]), a committer that finds the lease held **queues** instead: it uploads
//!   nothing until it holds the lease, so that its chunks cross the network once.
//! - **queued**: a queued committer says so with an empty `queued-<holder>` marker, removed when
//!   it leaves the queue. A committer that finds [`QUEUE_LENGTH`] waiting already (queued, or as
//!   deltas) waits as a delta at once: queued committers ask for the lease often, and a queue
//!   longer than a few turns is mostly given up on anyway.
//! - **rejected**: a delta its holder cannot read (damaged, made for another layout), or one that
//!   waited past its [`lifetime`] by the server's clock (its writer is gone), is left out, and a
//!   `rejected-<delta>` marker saying why makes its waiter's commit fail rather than succeed.
//! - **note**: each shard version written here carries, in the same atomic PUT, a note naming the
//!   deltas it holds that still existed. A holder killed between its PUT and its removals leaves
//!   deltas the shard already holds; the next holder finds them in the note and removes them
//!   rather than fold them again over newer writes. A holder reads the note before it lists the
//!   deltas, so every delta named in the note and not listed is gone for good. The note also
//!   names the last few holders whose own changes a version holds, so that a holder whose PUT's
//!   answer was lost can tell whether it was stored; one stalled past that many versions finds a
//!   `stored-<holder>` marker instead ([`super::lease`]).
//!
//! Every shard version in the store is a whole valid shard, written by one conditional PUT: a
//! reader that knows nothing of this sees the old shard or the new one. The lease only keeps
//! machines from uploading shards in vain; correctness rests on the PUT's condition, so a holder
//! that stalled past its lease and wakes loses its PUT and reads again. Contention costs time,
//! never an error. Deltas are folded oldest first by the server's clock (their listed
//! `Last-Modified`, not the names their writers' clocks gave them), and a holder's own changes
//! last: a delta waiting in the store was written before the commit that finds it. Once a stored
//! version holds a commit's own changes, nothing after fails it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::apply::{WhenEmpty, apply_levels, open_shard, read_index};
use super::delta;
use super::error::CommitError;
use super::lease::{self, DOUBT, HOLDER, LEASE, Lease, STORED, WAITER};
use super::shard::Current;
use super::shard::{Committed, NestedChanges, Outcome};
use crate::format::shard_index::IndexSpec;
use crate::metrics;
use crate::store::exchange::{EXCHANGE_DIR, Exchange, Listed, Noted, Version};
use crate::store::world::{World, both, each_at_once};
use crate::store::{self, Object, Store, join, lock};

/// How a delta's name starts.
const DELTA: &str = "delta-";
/// How the name of the marker of a rejected delta starts (then the delta's name).
const REJECTED: &str = "rejected-";
/// How the name of a queued committer's marker starts (then its holder's name).
const QUEUED: &str = "queued-";
/// A lease whose version has not changed for this long is taken over: its holder died or stalled.
pub const LEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a round reads a shard replaced under it before the commit fails.
const READS: u32 = 16;
/// How often a waiter that took the lease may fail to fold before its commit fails.
const HOLDS: u32 = 3;
/// How long a waiter waits before asking whether its delta was folded (or the lease is free);
/// the pause doubles with each question (a queued committer's every other question: it queues
/// for at most [`QUEUE_PATIENCE`] or [`QUEUE_TURNS`]) up to [`LONGEST_POLL`].
const POLL: Duration = Duration::from_millis(20);
/// The longest pause between a waiter's questions: a thousand machines waiting on one shard ask
/// about two thousand times a second, under what an object store serves a prefix (S3: 5,500
/// reads a second), while a short wait is noticed within tens of milliseconds.
const LONGEST_POLL: Duration = Duration::from_secs(1);
/// How the pauses between a waiter's questions grow.
#[derive(Clone, Copy)]
struct Pace {
    /// The pause doubles every this many questions.
    doubling: u32,
    /// The longest pause.
    longest: Duration,
}

/// The pace of a waiter among many: its pause doubles with each question, up to
/// [`LONGEST_POLL`].
const CROWD: Pace = Pace { doubling: 1, longest: LONGEST_POLL };

/// The pace of a waiter among fewer than [`QUEUE_LENGTH`] (queued, or as deltas): its pause
/// doubles with each question, up to 320 ms, so that a delta folded is seen within tens of
/// milliseconds to a few hundred, where a waiter among many may take up to a second (eight
/// mounts writing one array waited on their last deltas for 0.4 s on average that way).
const FEW: Pace = Pace { doubling: 1, longest: Duration::from_millis(320) };

/// The pace of a queued committer: up to [`FEW`]'s longest pause, doubled every other question
/// (its turn is taken soon after the last; at most [`QUEUE_LENGTH`] queue).
const IN_QUEUE: Pace = Pace { doubling: 2, ..FEW };

/// How many turns a waiter among few sees others take, its delta still there, before it asks at
/// [`CROWD`]'s pace: each holder folds every delta it listed (up to [`MOST_NOTED`]), so a delta
/// that waits through two turns waits behind many (a thousand machines that all found few
/// waiting, arriving at once, would otherwise go on asking about 6,000 times a second: two
/// requests every 320 ms each).
const CROWDED_TURNS: u32 = 2;

impl Pace {
    /// The pace of a waiter that found `waiting` others waiting for the lease (queued, or as
    /// deltas): among few, [`FEW`]; among more, its pause doubles with each question, up to 40
    /// ms for each waiter (at least [`FEW`]'s, at most [`LONGEST_POLL`]), so that the waiters
    /// of one shard ask (twice a question) about fifty times a second in all, a thousand at most.
    fn of(waiting: usize) -> Pace {
        match waiting < QUEUE_LENGTH {
            true => FEW,
            false => {
                let longest = (POLL * 2 * waiting as u32).clamp(FEW.longest, LONGEST_POLL);
                Pace { doubling: 1, longest }
            }
        }
    }
}

/// How long a holder takes to fold each delta, about (forty to a round of a few round trips): a
/// waiter that found N deltas waiting asks no more often than every N times this, so that many
/// waiters do not ask in vain.
const PER_DELTA: Duration = Duration::from_millis(5);
/// How long a committer queues for its turn before it uploads its changes as a delta instead:
/// queued commits take one round each, deltas are folded forty to a round, so where many
/// machines wait (each queued round takes a few round trips) the queue would grow without end.
const QUEUE_PATIENCE: Duration = Duration::from_secs(2);
/// How many turns a queued committer sees others take before it waits as a delta instead: where
/// that many are ahead of it, its chunks folded in a holder's round cost less than its own turn.
const QUEUE_TURNS: u32 = 4;
/// How many committers may wait for a shard's lease (queued, or as deltas) where one more still
/// queues; past it, it waits as a delta at once. Queued committers ask for the lease every 20
/// ms at first: a thousand arriving at a shard within a second, all queued, asked more than S3
/// serves a prefix (5,500 reads a second) and met SlowDown. Eight: each of eight machines
/// writing one shard at once still queues.
const QUEUE_LENGTH: usize = 8;
/// The most delta names a shard version's note holds (44 bytes each: S3 keeps at most 2 KiB of
/// user metadata, with [`HOLDERS_NOTED`] holders' names): those it takes in, and those it held
/// before that are still there. More deltas wait for the holder's next round.
const MOST_NOTED: usize = 36;
/// How many of the latest holders whose own changes a version holds its note names (this one's,
/// then those of the versions before): a holder whose PUT was refused finds out whether a try
/// whose answer was lost stored it after all (past that, from a [`STORED`] marker).
const HOLDERS_NOTED: usize = 4;

/// Commits `changes` (innermost chunks by their entry at every level) into the shard at `key`,
/// laid out as `specs` say, taking turns with other machines through `exchange`.
pub fn commit(
    store: &dyn Store,
    exchange: &dyn Exchange,
    key: &str,
    specs: &[IndexSpec],
    changes: &NestedChanges,
) -> Result<Committed, CommitError> {
    let world = exchange.world();
    let turns = Turns { store, exchange, world, key, specs, dir: join(EXCHANGE_DIR, key) };
    let (lease, holder) = (turns.lease(), turns.unique_name(HOLDER));
    let body = lease::body(&holder, world.random(), &[]);
    let asked = world.now();
    // The lease is asked for while the shard is opened, and its note and exchange directory
    // read: uncontended, it costs no round trip. The shard's index (and, where the shard is
    // rewritten, its chunks) is read on unless the lease was refused by then: a committer that
    // waits needs the shard's size alone. Where leases are given up by emptying them, a free
    // lease is the rule and its create fails: the index is read all the same.
    let refused = std::sync::OnceLock::new();
    let (noted, (taken, found)) = both(
        world,
        || turns.noted(),
        || {
            both(
                world,
                || {
                    let taken = exchange.create(&lease, &body);
                    let _ = refused.set(!matches!(taken, Ok(Some(_))));
                    taken
                },
                || match open_shard(store, key)? {
                    file if refused.get() == Some(&true) && exchange.removes_at() => Ok(Found::Opened(file)),
                    file => turns.current(file).map(Found::Read),
                },
            )
        },
    );
    let seen = |noted: Result<_, store::Error>, current: Result<_, CommitError>| -> Result<Seen, CommitError> {
        let (note, listed) = noted?;
        Ok((note, listed, current?))
    };
    match taken? {
        Some(tag) => {
            // Renewed as of the asking: the answer may have come long after the server stored it.
            let lease = Lease { tag, renewed: asked, doubts: Vec::new() };
            let seen = seen(noted, found.and_then(|found| turns.read_found(found)));
            turns.hold_changes(lease, &holder, changes, Some(seen))
        }
        // Given up where leases are not removed: free, taken at once. What was listed before
        // holds the free lease, whose time is too old to tell which deltas waited too long by.
        None if let Some(lease) = turns.take_free(&holder)? => {
            let seen =
                seen(noted, found.and_then(|found| turns.read_found(found))).and_then(|(note, listed, current)| {
                    match ages_need_a_fresh_listing(exchange, &listed) {
                        true => Ok((note, turns.patiently(|| exchange.list(&turns.dir))?, current)),
                        false => Ok((note, listed, current)),
                    }
                });
            turns.hold_changes(lease, &holder, changes, Some(seen))
        }
        None => match (noted, found) {
            (Ok((_, listed)), Ok(found)) => {
                let ahead = listed.iter().filter(|l| l.name.starts_with(DELTA)).count();
                let queued = listed.iter().filter(|l| l.name.starts_with(QUEUED) && !expired(l, &listed)).count();
                match found.len() {
                    Some(len) if ahead + queued < QUEUE_LENGTH && turns.extends(len) => turns.queue(changes),
                    _ => turns.wait(changes, PER_DELTA * ahead as u32, Pace::of(ahead + queued)),
                }
            }
            _ => turns.wait(changes, Duration::ZERO, CROWD),
        },
    }
}

/// The shard as a committer arriving found it: read (its index), where it took the lease; opened
/// alone, where it waits. `None`: there is none.
enum Found {
    Read(Option<Current>),
    Opened(Option<Box<dyn Object>>),
}

impl Found {
    fn len(&self) -> Option<u64> {
        match self {
            Found::Read(current) => current.as_ref().map(Current::len),
            Found::Opened(file) => file.as_ref().map(|file| file.attr().size),
        }
    }
}

/// What a holder reads before folding: the shard's note and the version it is of, the names in
/// the shard's exchange directory, and the shard.
type Seen = (Option<Noted>, Vec<Listed>, Option<Current>);

/// A lease taken, with what its holder's first round reads where that was read while it was
/// taken.
type Turn = (Lease, Option<Result<Seen, CommitError>>);

/// Deltas read: their bytes by name, in the order they are folded.
type Deltas = std::collections::BTreeMap<String, Vec<u8>>;

/// What a holder must see stored before its turn ends.
#[derive(Clone, Copy)]
enum Mine<'a> {
    /// Its own changes, folded last into the first round.
    Changes(&'a NestedChanges<'a>),
    /// Its delta, uploaded while it waited, by name.
    Delta(&'a str),
}

/// One shard's turn-taking.
struct Turns<'a> {
    store: &'a dyn Store,
    exchange: &'a dyn Exchange,
    world: &'a dyn World,
    key: &'a str,
    specs: &'a [IndexSpec],
    /// The shard's exchange directory.
    dir: String,
}

impl Turns<'_> {
    fn lease(&self) -> String {
        join(&self.dir, LEASE)
    }

    /// `ask` again after a growing pause while the server fails it (a 503 its client gave up on,
    /// an answer lost), a bounded number of times: a passing fault costs time, not the commit.
    fn patiently<T>(&self, ask: impl Fn() -> Result<T, store::Error>) -> Result<T, store::Error> {
        let mut tries = 0;
        loop {
            tries += 1;
            match ask() {
                Err(e @ store::Error::Io { .. }) if tries < READS => {
                    log::warn!("{e}; asked again");
                    self.world.sleep(self.world.backoff(tries.min(6)));
                }
                done => return done,
            }
        }
    }

    /// The pause before question `polls` of a waiter at `pace`: [`POLL`] doubled every
    /// `pace.doubling` questions, at least `least`, at most `pace.longest`, give or take half, so
    /// that waiters fall out of step.
    fn poll(&self, polls: u32, pace: Pace, least: Duration) -> Duration {
        let doubled = POLL * 2u32.pow(((polls - 1) / pace.doubling).min(8));
        let mean = doubled.max(least).min(pace.longest).as_millis() as u64;
        Duration::from_millis(mean / 2 + self.world.random() % (mean + 1))
    }

    /// How long ago `then` (a [`World::now`]) was.
    fn since(&self, then: Duration) -> Duration {
        self.world.now().saturating_sub(then)
    }

    /// A name no other commit uses, that sorts after every name this process made before:
    /// `prefix`, this machine's time in nanoseconds and a random number.
    fn unique_name(&self, prefix: &str) -> String {
        let name = format!("{prefix}{:020}-{:016x}", self.world.wall_nanos(), self.world.random());
        // Which machine a name in the exchange was, for whoever reads the logs after a crash.
        log::debug!("{}: commits as {name}", self.store.describe(self.key));
        name
    }

    /// Commits `changes` as holder `me` of `lease`; where the lease is taken over before a stored
    /// version holds them, as a waiter.
    fn hold_changes(
        &self,
        lease: Lease,
        me: &str,
        changes: &NestedChanges,
        seen: Option<Result<Seen, CommitError>>,
    ) -> Result<Committed, CommitError> {
        match self.hold(lease, me, Mine::Changes(changes), seen)? {
            Some(committed) => Ok(committed),
            None => {
                log::info!("{}: its commit lease was taken over; waiting as a delta", self.store.describe(self.key));
                self.wait(changes, Duration::ZERO, CROWD)
            }
        }
    }

    /// Folds as holder `me` of the lease, then gives the lease up while it is still this
    /// holder's (a lease left behind by a failure, or with holders in doubt, expires). `None`:
    /// the lease was taken over before a stored version held this holder's own changes.
    fn hold(
        &self,
        lease: Lease,
        me: &str,
        mine: Mine,
        seen: Option<Result<Seen, CommitError>>,
    ) -> Result<Option<Committed>, CommitError> {
        let mut lease = Some(lease);
        let result = self.fold(&mut lease, me, mine, seen);
        let mut taken_over = lease.is_none();
        // Given up only at the version this holder stored, by a condition the server decides
        // ([`lease`]). Holders in doubt not yet settled go to whoever takes it over next.
        if let Some(lease) = lease.filter(|lease| lease.doubts.is_empty()) {
            let given_up = match self.exchange.removes_at() {
                true => self.exchange.remove_at(&self.lease(), &lease.tag).map(|()| true),
                false => self.exchange.replace(&self.lease(), lease::FREE, &lease.tag).map(|tag| tag.is_some()),
            };
            match given_up {
                Ok(true) => {}
                Ok(false) | Err(store::Error::Changed(_)) => taken_over = true,
                Err(e) => log::warn!("{}: {e}; the lease expires instead", self.store.describe(self.key)),
            }
        }
        if taken_over && matches!(mine, Mine::Changes(_)) {
            // The holder that took it over may have marked this one stored: it is done.
            let _ = self.exchange.remove(&join(&self.dir, &format!("{STORED}{me}")));
        }
        result
    }

    /// True when a commit over the shard, `len` bytes long, sends only its own chunks
    /// ([`super::extend`]): the store copies what it keeps, and the shard is big enough for it.
    fn extends(&self, len: u64) -> bool {
        super::extend::kept(self.store, &self.specs[0], len).is_some()
    }

    /// Waits for the lease and commits `changes` under it: where the shard is extended, a
    /// commit's chunks cross the network once this way, where a delta would send them twice (as
    /// the delta, then inside the holder's version). Past [`QUEUE_PATIENCE`], it waits as a delta.
    fn queue(&self, changes: &NestedChanges) -> Result<Committed, CommitError> {
        log::info!("{}: its lease is held; waiting for its turn", self.store.describe(self.key));
        metrics::lease_wait("queue");
        let holder = self.unique_name(HOLDER);
        let marker = join(&self.dir, &format!("{QUEUED}{holder}"));
        let mut seen: Option<(String, Duration)> = None;
        let (mut polls, since, mut missed) = (0u32, self.world.now(), 0u32);
        // Marked while it waits for its first question: unmarked, it is only not counted, and
        // a marker left behind goes with a delta's lifetime.
        let (marked, ()) = both(
            self.world,
            || self.exchange.create(&marker, b""),
            || self.world.sleep(self.poll(1, IN_QUEUE, Duration::ZERO)),
        );
        if let Err(e) = marked {
            log::debug!("{e}; queued unmarked");
        }
        let unmark = || {
            if let Err(e) = self.exchange.remove(&marker) {
                log::debug!("{e}; left for a holder to sweep");
            }
        };
        loop {
            polls += 1;
            // Each turn is taken soon after the last: asked after 20 ms, twice as long every
            // other question (a thousand machines queued at once asking every 20 ms were most of
            // S3's 5,500 reads a second of a prefix, and met SlowDown).
            if polls > 1 {
                self.world.sleep(self.poll(polls, IN_QUEUE, Duration::ZERO));
            }
            let before = seen.as_ref().map(|(tag, _)| tag.clone());
            let Some((lease, read)) = self.take_turn(&holder, &mut seen).inspect_err(|_| unmark())? else {
                // Another took a turn: many are queued.
                if before.is_some() && seen.as_ref().map(|(tag, _)| tag) != before.as_ref() {
                    missed += 1;
                }
                if self.since(since) > QUEUE_PATIENCE || missed >= QUEUE_TURNS {
                    // It queued where few waited: as a delta it asks as one of few until it sees
                    // the lease change hands [`CROWDED_TURNS`] times more.
                    return both(self.world, unmark, || self.wait(changes, Duration::ZERO, FEW)).1;
                }
                continue;
            };
            if read.is_none() {
                self.exchange.forget(self.key);
            }
            return both(self.world, unmark, || self.hold_changes(lease, &holder, changes, read)).1;
        }
    }

    /// Uploads `changes` as a delta and waits until a stored shard version holds it, taking the
    /// lease when it is free or expired. `least`: the shortest pause between its questions;
    /// `pace`: how they are spaced.
    fn wait(&self, changes: &NestedChanges, least: Duration, pace: Pace) -> Result<Committed, CommitError> {
        let name = self.unique_name(DELTA);
        let delta_key = join(&self.dir, &name);
        log::info!("{}: its lease is held; waiting as {name}", self.store.describe(self.key));
        metrics::lease_wait("delta");
        // Never made again after a failure: the first try may have stored it, and a holder folded
        // and removed it since (made again, it would be folded twice). Found there, it is this very
        // delta (its name is unique); not found, the commit fails, its writes kept for later.
        if let Err(e) = self.exchange.create(&delta_key, &delta::encode(changes))
            && self.patiently(|| self.exchange.head(&delta_key))?.is_none()
        {
            return Err(e.into());
        }
        // Not a holder's name: a waiter's own changes are in its delta, never in doubt.
        let holder = self.unique_name(WAITER);
        let mut seen: Option<(String, Duration)> = None;
        let (mut polls, mut failed, mut turns) = (0u32, 0u32, 0u32);
        loop {
            polls += 1;
            let pace = if turns >= CROWDED_TURNS { CROWD } else { pace };
            self.world.sleep(self.poll(polls, pace, least));
            if self.patiently(|| self.exchange.head(&delta_key))?.is_none() {
                self.exchange.forget(self.key);
                return self.folded(&name);
            }
            let before = seen.as_ref().map(|(tag, _)| tag.clone());
            let Some((lease, read)) = self.take_turn(&holder, &mut seen)? else {
                if before.is_some() && seen.as_ref().map(|(tag, _)| tag) != before.as_ref() {
                    turns += 1;
                }
                continue;
            };
            let held = self.hold(lease, &holder, Mine::Delta(&name), read);
            self.exchange.forget(self.key);
            // Done only once the delta is gone, whatever the rounds said: a holder taken over
            // mid-fold may not have reached it, and one that failed may have folded it.
            if self.patiently(|| self.exchange.head(&delta_key))?.is_none() {
                return self.folded(&name);
            }
            if let Err(e) = held {
                failed += 1;
                if failed >= HOLDS {
                    return Err(e);
                }
                log::warn!("{}: {e}; its delta waits on", self.store.describe(self.key));
            }
        }
    }

    /// Takes the lease for `holder` when there is none or it is free, or when it has not changed
    /// for [`LEASE_TIMEOUT`] since first `seen` (its holder died or stalled), with that holder
    /// and its doubts as this one's doubts; `None` when another holds it. Where there was none,
    /// with what its first round reads, read while the lease was asked for.
    fn take_turn(&self, holder: &str, seen: &mut Option<(String, Duration)>) -> Result<Option<Turn>, CommitError> {
        let lease = self.lease();
        let taken = |lease: Option<Lease>| lease.map(|lease| (lease, None));
        Ok(match self.patiently(|| self.exchange.head(&lease))? {
            None => {
                // Its last holder gave it up after storing its version: the shard is opened,
                // and its note and exchange directory read, while the lease is created, and the
                // index read once it is (a round trip saved at each turn of a queue; where
                // another committer creates it first, a HEAD and a listing made in vain).
                let (body, asked) = (lease::body(holder, self.world.random(), &[]), self.world.now());
                self.exchange.forget(self.key);
                let (noted, taken) = both(
                    self.world,
                    || self.noted(),
                    || {
                        let (created, opened) = both(
                            self.world,
                            || self.patiently(|| self.exchange.create(&lease, &body)),
                            || open_shard(self.store, self.key),
                        );
                        created.map(|tag| tag.map(|tag| (tag, opened.and_then(|file| self.current(file)))))
                    },
                );
                taken?.map(|(tag, current)| {
                    let read = noted.map_err(CommitError::from).and_then(|(note, listed)| Ok((note, listed, current?)));
                    (Lease { tag, renewed: asked, doubts: Vec::new() }, Some(read))
                })
            }
            Some(free) if lease::free(&free) => taken(self.take(holder, &free.tag, Vec::new())?),
            Some(Version { tag, .. }) => match seen {
                Some((old, since)) if *old == tag && self.since(*since) >= LEASE_TIMEOUT => {
                    log::warn!("{}: its commit lease expired; taking it over", self.store.describe(self.key));
                    metrics::lease_takeover();
                    // Read after its tag: a body of a later version only makes the replacement
                    // below fail.
                    let Some(was) = self.patiently(|| self.exchange.read(&lease))? else { return Ok(None) };
                    taken(self.take(holder, &tag, lease::inherited(&was))?)
                }
                Some((old, _)) if *old == tag => None,
                _ => {
                    *seen = Some((tag, self.world.now()));
                    None
                }
            },
        })
    }

    /// Replaces the lease at version `tag` with one `holder` holds with `doubts`; `None` when it
    /// is at another version.
    fn take(&self, holder: &str, tag: &str, doubts: Vec<String>) -> Result<Option<Lease>, CommitError> {
        let (body, asked) = (lease::body(holder, self.world.random(), &doubts), self.world.now());
        let taken = self.patiently(|| self.exchange.replace(&self.lease(), &body, tag))?;
        Ok(taken.map(|tag| Lease { tag, renewed: asked, doubts }))
    }

    /// The lease for `holder` where leases are given up by replacing them and this one is free
    /// ([`lease`]): asked by a committer whose lease could not be created.
    fn take_free(&self, holder: &str) -> Result<Option<Lease>, CommitError> {
        if self.exchange.removes_at() {
            return Ok(None);
        }
        match self.patiently(|| self.exchange.head(&self.lease()))? {
            Some(free) if lease::free(&free) => self.take(holder, &free.tag, Vec::new()),
            _ => Ok(None),
        }
    }

    /// What became of delta `name`, now gone: folded into a stored version, or rejected by the
    /// holder that read it (its bytes were damaged, or made for another layout), which leaves a
    /// marker saying why.
    fn folded(&self, name: &str) -> Result<Committed, CommitError> {
        let marker = join(&self.dir, &format!("{REJECTED}{name}"));
        let mut tries = 0;
        // Its delta is gone: an error now would have its writer write again what is stored.
        let read = loop {
            tries += 1;
            match self.exchange.read(&marker) {
                Err(e) if tries < READS => {
                    log::warn!("{e}; asked again");
                    self.world.sleep(self.world.backoff(tries.min(6)));
                }
                read => break read?,
            }
        };
        match read {
            None => Ok(Outcome::Rewritten.into()),
            Some(why) => {
                let _ = self.exchange.remove(&marker);
                Err(CommitError::Damaged(format!(
                    "{}: {}; its chunks were not committed",
                    self.store.describe(&join(&self.dir, name)),
                    String::from_utf8_lossy(&why)
                )))
            }
        }
    }

    /// Under the lease: folds the waiting deltas (oldest first, at most [`MOST_NOTED`] to a
    /// round) and this commit's own changes into the shard, and removes the deltas folded, in
    /// rounds until a stored version holds `mine`; then it gives the lease up, and the deltas
    /// still waiting are folded by their own waiters, who take it in turn. `seen`: what was read
    /// already for the first round. Once a stored version holds `mine`, a later round's failure
    /// is no failure of this commit: its writer is told it is done (told EIO, it would write its
    /// chunks again later, over whatever others wrote since).
    fn fold(
        &self,
        lease: &mut Option<Lease>,
        me: &str,
        mine: Mine,
        seen: Option<Result<Seen, CommitError>>,
    ) -> Result<Option<Committed>, CommitError> {
        let mut stored = None;
        match self.rounds(lease, me, mine, seen, &mut stored) {
            Err(e) if let Some(committed) = stored => {
                log::warn!("{}: {e}; after this commit was stored, others' deltas wait", self.store.describe(self.key));
                Ok(Some(committed))
            }
            done => done,
        }
    }

    /// [`Turns::fold`]'s rounds; `last`: what the round holding `mine` stored. `me` is named in
    /// the note of the version holding `mine`'s own changes.
    fn rounds(
        &self,
        lease: &mut Option<Lease>,
        me: &str,
        mine: Mine,
        mut seen: Option<Result<Seen, CommitError>>,
        last: &mut Option<Committed>,
    ) -> Result<Option<Committed>, CommitError> {
        let (mut own, own_delta) = match mine {
            Mine::Changes(changes) => (Some(changes), None),
            Mine::Delta(name) => (None, Some(name)),
        };
        let mut attempt = 0;
        // Whether a PUT of `own` was tried: one more is made only by a holder that still holds
        // the lease (one that took it over has settled this holder's doubt, and would not know).
        let mut tried_own = false;
        // The version (`None`: no shard) a PUT of this holder's was refused over: once the shard
        // is read at another one, that PUT's round settles the holders in doubt as a stored one
        // would (the version it went over is gone, whoever replaced it), even where the answer
        // of its own PUT was lost and its retry refused.
        let mut refused_over: Option<Option<store::Stamp>> = None;
        loop {
            attempt += 1;
            let lock = self.store.lock(lock::slot(self.key))?;
            let (note, mut listed, current) = match seen.take().unwrap_or_else(|| self.read()) {
                Ok(seen) => seen,
                // Replaced between its HEAD and the read of its index (or a version gone, a 416),
                // or a passing fault: read again, after a growing pause, a bounded number of times.
                Err(CommitError::Store(store::Error::Changed(_) | store::Error::Io { .. })) if attempt < READS => {
                    self.exchange.forget(self.key);
                    drop(lock);
                    self.world.sleep(self.world.backoff(attempt.min(6)));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let current_stamp = current.as_ref().map(Current::stamp);
            if note.as_ref().map(|noted| noted.stamp) != current_stamp {
                // What this process knew of the shard was old, or it changed between the reads.
                self.exchange.forget(self.key);
                drop(lock);
                self.world.sleep(self.world.backoff(attempt.min(6)));
                continue;
            }
            // Which deltas waited too long is told by the server's time, the newest name listed
            // (see `expired`): the lease, listed after it was taken, or this holder's own queued
            // marker, made at most a queue's patience before. Where the listing was made while
            // the lease was being taken, lacks both, and a delta waits, the holder lists again:
            // a dead writer's delta listed alone would look fresh (markers alone need it only
            // where the server's time is not heard: `ages_need_a_fresh_listing`).
            let recent = |l: &Listed| l.name == LEASE || l.name.strip_prefix(QUEUED) == Some(me);
            if !listed.iter().any(recent) && ages_need_a_fresh_listing(self.exchange, &listed) {
                listed = self.patiently(|| self.exchange.list(&self.dir))?;
            }
            let held: HashSet<String> =
                note.as_ref().map(|n| n.note.split(' ').map(str::to_string).collect()).unwrap_or_default();
            // Deltas fold in the order the server stored them (one clock, where the machines'
            // may disagree), oldest first.
            let fresh = |listed: &[Listed]| -> Vec<String> {
                let still_held = listed.iter().filter(|l| held.contains(&l.name)).count();
                let mut fresh: Vec<&Listed> = listed
                    .iter()
                    .filter(|l| l.name.starts_with(DELTA) && !held.contains(&l.name) && !expired(l, listed))
                    .collect();
                fresh.sort_unstable_by(|a, b| (a.stored, &a.name).cmp(&(b.stored, &b.name)));
                fresh.truncate(MOST_NOTED.saturating_sub(still_held));
                fresh.into_iter().map(|l| l.name.clone()).collect()
            };
            let mut read = Deltas::new();
            if !fresh(&listed).is_empty() {
                // Others are committing: those whose deltas land while the first are read are
                // folded in this round too.
                let Some(first) = self.read_deltas(&fresh(&listed))? else { continue };
                read = first;
                listed = self.patiently(|| self.exchange.list(&self.dir))?;
            }
            let deltas: Vec<&str> = listed.iter().map(|l| l.name.as_str()).filter(|n| n.starts_with(DELTA)).collect();
            let fresh = fresh(&listed);
            let more: Vec<String> = fresh.iter().filter(|n| !read.contains_key(*n)).cloned().collect();
            let Some(more) = self.read_deltas(&more)? else { continue };
            read.extend(more);
            read.retain(|name, _| fresh.contains(name));
            let mut merged = NestedChanges::new();
            // A delta that waited past its lifetime is a dead writer's: folded weeks later, it
            // would bring back over newer writes what was never acknowledged.
            let mut rejected: Vec<(String, String)> = listed
                .iter()
                .filter(|l| l.name.starts_with(DELTA) && !held.contains(&l.name) && expired(l, &listed))
                .map(|l| {
                    log::warn!(
                        "{}: waited past {:?}; left out",
                        self.store.describe(&join(&self.dir, &l.name)),
                        lifetime()
                    );
                    (l.name.clone(), format!("its writer waited past {:?} and was taken for gone", lifetime()))
                })
                .collect();
            for name in &fresh {
                let Some(bytes) = read.get(name) else { continue };
                match delta::decode(bytes, self.specs) {
                    Ok(changes) => merged.extend(changes),
                    Err(why) => {
                        log::error!(
                            "{}: {why}; left out of the shard, and its writer told so",
                            self.store.describe(&join(&self.dir, name))
                        );
                        rejected.push((name.clone(), why));
                    }
                }
            }
            if let Some(own) = own {
                merged.extend(own.iter().map(|(path, c)| (path.clone(), c.as_deref().map(Cow::Borrowed))));
            }
            // A rejected delta is in no version's note: it is removed once its marker is stored.
            let is_rejected = |n: &str| rejected.iter().any(|(r, _)| r == n);
            let folded: Vec<&str> = deltas
                .iter()
                .copied()
                .filter(|n| held.contains(*n) || (read.contains_key(*n) && !is_rejected(n)))
                .collect();
            // Holders in doubt that the note of the version read names are marked stored.
            let read_note = note.as_ref().map_or("", |n| n.note.as_str());
            self.mark_stored(lease.as_mut(), &listed, read_note)?;
            if let Some(held) = lease.as_mut().filter(|_| refused_over.is_some_and(|over| over != current_stamp)) {
                held.doubts.clear();
            }
            // A holder in doubt is settled only by a version stored after its lease was taken
            // over: a round with nothing to fold still stores one (the version read again, with
            // a new nonce and note), or the lease is left with its doubts to expire, and the next
            // commit waits for that.
            let settles = lease.as_ref().is_some_and(|held| !held.doubts.is_empty());
            let mut committed = match merged.is_empty() && !settles {
                true => Committed::from(Outcome::Unchanged),
                false => {
                    // The holders named before this one's own changes carry on, latest first.
                    let holders =
                        own.map(|_| me).into_iter().chain(read_note.split(' ').filter(|n| n.starts_with(HOLDER)));
                    let noted: Vec<&str> = folded.iter().copied().chain(holders.take(HOLDERS_NOTED)).collect();
                    let note = noted.join(" ");
                    let note = Some((self.exchange, note.as_str()));
                    // Settled once this PUT is stored or refused, a holder in doubt leaves the
                    // lease; were an outside tool to delete the shard, its create could still land
                    // later, pushed out of the notes by the holders after. A marker keeps it in
                    // doubt for whoever reads a note that names it.
                    if let Some(held) = lease.as_ref().filter(|held| !held.doubts.is_empty()) {
                        self.linger(&held.doubts)?;
                    }
                    // Its own changes go up only from a holder whose lease no one took over before
                    // the read they go over: one that took it over then may have settled this
                    // holder's doubt already, and would not know of this PUT. Renewed after a
                    // PUT tried, or when held long enough that a waiter may have taken it over;
                    // so too by a holder that only folds others' deltas: its create, sent late
                    // where an outside tool deleted a shard of empty entries, would bring those
                    // deltas' chunks back over the removals made since. Renewed last before the
                    // PUT, and again while the renewal's answer came late: a renewal stored, then
                    // answered after the lease's time-out, is no lease held.
                    let stale = |lease: &Option<Lease>| {
                        lease.as_ref().is_some_and(|held| self.since(held.renewed) >= LEASE_TIMEOUT / 8)
                    };
                    let mut renewing = (own.is_some() && tried_own) || stale(lease);
                    while renewing {
                        if !self.renew(lease, me)? {
                            return Ok(None);
                        }
                        renewing = stale(lease);
                    }
                    tried_own |= own.is_some();
                    let put_at = (self.world.now(), self.exchange.server_time());
                    // A holder in doubt is settled only by a version stored: changes that leave a
                    // shard that is gone without chunks store one of empty entries then.
                    let when_empty = match settles {
                        true => WhenEmpty::StoreEmpty,
                        false => WhenEmpty::StoreNothing,
                    };
                    match apply_levels(self.store, self.key, self.specs, current, &merged, note, when_empty) {
                        // Nothing stored, so no condition checked that the shard is still the
                        // version read: deltas listed since (the second listing) may come from
                        // commits begun after another version was stored over it. Folded only
                        // once the shard is seen unchanged after them.
                        Ok(committed)
                            if committed.outcome == Outcome::Unchanged
                                && !read.is_empty()
                                && self.patiently(|| self.exchange.note(self.key))?.map(|noted| noted.stamp)
                                    != current_stamp =>
                        {
                            self.exchange.forget(self.key);
                            drop(lock);
                            continue;
                        }
                        Ok(committed) => committed,
                        Err(CommitError::Store(store::Error::Changed(_))) => {
                            // Replaced since it was read (or while its chunks were): what this
                            // process knew of it is old, and would be read again.
                            self.exchange.forget(self.key);
                            drop(lock);
                            // Stored by a try whose answer was lost: never applied twice, and it
                            // settles the holders in doubt as an answered one does.
                            if own.is_some() && self.stored_own(me, put_at)? {
                                if let Some(held) = lease.as_mut() {
                                    held.doubts.clear();
                                }
                                return Ok(Some(Outcome::Rewritten.into()));
                            }
                            refused_over = Some(current_stamp);
                            self.world.sleep(self.world.backoff(attempt.min(6)));
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            drop(lock);
            // Stored over the version read: a holder in doubt that its note did not name can no
            // longer store anything (its PUT, even one still on its way, was over a version no
            // longer there). A round that stores nothing settles none: a first PUT sent late may
            // yet land over the version it read (found by review, with a PUT landing 20 s late).
            if let Some(held) = lease.as_mut().filter(|_| committed.outcome != Outcome::Unchanged) {
                held.doubts.clear();
            }
            log::info!(
                "{}: committed with {} of the {} waiting deltas{}",
                self.store.describe(self.key),
                read.len(),
                deltas.len(),
                if own.is_some() { " and this mount's own changes" } else { "" }
            );
            // A rejected delta is removed once the marker that tells its writer so is stored (or
            // was, by a holder before); one whose marker failed is read again next round.
            let marked = each_at_once(self.world, &rejected, |(name, why)| {
                self.exchange.create(&join(&self.dir, &format!("{REJECTED}{name}")), why.as_bytes())
            });
            let removable: Vec<&str> = rejected
                .iter()
                .zip(marked)
                .filter(|(_, marked)| marked.is_ok())
                .map(|((name, _), _)| name.as_str())
                .chain(folded.iter().copied())
                .collect();
            // A marker no waiter (or holder) read within a delta's lifetime is a dead writer's.
            let heard = self.exchange.server_time();
            let unread: Vec<&str> =
                listed.iter().filter(|l| swept(l, &listed, heard)).map(|l| l.name.as_str()).collect();
            // Held by the version just written (or the one read): one left is removed by the next
            // holder.
            let removing: Vec<&str> = removable.iter().chain(&unread).copied().collect();
            for removed in each_at_once(self.world, &removing, |name| self.exchange.remove(&join(&self.dir, name))) {
                if let Err(e) = removed {
                    log::warn!("{e}; the next commit of the shard removes it");
                }
            }
            if !read.is_empty() {
                // Others' chunks changed too: the versions are not the mount's own change alone.
                committed.replaced = None;
            }
            if own.is_some() || last.is_none() {
                *last = Some(committed);
            }
            own = None;
            // Done once a stored version holds this commit's chunks: its writer's fsync waits for
            // no one else's round. Its own delta is held once folded (or rejected, its marker
            // stored), or once gone (a holder before this one folded it).
            let delta_done = own_delta.is_none_or(|name| removable.contains(&name) || !deltas.contains(&name));
            if delta_done {
                return Ok(last.clone());
            }
            // Taken over: whoever holds it now folds what is left, and gives it up.
            if lease.as_ref().is_some_and(|held| self.since(held.renewed) >= LEASE_TIMEOUT / 4)
                && !self.renew(lease, me)?
            {
                return Ok(last.clone());
            }
            attempt = 0;
        }
    }

    /// Stores the lease again, so that waiters see it alive: false (and `lease` gone) when it was
    /// taken over.
    fn renew(&self, lease: &mut Option<Lease>, me: &str) -> Result<bool, CommitError> {
        let Some(held) = lease.as_mut() else { return Ok(false) };
        let (body, asked) = (lease::body(me, self.world.random(), &held.doubts), self.world.now());
        match self.patiently(|| self.exchange.replace(&self.lease(), &body, &held.tag))? {
            Some(tag) => {
                (held.tag, held.renewed) = (tag, asked);
                Ok(true)
            }
            None => {
                *lease = None;
                Ok(false)
            }
        }
    }

    /// Before a PUT over the version whose note is `note`: marks each holder in doubt that the
    /// note names as stored, so that its name may leave the note, and settles it: its changes
    /// are stored, and it stores nothing more ([`super::lease`]). In doubt are those of `lease`
    /// and those a [`DOUBT`] marker `listed` names, whose marker goes once they are marked.
    fn mark_stored(&self, lease: Option<&mut Lease>, listed: &[Listed], note: &str) -> Result<(), CommitError> {
        let named = |d: &str| note.split(' ').any(|n| n == d);
        let lingering: Vec<&str> =
            listed.iter().filter_map(|l| l.name.strip_prefix(DOUBT)).filter(|d| named(d)).collect();
        let mut marking: Vec<&str> = lingering.clone();
        if let Some(held) = lease.as_ref() {
            marking.extend(held.doubts.iter().map(String::as_str).filter(|d| named(d) && !lingering.contains(d)));
        }
        let marked = each_at_once(self.world, &marking, |holder| {
            self.patiently(|| self.exchange.create(&join(&self.dir, &format!("{STORED}{holder}")), b""))
        });
        for marked in marked {
            marked?;
        }
        let unmarked = each_at_once(self.world, &lingering, |holder| {
            self.exchange.remove(&join(&self.dir, &format!("{DOUBT}{holder}")))
        });
        for removed in unmarked {
            if let Err(e) = removed {
                log::warn!("{e}; removed once a delta's lifetime is past");
            }
        }
        if let Some(held) = lease {
            held.doubts.retain(|d| !named(d));
        }
        Ok(())
    }

    /// Before a PUT that settles `doubts`: a [`DOUBT`] marker for each, so that a holder that
    /// later reads a note naming one marks it stored ([`super::lease`]).
    fn linger(&self, doubts: &[String]) -> Result<(), CommitError> {
        let made = each_at_once(self.world, doubts, |holder| {
            self.patiently(|| self.exchange.create(&join(&self.dir, &format!("{DOUBT}{holder}")), b""))
        });
        for made in made {
            made?;
        }
        Ok(())
    }

    /// After a PUT of this holder's own changes, begun at `put_at` (by its clock, and by the
    /// server's as far as it had heard), was refused: whether a try of it whose answer was lost
    /// stored them after all. The version's note names holder `me`, as do the notes of the next
    /// [`HOLDERS_NOTED`] versions; the holder that took the lease over left a [`STORED`] marker
    /// before that name left the note (read after the note, so that one of the two is found). A
    /// marker no one read is removed once a delta's [`lifetime`] is past by the server's clock: a
    /// holder stalled near that long cannot tell, and fails rather than apply its changes twice.
    fn stored_own(&self, me: &str, put_at: (Duration, Option<SystemTime>)) -> Result<bool, CommitError> {
        let note = self.patiently(|| self.exchange.note(self.key))?;
        if note.is_some_and(|noted| noted.note.split(' ').any(|n| n == me)) {
            return Ok(true);
        }
        let marker = join(&self.dir, &format!("{STORED}{me}"));
        if self.patiently(|| self.exchange.head(&marker))?.is_some() {
            if let Err(e) = self.exchange.remove(&marker) {
                log::warn!("{e}; removed once a delta's lifetime is past");
            }
            return Ok(true);
        }
        // By the longer of its own clock and the server's: a VM paused with its clock stopped
        // wakes to a clock that tells no stall, and the server's went on. Its `Date` is whole
        // seconds, rounded down: a second more.
        let (local, server) = put_at;
        let by_server = server
            .zip(self.exchange.server_time())
            .and_then(|(sent, answered)| answered.duration_since(sent).ok())
            .map_or(Duration::ZERO, |d| d + Duration::from_secs(1));
        let stalled = self.since(local).max(by_server);
        if stalled > lifetime() / 4 {
            let why = format!("stalled {stalled:?} since its PUT, it cannot tell whether it was stored");
            let source = std::io::Error::new(std::io::ErrorKind::TimedOut, why);
            return Err(store::Error::Io { place: self.store.describe(self.key), source }.into());
        }
        Ok(false)
    }

    /// The shard's note, the exchange directory's names and the shard itself, read at once: the
    /// note before the listing, so that every delta the note names and the listing does not is
    /// gone for good.
    fn read(&self) -> Result<Seen, CommitError> {
        let (noted, current) = both(self.world, || self.noted(), || self.current(open_shard(self.store, self.key)?));
        let (note, listed) = noted?;
        Ok((note, listed, current?))
    }

    /// The shard's note, then the exchange directory's names ([`Turns::read`]'s order).
    fn noted(&self) -> Result<(Option<Noted>, Vec<Listed>), store::Error> {
        let note = self.exchange.note(self.key)?;
        Ok((note, self.exchange.list(&self.dir)?))
    }

    /// The shard `file` (as opened; `None`: there is none) with its index read.
    fn current(&self, file: Option<Box<dyn Object>>) -> Result<Option<Current>, CommitError> {
        let extending = self.specs.len() == 1;
        file.map(|file| read_index(self.store, self.key, &self.specs[0], file, "not writing over it", extending))
            .transpose()
    }

    /// The shard as `found` by a committer arriving, with its index read.
    fn read_found(&self, found: Found) -> Result<Option<Current>, CommitError> {
        match found {
            Found::Read(current) => Ok(current),
            Found::Opened(file) => self.current(file),
        }
    }

    /// The bytes of the deltas named, read at once; `None` when one is gone (a holder that
    /// stalled past its lease folded and removed it): the shard is read again.
    fn read_deltas(&self, names: &[String]) -> Result<Option<Deltas>, CommitError> {
        let read =
            each_at_once(self.world, names, |name| self.patiently(|| self.exchange.read(&join(&self.dir, name))));
        let mut deltas = Deltas::new();
        for (name, bytes) in names.iter().zip(read) {
            match bytes? {
                Some(bytes) => deltas.insert(name.clone(), bytes),
                None => return Ok(None),
            };
        }
        Ok(Some(deltas))
    }
}

/// Whether what `listed` holds needs a listing dated by a fresh name (the lease) to be aged: a
/// delta does (its lifetime told by the names listed alone: a dead writer's, listed alone,
/// would look fresh), a marker only where the store does not tell the server's time (`swept`).
fn ages_need_a_fresh_listing(exchange: &dyn Exchange, listed: &[Listed]) -> bool {
    listed.iter().any(|l| l.name.starts_with(DELTA))
        || (exchange.server_time().is_none() && listed.iter().any(is_marker))
}

/// Whether `file` is a marker: a rejection, a `stored-` or `doubt-` mark, a queued waiter's.
fn is_marker(file: &Listed) -> bool {
    [REJECTED, STORED, DOUBT, QUEUED].iter().any(|p| file.name.starts_with(p))
}

/// How long a delta may wait, by the server's clock, before it is taken for the delta of a writer
/// that is gone (ten minutes: a live waiter's is folded within seconds); tests shorten it.
static LIFETIME_MS: AtomicU64 = AtomicU64::new(600_000);

/// How long a delta may wait before it is taken for a dead writer's.
pub fn lifetime() -> Duration {
    Duration::from_millis(LIFETIME_MS.load(Ordering::Relaxed))
}

/// Sets [`lifetime`] (for tests, which cannot wait ten minutes).
pub fn set_lifetime(lifetime: Duration) {
    LIFETIME_MS.store(lifetime.as_millis() as u64, Ordering::Relaxed);
}

/// True when `file` was stored more than [`lifetime`] before the newest name of `listed` (the
/// server's clock as of that name's writing, at the latest; a lease listed after it was taken
/// or renewed is that recent).
fn expired(file: &Listed, listed: &[Listed]) -> bool {
    older_than_lifetime(file, listed.iter().map(|l| l.stored).max())
}

/// True when `file` is a marker ([`is_marker`]) stored more than [`lifetime`] before the newest
/// name of `listed` or `heard`, the server's time as of the newest answer this process heard:
/// never later than the server's time now, so a marker is never swept early (a holder in doubt
/// counts on it for a delta's lifetime), and as new as the listing's own answer on a server that
/// dates its answers, so that markers listed alone, without the lease, are swept in time without
/// listing again.
fn swept(file: &Listed, listed: &[Listed], heard: Option<SystemTime>) -> bool {
    is_marker(file) && older_than_lifetime(file, listed.iter().map(|l| l.stored).chain(heard).max())
}

/// True when `file` was stored more than [`lifetime`] before `now`.
fn older_than_lifetime(file: &Listed, now: Option<SystemTime>) -> bool {
    now.and_then(|now| now.duration_since(file.stored).ok()).is_some_and(|age| age > lifetime())
}
