//! Any bytes as a zip file: reading its end records, ZIP64 record, central directory and each
//! entry's local header, as the zip store does, never panics, and every entry's data found lies
//! before the central directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::zip::{End, LOCAL_LEN, TAIL_LEN, ZIP64_END_LEN, central_directory, data_start, end, zip64_end};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let tail = &data[len.saturating_sub(TAIL_LEN) as usize..];
    let place = match end(tail, len) {
        Ok(End::Directory(place)) => place,
        Ok(End::Zip64At(at)) => {
            let Some(record) = data.get(at as usize..(at + ZIP64_END_LEN) as usize) else { return };
            let Ok(place) = zip64_end(record, at) else { return };
            place
        }
        Err(_) => return,
    };
    assert!(place.range.start <= place.range.end && place.range.end <= len);
    let directory = &data[place.range.start as usize..place.range.end as usize];
    let Ok(entries) = central_directory(directory, place.entries) else { return };
    for entry in &entries {
        let header_end = entry.local_header.saturating_add(LOCAL_LEN + entry.name.len() as u64);
        if header_end > place.range.start {
            continue;
        }
        let header = &data[entry.local_header as usize..header_end as usize];
        if let Ok(start) = data_start(header, entry, place.range.start) {
            assert!(start + entry.compressed_size <= place.range.start, "{entry:?}");
        }
    }
});
