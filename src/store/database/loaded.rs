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
