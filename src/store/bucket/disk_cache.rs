//! Object bytes kept on local disk (`--cache DIR`, `--max-cache-size`), as mountpoint-s3 and
//! rclone do: a second mount of the same data reads it from disk and asks the server only to
//! revalidate (the LIST or HEAD that tells each object's current ETag).
//!
//! - An object version is named by the server (an S3 endpoint, an Azure account and endpoint, a GCS endpoint), the store's URL, the key, the (bare) ETag and the size; its
//!   bytes are kept in blocks of [`BLOCK`] bytes, one file each, at a path hashed from that name
//!   (SHA-256). A lookup needs the version's current ETag, which only the server tells, so
//!   another version's bytes are never served: a changed object is a new name, a miss.
//! - Every file starts with a header holding the version's whole name, the block's offset and
//!   length, and a CRC-32C of all that follows it; a file that does not match in every point
//!   (torn by a crash, flipped on disk, or the rare hash collision) is removed and counted a
//!   miss, never served.
//! - Files are written whole to a temporary name and renamed into place, so that mounts and
//!   processes sharing DIR never see half a file; two writing one block write the same bytes.
//! - Reads fetch whole blocks (a range widened to block bounds), so that whatever ranges the
//!   next mount reads, read-ahead or not, are found; a read whose blocks are all on disk sends
//!   no GET, one with some missing fetches the span from the first missing block to the last.
//!   The read waits for its blocks to be written (to the page cache, short beside a GET), so
//!   that what a mount read is there when it unmounts.
//! - DIR holds at most `--max-cache-size` bytes: each process adds up what it writes, and past
//!   the limit (or after writing a tenth of it since) scans DIR and removes the least recently
//!   used files (by modification time, set again at each hit) down to 90%. Nothing is shared in
//!   memory between mounts; a file removed by another one meanwhile is simply gone. The first
//!   scan comes with the first write (what earlier mounts left is added up then).
//! - The cache is an optimisation: a block that cannot be written (disk full, DIR gone) is
//!   logged once, and reads go on from the network.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::fetch::{ByteStream, Get};
use crate::store::{Error, Result};

/// The unit of caching: reads are widened to whole blocks (mountpoint-s3 uses 1 MiB too).
pub const BLOCK: u64 = 1 << 20;
/// The default `--max-cache-size` is a tenth of the free space of DIR's filesystem at mount
/// time, and at most this much.
pub const LARGEST_DEFAULT: u64 = 10 << 30;
/// The subdirectory of DIR holding this layout: another layout would go beside it.
const LAYOUT: &str = "shardfs-cache-v1";
const MAGIC: &[u8; 8] = b"shardfs\x01";
/// Magic, CRC-32C, name length (u32), block offset and length (u64 each).
const HEADER: usize = 8 + 4 + 4 + 8 + 8;
/// Temporary files older than this were left by a process that died while writing them.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Where the cache is and how large it may grow (`--cache`, `--max-cache-size`).
#[derive(Clone, Debug)]
pub struct DiskSettings {
    pub dir: PathBuf,
    /// `None`: a tenth of the free space, at most [`LARGEST_DEFAULT`].
    pub max_bytes: Option<u64>,
    /// The server, when the store's URL does not name it (an S3 endpoint, an Azure account; set by the store's
    /// constructor): part of every version's name.
    pub server: String,
}

/// The disk cache of one mount: cheap to clone.
#[derive(Clone, Debug)]
pub struct DiskCache(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// DIR/shardfs-cache-v1.
    root: PathBuf,
    /// DIR as given, for messages.
    shown: String,
    server: String,
    max_bytes: u64,
    /// Bytes in the cache, as of the last scan plus what this process wrote since.
    used: AtomicU64,
    /// Bytes written since the last scan.
    written: AtomicU64,
    scanning: AtomicBool,
    /// False until the first scan, made at the first write: what earlier mounts left is added
    /// up then (not when opening: `shardfs mount` opens the store before it forks, when no
    /// other thread may run).
    scanned: AtomicBool,
    /// True once a failed write was logged.
    warned: AtomicBool,
    temps: AtomicU64,
}

/// One object version, as the cache names it.
#[derive(Debug)]
pub struct CachedVersion {
    /// URL, key, ETag and size, each length-prefixed: kept in every block's header.
    name: Vec<u8>,
    /// The block files' path without the block number.
    stem: PathBuf,
    size: u64,
}

impl CachedVersion {
    fn block_path(&self, block: u64) -> PathBuf {
        let mut path = self.stem.clone().into_os_string();
        path.push(format!(".{block}"));
        path.into()
    }

    /// The offset and length of block `block`.
    fn block_range(&self, block: u64) -> Range<u64> {
        block * BLOCK..((block + 1) * BLOCK).min(self.size)
    }
}

/// Where a [`DiskCache::stream`] has got to.
struct Walk {
    cache: DiskCache,
    version: Arc<CachedVersion>,
    /// The next byte to serve, and the end of the range.
    at: u64,
    end: u64,
    fetch: Get,
    /// A block found on disk after a run of missing ones, to serve once the run is fetched.
    found: Option<(u64, Bytes)>,
    /// The GET of a run of missing blocks, while it lasts.
    net: Option<Fetching>,
}

/// The GET of a run of missing blocks.
struct Fetching {
    bytes: ByteStream,
    /// Where its next byte goes, and where its bytes end.
    at: u64,
    end: u64,
    /// The block being put together to be kept, and where it starts.
    block: BytesMut,
    block_start: u64,
}

impl Walk {
    /// The next bytes of the range; `None` at its end.
    async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            if let Some(net) = &mut self.net {
                let Some(piece) = net.bytes.next().await else {
                    if net.at < net.end {
                        let short = format!("the server sent {} bytes too few", net.end - net.at);
                        return Err(Error::Io { place: self.cache.0.shown.clone(), source: io::Error::other(short) });
                    }
                    self.net = None;
                    continue;
                };
                let piece = piece?;
                let piece_start = net.at;
                net.at += piece.len() as u64;
                if net.at > net.end {
                    let long = io::Error::other("the server sent more bytes than were due");
                    return Err(Error::Io { place: self.cache.0.shown.clone(), source: long });
                }
                self.keep_blocks_of(&piece).await;
                let (from, to) = (self.at.max(piece_start), self.end.min(piece_start + piece.len() as u64));
                if from < to {
                    self.at = to;
                    return Ok(Some(piece.slice((from - piece_start) as usize..(to - piece_start) as usize)));
                }
                continue;
            }
            if self.at >= self.end {
                return Ok(None);
            }
            let block = self.at / BLOCK;
            let on_disk = match self.found.take() {
                Some((found, bytes)) if found == block => Some(bytes),
                _ => self.cache.load_async(&self.version, block).await,
            };
            crate::metrics::cache("disk", on_disk.is_some());
            if let Some(bytes) = on_disk {
                let range = self.version.block_range(block);
                let to = self.end.min(range.end);
                let piece = bytes.slice((self.at - range.start) as usize..(to - range.start) as usize);
                self.at = to;
                return Ok(Some(piece));
            }
            // The run of missing blocks from here: up to the next one on disk, or the range's end.
            let last = (self.end - 1) / BLOCK;
            let mut after = block + 1;
            while after <= last {
                if let Some(bytes) = self.cache.load_async(&self.version, after).await {
                    self.found = Some((after, bytes));
                    break;
                }
                after += 1;
            }
            let span = self.version.block_range(block).start..self.version.block_range(after - 1).end;
            let bytes = (self.fetch)(span.clone()).await?;
            let block_start = span.start;
            self.net = Some(Fetching { bytes, at: span.start, end: span.end, block: BytesMut::new(), block_start });
        }
    }

    /// Adds `piece` (the GET's next bytes) to the block being put together, keeping each block
    /// once whole.
    async fn keep_blocks_of(&mut self, mut piece: &[u8]) {
        let Some(net) = &mut self.net else { return };
        while !piece.is_empty() {
            let block = net.block_start / BLOCK;
            let len = self.version.block_range(block).end - net.block_start;
            let n = piece.len().min((len - net.block.len() as u64) as usize);
            net.block.extend_from_slice(&piece[..n]);
            piece = &piece[n..];
            if net.block.len() as u64 == len {
                let whole = std::mem::take(&mut net.block).freeze();
                let (cache, version, offset) = (self.cache.clone(), self.version.clone(), net.block_start);
                net.block_start += len;
                // Awaited, so that what a mount read is on disk when it unmounts: a write to the
                // page cache is short beside the GET it comes from.
                let _ = tokio::task::spawn_blocking(move || cache.keep(&version, block, &whole, offset)).await;
            }
        }
    }
}

impl DiskCache {
    /// Opens (making it if needed) the cache in `settings.dir`, after checking that files can be
    /// written there; the error is one line naming the directory.
    pub fn open(settings: &DiskSettings) -> std::result::Result<DiskCache, String> {
        let shown = settings.dir.display().to_string();
        let fail = |what: &str, e: io::Error| format!("cache directory {shown}: {what}: {e}");
        let root = settings.dir.join(LAYOUT);
        fs::create_dir_all(root.join("tmp")).map_err(|e| fail("cannot create it", e))?;
        let max_bytes = match settings.max_bytes {
            Some(max) => max,
            None => (free_space(&root).map_err(|e| fail("cannot tell its free space", e))? / 10).min(LARGEST_DEFAULT),
        };
        let cache = DiskCache(Arc::new(Inner {
            root,
            shown: shown.clone(),
            server: settings.server.clone(),
            max_bytes,
            used: AtomicU64::new(0),
            written: AtomicU64::new(0),
            scanning: AtomicBool::new(false),
            scanned: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            temps: AtomicU64::new(0),
        }));
        let probe = cache.write_temp(b"probe").map_err(|e| fail("cannot write there", e))?;
        let _ = fs::remove_file(probe);
        Ok(cache)
    }

    /// The most bytes the cache holds.
    pub fn max_bytes(&self) -> u64 {
        self.0.max_bytes
    }

    /// The name of version `e_tag` (bare, without quotes) of `key` in the store at `url`,
    /// `size` bytes long.
    pub fn version(&self, url: &str, key: &str, e_tag: &str, size: u64) -> Arc<CachedVersion> {
        let mut name = Vec::new();
        for part in [&self.0.server, url, key, e_tag, &size.to_string()] {
            name.extend_from_slice(&(part.len() as u64).to_le_bytes());
            name.extend_from_slice(part.as_bytes());
        }
        let hash: String = Sha256::digest(&name)[..16].iter().map(|b| format!("{b:02x}")).collect();
        let stem = self.0.root.join(&hash[..2]).join(&hash);
        Arc::new(CachedVersion { name, stem, size })
    }

    /// `range` of `version` as it is read: the blocks found on disk from there, each run of
    /// missing blocks with one GET through `fetch` (widened to whole blocks), whose blocks are
    /// kept as they pass.
    pub fn stream(&self, version: Arc<CachedVersion>, range: Range<u64>, fetch: Get) -> ByteStream {
        let walk =
            Walk { cache: self.clone(), version, at: range.start, end: range.end, fetch, found: None, net: None };
        futures_util::stream::unfold(Some(walk), |walk| async move {
            let mut walk = walk?;
            match walk.next().await {
                Ok(Some(piece)) => Some((Ok(piece), Some(walk))),
                Ok(None) => None,
                // Nothing after an error.
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    /// Block `block` of `version` from disk, off the runtime's threads.
    async fn load_async(&self, version: &Arc<CachedVersion>, block: u64) -> Option<Bytes> {
        let (cache, version) = (self.clone(), version.clone());
        tokio::task::spawn_blocking(move || cache.load(&version, block)).await.ok().flatten()
    }

    /// Block `block` of `version` from disk, when a whole and matching copy is there; one that
    /// does not match is removed.
    fn load(&self, version: &CachedVersion, block: u64) -> Option<Bytes> {
        let path = version.block_path(block);
        let mut file = File::open(&path).ok()?;
        let range = version.block_range(block);
        let due = (HEADER + version.name.len()) as u64 + (range.end - range.start);
        // A file of another length is not read (a foreign file may be large).
        let mut content = Vec::new();
        let whole = file.metadata().is_ok_and(|m| m.len() == due) && file.read_to_end(&mut content).is_ok();
        match verified(&content, version, block).filter(|_| whole) {
            Some(data) => {
                // Recently used: the scan removes the oldest first.
                let _ = file.set_modified(SystemTime::now());
                Some(Bytes::from(content).slice(data))
            }
            None => {
                log::warn!("{}: a damaged or foreign cache file, removed", path.display());
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Writes the blocks of `version` in `bytes` (fetched from `offset`, block `first` on), each
    /// to a temporary file renamed into place; a failure is logged once.
    fn keep(&self, version: &CachedVersion, first: u64, bytes: &Bytes, offset: u64) {
        let mut block = first;
        let mut written = 0;
        while version.block_range(block).start < offset + bytes.len() as u64 {
            let range = version.block_range(block);
            let data = &bytes[(range.start - offset) as usize..(range.end - offset) as usize];
            match self.write_block(version, block, data) {
                Ok(n) => written += n,
                Err(e) => {
                    if !self.0.warned.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "cache directory {}: cannot write ({e}); reads go on from the network",
                            self.0.shown
                        );
                    }
                    break;
                }
            }
            block += 1;
        }
        let used = self.0.used.fetch_add(written, Ordering::Relaxed) + written;
        let since = self.0.written.fetch_add(written, Ordering::Relaxed) + written;
        let due = !self.0.scanned.load(Ordering::Relaxed) || used > self.0.max_bytes || since > self.0.max_bytes / 10;
        if due && !self.0.scanning.swap(true, Ordering::AcqRel) {
            self.scan();
        }
    }

    /// Writes one block file; its length.
    fn write_block(&self, version: &CachedVersion, block: u64, data: &[u8]) -> io::Result<u64> {
        let mut content = Vec::with_capacity(HEADER + version.name.len() + data.len());
        content.extend_from_slice(MAGIC);
        content.extend_from_slice(&[0; 4]);
        content.extend_from_slice(&(version.name.len() as u32).to_le_bytes());
        content.extend_from_slice(&(block * BLOCK).to_le_bytes());
        content.extend_from_slice(&(data.len() as u64).to_le_bytes());
        content.extend_from_slice(&version.name);
        content.extend_from_slice(data);
        let crc = crc32c::crc32c(&content[12..]);
        content[8..12].copy_from_slice(&crc.to_le_bytes());
        let temp = self.write_temp(&content)?;
        let path = version.block_path(block);
        let placed =
            fs::create_dir_all(path.parent().expect("in a subdirectory")).and_then(|()| fs::rename(&temp, &path));
        if placed.is_err() {
            let _ = fs::remove_file(&temp);
        }
        placed.map(|()| content.len() as u64)
    }

    /// A new temporary file in DIR holding `content`.
    fn write_temp(&self, content: &[u8]) -> io::Result<PathBuf> {
        let n = self.0.temps.fetch_add(1, Ordering::Relaxed);
        // Processes in other PID namespaces may share DIR: the time tells them apart too.
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let temp = self.0.root.join("tmp").join(format!("{}.{n}.{nanos}", std::process::id()));
        let written = File::create(&temp).and_then(|mut file| file.write_all(content));
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        Ok(temp)
    }

    /// Adds up the files in the cache, removing the least recently used ones down to 90% of the
    /// limit when it holds more, and temporary files left by dead processes.
    fn scan(&self) {
        let mut files = Vec::new();
        let mut total = 0;
        for sub in fs::read_dir(&self.0.root).into_iter().flatten().flatten() {
            let is_temp = sub.file_name() == "tmp";
            for file in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let Ok(meta) = file.metadata() else { continue };
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                if is_temp {
                    if modified.elapsed().is_ok_and(|age| age > STALE_TEMP) {
                        let _ = fs::remove_file(file.path());
                    }
                    continue;
                }
                total += meta.len();
                files.push((modified, meta.len(), file.path()));
            }
        }
        if total > self.0.max_bytes {
            files.sort_unstable_by_key(|(modified, _, _)| *modified);
            let target = self.0.max_bytes - self.0.max_bytes / 10;
            for (_, len, path) in files {
                if total <= target {
                    break;
                }
                // Gone already (another mount's scan) counts as removed.
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => continue,
                    _ => total -= len,
                }
            }
        }
        self.0.used.store(total, Ordering::Relaxed);
        self.0.written.store(0, Ordering::Relaxed);
        self.0.scanned.store(true, Ordering::Relaxed);
        self.0.scanning.store(false, Ordering::Release);
    }
}

/// The range of the block's bytes in `content`, when it is a whole block file of block `block`
/// of `version`.
fn verified(content: &[u8], version: &CachedVersion, block: u64) -> Option<Range<usize>> {
    let header = content.get(..HEADER)?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let name_len = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let range = version.block_range(block);
    let data = HEADER + name_len..content.len();
    let matches = &header[..8] == MAGIC
        && word(16) == range.start
        && word(24) == range.end - range.start
        && data.len() as u64 == range.end - range.start
        && content.get(HEADER..data.start) == Some(&version.name[..])
        && crc32c::crc32c(&content[12..]) == crc;
    matches.then_some(data)
}

/// The bytes free to unprivileged users on the filesystem holding `path`.
fn free_space(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("shardfs-disk-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// Byte `i` of an object of version `seed`.
    fn object(seed: u8, size: u64) -> Bytes {
        // Copied a cycle at a time: debug builds are slow per byte.
        let cycle: Vec<u8> = (0..251u8).map(|i| i ^ seed).collect();
        let mut out = Vec::with_capacity(size as usize);
        while out.len() < out.capacity() {
            let n = cycle.len().min(out.capacity() - out.len());
            out.extend_from_slice(&cycle[..n]);
        }
        out.into()
    }

    /// Reads `range` through `cache`, recording the GETs `fetch` was asked for.
    fn read(
        rt: &tokio::runtime::Runtime,
        cache: &DiskCache,
        seed: u8,
        size: u64,
        range: Range<u64>,
        gets: &Arc<Mutex<Vec<Range<u64>>>>,
    ) -> Bytes {
        let version = cache.version("s3://b/p", "k", &format!("e{seed}"), size);
        let gets = gets.clone();
        let fetch: Get = Arc::new(move |span: Range<u64>| {
            gets.lock().unwrap().push(span.clone());
            // Replies come in pieces, as from a server.
            let pieces: Vec<Result<Bytes>> = object(seed, size)
                .slice(span.start as usize..span.end as usize)
                .chunks(100_000)
                .map(|piece| Ok(Bytes::copy_from_slice(piece)))
                .collect();
            Box::pin(async move { Ok(futures_util::stream::iter(pieces).boxed()) })
        });
        let mut stream = cache.stream(version, range, fetch);
        let mut all = Vec::new();
        while let Some(piece) = rt.block_on(stream.next()) {
            all.extend_from_slice(&piece.unwrap());
        }
        all.into()
    }

    #[test]
    fn blocks_fetched_once_are_read_from_disk_by_another_cache_on_the_same_dir() {
        let rt = runtime();
        let dir = temp_dir("reuse");
        let settings = DiskSettings { dir: dir.clone(), max_bytes: Some(64 << 20), server: String::new() };
        let size = 3 * BLOCK + 5;
        let gets = Arc::new(Mutex::new(Vec::new()));
        let first = DiskCache::open(&settings).unwrap();
        assert_eq!(read(&rt, &first, 1, size, 10..20, &gets), object(1, size).slice(10..20));
        assert_eq!(gets.lock().unwrap()[0], 0..BLOCK, "widened to its block");
        let second = DiskCache::open(&settings).unwrap();
        assert_eq!(read(&rt, &second, 1, size, 100..BLOCK, &gets), object(1, size).slice(100..BLOCK as usize));
        assert_eq!(gets.lock().unwrap().len(), 1, "found on disk");
        let whole = read(&rt, &second, 1, size, 0..size, &gets);
        assert_eq!(whole, object(1, size));
        assert_eq!(gets.lock().unwrap()[1], BLOCK..size, "only the blocks missing");
        assert_eq!(read(&rt, &second, 2, size, 0..size, &gets), object(2, size), "another version: a miss");
        assert_eq!(gets.lock().unwrap().len(), 3);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_damaged_block_file_is_a_miss_and_is_replaced() {
        let rt = runtime();
        let dir = temp_dir("damaged");
        let cache =
            DiskCache::open(&DiskSettings { dir: dir.clone(), max_bytes: Some(64 << 20), server: String::new() })
                .unwrap();
        let size = 2 * BLOCK;
        let gets = Arc::new(Mutex::new(Vec::new()));
        read(&rt, &cache, 1, size, 0..size, &gets);
        let version = cache.version("s3://b/p", "k", "e1", size);
        let path = version.block_path(1);
        let mut content = fs::read(&path).unwrap();
        let at = content.len() - 7;
        content[at] ^= 1;
        fs::write(&path, &content).unwrap();
        fs::write(version.block_path(0), b"short").unwrap();
        assert_eq!(read(&rt, &cache, 1, size, 0..size, &gets), object(1, size));
        assert_eq!(gets.lock().unwrap()[1], 0..size, "both fetched again");
        assert_eq!(read(&rt, &cache, 1, size, 0..size, &gets), object(1, size));
        assert_eq!(gets.lock().unwrap().len(), 2, "and kept again");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_cache_stays_within_its_size_removing_the_least_recently_used() {
        let rt = runtime();
        let dir = temp_dir("bounded");
        let cache = DiskCache::open(&DiskSettings {
            dir: dir.clone(),
            max_bytes: Some(4 * BLOCK + 4096),
            server: String::new(),
        })
        .unwrap();
        let gets = Arc::new(Mutex::new(Vec::new()));
        for seed in 0..12u8 {
            read(&rt, &cache, seed, BLOCK, 0..BLOCK, &gets);
            // The oldest file is the least recently used: modification times must differ.
            std::thread::sleep(Duration::from_millis(20));
            read(&rt, &cache, 0, BLOCK, 0..BLOCK, &gets);
        }
        let total = bytes_in(&dir);
        assert!(total <= cache.max_bytes(), "{total} bytes kept");
        let before = gets.lock().unwrap().len();
        read(&rt, &cache, 0, BLOCK, 0..BLOCK, &gets);
        assert_eq!(gets.lock().unwrap().len(), before, "the block read all along is still there");
        fs::remove_dir_all(dir).unwrap();
    }

    /// The bytes of every block file in `dir`.
    fn bytes_in(dir: &Path) -> u64 {
        let subs = fs::read_dir(dir.join(LAYOUT)).unwrap().flatten().filter(|s| s.file_name() != "tmp");
        subs.flat_map(|sub| fs::read_dir(sub.path()).unwrap().flatten()).map(|f| f.metadata().unwrap().len()).sum()
    }

    #[test]
    fn a_mount_over_a_dir_filled_by_another_trims_it_to_its_own_size() {
        let rt = runtime();
        let dir = temp_dir("shared");
        let settings = |max| DiskSettings { dir: dir.clone(), max_bytes: Some(max), server: String::new() };
        let (large, small) =
            (DiskCache::open(&settings(64 << 20)).unwrap(), DiskCache::open(&settings(3 * BLOCK)).unwrap());
        let gets = Arc::new(Mutex::new(Vec::new()));
        for seed in 0..6 {
            read(&rt, &large, seed, BLOCK, 0..BLOCK, &gets);
        }
        assert!(bytes_in(&dir) > 6 * BLOCK);
        read(&rt, &small, 9, BLOCK, 0..BLOCK, &gets);
        assert!(bytes_in(&dir) <= 3 * BLOCK, "{} bytes left", bytes_in(&dir));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mounts_sharing_a_small_dir_at_once_read_exact_bytes_while_blocks_come_and_go() {
        let rt = runtime();
        let dir = temp_dir("concurrent");
        let settings = DiskSettings { dir: dir.clone(), max_bytes: Some(4 * BLOCK), server: String::new() };
        let caches = [DiskCache::open(&settings).unwrap(), DiskCache::open(&settings).unwrap()];
        let size = 8 * BLOCK + 123;
        let gets = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            for t in 0..6u64 {
                let (cache, rt, gets) = (&caches[t as usize % 2], &rt, &gets);
                s.spawn(move || {
                    for i in 0..40u64 {
                        let start = (i * 7919 + t * 104_729) * 4099 % size;
                        let end = (start + (i % 3 + 1) * (BLOCK / 2)).min(size);
                        let got = read(rt, cache, (i % 2) as u8, size, start..end, gets);
                        assert!(got == object((i % 2) as u8, size).slice(start as usize..end as usize));
                    }
                });
            }
        });
        // Blocks written while a scan runs are trimmed at the next write's scan, not during it:
        // under load the six threads' last blocks can all land during one. After one more block
        // through each mount, the directory is within the limit again.
        for cache in &caches {
            read(&rt, cache, 7, BLOCK, 0..BLOCK, &gets);
        }
        assert!(bytes_in(&dir) <= 4 * BLOCK, "{} bytes", bytes_in(&dir));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn temporary_files_left_by_a_dead_process_go_at_the_first_scan() {
        let rt = runtime();
        let dir = temp_dir("stale");
        let cache =
            DiskCache::open(&DiskSettings { dir: dir.clone(), max_bytes: Some(64 << 20), server: String::new() })
                .unwrap();
        let (stale, fresh) = (dir.join(LAYOUT).join("tmp/1.0"), dir.join(LAYOUT).join("tmp/2.0"));
        fs::write(&stale, b"torn").unwrap();
        fs::write(&fresh, b"being written").unwrap();
        File::options().write(true).open(&stale).unwrap().set_modified(SystemTime::now() - 2 * STALE_TEMP).unwrap();
        read(&rt, &cache, 1, BLOCK, 0..10, &Arc::default());
        assert!(!stale.exists() && fresh.exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reads_go_on_from_the_network_when_blocks_cannot_be_written() {
        let rt = runtime();
        let dir = temp_dir("unwritable");
        let cache =
            DiskCache::open(&DiskSettings { dir: dir.clone(), max_bytes: Some(64 << 20), server: String::new() })
                .unwrap();
        let temps = dir.join(LAYOUT).join("tmp");
        fs::remove_dir_all(&temps).unwrap();
        fs::write(&temps, b"not a directory").unwrap();
        let gets = Arc::new(Mutex::new(Vec::new()));
        let size = 2 * BLOCK;
        for _ in 0..2 {
            assert_eq!(read(&rt, &cache, 1, size, 0..size, &gets), object(1, size));
        }
        assert_eq!(gets.lock().unwrap().len(), 2, "nothing kept, both fetched");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unusable_directory_is_one_line_naming_it() {
        let file = temp_dir("file");
        fs::write(&file, b"").unwrap();
        let e =
            DiskCache::open(&DiskSettings { dir: file.clone(), max_bytes: None, server: String::new() }).unwrap_err();
        assert!(e.starts_with(&format!("cache directory {}: cannot create it", file.display())), "{e}");
        assert!(!e.contains('\n'));
        fs::remove_file(file).unwrap();
    }
}
