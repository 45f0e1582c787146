//! Where a Kyoto Cabinet file keeps each value, read from its records in the order they lie. A
//! hash file (`.kch`, the format of `kchashdb.h`): after the 64-byte header, the free-block pool
//! and the bucket array, records follow one another up to the size the header gives, each a
//! header (its padding's size, the offsets of its neighbours in the bucket's tree, the key's and
//! the value's sizes), the key, the value and its padding; a free block says only its size. A
//! tree file (`.kct`, `kcplantdb.h`) is a hash file whose records are the tree's nodes: `@` its
//! meta data (the count of records at 56), `L` and an id in hex each leaf, whose value is the ids
//! of its neighbours and then its records, each the key's and the value's sizes, the key and the
//! value (`I` the inner nodes, which hold keys only). The library reads a record's whole body
//! into new memory even to give its key (a tree's leaf, then each of its records, copied once
//! more), so a listing through it reads every value; with each value's place known, a listing
//! reads no value and a read takes only the bytes asked for.
//!
//! Only for files the header says were closed cleanly (not open, no fatal error: else the
//! library repairs them at its next writer), with records not compressed, and only when every
//! record and free block is in its place, padded as the format pads it, every leaf read to its
//! end, and the records are as many as the header counts; anything else is an error, and values
//! are read through the library.

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek};
use std::ops::Range;

/// The header's magic bytes, and its type byte for a hash file.
const MAGIC: &[u8; 4] = b"KC\n\0";
const HASH_FILE: u8 = 0x30;
const TREE_FILE: u8 = 0x31;
/// The tree's meta data record (`@`): its length, and where it counts the records.
const TREE_META_LEN: u64 = 80;
const TREE_COUNT_AT: u64 = 56;
/// The most bytes a number of variable length takes.
const VARNUM_MAX: usize = 10;
const HEADER_LEN: usize = 64;
/// Header offsets (`MOFF*`): the type, the alignment's power of 2, the free-block pool's, the
/// options, the bucket count, the flags, the record count, the file's logical size.
const TYPE_AT: usize = 8;
const ALIGNMENT_AT: usize = 9;
const FREE_POOL_AT: usize = 10;
const OPTIONS_AT: usize = 11;
const BUCKETS_AT: usize = 16;
const FLAGS_AT: usize = 24;
const COUNT_AT: usize = 32;
const SIZE_AT: usize = 40;
/// Options: 32-bit offsets, one child per record (a list, not a tree), compressed records.
const SMALL: u8 = 1 << 0;
const LINEAR: u8 = 1 << 1;
const COMPRESSED: u8 = 1 << 2;
/// Flags: open (not closed cleanly), a fatal error met.
const OPEN: u8 = 1 << 0;
const FATAL: u8 = 1 << 1;
/// The first byte of a record whose padding is under 256 bytes, of a free block, and of padding.
const RECORD_MAGIC: u8 = 0xcc;
const FREE_MAGIC: u8 = 0xdd;
const PAD_MAGIC: u8 = 0xee;
/// Bytes of a free-block pool entry.
const FREE_POOL_WIDTH: u64 = 6;
/// The most a record's header takes: 2 + two offsets of 6 + two numbers of at most 10.
const RECORD_HEADER_MAX: usize = 34;

/// The place of each key's value in the Kyoto Cabinet file `file` of `len` bytes, a hash file
/// (`tree` false) or a tree file, by key.
pub fn places(file: &std::fs::File, len: u64, tree: bool) -> Result<HashMap<Vec<u8>, Range<u64>>, String> {
    let mut places = HashMap::new();
    let mut add = |key: Vec<u8>, place: Range<u64>| match places.insert(key, place.clone()) {
        Some(_) => Err(format!("a key twice (its value at {})", place.start)),
        None => Ok(()),
    };
    let mut counted = None;
    let records = scan(file, len, if tree { TREE_FILE } else { HASH_FILE }, |reader, key, value| {
        if !tree {
            return add(key, value);
        }
        match key.first() {
            Some(b'L') if key.len() > 1 && key[1..].iter().all(u8::is_ascii_hexdigit) => leaf(reader, value, &mut add),
            Some(b'I') if key.len() > 1 && key[1..].iter().all(u8::is_ascii_hexdigit) => Ok(()),
            _ if key == b"@" => {
                if value.end - value.start != TREE_META_LEN {
                    return Err(format!(
                        "the tree's meta data at {} is {} bytes",
                        value.start,
                        value.end - value.start
                    ));
                }
                let meta = reader.bytes(value.start + TREE_COUNT_AT, 8)?;
                counted = Some(u64::from_be_bytes(meta.try_into().expect("8 bytes")));
                Ok(())
            }
            _ => Err(format!("a node of the tree named {:?}", String::from_utf8_lossy(&key))),
        }
    })?;
    let count = if tree { counted.ok_or("no meta data of the tree")? } else { records };
    if places.len() as u64 != count {
        return Err(format!("{} records, where its header counts {count}", places.len()));
    }
    Ok(places)
}

/// The records of the leaf whose value is at `value`: the ids of its neighbours, then each
/// record, given to `add`; every byte of the value is one of them.
fn leaf(
    reader: &mut Reader,
    value: Range<u64>,
    add: &mut impl FnMut(Vec<u8>, Range<u64>) -> Result<(), String>,
) -> Result<(), String> {
    let mut at = value.start;
    let varnum = |reader: &mut Reader, at: &mut u64| -> Result<u64, String> {
        let head = reader.bytes(*at, VARNUM_MAX.min((value.end - *at) as usize))?;
        let (n, read) = read_varnum(&head).ok_or_else(|| format!("a leaf's number cut short at {at}"))?;
        *at += read as u64;
        Ok(n)
    };
    // The ids of the leaves before and after.
    varnum(reader, &mut at)?;
    varnum(reader, &mut at)?;
    while value.end - at > 1 {
        let (key_len, value_len) = (varnum(reader, &mut at)?, varnum(reader, &mut at)?);
        let start = at.checked_add(key_len).ok_or("a key out of range")?;
        let end = start.checked_add(value_len).filter(|end| *end <= value.end);
        let end = end.ok_or_else(|| format!("a record of a leaf at {at} past the leaf's end"))?;
        add(reader.bytes(at, key_len as usize)?, start..end)?;
        at = end;
    }
    if at != value.end {
        return Err(format!("a leaf ending at {} with a byte over", value.end));
    }
    Ok(())
}

/// Walks the records of the hash file `file` of `len` bytes, whose type byte is `kind`, giving
/// `visit` each one's key and where its value lies; returns how many records its header counts.
fn scan(
    file: &std::fs::File,
    len: u64,
    kind: u8,
    mut visit: impl FnMut(&mut Reader, Vec<u8>, Range<u64>) -> Result<(), String>,
) -> Result<u64, String> {
    let mut reader = Reader { inner: BufReader::with_capacity(16 << 10, file), at: 0, len };
    let header = reader.bytes(0, HEADER_LEN)?;
    if &header[..4] != MAGIC || header[TYPE_AT] != kind {
        return Err(format!("not a file of type {kind:#x}"));
    }
    let number = |at: usize| u64::from_be_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let (alignment, free_pool, options, flags) =
        (header[ALIGNMENT_AT], header[FREE_POOL_AT], header[OPTIONS_AT], header[FLAGS_AT]);
    if flags & (OPEN | FATAL) != 0 {
        return Err(format!("its header's flags are {flags:#x}: not closed cleanly"));
    }
    if options & COMPRESSED != 0 {
        return Err("its records are compressed".into());
    }
    if alignment > 15 || free_pool > 20 {
        return Err(format!("alignment 2^{alignment}, free-block pool 2^{free_pool}: out of range"));
    }
    let (buckets, count, size) = (number(BUCKETS_AT), number(COUNT_AT), number(SIZE_AT));
    let width: u64 = if options & SMALL != 0 { 4 } else { 6 };
    let linear = options & LINEAR != 0;
    let align = 1u64 << alignment;
    // calc_meta: the bucket array after the header and the free-block pool, records after it,
    // aligned.
    let pool = if free_pool > 0 { 1u64 << free_pool } else { 0 };
    let mut buckets_at = HEADER_LEN as u64 + FREE_POOL_WIDTH * pool;
    if pool > 0 {
        buckets_at += width * 2 + 2;
    }
    let records = buckets.checked_mul(width).and_then(|b| b.checked_add(buckets_at)).ok_or("too many buckets")?;
    let mut at = records.div_ceil(align) * align;
    if size > len || at > size {
        return Err(format!("records from {at} to {size}, in a file of {len} bytes"));
    }
    let mut seen = 0;
    while at < size {
        let head = reader.bytes(at, RECORD_HEADER_MAX.min((size - at) as usize))?;
        let fixnum = |bytes: &[u8]| bytes.iter().fold(0u64, |n, b| n << 8 | u64::from(*b));
        // The least a record's header takes (two numbers of one byte), and a free block's.
        let shortest = 2 + width as usize * if linear { 1 } else { 2 } + 2;
        if head.len() < shortest.min(4 + width as usize) {
            return Err(format!("a record or free block at {at} cut short by the end of the records, {size}"));
        }
        let record_len = if head[0] == FREE_MAGIC {
            let w = width as usize;
            if head.len() < 4 + w || head[1] != FREE_MAGIC || head[2 + w] != PAD_MAGIC || head[3 + w] != PAD_MAGIC {
                return Err(format!("a damaged free block at {at}"));
            }
            let free = fixnum(&head[2..2 + w]) << alignment;
            if free < (4 + w) as u64 || free > size - at {
                return Err(format!("a free block at {at} of {free} bytes, in records up to {size}"));
            }
            free
        } else {
            let padding = match head[0] {
                RECORD_MAGIC => u64::from(head[1]),
                0x01..0x80 => u64::from(u16::from_be_bytes([head[0], head[1]])),
                _ => return Err(format!("no record or free block at {at}")),
            };
            let sizes_at = 2 + width as usize * if linear { 1 } else { 2 };
            let (key_len, read) = read_varnum(&head[sizes_at.min(head.len())..])
                .ok_or_else(|| format!("a record's header cut short at {at}"))?;
            let (value_len, read_too) = read_varnum(&head[(sizes_at + read).min(head.len())..])
                .ok_or_else(|| format!("a record's header cut short at {at}"))?;
            let body = at + (sizes_at + read + read_too) as u64;
            let value = body.checked_add(key_len).ok_or("a key out of range")?;
            let end = value.checked_add(value_len).ok_or("a value out of range")?;
            let record_end = end.checked_add(padding).ok_or("padding out of range")?;
            if record_end > size || !(record_end - at).is_multiple_of(align) {
                return Err(format!(
                    "a record at {at} ending at {record_end}, in records up to {size} aligned to {align}"
                ));
            }
            let key = reader.bytes(body, key_len as usize)?;
            visit(&mut reader, key, value..end)?;
            if padding > 0 && reader.bytes(end, 1)?[0] != PAD_MAGIC {
                return Err(format!("a record at {at} whose padding is damaged"));
            }
            seen += 1;
            record_end - at
        };
        if record_len == 0 {
            return Err(format!("a block of no bytes at {at}"));
        }
        at += record_len;
    }
    if seen != count {
        return Err(format!("{seen} records, where its header counts {count}"));
    }
    Ok(count)
}

/// A number in Kyoto Cabinet's variable length (7 bits a byte, most significant first, the high
/// bit set on all but the last) at the start of `bytes`, and how many bytes it took.
fn read_varnum(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut n = 0u64;
    for (i, byte) in bytes.iter().take(VARNUM_MAX).enumerate() {
        n = n.checked_mul(128)? + u64::from(byte & 0x7f);
        if *byte < 0x80 {
            return Some((n, i + 1));
        }
    }
    None
}

/// Reads a file's bytes at increasing places, through one buffer, so that the headers of small
/// records lying together are read in one go, and a large value between two is skipped.
struct Reader<'a> {
    inner: BufReader<&'a std::fs::File>,
    at: u64,
    len: u64,
}

impl Reader<'_> {
    fn bytes(&mut self, at: u64, n: usize) -> Result<Vec<u8>, String> {
        if at.checked_add(n as u64).is_none_or(|end| end > self.len) {
            return Err(format!("{n} bytes at {at}: past the end of the file"));
        }
        let seek = |e: std::io::Error| format!("{n} bytes at {at}: {e}");
        match i64::try_from(at as i128 - self.at as i128) {
            Ok(ahead) => self.inner.seek_relative(ahead).map_err(seek)?,
            Err(_) => _ = self.inner.seek(std::io::SeekFrom::Start(at)).map_err(seek)?,
        }
        let mut bytes = vec![0; n];
        self.inner.read_exact(&mut bytes).map_err(seek)?;
        self.at = at + n as u64;
        Ok(bytes)
    }
}
