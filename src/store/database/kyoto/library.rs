//! Kyoto Cabinet's C API (`kclangc.h`), from Debian's `libkyotocabinet16v5`, loaded when a Kyoto
//! Cabinet file is first opened ([`loaded`]).
//!
//! Only what [`super`] calls, each wrapped so that the rest of the store sees Rust types.
//!
//! Values are read through a visitor (`kcdbaccept`), copied from the library's record into a
//! [`Buffer`] used again, rather than taken as `kcdbget` allocates them: the library reads a
//! record's whole body into memory of its own at every look, even for its key alone, and a
//! second fresh allocation of each value was a page fault per 4 KiB. For the same reason the
//! listing learns each value's size as it goes (`kcdbiterate`), and a size asked for later is
//! answered from it, not by reading the value again.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

use bytes::Bytes;

use crate::store::database::buffers::Buffer;
use crate::store::database::keyed_file::{LockedFile, Measured, Places};
use crate::store::database::loaded::{self, symbol};

/// The library's file names, newest soname first.
const NAMES: [&str; 2] = ["libkyotocabinet.so.16", "libkyotocabinet.so"];

const READER: u32 = 1 << 0;
const WRITER: u32 = 1 << 1;
/// Fail at once, rather than wait, when another process holds the file's lock.
const TRY_LOCK: u32 = 1 << 7;
/// A byte whose address stands for an empty value's.
static NOTHING: [u8; 1] = [0];

#[repr(C)]
struct Db(c_void);

/// A visitor of a record that is there (`KCVISITFULL`): the key, the value, and the `opq` given.
type VisitFull =
    unsafe extern "C" fn(*const c_char, usize, *const c_char, usize, *mut usize, *mut c_void) -> *const c_char;
/// A visitor of a key that is not there (`KCVISITEMPTY`).
type VisitEmpty = unsafe extern "C" fn(*const c_char, usize, *mut usize, *mut c_void) -> *const c_char;

struct Api {
    new: unsafe extern "C" fn() -> *mut Db,
    del: unsafe extern "C" fn(*mut Db),
    open: unsafe extern "C" fn(*mut Db, *const c_char, u32) -> i32,
    close: unsafe extern "C" fn(*mut Db) -> i32,
    accept: unsafe extern "C" fn(*mut Db, *const c_char, usize, VisitFull, VisitEmpty, *mut c_void, i32) -> i32,
    iterate: unsafe extern "C" fn(*mut Db, VisitFull, *mut c_void, i32) -> i32,
    set: unsafe extern "C" fn(*mut Db, *const c_char, usize, *const c_char, usize) -> i32,
    remove: unsafe extern "C" fn(*mut Db, *const c_char, usize) -> i32,
    sync: unsafe extern "C" fn(*mut Db, i32, *const c_void, *mut c_void) -> i32,
    emsg: unsafe extern "C" fn(*mut Db) -> *const c_char,
    /// `KCVISNOP`, the address a visitor returns to leave a record as it is.
    no_change: usize,
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
        accept: symbol!(library, "Kyoto Cabinet", "kcdbaccept"),
        iterate: symbol!(library, "Kyoto Cabinet", "kcdbiterate"),
        set: symbol!(library, "Kyoto Cabinet", "kcdbset"),
        remove: symbol!(library, "Kyoto Cabinet", "kcdbremove"),
        sync: symbol!(library, "Kyoto Cabinet", "kcdbsync"),
        emsg: symbol!(library, "Kyoto Cabinet", "kcdbemsg"),
        no_change: {
            let place: *const *const c_char = symbol!(library, "Kyoto Cabinet", "KCVISNOP");
            // SAFETY: the library's constant, set before it was loaded and never changed.
            unsafe { *place as usize }
        },
        _library: library,
    })
}

/// An open Kyoto Cabinet file.
pub struct File {
    api: &'static Api,
    db: *mut Db,
    /// The size of each value, as the listing found it and this handle's writes changed it.
    sizes: HashMap<Vec<u8>, u64>,
    /// A file opened as a reader: a descriptor of its own to read values where [`super::layout`]
    /// places them, kept open as long as the library's (closing any descriptor of a file gives up
    /// this process's fcntl locks on it), and whether it is a tree file.
    own: Option<(std::fs::File, bool)>,
    /// The places found by the listing, until [`LockedFile::places`] takes them.
    places: Option<Places>,
}

// SAFETY: a database object may move between threads; it is used by one at a time (not Sync).
unsafe impl Send for File {}

impl File {
    /// Opens the file at `path` of `kind` (`kch` or `kct`, given to the library as
    /// `FILE#type=KIND`) as its writer or a reader, failing at once when another process holds it.
    pub fn open(path: &Path, kind: &str, writer: bool) -> Result<File, String> {
        let api = api()?;
        let name = CString::new(format!("{}#type={kind}", path.display())).map_err(|e| e.to_string())?;
        // SAFETY: a new object, deleted on drop (or here when the open fails).
        let mut file = File { api, db: unsafe { (api.new)() }, sizes: HashMap::new(), own: None, places: None };
        // Opened before the library opens the path, and kept only if the path still names the
        // same file after: then the library's lock is on the file this descriptor reads.
        let own = if writer { None } else { std::fs::File::open(path).ok() };
        let mode = if writer { WRITER } else { READER } | TRY_LOCK;
        if unsafe { (api.open)(file.db, name.as_ptr(), mode) } == 0 {
            return Err(file.error());
        }
        let same = |own: &std::fs::File| {
            use std::os::unix::fs::MetadataExt;
            let (Ok(held), Ok(named)) = (own.metadata(), std::fs::metadata(path)) else { return false };
            (held.dev(), held.ino()) == (named.dev(), named.ino())
        };
        file.own = own.filter(same).map(|own| (own, kind == "kct"));
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
        let mut found = Found { value: None, no_change: self.api.no_change };
        // SAFETY: the key and `found` outlive the call, which calls one of the visitors with
        // `found` as their `opq`, read-only (writable 0).
        let accepted = unsafe {
            (self.api.accept)(self.db, key.as_ptr().cast(), key.len(), copy_value, missing, (&raw mut found).cast(), 0)
        };
        if accepted == 0 {
            return Err(self.error());
        }
        Ok(found.value.map(Buffer::into_bytes))
    }

    fn measure(&mut self, key: &[u8]) -> Result<Option<Measured>, String> {
        match self.sizes.get(key) {
            Some(size) => Ok(Some(Measured::Size(*size))),
            None => Ok(self.fetch(key)?.map(Measured::Value)),
        }
    }

    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        // The library stores a value through a visitor, which returns the address 1 to remove the
        // record (`Visitor::REMOVE`): an empty slice's address is 1, and storing it removed the key.
        let at = if value.is_empty() { NOTHING.as_ptr() } else { value.as_ptr() };
        // SAFETY: both slices outlive the call (`at` is `value`'s, or a static's for none); the
        // library copies them.
        let set = unsafe { (self.api.set)(self.db, key.as_ptr().cast(), key.len(), at.cast(), value.len()) };
        if set == 0 {
            return Err(self.error());
        }
        self.sizes.insert(key.to_vec(), value.len() as u64);
        self.sync()
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        // SAFETY: as for fetch. 0 is also "no record", which is no error here.
        let _ = unsafe { (self.api.remove)(self.db, key.as_ptr().cast(), key.len()) };
        self.sizes.remove(key);
        self.sync()
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, String> {
        if let Some((own, tree)) = &self.own {
            let len = own.metadata().map_err(|e| e.to_string());
            match len.and_then(|meta| super::layout::places(own, meta.len(), *tree)) {
                Ok(places) => {
                    self.sizes = places.iter().map(|(key, place)| (key.clone(), place.end - place.start)).collect();
                    let keys = places.keys().cloned().collect();
                    self.places = Some(places);
                    return Ok(keys);
                }
                Err(why) => log::info!("Kyoto Cabinet: values read through the library, whole: {why}"),
            }
        }
        let mut listed = Listed { sizes: HashMap::new(), no_change: self.api.no_change };
        // SAFETY: `listed` outlives the call, which passes it to the visitor as `opq`, read-only.
        if unsafe { (self.api.iterate)(self.db, list_record, (&raw mut listed).cast(), 0) } == 0 {
            return Err(self.error());
        }
        self.sizes = listed.sizes;
        Ok(self.sizes.keys().cloned().collect())
    }

    /// A read-only file's, from its records ([`super::layout`]) when the listing found them
    /// all: the library lists keys only by reading every value, so its listing is not asked for
    /// these (the layout checks the records' count against the header's instead).
    fn places(&mut self) -> Option<Places> {
        self.places.take()
    }

    fn read_placed(&mut self, place: &Range<u64>, from: u64, buf: &mut [u8]) -> std::io::Result<()> {
        match &self.own {
            Some((own, _)) => own.read_exact_at(buf, place.start + from),
            None => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }
}

/// What [`copy_value`] found.
struct Found {
    value: Option<Buffer>,
    no_change: usize,
}

/// Copies the value visited into a [`Buffer`] of [`Found`] (`opq`).
unsafe extern "C" fn copy_value(
    _key: *const c_char,
    _key_len: usize,
    value: *const c_char,
    len: usize,
    _new_len: *mut usize,
    found: *mut c_void,
) -> *const c_char {
    // SAFETY: `fetch` passes its `Found`; the library's value is `len` bytes, valid during the call.
    let found = unsafe { &mut *found.cast::<Found>() };
    let mut buffer = Buffer::of(len);
    if len > 0 {
        buffer.copy_from_slice(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), len) });
    }
    found.value = Some(buffer);
    found.no_change as *const c_char
}

/// A key with no record: [`Found`] stays empty.
unsafe extern "C" fn missing(
    _key: *const c_char,
    _len: usize,
    _new_len: *mut usize,
    found: *mut c_void,
) -> *const c_char {
    // SAFETY: `fetch` passes its `Found`.
    unsafe { &*found.cast::<Found>() }.no_change as *const c_char
}

/// The keys and value sizes [`list_record`] saw.
struct Listed {
    sizes: HashMap<Vec<u8>, u64>,
    no_change: usize,
}

/// Notes the record visited, its key and its value's size, in [`Listed`] (`opq`).
unsafe extern "C" fn list_record(
    key: *const c_char,
    key_len: usize,
    _value: *const c_char,
    len: usize,
    _new_len: *mut usize,
    listed: *mut c_void,
) -> *const c_char {
    // SAFETY: `keys` passes its `Listed`; the key is `key_len` bytes, valid during the call.
    let listed = unsafe { &mut *listed.cast::<Listed>() };
    let key = if key_len == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(key.cast::<u8>(), key_len) }.to_vec()
    };
    listed.sizes.insert(key, len as u64);
    listed.no_change as *const c_char
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
