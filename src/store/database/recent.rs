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
/// fetcher holds of them (most of a value is served as a slice of it, [`Recent::piece`]).
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

    /// Bytes `range` of `value`, a value kept: a slice where it is most of the value, else a
    /// copy, so that a small piece held by a reader (the fetcher counts pieces by their length)
    /// does not hold the whole value in memory.
    pub fn piece(value: &Bytes, range: std::ops::Range<usize>) -> Bytes {
        if range.len() >= value.len() / 2 { value.slice(range) } else { Bytes::copy_from_slice(&value[range]) }
    }

    /// `key` is written or removed: a value kept for it is no longer its value.
    pub fn forget(&mut self, key: &str) {
        self.0.retain(|(kept, _)| kept != key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_piece_is_a_copy_and_most_of_a_value_a_slice() {
        let value = Bytes::from(vec![7u8; 1 << 20]);
        let inside = |piece: &Bytes| value.as_ptr_range().contains(&piece.as_ptr());
        let small = Recent::piece(&value, 4096..8192);
        assert!(!inside(&small) && small[..] == value[4096..8192], "a reader holding it holds 4 KiB, not 1 MiB");
        let most = Recent::piece(&value, 0..value.len());
        assert!(inside(&most) && most.len() == value.len());
    }

    #[test]
    fn values_kept_are_bounded_and_forgotten() {
        let mut recent = Recent::default();
        for i in 0..KEPT_VALUES + 5 {
            recent.keep(&i.to_string(), Bytes::from_static(b"x"));
        }
        assert!(recent.get("0").is_none() && recent.get(&(KEPT_VALUES + 4).to_string()).is_some());
        recent.keep("a", Bytes::from(vec![0; KEPT_BYTES]));
        recent.keep("b", Bytes::from(vec![0; 16]));
        assert!(recent.get("a").is_none(), "past the bytes, the oldest go");
        recent.forget("b");
        assert!(recent.get("b").is_none());
    }
}
