//! Which listings carry their files' attributes: the policy behind each READDIRPLUS reply.
//!
//! An entry with attributes spares a reader that stats it a LOOKUP round trip (`du -s` of 10^6
//! chunk files: 36 s through lookups, 6 s with attributes), but the kernel makes an inode for it
//! and the daemon keeps it until the kernel forgets it, whether or not it is ever stat'ed: `find
//! -type f` over 10^8 chunk files, given attributes with every batch, made the kernel fill 22 GB of
//! slab. The kernel's own rule (`FUSE_READDIRPLUS_AUTO`: attributes for a listing's first batch,
//! and for the next after a lookup in the directory) gives `du` none, since it reads up to 100,000
//! entries before it stats any. So the kernel is asked for READDIRPLUS always and the daemon
//! decides, by who reads:
//!
//! - a directory's subdirectories always come with attributes: they are few, and a walker opens
//!   each one, which would make the inode anyway;
//! - files come with attributes for a reader (the request's thread id) that was seen to stat
//!   files it had been given without: a lookup of a file in a directory it listed. `du` and `ls
//!   -l` are caught by the first files they stat (du's first 100,000, ls's first batch); `find
//!   -type f`, `ls` and `rsync`'s listing never are;
//! - files of a directory come with attributes in the one reply after a file it gave without was
//!   looked up by any reader, as the kernel's own rule has it (one lookup, one batch): a listing
//!   that feeds another process (`find | xargs cat`, whose listing goes on as `cat` reads) would
//!   otherwise cost that process a LOOKUP per file, and it makes their inodes anyway (a cold
//!   `cat` of 262,144 chunk files of one directory took 15-20% longer without). A stray lookup
//!   while a walk lists a huge directory costs one batch, not the rest of it;
//! - a reader outside the daemon's pid namespace (the daemon in a container, or a CSI plugin
//!   without `hostPID`, serving pods) comes as thread id 0, all such readers as one, which the
//!   rule above cannot follow. For them each lookup of a file they were listed without
//!   attributes (counted by directory, among those listed lately) buys [`UNSEEN_CREDIT`] files'
//!   attributes in their listings after, whichever of them lists, up to [`UNSEEN_CREDIT_MAX`]
//!   unspent: `ls -l`, `ls -lR` and `du` pay a lookup for about one file in that many (`ls -lR`
//!   and `du -s` of 65,536 chunk files in 256 directories took 5x as long through lookups
//!   alone). What a wrong guess costs is bounded by what was listed bare: a reader of chunks by
//!   key in a directory listed bare, beside a `find`, gives the `find` at most that many inodes
//!   for each file that listing gave;
//! - and only while the daemon holds fewer than [`MAX_INODES`] inodes (a bound on what a wrong
//!   guess costs: a reader that stopped stat'ing, or a thread id reused).
//!
//! A reader whose listing and stats come from different threads is recognised only in the
//! directory it is listing: the directories after go on through lookups, as every reader did
//! before.

use std::num::NonZeroUsize;

use lru::LruCache;
use parking_lot::Mutex;

/// The inodes the daemon may hold before listings stop giving files attributes: at about 20
/// bytes a chunk inode (and the kernel's ~1 KiB), 2^21 is a directory of a million files stat'ed
/// twice over, as plain files would cost the kernel too.
pub const MAX_INODES: usize = 1 << 21;

/// The readers remembered: more than ever list at once, few enough to be nothing.
const READERS: usize = 1024;

/// The directories a reader listed without attributes that a lookup of its still counts as a
/// stat of: a walker stats what it listed last.
const RECENT_DIRS: usize = 4;

/// The directories listed without files' attributes lately, whose next reply a lookup of one of
/// their files makes carry them: those being listed now, with room to spare.
const BARE_DIRS: usize = 64;

/// The files' attributes one lookup by a reader outside the daemon's pid namespace buys: the
/// share of stats such a reader pays a lookup for, and what a stray lookup costs.
pub const UNSEEN_CREDIT: usize = 64;

/// The most credit such readers hold: what is left of it when they stopped stat'ing is what a
/// wrong guess costs.
pub const UNSEEN_CREDIT_MAX: usize = 1 << 16;

/// The attributes a listing carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attributes {
    /// Every entry's: the kernel makes an inode for each.
    All,
    /// Only its subdirectories': files are listed by name, type and number alone.
    DirectoriesOnly,
}

#[derive(Debug, Default)]
struct Reader {
    /// Directories listed without the attributes of their files, the latest last.
    bare: Vec<u64>,
    /// Seen stat'ing files it was listed without attributes.
    stats: bool,
}

/// What is known of a directory listed lately without its files' attributes.
#[derive(Debug, Default)]
struct BareDir {
    /// A file of it was looked up since its last reply.
    looked_up: bool,
    /// Files it gave readers outside the daemon's pid namespace without attributes and that such
    /// readers have not looked up since (as far as the count tells): each lookup buys credit.
    unseen_bare: usize,
}

/// The readers seen listing directories, by thread id, and the directories they listed bare.
#[derive(Debug)]
pub struct ListingAttributes {
    readers: Mutex<LruCache<u32, Reader>>,
    /// Directories listed lately without their files' attributes, and whether a file of theirs
    /// was looked up since their last reply.
    bare_dirs: Mutex<LruCache<u64, BareDir>>,
    /// The files' attributes readers outside the daemon's pid namespace have bought with lookups
    /// and not yet been given.
    unseen_credit: Mutex<usize>,
}

impl Default for ListingAttributes {
    fn default() -> Self {
        Self {
            readers: Mutex::new(LruCache::new(NonZeroUsize::new(READERS).expect("non-zero"))),
            bare_dirs: Mutex::new(LruCache::new(NonZeroUsize::new(BARE_DIRS).expect("non-zero"))),
            unseen_credit: Mutex::new(0),
        }
    }
}

impl ListingAttributes {
    /// What a listing of directory `dir` read by thread `reader` (0: a reader outside the
    /// daemon's pid namespace) carries, with `held` inodes held.
    pub fn for_listing(&self, reader: u32, dir: u64, held: usize) -> Attributes {
        if held >= MAX_INODES {
            return Attributes::DirectoriesOnly;
        }
        if reader == 0 && *self.unseen_credit.lock() > 0 {
            return Attributes::All;
        }
        if let Some(bare) = self.bare_dirs.lock().get_mut(&dir)
            && std::mem::take(&mut bare.looked_up)
        {
            return Attributes::All;
        }
        if reader == 0 {
            self.bare_dirs.lock().get_or_insert_mut(dir, BareDir::default);
            return Attributes::DirectoriesOnly;
        }
        let mut readers = self.readers.lock();
        let seen = readers.get_or_insert_mut(reader, Reader::default);
        if seen.stats {
            return Attributes::All;
        }
        if seen.bare.last() != Some(&dir) {
            seen.bare.retain(|d| *d != dir);
            if seen.bare.len() == RECENT_DIRS {
                seen.bare.remove(0);
            }
            seen.bare.push(dir);
        }
        drop(readers);
        self.bare_dirs.lock().get_or_insert_mut(dir, BareDir::default);
        Attributes::DirectoriesOnly
    }

    /// A reply of a listing of directory `dir` read by thread `reader` gave `with` files with
    /// their attributes and `without` by name alone.
    pub fn gave(&self, reader: u32, dir: u64, with: usize, without: usize) {
        if reader != 0 {
            return;
        }
        if with > 0 {
            let mut credit = self.unseen_credit.lock();
            *credit = credit.saturating_sub(with);
        }
        if without > 0
            && let Some(bare) = self.bare_dirs.lock().peek_mut(&dir)
        {
            bare.unseen_bare = bare.unseen_bare.saturating_add(without);
        }
    }

    /// Thread `reader` (0: one outside the daemon's pid namespace) looked up a file (not a
    /// directory) in directory `parent`.
    pub fn looked_up(&self, reader: u32, parent: u64) {
        // Not made the latest by it: only listings keep a directory among those being listed.
        if let Some(bare) = self.bare_dirs.lock().peek_mut(&parent) {
            bare.looked_up = true;
            if reader == 0 && bare.unseen_bare > 0 {
                bare.unseen_bare -= 1;
                let mut credit = self.unseen_credit.lock();
                *credit = (*credit + UNSEEN_CREDIT).min(UNSEEN_CREDIT_MAX);
            }
        }
        if reader == 0 {
            return;
        }
        let mut readers = self.readers.lock();
        if let Some(seen) = readers.get_mut(&reader)
            && seen.bare.contains(&parent)
        {
            seen.stats = true;
            seen.bare = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_attributes_once_it_stats_files_it_listed_without() {
        let policy = ListingAttributes::default();
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::DirectoriesOnly);
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::DirectoriesOnly);
        // Its lookups elsewhere say nothing of it.
        policy.looked_up(100, 8);
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::DirectoriesOnly);
        policy.looked_up(100, 7);
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::All);
        assert_eq!(policy.for_listing(100, 9, 0), Attributes::All, "and in every directory after");
        assert_eq!(policy.for_listing(200, 9, 0), Attributes::DirectoriesOnly, "not another reader's");
    }

    #[test]
    fn a_directory_whose_files_another_reader_looks_up_is_listed_with_attributes() {
        let policy = ListingAttributes::default();
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::DirectoriesOnly);
        assert_eq!(policy.for_listing(100, 8, 0), Attributes::DirectoriesOnly);
        // find | xargs cat: cat (another thread) opens what find listed of directory 7.
        policy.looked_up(200, 7);
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::All, "the next batch of 7");
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::DirectoriesOnly, "one lookup, one batch");
        policy.looked_up(200, 7);
        assert_eq!(policy.for_listing(300, 7, 0), Attributes::All, "whoever lists it");
        assert_eq!(policy.for_listing(100, 8, 0), Attributes::DirectoriesOnly, "not the others");
        assert_eq!(policy.for_listing(100, 9, 0), Attributes::DirectoriesOnly);
        policy.looked_up(200, 7);
        assert_eq!(policy.for_listing(100, 7, MAX_INODES), Attributes::DirectoriesOnly, "within the bound");
        assert_eq!(policy.for_listing(100, 7, 0), Attributes::All, "kept past the bound's reply");
        // A directory listed long ago, or never, is not taken for one being listed; lookups alone
        // do not keep one among those.
        policy.for_listing(100, 8, 0);
        for dir in 10..10 + BARE_DIRS as u64 - 1 {
            policy.looked_up(200, 8);
            policy.for_listing(100, dir, 0);
        }
        policy.for_listing(100, 9, 0);
        policy.looked_up(200, 8);
        policy.looked_up(200, 1);
        assert_eq!(policy.for_listing(100, 8, 0), Attributes::DirectoriesOnly);
        assert_eq!(policy.for_listing(100, 1, 0), Attributes::DirectoriesOnly);
    }

    #[test]
    fn a_walker_that_never_stats_never_gets_attributes() {
        let policy = ListingAttributes::default();
        for dir in 2..10_000 {
            assert_eq!(policy.for_listing(300, dir, 0), Attributes::DirectoriesOnly);
            // find opens each subdirectory it lists: the kernel has its inode from the listing,
            // and a directory's lookup is no stat of a file anyway (the caller does not report it).
        }
        // A lookup in a directory listed long ago (a path given on the command line, say).
        policy.looked_up(300, 2);
        assert_eq!(policy.for_listing(300, 10_000, 0), Attributes::DirectoriesOnly);
    }

    #[test]
    fn no_reader_gets_attributes_past_the_bound() {
        let policy = ListingAttributes::default();
        policy.for_listing(100, 7, 0);
        policy.looked_up(100, 7);
        assert_eq!(policy.for_listing(100, 7, MAX_INODES - 1), Attributes::All);
        assert_eq!(policy.for_listing(100, 7, MAX_INODES), Attributes::DirectoriesOnly);
        policy.for_listing(0, 8, 0);
        policy.looked_up(0, 8);
        assert_eq!(policy.for_listing(0, 9, MAX_INODES), Attributes::DirectoriesOnly);
    }

    #[test]
    fn readers_outside_the_pid_namespace_buy_attributes_with_lookups_of_files_listed_without() {
        let policy = ListingAttributes::default();
        // find from a pod: nothing stat'ed, nothing given.
        for dir in 10..1000 {
            assert_eq!(policy.for_listing(0, dir, 0), Attributes::DirectoriesOnly);
            policy.gave(0, dir, 0, 100);
        }
        // A lookup in a directory not listed lately (a chunk read by its key) buys nothing.
        policy.looked_up(0, 5);
        assert_eq!(*policy.unseen_credit.lock(), 0);
        // du from a pod: a directory of 100 files by name, then a stat of each; a lookup more
        // (a reader of chunks by key there) buys nothing more.
        assert_eq!(policy.for_listing(0, 6, 0), Attributes::DirectoriesOnly);
        policy.gave(0, 6, 0, 100);
        for _ in 0..101 {
            policy.looked_up(0, 6);
        }
        assert_eq!(*policy.unseen_credit.lock(), 100 * UNSEEN_CREDIT);
        for dir in 1000..1000 + UNSEEN_CREDIT as u64 {
            assert_eq!(policy.for_listing(0, dir, 0), Attributes::All, "directory {dir}");
            policy.gave(0, dir, 100, 0);
        }
        assert_eq!(policy.for_listing(0, 2000, 0), Attributes::DirectoriesOnly, "the credit spent");
        policy.gave(0, 2000, 0, 10);
        // Readers in the namespace neither spend it nor buy it.
        policy.looked_up(100, 2000);
        assert_eq!(*policy.unseen_credit.lock(), 0);
        policy.looked_up(0, 2000);
        policy.gave(100, 2000, 1000, 0);
        assert_eq!(*policy.unseen_credit.lock(), UNSEEN_CREDIT);
        assert_eq!(policy.readers.lock().len(), 0, "unseen readers are no reader of the rule above");
        // Within a bound, however many files were listed bare and looked up.
        policy.gave(0, 2000, 0, 10 * UNSEEN_CREDIT_MAX);
        for _ in 0..10 * UNSEEN_CREDIT_MAX / UNSEEN_CREDIT {
            policy.looked_up(0, 2000);
        }
        assert_eq!(*policy.unseen_credit.lock(), UNSEEN_CREDIT_MAX);
    }

    #[test]
    fn readers_are_remembered_within_a_bound() {
        let policy = ListingAttributes::default();
        for reader in 1..=(READERS as u32 * 3) {
            policy.for_listing(reader, 7, 0);
        }
        assert_eq!(policy.readers.lock().len(), READERS);
    }
}
