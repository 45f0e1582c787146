//! Chunk keys: how chunk coordinates become store keys, relative to the array's directory.
//!
//! `default` keys are `c` followed by each coordinate (`c/1/2`, `c.1.2`, 0-d: `c`); `v2` keys
//! join the coordinates (`1.2`, `1/2`, 0-d: `0`); keys of the draft storage-transformer layout glue
//! the `c` to the first coordinate (`c1/2`, `c1.2`, 0-d: `c`). Decoding is strict (canonical decimals only) so
//! that every chunk has exactly one key and no stray file is mistaken for a chunk.

use super::error::Unsupported;
use serde_json::Value;

/// Which family of chunk keys an array uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyStyle {
    /// `"c"` then the coordinates, each after the separator.
    Default,
    /// The coordinates joined by the separator; `0` for a 0-d array.
    V2,
    /// `"c"` glued to the coordinates joined by the separator (zarr-python 2.x experimental v3).
    Draft,
}

/// A chunk key encoding: style plus separator (`/` or `.`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkKeyEncoding {
    pub style: KeyStyle,
    pub separator: char,
}

impl ChunkKeyEncoding {
    /// Parses the `chunk_key_encoding` field of a v3 array document.
    pub fn from_json(value: &Value) -> Result<Self, Unsupported> {
        let name = value.get("name").and_then(Value::as_str).ok_or("chunk_key_encoding has no name")?;
        let (style, default_separator) = match name {
            "default" => (KeyStyle::Default, '/'),
            "v2" => (KeyStyle::V2, '.'),
            other => return Err(format!("unsupported chunk_key_encoding {other:?}").into()),
        };
        let separator = match value.get("configuration").and_then(|c| c.get("separator")) {
            None => default_separator,
            Some(Value::String(s)) if s == "/" => '/',
            Some(Value::String(s)) if s == "." => '.',
            Some(other) => return Err(format!("unsupported chunk key separator {other}").into()),
        };
        Ok(Self { style, separator })
    }

    /// The key of the chunk at `coords`.
    pub fn encode(&self, coords: &[u64]) -> String {
        let mut key = String::with_capacity(2 + coords.len() * 4);
        match self.style {
            KeyStyle::Default | KeyStyle::Draft => key.push('c'),
            KeyStyle::V2 if coords.is_empty() => key.push('0'),
            KeyStyle::V2 => {}
        }
        for (i, c) in coords.iter().enumerate() {
            if i > 0 || self.style == KeyStyle::Default {
                key.push(self.separator);
            }
            key.push_str(&c.to_string());
        }
        key
    }

    /// The coordinates of the chunk whose key is `key`, for an array of rank `rank`.
    pub fn decode(&self, key: &str, rank: usize) -> Option<Vec<u64>> {
        let coords = self.parse(key, rank)?;
        (coords.len() == rank).then_some(coords)
    }

    /// The coordinates fixed by a directory that holds chunk keys (`c/1` fixes `[1]`); `""`, the
    /// array's own directory, fixes none. Only `/`-separated keys have such directories.
    pub fn decode_dir(&self, dir: &str, rank: usize) -> Option<Vec<u64>> {
        if dir.is_empty() {
            return Some(Vec::new());
        }
        if self.separator != '/' || rank == 0 {
            return None;
        }
        let coords = self.parse(dir, rank)?;
        (coords.len() < rank).then_some(coords)
    }

    /// The directory (relative to the array) holding every key whose leading coordinates are
    /// `prefix`; only for `/`-separated keys with `prefix` shorter than the rank.
    pub fn dir_key(&self, prefix: &[u64]) -> String {
        match (self.style, prefix.is_empty()) {
            (KeyStyle::V2 | KeyStyle::Draft, true) => String::new(),
            _ => self.encode(prefix),
        }
    }

    /// The coordinate spelled by one path component of a `/`-separated key, at position `depth`
    /// (`c3` at depth 0 for draft keys, `3` otherwise).
    pub fn component(&self, depth: usize, name: &str) -> Option<u64> {
        match (self.style, depth) {
            (KeyStyle::Draft, 0) => parse_canonical(name.strip_prefix('c')?),
            _ => parse_canonical(name),
        }
    }

    fn parse(&self, key: &str, rank: usize) -> Option<Vec<u64>> {
        let rest = match self.style {
            KeyStyle::Default => {
                let rest = key.strip_prefix('c')?;
                if rest.is_empty() {
                    return Some(Vec::new());
                }
                rest.strip_prefix(self.separator)?
            }
            KeyStyle::V2 if rank == 0 => return (key == "0").then(Vec::new),
            KeyStyle::V2 => key,
            KeyStyle::Draft => {
                let rest = key.strip_prefix('c')?;
                if rest.is_empty() {
                    return Some(Vec::new());
                }
                rest
            }
        };
        let coords: Option<Vec<u64>> = rest.split(self.separator).map(parse_canonical).collect();
        coords.filter(|c| c.len() <= rank)
    }
}

/// One coordinate as keys spell it: a decimal with no sign, no leading zero and no other character.
pub fn parse_canonical(s: &str) -> Option<u64> {
    let canonical = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_SLASH: ChunkKeyEncoding = ChunkKeyEncoding { style: KeyStyle::Default, separator: '/' };
    const DEFAULT_DOT: ChunkKeyEncoding = ChunkKeyEncoding { style: KeyStyle::Default, separator: '.' };
    const V2_DOT: ChunkKeyEncoding = ChunkKeyEncoding { style: KeyStyle::V2, separator: '.' };
    const V2_SLASH: ChunkKeyEncoding = ChunkKeyEncoding { style: KeyStyle::V2, separator: '/' };

    #[test]
    fn encodes_every_style() {
        assert_eq!(DEFAULT_SLASH.encode(&[1, 23, 45]), "c/1/23/45");
        assert_eq!(DEFAULT_DOT.encode(&[1, 23, 45]), "c.1.23.45");
        assert_eq!(V2_DOT.encode(&[1, 23, 45]), "1.23.45");
        assert_eq!(V2_SLASH.encode(&[1, 23, 45]), "1/23/45");
        assert_eq!(DEFAULT_SLASH.encode(&[]), "c");
        assert_eq!(V2_DOT.encode(&[]), "0");
    }

    #[test]
    fn decode_inverts_encode() {
        for enc in [DEFAULT_SLASH, DEFAULT_DOT, V2_DOT, V2_SLASH] {
            for coords in [vec![], vec![7], vec![0, 10, 3]] {
                assert_eq!(enc.decode(&enc.encode(&coords), coords.len()), Some(coords.clone()));
            }
        }
    }

    #[test]
    fn decode_rejects_non_canonical_and_wrong_rank() {
        assert_eq!(DEFAULT_SLASH.decode("c/01/2", 2), None);
        assert_eq!(DEFAULT_SLASH.decode("c/1/2", 3), None);
        assert_eq!(DEFAULT_SLASH.decode("c/1/2/3", 2), None);
        assert_eq!(DEFAULT_SLASH.decode("c/+1/2", 2), None);
        assert_eq!(DEFAULT_SLASH.decode("c//2", 2), None);
        assert_eq!(DEFAULT_DOT.decode("c/1", 1), None);
        assert_eq!(V2_DOT.decode("c.1", 1), None);
        assert_eq!(V2_DOT.decode("1", 0), None);
        assert_eq!(V2_DOT.decode("zarr.json", 1), None);
    }

    #[test]
    fn directories_fix_leading_coordinates() {
        assert_eq!(DEFAULT_SLASH.decode_dir("", 3), Some(vec![]));
        assert_eq!(DEFAULT_SLASH.decode_dir("c", 3), Some(vec![]));
        assert_eq!(DEFAULT_SLASH.decode_dir("c/4/5", 3), Some(vec![4, 5]));
        assert_eq!(DEFAULT_SLASH.decode_dir("c/4/5/6", 3), None);
        assert_eq!(V2_SLASH.decode_dir("4", 2), Some(vec![4]));
        assert_eq!(DEFAULT_DOT.decode_dir("c", 2), None);
        assert_eq!(DEFAULT_SLASH.decode_dir("c", 0), None);
        assert_eq!(DEFAULT_SLASH.dir_key(&[]), "c");
        assert_eq!(DEFAULT_SLASH.dir_key(&[4]), "c/4");
        assert_eq!(V2_SLASH.dir_key(&[]), "");
        assert_eq!(V2_SLASH.dir_key(&[4, 5]), "4/5");
    }

    #[test]
    fn draft_keys_glue_c_to_the_first_coordinate() {
        let slash = ChunkKeyEncoding { style: KeyStyle::Draft, separator: '/' };
        let dot = ChunkKeyEncoding { style: KeyStyle::Draft, separator: '.' };
        assert_eq!(slash.encode(&[96, 18]), "c96/18");
        assert_eq!(dot.encode(&[2, 1]), "c2.1");
        assert_eq!(slash.encode(&[0]), "c0");
        assert_eq!(slash.encode(&[]), "c");
        assert_eq!(slash.decode("c96/18", 2), Some(vec![96, 18]));
        assert_eq!(slash.decode("c/96/18", 2), None);
        assert_eq!(slash.decode_dir("c96", 2), Some(vec![96]));
        assert_eq!(slash.dir_key(&[]), "");
        assert_eq!(slash.dir_key(&[3]), "c3");
        assert_eq!(dot.decode("c2.1", 2), Some(vec![2, 1]));
        assert_eq!(slash.component(0, "c12"), Some(12));
        assert_eq!(slash.component(1, "12"), Some(12));
        assert_eq!(slash.component(0, "12"), None);
        assert_eq!(DEFAULT_SLASH.component(0, "12"), Some(12));
    }

    #[test]
    fn parses_json_with_defaults() {
        let enc = |v: &str| ChunkKeyEncoding::from_json(&serde_json::from_str(v).unwrap());
        assert_eq!(enc(r#"{"name":"default"}"#), Ok(DEFAULT_SLASH));
        assert_eq!(enc(r#"{"name":"v2"}"#), Ok(V2_DOT));
        assert_eq!(enc(r#"{"name":"v2","configuration":{"separator":"/"}}"#), Ok(V2_SLASH));
        assert!(enc(r#"{"name":"default","configuration":{"separator":"-"}}"#).is_err());
        assert!(enc(r#"{"name":"other"}"#).is_err());
    }
}
