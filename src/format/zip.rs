//! The zip format's directory as pure functions over bytes (PKWARE APPNOTE 6.3): the end of
//! central directory record and its ZIP64 locator and record, the central directory's entries
//! (with their ZIP64 extra fields), and the local header that says where an entry's data starts.
//! Reading the bytes is the store's business ([`crate::store::zip`]); nothing here does I/O, and
//! every length and offset read from the bytes is checked before it is used.

use std::ops::Range;

/// Why a zip file cannot be read, or one of its entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ZipError(pub String);

fn damaged(why: impl Into<String>) -> ZipError {
    ZipError(why.into())
}

pub type Result<T> = std::result::Result<T, ZipError>;

const END_SIGNATURE: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIGNATURE: u32 = 0x0706_4b50;
const ZIP64_END_SIGNATURE: u32 = 0x0606_4b50;
const CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const LOCAL_SIGNATURE: u32 = 0x0403_4b50;

/// The end of central directory record's fixed part.
const END_LEN: u64 = 22;
const ZIP64_LOCATOR_LEN: u64 = 20;
/// The ZIP64 end of central directory record's fixed part.
pub const ZIP64_END_LEN: u64 = 56;
const CENTRAL_LEN: usize = 46;
/// A local header's fixed part; the entry's name and extra field follow it.
pub const LOCAL_LEN: u64 = 30;

/// How many bytes at the end of a file hold its end records, at most: the end of central
/// directory record with the longest comment, and the ZIP64 locator before it.
pub const TAIL_LEN: u64 = END_LEN + u16::MAX as u64 + ZIP64_LOCATOR_LEN;

/// Entry flag: the entry is encrypted.
const ENCRYPTED: u16 = 1;

/// Compression methods.
pub const STORED: u16 = 0;
pub const DEFLATED: u16 = 8;

/// Where the central directory is, as the end records say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryPlace {
    pub range: Range<u64>,
    pub entries: u64,
}

/// What the last bytes of a file say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The central directory's place.
    Directory(DirectoryPlace),
    /// A ZIP64 file: its ZIP64 end record is at this offset (read it with [`zip64_end`]); the
    /// central directory ends where that record starts or before.
    Zip64At(u64),
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// Reads the end records from `tail`, the last bytes of a file `file_len` long (up to
/// [`TAIL_LEN`] of them). The end record is the last one whose comment reaches exactly to the end
/// of the file, so that a comment holding the signature is not taken for it.
pub fn end(tail: &[u8], file_len: u64) -> Result<End> {
    let tail_at = file_len.checked_sub(tail.len() as u64).ok_or_else(|| damaged("tail longer than the file"))?;
    if (tail.len() as u64) < END_LEN {
        return Err(damaged(format!("{file_len} bytes, too short for a zip file")));
    }
    let found = (0..=tail.len() - END_LEN as usize).rev().find(|&at| {
        u32_at(tail, at) == END_SIGNATURE && at + END_LEN as usize + u16_at(tail, at + 20) as usize == tail.len()
    });
    let Some(at) = found else {
        return Err(damaged("no end of central directory record: not a zip file, or one cut short"));
    };
    let record = &tail[at..];
    let entries = u16_at(record, 10) as u64;
    let size = u32_at(record, 12) as u64;
    let offset = u32_at(record, 16) as u64;
    let locator_at = at.checked_sub(ZIP64_LOCATOR_LEN as usize);
    if let Some(locator) = locator_at.map(|l| &tail[l..at])
        && u32_at(locator, 0) == ZIP64_LOCATOR_SIGNATURE
    {
        let zip64_at = u64_at(locator, 8);
        let locator_offset = tail_at + locator_at.expect("found") as u64;
        if zip64_at.checked_add(ZIP64_END_LEN).is_none_or(|end| end > locator_offset) {
            return Err(damaged(format!("ZIP64 end record at {zip64_at}, past its locator at {locator_offset}")));
        }
        return Ok(End::Zip64At(zip64_at));
    }
    if entries == u16::MAX as u64 || size == u32::MAX as u64 || offset == u32::MAX as u64 {
        return Err(damaged("ZIP64 sizes without a ZIP64 end record locator"));
    }
    place(offset, size, entries, tail_at + at as u64)
}

/// The central directory's place, checked to end before `limit` (where the end records start).
fn place(offset: u64, size: u64, entries: u64, limit: u64) -> Result<End> {
    match offset.checked_add(size) {
        Some(end) if end <= limit => Ok(End::Directory(DirectoryPlace { range: offset..end, entries })),
        _ => Err(damaged(format!(
            "central directory at {offset} of {size} bytes runs past its end record at {limit}: truncated"
        ))),
    }
}

/// Reads the ZIP64 end of central directory record `record` (at least [`ZIP64_END_LEN`] bytes)
/// found at offset `at`.
pub fn zip64_end(record: &[u8], at: u64) -> Result<DirectoryPlace> {
    if (record.len() as u64) < ZIP64_END_LEN || u32_at(record, 0) != ZIP64_END_SIGNATURE {
        return Err(damaged(format!("no ZIP64 end of central directory record at {at}")));
    }
    match place(u64_at(record, 48), u64_at(record, 40), u64_at(record, 32), at)? {
        End::Directory(place) => Ok(place),
        End::Zip64At(_) => unreachable!("place makes directories"),
    }
}

/// One entry of the central directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name as stored (`/`-separated; a directory's ends in `/`); not UTF-8: lossily decoded,
    /// and `utf8` false.
    pub name: String,
    pub utf8: bool,
    pub method: u16,
    pub encrypted: bool,
    pub crc32: u32,
    pub compressed_size: u64,
    pub size: u64,
    /// Where the entry's local header is.
    pub local_header: u64,
}

/// Parses the central directory `bytes`, which the end records say holds `expected` entries.
pub fn central_directory(bytes: &[u8], expected: u64) -> Result<Vec<Entry>> {
    let mut entries = Vec::with_capacity(expected.min(bytes.len() as u64 / CENTRAL_LEN as u64) as usize);
    let mut at = 0;
    while at < bytes.len() {
        let n = entries.len();
        let header = bytes.get(at..at + CENTRAL_LEN).filter(|h| u32_at(h, 0) == CENTRAL_SIGNATURE);
        let Some(header) = header else {
            return Err(damaged(format!("central directory entry {n} at byte {at} of it is not one: truncated")));
        };
        let (name_len, extra_len, comment_len) =
            (u16_at(header, 28) as usize, u16_at(header, 30) as usize, u16_at(header, 32) as usize);
        let name_at = at + CENTRAL_LEN;
        let next = name_at + name_len + extra_len + comment_len;
        if next > bytes.len() {
            return Err(damaged(format!("central directory entry {n} runs past the directory's end: truncated")));
        }
        let raw_name = &bytes[name_at..name_at + name_len];
        let (name, utf8) = match std::str::from_utf8(raw_name) {
            Ok(name) => (name.to_string(), true),
            Err(_) => (String::from_utf8_lossy(raw_name).into_owned(), false),
        };
        let mut entry = Entry {
            name,
            utf8,
            method: u16_at(header, 10),
            encrypted: u16_at(header, 8) & ENCRYPTED != 0,
            crc32: u32_at(header, 16),
            compressed_size: u32_at(header, 20) as u64,
            size: u32_at(header, 24) as u64,
            local_header: u32_at(header, 42) as u64,
        };
        zip64_extra(&mut entry, &bytes[name_at + name_len..name_at + name_len + extra_len])?;
        entries.push(entry);
        at = next;
    }
    if entries.len() as u64 != expected {
        return Err(damaged(format!(
            "central directory holds {} entries where its end record says {expected}: truncated",
            entries.len()
        )));
    }
    Ok(entries)
}

/// Takes the 64-bit sizes and offset of `entry` from its ZIP64 extra field (id 1), each present
/// only where the 32-bit field is all ones, in the order size, compressed size, offset.
fn zip64_extra(entry: &mut Entry, mut extra: &[u8]) -> Result<()> {
    while extra.len() >= 4 {
        let (id, len) = (u16_at(extra, 0), u16_at(extra, 2) as usize);
        let Some(data) = extra.get(4..4 + len) else {
            return Err(damaged(format!("{}: extra field runs past its end", entry.name)));
        };
        if id == 1 {
            let mut values = data.chunks_exact(8).map(|v| u64_at(v, 0));
            for field in [&mut entry.size, &mut entry.compressed_size, &mut entry.local_header] {
                if *field == u32::MAX as u64 {
                    *field =
                        values.next().ok_or_else(|| damaged(format!("{}: ZIP64 extra field too short", entry.name)))?;
                }
            }
        }
        extra = &extra[4 + len..];
    }
    Ok(())
}

/// The fixed part of a local header, read: how long its name and extra field are.
pub fn local_header_lengths(header: &[u8], entry: &Entry) -> Result<(u64, u64)> {
    if (header.len() as u64) < LOCAL_LEN || u32_at(header, 0) != LOCAL_SIGNATURE {
        return Err(damaged(format!("no local header at {}", entry.local_header)));
    }
    Ok((u16_at(header, 26) as u64, u16_at(header, 28) as u64))
}

/// Where the data of `entry` starts, from its local header `header` (the fixed part and at least
/// the name), checked to name the same entry, in a file whose central directory starts at
/// `directory_at`: the data must end before it.
pub fn data_start(header: &[u8], entry: &Entry, directory_at: u64) -> Result<u64> {
    let (name_len, extra_len) = local_header_lengths(header, entry)?;
    let name = header.get(LOCAL_LEN as usize..(LOCAL_LEN + name_len) as usize);
    if name.is_none_or(|name| String::from_utf8_lossy(name) != entry.name) {
        return Err(damaged(format!("its local header at {} names another entry", entry.local_header)));
    }
    let start = entry.local_header + LOCAL_LEN + name_len + extra_len;
    match start.checked_add(entry.compressed_size) {
        Some(end) if end <= directory_at => Ok(start),
        _ => Err(damaged(format!(
            "its {} bytes at {start} run past the entries' end at {directory_at}",
            entry.compressed_size
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zip of `files` (name, data), stored, written as the format says (with ZIP64 records
    /// and extra fields when `zip64`).
    fn zip(files: &[(&str, &[u8])], zip64: bool, comment: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in files {
            let at = out.len() as u64;
            let crc = crc32fast::hash(data);
            out.extend(LOCAL_SIGNATURE.to_le_bytes());
            out.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend(crc.to_le_bytes());
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((name.len() as u16).to_le_bytes());
            out.extend(0u16.to_le_bytes());
            out.extend(name.as_bytes());
            out.extend(*data);
            central.extend(CENTRAL_SIGNATURE.to_le_bytes());
            central.extend([45, 3, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            central.extend(crc.to_le_bytes());
            let (small, extra): (u32, Vec<u8>) = if zip64 {
                let mut extra = vec![1, 0, 24, 0];
                for value in [data.len() as u64, data.len() as u64, at] {
                    extra.extend(value.to_le_bytes());
                }
                (u32::MAX, extra)
            } else {
                (data.len() as u32, Vec::new())
            };
            central.extend(small.to_le_bytes());
            central.extend(small.to_le_bytes());
            central.extend((name.len() as u16).to_le_bytes());
            central.extend((extra.len() as u16).to_le_bytes());
            // Comment length, disk, internal and external attributes.
            central.extend([0; 10]);
            central.extend(if zip64 { u32::MAX } else { at as u32 }.to_le_bytes());
            central.extend(name.as_bytes());
            central.extend(extra);
        }
        let (dir_at, dir_len) = (out.len() as u64, central.len() as u64);
        out.extend(central);
        if zip64 {
            let record_at = out.len() as u64;
            out.extend(ZIP64_END_SIGNATURE.to_le_bytes());
            out.extend(44u64.to_le_bytes());
            out.extend([45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend((files.len() as u64).to_le_bytes());
            out.extend((files.len() as u64).to_le_bytes());
            out.extend(dir_len.to_le_bytes());
            out.extend(dir_at.to_le_bytes());
            out.extend(ZIP64_LOCATOR_SIGNATURE.to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend(record_at.to_le_bytes());
            out.extend(1u32.to_le_bytes());
        }
        out.extend(END_SIGNATURE.to_le_bytes());
        out.extend([0; 4]);
        let count = if zip64 { u16::MAX } else { files.len() as u16 };
        out.extend(count.to_le_bytes());
        out.extend(count.to_le_bytes());
        out.extend(if zip64 { u32::MAX } else { dir_len as u32 }.to_le_bytes());
        out.extend(if zip64 { u32::MAX } else { dir_at as u32 }.to_le_bytes());
        out.extend((comment.len() as u16).to_le_bytes());
        out.extend(comment);
        out
    }

    /// Every entry's data, read as the store reads it.
    fn read_all(file: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
        let len = file.len() as u64;
        let tail = &file[len.saturating_sub(TAIL_LEN) as usize..];
        let place = match end(tail, len)? {
            End::Directory(place) => place,
            End::Zip64At(at) => zip64_end(&file[at as usize..], at)?,
        };
        let entries = central_directory(&file[place.range.start as usize..place.range.end as usize], place.entries)?;
        entries
            .iter()
            .map(|e| {
                // The store reads a header only where it ends before the central directory.
                let header = file.get(e.local_header as usize..place.range.start as usize).unwrap_or_default();
                let start = data_start(header, e, place.range.start)? as usize;
                Ok((e.name.clone(), file[start..start + e.compressed_size as usize].to_vec()))
            })
            .collect()
    }

    #[test]
    fn reads_plain_and_zip64_files_with_comments() {
        let files: &[(&str, &[u8])] = &[("zarr.json", b"{}"), ("a/c/0", b"chunk bytes"), ("a/", b"")];
        for zip64 in [false, true] {
            for comment in [&b""[..], b"PK\x05\x06 a comment holding the signature"] {
                let read = read_all(&zip(files, zip64, comment)).unwrap();
                let expected: Vec<_> = files.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect();
                assert_eq!(read, expected, "zip64 {zip64}");
            }
        }
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let file = zip(&[("zarr.json", b"{}"), ("c/0", b"0123456789")], true, b"");
        // Every truncation and every single byte changed: an error or a correct reading.
        for cut in 0..file.len() {
            let _ = read_all(&file[..cut]);
            let mut changed = file.clone();
            changed[cut] ^= 0xff;
            let _ = read_all(&changed);
        }
        assert!(read_all(&file[..file.len() - 1]).is_err());
        assert!(read_all(b"not a zip").is_err());
    }

    #[test]
    fn a_truncated_directory_and_a_bad_local_header_are_named() {
        let file = zip(&[("zarr.json", b"{}"), ("c/0", b"0123456789")], false, b"");
        let len = file.len() as u64;
        let End::Directory(place) = end(&file, len).unwrap() else { panic!("not zip64") };
        let bytes = &file[place.range.start as usize..place.range.end as usize];
        let err = central_directory(&bytes[..bytes.len() - 5], 2).unwrap_err();
        assert!(err.0.contains("truncated"), "{err}");
        let entries = central_directory(bytes, 2).unwrap();
        let err = data_start(&file[entries[0].local_header as usize + 1..], &entries[0], place.range.start);
        assert!(err.unwrap_err().0.contains("no local header"));
        let mut past = entries[1].clone();
        past.compressed_size = 1 << 40;
        let err = data_start(&file[past.local_header as usize..], &past, place.range.start).unwrap_err();
        assert!(err.0.contains("run past"), "{err}");
    }
}
