//! Any bytes as a kerchunk JSON reference file (templates, `gen` and its expressions included), as
//! `.zmetadata` and as an array's `.zarray`: never a panic. A reference set is read from untrusted
//! files; a `gen` expression is evaluated, so its arithmetic must not overflow or hang. Record
//! files are not fuzzed here: the parquet crate panics on some damaged ones, which
//! `format::foreign` catches and libFuzzer's panic hook would not let it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::kerchunk::{self, parquet};

fuzz_target!(|data: &[u8]| {
    let _ = kerchunk::parse_json(data);
    let _ = parquet::metadata(data);
    let _ = parquet::ChunkGrid::of_zarray(data);
});
