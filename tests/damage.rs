//! Damaged shards and refused layouts, through the filesystem logic without FUSE: each damage
//! costs exactly the chunks it touches (EIO, never a silent fill value), and everything else
//! keeps being served.

mod common;

use common::*;
use shardfs::fs::Error;
use shardfs::fs::ShardFs;

fn names(fs: &ShardFs, path: &str) -> Vec<String> {
    let dir = lookup(fs, path).unwrap();
    let mut out = Vec::new();
    fs.readdir(dir, 2, |e, _| {
        out.push(e.name.clone());
        false
    })
    .unwrap();
    out
}

#[test]
fn checksum_mismatch_fails_that_shard_only() {
    let store = sharded_copy();
    // Shard c/1/0 holds chunks (2..4, 0..2); flip one byte of its index.
    let shard = store.path().join("zp/gzip_crc_end/c/1/0");
    patch(&shard, -10, &[0xff]);
    let fs = fs_of(store.path());
    assert_damaged(&fs, "zp/gzip_crc_end/c/2/0", &shard);
    assert_damaged(&fs, "zp/gzip_crc_end/c/3/1", &shard);
    // The damaged shard's chunks stay listed, so readers see EIO rather than a missing chunk.
    assert_eq!(names(&fs, "zp/gzip_crc_end/c/2"), ["0", "1", "2"]);
    let ok = lookup(&fs, "zp/gzip_crc_end/c/4/0").unwrap();
    assert_eq!(read_all(&fs, ok), twin("zp/gzip_crc_end/c/4/0"));
    let ok = lookup(&fs, "zp/gzip_crc_end/c/2/2").unwrap();
    assert_eq!(read_all(&fs, ok), twin("zp/gzip_crc_end/c/2/2"));
}

#[test]
fn truncated_shard_fails_its_chunks() {
    let store = sharded_copy();
    let shard = store.path().join("zp/raw_nocrc/c/1");
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(10).unwrap();
    let fs = fs_of(store.path());
    for chunk in ["3", "4", "5"] {
        assert_damaged(&fs, &format!("zp/raw_nocrc/c/{chunk}"), &shard);
    }
    let ok = lookup(&fs, "zp/raw_nocrc/c/6").unwrap();
    assert_eq!(read_all(&fs, ok), twin("zp/raw_nocrc/c/6"));
}

#[test]
fn bad_entries_fail_alone() {
    let store = sharded_copy();
    // raw_nocrc: 8 chunks of 4 in shards of 3 entries (16 bytes each, little-endian, at the end).
    let c2 = store.path().join("zp/raw_nocrc/c/2");
    patch(&c2, -48 + 8, &u64::MAX.to_le_bytes()[..7]); // chunk 6: nbytes runs past the end
    let c1 = store.path().join("zp/raw_nocrc/c/1");
    patch(&c1, -32, &u64::MAX.to_le_bytes()); // chunk 4: only the offset is the empty sentinel
    let fs = fs_of(store.path());
    assert_damaged(&fs, "zp/raw_nocrc/c/6", &c2);
    assert_damaged(&fs, "zp/raw_nocrc/c/4", &c1);
    for ok in ["3", "5", "7"] {
        let ino = lookup(&fs, &format!("zp/raw_nocrc/c/{ok}")).unwrap();
        assert_eq!(read_all(&fs, ino), twin(&format!("zp/raw_nocrc/c/{ok}")));
    }
    assert_eq!(names(&fs, "zp/raw_nocrc/c"), ["2", "3", "4", "5", "6", "7"]);
}

#[test]
fn a_shard_truncated_while_open_reads_as_damaged() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let fh = fs.open(lookup(&fs, "zp/raw_nocrc/c/7").unwrap(), shardfs::fs::OpenMode::default()).unwrap();
    let shard = store.path().join("zp/raw_nocrc/c/2");
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(2).unwrap();
    match fs.read(fh, 0, 4096) {
        Err(Error::Damaged(msg)) => assert!(msg.contains(shard.to_str().unwrap()), "{msg}"),
        other => panic!("expected a damaged-shard error, got {other:?}"),
    }
}

#[test]
fn a_shard_that_is_a_directory_fails_its_chunks() {
    let store = sharded_copy();
    let shard = store.path().join("zp/raw_nocrc/c/1");
    std::fs::remove_file(&shard).unwrap();
    std::fs::create_dir(&shard).unwrap();
    let fs = fs_of(store.path());
    assert_damaged(&fs, "zp/raw_nocrc/c/4", &shard);
    assert!(names(&fs, "zp/raw_nocrc/c").contains(&"4".to_string()));
    assert!(lookup(&fs, "zp/raw_nocrc/c/2").is_ok());
    // readdirplus lists the damaged shard's chunks without attributes, so the kernel caches
    // nothing for them and asks again, getting the error; the other chunks come with theirs.
    let plus = list_plus(&fs, lookup(&fs, "zp/raw_nocrc/c").unwrap());
    let attrs = |name: &str| plus.iter().find(|(e, _)| e.name == name).map(|(_, a)| *a).unwrap();
    assert!(attrs("4").is_none());
    assert_eq!(attrs("2").map(|a| a.size), Some(twin("zp/raw_nocrc/c/2").len() as u64));
}

#[test]
fn readdirplus_leaves_one_reference_per_entry_taken() {
    let fs = fs_of(&golden().join("sharded"));
    let dir = lookup(&fs, "zp/raw_nocrc/c").unwrap();
    let baseline = fs.known_inodes();
    // A reply that fills after two entries: the entry that did not fit must not stay referenced.
    let mut taken = Vec::new();
    fs.readdirplus(dir, 2, |e, _, _| {
        if taken.len() == 2 {
            return true;
        }
        taken.push(e.ino);
        false
    })
    .unwrap();
    assert_eq!(fs.known_inodes(), baseline + 2);
    for ino in taken {
        fs.forget(ino, 1);
    }
    assert_eq!(fs.known_inodes(), baseline);
}

#[test]
fn refused_layouts_are_shown_as_stored() {
    let store = sharded_copy();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("zp/raw_nocrc", |d| {
            let codecs = d["codecs"].as_array_mut().unwrap();
            codecs.insert(0, serde_json::json!({"name": "transpose", "configuration": {"order": [0]}}));
        }),
        ("zp/gzip_crc_end", |d| {
            d["codecs"].as_array_mut().unwrap().push(serde_json::json!({"name": "gzip", "configuration": {"level": 1}}))
        }),
        ("ts/zstd_crc", |d| d["storage_transformers"] = serde_json::json!([{"name": "other"}])),
    ];
    for (array, edit) in edits {
        let path = store.path().join(array).join("zarr.json");
        let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut doc);
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    }
    let fs = fs_of(store.path());
    let (view, _) = walk_view(&fs);
    let (stored, _) = walk_dir(store.path());
    for (array, _) in edits {
        let in_array = |m: &std::collections::BTreeMap<String, Vec<u8>>| {
            m.iter()
                .filter(|(k, _)| k.starts_with(&format!("{array}/")))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(in_array(&view), in_array(&stored), "{array} must be shown exactly as stored");
    }
    // The other arrays are still unsharded in the view.
    assert_eq!(view["zp/nested/c/1/0"], twin("zp/nested/c/1/0"));
}

#[test]
fn a_shard_rewritten_underneath_is_read_anew() {
    let store = sharded_copy();
    let fs = fs_of(store.path());
    let first = lookup(&fs, "zp/gzip_crc_end/c/2/0").unwrap();
    assert_eq!(read_all(&fs, first), twin("zp/gzip_crc_end/c/2/0"));
    // Replace shard (1, 0) by shard (2, 0): same shape, other data, a new file.
    let dir = store.path().join("zp/gzip_crc_end/c");
    std::fs::copy(dir.join("2/0"), dir.join("tmp")).unwrap();
    std::fs::rename(dir.join("tmp"), dir.join("1/0")).unwrap();
    let again = lookup(&fs, "zp/gzip_crc_end/c/2/0").unwrap();
    assert_ne!(again, first, "another version of the content: another inode");
    assert_eq!(read_all(&fs, again), twin("zp/gzip_crc_end/c/4/0"));
    assert!(matches!(fs.open(first, Default::default()), Err(shardfs::fs::Error::Stale(_))));
    assert_eq!(fs.getattr(first).unwrap().size, twin("zp/gzip_crc_end/c/2/0").len() as u64, "its own size");
}

#[test]
fn lookups_outside_the_array_or_the_key_space_find_nothing() {
    let fs = fs_of(&golden().join("sharded"));
    assert!(lookup(&fs, "zp/raw_nocrc/c/7").is_ok());
    for path in [
        "zp/raw_nocrc/c/8",        // stored empty by the writer: outside the array
        "zp/raw_nocrc/c/0",        // all fill value, never stored
        "zp/raw_nocrc/c/07",       // not a canonical key
        "zp/raw_nocrc/c/99",       // far outside
        "zp/keys/v2_dot/5.0",      // outside, other key encoding
        "zp/keys/v2_dot/c.1.0",    // another encoding's key
        "zp/gzip_crc_end/c/9",     // a directory outside the grid
        "zp/gzip_crc_end/c/1/0/x", // below a chunk file
    ] {
        let result = lookup(&fs, path);
        assert!(matches!(result, Err(Error::NotFound) | Err(Error::NotADirectory)), "{path}: {result:?}");
    }
}

#[test]
fn the_private_directory_is_not_shown() {
    let store = sharded_copy();
    std::fs::create_dir_all(store.path().join("__shardfs/journal")).unwrap();
    let fs = fs_of(store.path());
    assert!(matches!(lookup(&fs, "__shardfs"), Err(Error::NotFound)));
    let (view, dirs) = walk_view(&fs);
    assert!(!dirs.iter().any(|d| d.starts_with("__shardfs")));
    assert!(!view.keys().any(|k| k.starts_with("__shardfs")));
}
