//! Zarr v2 metadata for a Zarr v3 array, as the Zarr v2 view will show it: the `.zarray` and
//! `.zattrs` with which a v2 reader (zarr-python 2, GDAL before 3.11, n5-zarr) reads the very
//! chunk bytes the v3 view serves, less a trailing crc32c (which the view checks and strips), or
//! why v2 cannot express the array. The input is an unsharded array document: an unsharded v3
//! array as stored, or a sharded one as the v3 view shows it (its inner chunks).
//!
//! The mapping, readable by zarr-python 2.18: data types to NumPy type strings (`<u2`, `>f8`,
//! `|b1`, `<c16`), fill values with NaN and infinities kept and hex-encoded floats decoded, the
//! `bytes` codec's endianness into the type string, one compressor after it (gzip, zstd without
//! a `checksum` key, blosc), a trailing crc32c stripped, a full-reversal transpose as order F,
//! the chunk key separator as `dimension_separator`, and dimension names as xarray's
//! `_ARRAY_DIMENSIONS`.

use serde_json::{Map, Value, json};

use super::error::Unsupported;

/// The v2 form of one array.
#[derive(Debug, Clone, PartialEq)]
pub struct V2Array {
    /// The `.zarray` document.
    pub zarray: Value,
    /// The `.zattrs` document.
    pub zattrs: Value,
    /// True when each chunk ends in a crc32c of the rest, to be checked and left out.
    pub strip_crc32c: bool,
}

/// The v2 form of the v3 array document `doc`.
pub fn v2_array(doc: &Value) -> Result<V2Array, Unsupported> {
    let field = |name: &str| doc.get(name).ok_or_else(|| Unsupported(format!("no {name}")));
    if doc.get("node_type") != Some(&json!("array")) {
        return Err("not an array".into());
    }
    let shape = field("shape")?.clone();
    let grid = field("chunk_grid")?;
    if grid.get("name") != Some(&json!("regular")) {
        return Err("the chunk grid is not regular".into());
    }
    let chunks = grid.pointer("/configuration/chunk_shape").ok_or("no chunk_shape")?.clone();
    if doc.get("storage_transformers").and_then(Value::as_array).is_some_and(|t| !t.is_empty()) {
        return Err("storage transformers have no v2 form".into());
    }
    let codecs = Codecs::of(field("codecs")?.as_array().ok_or("codecs is not a list")?, rank(&shape)?)?;
    let data_type = field("data_type")?.as_str().ok_or("the data type is not a name (no v2 form)")?;
    let (dtype, kind) = dtype(data_type, codecs.big_endian)?;
    let fill_value = fill_value(field("fill_value")?, kind)?;
    let mut zarray = Map::new();
    zarray.insert("zarr_format".into(), json!(2));
    zarray.insert("shape".into(), shape);
    zarray.insert("chunks".into(), chunks);
    zarray.insert("dtype".into(), json!(dtype));
    zarray.insert("compressor".into(), codecs.compressor.unwrap_or(Value::Null));
    zarray.insert("fill_value".into(), fill_value);
    zarray.insert("order".into(), json!(if codecs.fortran { "F" } else { "C" }));
    zarray.insert("filters".into(), Value::Null);
    zarray.insert("dimension_separator".into(), json!(separator(doc.get("chunk_key_encoding"))?));
    let mut zattrs = doc.get("attributes").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(names) = doc.get("dimension_names").and_then(Value::as_array)
        && names.iter().all(Value::is_string)
    {
        zattrs.insert("_ARRAY_DIMENSIONS".into(), Value::Array(names.clone()));
    }
    Ok(V2Array { zarray: Value::Object(zarray), zattrs: Value::Object(zattrs), strip_crc32c: codecs.crc32c })
}

/// The stored v3 document `stored` (a group or an array) with the attributes of the `.zattrs`
/// `written`: xarray's `_ARRAY_DIMENSIONS` become an array's dimension names, the rest its
/// attributes.
pub fn with_zattrs(stored: &Value, written: &Value) -> Result<Value, Unsupported> {
    let mut attributes = written.as_object().ok_or(".zattrs is not a JSON object")?.clone();
    if !stored.is_object() {
        return Err("the stored document is not a JSON object".into());
    }
    let mut doc = stored.clone();
    let names = attributes.remove("_ARRAY_DIMENSIONS");
    if stored.get("node_type") == Some(&json!("array")) {
        let rank = rank(stored.get("shape").ok_or("no shape")?)?;
        match names {
            Some(Value::Array(names)) if names.len() == rank && names.iter().all(|n| n.is_string() || n.is_null()) => {
                doc["dimension_names"] = Value::Array(names);
            }
            Some(other) => {
                return Err(format!("_ARRAY_DIMENSIONS {other} is not a list of {rank} names").into());
            }
            None => {
                doc.as_object_mut().expect("an array document is an object").remove("dimension_names");
            }
        }
    } else if let Some(names) = names {
        attributes.insert("_ARRAY_DIMENSIONS".into(), names);
    }
    doc["attributes"] = Value::Object(attributes);
    Ok(doc)
}

/// The stored v3 array document `stored` resized as the `.zarray` `written` says, given the
/// `.zarray` the view shows for it now (`shown`): the shape is the one field a v2 writer may
/// change; any other change has no faithful v3 form here.
pub fn with_zarray(stored: &Value, shown: &Value, written: &Value) -> Result<Value, Unsupported> {
    let written = written.as_object().ok_or(".zarray is not a JSON object")?;
    if !stored.is_object() {
        return Err("the stored document is not a JSON object".into());
    }
    let shown = shown.as_object().ok_or("the shown .zarray is not a JSON object")?;
    // zarr-python 2 leaves out a default dimension_separator of "." when it writes, and
    // numcodecs adds the defaults of its compressor's other settings (zstd's checksum: false).
    let differs = |key: &String| match (shown.get(key), written.get(key)) {
        (Some(Value::String(s)), None) if key == "dimension_separator" => s != ".",
        (Some(Value::Object(shown)), Some(Value::Object(written))) if key == "compressor" => {
            shown.iter().any(|(k, v)| written.get(k) != Some(v))
        }
        (a, b) => a != b,
    };
    let changed: Vec<&String> = shown.keys().chain(written.keys()).filter(|k| *k != "shape" && differs(k)).collect();
    if let Some(field) = changed.first() {
        return Err(format!("only the shape of .zarray can change through the Zarr v2 view, not {field:?}").into());
    }
    let shape = written.get("shape").filter(|s| s.as_array().is_some_and(|d| d.iter().all(Value::is_u64)));
    let shape = shape.ok_or(".zarray shape is not a list of non-negative integers")?;
    if rank(shape)? != rank(stored.get("shape").ok_or("no shape")?)? {
        return Err("a resize cannot change the number of dimensions".into());
    }
    let mut doc = stored.clone();
    doc["shape"] = shape.clone();
    Ok(doc)
}

/// The v3 document of an array created through the v2 view with the `.zarray` `zarray`: the
/// inverse of [`v2_array`] (numpy type string to data type and byte order, order F to a
/// reversing transpose, the compressor to its v3 codec, `dimension_separator` to the `v2` chunk
/// key encoding), so that the chunk files written under v2 keys are the chunks of the v3 array.
pub fn v3_array(zarray: &Value) -> Result<Value, Unsupported> {
    let field = |name: &str| zarray.get(name).ok_or_else(|| Unsupported(format!(".zarray has no {name}")));
    if zarray.get("zarr_format") != Some(&json!(2)) {
        return Err(".zarray is not zarr_format 2".into());
    }
    let sizes = |name: &str| -> Result<Vec<u64>, Unsupported> {
        let list = field(name)?.as_array().ok_or_else(|| Unsupported(format!(".zarray {name} is not a list")))?;
        list.iter()
            .map(|v| v.as_u64().ok_or_else(|| Unsupported(format!(".zarray {name} is not a list of sizes"))))
            .collect()
    };
    let (shape, chunks) = (sizes("shape")?, sizes("chunks")?);
    if chunks.len() != shape.len() || chunks.contains(&0) {
        return Err(format!("chunks {chunks:?} do not fit shape {shape:?}").into());
    }
    let dtype = field("dtype")?.as_str().ok_or("a structured dtype has no v3 form here")?;
    let (order, code) = dtype.split_at_checked(1).ok_or("the dtype is empty")?;
    let data_type = match code {
        "b1" => "bool",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "c8" => "complex64",
        "c16" => "complex128",
        _ => return Err(format!("the dtype {dtype} has no v3 form here").into()),
    };
    let item_size: u64 = code[1..].parse().expect("a size");
    let mut codecs = Vec::new();
    match field("order")?.as_str() {
        Some("C") => {}
        Some("F") if shape.len() > 1 => codecs
            .push(json!({"name": "transpose", "configuration": {"order": (0..shape.len()).rev().collect::<Vec<_>>()}})),
        Some("F") => {}
        _ => return Err(".zarray order is neither C nor F".into()),
    }
    codecs.push(match (order, item_size) {
        (_, 1) => json!({"name": "bytes"}),
        (">", _) => json!({"name": "bytes", "configuration": {"endian": "big"}}),
        ("<" | "|" | "=", _) => json!({"name": "bytes", "configuration": {"endian": "little"}}),
        _ => return Err(format!("the byte order of {dtype} is unknown").into()),
    });
    if !matches!(zarray.get("filters"), None | Some(Value::Null)) && zarray["filters"] != json!([]) {
        return Err("filters have no v3 form here".into());
    }
    if let Some(compressor) = zarray.get("compressor").filter(|c| !c.is_null()) {
        codecs.push(codec_of(compressor, item_size)?);
    }
    let fill_value = match field("fill_value")? {
        Value::Null if data_type == "bool" => json!(false),
        Value::Null => json!(0),
        other => other.clone(),
    };
    let separator = match zarray.get("dimension_separator").and_then(Value::as_str) {
        None | Some(".") => ".",
        Some("/") => "/",
        Some(other) => return Err(format!("dimension_separator {other:?} is neither . nor /").into()),
    };
    Ok(json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": separator}},
        "fill_value": fill_value,
        "codecs": codecs,
        "attributes": {},
    }))
}

/// The v3 codec of a numcodecs compressor: the inverse of [`compressor_of`].
fn codec_of(compressor: &Value, item_size: u64) -> Result<Value, Unsupported> {
    let get = |key: &str| compressor.get(key).cloned().ok_or_else(|| Unsupported(format!("compressor without {key}")));
    match compressor.get("id").and_then(Value::as_str) {
        Some("gzip") => Ok(json!({"name": "gzip", "configuration": {"level": get("level")?}})),
        Some("zstd") => Ok(
            json!({"name": "zstd", "configuration": {"level": get("level")?, "checksum": compressor.get("checksum").cloned().unwrap_or(json!(false))}}),
        ),
        Some("blosc") => {
            // numcodecs' AUTOSHUFFLE (-1) is bit shuffle for one-byte items, byte shuffle otherwise.
            let shuffle = match get("shuffle")?.as_i64() {
                Some(0) => "noshuffle",
                Some(1) => "shuffle",
                Some(2) => "bitshuffle",
                Some(-1) if item_size == 1 => "bitshuffle",
                Some(-1) => "shuffle",
                _ => return Err("blosc with an unknown shuffle".into()),
            };
            let blocksize = compressor.get("blocksize").cloned().unwrap_or(json!(0));
            Ok(
                json!({"name": "blosc", "configuration": {"cname": get("cname")?, "clevel": get("clevel")?, "shuffle": shuffle, "typesize": item_size, "blocksize": blocksize}}),
            )
        }
        _ => Err(format!("the compressor {compressor} has no v3 form here").into()),
    }
}

/// The `.zgroup` and `.zattrs` of the v3 group document `doc`.
pub fn v2_group(doc: &Value) -> (Value, Value) {
    let attributes = doc.get("attributes").filter(|a| a.is_object()).cloned().unwrap_or_else(|| json!({}));
    (json!({"zarr_format": 2}), attributes)
}

fn rank(shape: &Value) -> Result<usize, Unsupported> {
    Ok(shape.as_array().ok_or("shape is not a list")?.len())
}

/// What a v3 codec chain means in v2 terms.
#[derive(Debug, Default)]
struct Codecs {
    fortran: bool,
    big_endian: bool,
    compressor: Option<Value>,
    crc32c: bool,
}

impl Codecs {
    fn of(codecs: &[Value], rank: usize) -> Result<Self, Unsupported> {
        let mut found = Codecs::default();
        let mut rest = codecs;
        if let Some((first, tail)) = rest.split_first()
            && name(first)? == "transpose"
        {
            let order =
                first.pointer("/configuration/order").and_then(Value::as_array).ok_or("transpose without order")?;
            let reversed: Vec<Value> = (0..rank as u64).rev().map(Value::from).collect();
            if *order != reversed {
                return Err("a transpose other than the full reversal (order F) has no v2 form".into());
            }
            found.fortran = rank > 1;
            rest = tail;
        }
        let (bytes, mut rest) = rest.split_first().ok_or("no array-to-bytes codec")?;
        if name(bytes)? != "bytes" {
            return Err(format!("the {} codec has no v2 form", name(bytes)?).into());
        }
        found.big_endian = bytes.pointer("/configuration/endian") == Some(&json!("big"));
        if let Some((last, head)) = rest.split_last()
            && name(last)? == "crc32c"
        {
            found.crc32c = true;
            rest = head;
        }
        match rest {
            [] => {}
            [compressor] => found.compressor = Some(compressor_of(compressor)?),
            _ => return Err("more than one compressor has no v2 form here".into()),
        }
        Ok(found)
    }
}

fn name(codec: &Value) -> Result<&str, Unsupported> {
    codec.get("name").and_then(Value::as_str).ok_or_else(|| "a codec without a name".into())
}

/// The numcodecs configuration of a v3 bytes-to-bytes codec.
fn compressor_of(codec: &Value) -> Result<Value, Unsupported> {
    let config = codec.get("configuration").cloned().unwrap_or_else(|| json!({}));
    let get = |key: &str| {
        config.get(key).cloned().ok_or_else(|| Unsupported(format!("{} without {key}", name(codec).unwrap_or("?"))))
    };
    match name(codec)? {
        "gzip" => Ok(json!({"id": "gzip", "level": get("level")?})),
        // numcodecs of zarr-python 2.18 refuses a `checksum` key; each frame says whether it has one.
        "zstd" => Ok(json!({"id": "zstd", "level": get("level")?})),
        "blosc" => {
            let shuffle = match get("shuffle")?.as_str() {
                Some("noshuffle") => 0,
                Some("shuffle") => 1,
                Some("bitshuffle") => 2,
                _ => return Err("blosc with an unknown shuffle".into()),
            };
            let blocksize = config.get("blocksize").cloned().unwrap_or(json!(0));
            Ok(
                json!({"id": "blosc", "cname": get("cname")?, "clevel": get("clevel")?, "shuffle": shuffle, "blocksize": blocksize}),
            )
        }
        "crc32c" => Err("a crc32c codec before the last has no v2 form".into()),
        other => Err(format!("the {other} codec has no v2 form").into()),
    }
}

/// What kind of value a data type holds, for its fill value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueKind {
    Bool,
    Integer,
    Float { bits: u32 },
    Complex { bits: u32 },
}

/// The NumPy type string of a v3 data type, with the byte order the `bytes` codec gives it.
fn dtype(data_type: &str, big_endian: bool) -> Result<(String, ValueKind), Unsupported> {
    let order = if big_endian { '>' } else { '<' };
    let (code, size, kind) = match data_type {
        "bool" => return Ok(("|b1".into(), ValueKind::Bool)),
        "int8" => return Ok(("|i1".into(), ValueKind::Integer)),
        "uint8" => return Ok(("|u1".into(), ValueKind::Integer)),
        "int16" => ('i', 2, ValueKind::Integer),
        "int32" => ('i', 4, ValueKind::Integer),
        "int64" => ('i', 8, ValueKind::Integer),
        "uint16" => ('u', 2, ValueKind::Integer),
        "uint32" => ('u', 4, ValueKind::Integer),
        "uint64" => ('u', 8, ValueKind::Integer),
        "float16" => ('f', 2, ValueKind::Float { bits: 16 }),
        "float32" => ('f', 4, ValueKind::Float { bits: 32 }),
        "float64" => ('f', 8, ValueKind::Float { bits: 64 }),
        "complex64" => ('c', 8, ValueKind::Complex { bits: 32 }),
        "complex128" => ('c', 16, ValueKind::Complex { bits: 64 }),
        other => return Err(format!("the data type {other} has no v2 form").into()),
    };
    Ok((format!("{order}{code}{size}"), kind))
}

/// The v2 fill value of a v3 one.
fn fill_value(fill: &Value, kind: ValueKind) -> Result<Value, Unsupported> {
    match (kind, fill) {
        (ValueKind::Bool, Value::Bool(_)) | (ValueKind::Integer, Value::Number(_)) => Ok(fill.clone()),
        (ValueKind::Float { bits }, _) => float_fill(fill, bits),
        (ValueKind::Complex { bits }, Value::Array(parts)) if parts.len() == 2 => {
            Ok(Value::Array(parts.iter().map(|p| float_fill(p, bits)).collect::<Result<_, _>>()?))
        }
        _ => Err(format!("the fill value {fill} does not fit the data type").into()),
    }
}

/// A float fill value: numbers and "NaN", "Infinity", "-Infinity" as they are (zarr-python 2
/// reads them so), hex-encoded bit patterns as the value they stand for.
fn float_fill(fill: &Value, bits: u32) -> Result<Value, Unsupported> {
    match fill {
        Value::Number(_) => Ok(fill.clone()),
        Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => Ok(fill.clone()),
        Value::String(s) if s.starts_with("0x") => {
            let raw =
                u64::from_str_radix(&s[2..], 16).map_err(|_| Unsupported(format!("the fill value {s} is not hex")))?;
            let value = match bits {
                16 => half_to_f64(raw as u16),
                32 => f32::from_bits(raw as u32) as f64,
                _ => f64::from_bits(raw),
            };
            Ok(if value.is_nan() {
                json!("NaN")
            } else if value.is_infinite() {
                json!(if value > 0.0 { "Infinity" } else { "-Infinity" })
            } else {
                json!(value)
            })
        }
        _ => Err(format!("the fill value {fill} is not a number").into()),
    }
}

fn half_to_f64(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f64::from(bits & 0x3ff);
    match exponent {
        0 => sign * fraction * 2f64.powi(-24),
        31 if fraction == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + fraction / 1024.0) * 2f64.powi(exponent - 15),
    }
}

/// The v2 `dimension_separator` of a v3 chunk key encoding.
fn separator(encoding: Option<&Value>) -> Result<&'static str, Unsupported> {
    let Some(encoding) = encoding else { return Ok("/") };
    let default = match encoding.get("name").and_then(Value::as_str) {
        Some("default") => "/",
        Some("v2") => ".",
        _ => return Err("an unknown chunk key encoding".into()),
    };
    match encoding.pointer("/configuration/separator").and_then(Value::as_str) {
        None => Ok(default),
        Some("/") => Ok("/"),
        Some(".") => Ok("."),
        Some(other) => Err(format!("the separator {other:?} has no v2 form").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(data_type: &str, fill: Value, codecs: Value) -> Value {
        json!({
            "zarr_format": 3, "node_type": "array", "shape": [10, 6], "data_type": data_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 3]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "fill_value": fill, "codecs": codecs, "attributes": {"units": "K"}, "dimension_names": ["y", "x"]
        })
    }

    const BYTES: &str = r#"{"name": "bytes", "configuration": {"endian": "little"}}"#;

    fn codecs(rest: &[Value]) -> Value {
        let mut all = vec![serde_json::from_str::<Value>(BYTES).unwrap()];
        all.extend_from_slice(rest);
        Value::Array(all)
    }

    #[test]
    fn a_gzip_array_with_a_crc32c_maps_field_by_field() {
        let doc = array(
            "uint16",
            json!(7),
            codecs(&[json!({"name": "gzip", "configuration": {"level": 5}}), json!({"name": "crc32c"})]),
        );
        let v2 = v2_array(&doc).unwrap();
        assert_eq!(
            v2.zarray,
            json!({"zarr_format": 2, "shape": [10, 6], "chunks": [4, 3], "dtype": "<u2",
                   "compressor": {"id": "gzip", "level": 5}, "fill_value": 7, "order": "C", "filters": null,
                   "dimension_separator": "."})
        );
        assert_eq!(v2.zattrs, json!({"units": "K", "_ARRAY_DIMENSIONS": ["y", "x"]}));
        assert!(v2.strip_crc32c);
    }

    #[test]
    fn data_types_take_the_bytes_codecs_byte_order() {
        let big = json!([{"name": "bytes", "configuration": {"endian": "big"}}]);
        assert_eq!(
            v2_array(&array("float64", json!(0.5), big.clone())).unwrap().zarray["dtype"],
            "<f8".replace('<', ">")
        );
        assert_eq!(v2_array(&array("bool", json!(false), big.clone())).unwrap().zarray["dtype"], "|b1");
        assert_eq!(v2_array(&array("int8", json!(-1), big)).unwrap().zarray["dtype"], "|i1");
        assert_eq!(v2_array(&array("complex64", json!([1.0, "NaN"]), codecs(&[]))).unwrap().zarray["dtype"], "<c8");
    }

    #[test]
    fn fill_values_keep_nan_and_infinities_and_decode_hex() {
        let fill =
            |data_type, fill| v2_array(&array(data_type, fill, codecs(&[]))).map(|a| a.zarray["fill_value"].clone());
        assert_eq!(fill("float32", json!("NaN")).unwrap(), "NaN");
        assert_eq!(fill("float64", json!("-Infinity")).unwrap(), "-Infinity");
        assert_eq!(fill("float32", json!("0x3fc00000")).unwrap(), 1.5);
        assert_eq!(fill("float64", json!("0x7ff8000000000000")).unwrap(), "NaN");
        assert_eq!(fill("float16", json!("0x3c00")).unwrap(), 1.0);
        assert!(fill("uint8", json!("NaN")).is_err());
    }

    #[test]
    fn compressors_map_to_numcodecs() {
        let compressor =
            |codec| v2_array(&array("uint8", json!(0), codecs(&[codec]))).unwrap().zarray["compressor"].clone();
        assert_eq!(
            compressor(json!({"name": "zstd", "configuration": {"level": 3, "checksum": true}})),
            json!({"id": "zstd", "level": 3})
        );
        assert_eq!(
            compressor(
                json!({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 1, "blocksize": 0}})
            ),
            json!({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0})
        );
    }

    #[test]
    fn only_a_full_reversal_transposes_as_order_f() {
        let transposed = |order: Value| {
            let mut all = vec![json!({"name": "transpose", "configuration": {"order": order}})];
            all.extend(codecs(&[]).as_array().unwrap().iter().cloned());
            v2_array(&array("uint8", json!(0), Value::Array(all)))
        };
        assert_eq!(transposed(json!([1, 0])).unwrap().zarray["order"], "F");
        let cube = json!({"zarr_format": 3, "node_type": "array", "shape": [2, 2, 2], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1, 1]}}, "fill_value": 0,
            "codecs": [{"name": "transpose", "configuration": {"order": [0, 2, 1]}}, {"name": "bytes"}]});
        assert!(v2_array(&cube).unwrap_err().0.contains("transpose"));
    }

    #[test]
    fn what_v2_cannot_express_is_refused_with_the_reason() {
        let refused = |doc: Value| v2_array(&doc).unwrap_err().0;
        assert!(refused(array("string", json!(""), codecs(&[]))).contains("string"));
        assert!(refused(array("uint8", json!(0), codecs(&[json!({"name": "lz77"})]))).contains("lz77"));
        let two = codecs(&[
            json!({"name": "gzip", "configuration": {"level": 1}}),
            json!({"name": "zstd", "configuration": {"level": 1}}),
        ]);
        assert!(refused(array("uint8", json!(0), two)).contains("more than one"));
        let vlen = json!([{"name": "vlen-utf8"}]);
        assert!(refused(array("uint8", json!(0), vlen)).contains("vlen-utf8"));
    }

    #[test]
    fn the_default_key_encoding_without_a_separator_is_slash_separated() {
        let mut doc = array("uint8", json!(0), codecs(&[]));
        doc["chunk_key_encoding"] = json!({"name": "default"});
        assert_eq!(v2_array(&doc).unwrap().zarray["dimension_separator"], "/");
        doc["chunk_key_encoding"] = json!({"name": "v2"});
        assert_eq!(v2_array(&doc).unwrap().zarray["dimension_separator"], ".");
    }

    #[test]
    fn zattrs_written_become_attributes_and_dimension_names() {
        let stored = array("uint8", json!(0), codecs(&[]));
        let written = json!({"units": "K", "_ARRAY_DIMENSIONS": ["y", "x"]});
        let doc = with_zattrs(&stored, &written).unwrap();
        assert_eq!(doc["attributes"], json!({"units": "K"}));
        assert_eq!(doc["dimension_names"], json!(["y", "x"]));
        let doc = with_zattrs(&doc, &json!({})).unwrap();
        assert!(doc.get("dimension_names").is_none());
        assert!(with_zattrs(&stored, &json!({"_ARRAY_DIMENSIONS": 3})).is_err());
        assert!(with_zattrs(&stored, &json!({"_ARRAY_DIMENSIONS": ["x"]})).unwrap_err().0.contains("2 names"));
        assert!(with_zattrs(&json!([1]), &json!({})).is_err());
        assert!(with_zarray(&json!([1]), &json!({}), &json!({})).is_err());
        let group = json!({"zarr_format": 3, "node_type": "group"});
        assert_eq!(with_zattrs(&group, &json!({"a": 1})).unwrap()["attributes"], json!({"a": 1}));
    }

    #[test]
    fn zarray_written_resizes_and_refuses_other_changes() {
        let stored = array("uint8", json!(0), codecs(&[]));
        let shown = v2_array(&stored).unwrap().zarray;
        let mut written = shown.clone();
        written["shape"] = json!([9, 3]);
        assert_eq!(with_zarray(&stored, &shown, &written).unwrap()["shape"], json!([9, 3]));
        written["shape"] = json!([9]);
        assert!(with_zarray(&stored, &shown, &written).unwrap_err().0.contains("dimensions"));
        let mut written = shown.clone();
        written["chunks"] = json!([1, 1]);
        assert!(with_zarray(&stored, &shown, &written).unwrap_err().0.contains("chunks"));
    }

    #[test]
    fn a_new_zarray_becomes_the_v3_array_whose_v2_form_it_is() {
        let zarray = json!({"zarr_format": 2, "shape": [10, 6], "chunks": [4, 3], "dtype": ">f8",
            "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
            "fill_value": "NaN", "order": "F", "filters": null, "dimension_separator": "/"});
        let v3 = v3_array(&zarray).unwrap();
        assert_eq!(v3["data_type"], "float64");
        assert_eq!(v3["chunk_key_encoding"], json!({"name": "v2", "configuration": {"separator": "/"}}));
        let back = v2_array(&v3).unwrap().zarray;
        for key in ["shape", "chunks", "dtype", "compressor", "fill_value", "order", "dimension_separator"] {
            assert_eq!(back[key], zarray[key], "{key}");
        }
        let gzip = json!({"zarr_format": 2, "shape": [5], "chunks": [2], "dtype": "|u1",
            "compressor": {"id": "gzip", "level": 1}, "fill_value": null, "order": "C", "filters": null});
        assert_eq!(v2_array(&v3_array(&gzip).unwrap()).unwrap().zarray["compressor"], gzip["compressor"]);
        let mut bad = gzip.clone();
        bad["filters"] = json!([{"id": "delta", "dtype": "<i4"}]);
        assert!(v3_array(&bad).unwrap_err().0.contains("filters"));
        bad = gzip.clone();
        bad["dtype"] = json!("<U4");
        assert!(v3_array(&bad).is_err());
    }

    #[test]
    fn groups_keep_their_attributes() {
        let (zgroup, zattrs) = v2_group(&json!({"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}));
        assert_eq!((zgroup, zattrs), (json!({"zarr_format": 2}), json!({"a": 1})));
    }
}
