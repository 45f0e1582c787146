//! A Kyoto Cabinet file of Zarr keys, hash (`.kch`) or tree (`.kct`): keys the Zarr keys in
//! UTF-8, values the bytes, the layout of the other key-value files. Through Debian's Kyoto
//! Cabinet library ([`library`]), loaded when such a file is mounted; served as a [`KeyedFile`]
//! under Kyoto Cabinet's lock (a writable mount its one writer, a read-only mount a reader).
//! Each write is synced to the device before it returns.

mod layout;
mod library;

use std::path::Path;

use super::keyed_file::KeyedFile;

const STORE: &str = "Kyoto Cabinet";

/// The first bytes of every Kyoto Cabinet hash file (a tree file is one too).
const MAGIC: &[u8; 4] = b"KC\n\0";

/// A Kyoto Cabinet file of Zarr keys, locked by this process.
pub type Kyoto = KeyedFile<library::File>;

/// Which kind of Kyoto Cabinet file the local file at `path` is, by its header (`kch` or `kct`),
/// if it is one.
pub fn kind(path: &Path) -> Option<&'static str> {
    use std::io::Read;
    let mut start = [0; 9];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut start)).ok()?;
    // The header's type byte: 0x30 a hash file, 0x31 a tree file (kchashdb.h, kcplantdb.h).
    match (&start[..4] == MAGIC, start[8]) {
        (true, 0x30) => Some("kch"),
        (true, 0x31) => Some("kct"),
        _ => None,
    }
}

/// Opens the file at `path`, of `kind`, as its writer unless `read_only`; fails, naming it and the
/// cause, when another process holds it, it is damaged, or the library is missing.
pub fn open(path: &Path, kind: &str, read_only: bool) -> Result<Kyoto, String> {
    let name = path.display().to_string();
    if name.contains('#') {
        return Err(format!("{name}: Kyoto Cabinet reads '#' in a path as the start of its options"));
    }
    // The kind from the header, not the name's suffix, which Kyoto Cabinet would go by.
    let file = || {
        library::File::open(path, kind, !read_only).map_err(|why| {
            if why.contains("lock") {
                format!("{name}: held by another process ({why}: Kyoto Cabinet lets one writer, or only readers, open a file)")
            } else {
                format!("{name}: {why}")
            }
        })
    };
    KeyedFile::open(STORE, path, file, read_only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::{Condition, Database, Objects};
    use object_store::PutPayload;

    /// A new empty file of `kind`, made with Kyoto Cabinet's own tool, removed when the guard is
    /// dropped; `None` (said loudly) where the tools are missing, unless
    /// `SHARDFS_REQUIRE_KYOTO=1` (`.ci/run`) makes that a failure.
    fn temp_file(label: &str, kind: &str) -> Option<(Removed, std::path::PathBuf)> {
        tuned_file(label, kind, &[])
    }

    /// [`temp_file`], made with `tuning` (the tool's `create` options).
    fn tuned_file(label: &str, kind: &str, tuning: &[&str]) -> Option<(Removed, std::path::PathBuf)> {
        let path = std::env::temp_dir().join(format!("shardfs-{label}-{}.{kind}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let tool = if kind == "kch" { "kchashmgr" } else { "kctreemgr" };
        match std::process::Command::new(tool).arg("create").args(tuning).arg(&path).status() {
            Ok(status) => assert!(status.success(), "{tool} create failed"),
            Err(e) if std::env::var("SHARDFS_REQUIRE_KYOTO").as_deref() != Ok("1") => {
                eprintln!("*** SKIPPED: {tool}: {e} (apt-get install kyotocabinet-utils) ***");
                return None;
            }
            Err(e) => panic!("{tool}: {e}"),
        }
        assert_eq!(super::kind(&path), Some(kind));
        Some((Removed(path.clone()), path))
    }

    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn hash_and_tree_files_pass_the_conformance_checks_and_list_their_directories() {
        for kind in ["kch", "kct"] {
            let Some((_file, path)) = temp_file("kyoto-conformance", kind) else { return };
            let store =
                Objects::mount(open(&path, kind, false).unwrap(), STORE, "test", false, Default::default()).unwrap();
            crate::store::conformance::check(&store);
            drop(store);
            let Some((_file, path)) = temp_file("kyoto-listing", kind) else { return };
            crate::store::database::check_listing(&open(&path, kind, false).unwrap());
        }
    }

    #[test]
    fn versions_change_with_this_stores_writes_and_a_held_file_is_refused() {
        let Some((_file, path)) = temp_file("kyoto-versions", "kct") else { return };
        let database = open(&path, "kct", false).unwrap();
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        // Kyoto Cabinet's lock is per process (fcntl): another process is refused.
        let other =
            std::process::Command::new("kctreemgr").args(["set", "-otl"]).arg(&path).args(["b", "x"]).output().unwrap();
        assert!(!other.status.success(), "a second writer got in");
        drop(database);
        let listed = std::process::Command::new("kctreemgr").arg("get").arg(&path).arg("a").output().unwrap();
        assert_eq!(listed.stdout, b"two\n");
    }

    /// Values of the sizes that take each form of a record's header and padding.
    /// A fresh file of `kind` (as [`temp_file`]) holding [`values`], closed.
    fn written(label: &str, kind: &str) -> Option<(Removed, std::path::PathBuf)> {
        let (file, path) = temp_file(label, kind)?;
        let database = open(&path, kind, false).unwrap();
        for (key, value) in values() {
            database.write(&key, &PutPayload::from(value), &Condition::Any).unwrap();
        }
        Some((file, path))
    }

    fn values() -> Vec<(String, Vec<u8>)> {
        [0usize, 1, 7, 300, 4095, 70_000, (1 << 20) + 3]
            .iter()
            .enumerate()
            .map(|(i, &len)| (format!("a/c/{i}"), (0..len).map(|b| (b * 31 + i) as u8).collect()))
            .collect()
    }

    #[test]
    fn a_read_only_files_values_are_read_where_its_records_place_them_in_every_layout() {
        let tunings: [(&str, &[&str]); 11] = [
            ("kch", &[]),
            ("kch", &["-ts"]),
            ("kch", &["-tl"]),
            ("kch", &["-ts", "-tl"]),
            ("kch", &["-apow", "0", "-fpow", "0"]),
            ("kch", &["-apow", "10", "-fpow", "2", "-bnum", "3"]),
            ("kch", &["-tc"]),
            ("kct", &[]),
            ("kct", &["-psiz", "256", "-bnum", "5"]),
            ("kct", &["-ts", "-tl", "-apow", "0"]),
            ("kct", &["-tc"]),
        ];
        for (kind, tuning) in tunings {
            let Some((_file, path)) = tuned_file("kyoto-layout", kind, tuning) else { return };
            let mut expected: std::collections::BTreeMap<String, Vec<u8>> = values().into_iter().collect();
            // Small values too, many to a tree's leaf, and leaves enough to split.
            expected.extend((0..200).map(|i| (format!("b/c/{i}"), format!("small {i}").into_bytes())));
            let database = open(&path, kind, false).unwrap();
            for (key, value) in &expected {
                database.write(key, &PutPayload::from(value.clone()), &Condition::Any).unwrap();
            }
            // A value grown (its record moved, a free block left), one removed, one new in the
            // space freed.
            let grown = vec![9; 100_000];
            database.write("a/c/3", &PutPayload::from(grown.clone()), &Condition::Any).unwrap();
            expected.insert("a/c/3".into(), grown);
            database.delete("a/c/5").unwrap();
            expected.remove("a/c/5");
            database.write("a/c/new", &PutPayload::from_static(b"after"), &Condition::Any).unwrap();
            expected.insert("a/c/new".into(), b"after".to_vec());
            drop(database);

            let database = open(&path, kind, true).unwrap();
            let placed = if tuning == ["-tc"] { 0 } else { expected.len() };
            assert_eq!(database.placed(), placed, "{kind} {tuning:?}");
            for (key, value) in &expected {
                let (entry, _, got) = database.read(key, None, &|_| Ok(())).unwrap().unwrap();
                assert_eq!((entry.size, &got[..]), (value.len() as u64, &value[..]), "{key} of {kind} {tuning:?}");
            }
            let listed: Vec<String> = database.list_all("").unwrap().into_iter().map(|(key, _)| key).collect();
            assert_eq!(listed, expected.keys().cloned().collect::<Vec<_>>(), "{kind} {tuning:?}");
        }
    }

    #[test]
    fn a_hash_file_whose_records_are_not_as_its_header_says_is_read_through_the_library() {
        let Some((_file, path)) = written("kyoto-layout-damaged", "kch") else { return };
        let file = std::fs::File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        assert_eq!(layout::places(&file, len, false).unwrap().len(), values().len());
        // The header's count one more than the records, and its size past the file's end.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[39] += 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = layout::places(&std::fs::File::open(&path).unwrap(), len, false).unwrap_err();
        assert!(error.contains("records, where its header counts"), "{error}");
        bytes[39] -= 1;
        let size = u64::from_be_bytes(bytes[40..48].try_into().unwrap());
        bytes[40..48].copy_from_slice(&(size + 8).to_be_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(layout::places(&std::fs::File::open(&path).unwrap(), len, false).is_err());
        bytes[40..48].copy_from_slice(&size.to_be_bytes());
        // A record's padding magic changed: refused.
        let pad = bytes.windows(3).rposition(|w| w == [0xee, 0, 0]).unwrap();
        bytes[pad] = 0xef;
        std::fs::write(&path, &bytes).unwrap();
        let error = layout::places(&std::fs::File::open(&path).unwrap(), len, false).unwrap_err();
        assert!(error.contains("padding"), "{error}");
    }

    #[test]
    fn a_tree_file_whose_leaves_are_not_as_its_meta_data_says_is_read_through_the_library() {
        let Some((_file, path)) = written("kyoto-layout-tree", "kct") else { return };
        let len = std::fs::metadata(&path).unwrap().len();
        let places = |path: &std::path::Path| layout::places(&std::fs::File::open(path).unwrap(), len, true);
        assert_eq!(places(&path).unwrap().len(), values().len());
        assert!(layout::places(&std::fs::File::open(&path).unwrap(), len, false).is_err(), "not a hash file");
        // The meta data's count of records (16 bytes before its closing magic) one more.
        let mut bytes = std::fs::read(&path).unwrap();
        let magic = bytes.windows(8).position(|w| w == b"\nBoofy!\n").unwrap();
        bytes[magic - 9] += 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = places(&path).unwrap_err();
        assert!(error.contains("records, where its header counts"), "{error}");
        assert_eq!(open(&path, "kct", true).unwrap().placed(), 0, "read through the library");
    }

    /// Review: a header whose size ends one byte into a record (or a free block whose size ends
    /// one byte short of the records' end, with 1-byte alignment) must be refused, not panicked on:
    /// `scan` reads `head[1]` of a 1-byte head (layout.rs, `RECORD_MAGIC => head[1]`).
    #[test]
    fn review_a_record_head_of_one_byte_is_refused_not_panicked_on() {
        let Some((_file, path)) = tuned_file("kyoto-review-short", "kch", &["-bnum", "1", "-fpow", "0"]) else {
            return;
        };
        let database = open(&path, "kch", false).unwrap();
        database.write("a/c/0", &PutPayload::from_static(b"value"), &Condition::Any).unwrap();
        drop(database);
        let mut bytes = std::fs::read(&path).unwrap();
        let bnum = u64::from_be_bytes(bytes[16..24].try_into().unwrap());
        let records = (64 + 6 * bnum).div_ceil(8) * 8;
        assert_eq!(bytes[records as usize], 0xcc, "a record at {records}");
        // One byte of the header's size changed: the records end one byte into the first.
        bytes[40..48].copy_from_slice(&(records + 1).to_be_bytes());
        std::fs::write(&path, &bytes).unwrap();
        // The mount itself: the library opens it (trimming the file to that size), then lists.
        let mounted = std::panic::catch_unwind(|| open(&path, "kch", true).map(|d| d.placed()));
        assert!(mounted.is_ok(), "a read-only mount panicked");
        let file = std::fs::File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        let parsed = std::panic::catch_unwind(|| layout::places(&file, len, false).map(|p| p.len()));
        assert!(matches!(parsed, Ok(Err(_))), "places: {:?}", parsed.map_err(|_| "panicked"));
    }

    #[test]
    fn review_a_free_block_ending_at_the_last_byte_is_refused_not_panicked_on() {
        let Some((_file, path)) = tuned_file("kyoto-review-free", "kch", &["-bnum", "1", "-fpow", "0", "-apow", "0"])
        else {
            return;
        };
        let database = open(&path, "kch", false).unwrap();
        database.write("a/c/0", &PutPayload::from_static(b"1234567890"), &Condition::Any).unwrap();
        database.write("a/c/1", &PutPayload::from_static(b"xyz"), &Condition::Any).unwrap();
        database.delete("a/c/0").unwrap();
        drop(database);
        let mut bytes = std::fs::read(&path).unwrap();
        let bnum = u64::from_be_bytes(bytes[16..24].try_into().unwrap());
        let size = u64::from_be_bytes(bytes[40..48].try_into().unwrap());
        let records = 64 + 6 * bnum;
        assert_eq!(&bytes[records as usize..records as usize + 2], &[0xdd, 0xdd], "a free block at {records}");
        // The free block's size field: it now ends at the file's last byte ('z').
        bytes[records as usize + 2..records as usize + 8].copy_from_slice(&(size - 1 - records).to_be_bytes()[2..]);
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let parsed = std::panic::catch_unwind(|| layout::places(&file, bytes.len() as u64, false).map(|p| p.len()));
        assert!(matches!(parsed, Ok(Err(_))), "places: {:?}", parsed.map_err(|_| "panicked"));
    }
}
