//! Any bytes as a shard file of a small sharded array (crc32c index at the end, one level of
//! nesting's worth of entries), read through the whole view: every lookup, listing and read of
//! every chunk ends in bytes or an error, never a panic, and the bytes served are exactly the
//! range the index names.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use shardfs::fs::{OpenMode, ROOT_INO, ShardFs};
use shardfs::mount::{filesystem, open_store};
use shardfs::view::index_cache::IndexCache;

const DOCUMENT: &str = r#"{"zarr_format": 3, "node_type": "array", "shape": [16], "data_type": "uint8",
 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8]}},
 "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
 "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": [{"name": "bytes"}],
   "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
   "index_location": "end"}}]}"#;

fn store() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("shardfs-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/c")).unwrap();
        std::fs::write(dir.join("a/zarr.json"), DOCUMENT).unwrap();
        std::fs::write(dir.join("zarr.json"), r#"{"zarr_format": 3, "node_type": "group"}"#).unwrap();
        dir
    })
}

fn walk(fs: &ShardFs, ino: u64) {
    let mut names = Vec::new();
    let _ = fs.readdirplus(ino, 2, |entry, _, _| {
        names.push(entry.name.clone());
        false
    });
    for name in names {
        let Ok((child, attr)) = fs.lookup(ino, &name) else { continue };
        if attr.kind == shardfs::store::Kind::Dir {
            walk(fs, child);
        } else if let Ok(fh) = fs.open(child, OpenMode::default()) {
            if let Ok(bytes) = fs.read(fh, 0, 1 << 16) {
                assert!(bytes.len() as u64 <= attr.size, "{name}: more bytes than its size");
            }
            fs.release(fh);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = store();
    std::fs::write(dir.join("a/c/0"), data).unwrap();
    std::fs::write(dir.join("a/c/1"), data.iter().rev().copied().collect::<Vec<u8>>()).unwrap();
    // A fresh filesystem each time: an index cached from the previous input must not hide this one.
    let fs = filesystem(open_store(dir).unwrap(), IndexCache::new(1 << 20), None).unwrap();
    walk(&fs, ROOT_INO);
});
