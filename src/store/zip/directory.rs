//! The central directory of one version of a zip file, read once and indexed: which entry each
//! key is, what each directory lists (directories are implied by entry names as well as stored as
//! `dir/` entries), and, found lazily from each entry's local header, where its data starts.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::OnceLock;

use crate::format::zip::{self, DirectoryPlace, End, Entry, LOCAL_LEN, TAIL_LEN, ZIP64_END_LEN, ZipError};
use crate::store::key_tree::KeyTree;
use crate::store::read_only::damaged;
use crate::store::{self, Kind, Object, Stamp};

/// The largest central directory read (about 10 million entries): a bigger one is refused rather
/// than held in memory.
pub const MAX_DIRECTORY: u64 = 1 << 30;

/// One version of a zip file, its central directory read.
#[derive(Debug)]
pub struct Directory {
    /// The zip file, open at the version read.
    pub file: Box<dyn Object>,
    pub entries: Vec<Entry>,
    /// Where the central directory starts: every entry's data ends before it.
    pub directory_at: u64,
    /// The entry of each file key.
    pub files: HashMap<String, usize>,
    /// What each directory key lists (`""`: the root), by name.
    pub dirs: HashMap<String, BTreeMap<String, Kind>>,
    /// Where each entry's data starts, or why it cannot be read, once its local header was read.
    starts: Vec<OnceLock<Result<u64, ZipError>>>,
}

impl Directory {
    /// Reads the end records and the central directory of `file` (two or three reads: the tail,
    /// a ZIP64 end record not in it, and the whole central directory in one piece).
    pub fn read(file: Box<dyn Object>) -> Result<Directory, Failure> {
        let len = file.attr().size;
        let tail_at = len.saturating_sub(TAIL_LEN);
        let tail = file.read_exact_at(tail_at, len - tail_at)?;
        let in_tail = |range: std::ops::Range<u64>| {
            (range.start >= tail_at)
                .then(|| tail[(range.start - tail_at) as usize..(range.end - tail_at) as usize].to_vec())
        };
        let place = match zip::end(&tail, len)? {
            End::Directory(place) => place,
            End::Zip64At(at) => {
                let range = at..at + ZIP64_END_LEN;
                let record = match in_tail(range.clone()) {
                    Some(record) => record,
                    None => file.read_exact_at(at, ZIP64_END_LEN)?,
                };
                zip::zip64_end(&record, at)?
            }
        };
        let DirectoryPlace { range, entries } = place;
        if range.end - range.start > MAX_DIRECTORY {
            let size = range.end - range.start;
            return Err(
                ZipError(format!("central directory of {size} bytes, more than the {MAX_DIRECTORY} read")).into()
            );
        }
        let bytes = match in_tail(range.clone()) {
            Some(bytes) => bytes,
            None => file.read_exact_at(range.start, range.end - range.start)?,
        };
        let entries = zip::central_directory(&bytes, entries)?;
        let place = file.place();
        let names = entries.iter().enumerate().filter_map(|(n, entry)| {
            if !entry.utf8 {
                log::warn!("{place}: entry {:?} is not shown: its name is not UTF-8", entry.name);
            }
            entry.utf8.then_some((n, entry.name.as_str()))
        });
        let KeyTree { files, dirs } = KeyTree::of(names, &place);
        let starts = entries.iter().map(|_| OnceLock::new()).collect();
        Ok(Directory { file, entries, directory_at: range.start, files, dirs, starts })
    }

    pub fn stamp(&self) -> Stamp {
        self.file.attr().stamp
    }

    /// Where the data of entry `n` starts, from its local header (read once, checked to name the
    /// entry, its data to end before the central directory). Damage is logged once; a failed read
    /// of the zip file is not remembered.
    pub fn data_start(&self, n: usize) -> store::Result<u64> {
        let entry = &self.entries[n];
        let place = || format!("{}/{}", self.file.place(), entry.name);
        if let Some(found) = self.starts[n].get() {
            return found.clone().map_err(|e| damaged(place(), e.0));
        }
        let header_len = LOCAL_LEN + entry.name.len() as u64;
        let found = match entry.local_header.checked_add(header_len) {
            Some(end) if end <= self.directory_at => {
                let header = self.file.read_exact_at(entry.local_header, header_len)?;
                zip::data_start(&header, entry, self.directory_at)
            }
            _ => Err(ZipError(format!("its local header at {} is past the entries' end", entry.local_header))),
        };
        if let Err(e) = &found {
            log::warn!("{}: {e}; it reads as EIO", place());
        }
        self.starts[n].get_or_init(|| found).clone().map_err(|e| damaged(place(), e.0))
    }
}

/// Why a zip's directory could not be read: damage in it, or a failed read of the file.
#[derive(Debug)]
pub enum Failure {
    Damaged(ZipError),
    Store(store::Error),
}

impl From<ZipError> for Failure {
    fn from(e: ZipError) -> Self {
        Failure::Damaged(e)
    }
}

impl From<store::Error> for Failure {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof => {
                Failure::Damaged(ZipError("shorter than its records say: truncated".into()))
            }
            e => Failure::Store(e),
        }
    }
}
