//! Where GNU dbm keeps each value, read from the file's own hash directory and buckets (the
//! 64-bit format of `gdbmdefs.h`, as GNU dbm 1.x writes it on 64-bit Linux): a value is
//! `data_size` bytes right after its key, at the element's `data_pointer`. The library gives a
//! value only whole, copied twice; with its place known, a read takes only the bytes asked for,
//! and a listing learns every size without reading a value.
//!
//! Used only when it agrees with the library: every key found here must be a key the library
//! lists and the other way round, each found by its own bytes at the place named, or nothing of
//! it is used ([`super::super::keyed_file`] then reads values through the library).

use std::collections::HashMap;
use std::ops::Range;

/// The 64-bit formats' magic numbers: plain, and with numsync (whose extra header follows the
/// plain one, leaving what is read here where it was).
const MAGIC64: [u32; 2] = [0x13579acf, 0x13579ad1];
/// `gdbm_file_header`: magic, block size, directory address and size, its bits, the bucket size
/// and elements per bucket, the next free block.
const HEADER_LEN: usize = 40;
/// `hash_bucket`: the element table starts after the count of elements in use, at 108.
const BUCKET_COUNT_AT: usize = 108;
const ELEMENTS_AT: usize = 112;
/// `bucket_element`: hash value, the key's first 4 bytes, data pointer, key size, data size.
const ELEMENT_LEN: usize = 24;
/// The hash value of an element not in use.
const UNUSED: i32 = -1;

/// The place of each key's value in a GNU dbm file of `len` bytes, which `read_at` reads, by key.
pub fn places(
    len: u64,
    read_at: impl Fn(&mut [u8], u64) -> std::io::Result<()>,
) -> Result<HashMap<Vec<u8>, Range<u64>>, String> {
    let read = |at: u64, n: usize| -> Result<Vec<u8>, String> {
        if at.checked_add(n as u64).is_none_or(|end| end > len) {
            return Err(format!("{n} bytes at {at}: past the end of the file"));
        }
        let mut bytes = vec![0; n];
        read_at(&mut bytes, at).map_err(|e| format!("{n} bytes at {at}: {e}"))?;
        Ok(bytes)
    };
    let header = read(0, HEADER_LEN)?;
    let int = |bytes: &[u8], at: usize| i32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let offset = |bytes: &[u8], at: usize| i64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let magic = int(&header, 0) as u32;
    if !MAGIC64.contains(&magic) {
        return Err(format!("format {magic:#x}, not the 64-bit one"));
    }
    let (dir, dir_size) = (offset(&header, 8), int(&header, 16));
    let (bucket_size, elements) = (int(&header, 24), int(&header, 28));
    let (Ok(dir), Ok(dir_size), Ok(bucket_size), Ok(elements)) =
        (u64::try_from(dir), usize::try_from(dir_size), usize::try_from(bucket_size), usize::try_from(elements))
    else {
        return Err("a negative address or size in the header".into());
    };
    if ELEMENTS_AT + elements * ELEMENT_LEN > bucket_size || dir_size % 8 != 0 {
        return Err(format!("{elements} elements in buckets of {bucket_size} bytes, a directory of {dir_size}"));
    }
    let directory = read(dir, dir_size)?;
    let mut buckets: Vec<i64> = directory.chunks_exact(8).map(|b| offset(b, 0)).collect();
    buckets.sort_unstable();
    buckets.dedup();
    let mut places = HashMap::new();
    for at in buckets {
        let at = u64::try_from(at).map_err(|_| format!("a bucket at {at}"))?;
        let bucket = read(at, bucket_size)?;
        let mut used = 0;
        for element in bucket[ELEMENTS_AT..ELEMENTS_AT + elements * ELEMENT_LEN].chunks_exact(ELEMENT_LEN) {
            if int(element, 0) == UNUSED {
                continue;
            }
            used += 1;
            let (pointer, key_size, data_size) = (offset(element, 8), int(element, 16), int(element, 20));
            let (Ok(pointer), Ok(key_size), Ok(data_size)) =
                (u64::try_from(pointer), usize::try_from(key_size), u64::try_from(data_size))
            else {
                return Err(format!("an element of the bucket at {at} out of range"));
            };
            let key = read(pointer, key_size)?;
            // The key's first bytes, kept in the element, as the library's lookup compares them.
            let start = key_size.min(4);
            if element[4..4 + start] != key[..start] {
                return Err(format!("an element of the bucket at {at} whose key starts otherwise"));
            }
            let start = pointer + key_size as u64;
            if start + data_size > len {
                return Err(format!("a value at {start} of {data_size} bytes: past the end of the file"));
            }
            if places.insert(key, start..start + data_size).is_some() {
                return Err(format!("a key twice (the bucket at {at})"));
            }
        }
        if used != int(&bucket, BUCKET_COUNT_AT) {
            return Err(format!(
                "the bucket at {at} holds {used} elements, where it counts {}",
                int(&bucket, BUCKET_COUNT_AT)
            ));
        }
    }
    Ok(places)
}
