//! Arrays the view shows as stored (Zarr v2 arrays, v3 arrays without sharding, arrays refused
//! as sharded): their chunk grid and chunk keys, read from their documents (`.zarray`,
//! `zarr.json`), so that a reader going through their chunk files in order has the next ones
//! fetched ahead ([`super::read_ahead`]). Which array a stored file is a chunk of is found from
//! its key: the directories above it whose names could be part of a chunk key, nearest first,
//! each looked up once and remembered (an array's by its document's version, a directory of no
//! array for [`NO_ARRAY_FOR`]).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;
use serde_json::Value;

use crate::format::chunk_key::{ChunkKeyEncoding, KeyStyle};
use crate::store::{Kind, Stamp, Store};

/// How long a directory found to hold no array document is taken to hold none.
const NO_ARRAY_FOR: Duration = Duration::from_secs(10);
/// Directories remembered.
const DIRS: usize = 4096;
/// Directories looked at above a file, at most: one more than the largest rank Zarr allows.
const MOST_LEVELS: usize = 33;

/// An array shown as stored, as far as its chunk files go.
#[derive(Debug, PartialEq, Eq)]
pub struct PlainArray {
    /// The array's directory, a store key.
    pub dir: Arc<str>,
    /// Chunks along each dimension.
    pub grid: Vec<u64>,
    keys: ChunkKeyEncoding,
}

impl PlainArray {
    /// The array a `.zarray` document describes.
    fn of_zarray(dir: &str, doc: &Value) -> Option<PlainArray> {
        let separator = match doc.get("dimension_separator").and_then(Value::as_str) {
            None | Some(".") => '.',
            Some("/") => '/',
            Some(_) => return None,
        };
        let keys = ChunkKeyEncoding { style: KeyStyle::V2, separator };
        PlainArray::of(dir, doc.get("shape")?, doc.get("chunks")?, keys)
    }

    /// The array a `zarr.json` document describes, if it describes one.
    fn of_zarr_json(dir: &str, doc: &Value) -> Option<PlainArray> {
        if doc.get("node_type")?.as_str()? != "array" {
            return None;
        }
        let grid = doc.get("chunk_grid")?;
        if grid.get("name")?.as_str()? != "regular" {
            return None;
        }
        let keys = ChunkKeyEncoding::from_json(doc.get("chunk_key_encoding")?).ok()?;
        PlainArray::of(dir, doc.get("shape")?, grid.get("configuration")?.get("chunk_shape")?, keys)
    }

    fn of(dir: &str, shape: &Value, chunks: &Value, keys: ChunkKeyEncoding) -> Option<PlainArray> {
        let numbers = |v: &Value| v.as_array()?.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>();
        let (shape, chunks) = (numbers(shape)?, numbers(chunks)?);
        if shape.len() != chunks.len() || chunks.contains(&0) {
            return None;
        }
        let grid = shape.iter().zip(&chunks).map(|(s, c)| s.div_ceil(*c)).collect();
        Some(PlainArray { dir: dir.into(), grid, keys })
    }

    /// The store key of the chunk file at `coords`.
    pub fn chunk_key(&self, coords: &[u64]) -> String {
        let key = self.keys.encode(coords);
        if self.dir.is_empty() { key } else { format!("{}/{key}", self.dir) }
    }

    /// The coordinates of the chunk whose file is at store key `key`, if it is one of this
    /// array's, inside its grid.
    fn coords(&self, key: &str) -> Option<Vec<u64>> {
        let rel = if self.dir.is_empty() { key } else { key.strip_prefix(&*self.dir)?.strip_prefix('/')? };
        let coords = self.keys.decode(rel, self.grid.len())?;
        coords.iter().zip(&self.grid).all(|(c, g)| c < g).then_some(coords)
    }
}

/// What a directory was found to hold.
enum Found {
    /// The array of the document at this key, at this version.
    Array(String, Stamp, Arc<PlainArray>),
    /// No array document (or one that describes no array shown as stored), as of then.
    Nothing(Instant),
}

/// The arrays shown as stored that readers of their chunk files went through, by directory.
pub struct PlainArrays {
    dirs: Mutex<LruCache<String, Found>>,
}

impl Default for PlainArrays {
    fn default() -> Self {
        PlainArrays { dirs: Mutex::new(LruCache::new(NonZeroUsize::new(DIRS).expect("non-zero"))) }
    }
}

impl std::fmt::Debug for PlainArrays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainArrays").field("dirs", &self.dirs.lock().len()).finish()
    }
}

impl PlainArrays {
    /// The array shown as stored whose chunk file is at store key `key`, and the chunk's
    /// coordinates; `None` when it is no such file (or cannot be told: a hint, not an answer).
    pub fn chunk_of(&self, store: &dyn Store, key: &str) -> Option<(Arc<PlainArray>, Vec<u64>)> {
        // An array known above the file whose keys spell it, still as it was: no look at the
        // directories in between (each chunk of a `c/<i>` row is in a directory of its own).
        if let Some((doc, stamp, array, coords)) = self.known_above(key)
            && store.is_unchanged(&doc, &stamp)
        {
            return Some((array, coords));
        }
        for dir in chunk_key_dirs(key) {
            if let Some(array) = self.array_at(store, dir) {
                return array.coords(key).map(|coords| (array, coords));
            }
        }
        None
    }

    /// The array remembered nearest above `key` whose chunk `key` is, with its document's key and
    /// version as last found.
    fn known_above(&self, key: &str) -> Option<(String, Stamp, Arc<PlainArray>, Vec<u64>)> {
        let mut dirs = self.dirs.lock();
        chunk_key_dirs(key).find_map(|dir| match dirs.get(dir) {
            Some(Found::Array(doc, stamp, array)) => {
                array.coords(key).map(|coords| (doc.clone(), *stamp, array.clone(), coords))
            }
            _ => None,
        })
    }

    /// The array shown as stored at directory `dir`, from what was found before while it holds.
    fn array_at(&self, store: &dyn Store, dir: &str) -> Option<Arc<PlainArray>> {
        // Copied out: the store is asked without the lock, which every open of a chunk file takes.
        let remembered = match self.dirs.lock().get(dir) {
            Some(Found::Nothing(at)) if at.elapsed() < NO_ARRAY_FOR => return None,
            Some(Found::Array(doc, stamp, array)) => Some((doc.clone(), *stamp, array.clone())),
            _ => None,
        };
        if let Some((doc, stamp, array)) = remembered
            && store.is_unchanged(&doc, &stamp)
        {
            return Some(array);
        }
        let found = Self::look(store, dir);
        let array = match &found {
            Found::Array(_, _, array) => Some(array.clone()),
            Found::Nothing(_) => None,
        };
        self.dirs.lock().put(dir.to_string(), found);
        array
    }

    /// Reads the array document in `dir`, `.zarray` first.
    fn look(store: &dyn Store, dir: &str) -> Found {
        type Parse = fn(&str, &Value) -> Option<PlainArray>;
        let parsers: [(&str, Parse); 2] = [(".zarray", PlainArray::of_zarray), ("zarr.json", PlainArray::of_zarr_json)];
        for (name, parse) in parsers {
            let key = if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
            let Ok(attr) = store.attr(&key) else { continue };
            if attr.kind != Kind::File {
                continue;
            }
            let doc = store.read(&key).ok().and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            return match doc.as_ref().and_then(|doc| parse(dir, doc)) {
                Some(array) => Found::Array(key, attr.stamp, Arc::new(array)),
                None => Found::Nothing(Instant::now()),
            };
        }
        Found::Nothing(Instant::now())
    }
}

/// The directories above the file at `key` that could hold an array it is a chunk file of,
/// nearest first: only directories whose names could be part of a chunk key (`c`, coordinates, `c3` of the draft layout) lie between an array's
/// directory and its chunk files.
fn chunk_key_dirs(key: &str) -> impl Iterator<Item = &str> {
    let mut dir = Some(key);
    std::iter::from_fn(move || {
        let (parent, name) = dir?.rsplit_once('/').unwrap_or(("", dir?));
        let fits = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'c');
        if !fits {
            dir = None;
            return None;
        }
        dir = (!parent.is_empty()).then_some(parent);
        Some(parent)
    })
    .take(MOST_LEVELS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn v2_and_v3_documents_give_the_grid_and_chunk_keys() {
        let v2 = PlainArray::of_zarray("a/big", &json!({"shape": [100, 60], "chunks": [32, 25]})).unwrap();
        assert_eq!(v2.grid, [4, 3]);
        assert_eq!(v2.chunk_key(&[3, 2]), "a/big/3.2");
        assert_eq!(v2.coords("a/big/3.2"), Some(vec![3, 2]));
        assert_eq!(v2.coords("a/big/4.0"), None, "outside the grid");
        assert_eq!(v2.coords("a/big/.zarray"), None);
        let nested =
            PlainArray::of_zarray("", &json!({"shape": [10], "chunks": [3], "dimension_separator": "/"})).unwrap();
        assert_eq!((nested.chunk_key(&[2]), nested.coords("3")), ("2".to_string(), Some(vec![3])));
        let v3 = json!({"node_type": "array", "shape": [8, 8], "chunk_key_encoding": {"name": "default"},
                        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 2]}}});
        let v3 = PlainArray::of_zarr_json("x", &v3).unwrap();
        assert_eq!((v3.grid.as_slice(), v3.chunk_key(&[1, 3])), ([2, 4].as_slice(), "x/c/1/3".to_string()));
        assert_eq!(v3.coords("x/c/1/3"), Some(vec![1, 3]));
        assert!(PlainArray::of_zarr_json("x", &json!({"node_type": "group"})).is_none());
        assert!(PlainArray::of_zarray("x", &json!({"shape": [4], "chunks": [0]})).is_none());
    }

    #[test]
    fn a_chunk_file_is_found_under_its_array_and_other_files_are_not() {
        let dir = std::env::temp_dir().join(format!("shardfs-plain-arrays-{}", std::process::id()));
        let put = |key: &str, bytes: &[u8]| {
            let path = dir.join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        };
        put("g/a/.zarray", br#"{"shape": [8, 8], "chunks": [4, 4], "dimension_separator": "/"}"#);
        put("g/a/1/0", b"x");
        put(
            "g/v3/zarr.json",
            br#"{"node_type": "array", "shape": [4], "chunk_key_encoding": {"name": "v2"},
                 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}}}"#,
        );
        put("g/v3/3", b"x");
        put("g/notes/1.txt", b"x");
        let store = crate::store::local::LocalStore::open(&dir).unwrap();
        let arrays = PlainArrays::default();
        let (array, coords) = arrays.chunk_of(&store, "g/a/1/0").unwrap();
        assert_eq!((&*array.dir, coords), ("g/a", vec![1, 0]));
        let (array, coords) = arrays.chunk_of(&store, "g/v3/3").unwrap();
        assert_eq!((&*array.dir, coords), ("g/v3", vec![3]));
        assert!(arrays.chunk_of(&store, "g/notes/1.txt").is_none());
        assert!(arrays.chunk_of(&store, "g/a/.zarray").is_none());
        assert!(arrays.chunk_of(&store, "g/a/2/0").is_none(), "outside the grid");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A local store that counts the attributes asked of it.
    #[derive(Debug)]
    struct CountingAttrs(crate::store::LocalStore, std::sync::atomic::AtomicUsize, Mutex<Option<String>>);

    impl Store for CountingAttrs {
        fn describe(&self, key: &str) -> String {
            self.0.describe(key)
        }
        fn url(&self, key: &str) -> String {
            self.0.url(key)
        }
        fn attr(&self, key: &str) -> crate::store::Result<crate::store::Attr> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // A key slow to answer: a HEAD on an object store once its answer is stale.
            if self.2.lock().as_deref() == Some(key) {
                std::thread::sleep(Duration::from_millis(600));
            }
            self.0.attr(key)
        }
        fn list(&self, dir: &str) -> crate::store::Result<(Vec<(String, Kind)>, Stamp)> {
            self.0.list(dir)
        }
        fn open(&self, key: &str) -> crate::store::Result<Box<dyn crate::store::Object>> {
            self.0.open(key)
        }
        fn read_link(&self, key: &str) -> crate::store::Result<std::path::PathBuf> {
            self.0.read_link(key)
        }
        fn space(&self) -> crate::store::Result<crate::store::Space> {
            self.0.space()
        }
        fn put(&self, key: &str, pieces: &[&[u8]], mode: crate::store::PutMode) -> crate::store::Result<Option<Stamp>> {
            self.0.put(key, pieces, mode)
        }
        fn delete(&self, key: &str) -> crate::store::Result<()> {
            self.0.delete(key)
        }
        fn rename(&self, from: &str, to: &str) -> crate::store::Result<()> {
            self.0.rename(from, to)
        }
        fn make_dir(&self, key: &str, mode: u32) -> crate::store::Result<()> {
            self.0.make_dir(key, mode)
        }
        fn make_dirs(&self, key: &str) -> crate::store::Result<()> {
            self.0.make_dirs(key)
        }
        fn remove_dir(&self, key: &str) -> crate::store::Result<()> {
            self.0.remove_dir(key)
        }
        fn can_append(&self) -> bool {
            self.0.can_append()
        }
        fn open_file(
            &self,
            key: &str,
            how: crate::store::OpenHow,
        ) -> crate::store::Result<Box<dyn crate::store::OpenFile>> {
            self.0.open_file(key, how)
        }
        fn lock(&self, slot: u64) -> crate::store::Result<Box<dyn crate::store::Lock>> {
            self.0.lock(slot)
        }
    }

    /// review4: a v3 array with default (`c/`) keys, 64 rows of one chunk: each chunk file is in
    /// a directory of its own (`a/c/<i>`), and finding the array of each chunk opened looks up
    /// `.zarray` and `zarr.json` in that new directory before it reaches the array it already
    /// knows: on an object store a HEAD (and a LIST) for each, in the reader's open.
    #[test]
    fn review4_chunk_files_of_a_known_array_cost_no_document_lookups_in_each_new_directory() {
        let dir = std::env::temp_dir().join(format!("shardfs-plain-arrays-review4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let put = |key: &str, bytes: &[u8]| {
            let path = dir.join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        };
        put(
            "a/zarr.json",
            br#"{"node_type": "array", "shape": [64, 1], "chunk_key_encoding": {"name": "default"},
                 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1]}}}"#,
        );
        for i in 0..64 {
            put(&format!("a/c/{i}/0"), b"x");
        }
        let store = CountingAttrs(crate::store::LocalStore::open(&dir).unwrap(), Default::default(), Mutex::new(None));
        let arrays = PlainArrays::default();
        // The first chunk finds the array.
        assert_eq!(arrays.chunk_of(&store, "a/c/0/0").map(|(_, c)| c), Some(vec![0, 0]));
        let before = store.1.load(std::sync::atomic::Ordering::SeqCst);
        for i in 1..64 {
            assert_eq!(arrays.chunk_of(&store, &format!("a/c/{i}/0")).map(|(_, c)| c), Some(vec![i, 0]));
        }
        let asked = store.1.load(std::sync::atomic::Ordering::SeqCst) - before;
        std::fs::remove_dir_all(&dir).unwrap();
        // One look at the array's document per chunk would do (is_unchanged); 63 more chunks.
        assert!(asked <= 63, "{asked} attribute lookups for 63 chunk files of an array already found");
    }

    /// review4: the lock of the arrays remembered is held while the store is asked whether an
    /// array's document is unchanged (`match self.dirs.lock().get(dir) { .. if
    /// store.is_unchanged(..) }`): a slow answer for one array (a HEAD on an object store) holds
    /// up every open of a chunk file of every other array, known ones too.
    #[test]
    fn review4_a_slow_look_at_one_arrays_document_does_not_hold_up_the_chunks_of_another() {
        let dir = std::env::temp_dir().join(format!("shardfs-plain-arrays-review4-slow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let put = |key: &str, bytes: &[u8]| {
            let path = dir.join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        };
        put("a/.zarray", br#"{"shape": [8], "chunks": [1]}"#);
        put("b/.zarray", br#"{"shape": [8], "chunks": [1]}"#);
        for i in 0..8 {
            put(&format!("a/{i}"), b"x");
            put(&format!("b/{i}"), b"x");
        }
        let store = CountingAttrs(crate::store::LocalStore::open(&dir).unwrap(), Default::default(), Mutex::new(None));
        let arrays = PlainArrays::default();
        assert!(arrays.chunk_of(&store, "a/0").is_some() && arrays.chunk_of(&store, "b/0").is_some());
        *store.2.lock() = Some("a/.zarray".to_string());
        let took = std::thread::scope(|s| {
            s.spawn(|| arrays.chunk_of(&store, "a/1"));
            std::thread::sleep(Duration::from_millis(100));
            let start = Instant::now();
            assert!(arrays.chunk_of(&store, "b/1").is_some());
            start.elapsed()
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(took < Duration::from_millis(300), "a chunk of b waited {took:?} for a look at a's document");
    }
}
