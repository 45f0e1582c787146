//! LevelDB's C API (`leveldb/c.h`), from Debian's `libleveldb1d`, loaded when a LevelDB is first
//! opened ([`loaded`]).
//!
//! Only what [`super::LevelDb`] calls, each wrapped so that the rest of the store sees Rust types:
//! errors as strings, values as slices or vectors, the C objects freed on drop.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;

use crate::store::database::loaded::{self, symbol};

/// The library's file names, newest soname first.
const NAMES: [&str; 3] = ["libleveldb.so.1d", "libleveldb.so.1", "libleveldb.so"];

#[repr(C)]
pub struct Db(c_void);
#[repr(C)]
pub struct Options(c_void);
#[repr(C)]
pub struct ReadOptions(c_void);
#[repr(C)]
pub struct WriteOptions(c_void);
#[repr(C)]
pub struct Iterator(c_void);

type Err = *mut *mut c_char;

/// The functions used, as the library exports them.
struct Api {
    open: unsafe extern "C" fn(*const Options, *const c_char, Err) -> *mut Db,
    close: unsafe extern "C" fn(*mut Db),
    put: unsafe extern "C" fn(*mut Db, *const WriteOptions, *const c_char, usize, *const c_char, usize, Err),
    delete: unsafe extern "C" fn(*mut Db, *const WriteOptions, *const c_char, usize, Err),
    create_iterator: unsafe extern "C" fn(*mut Db, *const ReadOptions) -> *mut Iterator,
    iter_destroy: unsafe extern "C" fn(*mut Iterator),
    iter_valid: unsafe extern "C" fn(*const Iterator) -> u8,
    iter_seek: unsafe extern "C" fn(*mut Iterator, *const c_char, usize),
    iter_next: unsafe extern "C" fn(*mut Iterator),
    iter_key: unsafe extern "C" fn(*const Iterator, *mut usize) -> *const c_char,
    iter_value: unsafe extern "C" fn(*const Iterator, *mut usize) -> *const c_char,
    iter_get_error: unsafe extern "C" fn(*const Iterator, Err),
    options_create: unsafe extern "C" fn() -> *mut Options,
    options_destroy: unsafe extern "C" fn(*mut Options),
    options_set_create_if_missing: unsafe extern "C" fn(*mut Options, u8),
    readoptions_create: unsafe extern "C" fn() -> *mut ReadOptions,
    readoptions_destroy: unsafe extern "C" fn(*mut ReadOptions),
    writeoptions_create: unsafe extern "C" fn() -> *mut WriteOptions,
    writeoptions_destroy: unsafe extern "C" fn(*mut WriteOptions),
    writeoptions_set_sync: unsafe extern "C" fn(*mut WriteOptions, u8),
    free: unsafe extern "C" fn(*mut c_void),
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

/// The library, loaded once; the error says what is missing.
fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let library = loaded::library(&NAMES, "LevelDB", "libleveldb1d")?;
    Ok(Api {
        open: symbol!(library, "LevelDB", "leveldb_open"),
        close: symbol!(library, "LevelDB", "leveldb_close"),
        put: symbol!(library, "LevelDB", "leveldb_put"),
        delete: symbol!(library, "LevelDB", "leveldb_delete"),
        create_iterator: symbol!(library, "LevelDB", "leveldb_create_iterator"),
        iter_destroy: symbol!(library, "LevelDB", "leveldb_iter_destroy"),
        iter_valid: symbol!(library, "LevelDB", "leveldb_iter_valid"),
        iter_seek: symbol!(library, "LevelDB", "leveldb_iter_seek"),
        iter_next: symbol!(library, "LevelDB", "leveldb_iter_next"),
        iter_key: symbol!(library, "LevelDB", "leveldb_iter_key"),
        iter_value: symbol!(library, "LevelDB", "leveldb_iter_value"),
        iter_get_error: symbol!(library, "LevelDB", "leveldb_iter_get_error"),
        options_create: symbol!(library, "LevelDB", "leveldb_options_create"),
        options_destroy: symbol!(library, "LevelDB", "leveldb_options_destroy"),
        options_set_create_if_missing: symbol!(library, "LevelDB", "leveldb_options_set_create_if_missing"),
        readoptions_create: symbol!(library, "LevelDB", "leveldb_readoptions_create"),
        readoptions_destroy: symbol!(library, "LevelDB", "leveldb_readoptions_destroy"),
        writeoptions_create: symbol!(library, "LevelDB", "leveldb_writeoptions_create"),
        writeoptions_destroy: symbol!(library, "LevelDB", "leveldb_writeoptions_destroy"),
        writeoptions_set_sync: symbol!(library, "LevelDB", "leveldb_writeoptions_set_sync"),
        free: symbol!(library, "LevelDB", "leveldb_free"),
        _library: library,
    })
}

/// Runs `call` with an error slot and turns what the library put there into an error.
fn checked<T>(api: &Api, call: impl FnOnce(Err) -> T) -> Result<T, String> {
    let mut error: *mut c_char = std::ptr::null_mut();
    let value = call(&mut error);
    if error.is_null() {
        return Ok(value);
    }
    // SAFETY: the library put a NUL-terminated string it allocated there, freed here once.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { (api.free)(error.cast()) };
    Err(message)
}

/// An open LevelDB; safe to use from many threads at once, as LevelDB's `DB` is.
pub struct Database {
    api: &'static Api,
    db: *mut Db,
    read: *mut ReadOptions,
    /// Writes synced to disk before they return.
    write: *mut WriteOptions,
}

// SAFETY: LevelDB's DB may be used from several threads without synchronisation, and the option
// objects are only read after they are made.
unsafe impl Send for Database {}
unsafe impl Sync for Database {}

impl Database {
    /// Opens (creating when `create`) the database in `dir`.
    pub fn open(dir: &std::path::Path, create: bool) -> Result<Database, String> {
        let api = api()?;
        let name = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: each object is made by the library and freed below or on drop.
        unsafe {
            let options = (api.options_create)();
            (api.options_set_create_if_missing)(options, create as u8);
            let db = checked(api, |error| (api.open)(options, name.as_ptr(), error));
            (api.options_destroy)(options);
            let db = db?;
            let read = (api.readoptions_create)();
            let write = (api.writeoptions_create)();
            (api.writeoptions_set_sync)(write, 1);
            Ok(Database { api, db, read, write })
        }
    }

    /// Stores `value` at `key`, synced to disk.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        // SAFETY: the pointers and lengths are of live slices.
        checked(self.api, |error| unsafe {
            (self.api.put)(
                self.db,
                self.write,
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr().cast(),
                value.len(),
                error,
            )
        })
    }

    /// Removes `key`, synced to disk; nothing there is no error.
    pub fn delete(&self, key: &[u8]) -> Result<(), String> {
        // SAFETY: as for put.
        checked(self.api, |error| unsafe {
            (self.api.delete)(self.db, self.write, key.as_ptr().cast(), key.len(), error)
        })
    }

    /// An iterator over a snapshot of the database as it is now.
    pub fn iter(&self) -> Cursor<'_> {
        // SAFETY: the iterator is destroyed before the database closes (it borrows it).
        Cursor { database: self, it: unsafe { (self.api.create_iterator)(self.db, self.read) } }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // SAFETY: made in open, no iterator outlives the borrow of self.
        unsafe {
            (self.api.readoptions_destroy)(self.read);
            (self.api.writeoptions_destroy)(self.write);
            (self.api.close)(self.db);
        }
    }
}

/// A key and its value.
pub type Pair<'a> = (&'a [u8], &'a [u8]);

/// A position among the keys of one snapshot, in byte order.
pub struct Cursor<'a> {
    database: &'a Database,
    it: *mut Iterator,
}

impl Cursor<'_> {
    /// Moves to the first key at or after `key`.
    pub fn seek(&mut self, key: &[u8]) {
        // SAFETY: a live slice; LevelDB copies what it needs.
        unsafe { (self.database.api.iter_seek)(self.it, key.as_ptr().cast(), key.len()) }
    }

    pub fn next(&mut self) {
        // SAFETY: called only where `current` found an entry.
        unsafe { (self.database.api.iter_next)(self.it) }
    }

    /// The key and value here, borrowed until the cursor moves; `Ok(None)` past the end.
    pub fn current(&self) -> Result<Option<Pair<'_>>, String> {
        let api = self.database.api;
        // SAFETY: key and value point into the iterator's block, valid until it moves.
        unsafe {
            if (api.iter_valid)(self.it) == 0 {
                return checked(api, |error| (api.iter_get_error)(self.it, error)).map(|()| None);
            }
            let (mut key_len, mut value_len) = (0, 0);
            let key = (api.iter_key)(self.it, &mut key_len);
            let value = (api.iter_value)(self.it, &mut value_len);
            Ok(Some((slice(key, key_len), slice(value, value_len))))
        }
    }
}

/// The bytes at `pointer`, `len` of them (none when the pointer is null).
///
/// # Safety
/// `pointer` points to `len` readable bytes that outlive the slice.
unsafe fn slice<'a>(pointer: *const c_char, len: usize) -> &'a [u8] {
    if pointer.is_null() || len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(pointer.cast(), len) } }
}

impl Drop for Cursor<'_> {
    fn drop(&mut self) {
        // SAFETY: made in iter, destroyed once.
        unsafe { (self.database.api.iter_destroy)(self.it) }
    }
}
