//! Any bytes as a Bloscpack file: reading its header, metadata and offsets and walking its chunks
//! never panics, and every chunk found lies inside the file, after the header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::blz::bloscpack::{Prefix, chunks, prefix_len};

fuzz_target!(|data: &[u8]| {
    let Ok(len) = prefix_len(&data[..data.len().min(64)]) else { return };
    let Some(prefix) = data.get(..len.min(data.len() as u64) as usize) else { return };
    let Ok(prefix) = Prefix::parse(prefix) else { return };
    let _ = prefix.array(data.len() as u64);
    let file_len = data.len() as u64;
    let read = |at: u64| data.get(at as usize..).map(|rest| rest[..rest.len().min(16)].to_vec());
    let table = chunks(&prefix, file_len, read);
    assert!(table.chunks.len() <= prefix.header.nchunks.max(0) as usize);
    for chunk in table.chunks.into_iter().flatten() {
        let end = chunk.start + chunk.blosc.ctbytes as u64 + prefix.header.checksum.size();
        assert!(chunk.start >= prefix.data_start && end <= file_len, "{chunk:?}");
    }
});
