//! Kyoto Cabinet's C API (`kclangc.h`), from Debian's `libkyotocabinet16v5`, loaded when a Kyoto
//! Cabinet file is first opened ([`loaded`]).
//!
//! Only what [`super`] calls, each wrapped so that the rest of the store sees Rust types.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;

use bytes::Bytes;

use crate::store::database::keyed_file::LockedFile;
use crate::store::database::loaded::{self, Allocated, symbol};

/// The library's file names, newest soname first.
const NAMES: [&str; 2] = ["libkyotocabinet.so.16", "libkyotocabinet.so"];

const READER: u32 = 1 << 0;
const WRITER: u32 = 1 << 1;
/// Fail at once, rather than wait, when another process holds the file's lock.
const TRY_LOCK: u32 = 1 << 7;
/// `KCENOREC`: the error code of a get of a key that is not there.
const NO_RECORD: i32 = 7;

#[repr(C)]
struct Db(c_void);
#[repr(C)]
struct Cursor(c_void);

struct Api {
    new: unsafe extern "C" fn() -> *mut Db,
    del: unsafe extern "C" fn(*mut Db),
    open: unsafe extern "C" fn(*mut Db, *const c_char, u32) -> i32,
    close: unsafe extern "C" fn(*mut Db) -> i32,
    get: unsafe extern "C" fn(*mut Db, *const c_char, usize, *mut usize) -> *mut c_char,
    set: unsafe extern "C" fn(*mut Db, *const c_char, usize, *const c_char, usize) -> i32,
    remove: unsafe extern "C" fn(*mut Db, *const c_char, usize) -> i32,
    sync: unsafe extern "C" fn(*mut Db, i32, *const c_void, *mut c_void) -> i32,
    emsg: unsafe extern "C" fn(*mut Db) -> *const c_char,
    ecode: unsafe extern "C" fn(*mut Db) -> i32,
    cursor: unsafe extern "C" fn(*mut Db) -> *mut Cursor,
    cursor_del: unsafe extern "C" fn(*mut Cursor),
    cursor_jump: unsafe extern "C" fn(*mut Cursor) -> i32,
    cursor_key: unsafe extern "C" fn(*mut Cursor, *mut usize, i32) -> *mut c_char,
    free: unsafe extern "C" fn(*mut c_void),
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let library = loaded::library(&NAMES, "Kyoto Cabinet", "libkyotocabinet16v5")?;
    Ok(Api {
        new: symbol!(library, "Kyoto Cabinet", "kcdbnew"),
        del: symbol!(library, "Kyoto Cabinet", "kcdbdel"),
        open: symbol!(library, "Kyoto Cabinet", "kcdbopen"),
        close: symbol!(library, "Kyoto Cabinet", "kcdbclose"),
        get: symbol!(library, "Kyoto Cabinet", "kcdbget"),
        set: symbol!(library, "Kyoto Cabinet", "kcdbset"),
        remove: symbol!(library, "Kyoto Cabinet", "kcdbremove"),
        sync: symbol!(library, "Kyoto Cabinet", "kcdbsync"),
        emsg: symbol!(library, "Kyoto Cabinet", "kcdbemsg"),
        ecode: symbol!(library, "Kyoto Cabinet", "kcdbecode"),
        cursor: symbol!(library, "Kyoto Cabinet", "kcdbcursor"),
        cursor_del: symbol!(library, "Kyoto Cabinet", "kccurdel"),
        cursor_jump: symbol!(library, "Kyoto Cabinet", "kccurjump"),
        cursor_key: symbol!(library, "Kyoto Cabinet", "kccurgetkey"),
        free: symbol!(library, "Kyoto Cabinet", "kcfree"),
        _library: library,
    })
}

/// An open Kyoto Cabinet file.
pub struct File {
    api: &'static Api,
    db: *mut Db,
}

// SAFETY: a database object may move between threads; it is used by one at a time (not Sync).
unsafe impl Send for File {}

impl File {
    /// Opens the file named by `path` (Kyoto Cabinet's path syntax: `FILE#type=kct` says its
    /// kind) as its writer or a reader, failing at once when another process holds it.
    pub fn open(path: &str, writer: bool) -> Result<File, String> {
        let api = api()?;
        let name = CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: a new object, deleted on drop (or here when the open fails).
        let file = File { api, db: unsafe { (api.new)() } };
        let mode = if writer { WRITER } else { READER } | TRY_LOCK;
        if unsafe { (api.open)(file.db, name.as_ptr(), mode) } == 0 {
            return Err(file.error());
        }
        Ok(file)
    }

    fn error(&self) -> String {
        // SAFETY: a static or object-owned NUL-terminated message.
        let text = unsafe { (self.api.emsg)(self.db) };
        if text.is_null() {
            "an unknown error".to_string()
        } else {
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        }
    }

    /// Takes the bytes the library allocated at `pointer`, `len` of them; `None` for none.
    fn take(&self, pointer: *mut c_char, len: usize) -> Option<Allocated> {
        // SAFETY: the library allocated len bytes there for the caller, freed with kcfree.
        unsafe { Allocated::new(pointer.cast(), len, self.api.free) }
    }

    /// Synced to the device (`hard`), not only to the file system.
    fn sync(&mut self) -> Result<(), String> {
        // SAFETY: no callback.
        if unsafe { (self.api.sync)(self.db, 1, std::ptr::null(), std::ptr::null_mut()) } == 0 {
            return Err(self.error());
        }
        Ok(())
    }
}

impl LockedFile for File {
    fn fetch(&mut self, key: &[u8]) -> Result<Option<Bytes>, String> {
        let mut len = 0;
        // SAFETY: the key outlives the call.
        let value = unsafe { (self.api.get)(self.db, key.as_ptr().cast(), key.len(), &mut len) };
        match self.take(value, len) {
            Some(value) => Ok(Some(Bytes::from_owner(value))),
            // SAFETY: an open handle. No value is an error unless the record is missing.
            None if unsafe { (self.api.ecode)(self.db) } == NO_RECORD => Ok(None),
            None => Err(self.error()),
        }
    }

    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        // SAFETY: both slices outlive the call; the library copies them.
        let set =
            unsafe { (self.api.set)(self.db, key.as_ptr().cast(), key.len(), value.as_ptr().cast(), value.len()) };
        if set == 0 {
            return Err(self.error());
        }
        self.sync()
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        // SAFETY: as for fetch. 0 is also "no record", which is no error here.
        let _ = unsafe { (self.api.remove)(self.db, key.as_ptr().cast(), key.len()) };
        self.sync()
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let mut keys = Vec::new();
        // SAFETY: the cursor is deleted below; each key is taken (freed) once.
        unsafe {
            let cursor = (self.api.cursor)(self.db);
            if (self.api.cursor_jump)(cursor) != 0 {
                loop {
                    let mut len = 0;
                    let key = (self.api.cursor_key)(cursor, &mut len, 1);
                    match self.take(key, len) {
                        Some(key) => keys.push(key.as_ref().to_vec()),
                        None => break,
                    }
                }
            }
            (self.api.cursor_del)(cursor);
        }
        Ok(keys)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // SAFETY: made in open, closed and deleted once (closing one that did not open is a no-op
        // error).
        unsafe {
            (self.api.close)(self.db);
            (self.api.del)(self.db);
        }
    }
}
