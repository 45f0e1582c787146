//! Any bytes as a shard under every index layout: decoding never panics, and every entry it
//! serves lies inside the shard's data area.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex};

fuzz_target!(|data: &[u8]| {
    let Some((&entries, shard)) = data.split_first() else { return };
    for endian in [Endian::Little, Endian::Big] {
        for checksum in [false, true] {
            for location in [IndexLocation::Start, IndexLocation::End] {
                let spec = IndexSpec { entries: u64::from(entries % 64), endian, checksum, location };
                let blob_len = shard.len() as u64;
                let Ok(range) = spec.index_range(blob_len) else { continue };
                let bytes = &shard[range.start as usize..range.end as usize];
                let Ok(index) = ShardIndex::decode(&spec, bytes, blob_len, 0) else { continue };
                let data_area = spec.data_range(blob_len);
                for i in 0..index.entries() + 2 {
                    if let Ok(Some(chunk)) = index.chunk(i) {
                        assert!(data_area.start <= chunk.start && chunk.end <= data_area.end, "{chunk:?}");
                    }
                }
            }
        }
    }
});
