//! The object-store backend without FUSE: the golden store copied into object_store's in-memory
//! store shows exactly the view of the local copy; two filesystems over one bucket (as two
//! machines) write interleaved chunks of one shard with a commit after each and lose nothing; a
//! plain file written through the view is stored when synced, and an atomic writer's temporary
//! files never reach the bucket nor cost a request; a commit that empties a shard, or
//! rebuilds a nested one, after another machine committed to it keeps that machine's chunks. And
//! the store conformance checks
//! against a real local S3 server: moto, which scripts/test.sh starts and names in
//! SHARDFS_TEST_S3_ENDPOINT; there too, the disk cache (`--cache`): a remount sends no GET, and
//! damaged cache files and replaced objects are never served. `check --data` reads a shard
//! replaced while it reads it again.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use object_store::memory::InMemory;
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex, assemble_shard};
use shardfs::fs::{Dropped, OpenMode, ROOT_INO, ShardFs, WriteOptions};
use shardfs::fuse::CACHE_TTL;
use shardfs::inspect::{Depth, scan, scan_with};
use shardfs::mount::filesystem;
use shardfs::progress::Silent;
use shardfs::store::bucket::disk_cache::DiskSettings;
use shardfs::store::bucket::s3::{self, S3Options};
use shardfs::store::bucket::{BucketStore, Caching};
use shardfs::store::{self, OpenHow, PutMode, Store, conformance};
use shardfs::view::index_cache::IndexCache;
use shardfs::write::commit::{Changes, NestedChanges, commit, commit_levels};
use shardfs::write::pending::Policy;

/// A store over `objects` below a prefix, with the default caches.
fn bucket(objects: &Arc<InMemory>) -> BucketStore {
    BucketStore::new(objects.clone(), "data/sharded", "memory://bucket/data/sharded", Caching::default()).unwrap()
}

/// Puts every file below `dir` into `store`, at the same relative keys.
fn upload(store: &dyn Store, dir: &Path, key: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let child = if key.is_empty() { name } else { format!("{key}/{name}") };
        if entry.file_type().unwrap().is_dir() {
            upload(store, &entry.path(), &child);
        } else {
            store.put(&child, &[&std::fs::read(entry.path()).unwrap()], PutMode::Overwrite).unwrap();
        }
    }
}

fn golden_bucket() -> Arc<InMemory> {
    let objects = Arc::new(InMemory::new());
    upload(&bucket(&objects), &golden().join("sharded"), "");
    objects
}

fn writable(store: BucketStore) -> ShardFs {
    let policy = Policy { shard_bytes: usize::MAX, idle: Duration::from_secs(3600), ..Policy::default() };
    let options = WriteOptions { policy, shard_new: None };
    filesystem(Arc::new(store), IndexCache::new(1 << 20), Some(options)).unwrap()
}

#[test]
fn a_bucket_shows_the_same_view_as_a_directory() {
    let objects = golden_bucket();
    let from_bucket = filesystem(Arc::new(bucket(&objects)), IndexCache::new(1 << 20), None).unwrap();
    let (files, dirs) = walk_view(&from_bucket);
    let (want_files, want_dirs) = walk_view(&fs_of(&golden().join("sharded")));
    assert_eq!(dirs, want_dirs);
    assert_eq!(files.keys().collect::<Vec<_>>(), want_files.keys().collect::<Vec<_>>());
    for (path, bytes) in &want_files {
        assert!(files[path] == *bytes, "{path}: the bucket's view differs");
    }
}

#[test]
fn two_filesystems_over_one_bucket_lose_none_of_each_others_commits() {
    let objects = golden_bucket();
    // Each has its own metadata cache, so each commits over a shard version it may not have seen:
    // the conditional PUT refuses it, and the commit reads the shard again.
    let (a, b) = (writable(bucket(&objects)), writable(bucket(&objects)));
    for round in 0..6u8 {
        for (fs, tag) in [(&a, 1u8), (&b, 2u8)] {
            let path = format!("zp/gzip_crc_end/c/{}/{}", 2 + tag as usize % 2, round % 2);
            write_file(fs, &path, &[tag, round]);
            fs.commit_all().unwrap();
        }
    }
    let fresh = filesystem(Arc::new(bucket(&objects)), IndexCache::new(1 << 20), None).unwrap();
    assert_eq!(read_path(&fresh, "zp/gzip_crc_end/c/3/1").unwrap(), [1, 5]);
    assert_eq!(read_path(&fresh, "zp/gzip_crc_end/c/2/1").unwrap(), [2, 5]);
    assert_eq!(read_path(&fresh, "zp/gzip_crc_end/c/3/0").unwrap(), [1, 4]);
    assert_eq!(read_path(&fresh, "zp/gzip_crc_end/c/2/0").unwrap(), [2, 4]);
    assert!(scan(&bucket(&objects)).unwrap().healthy());
}

#[test]
fn a_plain_file_written_through_the_view_reaches_the_bucket_when_synced_and_never_under_a_name_it_left() {
    let objects = golden_bucket();
    let fs = writable(bucket(&objects));
    let write = OpenMode { write: true, truncate: true, append: false };
    let (_, _, fh) = fs.create(ROOT_INO, "notes.txt", 0o644, write).unwrap();
    fs.write(fh, 0, b"kept here until synced").unwrap();
    assert!(!fs.flushes_at_close(fh), "a close has nothing to do: no request from the kernel");
    fs.release(fh);
    assert!(bucket(&objects).read("notes.txt").is_err(), "not in the bucket before a sync");
    assert_eq!(read_path(&fs, "notes.txt").unwrap(), b"kept here until synced", "but in the mount");
    // An atomic writer's temporary file, renamed before anything was synced.
    let (_, _, fh) = fs.create(ROOT_INO, "notes.txt.1234.partial", 0o644, write).unwrap();
    fs.write(fh, 0, b"renamed").unwrap();
    fs.release(fh);
    fs.rename(ROOT_INO, "notes.txt.1234.partial", ROOT_INO, "final.txt").unwrap();
    fs.commit_all().unwrap();
    let later = bucket(&objects);
    assert_eq!(later.read("notes.txt").unwrap(), b"kept here until synced");
    assert_eq!(later.read("final.txt").unwrap(), b"renamed");
    assert!(later.read("notes.txt.1234.partial").is_err(), "the temporary file never reached the bucket");
}

#[test]
fn an_atomic_write_of_a_chunk_and_of_a_document_asks_the_server_nothing_until_the_commit() {
    let server = Arc::new(Server::default());
    // Nothing fetched ahead in the background, where it would count.
    let caching = Caching { read_ahead_bytes: 0, ..Caching::default() };
    let store = BucketStore::new(server.clone(), "data", "memory://bucket/data", caching).unwrap();
    upload(&store, &golden().join("sharded"), "");
    let fs = writable(store);
    let array = "zp/gzip_crc_end";
    let chunk_dir = lookup(&fs, &format!("{array}/c/1")).unwrap();
    let array_dir = lookup(&fs, array).unwrap();
    let document = read_path(&fs, &format!("{array}/zarr.json")).unwrap();
    let write = OpenMode { write: true, truncate: true, append: false };
    let before = server.requests();
    // As zarr-python's LocalStore writes a chunk: a temporary file beside it, renamed over it.
    assert!(fs.lookup(chunk_dir, "0.9f8e.partial").is_err());
    let (_, _, fh) = fs.create(chunk_dir, "0.9f8e.partial", 0o644, write).unwrap();
    fs.write(fh, 0, b"a new chunk").unwrap();
    fs.release(fh);
    fs.rename(chunk_dir, "0.9f8e.partial", chunk_dir, "0").unwrap();
    assert_eq!(read_path(&fs, &format!("{array}/c/1/0")).unwrap(), b"a new chunk");
    // And its document written again the same way, in the array's directory.
    assert!(fs.lookup(array_dir, "zarr.77aa.partial").is_err());
    let (_, _, fh) = fs.create(array_dir, "zarr.77aa.partial", 0o644, write).unwrap();
    fs.write(fh, 0, &document).unwrap();
    fs.release(fh);
    assert_eq!(server.requests(), before, "no request before the document is stored");
    fs.rename(array_dir, "zarr.77aa.partial", array_dir, "zarr.json").unwrap();
    assert_eq!(server.requests(), before + 1, "storing the document is one PUT, nothing else");
    fs.commit_all().unwrap();
    let later = BucketStore::new(server.clone(), "data", "memory://bucket/data", Caching::default()).unwrap();
    let fresh = filesystem(Arc::new(later), IndexCache::new(1 << 20), None).unwrap();
    assert_eq!(read_path(&fresh, &format!("{array}/c/1/0")).unwrap(), b"a new chunk");
    let names = list_plus(&fresh, lookup(&fresh, array).unwrap());
    assert!(names.iter().all(|(e, _)| !e.name.contains("partial")), "no temporary file in the bucket");
}

/// Makes bucket `name` on the S3 server at `endpoint` (moto takes an unsigned request).
fn make_bucket(endpoint: &str, name: &str) {
    let host = endpoint.strip_prefix("http://").expect("an http:// endpoint");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(stream, "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "making bucket {name}: {reply}");
}

/// The local S3 server's endpoint (SHARDFS_TEST_S3_ENDPOINT), with credentials for it in the
/// environment; `None` (the test skipped, loudly) when there is none.
fn s3_endpoint(what: &str) -> Option<String> {
    let Ok(endpoint) = std::env::var("SHARDFS_TEST_S3_ENDPOINT") else {
        assert!(
            std::env::var("SHARDFS_REQUIRE_S3").is_err(),
            "SHARDFS_REQUIRE_S3 is set but SHARDFS_TEST_S3_ENDPOINT is not"
        );
        eprintln!("*** SKIPPING {what}: no SHARDFS_TEST_S3_ENDPOINT (scripts/test.sh starts moto) ***");
        return None;
    };
    // SAFETY: every test that reads them sets the same values, and object_store reads them while
    // building a client, after this.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    }
    Some(endpoint)
}

#[test]
fn a_real_s3_server_passes_the_store_conformance_checks() {
    let Some(endpoint) = s3_endpoint("the S3 conformance checks") else { return };
    let name = format!("conformance-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint), ..Default::default() };
    for (prefix, caching) in [
        ("cached", Caching::default()),
        ("uncached", Caching { metadata_ttl: Duration::ZERO, read_ahead_bytes: 0, ..Caching::default() }),
    ] {
        let store = s3::open(&format!("s3://{name}/{prefix}"), &options, caching).unwrap();
        conformance::check(&store);
    }
}

/// The ETag of object `key` of bucket `bucket` on the S3 server at `endpoint`, asked directly.
fn e_tag_of(endpoint: &str, bucket: &str, key: &str) -> String {
    use object_store::ObjectStoreExt;
    let client = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let meta = runtime.block_on(client.head(&object_store::path::Path::from(key))).unwrap();
    meta.e_tag.expect("an ETag").trim_matches('"').to_string()
}

/// A commit in doubt measures its stall by the server's clock too: the `Date` of moto's answers
/// about the bucket (the same machine's clock, here).
#[test]
fn an_s3_servers_answers_tell_the_exchange_its_time() {
    let Some(endpoint) = s3_endpoint("the server's clock") else { return };
    let name = format!("clock-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint.clone()), ..Default::default() };
    let store = s3::open(&format!("s3://{name}/p"), &options, Caching::default()).unwrap();
    let exchange = store.exchange().expect("S3 keeps notes");
    store.put("k", &[b"one"], PutMode::Create).unwrap();
    exchange.head("k").unwrap();
    let told = exchange.server_time().expect("a Date from the server");
    let now = std::time::SystemTime::now();
    let off = now.duration_since(told).unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(5), "the server's Date {told:?} is {off:?} from now");
}

#[test]
fn a_large_shard_goes_up_in_parts_under_the_conditions_the_server_honours_there() {
    let Some(endpoint) = s3_endpoint("multipart uploads") else { return };
    let name = format!("multipart-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint.clone()), ..Default::default() };
    let store = s3::open(&format!("s3://{name}/p"), &options, Caching::default()).unwrap();
    // Asks the server which conditions it honours on a completion: moto refuses one where an
    // object is (If-None-Match: *) and ignores If-Match there.
    store.check_writes().unwrap();
    let shard: Vec<u8> = (0..21u32 << 20).map(|i| (i % 251) as u8).collect();
    let (head, tail) = shard.split_at(7 << 20);
    store.put("shard", &[head, tail], PutMode::Create).unwrap();
    let e_tag = e_tag_of(&endpoint, &name, "p/shard");
    assert!(e_tag.ends_with("-5"), "five parts of 5 MiB at most: {e_tag}");
    let fresh = || s3::open(&format!("s3://{name}/p"), &options, Caching::default()).unwrap();
    assert!(fresh().read("shard").unwrap() == shard, "the parts in order, every byte");
    assert!(
        matches!(store.put("shard", &[&shard], PutMode::Create), Err(store::Error::Changed(_))),
        "a new shard goes up only where there is none, in parts too"
    );
    // An update under If-Match, which moto does not honour on a completion: one PUT, whose
    // condition it does honour.
    let stale = fresh().attr("shard").unwrap().stamp;
    let replaced: Vec<u8> = shard.iter().map(|b| b.wrapping_add(1)).collect();
    store.put("shard", &[&replaced], PutMode::Update(stale)).unwrap();
    assert!(!e_tag_of(&endpoint, &name, "p/shard").contains('-'), "a single PUT");
    assert!(
        matches!(fresh().put("shard", &[&shard], PutMode::Update(stale)), Err(store::Error::Changed(_))),
        "never over another version"
    );
    assert!(fresh().read("shard").unwrap() == replaced);
}

/// One inner chunk of the arrays of `mib_array`: 1 MiB, each unlike the others.
fn mib_chunk(i: u8) -> Vec<u8> {
    (0..1u32 << 20).map(|j| (j % 253) as u8 ^ i).collect()
}

/// A new bucket named after `name` on the S3 server at `endpoint`, holding at `a` a 1-D array of
/// `shards` shards of twelve chunks of 1 MiB (more than an object small enough to be fetched
/// whole at its first read), each chunk ending in its crc32c when `checksummed`; its store and
/// chunks (without checksums).
fn mib_array(endpoint: &str, name: &str, shards: usize, checksummed: bool) -> (BucketStore, Vec<Vec<u8>>) {
    mib_chunks_array(endpoint, name, shards, 12, checksummed)
}

/// [`mib_array`] with `per_shard` chunks of 1 MiB in each shard.
fn mib_chunks_array(
    endpoint: &str,
    name: &str,
    shards: usize,
    per_shard: usize,
    checksummed: bool,
) -> (BucketStore, Vec<Vec<u8>>) {
    let name = format!("{name}-{}", std::process::id());
    make_bucket(endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint.to_string()), ..Default::default() };
    let store = s3::open(&format!("s3://{name}/ds"), &options, Caching::default()).unwrap();
    let codecs = match checksummed {
        true => serde_json::json!([{"name": "bytes"}, {"name": "crc32c"}]),
        false => serde_json::json!([{"name": "bytes"}]),
    };
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [shards * (per_shard << 20)], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [per_shard << 20]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1 << 20],
            "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
    });
    let chunks: Vec<Vec<u8>> = (0..shards * per_shard).map(|i| mib_chunk(i as u8)).collect();
    store.put("zarr.json", &[br#"{"zarr_format": 3, "node_type": "group"}"#], PutMode::Overwrite).unwrap();
    store.put("a/zarr.json", &[&serde_json::to_vec(&doc).unwrap()], PutMode::Overwrite).unwrap();
    let stored: Vec<Vec<u8>> = match checksummed {
        true => chunks.iter().map(|c| [c.as_slice(), &crc32c::crc32c(c).to_le_bytes()].concat()).collect(),
        false => chunks.clone(),
    };
    for (shard, of) in stored.chunks(per_shard).enumerate() {
        let bytes = assemble_shard(&spec(per_shard as u64), &of.iter().map(|c| Some(c.as_slice())).collect::<Vec<_>>());
        store.put(&format!("a/c/{shard}"), &[&bytes], PutMode::Overwrite).unwrap();
    }
    (store, chunks)
}

#[test]
fn a_chunk_file_costs_one_get_read_in_pieces_or_by_two_readers_at_once() {
    let Some(endpoint) = s3_endpoint("the GET counts of chunk reads") else { return };
    // Twelve chunks of 1 MiB in one shard: more than an object small enough to be fetched whole.
    let (store, chunks) = mib_array(&endpoint, "fetch", 1, false);
    let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
    // The shard's index, read once and cached, is not what is counted.
    assert!(read_path(&fs, "a/c/0").unwrap() == chunks[0]);
    let read_in_pieces = |fh: u64| {
        let mut out = Vec::new();
        loop {
            let piece = fs.read(fh, out.len() as u64, 128 << 10).unwrap();
            if piece.is_empty() {
                return out;
            }
            out.extend(piece);
        }
    };

    let before = store.gets_sent();
    // A chunk far from the one read before (chunks read in order would be fetched ahead).
    let fh = fs.open(lookup(&fs, "a/c/11").unwrap(), OpenMode::default()).unwrap();
    assert!(read_in_pieces(fh) == chunks[11]);
    fs.release(fh);
    assert_eq!(store.gets_sent() - before, 1, "1 MiB read in 128 KiB pieces");

    let before = store.gets_sent();
    let ino = lookup(&fs, "a/c/5").unwrap();
    let (first, second) = (fs.open(ino, OpenMode::default()).unwrap(), fs.open(ino, OpenMode::default()).unwrap());
    std::thread::scope(|s| {
        let readers = [s.spawn(|| read_in_pieces(first)), s.spawn(|| read_in_pieces(second))];
        for reader in readers {
            assert!(reader.join().unwrap() == chunks[5]);
        }
    });
    fs.release(first);
    fs.release(second);
    assert_eq!(store.gets_sent() - before, 1, "two readers of one chunk at once");
}

#[test]
fn an_array_read_in_order_costs_a_get_or_two_per_shard_and_its_index() {
    let Some(endpoint) = s3_endpoint("the GET counts of an array read in order") else { return };
    let (store, chunks) = mib_array(&endpoint, "in-order", 4, false);
    let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
    lookup(&fs, "a/zarr.json").unwrap();
    let before = store.gets_sent();
    // As cat of every chunk file does: each looked up and read in 128 KiB pieces, in order.
    for (i, chunk) in chunks.iter().enumerate() {
        let fh = fs.open(lookup(&fs, &format!("a/c/{i}")).unwrap(), OpenMode::default()).unwrap();
        let mut read = Vec::new();
        loop {
            let piece = fs.read(fh, read.len() as u64, 128 << 10).unwrap();
            if piece.is_empty() {
                break;
            }
            read.extend(piece);
        }
        fs.release(fh);
        assert!(read == *chunk, "chunk {i}");
    }
    // The first shard: its index, its first chunk, the rest; every later one asked for ahead:
    // its index and its bytes. Not one GET per chunk, nor per 8 MiB.
    let gets = store.gets_sent() - before;
    assert!((8..=12).contains(&gets), "{gets} GETs for 48 chunks in 4 shards");
}

#[test]
fn the_chunk_files_of_an_array_shown_as_stored_read_in_order_are_fetched_ahead() {
    // A Zarr v2 array (its chunk files shown as they are): a reader going through them in order
    // has the next ones fetched while it reads, each in a GET of its own, several at once; so does
    // one that reads with no open, as the kernel does on a read-only mount (the file opened at its
    // lookup, the reader followed from its first read).
    let read_without_open = |fs: &ShardFs, path: &str| {
        let ino = lookup(fs, path)?;
        fs.read_unopened(ino, 0, 1 << 20)
    };
    for (zarray, key, opened) in [
        (r#"{"shape": [1, 1024], "chunks": [1, 16], "dimension_separator": "."}"#, "0.", true),
        (r#"{"shape": [1, 1024], "chunks": [1, 16], "dimension_separator": "/"}"#, "0/", true),
        (r#"{"shape": [1, 1024], "chunks": [1, 16], "dimension_separator": "."}"#, "0.", false),
    ] {
        let read_path = |fs: &ShardFs, path: &str| match opened {
            true => read_path(fs, path),
            false => read_without_open(fs, path),
        };
        let objects = Arc::new(InMemory::new());
        // Written through a store of their own: one keeps what it wrote whole, and reads it free.
        let writer = bucket(&objects);
        writer.put("v2/.zarray", &[zarray.as_bytes()], PutMode::Overwrite).unwrap();
        let chunks: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 1000 + i as usize]).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            writer.put(&format!("v2/{key}{i}"), &[chunk], PutMode::Overwrite).unwrap();
        }
        let store = bucket(&objects);
        let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
        lookup(&fs, "v2/.zarray").unwrap();
        let read_in_order = |chunks_read: std::ops::Range<usize>| {
            let before = store.gets_sent();
            for i in chunks_read {
                assert!(read_path(&fs, &format!("v2/{key}{i}")).unwrap() == chunks[i], "chunk {i}");
            }
            std::thread::sleep(Duration::from_millis(300));
            store.gets_sent() - before
        };
        // The third in order asks for the files of the next 32 chunks (2 to 34: a row of 64 is
        // more than the most asked for), each chunk after for one more: each chunk file once, up
        // to 32 ahead of the reader.
        assert_eq!(read_in_order(0..4), 37, "({key}) chunks 0 to 35 and the document");
        assert_eq!(read_in_order(4..12), 8, "({key}) chunks 36 to 43, none again");
        // Out of order: nothing ahead.
        let before = store.gets_sent();
        for i in [63, 52] {
            assert!(read_path(&fs, &format!("v2/{key}{i}")).unwrap() == chunks[i]);
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(store.gets_sent() - before, 2, "chunks far apart ({key})");
    }
}

#[test]
fn a_writer_opening_chunks_in_order_without_truncating_them_fetches_no_shard_ahead() {
    let Some(endpoint) = s3_endpoint("the GETs of a writer's opens") else { return };
    let (store, chunks) = mib_array(&endpoint, "rewrite", 4, false);
    let fs = writable(store.clone());
    lookup(&fs, "a/zarr.json").unwrap();
    let before = store.gets_sent();
    // A writer changing the first chunks in place: each opened without O_TRUNC (its bytes read),
    // in order, as a reader's opens that have the shards ahead fetched.
    let write = OpenMode { write: true, truncate: false, append: false };
    for (i, chunk) in chunks.iter().enumerate().take(4) {
        let fh = fs.open(lookup(&fs, &format!("a/c/{i}")).unwrap(), write).unwrap();
        assert!(fs.read(fh, 0, 1 << 20).unwrap() == *chunk, "chunk {i}");
        fs.release(fh);
    }
    std::thread::sleep(Duration::from_millis(500));
    // The first shard's index and each chunk alone: not the rest of the shard as the opens go on
    // in it, nor anything of the three shards after it (their indexes and first lanes: six GETs
    // more).
    let gets = store.gets_sent() - before;
    assert!(gets <= 5, "{gets} GETs for the first four chunks of one shard");
}

#[test]
fn a_listing_asks_for_the_indexes_of_the_shards_ahead_of_the_one_it_reads() {
    let Some(endpoint) = s3_endpoint("the GETs of a listing") else { return };
    let (store, _) = mib_array(&endpoint, "listing", 4, false);
    let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
    // The lookup of the directory reads the first shard's index (is there a chunk?).
    let dir = lookup(&fs, "a/c").unwrap();
    let before = store.gets_sent();
    // `ls` reading its first entries: the chunks of the first shard.
    let (mut names, mut offset) = (Vec::new(), 0);
    fs.readdir(dir, 2, |entry, next| {
        if !names.is_empty() {
            return true;
        }
        names.push(entry.name.clone());
        offset = next;
        false
    })
    .unwrap();
    assert_eq!(names, ["0"]);
    // The other three shards' indexes come in the background, each in a GET of its own, while
    // the listing is still at the first: on a real network they arrive together, not one round
    // trip after another as the listing reaches each.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.gets_sent() - before < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(store.gets_sent() - before, 3, "the next three shards' indexes");
    let mut rest = 0;
    fs.readdir(dir, offset, |_, _| {
        rest += 1;
        false
    })
    .unwrap();
    assert_eq!(rest, 47, "the other chunk files");
    assert_eq!(store.gets_sent() - before, 3, "the indexes fetched ahead are the ones the listing reads");
}

#[test]
fn ls_l_of_a_read_only_mount_fetches_the_shards_indexes_and_no_chunk() {
    let Some(endpoint) = s3_endpoint("the GETs of ls -l") else { return };
    // Shards of 12 MiB, fetched in lanes once a reader goes on in order through them, and of 4 MiB,
    // fetched whole with the index at a reader's first read.
    for (name, per_shard) in [("ls-large", 12), ("ls-small", 4)] {
        let (store, _) = mib_chunks_array(&endpoint, name, 4, per_shard, false);
        let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
        // The lookup of the directory reads the first shard's index (is there a chunk?).
        let dir = lookup(&fs, "a/c").unwrap();
        let before = store.gets_sent();
        // `ls -l`: the listing, then a lookup of each file listed, in order. A read-only mount
        // opens each file it looks up (src/fs/unopened.rs): lookups in order once had the shards
        // ahead fetched as for a reader, and a listing's read of an index the rest of a small shard.
        let mut names = Vec::new();
        fs.readdir(dir, 2, |entry, _| {
            names.push(entry.name.clone());
            false
        })
        .unwrap();
        assert_eq!(names.len(), 4 * per_shard, "{name}");
        for file in &names {
            fs.lookup(dir, file).unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(store.gets_sent() - before, 3, "the other three shards' indexes alone ({name})");
    }
}

#[test]
fn a_zarr_v2_view_of_checksummed_chunks_fetches_no_chunk_to_look_one_up() {
    let Some(endpoint) = s3_endpoint("the GET counts of lookups in a v2 view") else { return };
    let (store, chunks) = mib_array(&endpoint, "v2-lookup", 1, true);
    let v2 = Arc::new(shardfs::view::presentation::ZarrV2);
    let fs = shardfs::mount::filesystem_showing(Arc::new(store.clone()), v2, IndexCache::new(1 << 20), None).unwrap();
    assert!(read_path(&fs, "a/0").unwrap() == chunks[0], "the first chunk, and the shard's index");
    let before = store.gets_sent();
    // Out of order, so that no shard is asked for ahead: what `stat`, `ls -l FILE` or a Zarr
    // reader's `exists` do. A read-only mount holds each file looked up open; it reads and checks
    // a chunk's bytes at the first read, not at the open.
    for i in [11, 2, 7, 4, 9] {
        let ino = lookup(&fs, &format!("a/{i}")).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, 1 << 20, "chunk {i} without its crc32c");
    }
    assert_eq!(store.gets_sent() - before, 0, "GETs for five lookups");
    for i in [11, 2] {
        assert!(read_path(&fs, &format!("a/{i}")).unwrap() == chunks[i], "chunk {i}");
    }
}

#[test]
fn a_chunk_whose_crc32c_does_not_match_is_fetched_once_per_open_however_often_read() {
    let Some(endpoint) = s3_endpoint("the GETs of a damaged chunk") else { return };
    let (store, chunks) = mib_array(&endpoint, "v2-damaged", 1, true);
    let mut stored: Vec<Vec<u8>> =
        chunks.iter().map(|c| [c.as_slice(), &crc32c::crc32c(c).to_le_bytes()].concat()).collect();
    *stored[3].last_mut().unwrap() ^= 1;
    let shard = assemble_shard(&spec(12), &stored.iter().map(|c| Some(c.as_slice())).collect::<Vec<_>>());
    store.put("a/c/0", &[&shard], PutMode::Overwrite).unwrap();
    // Keeping no bytes fetched, so that each check of the chunk would be a GET of its own.
    let options = S3Options { endpoint_url: Some(endpoint.clone()), ..Default::default() };
    let uncached = Caching { read_ahead_bytes: 0, ..Caching::default() };
    let store = s3::open(&format!("s3://v2-damaged-{}/ds", std::process::id()), &options, uncached).unwrap();
    let v2 = Arc::new(shardfs::view::presentation::ZarrV2);
    let fs = shardfs::mount::filesystem_showing(Arc::new(store.clone()), v2, IndexCache::new(1 << 20), None).unwrap();
    assert!(read_path(&fs, "a/2").unwrap() == chunks[2], "its neighbours are served");
    let fh = fs.open(lookup(&fs, "a/3").unwrap(), OpenMode::default()).unwrap();
    let before = store.gets_sent();
    for _ in 0..3 {
        let e = fs.read(fh, 0, 128 << 10).unwrap_err();
        assert!(matches!(e, shardfs::fs::Error::Damaged(_)), "{e:?}");
    }
    fs.release(fh);
    assert_eq!(store.gets_sent() - before, 1, "the chunk fetched and found damaged once");
}

const SHARD: &str = "a/c/0";

fn spec(entries: u64) -> IndexSpec {
    IndexSpec { entries, endian: Endian::Little, checksum: true, location: IndexLocation::End }
}

/// The chunks of the shard at `SHARD` laid out as `spec`.
fn chunks_of(store: &dyn Store, spec: &IndexSpec) -> Vec<Option<Vec<u8>>> {
    let bytes = store.read(SHARD).unwrap();
    let len = bytes.len() as u64;
    let range = spec.index_range(len).unwrap();
    let index = ShardIndex::decode(spec, &bytes[range.start as usize..range.end as usize], len, 0).unwrap();
    (0..spec.entries)
        .map(|i| index.chunk(i).unwrap().map(|r| bytes[r.start as usize..r.end as usize].to_vec()))
        .collect()
}

/// A bucket store over `objects` that lets another machine put `theirs` at `SHARD` just before
/// its own first write there: between a commit's read of the shard and its conditional write.
fn interloper(objects: &Arc<InMemory>, theirs: Vec<u8>) -> Hooked<BucketStore> {
    let other = bucket(objects);
    Hooked::new(bucket(objects)).before_writing(SHARD, move || {
        other.put(SHARD, &[&theirs], PutMode::Overwrite).unwrap();
    })
}

#[test]
fn emptying_a_shard_keeps_a_chunk_another_machine_committed_meanwhile() {
    let objects = Arc::new(InMemory::new());
    let spec = spec(4);
    let ours = bucket(&objects);
    ours.put(SHARD, &[&assemble_shard(&spec, &[Some(b"one".as_slice()), None, None, None])], PutMode::Create).unwrap();
    let theirs = assemble_shard(&spec, &[Some(b"one".as_slice()), None, Some(b"theirs".as_slice()), None]);
    let store = interloper(&objects, theirs);
    let emptied: Changes = BTreeMap::from([(0, None)]);
    commit(&store, SHARD, &spec, &emptied).unwrap();
    assert_eq!(chunks_of(&bucket(&objects), &spec), [None, None, Some(b"theirs".to_vec()), None]);
}

#[test]
fn a_nested_commit_retried_after_another_machines_commit_keeps_its_chunks() {
    let objects = Arc::new(InMemory::new());
    let (outer, inner) = (spec(2), spec(2));
    let inner_shard = |chunks: &[Option<&[u8]>]| assemble_shard(&inner, chunks);
    let theirs = assemble_shard(&outer, &[Some(inner_shard(&[None, Some(b"theirs")])), None]);
    let store = interloper(&objects, theirs);
    let ours: NestedChanges = BTreeMap::from([(vec![0, 0], Some(b"ours".as_slice().into()))]);
    commit_levels(&store, SHARD, &[outer, inner], &ours).unwrap();
    let inner_chunks = chunks_of(&bucket(&objects), &outer)[0].clone().unwrap();
    let objects_inner = Arc::new(InMemory::new());
    bucket(&objects_inner).put(SHARD, &[&inner_chunks], PutMode::Create).unwrap();
    assert_eq!(chunks_of(&bucket(&objects_inner), &inner), [Some(b"ours".to_vec()), Some(b"theirs".to_vec())]);
}

#[test]
fn handles_of_one_plain_file_share_its_content_and_a_truncating_open_empties_it() {
    let store = bucket(&Arc::new(InMemory::new()));
    store.put("f", &[b"old"], PutMode::Overwrite).unwrap();
    let emptied = store.open_file("f", OpenHow { create: None, truncate: true }).unwrap();
    emptied.sync().unwrap();
    assert_eq!(store.read("f").unwrap(), b"", "a truncating open with no write still empties the file");
    let first = store.open_file("g", OpenHow { create: Some(0o644), truncate: false }).unwrap();
    let second = store.open_file("g", OpenHow::default()).unwrap();
    first.write_at(b"one", 0).unwrap();
    first.sync().unwrap();
    second.write_at(b"T", 0).unwrap();
    second.sync().unwrap();
    assert_eq!(
        store.read("g").unwrap(),
        b"Tne",
        "the second handle wrote over the first one's bytes, not its own stale copy"
    );
}

/// An in-memory object store as a server the tests watch: it counts the requests it is sent and,
/// when told to, ignores If-Match on reads, as some S3-compatible servers do.
#[derive(Debug, Default)]
struct Server {
    objects: InMemory,
    ignores_if_match: bool,
    requests: std::sync::atomic::AtomicUsize,
}

impl Server {
    fn asked(&self) {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Server")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Server {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.asked();
        self.objects.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.asked();
        self.objects.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.asked();
        let if_match = if self.ignores_if_match { None } else { options.if_match.clone() };
        self.objects.get_opts(location, object_store::GetOptions { if_match, ..options }).await
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.asked();
        self.objects.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.asked();
        self.objects.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.asked();
        self.objects.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.asked();
        self.objects.copy_opts(from, to, options).await
    }
}

#[test]
fn a_server_that_ignores_if_match_never_passes_off_another_versions_bytes() {
    let objects = Arc::new(Server { ignores_if_match: true, ..Server::default() });
    let writer = BucketStore::new(objects.clone(), "", "memory://ignores", Caching::default()).unwrap();
    writer.put("k", &[b"one"], PutMode::Overwrite).unwrap();
    // Read by a store that did not write it (which would hold what it wrote).
    let store = BucketStore::new(objects, "", "memory://ignores", Caching::default()).unwrap();
    let opened = store.open("k").unwrap();
    writer.put("k", &[b"two"], PutMode::Overwrite).unwrap();
    assert!(matches!(opened.read_exact_at(0, 3), Err(store::Error::Changed(_))), "the reply's ETag gave it away");
}

#[test]
fn a_read_refused_for_its_version_has_the_next_open_ask_the_server() {
    let objects = Arc::new(InMemory::new());
    bucket(&objects).put("k", &[b"one"], PutMode::Overwrite).unwrap();
    let store = bucket(&objects);
    let opened = store.open("k").unwrap();
    bucket(&objects).put("k", &[b"two"], PutMode::Overwrite).unwrap();
    assert!(matches!(opened.read_exact_at(0, 3), Err(store::Error::Changed(_))), "If-Match refused (412)");
    // Within the remembered version's lifetime: not the version the server just refused.
    assert_eq!(store.open("k").unwrap().read_exact_at(0, 3).unwrap(), b"two");
}

#[test]
fn an_idle_mount_stops_asking_the_server_once_the_kernel_would_ask_again() {
    let server = Arc::new(Server::default());
    let caching = || Caching { metadata_ttl: Duration::ZERO, ..Caching::default() };
    let store = BucketStore::new(server.clone(), "data", "memory://bucket/data", caching()).unwrap();
    upload(&store, &golden().join("sharded"), "");
    let fs = filesystem(Arc::new(store), IndexCache::new(1 << 20), None).unwrap();
    let chunk = lookup(&fs, "zp/gzip_crc_end/c/1/0").unwrap();
    list_plus(&fs, lookup(&fs, "zp/gzip_crc_end/c").unwrap());
    let before = server.requests();
    assert!(fs.stale(CACHE_TTL).is_empty());
    assert!(server.requests() > before, "a pass over the files the kernel was told of asks the server");
    std::thread::sleep(Duration::from_millis(30));
    let lapsed = fs.stale(Duration::from_millis(20));
    let dropped = lapsed.iter().find(|s| s.ino == chunk).expect("the chunk is no longer watched");
    assert_eq!((dropped.content, &dropped.entry), (Dropped::Attributes, &None), "its pages stay");
    let idle = server.requests();
    for _ in 0..3 {
        assert!(fs.stale(CACHE_TTL).is_empty());
    }
    assert_eq!(server.requests(), idle, "an idle mount asks nothing");
    // Another machine replaces the chunk's shard (with a copy of the next one): the kernel asks
    // again before it uses what it holds, and is answered from the server.
    let other = BucketStore::new(server.clone(), "data", "memory://bucket/data", caching()).unwrap();
    let next = other.read("zp/gzip_crc_end/c/1/0").unwrap();
    other.put("zp/gzip_crc_end/c/0/0", &[&next], PutMode::Overwrite).unwrap();
    assert_ne!(lookup(&fs, "zp/gzip_crc_end/c/1/0").unwrap(), chunk, "the name leads to the new version");
    assert!(read_path(&fs, "zp/gzip_crc_end/c/1/0").unwrap() == twin("zp/gzip_crc_end/c/3/0"));
    assert!(server.requests() > idle);
}

#[test]
fn a_document_read_again_costs_no_get_while_its_version_stands() {
    let objects = Arc::new(InMemory::new());
    // Every read asks the server for the version: only the GET of its bytes is saved.
    let caching = Caching { metadata_ttl: Duration::ZERO, ..Caching::default() };
    let store = BucketStore::new(objects.clone(), "data/sharded", "memory://bucket/data/sharded", caching).unwrap();
    bucket(&objects).put("zarr.json", &[b"{\"one\": 1}"], PutMode::Overwrite).unwrap();
    assert_eq!(store.read("zarr.json").unwrap(), b"{\"one\": 1}");
    let before = store.gets_sent();
    assert_eq!(store.read("zarr.json").unwrap(), b"{\"one\": 1}");
    assert_eq!(store.gets_sent(), before, "the same version read again");
    bucket(&objects).put("zarr.json", &[b"{\"two\": 2}"], PutMode::Overwrite).unwrap();
    assert_eq!(store.read("zarr.json").unwrap(), b"{\"two\": 2}", "another machine's new version");
    assert_eq!(store.gets_sent(), before + 1);
}

/// An object store whose answers are mangled on the way, as a faulty network or proxy does: GETs
/// of whole objects come back with 64 bytes too many (every one, or every other one), and the
/// next conditional PUT (or every one) is applied but its answer lost.
#[derive(Debug, Default)]
struct Mangles {
    inner: InMemory,
    long_bodies: std::sync::atomic::AtomicU64,
    every_get_long: bool,
    lose_next_put: std::sync::atomic::AtomicBool,
    lose_every_put: bool,
}

impl std::fmt::Display for Mangles {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Mangles")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Mangles {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        let conditional = !matches!(opts.mode, object_store::PutMode::Overwrite);
        let lost = || object_store::Error::Generic { store: "Mangles", source: "connection reset".into() };
        let put = self.inner.put_opts(location, payload, opts).await;
        if conditional && self.lose_every_put {
            return Err(lost());
        }
        let put = put?;
        if conditional && self.lose_next_put.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(lost());
        }
        Ok(put)
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        let whole = options.range.is_none() && !options.head;
        let result = self.inner.get_opts(location, options).await?;
        let n = self.long_bodies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !whole || !(self.every_get_long || n.is_multiple_of(2)) {
            return Ok(result);
        }
        let (meta, attributes) = (result.meta.clone(), result.attributes.clone());
        let mut bytes = result.bytes().await?.to_vec();
        bytes.extend_from_slice(&[0xAB; 64]);
        let len = bytes.len() as u64;
        let stream = futures_util::stream::once(async move { Ok(bytes::Bytes::from(bytes)) });
        Ok(object_store::GetResult {
            payload: object_store::GetResultPayload::Stream(Box::pin(stream)),
            meta: object_store::ObjectMeta { size: len, ..meta },
            range: 0..len,
            attributes,
            extensions: Default::default(),
        })
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[test]
fn a_whole_object_read_with_a_longer_body_is_tried_again_and_never_taken() {
    let objects = Arc::new(Mangles::default());
    let writer = BucketStore::new(objects.clone(), "", "memory://mangles", Caching::default()).unwrap();
    writer.put("zarr.json", &[b"{\"zarr_format\": 3}"], PutMode::Overwrite).unwrap();
    // Another store, which has not written what it reads.
    let store = BucketStore::new(objects.clone(), "", "memory://mangles", Caching::default()).unwrap();
    for _ in 0..4 {
        assert_eq!(store.read("zarr.json").unwrap(), b"{\"zarr_format\": 3}", "every other GET is 64 bytes long");
    }
    let always = Arc::new(Mangles { every_get_long: true, ..Default::default() });
    let writer = BucketStore::new(always.clone(), "", "memory://mangles", Caching::default()).unwrap();
    writer.put("notes.txt", &[b"short"], PutMode::Overwrite).unwrap();
    let store = BucketStore::new(always, "", "memory://mangles", Caching::default()).unwrap();
    assert!(matches!(store.read("notes.txt"), Err(store::Error::Io { .. })), "a body that is always long is an error");
}

#[test]
fn a_conditional_put_whose_answer_was_lost_has_succeeded() {
    let objects = Arc::new(Mangles::default());
    let store = BucketStore::new(objects.clone(), "", "memory://mangles", Caching::default()).unwrap();
    objects.lose_next_put.store(true, std::sync::atomic::Ordering::SeqCst);
    let named = store.put("a", &[b"mine"], PutMode::Create).expect("the retry meets its own object");
    let stamp = store.attr("a").unwrap().stamp;
    assert_eq!(named, Some(stamp), "the version found holding what was put");
    objects.lose_next_put.store(true, std::sync::atomic::Ordering::SeqCst);
    store.put("a", &[b"mine, again"], PutMode::Update(stamp)).expect("the retry meets its own update");
    assert_eq!(store.read("a").unwrap(), b"mine, again");
    assert!(
        matches!(store.put("a", &[b"other"], PutMode::Create), Err(store::Error::Changed(_))),
        "another writer's object is still someone else's"
    );
}

#[test]
fn a_writable_mount_whose_conditional_writes_get_no_answer_is_refused_for_that_reason() {
    let objects = Arc::new(Mangles { lose_every_put: true, ..Default::default() });
    let store = BucketStore::new(objects, "", "memory://mangles", Caching::default()).unwrap();
    let refused = store.check_writes().unwrap_err().to_string();
    assert!(
        refused.contains("cannot tell whether the server refuses conditional writes (no answer: ")
            && refused.contains("connection reset"),
        "not that the server ignores them, which nobody said: {refused}"
    );
}

/// The block files of the disk cache in `dir`.
fn cache_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for sub in std::fs::read_dir(dir.join("shardfs-cache-v1")).unwrap().flatten() {
        if sub.file_name() != "tmp" {
            files.extend(std::fs::read_dir(sub.path()).unwrap().flatten().map(|f| f.path()));
        }
    }
    files
}

#[test]
fn a_remount_with_a_disk_cache_sends_no_get_and_never_serves_a_replaced_or_damaged_file() {
    let Some(endpoint) = s3_endpoint("the disk cache against S3") else { return };
    let name = format!("disk-cache-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint), ..Default::default() };
    let url = format!("s3://{name}/ds");
    let plain = || s3::open(&url, &options, Caching { metadata_ttl: Duration::ZERO, ..Caching::default() }).unwrap();
    upload(&plain(), &golden().join("sharded"), "");
    let cache = TempDir::new("disk-cache");
    let dir = cache.path().join("made/if/missing");
    let disk = Some(DiskSettings { dir: dir.clone(), max_bytes: Some(256 << 20), server: String::new() });
    // A mount: a store and a filesystem of its own, as a new process would have.
    let mount = || {
        let store = s3::open(&url, &options, Caching { disk: disk.clone(), ..Caching::default() }).unwrap();
        let fs = filesystem(Arc::new(store.clone()), IndexCache::new(1 << 20), None).unwrap();
        (store, fs)
    };
    let (want_files, want_dirs) = walk_view(&fs_of(&golden().join("sharded")));
    let same_as_golden = |fs: &ShardFs| {
        let (files, dirs) = walk_view(fs);
        assert_eq!(dirs, want_dirs);
        assert!(files == want_files, "the view differs from the golden one");
    };

    let (cold, fs) = mount();
    same_as_golden(&fs);
    assert!(cold.gets_sent() > 0);
    assert!(!cache_files(&dir).is_empty());
    drop((cold, fs));
    let (warm, fs) = mount();
    same_as_golden(&fs);
    assert_eq!(warm.gets_sent(), 0, "every metadata document, shard index and chunk from disk");

    // Every cache file damaged: each is a miss, removed, fetched again and kept again.
    for (i, file) in cache_files(&dir).into_iter().enumerate() {
        let mut bytes = std::fs::read(&file).unwrap();
        match i % 3 {
            0 => *bytes.last_mut().unwrap() ^= 0x20,
            1 => bytes.truncate(bytes.len() - 1),
            _ => bytes[40] ^= 1,
        }
        std::fs::write(&file, bytes).unwrap();
    }
    let (damaged, fs) = mount();
    same_as_golden(&fs);
    assert!(damaged.gets_sent() > 0, "damaged files are not served");
    let (again, fs) = mount();
    same_as_golden(&fs);
    assert_eq!(again.gets_sent(), 0, "and were replaced");

    // A shard replaced behind the mounts' backs, by one of the same length: the new bytes.
    let shard = "zp/big_endian_index/c/0/0";
    let other = plain().read("zp/big_endian_index/c/1/0").unwrap();
    assert_eq!(other.len(), plain().read(shard).unwrap().len());
    plain().put(shard, &[&other], PutMode::Overwrite).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let (files, _) = walk_view(&fs);
    let (truth, _) = walk_view(&filesystem(Arc::new(plain()), IndexCache::new(1 << 20), None).unwrap());
    assert!(files == truth, "the cached mount shows the shard as the server has it now");
    assert!(files != want_files, "which differs from what it cached");
    assert!(again.gets_sent() > 0);
}

#[test]
fn a_disk_cache_is_refused_for_a_local_store_and_an_unusable_directory_before_anything() {
    let check = |store: &str, dir: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardfs"))
            .args(["check", store, "--endpoint-url", "http://127.0.0.1:9", "--cache"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let temp = TempDir::new("unusable-cache");
    let local = golden().join("sharded");
    let e = check(local.to_str().unwrap(), temp.path());
    assert!(e.contains("--cache is for object stores") && e.trim().lines().count() == 1, "{e}");
    let file = temp.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let e = check("s3://bucket/prefix", &file);
    assert!(e.contains(&format!("cache directory {}: cannot create it", file.display())), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

#[test]
fn a_real_mount_with_o_cache_fills_the_cache_and_a_remount_over_it_shows_the_same_files() {
    let Some(endpoint) = s3_endpoint("a mount with a disk cache") else { return };
    let Some(mnt) = mount_point() else { return };
    let name = format!("disk-cache-mount-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint.clone()), ..Default::default() };
    let url = format!("s3://{name}/ds");
    upload(&s3::open(&url, &options, Caching::default()).unwrap(), &golden().join("sharded"), "");
    let cache = TempDir::new("mount-cache");
    let (want_files, want_dirs) = walk_view(&fs_of(&golden().join("sharded")));
    for round in ["cold", "warm"] {
        let _guard = UnmountGuard(mnt.path().to_path_buf());
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_shardfs"))
            .args(["mount", "--read-only", &url])
            .arg(mnt.path())
            .args(["--endpoint-url", &endpoint, "-o", &format!("cache={},max_cache_size=64M", cache.path().display())])
            .status()
            .unwrap();
        assert!(status.success(), "{round} mount");
        let (files, dirs) = walk_dir(mnt.path());
        shardfs::mount::unmount(mnt.path()).unwrap();
        assert_eq!(dirs, want_dirs, "{round}");
        assert!(files == want_files, "{round}: the mount's files differ from the golden view");
        assert!(!cache_files(cache.path()).is_empty(), "{round}: the cache holds what was read");
    }
}

#[test]
fn check_reads_a_shard_replaced_while_it_reads_it_again() {
    let objects = golden_bucket();
    let expected = scan_with(&bucket(&objects), Depth::Data, &Silent).unwrap();
    assert!(expected.healthy(), "{expected:?}");
    // Another writer puts the shard again (the same bytes, a new ETag) just after check opened
    // it: every read of the version opened is refused (If-Match), as from a replaced object.
    const SHARD: &str = "zp/gzip_crc_end/c/1/0";
    let other = bucket(&objects);
    let bytes = other.read(SHARD).unwrap();
    let store = Hooked::new(bucket(&objects)).after_opening(SHARD, move || {
        other.put(SHARD, &[&bytes], PutMode::Overwrite).unwrap();
    });
    let report = scan_with(&store, Depth::Data, &Silent).unwrap();
    assert_eq!(report, expected, "the same report, none of the replaced shard's reads taken for damage");
}

/// A writer's opens without O_TRUNC of one large shard's chunks in order are not taken for a
/// reader going on in order (`Need::Alone`): the rest of the shard in lanes would be up to twelve
/// GETs, of bytes it never reads.
#[test]
fn a_writer_opening_chunks_of_a_large_shard_in_order_costs_no_lanes() {
    let Some(endpoint) = s3_endpoint("the GETs of a writer's opens in a large shard") else { return };
    let name = format!("rewrite-large-{}", std::process::id());
    make_bucket(&endpoint, &name);
    let options = S3Options { endpoint_url: Some(endpoint.to_string()), ..Default::default() };
    let store = s3::open(&format!("s3://{name}/ds"), &options, Caching::default()).unwrap();
    let per_shard = 96usize;
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [per_shard << 20], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [per_shard << 20]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1 << 20],
            "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
    });
    let chunks: Vec<Vec<u8>> = (0..per_shard).map(|i| mib_chunk(i as u8)).collect();
    store.put("zarr.json", &[br#"{"zarr_format": 3, "node_type": "group"}"#], PutMode::Overwrite).unwrap();
    store.put("a/zarr.json", &[&serde_json::to_vec(&doc).unwrap()], PutMode::Overwrite).unwrap();
    let bytes = assemble_shard(&spec(per_shard as u64), &chunks.iter().map(|c| Some(c.as_slice())).collect::<Vec<_>>());
    store.put("a/c/0", &[&bytes], PutMode::Overwrite).unwrap();
    let fs = writable(store.clone());
    lookup(&fs, "a/zarr.json").unwrap();
    let before = store.gets_sent();
    let write = OpenMode { write: true, truncate: false, append: false };
    for (i, chunk) in chunks.iter().enumerate().take(4) {
        let fh = fs.open(lookup(&fs, &format!("a/c/{i}")).unwrap(), write).unwrap();
        assert!(fs.read(fh, 0, 1 << 20).unwrap() == *chunk, "chunk {i}");
        fs.release(fh);
    }
    std::thread::sleep(Duration::from_millis(500));
    let gets = store.gets_sent() - before;
    assert!(gets <= 5, "{gets} GETs for the first four chunks of one shard, opened by a writer");
}
