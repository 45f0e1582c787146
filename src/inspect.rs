//! Store-wide scans behind `shardfs check` and `shardfs info`: every sharded array, every shard
//! on disk, every index level read and verified (checksum, truncation, entries outside the data
//! area, half-empty sentinels, overlapping entries), and commits the journal says were cut short.
//! Only indexes are read, unless chunk data is asked for ([`Depth::Data`]).
//!
//! - [`data`]: `check --data`, every stored inner chunk decoded with its array's codecs.
//! - [`refs`]: `shardfs refs`, the view as a kerchunk reference file.

pub mod data;
pub mod refs;

use std::ops::Range;

use crate::format::codecs::ChunkCodecs;
use crate::format::shard_index::ShardIndex;
use crate::format::sharding::Level;
use crate::format::{ome, zarr_v2};
use crate::progress::{Progress, Silent};
use crate::store::{self, Kind, Object, Store, join};
use crate::view::array::ShardedArray;
use crate::view::arrays::find_arrays;
use crate::view::error::Error as ViewError;
use crate::view::shards::shards_on_disk;
use crate::view::sources::Sources;
use crate::write::journal::{journal_dir, list_names};
pub use data::Depth;
use data::{StoredChunk, codecs_of};

/// What one sharded array holds, and what is wrong with it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ArrayReport {
    pub dir: String,
    pub shards: u64,
    /// Stored inner chunks (innermost level).
    pub chunks: u64,
    /// Bytes of stored inner chunks.
    pub live_bytes: u64,
    /// Bytes of indexes, every level.
    pub index_bytes: u64,
    /// Bytes of shard files that neither a chunk nor an index uses (left by appends).
    pub unused_bytes: u64,
    /// One line per problem, naming the shard file.
    pub problems: Vec<String>,
    /// Stored inner chunks decoded ([`Depth::Data`]), whether or not they decoded.
    pub decoded: u64,
    /// Why this array's chunks were not decoded, with [`Depth::Data`] (a codec shardfs does not
    /// decode); chunks whose codecs have no checksum are decoded, but a changed byte may pass.
    pub not_decoded: Option<String>,
    /// With [`Depth::Data`]: a changed byte of a stored chunk is always found (a crc32c or gzip
    /// ends the codecs).
    pub checksummed: bool,
}

/// The whole store.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreReport {
    pub arrays: Vec<ArrayReport>,
    /// Arrays shown as stored rather than unsharded, with the reason.
    pub refused: Vec<(String, String)>,
    /// Metadata documents that are not JSON objects, with the reason: no reader can open them.
    pub invalid: Vec<(String, String)>,
    /// Journal records of commits that did not finish (`shardfs check --repair` settles them).
    pub unfinished: Vec<String>,
}

impl StoreReport {
    /// True when nothing is damaged and no commit is unfinished.
    pub fn healthy(&self) -> bool {
        self.unfinished.is_empty() && self.invalid.is_empty() && self.arrays.iter().all(|a| a.problems.is_empty())
    }
}

/// Scans every array of the store.
pub fn scan(store: &dyn Store) -> Result<StoreReport, store::Error> {
    scan_reporting(store, &Silent)
}

/// [`scan`], telling `progress` about each shard.
pub fn scan_reporting(store: &dyn Store, progress: &dyn Progress) -> Result<StoreReport, store::Error> {
    scan_with(store, Depth::Indexes, progress)
}

/// [`scan_reporting`], also decoding every stored inner chunk with [`Depth::Data`].
pub fn scan_with(store: &dyn Store, depth: Depth, progress: &dyn Progress) -> Result<StoreReport, store::Error> {
    let mut report = StoreReport::default();
    let found = find_arrays(store)?;
    report.refused = found.refused;
    report.invalid = found.invalid;
    // Every array's shards are listed first, so that the progress knows how many there are.
    let listed: Vec<_> =
        found.sharded.iter().map(|array| (array, shards_on_disk(store, array, &[], &Sources::default()))).collect();
    progress.start(listed.iter().map(|(_, shards)| shards.as_ref().map_or(0, |s| s.len() as u64)).sum());
    let scanned: Result<Vec<ArrayReport>, store::Error> =
        listed.into_iter().map(|(array, shards)| scan_array(store, array, shards, depth, progress)).collect();
    progress.finish();
    report.arrays = scanned?;
    for name in list_names(store, &journal_dir())? {
        report.unfinished.push(store.describe(&join(&journal_dir(), &name)));
    }
    Ok(report)
}

fn scan_array(
    store: &dyn Store,
    array: &ShardedArray,
    shards: Result<Vec<Vec<u64>>, ViewError>,
    depth: Depth,
    progress: &dyn Progress,
) -> Result<ArrayReport, store::Error> {
    let mut report = ArrayReport { dir: array.dir.to_string(), ..Default::default() };
    progress.array(&array.dir);
    let codecs = match depth {
        Depth::Indexes => None,
        Depth::Data => match codecs_of(array) {
            Ok(codecs) => {
                report.checksummed = codecs.detects_every_change();
                Some(codecs)
            }
            Err(why) => {
                report.not_decoded = Some(why);
                None
            }
        },
    };
    let shards = match shards {
        Ok(shards) => shards,
        Err(e) => {
            report.problems.push(format!("{}: cannot list its shards: {e}", store.describe(&array.dir)));
            return Ok(report);
        }
    };
    for coords in shards {
        scan_shard(store, array, &coords, codecs.as_ref(), &mut report)?;
        progress.shard_done();
    }
    Ok(report)
}

/// How often a shard replaced while it is scanned is scanned again.
const SCANS: u32 = 5;

/// Adds what shard `coords` holds to `report`: of the version read whole, when it was replaced
/// (another writer, or a version misnamed on the way) while read.
fn scan_shard(
    store: &dyn Store,
    array: &ShardedArray,
    coords: &[u64],
    codecs: Option<&ChunkCodecs>,
    report: &mut ArrayReport,
) -> Result<(), store::Error> {
    let mut scan = 1;
    let shard = loop {
        let mut shard = ArrayReport::default();
        match scan_shard_once(store, array, coords, codecs, &mut shard) {
            Ok(()) => break shard,
            Err(store::Error::Changed(_)) if scan < SCANS => {
                std::thread::sleep(store::backoff(scan));
                scan += 1;
            }
            Err(e) => return Err(e),
        }
    };
    report.shards += shard.shards;
    report.chunks += shard.chunks;
    report.live_bytes += shard.live_bytes;
    report.index_bytes += shard.index_bytes;
    report.unused_bytes += shard.unused_bytes;
    report.decoded += shard.decoded;
    report.problems.extend(shard.problems);
    Ok(())
}

fn scan_shard_once(
    store: &dyn Store,
    array: &ShardedArray,
    coords: &[u64],
    codecs: Option<&ChunkCodecs>,
    report: &mut ArrayReport,
) -> Result<(), store::Error> {
    let key = array.shard_key(coords);
    let shown = store.describe(&key);
    report.shards += 1;
    let file = match store.open(&key) {
        Ok(file) => file,
        Err(e) => {
            report.problems.push(format!("{shown}: cannot open: {e}"));
            return Ok(());
        }
    };
    if file.attr().kind != Kind::File {
        report.problems.push(format!("{shown}: not a regular file"));
        return Ok(());
    }
    let len = file.attr().size;
    let before = (report.live_bytes, report.index_bytes);
    let mut audit = Audit { file: &*file, array, shard: coords, codecs, entries: Vec::new(), shown: &shown, report };
    audit.blob(0, 0..len)?;
    let used = (report.live_bytes - before.0) + (report.index_bytes - before.1);
    report.unused_bytes += len.saturating_sub(used);
    Ok(())
}

/// One shard being verified, level by level.
struct Audit<'a> {
    file: &'a dyn Object,
    array: &'a ShardedArray,
    shard: &'a [u64],
    /// Set when stored chunks are decoded too.
    codecs: Option<&'a ChunkCodecs>,
    /// The entry at each level above the one being walked.
    entries: Vec<u64>,
    shown: &'a str,
    report: &'a mut ArrayReport,
}

impl Audit<'_> {
    fn blob(&mut self, depth: usize, blob: Range<u64>) -> Result<(), store::Error> {
        let levels: &[Level] = &self.array.meta.sharding.levels;
        let spec = levels[depth].index;
        let blob_len = blob.end - blob.start;
        let where_ = if depth == 0 { String::new() } else { format!(" (nested shard at {})", blob.start) };
        let range = match spec.index_range(blob_len) {
            Ok(range) => range,
            Err(e) => {
                self.report.problems.push(format!("{}{where_}: {e}", self.shown));
                return Ok(());
            }
        };
        let bytes = self.file.read_exact_at(blob.start + range.start, range.end - range.start)?;
        let index = match ShardIndex::decode(&spec, &bytes, blob_len, blob.start) {
            Ok(index) => index,
            Err(e) => {
                self.report.problems.push(format!("{}{where_}: {e}", self.shown));
                return Ok(());
            }
        };
        self.report.index_bytes += spec.encoded_len();
        let leaf = depth + 1 == levels.len();
        let mut ranges = Vec::new();
        for entry in 0..index.entries() {
            match index.chunk(entry) {
                Ok(None) => {}
                Ok(Some(chunk)) => {
                    ranges.push((chunk.clone(), entry));
                    self.entries.push(entry);
                    if leaf {
                        self.report.chunks += 1;
                        self.report.live_bytes += chunk.end - chunk.start;
                        self.decode(chunk)?;
                    } else {
                        self.blob(depth + 1, chunk)?;
                    }
                    self.entries.pop();
                }
                Err(e) => self.report.problems.push(format!("{}{where_}: {e}", self.shown)),
            }
        }
        ranges.sort_by_key(|(r, _)| (r.start, r.end));
        for pair in ranges.windows(2) {
            let ((a, ea), (b, eb)) = (&pair[0], &pair[1]);
            if a.end > b.start {
                let msg = format!("{}{where_}: entries {ea} and {eb} overlap ({a:?} and {b:?})", self.shown);
                self.report.problems.push(msg);
            }
        }
        Ok(())
    }

    /// Decodes the stored inner chunk at `range` when chunk data is checked.
    fn decode(&mut self, range: Range<u64>) -> Result<(), store::Error> {
        let Some(codecs) = self.codecs else { return Ok(()) };
        self.report.decoded += 1;
        let chunk =
            StoredChunk { file: self.file, range, array: self.array, shard: self.shard, entries: &self.entries };
        if let Some(fault) = chunk.fault(codecs)? {
            self.report.problems.push(format!("{}: {fault}", self.shown));
        }
        Ok(())
    }
}

/// `shardfs check`: prints every problem (and, with `repair`, what recovery did) and says whether
/// the store is healthy afterwards; with [`Depth::Data`], every stored inner chunk is decoded too.
pub fn check_command(
    store: &dyn Store,
    repair: bool,
    depth: Depth,
    progress: &dyn Progress,
) -> Result<bool, store::Error> {
    if repair {
        for done in crate::write::journal::recover(store)? {
            println!("repaired: {done:?}");
        }
    }
    let report = scan_with(store, depth, progress)?;
    for (doc, reason) in &report.invalid {
        println!("INVALID {}: {reason}", store.describe(doc));
    }
    for (doc, reason) in &report.refused {
        println!("note: {doc}: not sharded in a way the view shows unsharded ({reason})");
    }
    for record in &report.unfinished {
        println!("unfinished commit: {record} (run shardfs check --repair)");
    }
    for array in &report.arrays {
        let status = if array.problems.is_empty() { "ok" } else { "DAMAGED" };
        let decoded = match depth {
            Depth::Indexes => String::new(),
            Depth::Data if array.not_decoded.is_some() => ", data not decoded".into(),
            Depth::Data if array.checksummed => format!(", {} decoded and checksummed", array.decoded),
            Depth::Data => format!(", {} decoded (no checksum: a changed byte may pass)", array.decoded),
        };
        println!("{status:<7} {}: {} shards, {} chunks{decoded}", display_dir(&array.dir), array.shards, array.chunks);
        if let Some(why) = &array.not_decoded {
            println!("        note: chunk data not checked: {why}");
        }
        for problem in &array.problems {
            println!("        {problem}");
        }
    }
    let damaged = report.arrays.iter().filter(|a| !a.problems.is_empty()).count();
    println!(
        "{} arrays checked, {damaged} damaged, {} invalid documents, {} unfinished commits",
        report.arrays.len(),
        report.invalid.len(),
        report.unfinished.len()
    );
    Ok(report.healthy())
}

/// `shardfs info` of an Icechunk repository, first: one line per branch and tag, with the
/// snapshot it names (`branch main 1CECHNKREP0F1RSTCMT0`), each a version `shardfs mount` shows
/// with `--branch`, `--tag` or `--snapshot`.
pub fn print_repository_refs(refs: &crate::format::icechunk::Refs) {
    for (kind, list) in [("branch", &refs.branches), ("tag", &refs.tags)] {
        for (name, snapshot) in list {
            println!("{kind} {name} {snapshot}");
        }
    }
}

/// `shardfs info`: one line per sharded array with its shard, chunk and byte counts.
pub fn info_command(store: &dyn Store, progress: &dyn Progress) -> Result<(), store::Error> {
    let report = scan_reporting(store, progress)?;
    println!(
        "{:<32} {:>8} {:>10} {:>14} {:>14} {:>12}",
        "array", "shards", "chunks", "live bytes", "unused bytes", "index bytes"
    );
    for a in &report.arrays {
        println!(
            "{:<32} {:>8} {:>10} {:>14} {:>14} {:>12}",
            display_dir(&a.dir),
            a.shards,
            a.chunks,
            a.live_bytes,
            a.unused_bytes,
            a.index_bytes
        );
    }
    Ok(())
}

/// `shardfs info --zarr-format 2`: per Zarr v3 array, whether a Zarr v2 view can show it (its
/// v2 data type and compressor, and whether chunks carry a crc32c to strip) or why not; and per
/// group with OME-Zarr metadata, whether it is shown in 0.4 form or why it keeps its 0.5 form.
pub fn info_v2_command(store: &dyn Store) -> Result<(), store::Error> {
    let found = find_arrays(store)?;
    println!("{:<32} in a Zarr v2 view", "array");
    for (dir, doc) in &found.shown {
        let shown = match zarr_v2::v2_array(doc) {
            Ok(v2) => {
                let compressor = v2.zarray["compressor"]["id"].as_str().unwrap_or("no compressor").to_string();
                let crc = if v2.strip_crc32c { ", crc32c checked and stripped" } else { "" };
                format!("shown: {} {compressor}{crc}", v2.zarray["dtype"].as_str().unwrap_or("?"))
            }
            Err(why) => format!("left out: {why}"),
        };
        println!("{:<32} {shown}", display_dir(dir));
    }
    for (document, why) in &found.refused {
        println!("{:<32} left out: {why}", display_dir(document));
    }
    // As the v2 view renders a group's .zattrs (view::presentation::ZarrV2).
    for (dir, doc) in &found.groups {
        let (_, zattrs) = zarr_v2::v2_group(doc);
        match ome::to_v04(&zattrs) {
            Ok(None) => {}
            Ok(Some(_)) => println!("{:<32} group: OME-Zarr 0.5 shown as 0.4", display_dir(dir)),
            Err(why) => println!("{:<32} group: OME-Zarr metadata kept in 0.5 form: {why}", display_dir(dir)),
        }
    }
    Ok(())
}

fn display_dir(dir: &str) -> &str {
    if dir.is_empty() { "/" } else { dir }
}
