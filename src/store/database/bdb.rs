//! A Berkeley DB file of Zarr keys, hash or btree, as zarr-python 2's `DBMStore` writes one over
//! the `berkeleydb` (or older `bsddb3`) module's `hashopen` and `btopen`: one unnamed database in
//! the file, keys the Zarr keys in ASCII, values the bytes. Through Debian's Berkeley DB 5.3
//! library ([`library`]), loaded when such a file is mounted, which checks the whole file with
//! Berkeley DB's verifier before it opens it (a damaged page could crash the library), unless
//! this user's mounts verified the file unchanged since ([`verified`]); served as a
//! [`KeyedFile`]. Each write is synced to disk before it returns.
//!
//! Berkeley DB keeps no lock between processes on a file opened outside a shared environment, and
//! `hashopen` and `btopen` open it in a private one: nothing in the file says another process has
//! it open. So a mount takes a lock of its own, `flock` on the file, exclusive for a writable
//! mount and shared for a read-only one, failing at once when another holds it: two mounts never
//! write one file, and a writer never has a reader beside it. Python's `berkeleydb` takes no such
//! lock, so a Python process writing the file while it is mounted is not kept out (nor would two
//! Python writers be from each other); it writes it when nothing is mounted, or takes the same
//! `flock` itself.

mod layout;
mod library;
mod verified;

use std::path::Path;

use self::verified::{Record, Stamp};
use super::keyed_file::KeyedFile;

const STORE: &str = "Berkeley DB";

/// A Berkeley DB file of Zarr keys, locked by this process.
pub type Bdb = KeyedFile<library::File>;

/// Which kind of Berkeley DB file one is, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hash,
    Btree,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Hash => "hash",
            Kind::Btree => "btree",
        }
    }
}

/// The metadata page's magic numbers (`db.h`), at bytes 12 to 15 in the file's byte order.
const HASH_MAGIC: u32 = 0x061561;
const BTREE_MAGIC: u32 = 0x053162;

/// What the first page of a Berkeley DB file says (`DBMETA` in `db_page.h`).
struct Header {
    kind: Kind,
    encrypted: bool,
    /// `nparts`: a partitioned database, whose data is in other files.
    partitions: u32,
    /// The access method's flags.
    flags: u32,
}

fn header(start: &[u8; 52]) -> Option<Header> {
    let word = |at: usize, big: bool| {
        let bytes = [start[at], start[at + 1], start[at + 2], start[at + 3]];
        if big { u32::from_be_bytes(bytes) } else { u32::from_le_bytes(bytes) }
    };
    // A file in either byte order: Berkeley DB reads both.
    let (kind, big) = [false, true].into_iter().find_map(|big| match word(12, big) {
        HASH_MAGIC => Some((Kind::Hash, big)),
        BTREE_MAGIC => Some((Kind::Btree, big)),
        _ => None,
    })?;
    Some(Header { kind, encrypted: start[24] != 0, partitions: word(36, big), flags: word(48, big) })
}

fn read_header(path: &Path) -> Option<Header> {
    use std::io::Read;
    let mut start = [0; 52];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).ok()?;
    header(&start)
}

/// Which kind of Berkeley DB file the local file at `path` is, by its header, if it is one.
pub fn kind(path: &Path) -> Option<Kind> {
    read_header(path).map(|h| h.kind)
}

/// Why a Berkeley DB file is not one of Zarr keys, by its header flags: duplicates (a key with
/// many values), a recno or queue-like btree (keys record numbers), named databases in one file.
fn unfit(header: &Header) -> Option<&'static str> {
    // Hash: DB_HASH_DUP 0x01, DB_HASH_SUBDB 0x02, DB_HASH_DUPSORT 0x04. Btree: BTM_DUP 0x01,
    // BTM_RECNO 0x02, BTM_DUPSORT 0x40, BTM_SUBDB 0x20 (db_page.h).
    let (dup, subdb, recno) = match header.kind {
        Kind::Hash => (0x05, 0x02, 0),
        Kind::Btree => (0x41, 0x20, 0x02),
    };
    if header.encrypted {
        Some("it is encrypted")
    } else if header.partitions != 0 {
        Some("it is partitioned (its data is in other files)")
    } else if header.flags & recno != 0 {
        Some("it is a recno database (keys record numbers)")
    } else if header.flags & subdb != 0 {
        Some("it holds named databases, not one of Zarr keys")
    } else if header.flags & dup != 0 {
        Some("it allows duplicate keys")
    } else {
        None
    }
}

/// Opens the file at `path` as its writer unless `read_only`; fails, naming it and the cause,
/// when another mount holds it, it is damaged or not a plain hash or btree file of keys, or the
/// library is missing.
pub fn open(path: &Path, read_only: bool) -> Result<Bdb, String> {
    let name = path.display().to_string();
    let file = || {
        let header = read_header(path).ok_or_else(|| format!("{name}: not a Berkeley DB hash or btree file"))?;
        if let Some(why) = unfit(&header) {
            return Err(format!("{name}: a Berkeley DB {} file shardfs cannot mount: {why}", header.kind.name()));
        }
        let lock = take_lock(path, read_only).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => format!(
                "{name}: held by another process ({e}: a mount of a Berkeley DB file holds a flock on it, exclusive when writable, shared when read-only)"
            ),
            _ => format!("{name}: {e}"),
        })?;
        // Berkeley DB resolves a relative name against its environment's home: the absolute one.
        let absolute = std::path::absolute(path).map_err(|e| format!("{name}: {e}"))?;
        let kind = match header.kind {
            Kind::Hash => library::HASH,
            Kind::Btree => library::BTREE,
        };
        // The verifier and the library read the file the lock is on, whatever is renamed over
        // its path meanwhile: the inode whose stamp is checked and remembered.
        let locked = Path::new("/proc/self/fd").join(std::os::fd::AsRawFd::as_raw_fd(&lock).to_string());
        let target = if locked.exists() { locked } else { absolute };
        let record = Record::of_user();
        let stamp = Stamp::of(&lock);
        let verify = !stamp.as_ref().is_some_and(|stamp| record.holds(stamp));
        let probe = lock.try_clone().ok();
        let file = library::File::open(&target, kind, read_only, false, verify, lock)
            .map_err(|why| format!("{name}: {why} (a Berkeley DB {} file)", header.kind.name()))?;
        // Remembered only if nothing wrote the file while the verifier read it.
        if let Some(stamp) = stamp.filter(|_| verify)
            && probe.as_ref().and_then(Stamp::of) == Some(stamp)
        {
            record.remember(stamp);
        }
        Ok(file)
    };
    KeyedFile::open(STORE, path, file, read_only)
}

/// The `flock` of a mount on the file at `path`: shared when `read_only`, else exclusive; an
/// error of kind `WouldBlock` when another holds one that excludes it.
fn take_lock(path: &Path, read_only: bool) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    let how = if read_only { libc::LOCK_SH } else { libc::LOCK_EX };
    // SAFETY: a descriptor of ours; the lock goes with it.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::{Condition, Database, Objects};
    use object_store::{GetRange, PutPayload};

    /// A new empty file of `kind`, made with the library, removed when the guard is dropped;
    /// `None` (said loudly) where the library is missing, unless `SHARDFS_REQUIRE_BDB=1`
    /// (`.ci/run`) makes that a failure.
    fn temp_file(label: &str, kind: Kind) -> Option<(Removed, std::path::PathBuf)> {
        let path = std::env::temp_dir().join(format!("shardfs-{label}-{}.{}.db", std::process::id(), kind.name()));
        let _ = std::fs::remove_file(&path);
        let code = if kind == Kind::Hash { library::HASH } else { library::BTREE };
        let lock = std::fs::File::open("/dev/null").unwrap();
        match library::File::open(&path, code, false, true, false, lock) {
            Ok(made) => drop(made),
            Err(e) if e.contains("not installed") && std::env::var("SHARDFS_REQUIRE_BDB").as_deref() != Ok("1") => {
                eprintln!("*** SKIPPED: {e} ***");
                return None;
            }
            Err(e) => panic!("{e}"),
        }
        assert_eq!(super::kind(&path), Some(kind));
        Some((Removed(path.clone()), path))
    }

    /// The file at `path` opened as a reader, once a writer just dropped is gone: a child another
    /// test of this process forks holds a copy of the lock's descriptor until it execs, so the
    /// lock may outlive the drop by that long.
    fn reader(path: &std::path::Path) -> Bdb {
        let mut again = open(path, true);
        for _ in 0..100 {
            match &again {
                Err(e) if e.contains("held by another process") => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    again = open(path, true);
                }
                _ => break,
            }
        }
        again.unwrap()
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn hash_and_btree_files_pass_the_conformance_checks_and_list_their_directories() {
        for kind in [Kind::Hash, Kind::Btree] {
            let Some((_file, path)) = temp_file("bdb-conformance", kind) else { return };
            let store = Objects::mount(open(&path, false).unwrap(), STORE, "test", false, Default::default()).unwrap();
            crate::store::conformance::check(&store);
            drop(store);
            let Some((_file, path)) = temp_file("bdb-listing", kind) else { return };
            crate::store::database::check_listing(&open(&path, false).unwrap());
        }
    }

    #[test]
    fn a_reader_reads_every_value_exactly_from_the_files_pages() {
        for kind in [Kind::Hash, Kind::Btree] {
            let Some((_file, path)) = temp_file("bdb-mapped", kind) else { return };
            let value = |n: usize, seed: usize| (0..n).map(|i| (i * 7 + seed) as u8).collect::<Vec<u8>>();
            let written: Vec<(String, Vec<u8>)> =
                (0..40).map(|i| (format!("a/{i}"), value([0, 1, 100, 5000, 70_000, 1 << 20][i % 6], i))).collect();
            let writer = open(&path, false).unwrap();
            for (key, bytes) in &written {
                writer.write(key, &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
            }
            drop(writer);
            // Read-only, the values are read from the file's pages by the mount itself.
            let reader = reader(&path);
            assert_eq!(reader.placed(), written.len(), "{kind:?}");
            for (key, bytes) in &written {
                let (entry, _, whole) = reader.read(key, None, &|_| Ok(())).unwrap().unwrap();
                assert_eq!((entry.size, &whole[..]), (bytes.len() as u64, &bytes[..]), "{kind:?} {key}");
                for range in [0..1, 4000..9000, 70_000..400_000] {
                    let want = bytes.get(range.start as usize..(range.end as usize).min(bytes.len()));
                    let Some(want) = want.filter(|w| !w.is_empty()) else { continue };
                    let asked = GetRange::Bounded(range.start..range.start + want.len() as u64);
                    let (_, _, got) = reader.read(key, Some(&asked), &|_| Ok(())).unwrap().unwrap();
                    assert_eq!(&got[..], want, "{kind:?} {key} {range:?}");
                }
            }
        }
    }

    #[test]
    fn a_file_whose_freed_pages_were_used_again_reads_every_value_exactly() {
        for kind in [Kind::Hash, Kind::Btree] {
            let Some((_file, path)) = temp_file("bdb-reused", kind) else { return };
            let value = |n: usize, seed: usize| (0..n).map(|i| (i * 13 + seed) as u8).collect::<Vec<u8>>();
            let writer = open(&path, false).unwrap();
            let mut written = std::collections::BTreeMap::new();
            // Small values, enough for a btree of more than one level, and long ones.
            for i in 0..400 {
                written.insert(format!("a/small/{i}"), value(i % 50, i));
            }
            for i in 0..30 {
                written.insert(format!("a/{i}"), value(20_000, i));
            }
            for (key, bytes) in &written {
                writer.write(key, &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
            }
            // Every other long value removed, its pages freed, and longer ones written over
            // them: their chains run through pages freed here and there.
            for i in (0..30).step_by(2) {
                writer.delete(&format!("a/{i}")).unwrap();
                written.remove(&format!("a/{i}"));
            }
            for i in 30..45 {
                let bytes = value(50_000, i);
                writer.write(&format!("a/{i}"), &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
                written.insert(format!("a/{i}"), bytes);
            }
            drop(writer);
            let reader = reader(&path);
            assert_eq!(reader.placed(), written.len(), "{kind:?}");
            // A long value's middle first, before any page in front of it was read.
            for (key, bytes) in written.iter().filter(|(_, b)| b.len() > 15_100) {
                let middle = GetRange::Bounded(15_000..15_100);
                let (_, _, got) = reader.read(key, Some(&middle), &|_| Ok(())).unwrap().unwrap();
                assert_eq!(&got[..], &bytes[15_000..15_100], "{kind:?} {key}");
            }
            for (key, bytes) in &written {
                let (entry, _, whole) = reader.read(key, None, &|_| Ok(())).unwrap().unwrap();
                assert_eq!((entry.size, &whole[..]), (bytes.len() as u64, &bytes[..]), "{kind:?} {key}");
            }
            assert!(
                reader.placed() < written.len(),
                "{kind:?}: chains that do not follow are read through the library"
            );
        }
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_a_held_file_is_refused() {
        use std::os::fd::AsRawFd;
        let Some((_file, path)) = temp_file("bdb-versions", Kind::Hash) else { return };
        let database = open(&path, false).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        database.write("big", &PutPayload::from(vec![7u8; 3 << 20]), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let twice = open(&path, true).unwrap_err();
        assert!(twice.contains("already open in this process"), "{twice}");
        drop(database);
        // Opened again, as a reader: the values are there, with their sizes.
        let again = reader(&path);
        assert_eq!(again.entry("a").unwrap().map(|e| e.size), Some(3));
        assert_eq!(again.entry("big").unwrap().map(|e| e.size), Some(3 << 20));
        assert_eq!(again.list_all("").unwrap().len(), 3);
        drop(again);
        // Another holder of the lock (an open file description of its own, as another process
        // has): a writer is refused while it reads, both while it writes.
        let other = std::fs::File::open(&path).unwrap();
        assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_SH) }, 0);
        let held = open(&path, false).unwrap_err();
        assert!(held.contains(&path.display().to_string()) && held.contains("held by another process"), "{held}");
        assert!(open(&path, true).is_ok());
        assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert!(open(&path, true).unwrap_err().contains("held by another process"));
    }

    #[test]
    fn a_damaged_file_or_one_of_another_kind_is_refused_in_one_line_naming_it() {
        let Some((_file, path)) = temp_file("bdb-damaged", Kind::Btree) else { return };
        let name = path.display().to_string();
        // The header kept, the rest of the first page and what follows gone.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..100]).unwrap();
        assert_eq!(kind(&path), Some(Kind::Btree));
        let e = open(&path, false).unwrap_err();
        assert!(e.starts_with(&name) && !e.contains('\n'), "{e}");
        // A recno database is a btree file whose keys are record numbers.
        let mut recno = bytes.clone();
        recno[48] |= 0x02;
        std::fs::write(&path, &recno).unwrap();
        let e = open(&path, true).unwrap_err();
        assert!(e.starts_with(&name) && e.contains("recno"), "{e}");
        // Pages past the first scrambled, one at a time, in a file of many: the verifier refuses
        // each, where the library reading them could crash.
        std::fs::write(&path, &bytes).unwrap();
        let database = open(&path, false).unwrap();
        for n in 0..300 {
            let value = PutPayload::from(vec![n as u8; 50 + n % 200]);
            database.write(&format!("a/c/{n}"), &value, &Condition::Any).unwrap();
        }
        drop(database);
        let whole = std::fs::read(&path).unwrap();
        let pages = whole.len() / 4096;
        assert!(pages > 4, "{pages} pages");
        for page in 1..pages {
            let mut scrambled = whole.clone();
            let mut state = page as u64;
            for byte in &mut scrambled[page * 4096..(page + 1) * 4096] {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if state >> 62 == 0 {
                    *byte = (state >> 33) as u8;
                }
            }
            std::fs::write(&path, &scrambled).unwrap();
            let e = open(&path, true).unwrap_err();
            assert!(e.starts_with(&name) && e.contains("damaged") && !e.contains('\n'), "{e}");
        }
    }
}
