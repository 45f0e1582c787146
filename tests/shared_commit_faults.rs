//! Commits of many machines into one shard (`write::shared_commit`) when the store fails under
//! them, over object_store's `InMemory` wrapped to fail on cue (`Faults`): a commit whose own
//! chunks a stored version holds is told it is done, whatever fails after (told EIO, its writer
//! would write them again later, over whatever others wrote since), whether it held the lease
//! itself or its delta was folded by it as a waiter that took the lease; and a shard whose ranged
//! reads keep failing as replaced (416) fails the commit after a bounded number of reads, with
//! pauses between them, rather than asking again forever; a delta removed between a holder's HEAD
//! and its GET of it is taken as gone, and the round read again, not failed.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex};
use shardfs::store::Store;
use shardfs::store::bucket::{BucketStore, Caching};
use shardfs::store::exchange::EXCHANGE_DIR;
use shardfs::write::commit::{NestedChanges, commit_levels};
use shardfs::write::delta;

const KEY: &str = "arr/c/0";
const ENTRIES: u64 = 8;

fn spec() -> IndexSpec {
    IndexSpec { entries: ENTRIES, endian: Endian::Little, checksum: true, location: IndexLocation::End }
}

/// `InMemory` whose listings fail (an answer, not tried again) once the shard was put, when
/// `lists_fail_after_put`, and whose ranged GETs of the shard are answered 416, when `range_gone`.
#[derive(Debug, Default)]
struct Faults {
    inner: Arc<InMemory>,
    lists_fail_after_put: bool,
    put: AtomicBool,
    range_gone: bool,
    ranged_gets: AtomicU64,
    /// The next whole GET of a delta is answered 404, as when another holder removed it between
    /// this one's HEAD and its GET.
    delta_gone_once: AtomicBool,
}

impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faults")
    }
}

fn is_shard(location: &Path) -> bool {
    location.as_ref() == format!("p/{KEY}")
}

#[async_trait]
impl ObjectStore for Faults {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let put = self.inner.put_opts(location, payload, opts).await;
        if put.is_ok() && is_shard(location) {
            self.put.store(true, Ordering::SeqCst);
        }
        put
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if self.range_gone && options.range.is_some() && is_shard(location) {
            self.ranged_gets.fetch_add(1, Ordering::SeqCst);
            let source = "Server returned non-2xx status code: 416 Range Not Satisfiable".into();
            return Err(object_store::Error::Generic { store: "S3", source });
        }
        if options.range.is_none()
            && !options.head
            && location.as_ref().contains("/delta-")
            && self.delta_gone_once.swap(false, Ordering::SeqCst)
        {
            return Err(object_store::Error::NotFound { path: location.to_string(), source: "injected".into() });
        }
        self.inner.get_opts(location, options).await
    }
    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }
    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        if self.lists_fail_after_put && self.put.load(Ordering::SeqCst) {
            return Err(object_store::Error::PermissionDenied { path: "list".into(), source: "injected".into() });
        }
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn machine(objects: Arc<dyn ObjectStore>) -> BucketStore {
    BucketStore::new(objects, "p", "s3://bucket/p", Caching::default()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

fn read_shard(bucket: &Arc<InMemory>) -> Vec<Option<Vec<u8>>> {
    let bytes = machine(bucket.clone()).read(KEY).unwrap();
    let range = spec().index_range(bytes.len() as u64).unwrap();
    let index =
        ShardIndex::decode(&spec(), &bytes[range.start as usize..range.end as usize], bytes.len() as u64, 0).unwrap();
    (0..ENTRIES).map(|i| index.chunk(i).unwrap().map(|r| bytes[r.start as usize..r.end as usize].to_vec())).collect()
}

fn changes(pairs: &[(u64, Vec<u8>)]) -> NestedChanges<'_> {
    pairs.iter().map(|(entry, bytes)| (vec![*entry], Some(Cow::Borrowed(&bytes[..])))).collect()
}

#[test]
fn a_holder_whose_chunks_are_stored_is_told_so_whatever_fails_after() {
    let bucket = Arc::new(InMemory::new());
    // Another machine's delta waits: the holder folds it with its own chunks, then goes on for
    // another round, whose listing fails.
    let delta = Path::from(format!("p/{EXCHANGE_DIR}/{KEY}/delta-00000000000000000001-0"));
    runtime().block_on(bucket.put(&delta, delta::encode(&changes(&[(1, vec![1; 7])])).into())).unwrap();
    let faults = Arc::new(Faults { inner: bucket.clone(), lists_fail_after_put: true, ..Faults::default() });
    let mine = vec![2u8; 9];
    commit_levels(&machine(faults), KEY, &[spec()], &changes(&[(2, mine.clone())])).expect("its chunks are stored");
    let chunks = read_shard(&bucket);
    assert_eq!(chunks[2].as_deref(), Some(&mine[..]));
    assert_eq!(chunks[1].as_deref(), Some(&[1; 7][..]));
}

#[test]
fn a_waiter_that_folded_its_own_delta_is_told_so_whatever_fails_after() {
    let bucket = Arc::new(InMemory::new());
    let lease = Path::from(format!("p/{EXCHANGE_DIR}/{KEY}/lease"));
    runtime().block_on(bucket.put(&lease, b"holder-other".to_vec().into())).unwrap();
    let faults = Arc::new(Faults { inner: bucket.clone(), lists_fail_after_put: true, ..Faults::default() });
    let store = machine(faults);
    let mine = vec![4u8; 9];
    let waiter = {
        let mine = mine.clone();
        std::thread::spawn(move || commit_levels(&store, KEY, &[spec()], &changes(&[(4, mine)])).map(|c| c.outcome))
    };
    std::thread::sleep(Duration::from_millis(300));
    // The other holder gives the lease up: the waiter takes it and folds its own delta.
    runtime().block_on(bucket.delete(&lease)).unwrap();
    waiter.join().unwrap().expect("its delta is folded");
    assert_eq!(read_shard(&bucket)[4].as_deref(), Some(&mine[..]));
}

#[test]
fn a_shard_whose_ranged_reads_keep_answering_416_fails_the_commit_after_bounded_tries() {
    let bucket = Arc::new(InMemory::new());
    commit_levels(&machine(bucket.clone()), KEY, &[spec()], &changes(&[(1, vec![1; 5])])).unwrap();
    let faults = Arc::new(Faults { inner: bucket.clone(), range_gone: true, ..Faults::default() });
    let store = machine(faults.clone());
    let (sent, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sent.send(commit_levels(&store, KEY, &[spec()], &changes(&[(2, vec![2; 5])])).is_err());
    });
    let failed = got.recv_timeout(Duration::from_secs(60)).expect("the commit returns");
    assert!(failed, "a commit over a shard it cannot read succeeded");
    let gets = faults.ranged_gets.load(Ordering::SeqCst);
    assert!(gets <= 64, "{gets} ranged GETs: read again without end");
}

#[test]
fn a_delta_removed_between_its_head_and_its_get_is_read_as_gone_not_as_a_failure() {
    let bucket = Arc::new(InMemory::new());
    let delta = Path::from(format!("p/{EXCHANGE_DIR}/{KEY}/delta-00000000000000000001-0"));
    runtime().block_on(bucket.put(&delta, delta::encode(&changes(&[(1, vec![1; 7])])).into())).unwrap();
    let faults =
        Arc::new(Faults { inner: bucket.clone(), delta_gone_once: AtomicBool::new(true), ..Faults::default() });
    commit_levels(&machine(faults), KEY, &[spec()], &changes(&[(2, vec![2; 9])])).expect("no EIO");
    let chunks = read_shard(&bucket);
    assert_eq!(chunks[1].as_deref(), Some(&[1; 7][..]));
    assert_eq!(chunks[2].as_deref(), Some(&[2; 9][..]));
}
