//! The values a database store read last, kept for the reads that follow each: a chunk file is
//! looked up, then read in pieces while the next files are fetched ahead, and a library that
//! gives a value only whole (GNU dbm, Kyoto Cabinet, Berkeley DB), or one that decompresses its
//! block at every look (LevelDB), would otherwise read it whole again for each. A write or
//! removal of a key must [`Recent::forget`] it.

use std::collections::VecDeque;

use bytes::Bytes;

/// Values kept once read, at most: the one a reader is in, and those fetched ahead of it (up
/// to 32 chunk files, `view::read_ahead`), a value of more than 8 MiB in more than one GET.
pub const KEPT_VALUES: usize = 40;
/// Bytes of values kept, at most, unless the newest alone is more. Mostly the same bytes as the
/// fetcher holds of them (a value is served as slices of it), not a copy.
pub const KEPT_BYTES: usize = 128 << 20;

/// The values last read, newest last, until pushed out or forgotten.
#[derive(Default)]
pub struct Recent(VecDeque<(String, Bytes)>);

impl Recent {
    /// The value kept for `key`, which becomes the newest: a reader still in it keeps it while
    /// files are fetched ahead.
    pub fn get(&mut self, key: &str) -> Option<Bytes> {
        let at = self.0.iter().position(|(kept, _)| kept == key)?;
        let kept = self.0.remove(at)?;
        let value = kept.1.clone();
        self.0.push_back(kept);
        Some(value)
    }

    /// Keeps `value`, read for `key`, pushing out the oldest beyond the bounds.
    pub fn keep(&mut self, key: &str, value: Bytes) {
        self.forget(key);
        self.0.push_back((key.to_string(), value));
        let mut bytes: usize = self.0.iter().map(|(_, v)| v.len()).sum();
        while self.0.len() > KEPT_VALUES || (self.0.len() > 1 && bytes > KEPT_BYTES) {
            bytes -= self.0.pop_front().map_or(0, |(_, v)| v.len());
        }
    }

    /// `key` is written or removed: a value kept for it is no longer its value.
    pub fn forget(&mut self, key: &str) {
        self.0.retain(|(kept, _)| kept != key);
    }
}
