//! Any string as a chunk key of every encoding and rank: decoding never panics, and a key that
//! decodes is the canonical encoding of its coordinates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::chunk_key::{ChunkKeyEncoding, KeyStyle};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = std::str::from_utf8(data) else { return };
    for style in [KeyStyle::Default, KeyStyle::V2, KeyStyle::Draft] {
        for separator in ['/', '.'] {
            let encoding = ChunkKeyEncoding { style, separator };
            for rank in 0..5 {
                if let Some(coords) = encoding.decode(key, rank) {
                    assert_eq!(coords.len(), rank);
                    assert_eq!(encoding.encode(&coords), key, "{encoding:?} rank {rank}");
                }
                if let Some(prefix) = encoding.decode_dir(key, rank) {
                    assert!(prefix.len() < rank.max(1), "{encoding:?} rank {rank}: {prefix:?}");
                }
            }
        }
    }
});
