//! numpy data types as Zarr v3 data types: type strings (`<i4`, `|b1`, `>f8`), with or without
//! the quotes of a Python repr (Bloscpack metadata writes `'<i4'`), and numpy names (`float64`,
//! as bcolz writes them). Object, string, datetime and structured types have no Zarr v3 form here
//! and are refused. Also fill values as the bytes of one item.

use serde_json::Value;

use super::{Result, refused};

/// A numeric or boolean numpy type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dtype {
    /// Zarr v3's name (`int32`).
    pub name: &'static str,
    /// `b` bool, `i` signed, `u` unsigned, `f` float, `c` complex.
    pub kind: char,
    pub size: u8,
    pub big_endian: bool,
}

const TYPES: [(&str, char, u8); 13] = [
    ("bool", 'b', 1),
    ("int8", 'i', 1),
    ("int16", 'i', 2),
    ("int32", 'i', 4),
    ("int64", 'i', 8),
    ("uint8", 'u', 1),
    ("uint16", 'u', 2),
    ("uint32", 'u', 4),
    ("uint64", 'u', 8),
    ("float16", 'f', 2),
    ("float32", 'f', 4),
    ("float64", 'f', 8),
    ("complex64", 'c', 8),
];

/// A float fill value: a number, or Zarr v3's "NaN", "Infinity" and "-Infinity".
fn float(value: &Value) -> Option<f64> {
    match value.as_str() {
        Some("NaN") => Some(f64::NAN),
        Some("Infinity") => Some(f64::INFINITY),
        Some("-Infinity") => Some(f64::NEG_INFINITY),
        _ => value.as_f64(),
    }
}

impl Dtype {
    /// Reads a numpy type string or name.
    pub fn parse(text: &str) -> Result<Dtype> {
        let text = text.trim();
        let unquoted = text
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))
            .unwrap_or(text);
        if unquoted.starts_with('[') || unquoted.starts_with('(') {
            return refused(format!("structured dtype {text} is not supported"));
        }
        let find = |kind: char, size: u8| {
            if (kind, size) == ('c', 16) {
                return Some(("complex128", 'c', 16));
            }
            TYPES.iter().copied().find(|(_, k, s)| *k == kind && *s == size)
        };
        let by_name = TYPES.iter().copied().chain([("complex128", 'c', 16)]).find(|(n, _, _)| *n == unquoted);
        let found = match unquoted.as_bytes() {
            _ if by_name.is_some() => by_name.map(|t| (t, false)),
            [order @ (b'<' | b'>' | b'|' | b'='), kind, size @ ..] => {
                let size: Option<u8> = std::str::from_utf8(size).ok().and_then(|s| s.parse().ok());
                let kind = *kind as char;
                size.and_then(|size| find(kind, size)).map(|t| (t, *order == b'>' && size > Some(1)))
            }
            _ => None,
        };
        match found {
            Some(((name, kind, size), big_endian)) => Ok(Dtype { name, kind, size, big_endian }),
            None => refused(format!("dtype {text} has no Zarr v3 data type here (object, string, datetime?)")),
        }
    }

    /// `value` (a JSON number or boolean) as the bytes of one item; `None` when it does not fit.
    pub fn encode(&self, value: &Value) -> Option<Vec<u8>> {
        let mut bytes: Vec<u8> = match (self.kind, self.size) {
            ('b', _) => vec![u8::from(value.as_bool().or_else(|| value.as_f64().map(|v| v != 0.0))?)],
            ('i', n) => {
                let v = value.as_i64().or_else(|| value.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))?;
                let bytes = v.to_le_bytes();
                let fits = (n == 8) || (v >= -(1i64 << (8 * n - 1)) && v < (1i64 << (8 * n - 1)));
                fits.then(|| bytes[..n as usize].to_vec())?
            }
            ('u', n) => {
                let v = value
                    .as_u64()
                    .or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))?;
                (n == 8 || v < (1u64 << (8 * n))).then(|| v.to_le_bytes()[..n as usize].to_vec())?
            }
            ('f', 4) => (float(value)? as f32).to_le_bytes().to_vec(),
            ('f', 8) => float(value)?.to_le_bytes().to_vec(),
            // float16 and complex: only zero, whose bytes are all zero.
            (_, n) => (value.as_f64()? == 0.0).then(|| vec![0; n as usize])?,
        };
        if self.big_endian {
            bytes.reverse();
        }
        Some(bytes)
    }

    /// The fill value as `zarr.json` writes it for this type.
    pub fn fill_value(&self, value: &Value) -> Value {
        match self.kind {
            'b' => Value::from(value.as_bool().unwrap_or_else(|| value.as_f64().is_some_and(|v| v != 0.0))),
            'i' | 'u' => value.clone(),
            'c' => Value::from(vec![value.clone(), Value::from(0.0)]),
            _ => value.as_f64().map_or(Value::from(0.0), Value::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_type_strings_reprs_and_names() {
        let parse = |t| Dtype::parse(t).map(|d| (d.name, d.size, d.big_endian));
        assert_eq!(parse("'<i4'"), Ok(("int32", 4, false)));
        assert_eq!(parse(">f8"), Ok(("float64", 8, true)));
        assert_eq!(parse("|b1"), Ok(("bool", 1, false)));
        assert_eq!(parse("|u1"), Ok(("uint8", 1, false)));
        assert_eq!(parse("float64"), Ok(("float64", 8, false)));
        assert_eq!(parse("uint32"), Ok(("uint32", 4, false)));
        assert_eq!(parse("<c16"), Ok(("complex128", 16, false)));
        for bad in ["'|O'", "object", "[('a', '<i4')]", "|S10", "<M8[ns]", "", "'<i3'"] {
            assert!(Dtype::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encodes_fill_values() {
        let d = |t| Dtype::parse(t).unwrap();
        assert_eq!(d("<i4").encode(&json!(-2)), Some(vec![0xfe, 0xff, 0xff, 0xff]));
        assert_eq!(d(">u2").encode(&json!(1)), Some(vec![0, 1]));
        assert_eq!(d("<f8").encode(&json!(1.5)), Some(1.5f64.to_le_bytes().to_vec()));
        assert_eq!(d("|u1").encode(&json!(300)), None);
        assert_eq!(d("|b1").encode(&json!(true)), Some(vec![1]));
        assert_eq!(d("<i8").encode(&json!(0.0)), Some(vec![0; 8]));
        assert_eq!(d("<f2").encode(&json!(1.0)), None);
    }
}
