//! The view of stores written by zarr-python 3 and tensorstore equals the same data written
//! unsharded by the same library (tests/data/golden, made by tests/data/generate.py), read
//! through the filesystem logic without FUSE.

mod common;

use common::*;

#[test]
fn view_equals_the_unsharded_twin() {
    assert_view_equals_twin(&golden());
}

#[test]
fn every_golden_array_is_shown_unsharded() {
    let arrays: Vec<String> = serde_json::from_slice(&std::fs::read(golden().join("arrays.json")).unwrap()).unwrap();
    let fs = fs_of(&golden().join("sharded"));
    let (view, _) = walk_view(&fs);
    for array in arrays {
        let doc: serde_json::Value = serde_json::from_slice(&view[&format!("{array}/zarr.json")]).unwrap();
        let codecs = doc["codecs"].to_string();
        assert!(!codecs.contains("sharding_indexed"), "{array} is still sharded in the view: {codecs}");
        assert!(view.keys().any(|k| k.starts_with(&format!("{array}/")) && !k.ends_with("zarr.json")), "{array}");
    }
}

#[test]
fn a_listing_is_kept_between_reads_until_read_to_its_end_or_forgotten() {
    let fs = fs_of(&golden().join("sharded"));
    let (zp, _) = fs.lookup(shardfs::fs::ROOT_INO, "zp").unwrap();
    let (arr, _) = fs.lookup(zp, "gzip_crc_end").unwrap();
    let (c, _) = fs.lookup(arr, "c").unwrap();
    let whole = list(&fs, c);
    assert!(whole.len() > 4, "{whole:?}");
    // Read in pieces, as the kernel's reply buffers fill: the same entries, the listing kept
    // between the pieces and dropped at the read past its end (the kernel's last).
    let (mut pieces, mut offset) = (Vec::new(), 0);
    loop {
        let before = pieces.len();
        fs.readdir(c, offset, |e, next| {
            if pieces.len() - before == 2 {
                return true;
            }
            pieces.push(e.clone());
            offset = next;
            false
        })
        .unwrap();
        if pieces.len() == before {
            break;
        }
        assert_eq!(fs.listings_kept(), 1);
    }
    assert_eq!(pieces, whole);
    assert_eq!(fs.listings_kept(), 0, "a listing read to its end is dropped");
    // A listing left part-read (`ls | head`) goes with its directory.
    fs.readdir(c, 0, |_, _| true).unwrap();
    assert_eq!(fs.listings_kept(), 1);
    fs.forget(c, 1);
    assert_eq!(fs.listings_kept(), 0, "a forgotten directory's listing is dropped");
}

#[test]
fn inode_numbers_are_stable() {
    let fs = fs_of(&golden().join("sharded"));
    let (zp, _) = fs.lookup(shardfs::fs::ROOT_INO, "zp").unwrap();
    let (arr, _) = fs.lookup(zp, "gzip_crc_end").unwrap();
    let (c, _) = fs.lookup(arr, "c").unwrap();
    let (row, _) = fs.lookup(c, "4").unwrap();
    let (chunk, _) = fs.lookup(row, "1").unwrap();
    let known = fs.known_inodes();
    fs.forget(chunk, 1);
    assert_eq!(fs.known_inodes(), known - 1, "a forgotten inode is dropped from the table");
    assert_eq!(fs.lookup(row, "1").unwrap().0, chunk, "and comes back with the same number");
    let again = fs_of(&golden().join("sharded"));
    let (zp2, _) = again.lookup(shardfs::fs::ROOT_INO, "zp").unwrap();
    assert_eq!(zp2, zp);
}
