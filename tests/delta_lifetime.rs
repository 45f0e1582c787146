//! A delta whose writer is gone (a daemon killed while it waited) is not folded when the shard is
//! next committed, however much later: past its lifetime by the server's clock it is left out,
//! with a marker for a writer that might still read it, and the marker goes too once no one did.
//! A binary of its own: the lifetime is shortened for the whole process.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex};
use shardfs::store::Store;
use shardfs::store::bucket::{BucketStore, Caching};
use shardfs::store::exchange::EXCHANGE_DIR;
use shardfs::write::commit::{NestedChanges, commit_levels};
use shardfs::write::{delta, shared_commit};

const KEY: &str = "arr/c/0";

fn spec() -> IndexSpec {
    IndexSpec { entries: 16, endian: Endian::Little, checksum: true, location: IndexLocation::End }
}

fn changes(pairs: &[(u64, Vec<u8>)]) -> NestedChanges<'_> {
    pairs.iter().map(|(entry, bytes)| (vec![*entry], Some(Cow::Borrowed(&bytes[..])))).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

/// The objects in the shard's exchange directory, but for its lease given up (`InMemory` has no
/// conditional DELETE, so a lease is given up by emptying it).
fn exchange_objects(bucket: &Arc<InMemory>) -> Vec<String> {
    let prefix = Path::from(format!("p/{EXCHANGE_DIR}/{KEY}"));
    let listed = runtime().block_on(bucket.list_with_delimiter(Some(&prefix))).unwrap();
    let given_up = |o: &object_store::ObjectMeta| o.location.filename() == Some("lease") && o.size == 0;
    listed.objects.into_iter().filter(|o| !given_up(o)).map(|o| o.location.filename().unwrap().to_string()).collect()
}

#[test]
fn a_dead_writers_delta_is_left_out_once_past_its_lifetime_and_its_marker_goes_after() {
    shared_commit::set_lifetime(Duration::from_millis(1500));
    let bucket = Arc::new(InMemory::new());
    let store = BucketStore::new(bucket.clone(), "p", "s3://bucket/p", Caching::default()).unwrap();
    commit_levels(&store, KEY, &[spec()], &changes(&[(3, vec![1; 8])])).unwrap();
    // A daemon killed while it waited left this delta (entry 3 = 9s); later entry 3 was written
    // again (2s) by zarr-python straight to the bucket, which knows nothing of deltas.
    let zombie = format!("p/{EXCHANGE_DIR}/{KEY}/delta-00000000000000000001-0");
    runtime().block_on(bucket.put(&Path::from(zombie), delta::encode(&changes(&[(3, vec![9; 8])])).into())).unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    let mut chunks = vec![None; 16];
    chunks[3] = Some(vec![2u8; 8]);
    let direct = shardfs::format::shard_index::assemble_shard(&spec(), &chunks);
    runtime().block_on(bucket.put(&Path::from(format!("p/{KEY}")), direct.into())).unwrap();
    // The next commit through a mount, of another chunk.
    commit_levels(&store, KEY, &[spec()], &changes(&[(5, vec![5; 8])])).unwrap();
    let bytes = store.read(KEY).unwrap();
    let range = spec().index_range(bytes.len() as u64).unwrap();
    let index =
        ShardIndex::decode(&spec(), &bytes[range.start as usize..range.end as usize], bytes.len() as u64, 0).unwrap();
    let chunk = index.chunk(3).unwrap().unwrap();
    assert_eq!(&bytes[chunk.start as usize..chunk.end as usize], &[2; 8], "the dead writer's delta came back");
    assert_eq!(exchange_objects(&bucket), vec!["rejected-delta-00000000000000000001-0".to_string()]);
    // No writer read the marker: the first commit past its lifetime removes it.
    std::thread::sleep(Duration::from_millis(2000));
    commit_levels(&store, KEY, &[spec()], &changes(&[(4, vec![4; 8])])).unwrap();
    assert_eq!(exchange_objects(&bucket), Vec::<String>::new());
}
