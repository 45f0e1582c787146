//! bcolz directories. A carray is `meta/sizes` (`{"shape": [N, ...], ...}`), `meta/storage`
//! (`{"dtype": "float64", "cparams": {"clevel", "shuffle", "cname"}, "chunklen": L, "dflt": ...}`),
//! `__attrs__` (user attributes) and `data/__i.blp`, one chunk of L rows each behind a 16-byte
//! header (`blpk`, version 1, three reserved bytes, nchunks = 1), the last one shorter when N is
//! not a multiple of L. A ctable is `__rootdirs__` (`{"names": [...]}`), one carray per column,
//! and `__attrs__`.

use serde_json::Value;

use super::dtype::Dtype;
use super::{BlzError, Result, damaged, refused};

/// The most chunk files a carray may have (a damaged `meta/sizes` could claim any number).
pub const MAX_CHUNKS: u64 = 1 << 20;

/// The header of a chunk file.
pub const CHUNK_HEADER_LEN: u64 = 16;

/// Files that mark a directory as a carray or a ctable.
pub const SIZES: &str = "meta/sizes";
pub const STORAGE: &str = "meta/storage";
pub const ATTRS: &str = "__attrs__";
pub const ROOTDIRS: &str = "__rootdirs__";

/// The key of chunk `i`'s file inside a carray directory.
pub fn chunk_file(i: u64) -> String {
    format!("data/__{i}.blp")
}

/// The largest `meta/sizes`, `meta/storage` or `__attrs__` read: bcolz writes a few hundred bytes.
pub const MAX_META_FILE: u64 = 16 << 20;

fn json(what: &str, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(&quoted_specials(bytes)).map_err(|e| BlzError::Damaged(format!("{what} is not JSON: {e}")))
}

/// `bytes` with the bare `NaN`, `Infinity` and `-Infinity` that Python's json writes (bcolz's
/// `dflt` of a float array) quoted, as Zarr v3 spells those fill values; strings are left alone.
fn quoted_specials(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            (in_string, escaped) = (escaped || b != b'"', !escaped && b == b'\\');
        } else if b == b'"' {
            in_string = true;
        } else if let Some(word) =
            [&b"-Infinity"[..], b"Infinity", b"NaN"].into_iter().find(|w| bytes[i..].starts_with(w))
        {
            out.push(b'"');
            out.extend_from_slice(word);
            out.push(b'"');
            i += word.len();
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

/// What a carray's `meta/sizes` and `meta/storage` say.
#[derive(Debug, Clone, PartialEq)]
pub struct Carray {
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub chunklen: u64,
    /// The fill value as JSON (`dflt`).
    pub dflt: Value,
    /// `dflt` as the bytes of one item.
    pub dflt_bytes: Vec<u8>,
    pub clevel: Option<u64>,
    /// `cparams.cname` (tells lz4hc from lz4, which chunk headers do not).
    pub cname: Option<String>,
}

impl Carray {
    pub fn parse(sizes: &[u8], storage: &[u8]) -> Result<Carray> {
        let sizes = json(SIZES, sizes)?;
        let storage = json(STORAGE, storage)?;
        let shape: Option<Vec<u64>> =
            sizes.get("shape").and_then(Value::as_array).and_then(|s| s.iter().map(Value::as_u64).collect());
        let shape =
            shape.filter(|s| !s.is_empty()).ok_or_else(|| BlzError::Damaged("meta/sizes has no shape".into()))?;
        let dtype = match storage.get("dtype") {
            Some(Value::String(t)) => Dtype::parse(t)?,
            Some(other) => return refused(format!("dtype {other} is structured or unknown")),
            None => return damaged("meta/storage has no dtype"),
        };
        let chunklen = storage.get("chunklen").and_then(Value::as_u64).filter(|l| *l > 0);
        let chunklen = chunklen.ok_or_else(|| BlzError::Damaged("meta/storage has no chunklen".into()))?;
        let dflt = storage.get("dflt").cloned().unwrap_or(Value::from(0));
        let dflt_bytes =
            dtype.encode(&dflt).ok_or_else(|| BlzError::Refused(format!("dflt {dflt} does not fit {}", dtype.name)))?;
        let chunk_bytes =
            shape[1..].iter().fold(chunklen.checked_mul(dtype.size as u64), |n, d| n.and_then(|n| n.checked_mul(*d)));
        if chunk_bytes.is_none_or(|n| n > super::blosc::MAX_CHUNK) {
            return refused(format!("chunks of {chunklen} rows are larger than {} bytes", super::blosc::MAX_CHUNK));
        }
        if shape[0].div_ceil(chunklen) > MAX_CHUNKS {
            return damaged(format!(
                "shape {shape:?} in chunks of {chunklen} rows makes more than {MAX_CHUNKS} chunk files"
            ));
        }
        let cparams = storage.get("cparams");
        Ok(Carray {
            shape,
            dtype,
            chunklen,
            dflt,
            dflt_bytes,
            clevel: cparams.and_then(|c| c.get("clevel")).and_then(Value::as_u64),
            cname: cparams.and_then(|c| c.get("cname")).and_then(Value::as_str).map(str::to_string),
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.shape[1..].iter().product::<u64>() * self.dtype.size as u64
    }

    /// Chunks holding the array's rows.
    pub fn nchunks(&self) -> u64 {
        self.shape[0].div_ceil(self.chunklen)
    }

    /// Rows in chunk `i`.
    pub fn rows_in(&self, i: u64) -> u64 {
        self.chunklen.min(self.shape[0].saturating_sub(i * self.chunklen))
    }
}

/// Checks a chunk file's own 16-byte header.
pub fn check_chunk_header(bytes: &[u8]) -> Result<()> {
    let Some(h) = bytes.get(..CHUNK_HEADER_LEN as usize) else { return damaged("chunk file cut short") };
    if &h[..4] != b"blpk" || h[4] != 1 {
        return damaged("chunk file has no bcolz chunk header (blpk, version 1)");
    }
    if i64::from_le_bytes(h[8..16].try_into().expect("eight bytes")) != 1 {
        return damaged("chunk file does not hold exactly one chunk");
    }
    Ok(())
}

/// The column names in a ctable's `__rootdirs__`.
pub fn columns(rootdirs: &[u8]) -> Result<Vec<String>> {
    let names = json(ROOTDIRS, rootdirs)?;
    let names: Option<Vec<String>> = names
        .get("names")
        .and_then(Value::as_array)
        .and_then(|n| n.iter().map(|n| n.as_str().map(str::to_string)).collect());
    names.ok_or_else(|| BlzError::Damaged("__rootdirs__ has no list of names".into()))
}

/// The attributes in an `__attrs__` file (none when it is empty).
pub fn attributes(bytes: &[u8]) -> Result<serde_json::Map<String, Value>> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Default::default());
    }
    match json(ATTRS, bytes)? {
        Value::Object(map) => Ok(map),
        other => damaged(format!("__attrs__ is {other}, not an object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_bcolz_writes() {
        let sizes = br#"{"shape": [1050, 2], "nbytes": 16800, "cbytes": 6807}"#;
        let storage = br#"{"dtype": "float64", "cparams": {"clevel": 5, "shuffle": 1, "cname": "lz4", "quantize": 0}, "chunklen": 100, "expectedlen": 1050, "dflt": 0.5}"#;
        let carray = Carray::parse(sizes, storage).unwrap();
        assert_eq!((carray.shape.clone(), carray.chunklen, carray.dtype.name), (vec![1050, 2], 100, "float64"));
        assert_eq!((carray.nchunks(), carray.rows_in(10), carray.rows_in(9), carray.row_bytes()), (11, 50, 100, 16));
        assert_eq!(carray.dflt_bytes, 0.5f64.to_le_bytes());
        assert_eq!((carray.clevel, carray.cname.as_deref()), (Some(5), Some("lz4")));
        assert_eq!(columns(br#"{"names": ["open", "day"], "dirs": {}}"#).unwrap(), ["open", "day"]);
        assert_eq!(attributes(br#"{"first_row": {"1": 0}}"#).unwrap()["first_row"], json!({"1": 0}));
        assert!(attributes(b"").unwrap().is_empty());
    }

    #[test]
    fn refuses_and_reports_damage() {
        let sizes = br#"{"shape": [10]}"#;
        assert!(matches!(Carray::parse(sizes, br#"{"dtype": "object", "chunklen": 4}"#), Err(BlzError::Refused(_))));
        assert!(matches!(
            Carray::parse(sizes, br#"{"dtype": [["a", "<i4"]], "chunklen": 4}"#),
            Err(BlzError::Refused(_))
        ));
        assert!(matches!(Carray::parse(sizes, br#"{"dtype": "int32"}"#), Err(BlzError::Damaged(_))));
        assert!(matches!(Carray::parse(b"{", br#"{"dtype": "int32", "chunklen": 4}"#), Err(BlzError::Damaged(_))));
        let huge = br#"{"shape": [1000000000000]}"#;
        assert!(matches!(Carray::parse(huge, br#"{"dtype": "int32", "chunklen": 4}"#), Err(BlzError::Damaged(_))));
        assert!(check_chunk_header(b"blpk\x01\0\0\0\x01\0\0\0\0\0\0\0").is_ok());
        assert!(check_chunk_header(b"blpk\x03\0\0\0\x01\0\0\0\0\0\0\0").is_err());
        assert!(check_chunk_header(b"blpk").is_err());
        // An overflowing chunk size is refused, not a panic (nor a wrapped product).
        let overflow = br#"{"dtype": "int32", "chunklen": 4611686018427387904}"#;
        assert!(matches!(Carray::parse(sizes, overflow), Err(BlzError::Refused(_))));
        assert!(matches!(Carray::parse(sizes, br#"{"dtype": "<U2", "chunklen": 4}"#), Err(BlzError::Refused(_))));
    }

    #[test]
    fn reads_the_nan_and_infinities_pythons_json_writes() {
        let sizes = br#"{"shape": [25]}"#;
        let nan = Carray::parse(sizes, br#"{"dtype": "float64", "chunklen": 8, "dflt": NaN}"#).unwrap();
        assert_eq!(nan.dflt, json!("NaN"));
        assert!(f64::from_le_bytes(nan.dflt_bytes.try_into().unwrap()).is_nan());
        let inf = Carray::parse(sizes, br#"{"dtype": "<f4", "chunklen": 8, "dflt": -Infinity}"#).unwrap();
        assert_eq!(inf.dflt_bytes, f32::NEG_INFINITY.to_le_bytes());
        let quoted = br#"{"dtype": "float64", "chunklen": 8, "dflt": 0, "note": "NaN \" Infinity"}"#;
        assert!(Carray::parse(sizes, quoted).is_ok(), "words inside strings are left alone");
    }
}
