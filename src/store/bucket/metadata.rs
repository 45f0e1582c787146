//! What a bucket store remembers of object metadata between requests, for `--metadata-ttl`: the
//! HEAD of each key (missing keys too) and the listing of each directory, each trusted for the
//! TTL and then asked again. A listing also tells the size and ETag of every object in it, so
//! `ls -l` of a directory costs one LIST, not a HEAD per file. A change made through this store
//! forgets what it makes stale at once; changes by others are seen within the TTL, and a stale
//! answer is never turned into wrong bytes (reads carry If-Match, writes are conditional).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use lru::LruCache;
use parking_lot::Mutex;

use crate::store::{Kind, Stamp, parent_key};

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
#[derive(Debug)]
pub struct Listing {
    pub entries: Vec<(String, Kind)>,
    pub stamp: Stamp,
    /// The newest modification time of an object in it, shown as the directory's.
    pub modified: SystemTime,
}

impl Listing {
    pub fn new(mut entries: Vec<(String, Kind)>, modified: SystemTime) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let mut hasher = DefaultHasher::new();
        for (name, kind) in &entries {
            name.hash(&mut hasher);
            (*kind == Kind::Dir).hash(&mut hasher);
        }
        Listing { stamp: Stamp::new([2, hasher.finish(), entries.len() as u64, 0, 0]), entries, modified }
    }

    pub fn kind_of(&self, name: &str) -> Option<Kind> {
        self.entries.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok().map(|i| self.entries[i].1)
    }
}

#[derive(Debug)]
struct Fresh<T> {
    until: Instant,
    value: T,
}

/// HEADs and listings, each trusted until its TTL runs out.
#[derive(Debug)]
pub struct MetadataCache {
    ttl: Duration,
    /// Counts forgets: an answer requested before a forget may be stale and is not remembered.
    epoch: std::sync::atomic::AtomicU64,
    heads: Mutex<LruCache<String, Fresh<Option<Head>>>>,
    listings: Mutex<LruCache<String, Fresh<Arc<Listing>>>>,
}

impl MetadataCache {
    pub fn new(ttl: Duration) -> Self {
        let size = |n| NonZeroUsize::new(n).expect("non-zero");
        MetadataCache {
            ttl,
            epoch: Default::default(),
            heads: Mutex::new(LruCache::new(size(HEADS))),
            listings: Mutex::new(LruCache::new(size(LISTINGS))),
        }
    }

    /// The HEAD of `key` if still trusted: `Some(None)` when the key was missing.
    pub fn head(&self, key: &str) -> Option<Option<Head>> {
        let mut heads = self.heads.lock();
        match heads.get(key) {
            Some(fresh) if fresh.until > Instant::now() => Some(fresh.value.clone()),
            _ => None,
        }
    }

    /// The current epoch, to be taken before a request whose answer is to be remembered.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn trusts(&self, epoch: u64) -> bool {
        !self.ttl.is_zero() && self.epoch() == epoch
    }

    /// Remembers the HEAD of `key`, asked for in `epoch`.
    pub fn remember_head(&self, key: &str, head: Option<Head>, epoch: u64) {
        if self.trusts(epoch) {
            self.heads.lock().put(key.to_string(), Fresh { until: Instant::now() + self.ttl, value: head });
        }
    }

    /// The listing of `dir` if still trusted.
    pub fn listing(&self, dir: &str) -> Option<Arc<Listing>> {
        let mut listings = self.listings.lock();
        match listings.get(dir) {
            Some(fresh) if fresh.until > Instant::now() => Some(fresh.value.clone()),
            _ => None,
        }
    }

    /// How many entries `dir` had when last listed, trusted or not.
    pub fn listed_len(&self, dir: &str) -> Option<usize> {
        self.listings.lock().peek(dir).map(|fresh| fresh.value.entries.len())
    }

    /// Remembers the listing of `dir` and the HEADs it showed (`objects`, by name), asked for in
    /// `epoch`.
    pub fn remember_listing(&self, dir: &str, listing: Arc<Listing>, objects: Vec<(String, Head)>, epoch: u64) {
        if !self.trusts(epoch) {
            return;
        }
        let until = Instant::now() + self.ttl;
        let mut heads = self.heads.lock();
        for (name, head) in objects {
            heads.put(crate::store::join(dir, &name), Fresh { until, value: Some(head) });
        }
        drop(heads);
        self.listings.lock().put(dir.to_string(), Fresh { until, value: listing });
    }

    /// Forgets what a change to `key` made stale: its HEAD and the listings of every directory
    /// above it (a new key can make new directories appear all the way up).
    pub fn forget(&self, key: &str) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.heads.lock().pop(key);
        let mut listings = self.listings.lock();
        let mut dir = key;
        while !dir.is_empty() {
            dir = parent_key(dir);
            listings.pop(dir);
        }
    }

    /// Forgets the listing of `dir` itself.
    pub fn forget_listing(&self, dir: &str) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.listings.lock().pop(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(tag: &str) -> Head {
        Head { size: 3, e_tag: Some(tag.into()), version: None, modified: SystemTime::UNIX_EPOCH }
    }

    #[test]
    fn a_listing_primes_heads_and_a_change_forgets_the_directories_above() {
        let cache = MetadataCache::new(Duration::from_secs(60));
        let listing = Arc::new(Listing::new(vec![("x".into(), Kind::File)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a/b", listing, vec![("x".into(), head("e1"))], cache.epoch());
        let above = Arc::new(Listing::new(vec![("b".into(), Kind::Dir)], SystemTime::UNIX_EPOCH));
        cache.remember_listing("a", above, vec![], cache.epoch());
        assert_eq!(cache.head("a/b/x"), Some(Some(head("e1"))));
        cache.forget("a/b/x");
        assert_eq!(cache.head("a/b/x"), None);
        assert!(cache.listing("a/b").is_none() && cache.listing("a").is_none());
    }

    #[test]
    fn nothing_is_trusted_with_a_zero_ttl() {
        let cache = MetadataCache::new(Duration::ZERO);
        cache.remember_head("k", Some(head("e")), cache.epoch());
        assert_eq!(cache.head("k"), None);
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
}
