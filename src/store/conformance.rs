//! The checks every [`Store`] implementation passes, run by each implementation's tests on an
//! empty store: reading what was written (empty files too), versions that change with every write, conditional
//! whole-file writes, listings, renames, deletions, files taken whole, directories, in-place
//! writes where the store can append, and locks. A failed check panics with what differed.

use super::{Error, Kind, OpenHow, PutMode, Store, lock};

/// Runs every check on `store`, which must be empty (or at least have no `conformance/`).
pub fn check(store: &dyn Store) {
    missing_keys_are_not_found(store);
    whole_files_read_back_as_written(store);
    empty_files_are_kept(store);
    versions_change_with_every_write(store);
    conditional_writes_refuse_a_changed_key(store);
    listings_show_entries_and_change_version(store);
    renames_and_deletions(store);
    files_taken_whole(store);
    directories(store);
    if store.can_append() {
        files_written_in_place(store);
    }
    locks_can_be_taken_again_once_dropped(store);
}

fn missing_keys_are_not_found(store: &dyn Store) {
    assert!(matches!(store.attr("conformance/missing"), Err(Error::NotFound(_))));
    assert!(matches!(store.open("conformance/missing"), Err(Error::NotFound(_))));
    assert!(matches!(store.read("conformance/missing"), Err(Error::NotFound(_))));
    assert!(matches!(store.delete("conformance/missing"), Err(Error::NotFound(_))));
}

fn whole_files_read_back_as_written(store: &dyn Store) {
    let big = vec![7u8; super::GATHER + 5];
    store.put("conformance/a/b/file", &[b"head", &big, b"tail"], PutMode::Overwrite).unwrap();
    let whole = [&b"head"[..], &big, b"tail"].concat();
    assert_eq!(store.read("conformance/a/b/file").unwrap(), whole);
    let attr = store.attr("conformance/a/b/file").unwrap();
    assert_eq!((attr.kind, attr.size), (Kind::File, whole.len() as u64));
    let object = store.open("conformance/a/b/file").unwrap();
    assert_eq!(object.attr().stamp, attr.stamp);
    assert_eq!(object.read_exact_at(2, 4).unwrap(), b"ad\x07\x07");
    let mut tail = [0u8; 10];
    assert_eq!(object.read_at(&mut tail, whole.len() as u64 - 3).unwrap(), 3, "short only at the end");
    assert!(object.read_exact_at(whole.len() as u64 - 2, 4).is_err());
    assert_eq!(store.attr("conformance/a").unwrap().kind, Kind::Dir, "directories above were made");
}

/// An empty file is a file (`touch`): Kyoto Cabinet's library took an empty value's address, 1,
/// for "remove the record".
fn empty_files_are_kept(store: &dyn Store) {
    store.put("conformance/e/empty", &[], PutMode::Overwrite).unwrap();
    assert_eq!(store.read("conformance/e/empty").unwrap(), b"");
    assert_eq!(store.attr("conformance/e/empty").unwrap().size, 0);
    store.put("conformance/e/empty", &[b"", b""], PutMode::Overwrite).unwrap();
    assert_eq!(store.read("conformance/e/empty").unwrap(), b"");
}

fn versions_change_with_every_write(store: &dyn Store) {
    let named = store.put("conformance/v", &[b"one"], PutMode::Overwrite).unwrap();
    let first = store.attr("conformance/v").unwrap().stamp;
    // A mount takes the version a commit names for the one its readers find next.
    assert!(named.is_none_or(|named| named == first), "put named {named:?}, then attr found {first:?}");
    assert!(store.is_unchanged("conformance/v", &first));
    let named = store.put("conformance/v", &[b"two"], PutMode::Update(first)).unwrap();
    assert!(!store.is_unchanged("conformance/v", &first), "a rewrite of the same size is a new version");
    let second = store.open("conformance/v").unwrap().attr().stamp;
    assert_ne!(second, first);
    assert!(named.is_none_or(|named| named == second), "put named {named:?}, then open found {second:?}");
}

fn conditional_writes_refuse_a_changed_key(store: &dyn Store) {
    store.put("conformance/c", &[b"first"], PutMode::Create).unwrap();
    assert!(matches!(store.put("conformance/c", &[b"second"], PutMode::Create), Err(Error::Changed(_))));
    assert_eq!(store.read("conformance/c").unwrap(), b"first");
    let stamp = store.attr("conformance/c").unwrap().stamp;
    store.put("conformance/c", &[b"third"], PutMode::Update(stamp)).unwrap();
    assert!(matches!(store.put("conformance/c", &[b"fourth"], PutMode::Update(stamp)), Err(Error::Changed(_))));
    assert_eq!(store.read("conformance/c").unwrap(), b"third");
}

fn listings_show_entries_and_change_version(store: &dyn Store) {
    store.put("conformance/l/x", &[b"x"], PutMode::Overwrite).unwrap();
    store.make_dirs("conformance/l/sub").unwrap();
    let (mut entries, before) = store.list("conformance/l").unwrap();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(entries, [("sub".to_string(), Kind::Dir), ("x".to_string(), Kind::File)]);
    store.put("conformance/l/y", &[b"y"], PutMode::Overwrite).unwrap();
    let (entries, after) = store.list("conformance/l").unwrap();
    assert_eq!(entries.len(), 3);
    assert_ne!(before, after, "a new entry is a new version of the directory");
    assert!(matches!(store.list("conformance/l/none"), Err(Error::NotFound(_))));
}

fn renames_and_deletions(store: &dyn Store) {
    store.put("conformance/r/from", &[b"moved"], PutMode::Overwrite).unwrap();
    store.put("conformance/r/to", &[b"replaced"], PutMode::Overwrite).unwrap();
    store.rename("conformance/r/from", "conformance/r/to").unwrap();
    assert_eq!(store.read("conformance/r/to").unwrap(), b"moved");
    assert!(matches!(store.attr("conformance/r/from"), Err(Error::NotFound(_))));
    store.delete("conformance/r/to").unwrap();
    assert!(matches!(store.attr("conformance/r/to"), Err(Error::NotFound(_))));
    store.put("conformance/r/gone", &[b"x"], PutMode::Overwrite).unwrap();
    store.discard("conformance/r/gone").unwrap();
    assert!(matches!(store.attr("conformance/r/gone"), Err(Error::NotFound(_))));
}

fn files_taken_whole(store: &dyn Store) {
    store.put("conformance/t/put", &[b"put ", b"whole"], PutMode::Overwrite).unwrap();
    assert_eq!(store.take("conformance/t/put").unwrap(), b"put whole");
    assert!(matches!(store.attr("conformance/t/put"), Err(Error::NotFound(_))));
    // As an atomic writer leaves its temporary file: written in order through a handle, closed.
    let file = store.open_file("conformance/t/written", OpenHow { create: Some(0o644), truncate: false }).unwrap();
    file.write_at(b"written ", 0).unwrap();
    file.write_at(b"in order", 8).unwrap();
    drop(file);
    assert_eq!(store.take("conformance/t/written").unwrap(), b"written in order");
    assert!(matches!(store.attr("conformance/t/written"), Err(Error::NotFound(_))));
    assert!(matches!(store.take("conformance/t/written"), Err(Error::NotFound(_))));
}

fn directories(store: &dyn Store) {
    store.make_dirs("conformance/d").unwrap();
    store.make_dir("conformance/d/e", 0o755).unwrap();
    assert_eq!(store.attr("conformance/d/e").unwrap().kind, Kind::Dir);
    store.remove_dir("conformance/d/e").unwrap();
    assert!(matches!(store.attr("conformance/d/e"), Err(Error::NotFound(_))));
}

fn files_written_in_place(store: &dyn Store) {
    let created = OpenHow { create: Some(0o644), truncate: false };
    let file = store.open_file("conformance/f", created).unwrap();
    file.write_at(b"hello", 0).unwrap();
    file.append(b" world").unwrap();
    file.write_at(b"J", 0).unwrap();
    file.sync().unwrap();
    assert_eq!(store.read("conformance/f").unwrap(), b"Jello world");
    file.set_len(5).unwrap();
    assert_eq!(file.attr().unwrap().size, 5);
    let mut buf = [0u8; 8];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 5);
    let again = store.open_file("conformance/f", OpenHow { create: None, truncate: true }).unwrap();
    assert_eq!(again.attr().unwrap().size, 0);
    assert!(matches!(store.open_file("conformance/none", OpenHow::default()), Err(Error::NotFound(_))));
}

fn locks_can_be_taken_again_once_dropped(store: &dyn Store) {
    let slot = lock::slot("conformance/lock");
    drop(store.lock(slot).unwrap());
    drop(store.lock(slot).unwrap());
}
