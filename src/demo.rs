//! `shardfs demo`: writes a small sharded store and mounts it in the foreground, so that a new
//! user sees the view with `ls` and `cat` one command after cloning.
//!
//! The store exercises what the view does: gzip inner chunks with a crc32c index, a nested group,
//! partial edge shards, empty inner chunks, and one array whose index sits at the start.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;

use crate::format::shard_index::{Endian, IndexLocation, IndexSpec, assemble_shard};
use crate::fs::WriteOptions;
use crate::fuse::MountSettings;
use crate::mount::{self, MountConfig};
use crate::view::index_cache::{DEFAULT_BUDGET, DEFAULT_MAX_INDEX_BYTES};

/// One demo array: its store path, its documents' fields and how its values are made.
struct DemoArray {
    path: &'static str,
    shape: [u64; 2],
    shard: [u64; 2],
    inner: [u64; 2],
    gzip: bool,
    index: IndexLocation,
    checksum: bool,
    /// Element size in bytes (little-endian unsigned).
    item: usize,
    value: fn(u64, u64) -> u64,
}

const ARRAYS: [DemoArray; 2] = [
    DemoArray {
        path: "temperature",
        shape: [100, 110],
        shard: [40, 40],
        inner: [10, 10],
        gzip: true,
        index: IndexLocation::End,
        checksum: true,
        item: 2,
        // A cold corner (rows < 20, columns >= 80) is all fill value: those chunks are empty.
        value: |i, j| if i < 20 && j >= 80 { 0 } else { 200 + (i * 7 + j * 3) % 100 },
    },
    DemoArray {
        path: "survey/labels",
        shape: [50, 64],
        shard: [32, 32],
        inner: [8, 8],
        gzip: false,
        index: IndexLocation::Start,
        checksum: false,
        item: 1,
        value: |i, j| if (i / 8 + j / 8) % 3 == 0 { 0 } else { 1 + (i + j) % 5 },
    },
];

/// Writes the demo store under `dir` (unless one is there already) and returns its path.
pub fn write_store(dir: &Path) -> Result<PathBuf, String> {
    let store = dir.join("store");
    if store.join("zarr.json").exists() {
        return Ok(store);
    }
    let io = |e: std::io::Error| format!("{}: cannot write the demo store: {e}", store.display());
    std::fs::create_dir_all(store.join("survey")).map_err(io)?;
    let group = |attributes| {
        serde_json::to_vec_pretty(&json!({"zarr_format": 3, "node_type": "group", "attributes": attributes}))
    };
    std::fs::write(store.join("zarr.json"), group(json!({"title": "shardfs demo"})).expect("json")).map_err(io)?;
    std::fs::write(store.join("survey/zarr.json"), group(json!({"site": "north"})).expect("json")).map_err(io)?;
    for array in &ARRAYS {
        write_array(&store, array).map_err(io)?;
    }
    Ok(store)
}

fn write_array(store: &Path, a: &DemoArray) -> std::io::Result<()> {
    let dir = store.join(a.path);
    std::fs::create_dir_all(&dir)?;
    let mut inner_codecs = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
    if a.gzip {
        inner_codecs.push(json!({"name": "gzip", "configuration": {"level": 5}}));
    }
    let mut index_codecs = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
    if a.checksum {
        index_codecs.push(json!({"name": "crc32c"}));
    }
    let location = if a.index == IndexLocation::Start { "start" } else { "end" };
    let doc = json!({
        "zarr_format": 3, "node_type": "array", "shape": a.shape,
        "data_type": if a.item == 2 { "uint16" } else { "uint8" },
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": a.shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": a.inner, "codecs": inner_codecs, "index_codecs": index_codecs, "index_location": location}}],
        "attributes": {"units": if a.item == 2 { "kelvin" } else { "class" }},
        "dimension_names": ["y", "x"],
    });
    std::fs::write(dir.join("zarr.json"), serde_json::to_vec_pretty(&doc).expect("json"))?;
    let per_shard = [a.shard[0] / a.inner[0], a.shard[1] / a.inner[1]];
    let spec = IndexSpec {
        entries: per_shard[0] * per_shard[1],
        endian: Endian::Little,
        checksum: a.checksum,
        location: a.index,
    };
    for s0 in 0..a.shape[0].div_ceil(a.shard[0]) {
        for s1 in 0..a.shape[1].div_ceil(a.shard[1]) {
            let mut chunks = Vec::new();
            for l0 in 0..per_shard[0] {
                for l1 in 0..per_shard[1] {
                    chunks.push(chunk_bytes(a, [s0 * per_shard[0] + l0, s1 * per_shard[1] + l1])?);
                }
            }
            if chunks.iter().any(Option::is_some) {
                let path = dir.join(format!("c/{s0}/{s1}"));
                std::fs::create_dir_all(path.parent().expect("has a parent"))?;
                std::fs::write(path, assemble_shard(&spec, &chunks))?;
            }
        }
    }
    Ok(())
}

/// The encoded inner chunk at grid position `chunk`, or `None` when it is all fill value or
/// outside the array (both stay empty, as zarr-python writes them).
fn chunk_bytes(a: &DemoArray, chunk: [u64; 2]) -> std::io::Result<Option<Vec<u8>>> {
    let mut raw = Vec::new();
    let mut any = false;
    for i in chunk[0] * a.inner[0]..(chunk[0] + 1) * a.inner[0] {
        for j in chunk[1] * a.inner[1]..(chunk[1] + 1) * a.inner[1] {
            let inside = i < a.shape[0] && j < a.shape[1];
            let v = if inside { (a.value)(i, j) } else { 0 };
            any |= v != 0;
            raw.extend_from_slice(&v.to_le_bytes()[..a.item]);
        }
    }
    if !any {
        return Ok(None);
    }
    if !a.gzip {
        return Ok(Some(raw));
    }
    let mut gz = GzEncoder::new(Vec::new(), Compression::new(5));
    gz.write_all(&raw)?;
    gz.finish().map(Some)
}

/// `shardfs demo [DIR]`: writes the store, mounts it at `DIR/view` in the foreground, and prints
/// what to try.
pub fn run(dir: &Path, verbosity: u8) -> Result<(), String> {
    let store = write_store(dir)?;
    let view = dir.join("view");
    std::fs::create_dir_all(&view).map_err(|e| format!("{}: {e}", view.display()))?;
    let v = view.display();
    println!("shardfs demo: the sharded store {} is mounted unsharded at {v}", store.display());
    println!("Try, in another terminal:");
    println!("  ls {v}/temperature/c/0              # inner chunks, one file each");
    println!("  find {v} -type f | sort | head");
    println!("  diff {}/temperature/zarr.json {v}/temperature/zarr.json", store.display());
    println!("  zcat {v}/temperature/c/3/4 | od -An -tu2 | head -3");
    println!("  ls -l {}/temperature/c/0            # the shards behind them", store.display());
    println!("Press Ctrl-C here to unmount.");
    mount::run(&MountConfig {
        store: (&store).into(),
        mountpoint: view,
        foreground: true,
        settings: MountSettings { options: Vec::new(), threads: 2, read_only: false, io_uring: false },
        cache_bytes: DEFAULT_BUDGET,
        max_index_bytes: DEFAULT_MAX_INDEX_BYTES,
        writes: WriteOptions::default(),
        verbosity,
        log_file: None,
        metrics_address: None,
        zarr_format: 3,
    })
}
