//! Parsers of other crates run on bytes from disk or network (Icechunk's flatbuffers through
//! `icechunk-format`, kerchunk's parquet record files through `parquet`). They trust what their
//! own checks passed, and some panic on damaged input (both were found to by cutting and changing
//! test files); a panic must cost the file it was reading, never the daemon.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// What `parse` returns, or `None` when it panicked.
pub fn caught<T>(parse: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(parse)).ok()
}
