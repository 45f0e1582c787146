//! Where a Berkeley DB hash or btree file places its values, read from its pages (db 5.3's
//! `db_page.h`, `hash.h`, `btree.h`), so that a read-only mount reads a value with `pread`, only
//! as far as asked. The library reads every page of a hash file through its cache (a hash file is
//! never mapped: its pages are converted as they are read) and then copies each value whole into
//! memory of its own: 256 MiB of 1 MiB values took 0.59 s of the daemon's CPU that way, 0.19 s
//! read from the pages (plain files through a mount: 0.11 s).
//!
//! A hash file's buckets are found as the library finds them (`BUCKET_TO_PAGE`: a bucket's page
//! is its number plus the spare pages before its doubling), each with its chain of hash pages; a
//! btree's leaves from the first (down the first items of its internal pages), along their
//! chain. Their items are key and value pairs. A value on its page is a run of that page's bytes.
//! A larger one is on a chain of overflow pages, each holding a page's worth after its header:
//! its place is its first page's, as long as the value, and its pages are taken to follow each
//! other in the file, as the library writes a value to a file that had no pages to reuse. A read
//! checks the headers of the pages it reads, and once those of every page before them (number,
//! kind, neighbours, bytes held), and fails otherwise ([`std::io::ErrorKind::InvalidData`]: the
//! value is then read through the library). Only files whose flags the reader knows are placed
//! (not a compressed btree, whose leaves hold lengths before the bytes), and the keys found are
//! checked against the library's own listing before any is used ([`super::super::keyed_file`]).

use std::collections::HashMap;
use std::io;
use std::ops::Range;

use crate::store::database::buffers::Buffer;
use crate::store::database::keyed_file::Places;

/// `DBMETA.magic` of a hash file and of a btree file.
const HASH_MAGIC: u32 = 0x061561;
const BTREE_MAGIC: u32 = 0x053162;
/// The header every page begins with (`PAGE`, `SIZEOF_PAGE`), in a file without checksums.
const HEADER: u64 = 26;
/// Page kinds (`PAGE.type`).
const HASH_UNSORTED: u8 = 2;
const BTREE_INTERNAL: u8 = 3;
const BTREE_LEAF: u8 = 5;
const OVERFLOW: u8 = 7;
const HASH: u8 = 13;
/// Item kinds (a hash item's first byte, a btree item's third): bytes on the page, or a value on
/// overflow pages.
const KEYDATA: u8 = 1;
const OFFPAGE: u8 = 3;
/// How deep a btree may be before its descent is taken for a loop.
const DEEPEST: usize = 64;
/// `DBMETA.metaflags`: the pages carry checksums, and a larger header.
const CHECKSUMS: u8 = 0x01;
/// `BTM_RECNUM`: a btree that counts records under each internal item, whose leaves are as any.
const RECORD_NUMBERS: u32 = 0x04;

/// A file's pages: their size, byte order and last, and how far each overflow chain read so far
/// was found to run on consecutive pages.
#[derive(Debug)]
pub struct Pages {
    size: u64,
    big: bool,
    /// The file's last page (`DBMETA.last_pgno`).
    last: u64,
    /// By a chain's first page: how many of its pages from the first were checked to follow
    /// each other. A page is only read as a value's once every page before it was: each page's
    /// header names the one before it, and only the chain's first has none.
    followed: HashMap<u64, u64>,
}

impl Pages {
    fn u16(&self, bytes: &[u8], at: usize) -> u16 {
        let b = [bytes[at], bytes[at + 1]];
        if self.big { u16::from_be_bytes(b) } else { u16::from_le_bytes(b) }
    }

    fn u32(&self, bytes: &[u8], at: usize) -> u32 {
        let b = [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        if self.big { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }
    }

    /// The bytes a page of an overflow chain holds after its header.
    fn held(&self) -> u64 {
        self.size - HEADER
    }

    /// Fills `buf` with the bytes of the value at `place` from its byte `from` on, read with
    /// `read_at`: where they lie on a hash page, or from the overflow pages that follow its first,
    /// each page's header checked, and the headers of the pages before them too the first time.
    pub fn read_value(
        &mut self,
        place: &Range<u64>,
        from: u64,
        buf: &mut [u8],
        read_at: impl Fn(&mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if !place.start.is_multiple_of(self.size) {
            return read_at(buf, place.start + from);
        }
        let chain = Chain { first: place.start / self.size, len: place.end - place.start };
        if from + buf.len() as u64 > chain.len {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a read past the value's end"));
        }
        let (low, high) = (from / self.held(), (from + buf.len() as u64 - 1) / self.held());
        if chain.first + high > self.last {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a value's pages would run past the file's last"));
        }
        // A file cut short since it was opened: read through the library, which says so.
        let read_at = |buf: &mut [u8], at: u64| {
            read_at(buf, at).map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(io::ErrorKind::InvalidData, e),
                _ => e,
            })
        };
        let followed = self.followed.get(&chain.first).copied().unwrap_or(0);
        for k in followed..low {
            let mut header = [0; HEADER as usize];
            read_at(&mut header, (chain.first + k) * self.size)?;
            self.check(&chain, k, &header)?;
        }
        // The pages from `low` to `high`, headers and all, in one read.
        let start = (chain.first + low) * self.size;
        let end = (chain.first + high) * self.size + HEADER + self.on_page(&chain, high);
        let mut pages = Buffer::of((end - start) as usize);
        read_at(&mut pages, start)?;
        let mut filled = 0;
        for k in low..=high {
            let at = ((k - low) * self.size) as usize;
            let held = self.check(&chain, k, &pages[at..at + HEADER as usize])?;
            let skip = if k == low { from - low * self.held() } else { 0 };
            let n = (held - skip).min((buf.len() - filled) as u64) as usize;
            let data = at + (HEADER + skip) as usize;
            buf[filled..filled + n].copy_from_slice(&pages[data..data + n]);
            filled += n;
        }
        self.followed.insert(chain.first, followed.max(high + 1));
        Ok(())
    }

    /// Checks that `header` is of page `k` of `chain`, following page `k - 1` and followed by
    /// page `k + 1` (none for the last): how many bytes of the value it holds.
    fn check(&self, chain: &Chain, k: u64, header: &[u8]) -> io::Result<u64> {
        let count = chain.len.div_ceil(self.held());
        let held = self.on_page(chain, k);
        let number = chain.first + k;
        let (prev, next) = (if k == 0 { 0 } else { number - 1 }, if k + 1 == count { 0 } else { number + 1 });
        if u64::from(self.u32(header, 8)) != number
            || header[25] != OVERFLOW
            || u64::from(self.u32(header, 12)) != prev
            || u64::from(self.u32(header, 16)) != next
            || u64::from(self.u16(header, 22)) != held
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("overflow page {number} is not page {k} of the value whose first is {}", chain.first),
            ));
        }
        Ok(held)
    }

    /// The bytes page `k` of `chain` holds of its value.
    fn on_page(&self, chain: &Chain, k: u64) -> u64 {
        (chain.len - k * self.held()).min(self.held())
    }
}

/// The overflow pages of a value, taken to follow each other from the first.
struct Chain {
    first: u64,
    len: u64,
}

/// The pages of the hash or btree file of `len` bytes read with `read_at`, and where its values
/// lie: for a value on its page, the run of the file's bytes it is; for one on overflow pages, the
/// offset of its first page, as long as the value ([`Pages::read_value`] reads either).
pub fn places(len: u64, read_at: impl Fn(&mut [u8], u64) -> io::Result<()>) -> Result<(Pages, Places), String> {
    let read = |at: u64, n: u64| -> Result<Vec<u8>, String> {
        if at.checked_add(n).is_none_or(|end| end > len) {
            return Err(format!("{n} bytes at {at}: past the end of the file"));
        }
        let mut bytes = vec![0; n as usize];
        read_at(&mut bytes, at).map_err(|e| format!("{n} bytes at {at}: {e}"))?;
        Ok(bytes)
    };
    let meta = read(0, 224)?;
    // A file in either byte order: the library reads both.
    let magic: [u8; 4] = meta[12..16].try_into().expect("4 bytes");
    let (hash, big) = match (u32::from_le_bytes(magic), u32::from_be_bytes(magic)) {
        (HASH_MAGIC, _) => (true, false),
        (_, HASH_MAGIC) => (true, true),
        (BTREE_MAGIC, _) => (false, false),
        (_, BTREE_MAGIC) => (false, true),
        _ => return Err("neither a hash nor a btree file".into()),
    };
    let probe = Pages { size: 0, big, last: 0, followed: HashMap::new() };
    let size = u64::from(probe.u32(&meta, 20));
    if !size.is_power_of_two() || !(512..=65536).contains(&size) {
        return Err(format!("a page size of {size}"));
    }
    if meta[24] != 0 || meta[26] & CHECKSUMS != 0 {
        return Err("its pages are encrypted or carry checksums".into());
    }
    // The access method's flags (`DBMETA.flags`): only those of files whose items are as read
    // here. A compressed btree's leaves hold lengths before the bytes, and the library reads it
    // without being told.
    let flags = probe.u32(&meta, 48);
    let known = if hash { 0 } else { RECORD_NUMBERS };
    if flags & !known != 0 {
        return Err(format!("its flags are {flags:#x} (compressed, or duplicates)"));
    }
    let last = u64::from(probe.u32(&meta, 32));
    let pages = Pages { size, big, last, followed: HashMap::new() };
    if (last + 1) * size > len {
        return Err(format!("its last page, {last}, is past the end of the file"));
    }
    let mut places = Places::new();
    let mut add = |key: Vec<u8>, place: Range<u64>| match places.insert(key, place) {
        Some(_) => Err("a key on two pages".to_string()),
        None => Ok(()),
    };
    let page = |number: u64| -> Result<Vec<u8>, String> {
        if number == 0 || number > last {
            return Err(format!("page {number}: past the file's last, {last}"));
        }
        let page = read(number * size, size)?;
        if u64::from(pages.u32(&page, 8)) != number {
            return Err(format!("page {number} says it is page {}", pages.u32(&page, 8)));
        }
        Ok(page)
    };
    let header = |at: u64| read(at, HEADER);
    // Each page is visited once at most: more visits are a loop.
    let mut visited = 0;
    let mut visit = |number: u64| {
        visited += 1;
        if visited > last { Err(format!("page {number}: its pages loop")) } else { Ok(()) }
    };
    if hash {
        for bucket in 0..=u64::from(pages.u32(&meta, 72)) {
            // `BUCKET_TO_PAGE`: the bucket's number and the spare pages before its doubling,
            // `__db_log2(bucket + 1)`.
            let doubling = (bucket + 1).next_power_of_two().trailing_zeros() as usize;
            let spare = meta.get(96 + 4 * doubling..100 + 4 * doubling).ok_or("a bucket past the spares")?;
            let mut number = bucket + u64::from(pages.u32(spare, 0));
            while number != 0 {
                visit(number)?;
                let found = page(number)?;
                pairs(&pages, &found, number, true, &mut add, header)?;
                number = u64::from(pages.u32(&found, 16));
            }
        }
    } else {
        // Down the first items to the first leaf, then along the leaves.
        let mut number = u64::from(pages.u32(&meta, 88));
        let mut found = page(number)?;
        for _ in 0..DEEPEST {
            if found[25] != BTREE_INTERNAL {
                break;
            }
            // `BINTERNAL`: a length, a kind, a byte unused, the child's page number.
            let first = pages.items(&found, number, false)?.first().ok_or(format!("page {number}: no items"))?.start;
            if first + 8 > found.len() {
                return Err(format!("page {number}: an item at {first}"));
            }
            number = u64::from(pages.u32(&found, first + 4));
            found = page(number)?;
        }
        loop {
            visit(number)?;
            pairs(&pages, &found, number, false, &mut add, header)?;
            number = u64::from(pages.u32(&found, 16));
            if number == 0 {
                break;
            }
            found = page(number)?;
        }
    }
    Ok((pages, places))
}

impl Pages {
    /// Where the items of `page` (page `number`) lie: on a hash page (`packed`), each from its
    /// offset to the one before it, or to the page's end (`LEN_HITEM`); on a btree page, whose
    /// items are not in the order of their offsets, from its offset to the page's end (the item
    /// says its length).
    fn items(&self, page: &[u8], number: u64, packed: bool) -> Result<Vec<Range<usize>>, String> {
        let entries = usize::from(self.u16(page, 20));
        let table_end = HEADER as usize + 2 * entries;
        if table_end > page.len() {
            return Err(format!("page {number}: {entries} items"));
        }
        let offset = |i: usize| usize::from(self.u16(page, HEADER as usize + 2 * i));
        (0..entries)
            .map(|i| {
                let end = if i == 0 || !packed { page.len() } else { offset(i - 1) };
                let start = offset(i);
                if start < table_end || start >= end || end > page.len() {
                    return Err(format!("page {number}: item {i} at {start}..{end}"));
                }
                Ok(start..end)
            })
            .collect()
    }

    /// The place of a value on overflow pages from `first`, `len` bytes long, its first page's
    /// `header` checked.
    fn overflow(&self, first: u64, len: u64, header: &[u8]) -> Result<Range<u64>, String> {
        if len == 0 || u64::from(self.u32(header, 8)) != first || header[25] != OVERFLOW || self.u32(header, 12) != 0 {
            return Err(format!("a value's overflow page {first} does not begin one"));
        }
        Ok(first * self.size..first * self.size + len)
    }
}

/// What an item of a page holds.
enum Item {
    /// These bytes of the page.
    Bytes(Range<usize>),
    /// A value on overflow pages, from `first` on, `len` bytes long.
    Overflow { first: u64, len: u64 },
    /// Another kind (a duplicate set, an item deleted).
    Other(u8),
}

impl Pages {
    /// The item of `page` at `item`: a hash item's kind is its first byte, its bytes the rest
    /// (`HKEYDATA`); a btree item's kind its third, after its length (`BKEYDATA`). An item of a
    /// value on overflow pages (`HOFFPAGE`, `BOVERFLOW`) names the first and the length at the
    /// same places in both.
    fn item(&self, page: &[u8], item: &Range<usize>, hash: bool) -> Option<Item> {
        let kind = *page.get(if hash { item.start } else { item.start + 2 })?;
        match kind {
            KEYDATA if hash => Some(Item::Bytes(item.start + 1..item.end)),
            KEYDATA => {
                let end = item.start + 3 + usize::from(self.u16(page, item.start));
                (end <= item.end).then_some(Item::Bytes(item.start + 3..end))
            }
            OFFPAGE if item.len() >= 12 => Some(Item::Overflow {
                first: u64::from(self.u32(page, item.start + 4)),
                len: u64::from(self.u32(page, item.start + 8)),
            }),
            kind => Some(Item::Other(kind)),
        }
    }
}

/// Reads the key and value pairs of page `number`, a hash page or a btree leaf, into `add`,
/// each value's first overflow page header read with `header`.
fn pairs(
    pages: &Pages,
    page: &[u8],
    number: u64,
    hash: bool,
    add: &mut impl FnMut(Vec<u8>, Range<u64>) -> Result<(), String>,
    header: impl Fn(u64) -> Result<Vec<u8>, String>,
) -> Result<(), String> {
    let fits = if hash { [HASH, HASH_UNSORTED].contains(&page[25]) } else { page[25] == BTREE_LEAF };
    if !fits {
        return Err(format!(
            "page {number} is of kind {}, not a {}",
            page[25],
            if hash { "hash page" } else { "btree leaf" }
        ));
    }
    let items = pages.items(page, number, hash)?;
    if !items.len().is_multiple_of(2) {
        return Err(format!("page {number}: {} items, not pairs", items.len()));
    }
    let at = number * pages.size;
    let item =
        |item: &Range<usize>| pages.item(page, item, hash).ok_or(format!("page {number}: an item at {}", item.start));
    for pair in items.chunks(2) {
        let key = match item(&pair[0])? {
            Item::Bytes(key) => key,
            _ => return Err(format!("page {number}: a key not on its page (a long key, or deleted)")),
        };
        let place = match item(&pair[1])? {
            Item::Bytes(value) => at + value.start as u64..at + value.end as u64,
            Item::Overflow { first, len } => pages.overflow(first, len, &header(first * pages.size)?)?,
            Item::Other(kind) => return Err(format!("page {number}: a value of kind {kind} (duplicates, or deleted)")),
        };
        add(page[key].to_vec(), place)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash file of one bucket page (page 1) of `pairs`, whose values from `long` bytes on are
    /// on overflow pages from page 2 on, as the library lays one out.
    fn file(pairs: &[(&[u8], Vec<u8>)], long: usize) -> Vec<u8> {
        let size = 4096usize;
        let mut file = vec![0u8; 2 * size];
        let put32 = |f: &mut Vec<u8>, at: usize, v: u32| f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put32(&mut file, 12, HASH_MAGIC);
        put32(&mut file, 20, size as u32);
        // max_bucket 0; spares[0] 1: bucket 0 is page 1.
        put32(&mut file, 96, 1);
        let mut page = vec![0u8; size];
        page[8..12].copy_from_slice(&1u32.to_le_bytes());
        page[25] = HASH;
        page[20..22].copy_from_slice(&((2 * pairs.len()) as u16).to_le_bytes());
        let mut top = size;
        let mut next_page = 2u32;
        let mut overflow = Vec::new();
        for (i, (key, value)) in pairs.iter().enumerate() {
            let mut items = vec![[&[KEYDATA][..], key].concat()];
            if value.len() >= long {
                let mut item = vec![OFFPAGE, 0, 0, 0];
                item.extend(next_page.to_le_bytes());
                item.extend((value.len() as u32).to_le_bytes());
                items.push(item);
                let pieces: Vec<&[u8]> = value.chunks(size - HEADER as usize).collect();
                for (k, piece) in pieces.iter().enumerate() {
                    let number = next_page + k as u32;
                    let mut p = vec![0u8; size];
                    p[8..12].copy_from_slice(&number.to_le_bytes());
                    p[12..16].copy_from_slice(&(if k == 0 { 0 } else { number - 1 }).to_le_bytes());
                    p[16..20].copy_from_slice(&(if k + 1 == pieces.len() { 0 } else { number + 1 }).to_le_bytes());
                    p[22..24].copy_from_slice(&(piece.len() as u16).to_le_bytes());
                    p[25] = OVERFLOW;
                    p[HEADER as usize..HEADER as usize + piece.len()].copy_from_slice(piece);
                    overflow.extend(p);
                }
                next_page += pieces.len() as u32;
            } else {
                items.push([&[KEYDATA][..], value].concat());
            }
            for (j, item) in items.iter().enumerate() {
                top -= item.len();
                page[top..top + item.len()].copy_from_slice(item);
                let slot = HEADER as usize + 2 * (2 * i + j);
                page[slot..slot + 2].copy_from_slice(&(top as u16).to_le_bytes());
            }
        }
        put32(&mut file, 32, next_page - 1);
        file[size..].copy_from_slice(&page);
        file.extend(overflow);
        file
    }

    fn read_in(file: &[u8]) -> impl Fn(&mut [u8], u64) -> io::Result<()> + '_ {
        |buf, at| {
            let at = at as usize;
            buf.copy_from_slice(file.get(at..at + buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?);
            Ok(())
        }
    }

    #[test]
    fn values_on_their_page_and_on_overflow_pages_are_read_from_any_byte() {
        let long: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        let pairs: Vec<(&[u8], Vec<u8>)> = vec![(b"a/.zarray", b"{}".to_vec()), (b"a/0", long.clone()), (b"e", vec![])];
        let file = file(&pairs, 1000);
        let (mut pages, places) = places(file.len() as u64, read_in(&file)).unwrap();
        assert_eq!(places.len(), 3);
        for (key, value) in &pairs {
            let place = &places[*key];
            assert_eq!(place.end - place.start, value.len() as u64);
            for from in [0, 1, 4069, 4070, 4071, 8140, 19_999].into_iter().filter(|f| *f < value.len()) {
                for n in [1, 100, 4070, 9000, 20_000] {
                    let n = n.min(value.len() - from);
                    let mut buf = vec![0; n];
                    pages.read_value(place, from as u64, &mut buf, read_in(&file)).unwrap();
                    assert!(buf == value[from..from + n], "{key:?} {from}+{n}");
                }
            }
        }
    }

    #[test]
    fn a_value_whose_pages_do_not_follow_each_other_is_not_read_from_them() {
        let long: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut file = file(&[(b"k", long)], 1000);
        // The chain's second page links elsewhere, as a page reused after a delete would.
        file[3 * 4096 + 16..3 * 4096 + 20].copy_from_slice(&9u32.to_le_bytes());
        let (mut pages, places) = places(file.len() as u64, read_in(&file)).unwrap();
        let place = &places[&b"k"[..]];
        let mut buf = vec![0; 10_000];
        // Its third page is not read as the value's: the second, before it, was not followed.
        let err = pages.read_value(place, 9000, &mut buf[..100], read_in(&file)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let err = pages.read_value(place, 0, &mut buf, read_in(&file)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // The first page alone still reads.
        pages.read_value(place, 0, &mut buf[..100], read_in(&file)).unwrap();
        assert!(buf[..100].iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn a_value_whose_pages_would_run_past_the_last_is_read_through_the_library() {
        // Pages 2 and 3 swapped: the value's first page is the file's last, and its second the
        // one before, as a chain through pages freed and used again downwards runs.
        let long: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        let mut file = file(&[(b"k", long)], 1000);
        let (two, three) = (file[2 * 4096..3 * 4096].to_vec(), file[3 * 4096..4 * 4096].to_vec());
        file[2 * 4096..3 * 4096].copy_from_slice(&three);
        file[3 * 4096..4 * 4096].copy_from_slice(&two);
        let put = |f: &mut Vec<u8>, at: usize, v: u32| f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        // The first (now page 3): itself, no previous, next page 2; the second: page 2 after 3.
        put(&mut file, 3 * 4096 + 8, 3);
        put(&mut file, 3 * 4096 + 16, 2);
        put(&mut file, 2 * 4096 + 8, 2);
        put(&mut file, 2 * 4096 + 12, 3);
        // The value's item (the page's second) names page 3 as its first.
        let value_item = 4096 + usize::from(u16::from_le_bytes([file[4096 + 28], file[4096 + 29]]));
        put(&mut file, value_item + 4, 3);
        let (mut pages, places) = places(file.len() as u64, read_in(&file)).unwrap();
        let mut buf = vec![0; 6000];
        let err = pages.read_value(&places[&b"k"[..]], 0, &mut buf, read_in(&file)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    #[test]
    fn a_compressed_btree_is_not_placed() {
        let mut meta = vec![0u8; 4096];
        meta[12..16].copy_from_slice(&BTREE_MAGIC.to_le_bytes());
        meta[20..24].copy_from_slice(&4096u32.to_le_bytes());
        meta[48..52].copy_from_slice(&0x80u32.to_le_bytes());
        let err = places(meta.len() as u64, read_in(&meta)).unwrap_err();
        assert!(err.contains("flags are 0x80"), "{err}");
    }

    #[test]
    fn a_file_of_other_pages_or_items_is_refused_not_panicked_on() {
        let file = file(&[(b"k", b"v".to_vec())], 1000);
        for (at, byte) in [(12, 0u8), (20, 3), (26, CHECKSUMS), (4096 + 25, OVERFLOW), (4096 + 20, 3), (4096 + 26, 0)] {
            let mut damaged = file.clone();
            damaged[at] = byte;
            assert!(places(damaged.len() as u64, read_in(&damaged)).is_err(), "byte {at} set to {byte}");
        }
        assert!(places(100, read_in(&file[..100])).is_err(), "cut short");
    }
}
