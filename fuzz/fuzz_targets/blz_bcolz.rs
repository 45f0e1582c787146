//! Any bytes as bcolz metadata (`meta/sizes` and `meta/storage`, split at the first byte's
//! position), a chunk file, and a blosc chunk decoded by c-blosc: never a panic, and a chunk that
//! decodes holds exactly the bytes its header says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::blz::{bcolz, blosc};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let (sizes, storage) = rest.split_at((split as usize).min(rest.len()));
    if let Ok(carray) = bcolz::Carray::parse(sizes, storage) {
        let _ = (carray.nchunks(), carray.row_bytes(), carray.rows_in(carray.nchunks()));
    }
    let _ = (bcolz::columns(rest), bcolz::attributes(rest), bcolz::check_chunk_header(rest));
    if let Ok(header) = blosc::Header::parse(rest)
        && (header.nbytes as usize) < 1 << 20
        && let Some(chunk) = rest.get(..header.ctbytes as usize)
        && let Ok(decoded) = blosc::decompress(chunk, header.nbytes as usize)
    {
        assert_eq!(decoded.len(), header.nbytes as usize);
    }
});
