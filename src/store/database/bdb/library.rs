//! Berkeley DB's C API (`db.h`), from Debian's `libdb5.3`, loaded when a Berkeley DB file is
//! first opened ([`loaded`]).
//!
//! Berkeley DB's methods are function pointers in its `DB`, `DBC` and `DB_ENV` structs
//! (`db->get(db, ...)`), whose layout only a C compiler reading `db.h` knows. The functions those
//! pointers are set to (`__db_get_pp` and the rest, installed by `__db_init` in `db_method.c`,
//! `__dbc_init` in `bt_cursor.c` and `db_env_create` in `env_method.c`) are exported by
//! `libdb-5.3.so` under the symbol version `DB5_3`, each with the method's own signature (checked
//! against Debian's `db.h` and db 5.3's `db_iface.c`, `db_vrfy.c`, `env_open.c`, `env_method.c`,
//! `mp_method.c`; `db_create`, `db_env_create` and `db_strerror` are public by name): they are
//! called here by name, as the struct would call them. That keeps the binary free of a C shim and
//! of a build dependency on `libdb5.3-dev`, which a shim would need (and it would still have to
//! load the library at run time, as the binary links no database library). What that relies on:
//! the names are internal to Berkeley DB 5.3 and so bound to its soname (`libdb-5.3.so`, the one
//! loaded); only plain `DB` handles are opened (not partitioned, no secondaries: [`super`]
//! refuses such files by their header), whose cursors are `__dbc_*_pp`'s. The one struct whose
//! layout is relied on is `DBT`, declared in `db.h` as [`Dbt`] is here; the constants are
//! `db.h`'s.
//!
//! Each file is opened in an environment of its own, private to this process (`DB_PRIVATE`, an
//! in-memory cache, as Python's `berkeleydb.hashopen` opens one), so that the library's error
//! messages come here (its error callback) rather than to standard error. A handle is not for two
//! threads at once: [`File`] is `Send`, not `Sync`, and the store keeps it behind a lock.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use bytes::Bytes;

use super::layout;
use crate::store::database::buffers::Buffer;
use crate::store::database::keyed_file::{LockedFile, Measured, Places};
use crate::store::database::loaded::{self, symbol};

/// The library's file names: the symbols called are Berkeley DB 5.3's.
const NAMES: [&str; 1] = ["libdb-5.3.so"];

/// `DBTYPE`.
pub const BTREE: c_int = 1;
pub const HASH: c_int = 2;

const CREATE: u32 = 0x1;
const RDONLY: u32 = 0x400;
const INIT_MPOOL: u32 = 0x400;
const PRIVATE: u32 = 0x10000;
const NEXT: u32 = 16;

const DBT_PARTIAL: u32 = 0x040;
const DBT_USERMEM: u32 = 0x800;

const BUFFER_SMALL: c_int = -30999;
const KEYEMPTY: c_int = -30995;
const NOTFOUND: c_int = -30988;

/// The cache of a file's environment: whole values of a few MiB go through it.
const CACHE_BYTES: u32 = 16 << 20;
/// The largest file a read-only mount maps rather than reads through the cache (address space
/// only: the kernel's page cache holds the pages either way).
const MAPPED_BYTES: usize = 1 << 40;

#[repr(C)]
struct Db(c_void);
#[repr(C)]
struct Cursor(c_void);
#[repr(C)]
struct Env(c_void);

/// `DBT` (`struct __db_dbt`): a key or a value, and how the library is to return one.
#[repr(C)]
struct Dbt {
    data: *mut c_void,
    size: u32,
    ulen: u32,
    dlen: u32,
    doff: u32,
    app_data: *mut c_void,
    flags: u32,
}

impl Dbt {
    /// A key or value the library reads.
    fn of(bytes: &[u8]) -> Result<Dbt, String> {
        let size =
            u32::try_from(bytes.len()).map_err(|_| format!("{} bytes: more than Berkeley DB holds", bytes.len()))?;
        Ok(Dbt { data: bytes.as_ptr().cast_mut().cast(), size, ..Dbt::empty(0) })
    }

    fn empty(flags: u32) -> Dbt {
        Dbt { data: std::ptr::null_mut(), size: 0, ulen: 0, dlen: 0, doff: 0, app_data: std::ptr::null_mut(), flags }
    }
}

type ErrCall = extern "C" fn(*const Env, *const c_char, *const c_char);

struct Api {
    env_create: unsafe extern "C" fn(*mut *mut Env, u32) -> c_int,
    env_set_errcall: unsafe extern "C" fn(*mut Env, ErrCall),
    env_set_cachesize: unsafe extern "C" fn(*mut Env, u32, u32, c_int) -> c_int,
    env_set_mmapsize: unsafe extern "C" fn(*mut Env, usize) -> c_int,
    env_open: unsafe extern "C" fn(*mut Env, *const c_char, u32, c_int) -> c_int,
    env_close: unsafe extern "C" fn(*mut Env, u32) -> c_int,
    create: unsafe extern "C" fn(*mut *mut Db, *mut Env, u32) -> c_int,
    open: unsafe extern "C" fn(*mut Db, *mut c_void, *const c_char, *const c_char, c_int, u32, c_int) -> c_int,
    close: unsafe extern "C" fn(*mut Db, u32) -> c_int,
    get: unsafe extern "C" fn(*mut Db, *mut c_void, *mut Dbt, *mut Dbt, u32) -> c_int,
    put: unsafe extern "C" fn(*mut Db, *mut c_void, *mut Dbt, *mut Dbt, u32) -> c_int,
    del: unsafe extern "C" fn(*mut Db, *mut c_void, *mut Dbt, u32) -> c_int,
    sync: unsafe extern "C" fn(*mut Db, u32) -> c_int,
    verify: unsafe extern "C" fn(*mut Db, *const c_char, *const c_char, *mut c_void, u32) -> c_int,
    cursor: unsafe extern "C" fn(*mut Db, *mut c_void, *mut *mut Cursor, u32) -> c_int,
    cursor_get: unsafe extern "C" fn(*mut Cursor, *mut Dbt, *mut Dbt, u32) -> c_int,
    cursor_close: unsafe extern "C" fn(*mut Cursor) -> c_int,
    strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let library = loaded::library(&NAMES, "Berkeley DB", "libdb5.3")?;
    Ok(Api {
        env_create: symbol!(library, "Berkeley DB", "db_env_create"),
        env_set_errcall: symbol!(library, "Berkeley DB", "__env_set_errcall"),
        env_set_cachesize: symbol!(library, "Berkeley DB", "__memp_set_cachesize"),
        env_set_mmapsize: symbol!(library, "Berkeley DB", "__memp_set_mp_mmapsize"),
        env_open: symbol!(library, "Berkeley DB", "__env_open_pp"),
        env_close: symbol!(library, "Berkeley DB", "__env_close_pp"),
        create: symbol!(library, "Berkeley DB", "db_create"),
        open: symbol!(library, "Berkeley DB", "__db_open_pp"),
        close: symbol!(library, "Berkeley DB", "__db_close_pp"),
        get: symbol!(library, "Berkeley DB", "__db_get_pp"),
        put: symbol!(library, "Berkeley DB", "__db_put_pp"),
        del: symbol!(library, "Berkeley DB", "__db_del_pp"),
        sync: symbol!(library, "Berkeley DB", "__db_sync_pp"),
        verify: symbol!(library, "Berkeley DB", "__db_verify_pp"),
        cursor: symbol!(library, "Berkeley DB", "__db_cursor_pp"),
        cursor_get: symbol!(library, "Berkeley DB", "__dbc_get_pp"),
        cursor_close: symbol!(library, "Berkeley DB", "__dbc_close_pp"),
        strerror: symbol!(library, "Berkeley DB", "db_strerror"),
        _library: library,
    })
}

thread_local! {
    /// The library's error messages of the call this thread is making.
    static MESSAGES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The environment's error callback: keeps the message for [`Api::failure`].
extern "C" fn keep(_: *const Env, _prefix: *const c_char, message: *const c_char) {
    if message.is_null() {
        return;
    }
    // SAFETY: the library passes a NUL-terminated message, valid for the call.
    let message = unsafe { CStr::from_ptr(message) }.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" ");
    MESSAGES.with(|m| m.borrow_mut().push(message));
}

impl Api {
    /// What failed with `code`: the library's messages since the call began, and its text for
    /// the code, on one line.
    fn failure(&self, code: c_int) -> String {
        self.failure_with(code, |said| said.last())
    }

    /// [`Api::failure`] with the first of the messages, the one that says where a check failed.
    fn failure_first(&self, code: c_int) -> String {
        self.failure_with(code, |said| said.first())
    }

    fn failure_with(&self, code: c_int, pick: impl FnOnce(&[String]) -> Option<&String>) -> String {
        // SAFETY: db_strerror returns a NUL-terminated string for any code.
        let text = unsafe { (self.strerror)(code) };
        let text = if text.is_null() {
            format!("Berkeley DB error {code}")
        } else {
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        let said = MESSAGES.with(|m| std::mem::take(&mut *m.borrow_mut()));
        match pick(&said) {
            Some(said) if !said.is_empty() => format!("{said} ({text})"),
            _ => text,
        }
    }

    /// `Ok` for 0, else the failure of `code`.
    fn check(&self, code: c_int) -> Result<(), String> {
        if code == 0 { Ok(()) } else { Err(self.failure(code)) }
    }
}

/// Starts a call whose messages [`Api::failure`] reports.
fn begin() {
    MESSAGES.with(|m| m.borrow_mut().clear());
}

/// An open Berkeley DB file, in an environment of its own.
pub struct File {
    api: &'static Api,
    env: *mut Env,
    /// Null until opened.
    db: *mut Db,
    /// The lock this mount holds on the file ([`super`]), given up after the file is closed; a
    /// descriptor of the file, which a read-only hash file's values are read through.
    lock: std::fs::File,
    /// Read-only: its values are read from its pages ([`super::layout`]).
    placeable: bool,
    /// The pages of a file whose values were placed.
    pages: Option<layout::Pages>,
}

// SAFETY: the handles may move between threads; they are used by one at a time (not Sync).
unsafe impl Send for File {}

impl File {
    /// Opens the file at `path` (a `kind`, [`BTREE`] or [`HASH`]) for writing unless `read_only`
    /// (creating it when `create`), holding `lock`. With `verify`, an existing file is checked
    /// first with Berkeley DB's verifier, which reads every page: the library trusts the pages it
    /// reads, and a damaged one can crash it (a bus error, seen with a btree page scrambled), so
    /// a damaged file is refused here instead, with the verifier's first complaint.
    pub fn open(
        path: &std::path::Path,
        kind: c_int,
        read_only: bool,
        create: bool,
        verify: bool,
        lock: std::fs::File,
    ) -> Result<File, String> {
        let api = api()?;
        let name = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        begin();
        let mut env = std::ptr::null_mut();
        // SAFETY: each call as db.h declares the method; the environment is closed on drop (or
        // below when it does not open), the database too.
        unsafe {
            api.check((api.env_create)(&mut env, 0))?;
            let placeable = read_only;
            let mut file = File { api, env, db: std::ptr::null_mut(), lock, placeable, pages: None };
            (api.env_set_errcall)(env, keep);
            api.check((api.env_set_cachesize)(env, 0, CACHE_BYTES, 1))?;
            if read_only {
                // A btree file opened read-only is mapped and its pages read where they are, not
                // copied through the cache, up to this size (the library's default: 10 MB). A
                // hash file never is: its pages are converted as they are read.
                api.check((api.env_set_mmapsize)(env, MAPPED_BYTES))?;
            }
            api.check((api.env_open)(env, std::ptr::null(), CREATE | INIT_MPOOL | PRIVATE, 0))?;
            if verify && !create {
                let mut checker = std::ptr::null_mut();
                api.check((api.create)(&mut checker, env, 0))?;
                begin();
                // The handle is the verifier's: gone once it returns, whatever it returns.
                let verified = (api.verify)(checker, name.as_ptr(), std::ptr::null(), std::ptr::null_mut(), 0);
                if verified != 0 {
                    return Err(format!("damaged: {}", api.failure_first(verified)));
                }
            }
            begin();
            let mut db = std::ptr::null_mut();
            api.check((api.create)(&mut db, env, 0))?;
            file.db = db;
            let flags = if read_only {
                RDONLY
            } else if create {
                CREATE
            } else {
                0
            };
            let opened = (api.open)(db, std::ptr::null_mut(), name.as_ptr(), std::ptr::null(), kind, flags, 0o644);
            if opened != 0 {
                // A handle that failed to open is closed all the same, and only once.
                let why = api.failure(opened);
                (api.close)(db, 0);
                file.db = std::ptr::null_mut();
                return Err(why);
            }
            Ok(file)
        }
    }

    /// The size of the value at `key`, if there is one, read without the value.
    fn size(&mut self, key: &[u8]) -> Result<Option<u32>, String> {
        begin();
        let mut key = Dbt::of(key)?;
        let mut value = Dbt::empty(DBT_USERMEM);
        // SAFETY: the key's bytes outlive the call; ulen 0 and no memory: the library only sets
        // the size.
        match unsafe { (self.api.get)(self.db, std::ptr::null_mut(), &mut key, &mut value, 0) } {
            BUFFER_SMALL | 0 => Ok(Some(value.size)),
            NOTFOUND | KEYEMPTY => Ok(None),
            code => Err(self.api.failure(code)),
        }
    }

    fn sync(&mut self) -> Result<(), String> {
        begin();
        // SAFETY: an open handle.
        self.api.check(unsafe { (self.api.sync)(self.db, 0) })
    }
}

impl LockedFile for File {
    /// A read-only file's, from its pages.
    fn places(&mut self) -> Option<Places> {
        if !self.placeable {
            return None;
        }
        let len = self.lock.metadata().map(|m| m.len()).map_err(|e| e.to_string());
        match len.and_then(|len| layout::places(len, |buf, at| self.lock.read_exact_at(buf, at))) {
            Ok((pages, places)) => {
                self.pages = Some(pages);
                Some(places)
            }
            Err(why) => {
                log::info!("Berkeley DB: values read through the library, whole: {why}");
                None
            }
        }
    }

    fn read_placed(&mut self, place: &Range<u64>, from: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let pages = self.pages.as_mut().ok_or(std::io::ErrorKind::Unsupported)?;
        let lock = &self.lock;
        pages.read_value(place, from, buf, |buf, at| lock.read_exact_at(buf, at))
    }

    fn fetch(&mut self, key: &[u8]) -> Result<Option<Bytes>, String> {
        // First the size, then the value, into memory of that size.
        let Some(size) = self.size(key)? else { return Ok(None) };
        if size == 0 {
            return Ok(Some(Bytes::new()));
        }
        begin();
        let mut key = Dbt::of(key)?;
        let mut bytes = Buffer::of(size as usize);
        let mut value = Dbt::empty(DBT_USERMEM);
        value.data = bytes.as_mut_ptr().cast();
        value.ulen = size;
        // SAFETY: ulen bytes at data are ours to write; the library writes size of them.
        match unsafe { (self.api.get)(self.db, std::ptr::null_mut(), &mut key, &mut value, 0) } {
            0 => {
                bytes.truncate(value.size as usize);
                Ok(Some(bytes.into_bytes()))
            }
            NOTFOUND | KEYEMPTY => Ok(None),
            code => Err(self.api.failure(code)),
        }
    }

    /// The size alone: the library reads no value into memory too small for it.
    fn measure(&mut self, key: &[u8]) -> Result<Option<Measured>, String> {
        Ok(self.size(key)?.map(|size| Measured::Size(size.into())))
    }

    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        begin();
        let (mut key, mut value) = (Dbt::of(key)?, Dbt::of(value)?);
        // SAFETY: both slices outlive the call; the library copies them (and only reads them).
        self.api.check(unsafe { (self.api.put)(self.db, std::ptr::null_mut(), &mut key, &mut value, 0) })?;
        self.sync()
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        begin();
        let mut key = Dbt::of(key)?;
        // SAFETY: as for fetch.
        match unsafe { (self.api.del)(self.db, std::ptr::null_mut(), &mut key, 0) } {
            0 | NOTFOUND | KEYEMPTY => {}
            code => return Err(self.api.failure(code)),
        }
        self.sync()
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, String> {
        begin();
        let mut cursor = std::ptr::null_mut();
        // SAFETY: the cursor is closed below, once.
        self.api.check(unsafe { (self.api.cursor)(self.db, std::ptr::null_mut(), &mut cursor, 0) })?;
        let mut keys = Vec::new();
        let walked = loop {
            // The key in the library's memory (valid until the next call), no bytes of the value.
            let mut key = Dbt::empty(0);
            let mut value = Dbt::empty(DBT_PARTIAL);
            // SAFETY: an open cursor; the key's memory is read before the next call.
            match unsafe { (self.api.cursor_get)(cursor, &mut key, &mut value, NEXT) } {
                0 if key.data.is_null() => keys.push(Vec::new()),
                0 => {
                    keys.push(unsafe { std::slice::from_raw_parts(key.data.cast::<u8>(), key.size as usize) }.to_vec())
                }
                NOTFOUND => break Ok(keys),
                code => break Err(self.api.failure(code)),
            }
        };
        // SAFETY: opened above.
        let closed = unsafe { (self.api.cursor_close)(cursor) };
        let keys = walked?;
        self.api.check(closed)?;
        Ok(keys)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // SAFETY: made in open, each closed once: the database (which flushes what is cached), then
        // its environment.
        unsafe {
            if !self.db.is_null() {
                (self.api.close)(self.db, 0);
            }
            (self.api.env_close)(self.env, 0);
        }
    }
}
