//! A GNU dbm file of Zarr keys, as zarr-python 2's `DBMStore` writes one over `dbm.gnu`: keys the
//! Zarr keys in ASCII, values the bytes. Through Debian's GNU dbm library ([`library`]), the one
//! Python's `dbm.gnu` uses, loaded when such a file is mounted; served as a [`KeyedFile`] under
//! GNU dbm's lock (a writable mount its one writer, a read-only mount a reader). Each write is
//! synced to disk before it returns.

mod layout;
mod library;

use std::path::Path;

use super::keyed_file::KeyedFile;

const STORE: &str = "GNU dbm";

/// A GNU dbm file of Zarr keys, locked by this process.
pub type Gdbm = KeyedFile<library::File>;

/// True when the local file at `path` starts as a GNU dbm file does.
pub fn is_gdbm(path: &Path) -> bool {
    use std::io::Read;
    let mut start = [0; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).is_ok() && library::is_gdbm(&start)
}

/// Opens the file at `path`, as its writer unless `read_only`; fails, naming it and the cause,
/// when another process holds it, it is damaged, or the library is missing.
pub fn open(path: &Path, read_only: bool) -> Result<Gdbm, String> {
    let name = path.display().to_string();
    let file = || {
        library::File::open(path, !read_only).map_err(|e| match e {
            library::OpenError::Held(why) => format!(
                "{name}: held by another process ({why}: GNU dbm lets one writer, or only readers, open a file)"
            ),
            library::OpenError::Other(why) => format!("{name}: {why}"),
        })
    };
    KeyedFile::open(STORE, path, file, read_only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::{Condition, Database, Objects};
    use object_store::{GetRange, PutPayload};

    /// A new empty GNU dbm file, removed when the guard is dropped; `None` (said loudly) where
    /// the library is missing, unless `SHARDFS_REQUIRE_GDBM=1` (`.ci/run`) makes that a failure.
    fn temp_file(label: &str) -> Option<(Removed, std::path::PathBuf)> {
        let path = std::env::temp_dir().join(format!("shardfs-{label}-{}.gdbm", std::process::id()));
        let _ = std::fs::remove_file(&path);
        std::fs::File::create(&path).unwrap();
        // GNU dbm writes its header into an empty file it opens as a writer.
        match library::File::open(&path, true) {
            Ok(made) => drop(made),
            Err(library::OpenError::Other(e))
                if e.contains("not installed") && std::env::var("SHARDFS_REQUIRE_GDBM").as_deref() != Ok("1") =>
            {
                eprintln!("*** SKIPPED: {e} ***");
                return None;
            }
            Err(library::OpenError::Held(e) | library::OpenError::Other(e)) => panic!("{e}"),
        }
        assert!(is_gdbm(&path));
        Some((Removed(path.clone()), path))
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn passes_the_conformance_checks() {
        let Some((_file, path)) = temp_file("gdbm-conformance") else { return };
        let store = Objects::mount(open(&path, false).unwrap(), STORE, "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_a_held_file_is_refused() {
        let Some((_file, path)) = temp_file("gdbm-versions") else { return };
        let database = open(&path, false).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let twice = open(&path, true).unwrap_err();
        assert!(twice.contains("already open in this process"), "{twice}");
        drop(database);
        // Opened again, as a reader: the values are there, with their sizes.
        let again = open(&path, true).unwrap();
        assert_eq!(again.entry("a").unwrap().map(|e| e.size), Some(3));
        assert_eq!(again.list_all("").unwrap().len(), 2);
    }

    #[test]
    fn values_are_read_where_the_buckets_place_them_until_written() {
        let Some((_file, path)) = temp_file("gdbm-places") else { return };
        let value =
            |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>();
        let mut written = std::collections::BTreeMap::new();
        let database = open(&path, false).unwrap();
        // Enough keys to split buckets; some replaced and removed, so that freed space is reused.
        for i in 0..600 {
            let bytes = value(1 + (i * 37) % 5000, i as u8);
            database.write(&format!("a/{i}"), &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
            written.insert(format!("a/{i}"), bytes);
        }
        for i in (0..600).step_by(7) {
            let bytes = value(1 + (i * 53) % 9000, 7);
            database.write(&format!("a/{i}"), &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
            written.insert(format!("a/{i}"), bytes);
        }
        for i in (3..600).step_by(11) {
            database.delete(&format!("a/{i}")).unwrap();
            written.remove(&format!("a/{i}"));
        }
        drop(database);
        let range = GetRange::Bounded(3..40);
        let check = |database: &Gdbm, written: &std::collections::BTreeMap<String, Vec<u8>>| {
            assert_eq!(database.list_all("").unwrap().len(), written.len());
            for (key, bytes) in written {
                let (entry, _, whole) = database.read(key, None, &|_| Ok(())).unwrap().unwrap();
                assert_eq!((entry.size, &whole[..]), (bytes.len() as u64, &bytes[..]), "{key}");
                if bytes.len() >= 40 {
                    let (_, at, part) = database.read(key, Some(&range), &|_| Ok(())).unwrap().unwrap();
                    assert_eq!((at, &part[..]), (3..40, &bytes[3..40]), "{key}");
                }
            }
        };
        let reader = open(&path, true).unwrap();
        assert_eq!(reader.placed(), written.len(), "every value placed from the buckets");
        check(&reader, &written);
        drop(reader);
        // A writer's own writes move values: each written key is read through the library again.
        let writer = open(&path, false).unwrap();
        assert_eq!(writer.placed(), written.len());
        for i in (0..600).step_by(5) {
            let bytes = value(100 + i, 99);
            writer.write(&format!("a/{i}"), &PutPayload::from(bytes.clone()), &Condition::Any).unwrap();
            written.insert(format!("a/{i}"), bytes);
        }
        assert!(writer.placed() < written.len() - 100);
        check(&writer, &written);
    }

    #[test]
    fn buckets_that_disagree_with_the_library_are_not_used() {
        let Some((_file, path)) = temp_file("gdbm-disagree") else { return };
        let database = open(&path, false).unwrap();
        database.write("abcdef", &PutPayload::from_static(b"value"), &Condition::Any).unwrap();
        drop(database);
        // The element's copy of the key's first bytes, changed: the library's lookup would no
        // longer find the key there, so the buckets are not trusted for any key.
        let mut bytes = std::fs::read(&path).unwrap();
        let int = |at: usize| i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        let dir = i64::from_ne_bytes(bytes[8..16].try_into().unwrap()) as usize;
        let bucket = i64::from_ne_bytes(bytes[dir..dir + 8].try_into().unwrap()) as usize;
        let element = (0..int(28) as usize).map(|e| bucket + 112 + 24 * e).find(|&e| int(e) != -1).unwrap();
        assert_eq!(&bytes[element + 4..element + 8], b"abcd");
        bytes[element + 4] = b'x';
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(open(&path, true).unwrap().placed(), 0);
    }

    #[test]
    fn a_listing_names_each_directory_once_and_only_its_own_files() {
        let Some((_file, path)) = temp_file("gdbm-listing") else { return };
        crate::store::database::check_listing(&open(&path, false).unwrap());
    }
}
