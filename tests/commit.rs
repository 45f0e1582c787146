//! Crash safety and concurrency of shard commits: a commit stopped at every single byte, then
//! recovered, leaves the shard wholly old or wholly new; concurrent committers lose nothing.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{Hooked, TempDir};
use shardfs::format::shard_index::{Endian, IndexLocation, IndexSpec, ShardIndex, assemble_shard};
use shardfs::store::faulty::FaultyStore;
use shardfs::store::{LocalStore, Store};
use shardfs::write::commit::{Changes, CommitError, Outcome, commit};
use shardfs::write::journal::{Recovery, recover};

const KEY: &str = "arr/c/0";

fn spec(location: IndexLocation) -> IndexSpec {
    IndexSpec { entries: 8, endian: Endian::Little, checksum: true, location }
}

/// The chunks of the shard at `KEY` (None: empty), read with the format layer alone.
fn read_shard(root: &Path, spec: &IndexSpec) -> Option<Vec<Option<Vec<u8>>>> {
    let bytes = std::fs::read(root.join(KEY)).ok()?;
    let range = spec.index_range(bytes.len() as u64).expect("index fits");
    let index = ShardIndex::decode(spec, &bytes[range.start as usize..range.end as usize], bytes.len() as u64, 0)
        .expect("index decodes");
    Some(
        (0..spec.entries)
            .map(|i| index.chunk(i).expect("entry valid").map(|r| bytes[r.start as usize..r.end as usize].to_vec()))
            .collect(),
    )
}

fn chunk(tag: u8, i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| tag.wrapping_mul(31).wrapping_add(i as u8).wrapping_add(j as u8)).collect()
}

fn setup(root: &Path, spec: &IndexSpec, old: &[Option<Vec<u8>>]) {
    std::fs::create_dir_all(root.join("arr/c")).unwrap();
    if old.iter().any(Option::is_some) {
        std::fs::write(root.join(KEY), assemble_shard(spec, old)).unwrap();
    } else {
        let _ = std::fs::remove_file(root.join(KEY));
    }
}

fn apply(old: &[Option<Vec<u8>>], changes: &Changes) -> Vec<Option<Vec<u8>>> {
    let changed = |i: usize| changes.get(&(i as u64)).map(|c| c.as_deref().map(<[u8]>::to_vec));
    old.iter().enumerate().map(|(i, c)| changed(i).unwrap_or_else(|| c.clone())).collect()
}

/// Stops the commit after 0, 1, 2, ... bytes until it completes; after each stop, recovery must
/// leave the shard wholly old or wholly new.
fn crash_at_every_byte(location: IndexLocation, old: Vec<Option<Vec<u8>>>, changes: Changes) -> u64 {
    crash_at_every_byte_of(location, old, changes, |store| store)
}

/// [`crash_at_every_byte`] on the store `wrap` makes of a local one.
fn crash_at_every_byte_of<S: Store>(
    location: IndexLocation,
    old: Vec<Option<Vec<u8>>>,
    changes: Changes,
    wrap: impl Fn(LocalStore) -> S,
) -> u64 {
    let spec = spec(location);
    let new = apply(&old, &changes);
    let as_state = |chunks: Vec<Option<Vec<u8>>>| if chunks.iter().all(Option::is_none) { None } else { Some(chunks) };
    let (old_state, new_state) = (as_state(old.clone()), as_state(new));
    let dir = TempDir::new("crash");
    let store = LocalStore::open(dir.path()).unwrap();
    for k in 0.. {
        setup(dir.path(), &spec, &old);
        let result = commit(&FaultyStore::crash_after(wrap(store.clone()), k), KEY, &spec, &changes);
        let recovered = recover(&store).unwrap();
        let state = read_shard(dir.path(), &spec);
        match result {
            Ok(_) => {
                assert_eq!(state, new_state, "completed commit must show the new state");
                assert!(recovered.is_empty(), "nothing to recover after a completed commit: {recovered:?}");
                assert!(std::fs::read_dir(dir.path().join("__shardfs/tmp")).map_or(true, |mut d| d.next().is_none()));
                return k;
            }
            Err(CommitError::Store(shardfs::store::Error::Crashed(_))) => assert!(
                state == old_state || state == new_state,
                "after a crash at byte {k} and recovery the shard is neither old nor new: {state:?}"
            ),
            Err(e) => panic!("unexpected error at byte {k}: {e}"),
        }
    }
    unreachable!()
}

fn old_chunks() -> Vec<Option<Vec<u8>>> {
    (0..8).map(|i| (i % 3 != 0).then(|| chunk(1, i, 5 + i as usize))).collect()
}

#[test]
fn torn_appends_roll_back() {
    let changes: Changes =
        BTreeMap::from([(1, Some(chunk(2, 1, 9).into())), (3, None), (6, Some(chunk(2, 6, 4).into()))]);
    let steps = crash_at_every_byte(IndexLocation::End, old_chunks(), changes);
    assert!(steps > 150, "the commit wrote only {steps} bytes: the loop did not cover it");
}

#[test]
fn stores_that_cannot_append_rewrite_whole_shards_atomically() {
    let changes: Changes =
        BTreeMap::from([(1, Some(chunk(2, 1, 9).into())), (3, None), (6, Some(chunk(2, 6, 4).into()))]);
    crash_at_every_byte_of(IndexLocation::End, old_chunks(), changes.clone(), Hooked::no_append);
    let dir = TempDir::new("no-append");
    let spec = spec(IndexLocation::End);
    setup(dir.path(), &spec, &old_chunks());
    let store = Hooked::no_append(LocalStore::open(dir.path()).unwrap());
    let before = store.attr(KEY).unwrap().stamp;
    let committed = commit(&store, KEY, &spec, &changes).unwrap();
    assert_eq!(committed.outcome, Outcome::Rewritten);
    // The version the commit names is the one an open finds: the mount rebinds the files of the
    // chunks it did not change to it.
    assert_eq!(committed.replaced, Some((before, store.open(KEY).unwrap().attr().stamp)));
    let unused = std::fs::metadata(dir.path().join(KEY)).unwrap().len()
        - apply(&old_chunks(), &changes).iter().flatten().map(|c| c.len() as u64).sum::<u64>()
        - spec.encoded_len();
    assert_eq!(unused, 0, "a rewritten shard holds no unused bytes");
}

#[test]
fn a_shard_replaced_by_another_program_before_the_append_is_read_again() {
    let dir = TempDir::new("meddled");
    let spec = spec(IndexLocation::End);
    setup(dir.path(), &spec, &old_chunks());
    // Another program writes a whole other shard at the key, after the commit read the index.
    let theirs: Vec<Option<Vec<u8>>> = (0..8).map(|i| Some(chunk(9, i, 30))).collect();
    let replacement = dir.path().join("theirs");
    std::fs::write(&replacement, assemble_shard(&spec, &theirs)).unwrap();
    let target = dir.path().join(KEY);
    let meddle = move || std::fs::rename(&replacement, &target).unwrap();
    let store = Hooked::new(LocalStore::open(dir.path()).unwrap()).before_writing(KEY, meddle);
    let changes: Changes = BTreeMap::from([(1, Some(chunk(5, 1, 3).into()))]);
    commit(&store, KEY, &spec, &changes).unwrap();
    assert_eq!(read_shard(dir.path(), &spec), Some(apply(&theirs, &changes)), "their shard, with our change on top");
}

#[test]
fn torn_rewrites_of_index_at_start_shards_roll_back() {
    let changes: Changes = BTreeMap::from([(0, Some(chunk(3, 0, 7).into())), (2, None)]);
    crash_at_every_byte(IndexLocation::Start, old_chunks(), changes);
}

#[test]
fn torn_creation_leaves_no_shard() {
    let changes: Changes = BTreeMap::from([(4, Some(chunk(4, 4, 6).into()))]);
    crash_at_every_byte(IndexLocation::End, vec![None; 8], changes);
}

#[test]
fn emptying_a_shard_deletes_it() {
    let changes: Changes = (0..8).map(|i| (i, None)).collect();
    crash_at_every_byte(IndexLocation::End, old_chunks(), changes);
    let dir = TempDir::new("delete");
    let store = LocalStore::open(dir.path()).unwrap();
    setup(dir.path(), &spec(IndexLocation::End), &old_chunks());
    let changes: Changes = (0..8).map(|i| (i, None)).collect();
    let committed = commit(&store, KEY, &spec(IndexLocation::End), &changes).unwrap();
    assert_eq!((committed.outcome, committed.replaced), (Outcome::Deleted, None));
    assert!(!dir.path().join(KEY).exists());
}

#[test]
fn appends_leave_old_bytes_as_unused_space() {
    let dir = TempDir::new("append");
    let store = LocalStore::open(dir.path()).unwrap();
    let spec = spec(IndexLocation::End);
    setup(dir.path(), &spec, &old_chunks());
    let before = std::fs::metadata(dir.path().join(KEY)).unwrap().len();
    let changes: Changes = BTreeMap::from([(1, Some(chunk(5, 1, 3).into()))]);
    let stamp = store.attr(KEY).unwrap().stamp;
    let committed = commit(&store, KEY, &spec, &changes).unwrap();
    assert_eq!(committed.outcome, Outcome::Appended { old_len: before, new_len: before + 3 + spec.encoded_len() });
    assert_eq!(committed.replaced, Some((stamp, store.open(KEY).unwrap().attr().stamp)));
    assert_eq!(read_shard(dir.path(), &spec), Some(apply(&old_chunks(), &changes)));
}

#[test]
fn a_damaged_shard_is_not_written_over() {
    let dir = TempDir::new("damaged");
    let store = LocalStore::open(dir.path()).unwrap();
    let spec = spec(IndexLocation::End);
    setup(dir.path(), &spec, &old_chunks());
    let file = std::fs::OpenOptions::new().write(true).open(dir.path().join(KEY)).unwrap();
    let len = file.metadata().unwrap().len();
    file.write_all_at(&[0xee], len - 7).unwrap();
    let before = std::fs::read(dir.path().join(KEY)).unwrap();
    let changes: Changes = BTreeMap::from([(0, Some(vec![1, 2, 3].into()))]);
    let err = commit(&store, KEY, &spec, &changes).unwrap_err();
    assert!(matches!(err, CommitError::Damaged(ref m) if m.contains("checksum")), "{err}");
    assert_eq!(std::fs::read(dir.path().join(KEY)).unwrap(), before);
}

#[test]
fn concurrent_committers_lose_nothing() {
    let dir = TempDir::new("concurrent");
    let store = LocalStore::open(dir.path()).unwrap();
    let spec = IndexSpec { entries: 64, endian: Endian::Little, checksum: true, location: IndexLocation::End };
    std::fs::create_dir_all(dir.path().join("arr/c")).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..8u64 {
                    let entry = t * 8 + i;
                    let changes: Changes =
                        BTreeMap::from([(entry, Some(chunk(t as u8, entry, 3 + i as usize).into()))]);
                    commit(store, KEY, &spec, &changes).unwrap();
                }
            });
        }
    });
    let chunks = read_shard(dir.path(), &spec).unwrap();
    for (entry, got) in chunks.into_iter().enumerate() {
        let (t, i) = (entry as u64 / 8, entry as u64 % 8);
        assert_eq!(got, Some(chunk(t as u8, entry as u64, 3 + i as usize)), "entry {entry}");
    }
}

#[test]
fn recovery_keeps_a_complete_append_whose_record_survived() {
    let dir = TempDir::new("keep");
    let store = LocalStore::open(dir.path()).unwrap();
    let spec = spec(IndexLocation::End);
    let changes: Changes = BTreeMap::from([(2, Some(chunk(6, 2, 4).into()))]);
    setup(dir.path(), &spec, &old_chunks());
    commit(&store, KEY, &spec, &changes).unwrap();
    let complete = std::fs::read(dir.path().join(KEY)).unwrap();
    for k in 0.. {
        setup(dir.path(), &spec, &old_chunks());
        let crashed = commit(&FaultyStore::crash_after(store.clone(), k), KEY, &spec, &changes).is_err();
        assert!(crashed, "no crash point fell between the append and the end of the commit");
        if std::fs::read(dir.path().join(KEY)).unwrap() == complete {
            // Stopped after the append, before its record was dropped: recovery keeps it.
            assert_eq!(recover(&store).unwrap(), vec![Recovery::Kept(KEY.to_string())]);
            assert_eq!(read_shard(dir.path(), &spec), Some(apply(&old_chunks(), &changes)));
            return;
        }
        recover(&store).unwrap();
    }
}
