//! Store writer and checker for `scripts/bench.sh --profile huge`: sharded Zarr v3 stores of up
//! to 10^8 inner chunks written straight as shard files (zarr-python would take hours), and the
//! checks that what a mount serves is what was written.
//!
//!     huge_store write OUT --chunks N --per-dir D [--chunk-bytes B] [--per-shard S]
//!     huge_store plain OUT --files N [--chunk-bytes B]
//!     huge_store check MOUNTED_ARRAY --chunks N --per-dir D [--chunk-bytes B] [--samples K]
//!
//! `write`: OUT/zarr.json (a group) and the array OUT/a: N inner chunks of B bytes (uint8,
//! uncompressed), D to a chunk-key directory (`c/<row>/<n>`, rows = N / D), S to a shard (a row
//! of them; a crc32c index at the end), so that a listing of `a/c/<row>` has D files. Inner chunk
//! `(row, n)` holds bytes made from its place ([`chunk_bytes`]). `plain`: OUT/c/<n>, N plain files
//! of B bytes, as chunk files of a 1-D array would be (`ls -l` of a directory of N plain files).
//! `check`: reads K chunk files of a mounted array picked at random (a fixed sequence) and
//! compares each with what `write` put there; exits 1 at the first difference.

use std::io::Write;
use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else { usage() };
    let Some((target, flags)) = rest.split_first() else { usage() };
    let flag = |name: &str, default: Option<u64>| -> u64 {
        let at = flags.iter().position(|f| f == name);
        match (at.and_then(|i| flags.get(i + 1)), default) {
            (Some(value), _) => value.parse().unwrap_or_else(|_| fail(&format!("{name} {value}: not a number"))),
            (None, Some(default)) => default,
            (None, None) => fail(&format!("{name} is needed")),
        }
    };
    let bytes = flag("--chunk-bytes", Some(4)) as usize;
    match command.as_str() {
        "write" => {
            let (chunks, per_dir, per_shard) =
                (flag("--chunks", None), flag("--per-dir", None), flag("--per-shard", Some(4096)));
            if chunks % per_dir != 0 || per_dir % per_shard != 0 {
                fail("--chunks must be a multiple of --per-dir, and --per-dir of --per-shard");
            }
            write_store(Path::new(target), chunks / per_dir, per_dir, per_shard, bytes);
        }
        "plain" => write_plain(Path::new(target), flag("--files", None), bytes),
        "check" => {
            let (chunks, per_dir, samples) =
                (flag("--chunks", None), flag("--per-dir", None), flag("--samples", Some(10_000)));
            check(Path::new(target), chunks, per_dir, samples, bytes);
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: huge_store write OUT --chunks N --per-dir D [--chunk-bytes B] [--per-shard S]\n       \
         huge_store plain OUT --files N [--chunk-bytes B]\n       \
         huge_store check MOUNTED_ARRAY --chunks N --per-dir D [--chunk-bytes B] [--samples K]"
    );
    std::process::exit(2)
}

fn fail(message: &str) -> ! {
    eprintln!("huge_store: {message}");
    std::process::exit(1)
}

/// The bytes of inner chunk `n` of row `row`: every chunk unlike its neighbours.
fn chunk_bytes(row: u64, n: u64, len: usize) -> Vec<u8> {
    let seed = row.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    (0..len as u64).map(|i| (seed.wrapping_add(i.wrapping_mul(0x2545_F491)) >> 24) as u8).collect()
}

fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
}

fn write_store(out: &Path, rows: u64, per_dir: u64, per_shard: u64, bytes: usize) {
    let array = out.join("a");
    std::fs::create_dir_all(&array).unwrap_or_else(|e| fail(&format!("{}: {e}", array.display())));
    write_file(&out.join("zarr.json"), br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#);
    let document = format!(
        r#"{{"zarr_format": 3, "node_type": "array", "shape": [{rows}, {width}], "data_type": "uint8",
"chunk_grid": {{"name": "regular", "configuration": {{"chunk_shape": [1, {shard_width}]}}}},
"chunk_key_encoding": {{"name": "default", "configuration": {{"separator": "/"}}}}, "fill_value": 0,
"codecs": [{{"name": "sharding_indexed", "configuration": {{"chunk_shape": [1, {bytes}],
"codecs": [{{"name": "bytes"}}],
"index_codecs": [{{"name": "bytes", "configuration": {{"endian": "little"}}}}, {{"name": "crc32c"}}],
"index_location": "end"}}}}], "attributes": {{}}}}"#,
        width = per_dir * bytes as u64,
        shard_width = per_shard * bytes as u64,
    );
    write_file(&array.join("zarr.json"), document.as_bytes());
    let shards_per_row = per_dir / per_shard;
    let mut shard = Vec::with_capacity(per_shard as usize * (bytes + 16) + 4);
    for row in 0..rows {
        let dir = array.join("c").join(row.to_string());
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
        for s in 0..shards_per_row {
            shard.clear();
            for k in 0..per_shard {
                shard.extend_from_slice(&chunk_bytes(row, s * per_shard + k, bytes));
            }
            let mut index = Vec::with_capacity(per_shard as usize * 16);
            for k in 0..per_shard {
                index.extend_from_slice(&(k * bytes as u64).to_le_bytes());
                index.extend_from_slice(&(bytes as u64).to_le_bytes());
            }
            let crc = crc32c::crc32c(&index);
            shard.extend_from_slice(&index);
            shard.extend_from_slice(&crc.to_le_bytes());
            write_file(&dir.join(s.to_string()), &shard);
        }
        if row % 256 == 255 {
            eprint!("\rhuge_store: {} of {rows} rows", row + 1);
        }
    }
    eprintln!("\rhuge_store: {rows} rows of {per_dir} chunks written to {}", out.display());
}

fn write_plain(out: &Path, files: u64, bytes: usize) {
    let dir = out.join("c");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
    for n in 0..files {
        write_file(&dir.join(n.to_string()), &chunk_bytes(0, n, bytes));
    }
    eprintln!("huge_store: {files} plain files written to {}", dir.display());
}

fn check(array: &Path, chunks: u64, per_dir: u64, samples: u64, bytes: usize) {
    // A 64-bit LCG: the same picks every run.
    let mut state: u64 = 42;
    for _ in 0..samples {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let pick = (state >> 11) % chunks;
        let (row, n) = (pick / per_dir, pick % per_dir);
        let path: PathBuf = array.join("c").join(row.to_string()).join(n.to_string());
        let got = std::fs::read(&path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
        if got != chunk_bytes(row, n, bytes) {
            fail(&format!("{}: not the bytes written", path.display()));
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "huge_store: {samples} chunk files read exactly");
}
