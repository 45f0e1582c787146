//! A database file this process locks, whose keys the file keeps in no order it can seek (GNU
//! dbm's hash, Kyoto Cabinet's hash and tree files as their C APIs give them; Berkeley DB's hash
//! and btree files, served alike): the store of [`super::gdbm`], [`super::kyoto`] and
//! [`super::bdb`], each of which supplies a [`LockedFile`].
//!
//! The lock (one writer, or only readers; the library's, or for Berkeley DB the mount's own
//! `flock`) means nothing else changes the file while it is
//! mounted: a writable mount is its writer, a read-only mount one of its readers. Versions are
//! then this mount's own ([`Versions`]). The keys are read once at open into an ordered index
//! (kept up to date by this mount's writes). Where the file's own structures say where each value
//! lies ([`Places`]: GNU dbm's buckets), checked against the library's keys at open, every size is
//! known at once and a read of a value no write of this mount has touched takes only the bytes
//! asked for, with `pread`. Otherwise each value's size is learnt when first needed: from the
//! library where it tells a size without the value (Berkeley DB), else by reading the value,
//! which these libraries give only whole; and a read reads the whole value, as the library
//! allocated it (no copy), and gives the range asked for. The values last read or served are
//! kept ([`Recent`]), for the reads that follow each (a file
//! looked up, then read in pieces, while the next files are fetched ahead), which would
//! otherwise each read it whole again. One lock covers the file and the index, as a handle of these libraries is not
//! for two threads at once.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;

use super::buffers::Buffer;
use super::recent::Recent;
use super::sole::{Registered, Versions};
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

/// What a file tells of a value asked for its size.
pub enum Measured {
    /// The size alone, where the library gives it without reading the value.
    Size(u64),
    /// The value itself, read whole to learn its size.
    Value(Bytes),
}

/// Where the values of a file lie in it, read from the file's own structures: each key's value,
/// as a range of the file's bytes.
pub type Places = HashMap<Vec<u8>, Range<u64>>;

/// An open, locked database file, as a C library gives it.
pub trait LockedFile: Send + 'static {
    /// The value at `key`, if there is one.
    fn fetch(&mut self, key: &[u8]) -> std::result::Result<Option<Bytes>, String>;
    /// The size of the value at `key`, if there is one: by default its value, read whole.
    fn measure(&mut self, key: &[u8]) -> std::result::Result<Option<Measured>, String> {
        Ok(self.fetch(key)?.map(Measured::Value))
    }
    /// Stores `value` at `key`, on disk before it returns.
    fn store(&mut self, key: &[u8], value: &[u8]) -> std::result::Result<(), String>;
    /// Removes `key`, on disk before it returns; nothing there is no error.
    fn delete(&mut self, key: &[u8]) -> std::result::Result<(), String>;
    /// Every key, in whatever order the file keeps.
    fn keys(&mut self) -> std::result::Result<Vec<Vec<u8>>, String>;
    /// Where each value lies in the file, where its structures tell (GNU dbm's buckets); `None`:
    /// values are read through [`Self::fetch`] alone.
    fn places(&mut self) -> Option<Places> {
        None
    }
    /// Fills `buf` with the bytes of the value [`Self::places`] placed at `place`, from its byte
    /// `from` on: by default the file's bytes at `place.start + from`. `InvalidData`: the file's
    /// structures do not hold the value where its place said, and it is read through
    /// [`Self::fetch`] instead.
    fn read_placed(&mut self, place: &Range<u64>, from: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let _ = (place, from, buf);
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// The database of a [`LockedFile`].
pub struct KeyedFile<F> {
    /// What the database is called in errors (`GNU dbm`).
    store: &'static str,
    name: String,
    read_only: bool,
    state: Mutex<State<F>>,
    /// Last: given up once the file is closed.
    _registered: Registered,
}

impl<F> std::fmt::Debug for KeyedFile<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.store).field("name", &self.name).finish()
    }
}

struct State<F> {
    file: F,
    /// Every key, with its value's size once known.
    keys: BTreeMap<String, Option<u64>>,
    versions: Versions,
    /// The values last read.
    last: Recent,
    /// Where the values no write of this mount has touched lie in the file: read there, a value
    /// is read only as far as asked, and never copied whole.
    places: HashMap<String, Range<u64>>,
}

impl<F: LockedFile> State<F> {
    /// The size of the value at `key`, read once and then remembered.
    fn size(&mut self, key: &str) -> std::result::Result<Option<u64>, String> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(Some(size)) => Ok(Some(*size)),
            Some(None) => {
                let size = match self.file.measure(key.as_bytes())? {
                    None => {
                        self.keys.remove(key);
                        return Ok(None);
                    }
                    Some(Measured::Size(size)) => size,
                    Some(Measured::Value(value)) => {
                        let size = value.len() as u64;
                        self.last.keep(key, value);
                        size
                    }
                };
                self.keys.insert(key.to_string(), Some(size));
                Ok(Some(size))
            }
        }
    }

    fn entry(&mut self, key: &str) -> std::result::Result<Option<Entry>, String> {
        Ok(self.size(key)?.map(|size| Entry { size, version: self.versions.of(key.as_bytes()) }))
    }

    /// The value at `key`: the one read last, or read now (and kept).
    fn value(&mut self, key: &str) -> std::result::Result<Option<Bytes>, String> {
        if let Some(value) = self.last.get(key) {
            return Ok(Some(value));
        }
        let Some(value) = self.file.fetch(key.as_bytes())? else {
            return Ok(None);
        };
        self.last.keep(key, value.clone());
        Ok(Some(value))
    }

    /// `key` is written or removed: a value kept for it is no longer its value, nor is its
    /// value where it was.
    fn changes(&mut self, key: &str) {
        self.last.forget(key);
        self.places.remove(key);
    }
}

impl<F: LockedFile> KeyedFile<F> {
    /// The database of the file at `path`, opened by `open` (a reader when `read_only`) once no
    /// other open of this process has it, its keys read now.
    pub fn open(
        store: &'static str,
        path: &Path,
        open: impl FnOnce() -> std::result::Result<F, String>,
        read_only: bool,
    ) -> std::result::Result<Self, String> {
        let name = path.display().to_string();
        let registered = Registered::open(path, &name)?;
        let mut file = open()?;
        let listed = file.keys().map_err(|e| format!("{name}: {e}"))?;
        let places = match file.places() {
            Some(found) if agrees(&found, &listed) => found,
            Some(_) => {
                log::warn!(
                    "{name}: its buckets name other keys than its library lists; values read through the library"
                );
                HashMap::new()
            }
            None => HashMap::new(),
        };
        let places: HashMap<String, Range<u64>> =
            places.into_iter().filter_map(|(key, place)| Some((String::from_utf8(key).ok()?, place))).collect();
        let mut keys = BTreeMap::new();
        for key in listed {
            match String::from_utf8(key) {
                Ok(key) => {
                    let size = places.get(&key).map(|place| place.end - place.start);
                    keys.insert(key, size);
                }
                Err(e) => log::warn!("{name}: a key that is not UTF-8 left out: {:?}", e.as_bytes()),
            }
        }
        let state = State { file, keys, versions: Versions::new(path), last: Recent::default(), places };
        Ok(KeyedFile { store, name, read_only, state: Mutex::new(state), _registered: registered })
    }

    /// How many values are read where the file places them.
    #[cfg(test)]
    pub fn placed(&self) -> usize {
        self.state.lock().places.len()
    }

    /// True when opened as a reader.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(self.store, format!("{}: {what}", self.name))
    }
    /// The keys under `prefix` with their entries; with `dirs`, the names of the directories
    /// directly under it too, whose keys are skipped.
    fn listed(&self, prefix: &str, dirs: Option<&mut Vec<String>>) -> Result<Vec<(String, Entry)>> {
        let mut state = self.state.lock();
        let mut names = Vec::new();
        let mut from = prefix.to_string();
        let mut dirs = dirs;
        while let Some(key) = state.keys.range(from.clone()..).next().map(|(k, _)| k.clone()) {
            let Some(name) = key.strip_prefix(prefix) else { break };
            match (name.split_once('/'), dirs.as_deref_mut()) {
                (Some((sub, _)), Some(dirs)) => {
                    if !sub.is_empty() {
                        dirs.push(sub.to_string());
                    }
                    // On past every key of the subdirectory: '0' follows '/'.
                    from = format!("{prefix}{sub}0");
                    continue;
                }
                _ if !name.is_empty() => names.push(key.clone()),
                _ => {}
            }
            from = format!("{key}\0");
        }
        let mut found = Vec::with_capacity(names.len());
        for key in names {
            if let Some(entry) = state.entry(&key).map_err(|e| self.fail(format!("{key}: {e}")))? {
                found.push((key, entry));
            }
        }
        Ok(found)
    }
}

/// True when `places` names exactly the keys the library `listed`, each once.
fn agrees(places: &Places, listed: &[Vec<u8>]) -> bool {
    places.len() == listed.len() && listed.iter().all(|key| places.contains_key(key))
}

impl<F: LockedFile> Database for KeyedFile<F> {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // These files keep no time of a value's writing: the Unix epoch, the same for every
        // version.
        DateTime::UNIX_EPOCH
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        self.state.lock().entry(key).map_err(|e| self.fail(format!("{key}: {e}")))
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        let mut state = self.state.lock();
        if !state.keys.contains_key(key) {
            return Ok(None);
        }
        // Read where the file places it, only as far as asked; the state's lock is held
        // meanwhile, so that no write of the key frees those bytes under the read.
        if let Some(place) = state.places.get(key).cloned() {
            let entry = Entry { size: place.end - place.start, version: state.versions.of(key.as_bytes()) };
            admit(&entry)?;
            let range = resolve(self.store, range, entry.size)?;
            let mut bytes = Buffer::of((range.end - range.start) as usize);
            match state.file.read_placed(&place, range.start, &mut bytes) {
                Ok(()) => return Ok(Some((entry, range, bytes.into_bytes()))),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    log::debug!("{}: {key}: read through the library: {e}", self.name);
                    state.places.remove(key);
                }
                Err(e) => return Err(self.fail(format!("{key}: {e}"))),
            }
        }
        let Some(value) = state.value(key).map_err(|e| self.fail(format!("{key}: {e}")))? else {
            return Ok(None);
        };
        state.keys.insert(key.to_string(), Some(value.len() as u64));
        let entry = Entry { size: value.len() as u64, version: state.versions.of(key.as_bytes()) };
        admit(&entry)?;
        let range = resolve(self.store, range, entry.size)?;
        Ok(Some((entry, range.clone(), Recent::piece(&value, range.start as usize..range.end as usize))))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let mut state = self.state.lock();
        let found = state.entry(key).map_err(|e| self.fail(format!("{key}: {e}")))?;
        match (condition, found) {
            (Condition::Absent, Some(_)) => {
                let source = format!("{key} exists").into();
                return Err(object_store::Error::AlreadyExists { path: key.to_string(), source });
            }
            (Condition::At(version), found) if found.as_ref().map(|e| &e.version) != Some(version) => {
                return Err(changed(key, format!("not at {version}")));
            }
            _ => {}
        }
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        state.changes(key);
        state.file.store(key.as_bytes(), &bytes).map_err(|e| self.fail(format!("{key}: {e}")))?;
        state.keys.insert(key.to_string(), Some(bytes.len() as u64));
        Ok(Entry { size: bytes.len() as u64, version: state.versions.wrote(key.as_bytes()) })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut state = self.state.lock();
        state.changes(key);
        state.file.delete(key.as_bytes()).map_err(|e| self.fail(format!("{key}: {e}")))?;
        state.keys.remove(key);
        state.versions.wrote(key.as_bytes());
        Ok(())
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let mut dirs = Vec::new();
        let files = self.listed(dir, Some(&mut dirs))?;
        Ok(Listing { files, dirs })
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        self.listed(prefix, None)
    }

    /// Where the file's own structures place the values, read-only: each is then read with
    /// `pread`, only as far as asked. A writable mount's values lose their places as it writes
    /// them, and are then read whole through the library: those are better read ahead, as a
    /// 128 KiB read of one that was let go of reads it whole again.
    fn reads_in_place(&self) -> bool {
        self.read_only && !self.state.lock().places.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A file in memory that counts the values it gives; with `sizes`, it tells a value's size
    /// without giving the value, as Berkeley DB does.
    struct Counting {
        values: HashMap<Vec<u8>, Vec<u8>>,
        fetches: Arc<AtomicUsize>,
        sizes: bool,
    }

    impl LockedFile for Counting {
        fn fetch(&mut self, key: &[u8]) -> std::result::Result<Option<Bytes>, String> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            Ok(self.values.get(key).cloned().map(Bytes::from))
        }
        fn measure(&mut self, key: &[u8]) -> std::result::Result<Option<Measured>, String> {
            match self.sizes {
                true => Ok(self.values.get(key).map(|v| Measured::Size(v.len() as u64))),
                false => Ok(self.fetch(key)?.map(Measured::Value)),
            }
        }
        fn store(&mut self, key: &[u8], value: &[u8]) -> std::result::Result<(), String> {
            self.values.insert(key.to_vec(), value.to_vec());
            Ok(())
        }
        fn delete(&mut self, key: &[u8]) -> std::result::Result<(), String> {
            self.values.remove(key);
            Ok(())
        }
        fn keys(&mut self) -> std::result::Result<Vec<Vec<u8>>, String> {
            Ok(self.values.keys().cloned().collect())
        }
    }

    /// A file removed when dropped.
    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn opened(label: &str, values: &[(&str, Vec<u8>)]) -> (Removed, KeyedFile<Counting>, Arc<AtomicUsize>) {
        opened_sizing(label, values, false)
    }

    fn opened_sizing(
        label: &str,
        values: &[(&str, Vec<u8>)],
        sizes: bool,
    ) -> (Removed, KeyedFile<Counting>, Arc<AtomicUsize>) {
        let path = std::env::temp_dir().join(format!("shardfs-keyed-{label}-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let removed = Removed(path.clone());
        let fetches = Arc::new(AtomicUsize::new(0));
        let values = values.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.clone())).collect();
        let file = Counting { values, fetches: fetches.clone(), sizes };
        let db = KeyedFile::open("test", &path, || Ok(file), false).unwrap();
        (removed, db, fetches)
    }

    fn piece(db: &KeyedFile<Counting>, key: &str, range: Range<u64>) -> Bytes {
        let range = GetRange::Bounded(range);
        db.read(key, Some(&range), &|_| Ok(())).unwrap().unwrap().2
    }

    #[test]
    fn a_value_looked_up_then_read_in_pieces_is_read_from_the_file_once() {
        let value: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
        let (_file, db, fetches) = opened("pieces", &[("a/c/0", value.clone()), ("a/c/1", vec![7; 10])]);
        assert_eq!(db.entry("a/c/0").unwrap().unwrap().size, 1 << 20);
        for at in (0..1u64 << 20).step_by(128 << 10) {
            assert_eq!(piece(&db, "a/c/0", at..at + (128 << 10)), value[at as usize..][..128 << 10]);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_value_written_or_removed_is_not_served_from_the_one_kept() {
        let (_file, db, _) = opened("changed", &[("k", vec![1; 100])]);
        assert_eq!(piece(&db, "k", 0..10), vec![1; 10]);
        db.write("k", &PutPayload::from(vec![2u8; 50]), &Condition::Any).unwrap();
        assert_eq!(piece(&db, "k", 0..10), vec![2; 10]);
        db.delete("k").unwrap();
        assert!(db.read("k", None, &|_| Ok(())).unwrap().is_none());
    }

    #[test]
    fn a_listing_of_a_file_that_tells_sizes_reads_no_value_and_a_read_reads_its_value_once() {
        let values: Vec<(&str, Vec<u8>)> =
            (0..4).map(|i| (["a/0", "a/1", "a/2", "a/3"][i], vec![i as u8; 1000 * (i + 1)])).collect();
        let (_file, db, fetches) = opened_sizing("sizes", &values, true);
        let listed = db.list_all("a/").unwrap();
        assert_eq!(listed.iter().map(|(_, e)| e.size).collect::<Vec<_>>(), [1000, 2000, 3000, 4000]);
        assert_eq!(fetches.load(Ordering::SeqCst), 0, "a listing read values");
        for (key, value) in &values {
            assert_eq!(piece(&db, key, 0..1000), value[..1000]);
            assert_eq!(piece(&db, key, 500..1000), value[500..1000]);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 4);
        // Without sizes from the library, a listing reads each value, and the last is kept.
        let (_other, db, fetches) = opened_sizing("values", &values, false);
        db.list_all("a/").unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 4);
        assert_eq!(piece(&db, "a/3", 0..10), values[3].1[..10]);
        assert_eq!(fetches.load(Ordering::SeqCst), 4);
    }

    /// Reads the first `read` of `chunks` chunk files of `size` bytes (a Zarr v2 array, chunk `i`
    /// all bytes `i`) in order through a mount of a file that tells no size without the value (GNU
    /// dbm, Kyoto Cabinet), `piece` bytes at a time (the kernel's pieces): the values the file
    /// gave meanwhile.
    fn values_read_in_order(label: &str, chunks: usize, size: usize, read: usize, piece: u32) -> usize {
        let mut owned =
            vec![("a/.zarray".to_string(), format!(r#"{{"shape": [{chunks}], "chunks": [1]}}"#).into_bytes())];
        owned.extend((0..chunks).map(|i| (format!("a/{i}"), vec![i as u8; size])));
        let values: Vec<(&str, Vec<u8>)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let (_file, db, fetches) = opened(label, &values);
        let store = super::super::Objects::mount(db, "test", "test://review4", true, Default::default()).unwrap();
        let cache = crate::view::index_cache::IndexCache::new(1 << 20);
        let fs = crate::mount::filesystem(std::sync::Arc::new(store), cache, None).unwrap();
        let lookup = |path: &str| {
            let mut ino = crate::fs::ROOT_INO;
            for name in path.split('/') {
                ino = fs.lookup(ino, name).unwrap().0;
            }
            ino
        };
        lookup("a/0");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let before = fetches.load(Ordering::SeqCst);
        for i in 0..read {
            let fh = fs.open(lookup(&format!("a/{i}")), crate::fs::OpenMode::default()).unwrap();
            let mut got = Vec::new();
            loop {
                let piece = fs.read(fh, got.len() as u64, piece).unwrap();
                if piece.is_empty() {
                    break;
                }
                got.extend(piece);
            }
            assert!(got == vec![i as u8; size], "chunk {i}");
            fs.release(fh);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        let gave = fetches.load(Ordering::SeqCst) - before;
        // The file registered by inode until the store's last clone (a prefetch's) goes: kept
        // until then, so that no other test's file gets its inode meanwhile.
        drop(fs);
        std::thread::sleep(std::time::Duration::from_millis(500));
        gave
    }

    /// review4: 200 chunk files of 100 KiB read in order: each value read from the file once,
    /// whatever is fetched ahead (up to 32 chunk files) beside the one the reader is in (40
    /// values kept, 128 MiB).
    #[test]
    fn review4_chunks_read_in_order_with_files_fetched_ahead_are_each_read_from_the_file_once() {
        let read = values_read_in_order("review4-ahead", 200, 100 << 10, 40, 32 << 10);
        // Each once: the 40 read and up to 32 fetched ahead of the last.
        assert!(read <= 72, "{read} values read from the file for 40 chunks read in order");
    }

    /// review4: 10 chunk files of 10 MiB (more than the fetcher reads whole at once, so each in
    /// more than one GET) read in order: each value read from the file once, the whole array
    /// being within the values kept (with 4 kept, as at 7cf8329, most were read twice). Beyond
    /// 128 MiB of them, some may be read again, as timing has it.
    #[test]
    fn review4_large_chunks_read_in_order_with_files_fetched_ahead_are_each_read_from_the_file_once() {
        let read = values_read_in_order("review4-ahead-large", 10, 10 << 20, 8, 128 << 10);
        assert!(read <= 10, "{read} values read from the file for 8 chunks read in order");
    }
}
