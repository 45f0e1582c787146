//! The parquet layout of a reference set (fsspec's `LazyReferenceMapper`, which kerchunk's
//! `refs_to_dataframe` and VirtualiZarr write through): `.zmetadata` holds every metadata document
//! and the `record_size`; the references of the chunks of the array in directory `VAR` are rows of
//! `VAR/refs.N.parq`, row `n % record_size` of record `n / record_size` for the chunk whose
//! coordinates are `n` in C order over the chunk grid. A row holds inline bytes (`raw`), or a URL
//! (`path`) with an `offset` and a `size` (both 0: the whole file), or neither: no chunk.

use bytes::Bytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::Value;

use super::{Reference, Result, Urls, bad};
use crate::format::foreign::caught;

/// The name of the file holding the metadata documents and the record size.
pub const METADATA: &str = ".zmetadata";

/// What `.zmetadata` says.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    /// Each metadata document's key and bytes.
    pub documents: Vec<(String, Vec<u8>)>,
    /// How many rows each record file holds.
    pub record_size: u64,
}

/// True when `.zmetadata` (already JSON) is a parquet reference set's rather than a consolidated
/// Zarr v2 store's: it has a record size.
pub fn is_reference_metadata(doc: &Value) -> bool {
    doc.get("record_size").is_some()
}

/// The documents and record size of `.zmetadata`.
pub fn metadata(bytes: &[u8]) -> Result<Metadata> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let record_size = doc
        .get("record_size")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("no positive record_size"))?;
    let Some(Value::Object(documents)) = doc.get("metadata") else { return Err(bad("no \"metadata\" object")) };
    let documents = documents
        .iter()
        .map(|(key, doc)| {
            let bytes = match doc {
                Value::String(text) => text.clone().into_bytes(),
                other => other.to_string().into_bytes(),
            };
            (key.clone(), bytes)
        })
        .collect();
    Ok(Metadata { documents, record_size })
}

/// The chunk grid of one array, from its `.zarray`: where each chunk key's row is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkGrid {
    /// Chunks along each dimension (a scalar array: none, and one chunk).
    counts: Vec<u64>,
}

impl ChunkGrid {
    pub fn of_zarray(bytes: &[u8]) -> Result<ChunkGrid> {
        let doc: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!(".zarray is not JSON: {e}")))?;
        let numbers = |name: &str| -> Result<Vec<u64>> {
            let list = doc.get(name).and_then(Value::as_array).ok_or_else(|| bad(format!(".zarray has no {name}")))?;
            list.iter().map(|n| n.as_u64().ok_or_else(|| bad(format!(".zarray's {name} holds {n}")))).collect()
        };
        let (shape, chunks) = (numbers("shape")?, numbers("chunks")?);
        if shape.len() != chunks.len() || chunks.contains(&0) {
            return Err(bad(format!(".zarray's chunks {chunks:?} do not fit its shape {shape:?}")));
        }
        // fsspec finds a chunk's row by splitting its key at dots.
        match doc.get("dimension_separator").and_then(Value::as_str) {
            None | Some(".") => {}
            Some(other) => {
                return Err(bad(format!(".zarray's dimension_separator {other:?} (parquet references use \".\")")));
            }
        }
        let counts: Vec<u64> = shape.iter().zip(&chunks).map(|(s, c)| s.div_ceil(*c)).collect();
        counts
            .iter()
            .try_fold(1u64, |n, c| n.checked_mul(*c))
            .ok_or_else(|| bad(format!(".zarray's grid {counts:?} has too many chunks")))?;
        Ok(ChunkGrid { counts })
    }

    /// How many chunks the grid has.
    pub fn len(&self) -> u64 {
        self.counts.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of the chunk at `name` (relative to the array's directory), in C order.
    pub fn number(&self, name: &str) -> Option<u64> {
        if self.counts.is_empty() {
            return (name == "0").then_some(0);
        }
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() != self.counts.len() {
            return None;
        }
        let mut n = 0u64;
        for (part, count) in parts.iter().zip(&self.counts) {
            // Keys are written plainly: "01" or "+1" would name no chunk.
            let i: u64 = part.parse().ok().filter(|i: &u64| i.to_string() == *part)?;
            if i >= *count {
                return None;
            }
            n = n * count + i;
        }
        Some(n)
    }

    /// The name of chunk `n`.
    pub fn name(&self, mut n: u64) -> String {
        if self.counts.is_empty() {
            return "0".into();
        }
        let mut parts = vec![0; self.counts.len()];
        for (part, count) in parts.iter_mut().zip(&self.counts).rev() {
            *part = n % count;
            n /= count;
        }
        parts.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
    }
}

/// The name of record file `n` in an array's directory.
pub fn record_name(n: u64) -> String {
    format!("refs.{n}.parq")
}

/// The rows of one record file: each chunk's reference, or none.
pub fn record(bytes: Bytes) -> Result<Vec<Option<Reference>>> {
    caught(|| rows(bytes)).unwrap_or_else(|| Err(bad("the parquet reader failed on it")))
}

fn rows(bytes: Bytes) -> Result<Vec<Option<Reference>>> {
    let reader = SerializedFileReader::new(bytes).map_err(|e| bad(format!("not a readable parquet file: {e}")))?;
    let rows = reader.get_row_iter(None).map_err(|e| bad(format!("cannot read its rows: {e}")))?;
    let mut urls = Urls::default();
    let mut out = Vec::new();
    for row in rows {
        let row = row.map_err(|e| bad(format!("cannot read row {}: {e}", out.len())))?;
        let (mut path, mut offset, mut size, mut raw) = (None, 0u64, 0u64, None);
        for (name, field) in row.get_column_iter() {
            match (name.as_str(), field) {
                (_, Field::Null) => {}
                ("path", Field::Str(text)) => path = Some(text.clone()),
                ("path", Field::Bytes(bytes)) => {
                    path = Some(String::from_utf8(bytes.data().to_vec()).map_err(|_| bad("a path that is not UTF-8"))?)
                }
                ("raw", Field::Bytes(bytes)) => raw = Some(bytes.data().to_vec()),
                ("raw", Field::Str(text)) => raw = Some(text.clone().into_bytes()),
                ("offset", field) => offset = whole(field, "offset")?,
                ("size", field) => size = whole(field, "size")?,
                _ => {}
            }
        }
        out.push(match (raw, path) {
            (Some(raw), _) => Some(Reference::Inline(raw.into())),
            (None, None) => None,
            (None, Some(url)) if offset == 0 && size == 0 => {
                Some(Reference::Range { url: urls.get(&url), start: 0, len: None })
            }
            (None, Some(url)) => Some(Reference::Range { url: urls.get(&url), start: offset, len: Some(size) }),
        });
    }
    Ok(out)
}

fn whole(field: &Field, column: &str) -> Result<u64> {
    let n = match field {
        Field::Long(n) => *n,
        Field::Int(n) => i64::from(*n),
        Field::ULong(n) => i64::try_from(*n).unwrap_or(-1),
        Field::UInt(n) => i64::from(*n),
        other => return Err(bad(format!("{column} {other} is not a whole number"))),
    };
    u64::try_from(n).map_err(|_| bad(format!("a negative {column} ({n})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_numbers_are_c_order_over_the_grid() {
        let grid =
            ChunkGrid::of_zarray(br#"{"shape": [100, 60], "chunks": [32, 25], "dimension_separator": "."}"#).unwrap();
        assert_eq!(grid.len(), 12);
        assert_eq!(grid.number("1.2"), Some(5));
        assert_eq!(grid.name(5), "1.2");
        for name in ["4.0", "1", "1.2.0", "01.2", "+1.2", "a.b"] {
            assert_eq!(grid.number(name), None, "{name}");
        }
        let scalar = ChunkGrid::of_zarray(br#"{"shape": [], "chunks": []}"#).unwrap();
        assert_eq!((scalar.len(), scalar.number("0"), scalar.name(0).as_str()), (1, Some(0), "0"));
        for zarray in
            [&br#"{"shape": [1], "chunks": [0]}"#[..], br#"{"shape": [1]}"#, br#"{"shape": [1, 2], "chunks": [1]}"#]
        {
            assert!(ChunkGrid::of_zarray(zarray).is_err());
        }
    }

    #[test]
    fn metadata_needs_a_record_size() {
        let meta = metadata(br#"{"metadata": {".zgroup": {"zarr_format": 2}}, "record_size": 4}"#).unwrap();
        assert_eq!(meta.record_size, 4);
        assert_eq!(meta.documents, [(".zgroup".to_string(), br#"{"zarr_format":2}"#.to_vec())]);
        assert!(metadata(br#"{"metadata": {}, "zarr_consolidated_format": 1}"#).is_err());
    }

    #[test]
    fn records_of_both_writers_read_alike() {
        let data = |name: &str| Bytes::from(std::fs::read(format!("tests/data/kerchunk/{name}")).unwrap());
        for writer in ["fastparquet", "pyarrow"] {
            let temp = record(data(&format!("{writer}-temp.0.parq"))).unwrap();
            let starts: Vec<_> = temp
                .iter()
                .map(|r| match r {
                    Some(Reference::Range { url, start, len: Some(len) }) if &**url == "data.h5" => (*start, *len),
                    other => panic!("{writer}: {other:?}"),
                })
                .collect();
            assert_eq!(starts, [(9001, 1013), (10014, 1026), (11040, 559), (11599, 894)], "{writer}");
            let flag = record(data(&format!("{writer}-flag.0.parq"))).unwrap();
            assert_eq!(flag, [Some(Reference::Inline([7u8][..].into())), None, None, None], "{writer}");
        }
    }

    /// Record files of both writers cut short or with a byte changed are errors or (where
    /// the change missed what is read) rows, never a panic that escapes: the parquet crate panics
    /// on some (fuzz/fuzz_targets/kerchunk.rs found "Decoder for dict should have been set").
    #[test]
    fn damaged_records_are_errors() {
        assert!(record(Bytes::from_static(b"PAR1 not really")).is_err());
        assert!(record(Bytes::new()).is_err());
        for writer in ["fastparquet", "pyarrow"] {
            for name in ["temp", "flag"] {
                let bytes = std::fs::read(format!("tests/data/kerchunk/{writer}-{name}.0.parq")).unwrap();
                // A stride, not every byte: the unit tests share two cores with timing-bound ones.
                for at in (0..bytes.len()).step_by(7) {
                    let _ = record(Bytes::copy_from_slice(&bytes[..at]));
                    let mut changed = bytes.clone();
                    changed[at] ^= 0xa5;
                    let _ = record(Bytes::from(changed));
                }
            }
        }
    }
}
