//! GNU dbm's C API (`gdbm.h`), from Debian's `libgdbm6`, loaded when a GNU dbm file is first
//! opened ([`loaded`]).
//!
//! Only what [`super::Gdbm`] calls, each wrapped so that the rest of the store sees Rust types.
//! A GNU dbm handle is not safe to use from two threads at once: [`File`] is `Send`, not
//! `Sync`, and the store keeps it behind a lock.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use bytes::Bytes;

use crate::store::database::keyed_file::{LockedFile, Places};
use crate::store::database::loaded::{self, Allocated, symbol};

/// The library's file names, newest soname first.
const NAMES: [&str; 2] = ["libgdbm.so.6", "libgdbm.so"];

const READER: c_int = 0;
const WRITER: c_int = 1;
const REPLACE: c_int = 1;
/// `gdbm_errno` when another process holds the lock a reader or a writer needs.
const CANT_BE_READER: c_int = 9;
const CANT_BE_WRITER: c_int = 10;
/// `gdbm_errno` after a fetch of a key that is not there.
const ITEM_NOT_FOUND: c_int = 15;

/// The first bytes of a GNU dbm file, in this machine's byte order: the old format, the 32-bit
/// and 64-bit ones, and the last two with numsync.
const MAGICS: [u32; 5] = [0x13579ace, 0x13579acd, 0x13579acf, 0x13579ad0, 0x13579ad1];

/// True when `start`, a file's first bytes, are a GNU dbm file's.
pub fn is_gdbm(start: &[u8]) -> bool {
    start.get(..4).and_then(|b| b.try_into().ok()).is_some_and(|b| MAGICS.contains(&u32::from_ne_bytes(b)))
}

#[repr(C)]
struct Handle(c_void);

/// `datum`: a pointer and a length.
#[repr(C)]
#[derive(Clone, Copy)]
struct Datum {
    dptr: *mut c_char,
    dsize: c_int,
}

impl Datum {
    fn of(bytes: &[u8]) -> Result<Datum, String> {
        let dsize =
            c_int::try_from(bytes.len()).map_err(|_| format!("{} bytes: more than GNU dbm holds", bytes.len()))?;
        Ok(Datum { dptr: bytes.as_ptr().cast_mut().cast(), dsize })
    }

    /// The bytes of a datum the library allocated, freed when dropped; `None` for none.
    fn take(self) -> Option<Allocated> {
        // SAFETY: the library allocated dsize bytes at dptr with malloc, handed to the caller.
        unsafe { Allocated::new(self.dptr.cast(), self.dsize.max(0) as usize, libc::free) }
    }
}

struct Api {
    open: unsafe extern "C" fn(*const c_char, c_int, c_int, c_int, *const c_void) -> *mut Handle,
    close: unsafe extern "C" fn(*mut Handle) -> c_int,
    fetch: unsafe extern "C" fn(*mut Handle, Datum) -> Datum,
    store: unsafe extern "C" fn(*mut Handle, Datum, Datum, c_int) -> c_int,
    delete: unsafe extern "C" fn(*mut Handle, Datum) -> c_int,
    firstkey: unsafe extern "C" fn(*mut Handle) -> Datum,
    nextkey: unsafe extern "C" fn(*mut Handle, Datum) -> Datum,
    sync: unsafe extern "C" fn(*mut Handle) -> c_int,
    errno_location: unsafe extern "C" fn() -> *mut c_int,
    fdesc: unsafe extern "C" fn(*mut Handle) -> c_int,
    strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let library = loaded::library(&NAMES, "GNU dbm", "libgdbm6")?;
    Ok(Api {
        open: symbol!(library, "GNU dbm", "gdbm_open"),
        close: symbol!(library, "GNU dbm", "gdbm_close"),
        fetch: symbol!(library, "GNU dbm", "gdbm_fetch"),
        store: symbol!(library, "GNU dbm", "gdbm_store"),
        delete: symbol!(library, "GNU dbm", "gdbm_delete"),
        firstkey: symbol!(library, "GNU dbm", "gdbm_firstkey"),
        nextkey: symbol!(library, "GNU dbm", "gdbm_nextkey"),
        sync: symbol!(library, "GNU dbm", "gdbm_sync"),
        errno_location: symbol!(library, "GNU dbm", "gdbm_errno_location"),
        fdesc: symbol!(library, "GNU dbm", "gdbm_fdesc"),
        strerror: symbol!(library, "GNU dbm", "gdbm_strerror"),
        _library: library,
    })
}

/// Why a GNU dbm file could not be opened.
pub enum OpenError {
    /// Another process holds the lock this open needs.
    Held(String),
    Other(String),
}

/// An open GNU dbm file.
pub struct File {
    api: &'static Api,
    handle: *mut Handle,
}

// SAFETY: a handle may move between threads; it is used by one at a time (not Sync).
unsafe impl Send for File {}

impl File {
    /// Opens the file at `path` for writing (GNU dbm's exclusive lock) or reading (its shared
    /// one).
    pub fn open(path: &std::path::Path, writer: bool) -> Result<File, OpenError> {
        let api = api().map_err(OpenError::Other)?;
        let name = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| OpenError::Other(e.to_string()))?;
        // SAFETY: a NUL-terminated name; no fatal function, so errors come back as gdbm_errno.
        let handle =
            unsafe { (api.open)(name.as_ptr(), 0, if writer { WRITER } else { READER }, 0o644, std::ptr::null()) };
        if handle.is_null() {
            // SAFETY: the library's own errno slot.
            let code = unsafe { *(api.errno_location)() };
            let message = message(api, code);
            let io = std::io::Error::last_os_error();
            return Err(match code {
                CANT_BE_READER | CANT_BE_WRITER => OpenError::Held(message),
                _ => OpenError::Other(format!("{message} ({io})")),
            });
        }
        Ok(File { api, handle })
    }

    fn error(&self) -> String {
        // SAFETY: the library's own errno slot.
        message(self.api, unsafe { *(self.api.errno_location)() })
    }

    fn sync(&mut self) -> Result<(), String> {
        // SAFETY: a live handle.
        if unsafe { (self.api.sync)(self.handle) } != 0 { Err(self.error()) } else { Ok(()) }
    }
}

fn message(api: &Api, code: c_int) -> String {
    // SAFETY: gdbm_strerror returns a static NUL-terminated string for any code.
    let text = unsafe { (api.strerror)(code) };
    if text.is_null() {
        format!("GNU dbm error {code}")
    } else {
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
}

impl LockedFile for File {
    /// The value at `key`, if there is one.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<Bytes>, String> {
        // SAFETY: the key's bytes outlive the call; the result is the caller's to free.
        match unsafe { (self.api.fetch)(self.handle, Datum::of(key)?) }.take() {
            Some(value) => Ok(Some(Bytes::from_owner(value))),
            // SAFETY: the library's own errno slot. No value is an error unless the key is missing.
            None if unsafe { *(self.api.errno_location)() } == ITEM_NOT_FOUND => Ok(None),
            None => Err(self.error()),
        }
    }

    /// Stores `value` at `key` and syncs the file to disk.
    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        // SAFETY: both slices outlive the call; the library copies them.
        if unsafe { (self.api.store)(self.handle, Datum::of(key)?, Datum::of(value)?, REPLACE) } != 0 {
            return Err(self.error());
        }
        self.sync()
    }

    /// Removes `key` and syncs; nothing there is no error.
    fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        // SAFETY: as for fetch. -1 is also "no such key", which is no error here.
        let _ = unsafe { (self.api.delete)(self.handle, Datum::of(key)?) };
        self.sync()
    }

    /// Every key, in the file's hash order. A damaged file can make the library list keys again
    /// without end, or stop early: a key listed twice, or an end that is not "no more keys",
    /// fails.
    fn keys(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let mut keys = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // SAFETY: each datum the library returns is freed once, after the next call used it.
        let mut key = unsafe { (self.api.firstkey)(self.handle) };
        while !key.dptr.is_null() {
            let next = unsafe { (self.api.nextkey)(self.handle, key) };
            if let Some(key) = key.take().map(|key| key.as_ref().to_vec()) {
                if !seen.insert(key.clone()) {
                    drop(next.take());
                    return Err(format!("damaged: key {:?} listed twice", String::from_utf8_lossy(&key)));
                }
                keys.push(key);
            }
            key = next;
        }
        // SAFETY: the library's own errno slot.
        match unsafe { *(self.api.errno_location)() } {
            ITEM_NOT_FOUND => Ok(keys),
            _ => Err(format!("damaged: listing its keys: {}", self.error())),
        }
    }

    /// From the file's buckets ([`super::layout`]), where its format is the one known there.
    fn places(&mut self) -> Option<Places> {
        let read = |buf: &mut [u8], at: u64| self.descriptor()?.read_exact_at(buf, at);
        match self.len().map_err(|e| e.to_string()).and_then(|len| super::layout::places(len, read)) {
            Ok(places) => Some(places),
            Err(why) => {
                log::info!("GNU dbm: values read through the library, whole: {why}");
                None
            }
        }
    }

    /// With `pread` on the library's own descriptor of the file (a descriptor of this process's
    /// own would, closed, give up the library's lock where that is an fcntl lock).
    fn read_placed(&mut self, place: &Range<u64>, from: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.descriptor()?.read_exact_at(buf, place.start + from)
    }
}

impl File {
    /// The library's descriptor of the file, as a file that is never closed here.
    fn descriptor(&self) -> std::io::Result<std::mem::ManuallyDrop<std::fs::File>> {
        // SAFETY: a live handle.
        let fd = unsafe { (self.api.fdesc)(self.handle) };
        if fd < 0 {
            return Err(std::io::Error::other("GNU dbm gave no descriptor"));
        }
        // SAFETY: the handle's descriptor, open while the handle lives; never closed here.
        Ok(std::mem::ManuallyDrop::new(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    /// The file's length.
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.descriptor()?.metadata()?.len())
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // SAFETY: opened in open, closed once.
        unsafe { (self.api.close)(self.handle) };
    }
}
