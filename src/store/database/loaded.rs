//! C libraries of databases loaded when a database of theirs is first opened (LevelDB, GNU dbm, Kyoto Cabinet, Berkeley DB):
//! the binary links none of them, so that machines without one run every other store, and a
//! mount of its database there fails with one line saying what to install.

/// The first of `names` (file names, newest soname first) that loads; the error names `what`
/// and the Debian `package` that has it.
pub fn library(names: &[&str], what: &str, package: &str) -> Result<libloading::Library, String> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: these libraries' initialisers only set up their own statics.
        match unsafe { libloading::Library::new(*name) } {
            Ok(library) => return Ok(library),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!("{what}'s library is not installed (apt-get install {package}): {}", tried.join("; ")))
}

/// The function `$name` of `$library`, of the type the place it is put in wants, or an error
/// naming it (`$what` names the library).
macro_rules! symbol {
    ($library:expr, $what:literal, $name:literal) => {
        // SAFETY: the type is the one the library's header declares for this name.
        *unsafe { $library.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}'s library lacks {}: {e}", $what, $name))?
    };
}
pub(crate) use symbol;

/// Bytes a library allocated and handed to its caller, given back with the library's own `free`
/// when the last [`bytes::Bytes`] of them is dropped: a value is served as the library gave it,
/// not copied out first (a copy of a value of 1 MiB is also 256 fresh pages to fault in).
pub struct Allocated {
    pointer: std::ptr::NonNull<u8>,
    len: usize,
    free: unsafe extern "C" fn(*mut std::ffi::c_void),
}

impl Allocated {
    /// The `len` bytes at `pointer`, `None` when it is null.
    ///
    /// # Safety
    /// The library allocated `len` bytes at `pointer` for the caller, to be freed once with
    /// `free` and not touched by the library meanwhile.
    pub unsafe fn new(pointer: *mut u8, len: usize, free: unsafe extern "C" fn(*mut std::ffi::c_void)) -> Option<Self> {
        std::ptr::NonNull::new(pointer).map(|pointer| Allocated { pointer, len, free })
    }
}

impl AsRef<[u8]> for Allocated {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `new`'s contract: len bytes, ours until dropped.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.len) }
    }
}

impl Drop for Allocated {
    fn drop(&mut self) {
        // SAFETY: freed once, with the library's own function.
        unsafe { (self.free)(self.pointer.as_ptr().cast()) }
    }
}

// SAFETY: the bytes are only read, and a library's free may be called from any thread.
unsafe impl Send for Allocated {}
unsafe impl Sync for Allocated {}
