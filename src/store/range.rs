//! A range of another file as a file of its own: a referenced chunk (kerchunk, Icechunk's virtual
//! and native chunks), read in place from the version of the file opened. The caller checks that
//! the range lies in the file; a file shorter than that when read is EIO, never a short chunk.

use std::ops::Range;

use super::read_only::damaged;
use super::{Attr, Need, Object, Result};

/// A range of another file, opened: reads are reads of that range of the file version opened.
#[derive(Debug)]
pub struct RangeObject {
    attr: Attr,
    range: Range<u64>,
    target: Box<dyn Object>,
    place: String,
}

impl RangeObject {
    /// `range` of `target`, whose attributes are `attr` (its size the range's length).
    pub fn new(attr: Attr, range: Range<u64>, target: Box<dyn Object>, place: String) -> Self {
        RangeObject { attr, range, target, place }
    }

    /// The part of `len` bytes at `offset` that the range holds, as a range of the target.
    fn in_target(&self, offset: u64, len: u64) -> Range<u64> {
        let end = offset.saturating_add(len).min(self.attr.size);
        self.range.start + offset.min(end)..self.range.start + end
    }
}

impl Object for RangeObject {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let range = self.in_target(offset, buf.len() as u64);
        let n = (range.end - range.start) as usize;
        let mut filled = 0;
        while filled < n {
            match self.target.read_at(&mut buf[filled..n], range.start + filled as u64)? {
                0 => return Err(damaged(self.place.clone(), "the file it refers to is shorter than it was")),
                read => filled += read,
            }
        }
        Ok(n)
    }

    fn place(&self) -> String {
        self.place.clone()
    }

    fn will_need(&self, range: Range<u64>, need: Need) {
        self.target.will_need(self.in_target(range.start, range.end.saturating_sub(range.start)), need);
    }

    fn prefetch(&self, range: Range<u64>) {
        self.target.prefetch(self.in_target(range.start, range.end.saturating_sub(range.start)));
    }
}
