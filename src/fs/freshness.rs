//! Keeping the kernel's caches true to the store. The kernel keeps what it was told of an entry
//! (and a directory's listing) for a long time (`fuse::CACHE_TTL`), so that a second pass over a
//! store costs no request per file; in exchange, this tracker remembers for every inode the
//! kernel holds which store files its answers were read from, and in which version ([`Stamp`]). [`Freshness::changed`] stats
//! those files again and names the inodes whose answers are out of date, for the adapter to
//! invalidate in the kernel: a file rewritten underneath the mount is seen within one pass.
//!
//! An inode is watched only while the kernel may use what it was last told of it without asking
//! again ([`Freshness::lapsed`]): past that, its next use asks, and is answered from the store
//! afresh. An idle mount asks its store nothing (each pass over an object store's files costs a
//! listing or more: five a second, every second, for a mount nobody used for hours).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::interned::Interned;
use crate::store::Stamp;

/// The version of a watched file that the kernel's cached answers agree with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// Every answer was read from this version (`None`: the file did not exist).
    Seen(Option<Stamp>),
    /// Answers were read from different versions: the next pass invalidates them all.
    Mixed,
}

#[derive(Debug)]
struct Watched {
    baseline: Baseline,
    /// Inodes whose attributes (or content) were read from the file.
    inodes: HashSet<u64>,
    /// Directories whose listing was read from it.
    listings: HashSet<u64>,
    /// Inodes of an array's chunk key space whose geometry was taken from it (an array document):
    /// a change that only grows the array leaves them true.
    geometry: HashSet<u64>,
}

/// What the kernel must drop of an inode that is no longer watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwatched {
    /// Its name: the inode is bound to a version replaced since, and the kernel may have looked
    /// its name up again just before the replacement, after the last pass dropped it.
    Name,
    /// Its attributes: it was moved by a rename, and the kernel asks for them again, which
    /// watches it at its new place.
    Attributes,
}

/// What a change of a watched file means for the answers read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A file that is not a metadata document.
    Content,
    /// A metadata document that only grew its array: its chunks stay what they were.
    Grew,
    /// Any other change of a metadata document: what the names below it are may have changed.
    Document,
}

/// Key numbers, inline while they are few (a chunk's: its shard and its array's document).
#[derive(Debug, Default)]
struct Keys {
    inline: [u32; 3],
    len: u8,
    more: Vec<u32>,
}

impl Keys {
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.inline[..self.len as usize].iter().copied().chain(self.more.iter().copied())
    }

    /// Adds `key`; false when it was there.
    fn add(&mut self, key: u32) -> bool {
        if self.iter().any(|k| k == key) {
            return false;
        }
        match self.len {
            len if (len as usize) < self.inline.len() => {
                self.inline[len as usize] = key;
                self.len += 1;
            }
            _ => self.more.push(key),
        }
        true
    }
}

/// What is watched of one inode the kernel holds: when it was last told about it, and the keys
/// its answers were read from.
#[derive(Debug)]
struct Record {
    told: Instant,
    answers: Keys,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each key's number, held once by every inode or listing read from it.
    keys: Interned<Arc<str>>,
    watched: HashMap<u32, Watched>,
    /// The inodes the kernel was told about, with the keys their answers were read from (a
    /// chunk's shard cannot be worked out again once its array's geometry changed).
    records: HashMap<u64, Record>,
    /// The keys each cached listing was read from, to forget them with the directory.
    listing_keys: HashMap<u64, HashSet<u32>>,
    /// Inodes no longer watched, and what the kernel must drop of them at the next pass.
    unwatched: HashMap<u64, Unwatched>,
}

impl Inner {
    /// The entry of `key` (its number, one more reference to it), taking an answer read from
    /// version `stamp`.
    fn entry(&mut self, key: &str, stamp: Option<Stamp>) -> (u32, &mut Watched) {
        let n = self.keys.take_str(key);
        let seen = Baseline::Seen(stamp);
        let w = self.watched.entry(n).or_insert_with(|| Watched {
            baseline: seen,
            inodes: HashSet::new(),
            listings: HashSet::new(),
            geometry: HashSet::new(),
        });
        if w.baseline != seen {
            w.baseline = Baseline::Mixed;
        }
        (n, w)
    }

    /// Drops one reference to key `n`, and its entry once nothing is watched from it.
    fn release(&mut self, n: u32) {
        if self.watched.get(&n).is_some_and(|w| w.inodes.is_empty() && w.listings.is_empty() && w.geometry.is_empty()) {
            self.watched.remove(&n);
        }
        self.keys.release(n);
    }

    fn record(&mut self, ino: u64) -> &mut Record {
        self.records.entry(ino).or_insert_with(|| Record { told: Instant::now(), answers: Keys::default() })
    }

    fn forget_inode(&mut self, ino: u64) {
        let Some(record) = self.records.get_mut(&ino) else { return };
        let keys: Vec<u32> = std::mem::take(&mut record.answers).iter().collect();
        for n in keys {
            if let Some(w) = self.watched.get_mut(&n) {
                w.inodes.remove(&ino);
                w.geometry.remove(&ino);
            }
            self.release(n);
        }
    }

    fn forget_listing(&mut self, dir: u64) {
        let Some(keys) = self.listing_keys.remove(&dir) else { return };
        for n in keys.into_iter() {
            if let Some(w) = self.watched.get_mut(&n) {
                w.listings.remove(&dir);
            }
            self.release(n);
        }
    }

    /// Forgets everything of `ino`, and gives memory back once most was forgotten.
    fn forget(&mut self, ino: u64) {
        self.forget_inode(ino);
        self.forget_listing(ino);
        self.records.remove(&ino);
        if self.records.capacity() > 4096 && self.records.len() < self.records.capacity() / 4 {
            self.records.shrink_to(self.records.len() * 2);
            for w in self.watched.values_mut() {
                w.inodes.shrink_to_fit();
                w.geometry.shrink_to_fit();
            }
        }
    }
}

/// Which inodes were answered from which store files (keys), in which versions.
#[derive(Debug, Default)]
pub struct Freshness {
    inner: Mutex<Inner>,
}

impl Freshness {
    /// Records that the kernel was just told about `ino` from `sources`: store keys and the
    /// version each answer was read from.
    /// `geometry`, when given, is the array document the answer took its geometry from.
    pub fn watch(&self, ino: u64, sources: &[(String, Option<Stamp>)], geometry: Option<&(String, Stamp)>) {
        let mut inner = self.inner.lock();
        inner.record(ino).told = Instant::now();
        let geometry = geometry.map(|(key, stamp)| (key, Some(*stamp), true));
        for (key, stamp, is_geometry) in sources.iter().map(|(k, s)| (k, *s, false)).chain(geometry) {
            let (n, w) = inner.entry(key, stamp);
            if is_geometry {
                w.geometry.insert(ino)
            } else {
                w.inodes.insert(ino)
            };
            if !inner.record(ino).answers.add(n) {
                inner.keys.release(n);
            }
        }
    }

    /// Records that the kernel was just given (part of) the listing of directory `dir`, read
    /// from `sources`. The kernel keeps listings across opens and fills them piecemeal, so the
    /// files of every part count until the directory is forgotten.
    pub fn watch_listing(&self, dir: u64, sources: Vec<(String, Option<Stamp>)>) {
        let mut inner = self.inner.lock();
        inner.record(dir).told = Instant::now();
        for (key, stamp) in sources {
            let (n, w) = inner.entry(&key, stamp);
            w.listings.insert(dir);
            if !inner.listing_keys.entry(dir).or_default().insert(n) {
                inner.keys.release(n);
            }
        }
    }

    /// Forgets `ino`'s answers and listing (the kernel dropped it, or it now stands for another
    /// file).
    pub fn unwatch(&self, ino: u64) {
        let mut inner = self.inner.lock();
        inner.forget(ino);
        inner.unwatched.remove(&ino);
    }

    /// Stops watching `ino`, whose answers no longer say what it is, and has the next pass drop
    /// `what` of it: the kernel would otherwise keep it for the whole TTL.
    pub fn unwatch_until_dropped(&self, ino: u64, what: Unwatched) {
        let mut inner = self.inner.lock();
        inner.forget(ino);
        inner.unwatched.insert(ino, what);
    }

    /// Stops watching the inodes the kernel was last told about `after` ago or longer (it asks
    /// again before it uses answers that old), and returns them, each with whether its listing
    /// was watched: the kernel's copy of a listing is kept as long as it holds the directory.
    pub fn lapsed(&self, after: Duration) -> Vec<(u64, bool)> {
        let mut inner = self.inner.lock();
        let old: Vec<(u64, bool)> = inner
            .records
            .iter()
            .filter(|(_, r)| r.told.elapsed() >= after)
            .map(|(ino, _)| (*ino, inner.listing_keys.contains_key(ino)))
            .collect();
        for (ino, _) in &old {
            inner.forget(*ino);
        }
        old
    }

    /// The inodes [`Freshness::unwatch_until_dropped`] named since the last call.
    pub fn take_unwatched(&self) -> Vec<(u64, Unwatched)> {
        self.inner.lock().unwatched.drain().collect()
    }

    /// Takes `stamp` as the version every cached answer about `key` agrees with: the file was
    /// changed by this mount, in a way the kernel already knows of.
    pub fn rebase(&self, key: &str, stamp: Option<Stamp>) {
        let mut inner = self.inner.lock();
        if let Some(n) = inner.keys.number_of_str(key)
            && let Some(w) = inner.watched.get_mut(&n)
        {
            w.baseline = Baseline::Seen(stamp);
        }
    }

    /// The keys of every watched file and directory.
    pub fn keys(&self) -> Vec<Arc<str>> {
        let inner = self.inner.lock();
        inner.watched.keys().filter_map(|n| inner.keys.get(*n).cloned()).collect()
    }

    /// Stats every watched file with `stamp_of` and returns the inodes answered from a version
    /// that is no longer there, each with whether one of the changed files `defines_paths` (a
    /// metadata document: what the names below it are may have changed); the files' current
    /// versions become the new baselines.
    pub fn changed(
        &self,
        stamp_of: impl Fn(&str) -> Option<Stamp>,
        classify: impl Fn(&str, Option<Stamp>) -> Change,
    ) -> Vec<(u64, bool)> {
        let keys: Vec<(u32, Arc<str>, Baseline)> = {
            let inner = self.inner.lock();
            let named = |(n, w): (&u32, &Watched)| Some((*n, inner.keys.get(*n)?.clone(), w.baseline));
            inner.watched.iter().filter_map(named).collect()
        };
        // Stat (and classify the changes) without the lock: lookups keep being answered meanwhile.
        let now: Vec<(u32, Baseline, Option<Stamp>, Change)> = keys
            .into_iter()
            .filter_map(|(n, key, baseline)| {
                let current = stamp_of(&key);
                let before = match baseline {
                    Baseline::Seen(before) if before == current => return None,
                    Baseline::Seen(before) => before,
                    Baseline::Mixed => None,
                };
                let change = classify(&key, before);
                Some((n, baseline, current, change))
            })
            .collect();
        let mut stale = HashMap::new();
        let mut inner = self.inner.lock();
        for (n, before, current, change) in now {
            // A number given to another key meanwhile is not this one's.
            let Some(w) = inner.watched.get_mut(&n) else { continue };
            {
                let geometry = w.geometry.iter().filter(|_| change != Change::Grew);
                for ino in w.inodes.iter().chain(&w.listings).chain(geometry) {
                    *stale.entry(*ino).or_insert(false) |= change == Change::Document;
                }
                // An answer recorded since the snapshot may come from yet another version: it
                // stays Mixed, for the next pass.
                if w.baseline == before {
                    w.baseline = Baseline::Seen(current);
                }
            }
        }
        stale.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(size: u64) -> Option<Stamp> {
        Some(Stamp::new([1, 2, size, 3, 4]))
    }

    fn inodes(changed: Vec<(u64, bool)>) -> Vec<u64> {
        let mut inodes: Vec<u64> = changed.into_iter().map(|(ino, _)| ino).collect();
        inodes.sort();
        inodes
    }

    #[test]
    fn a_changed_document_is_told_apart_from_other_changed_files() {
        let f = Freshness::default();
        f.watch(10, &[("a/c/0".into(), stamp(1)), ("a/zarr.json".into(), stamp(7))], None);
        f.watch(11, &[("a/c/1".into(), stamp(1))], None);
        let classify = |k: &str, _| if k.ends_with("zarr.json") { Change::Document } else { Change::Content };
        let mut changed = f.changed(|k| if k == "a/c/1" { stamp(1) } else { stamp(2) }, classify);
        changed.sort();
        assert_eq!(changed, [(10, true)]);
        assert_eq!(f.changed(|_| stamp(3), classify).len(), 2);
    }

    #[test]
    fn a_changed_file_names_the_inodes_answered_from_it_once() {
        let f = Freshness::default();
        f.watch(10, &[("a/c/0".into(), stamp(1)), ("a/zarr.json".into(), stamp(7))], None);
        f.watch(11, &[("a/c/0".into(), stamp(1)), ("a/zarr.json".into(), stamp(7))], None);
        f.watch(12, &[("a/c/1".into(), stamp(1)), ("a/zarr.json".into(), stamp(7))], None);
        let disk = |k: &str| {
            if k == "a/c/0" {
                stamp(2)
            } else if k == "a/c/1" {
                stamp(1)
            } else {
                stamp(7)
            }
        };
        let stale = inodes(f.changed(disk, |_, _| Change::Content));
        assert_eq!(stale, [10, 11]);
        assert!(inodes(f.changed(disk, |_, _| Change::Content)).is_empty(), "the new version is the baseline now");
    }

    #[test]
    fn a_document_that_only_grew_its_array_leaves_its_chunks_and_drops_its_listings() {
        let f = Freshness::default();
        let doc = ("a/zarr.json".to_string(), Stamp::new([1, 2, 7, 3, 4]));
        f.watch(10, &[("a/c/0".into(), stamp(1))], Some(&doc));
        f.watch(11, &[("a/zarr.json".into(), stamp(7))], None);
        f.watch_listing(12, vec![("a/zarr.json".into(), stamp(7))]);
        let disk = |k: &str| if k == "a/zarr.json" { stamp(8) } else { stamp(1) };
        let mut changed = f.changed(disk, |_, _| Change::Grew);
        changed.sort();
        assert_eq!(changed, [(11, false), (12, false)], "the chunk stays; the document and the listing go");
        f.watch(10, &[("a/c/0".into(), stamp(1))], Some(&doc));
        let changed = f.changed(|k| if k == "a/zarr.json" { stamp(9) } else { stamp(1) }, |_, _| Change::Document);
        assert!(changed.contains(&(10, true)), "any other change drops the chunk and its name: {changed:?}");
    }

    #[test]
    fn answers_from_two_versions_are_invalidated_even_if_the_file_did_not_change_again() {
        let f = Freshness::default();
        f.watch(10, &[("s".into(), stamp(1))], None);
        f.watch(11, &[("s".into(), stamp(2))], None);
        let stale = inodes(f.changed(|_| stamp(2), |_, _| Change::Content));
        assert_eq!(stale, [10, 11]);
        assert!(inodes(f.changed(|_| stamp(2), |_, _| Change::Content)).is_empty());
    }

    #[test]
    fn a_file_that_appears_or_disappears_is_a_change() {
        let f = Freshness::default();
        f.watch(10, &[("s".into(), None)], None);
        assert_eq!(inodes(f.changed(|_| stamp(1), |_, _| Change::Content)), [10]);
        assert_eq!(inodes(f.changed(|_| None, |_, _| Change::Content)), [10]);
    }

    #[test]
    fn a_rebased_file_is_not_a_change() {
        let f = Freshness::default();
        f.watch(10, &[("s".into(), stamp(1))], None);
        f.rebase("s", stamp(2));
        assert!(inodes(f.changed(|_| stamp(2), |_, _| Change::Content)).is_empty());
    }

    #[test]
    fn a_listing_is_stale_when_any_file_it_was_read_from_changes_and_forgotten_with_its_directory() {
        let f = Freshness::default();
        f.watch(5, &[("a".into(), stamp(1))], None);
        f.watch_listing(5, vec![("a".into(), stamp(1)), ("a/c/0".into(), stamp(1)), ("a/c/1".into(), None)]);
        assert_eq!(inodes(f.changed(|_| stamp(1), |_, _| Change::Content)), [5], "a/c/1 appeared");
        // Later parts of the listing add their files; the earlier ones still count.
        f.watch_listing(5, vec![("a/c/2".into(), stamp(1))]);
        assert_eq!(inodes(f.changed(|k| if k == "a/c/0" { stamp(2) } else { stamp(1) }, |_, _| Change::Content)), [5]);
        f.unwatch(5);
        assert!(
            inodes(f.changed(|_| stamp(7), |_, _| Change::Content)).is_empty(),
            "nothing is watched once the directory is forgotten"
        );
    }

    #[test]
    fn inodes_the_kernel_was_not_told_about_for_a_while_stop_being_watched() {
        let f = Freshness::default();
        f.watch(10, &[("s".into(), stamp(1))], None);
        f.watch_listing(5, vec![("s".into(), stamp(1))]);
        assert!(f.lapsed(Duration::from_secs(60)).is_empty(), "told just now");
        std::thread::sleep(Duration::from_millis(30));
        f.watch(11, &[("t".into(), stamp(1))], None);
        let mut lapsed = f.lapsed(Duration::from_millis(20));
        lapsed.sort();
        assert_eq!(lapsed, [(5, true), (10, false)], "the listing and the file told 30 ms ago");
        assert_eq!(f.keys(), [Arc::from("t")], "only the file told since is still asked about");
        assert!(inodes(f.changed(|_| stamp(2), |_, _| Change::Content)) == [11]);
        f.watch(10, &[("s".into(), stamp(2))], None);
        assert_eq!(inodes(f.changed(|_| stamp(3), |_, _| Change::Content)), [10, 11], "told again, watched again");
    }

    #[test]
    fn forgotten_inodes_stop_being_watched() {
        let f = Freshness::default();
        f.watch(10, &[("s".into(), stamp(1))], None);
        f.watch(11, &[("s".into(), stamp(1))], None);
        f.unwatch(10);
        assert_eq!(inodes(f.changed(|_| stamp(2), |_, _| Change::Content)), [11]);
        f.unwatch(11);
        assert!(inodes(f.changed(|_| stamp(3), |_, _| Change::Content)).is_empty());
    }
}
