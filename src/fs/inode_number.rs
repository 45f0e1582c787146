//! Inode numbers of view paths. A number is a hash of the path, so the same path has the same
//! number for the life of the mount (and across mounts) without a table of every path ever seen,
//! and readdir's `d_ino` agrees with `stat`'s `st_ino`.
//!
//! Numbered names (chunk keys: `c/0/17`, `c.0.17`) are the exception that matters for speed: the
//! files `<stem><n>` of one directory get `base + n`, the base a hash of the directory and stem.
//! Tools built on fts (find, du, rm -r, chmod -R) sort a directory of over 10,000 entries by inode
//! number before visiting it; with hashed numbers that sort and the scattered frees after it cost
//! `find` on a 262,144-chunk directory more CPU than the kernel's listing, and visited chunks in
//! random shard order. With `base + n` the listing (chunk order) is already sorted.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::ROOT_INO;
use super::chunk_groups::COMPUTED;

/// Set in every number but the root's: keeps clear of 0 (invalid) and 1 (the root).
const HIGH: u64 = 1 << 63;
/// The bits a hashed number may use: clear of [`HIGH`] and of the computed chunk numbers.
const LOW: u64 = !(HIGH | COMPUTED);

/// The inode number of a view path, before collisions (see [`next_probe`]).
pub fn path_ino(path: &str) -> u64 {
    if path.is_empty() {
        return ROOT_INO;
    }
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    match numbered(name) {
        // Wraps within the 62 low bits: a run of numbers crosses the top once in 2^62 / n bases.
        Some((stem, n)) => (hash(&(parent, stem, Numbered)).wrapping_add(n) & LOW) | HIGH,
        None => (hash(path) & LOW) | HIGH,
    }
}

/// The number to try after `ino` when another path holds it: a fresh hash, never `ino + 1`, which
/// is the next numbered file's own number.
pub fn next_probe(ino: u64) -> u64 {
    (hash(&ino) & LOW) | HIGH
}

/// Marks the hash of a numbered run's base apart from the hash of any path.
#[derive(Hash)]
struct Numbered;

fn hash(value: &(impl Hash + ?Sized)) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// `name` as `<stem><n>`, where the stem is empty or ends with `.` and `n` is written the one way
/// a chunk key writes it (no sign, no leading zero), so two names never share a number.
fn numbered(name: &str) -> Option<(&str, u64)> {
    let digits = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (stem, number) = name.split_at(digits);
    let canonical = !number.is_empty() && (number == "0" || !number.starts_with('0'));
    if !canonical || !(stem.is_empty() || stem.ends_with('.')) {
        return None;
    }
    Some((stem, number.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_files_of_a_directory_are_numbered_in_order() {
        let base = path_ino("a/c/0/0");
        for n in 1..1000u64 {
            assert_eq!(path_ino(&format!("a/c/0/{n}")), (base.wrapping_add(n) & LOW) | HIGH);
        }
        let dotted = path_ino("a/c.3.0");
        assert_eq!(path_ino("a/c.3.41"), (dotted.wrapping_add(41) & LOW) | HIGH);
    }

    #[test]
    fn names_that_are_not_canonical_numbers_are_hashed() {
        for name in ["07", "+7", "x7", "7a", "c7", "99999999999999999999999", ""] {
            assert_eq!(numbered(name), None, "{name}");
        }
        assert_eq!(numbered("c.0.12"), Some(("c.0.", 12)));
        assert_eq!(numbered("0"), Some(("", 0)));
    }

    #[test]
    fn numbers_differ_between_directories_and_from_the_root() {
        assert_ne!(path_ino("a/c/0/5"), path_ino("a/c/1/5"));
        assert_ne!(path_ino("a/c/0"), path_ino("b/c/0"));
        assert_eq!(path_ino(""), ROOT_INO);
        assert_ne!(path_ino("0"), ROOT_INO);
        assert_ne!(next_probe(path_ino("a/c/0/5")), path_ino("a/c/0/6"));
    }
}
