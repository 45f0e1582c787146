//! Revalidating many keys with one request. The watcher asks every pass (each second) for the
//! current version of every file and directory the kernel holds answers from: a zarr.json, the
//! shards behind chunk files, the directories above them. Answers about to run out are renewed
//! too (`MetadataCache::due`), so that a reader's lookups between passes find them trusted. Asked one by one, that is a LIST per
//! directory each pass. Instead, one LIST without a delimiter below the directory all of them
//! share returns every object there, from which the HEAD of every file and the listing of every
//! directory below follow, exactly as a LIST of each would give them. Past one page of objects
//! ([`LARGEST`]) the keys are asked for one by one as before, and that directory is not listed
//! whole again for a while. The first listing of a directory is made the same way: the lookups
//! that follow, of the directories below, are then answered without a round trip each.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;

use super::metadata::{Head, Listing};
use super::{BucketStore, head_of};
use crate::store::{Kind, file_name, parent_key};

/// The most objects one listing below a directory may return to stand for the listings of
/// every directory there (one ListObjectsV2 page).
const LARGEST: usize = 1000;
/// A directory found to hold more is not listed whole again for this long.
const TOO_LARGE_FOR: Duration = Duration::from_secs(60);

impl BucketStore {
    /// Makes the HEADs and listings of `keys` current with one listing below the directory they
    /// share, when that is small enough; else leaves them to be asked for one by one.
    pub(super) fn revalidate(&self, keys: &[&str]) {
        let metadata = &self.0.metadata;
        let stale: Vec<&str> = keys.iter().copied().filter(|k| metadata.due(k)).collect();
        if let Some(dir) = shared_dir(&stale) {
            self.list_below(dir);
        }
    }

    /// Remembers the listing of `dir` and of every directory below it, and the HEAD of every
    /// object there, from one listing without a delimiter, when it holds at most [`LARGEST`]
    /// objects; else nothing.
    pub(super) fn list_below(&self, dir: String) {
        if !self.0.service.abilities.list {
            return;
        }
        let metadata = &self.0.metadata;
        let mut too_large = self.0.too_large.lock();
        too_large.retain(|_, since: &mut Instant| since.elapsed() < TOO_LARGE_FOR);
        if too_large.contains_key(&dir) {
            return;
        }
        drop(too_large);
        let epoch = metadata.epoch();
        let prefix = (!dir.is_empty() || !self.0.prefix.is_empty()).then(|| self.path(&dir));
        let objects = self.block_on(async {
            let listed = self.0.objects.list(prefix.as_ref()).take(LARGEST + 1).collect::<Vec<_>>();
            tokio::time::timeout(Duration::from_secs(10), listed).await
        });
        let Ok(objects) = objects else { return };
        let Ok(objects) = objects.into_iter().collect::<object_store::Result<Vec<_>>>() else { return };
        if objects.len() > LARGEST {
            self.0.too_large.lock().insert(dir, Instant::now());
            return;
        }
        let root = self.path("");
        let mut files = Vec::new();
        for meta in &objects {
            let key = match meta.location.prefix_match(&root) {
                Some(parts) => parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"),
                None => return,
            };
            files.push((key, head_of(meta)));
        }
        let made = self.0.made_dirs.lock().clone();
        // Every key's parent is listed now: a key neither shown as a file nor as a directory in
        // its parent's listing is no more.
        let Some(listings) = listings_below(&dir, &files, &made) else { return };
        if !listings.contains_key(&dir) {
            // Nothing below it, and not made here: no such directory.
            metadata.remember_listing(&dir, None, Vec::new(), epoch);
        }
        for (dir, (entries, objects, modified)) in listings {
            metadata.remember_listing(&dir, Some(Arc::new(Listing::new(entries, modified))), objects, epoch);
        }
    }
}

/// The directory every one of `keys` lies below (their parents' longest shared path), when there
/// are keys.
fn shared_dir(keys: &[&str]) -> Option<String> {
    let mut parts: Option<Vec<&str>> = None;
    for key in keys {
        let parent: Vec<&str> = parent_key(key).split('/').filter(|p| !p.is_empty()).collect();
        parts = Some(match parts {
            None => parent,
            Some(shared) => shared.iter().zip(&parent).take_while(|(a, b)| a == b).map(|(a, _)| *a).collect(),
        });
    }
    parts.map(|p| p.join("/"))
}

/// The entries, HEADs and newest modification of every directory at or below `dir` as listings
/// with a delimiter would give them, from the keys and HEADs of every object below `dir`;
/// directories made here and still empty included. `None` when a name is both a file and a
/// directory there, which listings with a delimiter show otherwise.
#[allow(clippy::type_complexity)]
fn listings_below(
    dir: &str,
    files: &[(String, Head)],
    made: &BTreeSet<String>,
) -> Option<BTreeMap<String, (Vec<(String, Kind)>, Vec<(String, Head)>, SystemTime)>> {
    let mut listings: BTreeMap<String, (Vec<(String, Kind)>, Vec<(String, Head)>, SystemTime)> = BTreeMap::new();
    let mut empty = || (Vec::new(), Vec::new(), SystemTime::UNIX_EPOCH);
    listings.entry(dir.to_string()).or_insert_with(&mut empty);
    let mut kinds: HashMap<String, Kind> = HashMap::new();
    let below = |key: &str| dir.is_empty() || key.starts_with(&format!("{dir}/"));
    for (key, head) in files {
        if !below(key) || file_name(key).is_empty() {
            return None;
        }
        let mut child = key.as_str();
        let mut kind = Kind::File;
        loop {
            let parent = parent_key(child);
            if kinds.insert(child.to_string(), kind).is_some_and(|was| was != kind) {
                return None;
            }
            let listing = listings.entry(parent.to_string()).or_insert_with(&mut empty);
            listing.0.push((file_name(child).to_string(), kind));
            if kind == Kind::File {
                listing.1.push((file_name(child).to_string(), head.clone()));
                listing.2 = listing.2.max(head.modified);
            }
            if parent == dir {
                break;
            }
            child = parent;
            kind = Kind::Dir;
        }
    }
    for made_dir in made.iter().filter(|d| below(d)) {
        if kinds.get(made_dir.as_str()).is_some_and(|k| *k == Kind::File) {
            return None;
        }
        listings.entry(made_dir.clone()).or_insert_with(&mut empty);
        listings
            .entry(parent_key(made_dir).to_string())
            .or_insert_with(&mut empty)
            .0
            .push((file_name(made_dir).to_string(), Kind::Dir));
    }
    // A directory no object is below and that was not made here is no directory: as a listing
    // would say, `dir` itself included.
    listings.retain(|d, listing| !listing.0.is_empty() || made.contains(d) || d.is_empty());
    Some(listings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(size: u64) -> Head {
        Head { size, e_tag: Some(format!("\"{size}\"")), version: None, modified: SystemTime::UNIX_EPOCH }
    }

    #[test]
    fn the_shared_directory_is_that_of_the_keys_parents() {
        assert_eq!(shared_dir(&["a/b/zarr.json", "a/b/c/0", "a/b/c"]).as_deref(), Some("a/b"));
        assert_eq!(shared_dir(&["a/zarr.json", "b/zarr.json"]).as_deref(), Some(""));
        assert_eq!(shared_dir(&["a"]).as_deref(), Some(""));
        assert_eq!(shared_dir(&[]), None);
    }

    #[test]
    fn listings_follow_from_the_objects_below() {
        let files = vec![("a/zarr.json".into(), head(1)), ("a/c/0".into(), head(2)), ("a/c/1".into(), head(3))];
        let made = BTreeSet::from(["a/empty".to_string()]);
        let listings = listings_below("", &files, &made).unwrap();
        let names = |d: &str| {
            let mut e: Vec<(String, Kind)> = listings[d].0.clone();
            e.sort_by(|x, y| x.0.cmp(&y.0));
            e.dedup();
            e
        };
        assert_eq!(names(""), [("a".to_string(), Kind::Dir)]);
        assert_eq!(
            names("a"),
            [("c".to_string(), Kind::Dir), ("empty".to_string(), Kind::Dir), ("zarr.json".to_string(), Kind::File)]
        );
        assert_eq!(names("a/c"), [("0".to_string(), Kind::File), ("1".to_string(), Kind::File)]);
        assert!(names("a/empty").is_empty());
        assert_eq!(listings["a/c"].1.len(), 2);
        let file_and_dir = vec![("a/x".into(), head(1)), ("a/x/y".into(), head(2))];
        assert!(listings_below("", &file_and_dir, &BTreeSet::new()).is_none());
    }
}
