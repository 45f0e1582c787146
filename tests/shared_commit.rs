//! Commits of many machines into one shard of an object store (`write::shared_commit`), each
//! machine a bucket store of its own over one object_store `InMemory` (whose conditional PUTs are
//! atomic per key, and which keeps user metadata): nothing committed is lost, the turn-taking
//! objects are gone afterwards, a delta a stored shard already holds is never folded again over
//! newer chunks, a delta left waiting is folded before the changes of the commit that finds it,
//! a damaged delta is left out and its writer told so, an expired lease is taken over, and
//! deltas fold in the order the server stored them, whatever their names say.

use std::borrow::Cow;
use std::sync::{Arc, Barrier};

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex};
use shardfs::store::bucket::{BucketStore, Caching};
use shardfs::store::exchange::EXCHANGE_DIR;
use shardfs::store::{PutMode, Store};
use shardfs::write::commit::{NestedChanges, commit_levels};
use shardfs::write::delta;

const KEY: &str = "arr/c/0";
const ENTRIES: u64 = 64;

fn spec() -> IndexSpec {
    IndexSpec { entries: ENTRIES, endian: Endian::Little, checksum: true, location: IndexLocation::End }
}

/// One machine: a store of its own (its own caches) over the shared bucket.
fn machine(bucket: &Arc<InMemory>) -> BucketStore {
    BucketStore::new(bucket.clone(), "p", "s3://bucket/p", Caching::default()).unwrap()
}

fn chunk(writer: u8, entry: u64) -> Vec<u8> {
    vec![writer.wrapping_mul(41).wrapping_add(entry as u8); 100 + entry as usize]
}

fn changes(pairs: &[(u64, Vec<u8>)]) -> NestedChanges<'_> {
    pairs.iter().map(|(entry, bytes)| (vec![*entry], Some(Cow::Borrowed(&bytes[..])))).collect()
}

/// The chunks of the shard as a reader that knows nothing of shardfs reads them.
fn read_shard(bucket: &Arc<InMemory>) -> Vec<Option<Vec<u8>>> {
    let store = machine(bucket);
    let bytes = store.read(KEY).unwrap();
    let range = spec().index_range(bytes.len() as u64).unwrap();
    let index = ShardIndex::decode(&spec(), &bytes[range.start as usize..range.end as usize], bytes.len() as u64, 0)
        .expect("every shard version decodes");
    (0..ENTRIES).map(|i| index.chunk(i).unwrap().map(|r| bytes[r.start as usize..r.end as usize].to_vec())).collect()
}

/// The objects left in the shard's exchange directory, but for its lease given up (`InMemory`
/// has no conditional DELETE, so a lease is given up by emptying it).
fn exchange_objects(bucket: &Arc<InMemory>) -> Vec<String> {
    let prefix = Path::from(format!("p/{EXCHANGE_DIR}/{KEY}"));
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime
        .block_on(bucket.list_with_delimiter(Some(&prefix)))
        .unwrap()
        .objects
        .into_iter()
        .filter(|o| !(o.location.as_ref().ends_with("/lease") && o.size == 0))
        .map(|o| o.location.to_string())
        .collect()
}

fn put_object(bucket: &Arc<InMemory>, key: &str, bytes: Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(bucket.put(&Path::from(format!("p/{key}")), bytes.into())).unwrap();
}

fn delta_key(name: &str) -> String {
    format!("{EXCHANGE_DIR}/{KEY}/{name}")
}

#[test]
fn eight_machines_committing_disjoint_chunks_of_one_shard_at_once_lose_nothing() {
    let bucket = Arc::new(InMemory::new());
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8u8)
        .map(|writer| {
            let (store, start) = (machine(&bucket), start.clone());
            std::thread::spawn(move || {
                // Two commits each: every entry i with i % 8 == writer, in two halves.
                for half in 0..2 {
                    let mine: Vec<(u64, Vec<u8>)> = (0..ENTRIES)
                        .filter(|i| i % 8 == writer as u64 && (i / 8) % 2 == half)
                        .map(|i| (i, chunk(writer, i)))
                        .collect();
                    start.wait();
                    commit_levels(&store, KEY, &[spec()], &changes(&mine)).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let chunks = read_shard(&bucket);
    for (i, got) in chunks.iter().enumerate() {
        assert_eq!(got.as_deref(), Some(&chunk((i % 8) as u8, i as u64)[..]), "entry {i}");
    }
    assert_eq!(exchange_objects(&bucket), Vec::<String>::new(), "lease and deltas are removed");
}

#[test]
fn a_delta_the_shard_already_holds_is_not_folded_again_over_newer_chunks() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    // A holder folded delta D (entry 1 = old) and was killed before removing it; then entry 1 was
    // written again (new), the version carrying D in its note.
    let old = vec![1u8; 10];
    let new = vec![2u8; 10];
    put_object(&bucket, &delta_key("delta-1"), delta::encode(&changes(&[(1, old)])));
    let shard = shardfs::format::shard_index::assemble_shard(&spec(), &{
        let mut chunks = vec![None; ENTRIES as usize];
        chunks[1] = Some(new.clone());
        chunks
    });
    let exchange = store.exchange().unwrap();
    exchange.put_noted(KEY, &[&shard], PutMode::Create, "delta-1").unwrap();
    commit_levels(&store, KEY, &[spec()], &changes(&[(2, vec![3; 10])])).unwrap();
    let chunks = read_shard(&bucket);
    assert_eq!(chunks[1].as_deref(), Some(&new[..]), "the delta was folded again");
    assert_eq!(chunks[2].as_deref(), Some(&[3; 10][..]));
    assert_eq!(exchange_objects(&bucket), Vec::<String>::new());
}

#[test]
fn a_waiting_delta_is_folded_before_the_changes_of_the_commit_that_finds_it_and_a_damaged_one_is_left_out() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    put_object(&bucket, &delta_key("delta-1"), delta::encode(&changes(&[(1, vec![1; 5]), (2, vec![1; 5])])));
    put_object(&bucket, &delta_key("delta-2"), b"shardfs delta 1\n\x01\x00".to_vec());
    commit_levels(&store, KEY, &[spec()], &changes(&[(2, vec![2; 5])])).unwrap();
    let chunks = read_shard(&bucket);
    assert_eq!(chunks[1].as_deref(), Some(&[1; 5][..]), "the waiting delta is folded");
    assert_eq!(chunks[2].as_deref(), Some(&[2; 5][..]), "the committer's own change comes last");
    // The damaged delta is gone, and a marker tells its writer why.
    assert_eq!(exchange_objects(&bucket), vec![format!("p/{}", delta_key("rejected-delta-2"))]);
    assert!(!store.exchange().unwrap().note(KEY).unwrap().unwrap().note.contains("delta-2"));
}

#[test]
fn a_waiter_whose_delta_was_damaged_on_the_way_is_told_its_commit_failed() {
    let bucket = Arc::new(InMemory::new());
    put_object(&bucket, &delta_key("lease"), b"holder-other".to_vec());
    let waiter = {
        let store = machine(&bucket);
        std::thread::spawn(move || commit_levels(&store, KEY, &[spec()], &changes(&[(4, vec![4; 9])])))
    };
    let start = std::time::Instant::now();
    let delta = loop {
        if let Some(name) = exchange_objects(&bucket).into_iter().find(|k| k.contains("/delta-")) {
            break name;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "no delta uploaded");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // Its bytes damaged in the bucket, then the lease given up: the waiter folds its own delta.
    put_object(&bucket, delta.strip_prefix("p/").unwrap(), b"shardfs delta 1\n\x05".to_vec());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(bucket.delete(&Path::from(format!("p/{}", delta_key("lease"))))).unwrap();
    let failed = waiter.join().unwrap().expect_err("a rejected delta is no commit");
    assert!(failed.to_string().contains("not committed"), "{failed}");
    assert_eq!(exchange_objects(&bucket), Vec::<String>::new(), "its marker is removed once read");
}

#[test]
fn a_lease_whose_holder_died_is_taken_over_once_it_expires() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    put_object(&bucket, &delta_key("lease"), b"holder-dead".to_vec());
    let began = std::time::Instant::now();
    commit_levels(&store, KEY, &[spec()], &changes(&[(5, vec![5; 7])])).unwrap();
    assert!(began.elapsed() >= shardfs::write::shared_commit::LEASE_TIMEOUT);
    assert_eq!(read_shard(&bucket)[5].as_deref(), Some(&[5; 7][..]));
    // The dead holder's create could still land were an outside tool to delete the shard: its
    // marker stays for a delta's lifetime, to be swept by a later commit.
    assert_eq!(exchange_objects(&bucket), vec![format!("p/{}", delta_key("doubt-holder-dead"))]);
}

#[test]
fn a_holder_returns_once_a_round_stores_its_own_chunks_and_more_deltas_than_a_note_names_fold_in_rounds() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    let chunks: Vec<(u64, Vec<u8>)> = (0..50).map(|i| (i, chunk(7, i))).collect();
    for (i, pair) in chunks.iter().enumerate() {
        let name = format!("delta-{i:020}-{i:016x}");
        put_object(&bucket, &delta_key(&name), delta::encode(&changes(std::slice::from_ref(pair))));
    }
    // The first commit folds the oldest deltas a note can name with its own chunks, and returns:
    // its writer waits for no one else's round.
    commit_levels(&store, KEY, &[spec()], &changes(&[(63, vec![63; 3])])).unwrap();
    let got = read_shard(&bucket);
    assert_eq!(got[63].as_deref(), Some(&[63; 3][..]));
    let folded = chunks.iter().take_while(|(i, bytes)| got[*i as usize].as_deref() == Some(&bytes[..])).count();
    assert!((1..50).contains(&folded), "{folded} of 50 deltas folded in the holder's one round");
    let note = store.exchange().unwrap().note(KEY).unwrap().unwrap().note;
    assert!(note.len() <= 2048 - 32, "a note of {} bytes", note.len());
    let left = exchange_objects(&bucket);
    assert_eq!(left.len(), 50 - folded, "{left:?}");
    // Their waiters (here, the next commit) fold the rest, oldest first, and nothing is lost.
    commit_levels(&store, KEY, &[spec()], &changes(&[(62, vec![62; 3])])).unwrap();
    let got = read_shard(&bucket);
    for (i, bytes) in &chunks {
        assert_eq!(got[*i as usize].as_deref(), Some(&bytes[..]), "entry {i}");
    }
    assert_eq!(got[62].as_deref(), Some(&[62; 3][..]));
    assert_eq!(exchange_objects(&bucket), Vec::<String>::new());
}

#[test]
fn deltas_fold_in_the_order_the_server_stored_them_not_by_their_writers_clocks() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    // A machine whose clock runs fast named its delta for the future; the later one, stored
    // after it by a machine with a true clock, wins.
    put_object(&bucket, &delta_key("delta-09999999999999999999-0"), delta::encode(&changes(&[(6, vec![1; 4])])));
    std::thread::sleep(std::time::Duration::from_millis(5));
    put_object(&bucket, &delta_key("delta-00000000000000000001-0"), delta::encode(&changes(&[(6, vec![2; 4])])));
    commit_levels(&store, KEY, &[spec()], &changes(&[(7, vec![7; 4])])).unwrap();
    let chunks = read_shard(&bucket);
    assert_eq!(chunks[6].as_deref(), Some(&[2; 4][..]), "the delta stored last is folded last");
    assert_eq!(chunks[7].as_deref(), Some(&[7; 4][..]));
}

#[test]
fn a_shard_returned_to_earlier_chunks_is_never_an_earlier_versions_bytes() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    let mut versions = Vec::new();
    for content in [1u8, 2, 1] {
        commit_levels(&store, KEY, &[spec()], &changes(&[(1, vec![content; 10])])).unwrap();
        versions.push(store.read(KEY).unwrap());
        assert_eq!(read_shard(&bucket)[1].as_deref(), Some(&[content; 10][..]));
    }
    // S3's ETag is the MD5 of the bytes: equal bytes would give the third version the first's.
    assert_ne!(versions[0], versions[2]);
}

#[test]
fn a_compacted_version_keeps_its_note_so_deltas_it_holds_are_not_folded_again() {
    let bucket = Arc::new(InMemory::new());
    let store = machine(&bucket);
    // As in the case above: delta-1 (entry 1 = old) is held by the version, which has entry 1 =
    // new since; then the shard is compacted, and another chunk committed.
    let (old, new) = (vec![1u8; 10], vec![2u8; 10]);
    put_object(&bucket, &delta_key("delta-1"), delta::encode(&changes(&[(1, old)])));
    // A hundred unused bytes before entry 1's, as a rewritten chunk leaves: something to compact.
    let empty = (shardfs::format::shard_index::EMPTY, shardfs::format::shard_index::EMPTY);
    let mut entries = vec![empty; ENTRIES as usize];
    entries[1] = (100, 10);
    let index = spec().encode(&entries);
    let shard = [&[9u8; 100][..], &new, &index].concat();
    store.exchange().unwrap().put_noted(KEY, &[&shard], PutMode::Create, "delta-1").unwrap();
    let compacted = shardfs::write::commit::compact(&store, KEY, &spec()).unwrap();
    assert!(matches!(compacted, shardfs::write::commit::Outcome::Compacted { .. }), "{compacted:?}");
    assert_eq!(store.exchange().unwrap().note(KEY).unwrap().unwrap().note, "delta-1");
    commit_levels(&store, KEY, &[spec()], &changes(&[(2, vec![3; 10])])).unwrap();
    assert_eq!(read_shard(&bucket)[1].as_deref(), Some(&new[..]), "the held delta was folded again");
}
