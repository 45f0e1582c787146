//! What a bucket store remembers of object metadata between requests, for `--metadata-ttl`: the
//! HEAD of each key (missing keys too) and the listing of each directory, each trusted for the
//! TTL and then asked again. A listing also tells the size and ETag of every object in it, so
//! `ls -l` of a directory costs one LIST, not a HEAD per file. Changes by others are seen within
//! the TTL, and a stale answer is never turned into wrong bytes (reads carry If-Match, writes are
//! conditional).
//!
//! A change made through this store is known here exactly: what it stored, removed or made is
//! written into the HEADs and listings remembered ([`MetadataCache::stored`],
//! [`MetadataCache::removed`]), so that a writer's next lookups need no round trip, however many
//! files it writes. What a request asked for before a change to its key brings back may not show
//! that change, and is not remembered: each key keeps the generation of its last change, and an
//! answer is remembered only when it was asked for after that ([`MetadataCache::epoch`]). A
//! change to one key never costs the answers about others.
//!
//! Requests for metadata are shared while in flight ([`Flights`]): the FUSE threads that find one
//! listing expired at once send one LIST between them. A read of an object that succeeds with
//! If-Match tells as much as a HEAD would, that this version is current, and renews its trust
//! ([`MetadataCache::confirm`]): an object being read is not asked about again.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use lru::LruCache;
use parking_lot::{Condvar, Mutex};

use crate::store::{Error, Kind, Result, Stamp, file_name, parent_key};

/// At most this many HEADs and this many listings are remembered.
const HEADS: usize = 100_000;
const LISTINGS: usize = 10_000;

/// One object version, as a HEAD or a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub size: u64,
    pub e_tag: Option<String>,
    /// The service's own version name, where it has one beside the ETag (GCS's generation),
    /// as a HEAD or a PUT tells it; listings may not.
    pub version: Option<String>,
    pub modified: SystemTime,
}

impl Head {
    /// The object's version: its ETag and size (not its time, which HEAD gives to the second and
    /// a listing to the millisecond).
    pub fn stamp(&self) -> Stamp {
        let mut hasher = DefaultHasher::new();
        self.e_tag.as_deref().map(bare_e_tag).hash(&mut hasher);
        Stamp::new([1, hasher.finish(), self.size, 0, 0])
    }
}

/// Marks a version tag made of an object's Last-Modified time, for a server that gives no ETag
/// (an ETag is a quoted string, never this).
const MODIFIED: &str = "last-modified:";

/// The version tag of an object: its ETag, or, from a server that gives none, its Last-Modified
/// time (reads then carry If-Unmodified-Since; a change within the same second goes unseen, as it
/// does for the server's own caches). `None`: neither, so versions cannot be told apart.
pub fn version_of(meta: &object_store::ObjectMeta) -> Option<String> {
    let nanos = meta.last_modified.timestamp_nanos_opt().filter(|n| *n > 0);
    meta.e_tag.clone().or_else(|| nanos.map(|n| format!("{MODIFIED}{n}")))
}

/// The time of a version tag made by [`version_of`] from Last-Modified.
pub fn modified_of(tag: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let nanos = tag.strip_prefix(MODIFIED)?.parse().ok()?;
    Some(chrono::DateTime::from_timestamp_nanos(nanos))
}

/// An ETag without the quotes and weak mark that listings, HEADs and PUT replies may spell
/// differently.
pub fn bare_e_tag(e_tag: &str) -> &str {
    e_tag.trim_start_matches("W/").trim_matches('"')
}

/// The entries of one directory (a prefix), with a version made of their names and kinds.
#[derive(Clone, Debug)]
pub struct Listing {
    /// By name.
    pub entries: Vec<(String, Kind)>,
    pub stamp: Stamp,
    /// The newest modification time of an object in it, shown as the directory's.
    pub modified: SystemTime,
    /// The sum of the entries' hashes, which the stamp carries: kept as entries come and go, so
    /// that a name this process adds or removes costs no pass over the others.
    sum: u64,
}

impl Listing {
    pub fn new(mut entries: Vec<(String, Kind)>, modified: SystemTime) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let sum = entries.iter().map(|(name, kind)| entry_hash(name, *kind)).fold(0, u64::wrapping_add);
        Listing { stamp: listing_stamp(sum, entries.len()), entries, modified, sum }
    }

    pub fn kind_of(&self, name: &str) -> Option<Kind> {
        self.find(name).ok().map(|i| self.entries[i].1)
    }

    fn find(&self, name: &str) -> std::result::Result<usize, usize> {
        self.entries.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// Adds `name`, of `kind`, unless there is an entry of that name.
    fn insert(&mut self, name: &str, kind: Kind) {
        if let Err(at) = self.find(name) {
            self.entries.insert(at, (name.to_string(), kind));
            self.sum = self.sum.wrapping_add(entry_hash(name, kind));
            self.stamp = listing_stamp(self.sum, self.entries.len());
        }
    }

    /// Takes out the entry named `name`, if there is one.
    fn remove(&mut self, name: &str) {
        if let Ok(at) = self.find(name) {
            let (name, kind) = self.entries.remove(at);
            self.sum = self.sum.wrapping_sub(entry_hash(&name, kind));
            self.stamp = listing_stamp(self.sum, self.entries.len());
        }
    }
}

fn entry_hash(name: &str, kind: Kind) -> u64 {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    (kind == Kind::Dir).hash(&mut hasher);
    hasher.finish()
}

fn listing_stamp(sum: u64, len: usize) -> Stamp {
    Stamp::new([2, sum, len as u64, 0, 0])
}

/// The most ahead of its end that an answer is renewed by a periodic revalidation (a pass of
/// the watcher comes each second).
const DUE_AHEAD: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Fresh<T> {
    until: Instant,
    value: T,
}

/// At most this many keys keep the generation of their last change; past it every answer asked
/// for before is forgotten at once (the rare cost of a bounded table).
const CHANGES: usize = 100_000;

/// The generation of the last change of each key made or learned of here.
#[derive(Debug, Default)]
struct Changes {
    at: HashMap<String, u64>,
    /// The generation of every key not in `at`.
    floor: u64,
}

impl Changes {
    fn of(&self, key: &str) -> u64 {
        self.at.get(key).copied().unwrap_or(self.floor)
    }
}

/// HEADs and listings, each trusted until its TTL runs out.
#[derive(Debug)]
pub struct MetadataCache {
    ttl: Duration,
    /// Counts changes; [`MetadataCache::epoch`] is its value when a request is sent.
    generation: std::sync::atomic::AtomicU64,
    changes: Mutex<Changes>,
    heads: Mutex<LruCache<String, Fresh<Option<Head>>>>,
    /// `None`: no such directory.
    listings: Mutex<LruCache<String, Fresh<Option<Arc<Listing>>>>>,
}

impl MetadataCache {
    pub fn new(ttl: Duration) -> Self {
        let size = |n| NonZeroUsize::new(n).expect("non-zero");
        MetadataCache {
            ttl,
            generation: Default::default(),
            changes: Mutex::default(),
            heads: Mutex::new(LruCache::new(size(HEADS))),
            listings: Mutex::new(LruCache::new(size(LISTINGS))),
        }
    }

    /// The HEAD of `key` if still trusted: `Some(None)` when the key was missing.
    pub fn head(&self, key: &str) -> Option<Option<Head>> {
        let mut heads = self.heads.lock();
        let found = match heads.get(key) {
            Some(fresh) if fresh.until > Instant::now() => Some(fresh.value.clone()),
            _ => None,
        };
        crate::metrics::cache("metadata", found.is_some());
        found
    }

    /// The current generation, to be taken before a request whose answer is to be remembered.
    pub fn epoch(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The generation of the last change of `key`: an answer about it asked for before then may
    /// not show that change.
    pub fn since(&self, key: &str) -> u64 {
        self.changes.lock().of(key)
    }

    /// True when an answer about `key` asked for in `epoch` may be remembered.
    fn trusts(&self, key: &str, epoch: u64) -> bool {
        !self.ttl.is_zero() && self.since(key) <= epoch
    }

    /// Marks `keys` changed now: answers about them asked for before are not remembered.
    fn change<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let mut changes = self.changes.lock();
        let now = self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if changes.at.len() >= CHANGES {
            *changes = Changes { at: HashMap::new(), floor: now };
        }
        for key in keys {
            changes.at.insert(key.to_string(), now);
        }
    }

    /// Remembers the HEAD of `key`, asked for in `epoch`.
    pub fn remember_head(&self, key: &str, head: Option<Head>, epoch: u64) {
        // Checked under the lock that a change's own HEAD waits for (`stored`, `removed`): a
        // change after the check writes its HEAD after this one, not before it.
        let mut heads = self.heads.lock();
        if self.trusts(key, epoch) {
            remember(&mut heads, key.to_string(), head, Instant::now() + self.ttl);
        }
    }

    /// The listing of `dir` if still trusted: `Some(None)` when there was no such directory.
    pub fn listing(&self, dir: &str) -> Option<Option<Arc<Listing>>> {
        let mut listings = self.listings.lock();
        let found = match listings.get(dir) {
            Some(fresh) if fresh.until > Instant::now() => Some(fresh.value.clone()),
            _ => None,
        };
        crate::metrics::cache("metadata", found.is_some());
        found
    }

    /// True unless the HEAD or the listing of `key` is trusted for a while yet (half the TTL, at
    /// most [`DUE_AHEAD`]): a periodic revalidation renews them before they run out, so that
    /// lookups between two passes never find them expired and wait for a round trip.
    pub fn due(&self, key: &str) -> bool {
        let ahead = Instant::now() + (self.ttl / 2).min(DUE_AHEAD);
        let trusted = |until: Instant| until > ahead;
        !(self.heads.lock().peek(key).is_some_and(|fresh| trusted(fresh.until))
            || self.listings.lock().peek(key).is_some_and(|fresh| trusted(fresh.until)))
    }

    /// How many entries `dir` had when last listed, trusted or not.
    pub fn listed_len(&self, dir: &str) -> Option<usize> {
        self.listings.lock().peek(dir).map(|fresh| fresh.value.as_ref().map_or(0, |l| l.entries.len()))
    }

    /// Remembers the listing of `dir` (`None`: there is no such directory) and the HEADs it
    /// showed (`objects`, by name), asked for in `epoch`.
    pub fn remember_listing(&self, dir: &str, listing: Option<Arc<Listing>>, objects: Vec<(String, Head)>, epoch: u64) {
        // Checked under the lock that a change's own entries wait for (`show_in_listings`,
        // `drop_entry`): a change after the check shows in this listing once it is put, where a
        // change between the check and the put would have been lost, for the TTL.
        let mut listings = self.listings.lock();
        if !self.trusts(dir, epoch) {
            return;
        }
        let until = Instant::now() + self.ttl;
        let mut heads = self.heads.lock();
        let changes = self.changes.lock();
        for (name, head) in objects {
            let key = crate::store::join(dir, &name);
            if changes.of(&key) <= epoch {
                remember(&mut heads, key, Some(head), until);
            }
        }
        drop((changes, heads));
        listings.put(dir.to_string(), Fresh { until, value: listing });
    }

    /// Forgets the HEAD of `key`, which may have changed (a read found another version, a PUT's
    /// outcome is unknown): the next question about it goes to the server. The listing of its
    /// directory stays, unless it lacks `key`: it would answer that there is none (a listing made
    /// before another machine created it), and a commit reading the shard again would find none
    /// until it ran out. A listing of the directory asked for before now (the watcher's, one not
    /// remembered yet) is not remembered when it answers, for the same reason.
    pub fn forget(&self, key: &str) {
        let mut listings = self.listings.lock();
        let dir = parent_key(key);
        self.change([key, dir]);
        self.heads.lock().pop(key);
        let lacks = |fresh: &Fresh<Option<Arc<Listing>>>| {
            fresh.value.as_ref().is_none_or(|listing| listing.kind_of(file_name(key)).is_none())
        };
        if listings.peek(dir).is_some_and(lacks) {
            listings.pop(dir);
        }
    }

    /// This process stored the object at `key`, now at version `head` (`None`: the store did not
    /// say which): its HEAD is that, and every listing remembered shows it, its directory in
    /// each directory above too, without asking the server again.
    pub fn stored(&self, key: &str, head: Option<Head>) {
        // The change and what it shows in the listings, as one under their lock (see `removed_dir`).
        let mut listings = self.listings.lock();
        self.change(std::iter::once(key).chain(ancestors(key)));
        let until = Instant::now() + self.ttl;
        match head {
            Some(head) if !self.ttl.is_zero() => {
                self.heads.lock().put(key.to_string(), Fresh { until, value: Some(head) });
            }
            _ => drop(self.heads.lock().pop(key)),
        }
        show_in_listings(&mut listings, key, Kind::File);
    }

    /// This process removed the object at `key`: it is known missing, and gone from its
    /// directory's listing (the directory itself stays, as on a filesystem).
    pub fn removed(&self, key: &str) {
        let mut listings = self.listings.lock();
        // Every directory above: a listing of one asked for before may lack a directory the
        // removal left empty, which stays (`BucketStore::delete_object`).
        self.change(std::iter::once(key).chain(ancestors(key)));
        if !self.ttl.is_zero() {
            self.heads.lock().put(key.to_string(), Fresh { until: Instant::now() + self.ttl, value: None });
        }
        drop_entry(&mut listings, key);
    }

    /// This process made the empty directory `dir` (it lives here until an object is under it).
    pub fn made_dir(&self, dir: &str) {
        let mut listings = self.listings.lock();
        self.change(std::iter::once(dir).chain(ancestors(dir)));
        if listings.peek(dir).is_none_or(|fresh| fresh.value.is_none()) && !self.ttl.is_zero() {
            let empty = Arc::new(Listing::new(Vec::new(), SystemTime::now()));
            listings.put(dir.to_string(), Fresh { until: Instant::now() + self.ttl, value: Some(empty) });
        }
        show_in_listings(&mut listings, dir, Kind::Dir);
    }

    /// This process removed the directory `dir`, found empty by a look after `epoch`. Something
    /// stored below it since (by another thread: a commit of another shard) makes it not empty
    /// after all: then its listing and its parent's are forgotten, to be asked for again, rather
    /// than its parent's listing left without it for the TTL. A store's change and its entries
    /// are made under the listings' lock, taken here before the check: a store is wholly before
    /// it (and seen) or wholly after (and shows itself again in the parent's listing).
    pub fn removed_dir(&self, dir: &str, epoch: u64) {
        let mut listings = self.listings.lock();
        let filled = self.since(dir) > epoch;
        self.change([dir, parent_key(dir)]);
        listings.pop(dir);
        if filled {
            listings.pop(parent_key(dir));
        } else {
            drop_entry(&mut listings, dir);
        }
    }

    /// Renews the trust in the HEAD of `key` when it names version `e_tag`: a read carrying
    /// If-Match for it, sent in `epoch`, just succeeded.
    pub fn confirm(&self, key: &str, e_tag: &str, epoch: u64) {
        if !self.trusts(key, epoch) {
            return;
        }
        let mut heads = self.heads.lock();
        if let Some(fresh) = heads.peek_mut(key)
            && fresh.value.as_ref().and_then(|h| h.e_tag.as_deref()).is_some_and(|t| bare_e_tag(t) == bare_e_tag(e_tag))
        {
            fresh.until = Instant::now() + self.ttl;
        }
    }
}

/// Adds `key`, of `kind`, to its directory's listing, and each directory above it to its
/// parent's, up to the first listing that shows it already; listings never made are not made up
/// (one above may have been). A listing is changed in place unless a reader holds it: thousands
/// of files written into a directory listed before cost no copy of its entries each.
fn show_in_listings(listings: &mut LruCache<String, Fresh<Option<Arc<Listing>>>>, key: &str, kind: Kind) {
    let (mut child, mut kind) = (key, kind);
    for dir in ancestors(key) {
        if let Some(fresh) = listings.peek_mut(dir) {
            let name = crate::store::file_name(child);
            let listing = match &mut fresh.value {
                Some(listing) if listing.kind_of(name).is_some() => break,
                Some(listing) => Arc::make_mut(listing),
                // A directory known missing is there now, with this one entry.
                missing => Arc::make_mut(missing.insert(Arc::new(Listing::new(Vec::new(), SystemTime::UNIX_EPOCH)))),
            };
            listing.insert(name, kind);
            if kind == Kind::File {
                listing.modified = listing.modified.max(SystemTime::now());
            }
        }
        (child, kind) = (dir, Kind::Dir);
    }
}

/// Takes the last component of `key` out of its directory's listing, if remembered.
fn drop_entry(listings: &mut LruCache<String, Fresh<Option<Arc<Listing>>>>, key: &str) {
    if let Some(Fresh { value: Some(listing), .. }) = listings.peek_mut(parent_key(key))
        && listing.kind_of(file_name(key)).is_some()
    {
        Arc::make_mut(listing).remove(file_name(key));
    }
}

/// The directories above `key`, nearest first, the root (`""`) last.
fn ancestors(key: &str) -> impl Iterator<Item = &str> {
    let mut at = Some(key);
    std::iter::from_fn(move || {
        let key = at.filter(|k| !k.is_empty())?;
        let parent = parent_key(key);
        at = Some(parent);
        Some(parent)
    })
}

/// Requests in flight, by key: a caller who finds one asked for since the key's last change waits
/// for its answer instead of sending its own.
#[derive(Debug)]
pub struct Flights<V> {
    flights: Mutex<HashMap<String, Arc<Flight<V>>>>,
}

impl<V> Default for Flights<V> {
    fn default() -> Self {
        Flights { flights: Mutex::default() }
    }
}

#[derive(Debug)]
struct Flight<V> {
    epoch: u64,
    outcome: Mutex<Option<std::result::Result<V, Error>>>,
    landed: Condvar,
}

impl<V: Clone> Flight<V> {
    fn wait(&self) -> Result<V> {
        let mut outcome = self.outcome.lock();
        loop {
            match &*outcome {
                Some(Ok(value)) => return Ok(value.clone()),
                Some(Err(e)) => return Err(e.duplicate()),
                None => self.landed.wait(&mut outcome),
            }
        }
    }
}

impl<V: Clone> Flights<V> {
    /// The answer of the request for `key` in flight, when it was asked for in generation `since`
    /// or later (the key's last change), or else of `ask`, sent now in generation `epoch` and
    /// shared with whoever asks for `key` until it lands.
    pub fn share(&self, key: &str, epoch: u64, since: u64, ask: impl FnOnce() -> Result<V>) -> Result<V> {
        let flight = {
            let mut flights = self.flights.lock();
            if let Some(flight) = flights.get(key).filter(|f| f.epoch >= since) {
                let flight = flight.clone();
                drop(flights);
                return flight.wait();
            }
            let flight = Arc::new(Flight { epoch, outcome: Mutex::new(None), landed: Condvar::new() });
            flights.insert(key.to_string(), flight.clone());
            flight
        };
        // Lands the flight however `ask` ends, a panic included, so nobody waits forever.
        struct Landing<'a, V> {
            flights: &'a Flights<V>,
            key: &'a str,
            flight: Arc<Flight<V>>,
        }
        impl<V> Drop for Landing<'_, V> {
            fn drop(&mut self) {
                let mut flights = self.flights.flights.lock();
                if flights.get(self.key).is_some_and(|f| Arc::ptr_eq(f, &self.flight)) {
                    flights.remove(self.key);
                }
                drop(flights);
                let mut outcome = self.flight.outcome.lock();
                if outcome.is_none() {
                    let gone = std::io::Error::other("the request was abandoned");
                    *outcome = Some(Err(Error::Io { place: self.key.to_string(), source: gone }));
                }
                self.flight.landed.notify_all();
            }
        }
        let landing = Landing { flights: self, key, flight };
        let answer = ask();
        *landing.flight.outcome.lock() = Some(match &answer {
            Ok(value) => Ok(value.clone()),
            Err(e) => Err(e.duplicate()),
        });
        answer
    }
}

/// Remembers `head` as the version of `key` until `until`. A WebDAV server may list objects with no
/// ETag (nginx's dav_ext) and give one at HEAD and GET: the two answers about one version then
/// differ only in that one of them has no ETag. The version remembered first stays, so that the
/// version of a file looked up is not seen to change (ESTALE) between the watcher's passes.
fn remember(heads: &mut LruCache<String, Fresh<Option<Head>>>, key: String, head: Option<Head>, until: Instant) {
    let value = match (heads.peek(&key).and_then(|fresh| fresh.value.clone()), head) {
        (Some(known), Some(new)) if same_version_without_an_e_tag(&known, &new) => Some(known),
        (_, head) => head,
    };
    heads.put(key, Fresh { until, value });
}

/// True when `a` and `b` have the same size and modification time and one of them names its
/// version by that time alone (no ETag): nothing tells them apart.
fn same_version_without_an_e_tag(a: &Head, b: &Head) -> bool {
    let by_time = |h: &Head| h.e_tag.as_deref().is_none_or(|t| t.starts_with(MODIFIED));
    a.size == b.size && a.modified == b.modified && (by_time(a) != by_time(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(tag: &str) -> Head {
        Head { size: 3, e_tag: Some(tag.into()), version: None, modified: SystemTime::UNIX_EPOCH }
    }

    #[test]
    fn a_listing_primes_heads_and_forgetting_a_key_costs_only_its_head() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let listing = Arc::new(Listing::new(vec![("x".into(), Kind::File)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a/b", Some(listing), vec![("x".into(), head("e1"))], cache.epoch());
        let above = Arc::new(Listing::new(vec![("b".into(), Kind::Dir)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a", Some(above), vec![], cache.epoch());
        assert_eq!(cache.head("a/b/x"), Some(Some(head("e1"))));
        cache.forget("a/b/x");
        assert_eq!(cache.head("a/b/x"), None);
        assert!(cache.listing("a/b").is_some() && cache.listing("a").is_some());
    }

    #[test]
    fn forgetting_a_key_its_listing_lacks_forgets_the_listing_too() {
        // Another machine created a/b/y after a/b was listed: a commit that found it changed
        // must not be told by the listing, again and again, that it is not there.
        let cache = MetadataCache::new(Duration::from_secs(60));
        let listing = Arc::new(Listing::new(vec![("x".into(), Kind::File)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a/b", Some(listing), vec![("x".into(), head("e1"))], cache.epoch());
        cache.forget("a/b/y");
        assert!(cache.listing("a/b").is_none());
        cache.remember_listing("c", None, vec![], cache.epoch());
        cache.forget("c/y");
        assert!(cache.listing("c").is_none(), "a directory known missing is asked about again");
    }

    #[test]
    fn a_listing_asked_for_before_a_forget_that_dropped_it_is_not_remembered() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let old = Arc::new(Listing::new(vec![("x".into(), Kind::File)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a/b", Some(old.clone()), vec![], cache.epoch());
        let asked = cache.epoch(); // a LIST sent before a/b/y was created...
        cache.forget("a/b/y");
        cache.remember_listing("a/b", Some(old), vec![], asked); // ...lands without it
        assert!(cache.listing("a/b").is_none());
    }

    fn names(listing: Option<Option<Arc<Listing>>>) -> Vec<(String, Kind)> {
        listing.expect("remembered").expect("a directory").entries.clone()
    }

    #[test]
    fn what_this_process_stores_and_removes_shows_in_the_listings_remembered() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let empty = || Arc::new(Listing::new(Vec::new(), SystemTime::UNIX_EPOCH));
        cache.remember_listing("", Some(empty()), vec![], cache.epoch());
        cache.remember_listing("a", Some(empty()), vec![], cache.epoch());
        cache.stored("a/b/c/x", Some(head("e1")));
        assert_eq!(cache.head("a/b/c/x"), Some(Some(head("e1"))));
        assert_eq!(names(cache.listing("")), [("a".to_string(), Kind::Dir)]);
        assert_eq!(names(cache.listing("a")), [("b".to_string(), Kind::Dir)]);
        assert!(cache.listing("a/b").is_none(), "never listed, so not made up");
        cache.remember_listing("a/b/c", Some(empty()), vec![], cache.epoch());
        cache.stored("a/b/c/y", None);
        assert_eq!(names(cache.listing("a/b/c")), [("y".to_string(), Kind::File)]);
        assert_eq!(cache.head("a/b/c/y"), None, "a version not told is asked for");
        cache.removed("a/b/c/y");
        assert!(names(cache.listing("a/b/c")).is_empty());
        assert_eq!(cache.head("a/b/c/y"), Some(None), "known missing");
        cache.made_dir("a/d");
        assert_eq!(names(cache.listing("a")), [("b".to_string(), Kind::Dir), ("d".to_string(), Kind::Dir)]);
        assert!(names(cache.listing("a/d")).is_empty());
        cache.removed_dir("a/d", cache.epoch());
        assert!(cache.listing("a/d").is_none());
        assert_eq!(names(cache.listing("a")), [("b".to_string(), Kind::Dir)]);
        // A directory known missing is there once something is stored below it.
        cache.remember_listing("e", None, vec![], cache.epoch());
        assert!(matches!(cache.listing("e"), Some(None)), "known missing");
        cache.stored("e/f/x", None);
        assert_eq!(names(cache.listing("e")), [("f".to_string(), Kind::Dir)]);
    }

    #[test]
    fn an_answer_asked_for_before_a_change_of_its_key_is_not_remembered_and_others_are() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let epoch = cache.epoch();
        cache.stored("d/x", Some(head("new")));
        let listing = |names: &[&str]| {
            let entries = names.iter().map(|n| (n.to_string(), Kind::File)).collect();
            Arc::new(Listing::new(entries, SystemTime::UNIX_EPOCH))
        };
        // A listing of `d` sent before the store does not show it: not remembered.
        cache.remember_listing("d", Some(listing(&[])), vec![], epoch);
        assert!(cache.listing("d").is_none());
        // One of another directory, sent as long ago, is.
        cache.remember_listing("e", Some(listing(&["y"])), vec![("y".into(), head("e1"))], epoch);
        assert_eq!(cache.head("e/y"), Some(Some(head("e1"))));
        cache.remember_head("d/x", Some(head("old")), epoch);
        assert_eq!(cache.head("d/x"), Some(Some(head("new"))));
    }

    #[test]
    fn a_version_listed_without_an_e_tag_and_given_one_at_head_is_one_version() {
        // nginx's WebDAV listings carry no ETag; its HEADs and GETs do.
        let cache = MetadataCache::new(Duration::from_secs(60));
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let by_time =
            Head { size: 3, e_tag: Some(format!("{MODIFIED}1700000000000000000")), version: None, modified: at };
        let tagged = Head { e_tag: Some("\"6b0845db-3\"".into()), ..by_time.clone() };
        let listing = |head: &Head| {
            let files = Arc::new(Listing::new(vec![("x".into(), Kind::File)], at));
            cache.remember_listing("d", Some(files), vec![("x".into(), head.clone())], cache.epoch());
        };
        listing(&by_time);
        cache.remember_head("d/x", Some(tagged.clone()), cache.epoch());
        assert_eq!(cache.head("d/x"), Some(Some(by_time.clone())), "a HEAD tells no other version");
        cache.forget("d/x");
        cache.remember_head("d/x", Some(tagged.clone()), cache.epoch());
        listing(&by_time);
        assert_eq!(cache.head("d/x"), Some(Some(tagged.clone())), "nor does a listing");
        // Another size or time is another version, and two ETags that differ are two.
        let later = Head { modified: at + Duration::from_secs(1), ..by_time.clone() };
        listing(&later);
        assert_eq!(cache.head("d/x"), Some(Some(later)));
        let retagged = Head { e_tag: Some("\"6b0845db-4\"".into()), ..tagged.clone() };
        cache.remember_head("d/x", Some(tagged), cache.epoch());
        cache.remember_head("d/x", Some(retagged.clone()), cache.epoch());
        assert_eq!(cache.head("d/x"), Some(Some(retagged)));
    }

    #[test]
    fn a_successful_read_renews_the_trust_in_its_version_only() {
        let cache = MetadataCache::new(Duration::from_millis(50));
        cache.remember_head("k", Some(head("e1")), cache.epoch());
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.head("k"), None, "expired");
        cache.confirm("k", "\"e2\"", cache.epoch());
        assert_eq!(cache.head("k"), None, "another version confirms nothing");
        cache.confirm("k", "\"e1\"", cache.epoch());
        assert_eq!(cache.head("k"), Some(Some(head("e1"))));
        let epoch = cache.epoch();
        cache.forget("k");
        cache.remember_head("k", Some(head("e1")), cache.epoch());
        std::thread::sleep(Duration::from_millis(60));
        cache.confirm("k", "e1", epoch);
        assert_eq!(cache.head("k"), None, "a read sent before a change made here confirms nothing");
    }

    #[test]
    fn callers_of_one_key_share_one_request_of_their_epoch() {
        let flights = Flights::<u32>::default();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let gate = std::sync::Barrier::new(5);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    gate.wait();
                    let answer = flights.share("k", 7, 7, || {
                        asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(100));
                        Ok(1)
                    });
                    assert_eq!(answer.unwrap(), 1);
                });
            }
            gate.wait();
        });
        assert_eq!(asked.into_inner(), 1, "one request for four callers");
        let failed = flights.share("k", 7, 7, || Err(Error::NotFound("k".into())));
        assert!(matches!(failed, Err(Error::NotFound(_))));
        assert_eq!(flights.share("k", 8, 0, || Ok(2)).unwrap(), 2, "nothing stays in flight once landed");
    }

    #[test]
    fn a_request_sent_before_its_keys_last_change_is_not_joined() {
        let flights = Flights::<u32>::default();
        let (started, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let old = s.spawn(|| {
                flights.share("k", 1, 0, || {
                    started.wait();
                    release.wait();
                    Ok(1)
                })
            });
            started.wait();
            assert_eq!(flights.share("k", 2, 2, || Ok(2)).unwrap(), 2, "asked again after a change");
            release.wait();
            assert_eq!(old.join().unwrap().unwrap(), 1);
        });
    }

    #[test]
    fn nothing_is_trusted_with_a_zero_ttl() {
        let cache = MetadataCache::new(Duration::ZERO);
        cache.remember_head("k", Some(head("e")), cache.epoch());
        assert_eq!(cache.head("k"), None);
    }

    #[test]
    fn an_answer_is_due_for_renewal_once_half_its_ttl_has_passed() {
        let cache = MetadataCache::new(Duration::from_secs(1));
        assert!(cache.due("k") && cache.due("d"), "never asked");
        cache.remember_head("k", Some(head("e")), cache.epoch());
        cache.remember_listing(
            "d",
            Some(Arc::new(Listing::new(Vec::new(), SystemTime::UNIX_EPOCH))),
            Vec::new(),
            cache.epoch(),
        );
        assert!(!cache.due("k") && !cache.due("d"));
        std::thread::sleep(Duration::from_millis(600));
        assert!(cache.head("k").is_some(), "still trusted");
        assert!(cache.due("k") && cache.due("d"), "but to be renewed before it runs out");
    }

    #[test]
    fn an_answer_asked_for_before_a_forget_is_not_remembered() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let epoch = cache.epoch();
        cache.forget("k");
        cache.remember_head("k", Some(head("old")), epoch);
        assert_eq!(cache.head("k"), None);
    }

    #[test]
    fn without_an_etag_the_version_is_the_modification_time() {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let meta = |e_tag: Option<&str>, last_modified| object_store::ObjectMeta {
            location: "k".into(),
            last_modified,
            size: 3,
            e_tag: e_tag.map(str::to_string),
            version: None,
        };
        assert_eq!(version_of(&meta(Some("\"e\""), at)).as_deref(), Some("\"e\""));
        let tag = version_of(&meta(None, at)).unwrap();
        assert_eq!(modified_of(&tag), Some(at));
        assert_eq!(modified_of("\"e\""), None);
        assert_eq!(version_of(&meta(None, chrono::DateTime::from_timestamp_nanos(0))), None);
    }

    #[test]
    fn quoting_does_not_make_another_version() {
        let quoted = Head { e_tag: Some("\"e1\"".into()), ..head("e1") };
        assert_eq!(quoted.stamp(), head("e1").stamp());
    }

    #[test]
    fn versions_differ_by_etag_and_by_names() {
        assert_ne!(head("e1").stamp(), head("e2").stamp());
        let one = Listing::new(vec![("a".into(), Kind::File)], SystemTime::UNIX_EPOCH);
        let two = Listing::new(vec![("a".into(), Kind::File), ("b".into(), Kind::Dir)], SystemTime::UNIX_EPOCH);
        assert_ne!(one.stamp, two.stamp);
        assert_eq!(two.kind_of("b"), Some(Kind::Dir));
        assert_eq!(two.kind_of("c"), None);
    }

    #[test]
    fn a_directory_removed_after_a_store_below_it_since_its_look_is_asked_for_again() {
        let cache = MetadataCache::new(Duration::from_secs(3600));
        // c shows 0, which is empty.
        let listed = || {
            let c = Listing::new(vec![("0".into(), Kind::Dir)], SystemTime::now());
            cache.remember_listing("c", Some(Arc::new(c)), vec![], cache.epoch());
            let empty = Listing::new(Vec::new(), SystemTime::UNIX_EPOCH);
            cache.remember_listing("c/0", Some(Arc::new(empty)), vec![], cache.epoch());
        };
        listed();
        // A look finds c/0 empty; another thread stores c/0/1; then c/0 is removed.
        let looked = cache.epoch();
        cache.stored("c/0/1", None);
        cache.removed_dir("c/0", looked);
        assert!(cache.listing("c").is_none() && cache.listing("c/0").is_none(), "both asked for again");
        // Removed with nothing stored since its look, it leaves its parent's listing.
        listed();
        cache.removed_dir("c/0", cache.epoch());
        assert!(names(cache.listing("c")).is_empty());
        // A store after the removal shows the directory again.
        cache.stored("c/0/2", None);
        assert_eq!(names(cache.listing("c")), [("0".to_string(), Kind::Dir)]);
    }

    #[test]
    fn a_listing_changed_in_place_has_the_stamp_a_listing_made_anew_would() {
        let cache = MetadataCache::new(Duration::from_secs(3600));
        cache.remember_listing(
            "d",
            Some(Arc::new(Listing::new(vec![("m".into(), Kind::File)], SystemTime::now()))),
            vec![],
            cache.epoch(),
        );
        let held = cache.listing("d").flatten().unwrap();
        for name in ["z", "a", "k/x", "b"] {
            cache.stored(&format!("d/{name}"), None);
        }
        cache.removed("d/b");
        let listing = cache.listing("d").flatten().unwrap();
        let entries =
            vec![("a".into(), Kind::File), ("k".into(), Kind::Dir), ("m".into(), Kind::File), ("z".into(), Kind::File)];
        assert_eq!(listing.entries, entries);
        assert_eq!(listing.stamp, Listing::new(entries, SystemTime::now()).stamp);
        assert_eq!(held.entries.len(), 1, "a listing a reader holds is not changed under it");
    }

    #[test]
    fn a_listing_asked_for_before_a_forget_or_a_removal_below_it_is_not_remembered() {
        // Found by a review: the listing of d answered after a PUT of d/k of unknown outcome, or
        // after the last object below d/x went (d/x stays), would lack k or x for the TTL.
        let cache = MetadataCache::new(Duration::from_secs(3600));
        let empty = || Some(Arc::new(Listing::new(vec![], SystemTime::UNIX_EPOCH)));
        let asked = cache.epoch();
        cache.forget("d/k");
        cache.remember_listing("d", empty(), vec![], asked);
        assert!(cache.listing("d").is_none());
        let asked = cache.epoch();
        cache.removed("d/x/y");
        cache.remember_listing("d", empty(), vec![], asked);
        assert!(cache.listing("d").is_none());
    }
}
