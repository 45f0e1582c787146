//! OME-Zarr 0.5 metadata in its OME-Zarr 0.4 form and back, for the Zarr v2 view: OME-Zarr 0.4
//! readers (ome-zarr-py on zarr-python 2, n5-zarr, OMERO, QuPath) read only Zarr v2, and look for
//! `multiscales`, `omero`, `labels`, `image-label`, `plate`, `well` and `bioformats2raw.layout` at
//! the top level of `.zattrs`, each versioned object with `"version": "0.4"`. OME-Zarr 0.5 keeps the
//! same objects under the group attribute `ome`, with one `"version": "0.5"` beside them.
//!
//! [`to_v04`] moves the objects to the top level, in `ome`'s place among the other attributes,
//! and sets the version where 0.4 puts it (each `multiscales` entry, `omero`, `image-label`,
//! `plate`, `well`). It refuses, so that the group keeps its 0.5 form, what a 0.4 reader would
//! misread: another OME-Zarr version (0.6's coordinate systems, RFC-5), `coordinateSystems` or
//! transformations other than one `scale` and one `translation`, axes 0.4 forbids (not 2 to 5,
//! not 2 or 3 of type space, out of order, names repeated), versions it cannot put back, and
//! names 0.4 has no place for. [`from_v04`] is the inverse, for a `.zattrs` written through the
//! view; it answers only where translating its answer again gives exactly what was written.

use serde_json::{Map, Value, json};

use super::error::Unsupported;

/// The OME-Zarr metadata 0.4 keeps at the top level of `.zattrs` and 0.5 under `ome`.
const KEYS: [&str; 7] = ["multiscales", "omero", "labels", "image-label", "plate", "well", "bioformats2raw.layout"];

/// The objects that carry a `version` of their own in 0.4 (besides each `multiscales` entry).
const VERSIONED: [&str; 4] = ["omero", "image-label", "plate", "well"];

/// The versions written.
const V04: &str = "0.4";
const V05: &str = "0.5";

/// The 0.4 form of a group's attributes (`attributes`, the whole `attributes` object of its
/// `zarr.json`). `Ok(None)`: no OME-Zarr metadata there (no `ome`); `Err`: OME-Zarr metadata
/// that 0.4 cannot show, and why.
pub fn to_v04(attributes: &Value) -> Result<Option<Value>, Unsupported> {
    let Some(attributes) = attributes.as_object() else { return Ok(None) };
    let Some(ome) = attributes.get("ome") else { return Ok(None) };
    let ome = ome.as_object().ok_or("`ome` is not a JSON object")?;
    match ome.get("version") {
        Some(Value::String(v)) if v == V05 => {}
        Some(other) => return Err(format!("OME-Zarr version {other} has no 0.4 form here").into()),
        None => return Err("`ome` has no version".into()),
    }
    if let Some(key) = KEYS.iter().find(|k| attributes.contains_key(**k)) {
        return Err(format!("`{key}` is both beside `ome` and would be put there").into());
    }
    if !KEYS.iter().any(|k| ome.contains_key(*k)) {
        return Err("`ome` holds none of the metadata 0.4 has".into());
    }
    let mut shown = Map::new();
    for (name, value) in attributes {
        if name != "ome" {
            shown.insert(name.clone(), value.clone());
            continue;
        }
        for (key, value) in ome.iter().filter(|(key, _)| *key != "version") {
            shown.insert(key.clone(), v04_entry(key, value)?);
        }
    }
    Ok(Some(Value::Object(shown)))
}

/// The 0.5 form of the `.zattrs` `written` through the v2 view, for a group whose attributes
/// are `stored` now (whose versions are kept where 0.5 had them: 0.5 allows a `version` inside
/// `plate`, `well` and `image-label`). `None`: store it as written: it holds no OME-Zarr 0.4
/// metadata (or an `ome` of its own), or not in a form the view would show again exactly.
/// Without a 0.4 version in it, only a group that was 0.5 already takes the 0.5 form: names such
/// as `labels` alone are no sign of OME-Zarr.
pub fn from_v04(written: &Value, stored: &Value) -> Option<Value> {
    let written_map = written.as_object()?;
    if written_map.contains_key("ome") || !KEYS.iter().any(|k| written_map.contains_key(*k)) {
        return None;
    }
    let previous = stored
        .get("ome")
        .and_then(Value::as_object)
        .filter(|ome| ome.get("version").and_then(Value::as_str) == Some(V05));
    if previous.is_none() && !marked_v04(written_map) {
        return None;
    }
    let mut ome = Map::new();
    for key in written_map.keys().filter(|k| KEYS.contains(&k.as_str())) {
        let before = previous.and_then(|p| p.get(key));
        ome.insert(key.clone(), v05_entry(key, &written_map[key], before)?);
    }
    // Where the group had it (writers put it first or last), so an unchanged write is the same bytes.
    let at = previous.and_then(|p| p.keys().position(|k| k == "version")).unwrap_or(0).min(ome.len());
    ome.shift_insert(at, "version".into(), json!(V05));
    let mut attributes = Map::new();
    for (name, value) in written_map {
        if !KEYS.contains(&name.as_str()) {
            attributes.insert(name.clone(), value.clone());
        } else if !attributes.contains_key("ome") {
            attributes.insert("ome".into(), Value::Object(std::mem::take(&mut ome)));
        }
    }
    let attributes = Value::Object(attributes);
    (to_v04(&attributes).ok()?.as_ref() == Some(written)).then_some(attributes)
}

/// The 0.4 form of the 0.5 `ome` entry `key`.
fn v04_entry(key: &str, value: &Value) -> Result<Value, Unsupported> {
    match key {
        "multiscales" => {
            let list = value.as_array().ok_or("`multiscales` is not a list")?;
            let entries = list.iter().enumerate().map(|(i, entry)| {
                check_multiscale(entry).map_err(|why| Unsupported(format!("multiscales[{i}]: {why}")))?;
                versioned(entry, &format!("multiscales[{i}]"))
            });
            Ok(Value::Array(entries.collect::<Result<_, _>>()?))
        }
        _ if VERSIONED.contains(&key) => versioned(value, &format!("`{key}`")),
        "labels" | "bioformats2raw.layout" => Ok(value.clone()),
        _ => Err(format!("`ome.{key}` has no place in OME-Zarr 0.4").into()),
    }
}

/// The 0.5 form of the 0.4 entry `key`, whose 0.5 form was `before` (if it was there).
fn v05_entry(key: &str, value: &Value, before: Option<&Value>) -> Option<Value> {
    match key {
        "multiscales" => {
            let before = before.and_then(Value::as_array);
            let entries = value.as_array()?.iter().enumerate();
            entries.map(|(i, entry)| unversioned(entry, before.and_then(|b| b.get(i)), false)).collect()
        }
        // ome-zarr-models warns of a 0.5 plate without a version: a new one gets one.
        "plate" => unversioned(value, before, true),
        _ if VERSIONED.contains(&key) => unversioned(value, before, false),
        _ => Some(value.clone()),
    }
}

/// `object` with `"version": "0.4"`: in place of a 0.5 version, else last.
fn versioned(object: &Value, what: &str) -> Result<Value, Unsupported> {
    let mut object = object.as_object().ok_or_else(|| format!("{what} is not a JSON object"))?.clone();
    match object.get("version") {
        None => {}
        Some(Value::String(v)) if v == V05 => {}
        Some(other) => return Err(format!("{what} has version {other}, which 0.5 does not put there").into()),
    }
    object.insert("version".into(), json!(V04));
    Ok(Value::Object(object))
}

/// The 0.4 `object` (whose version must be 0.4) in 0.5 form: with `"version": "0.5"` where its
/// 0.5 form `before` had a version (`keep` when there is none before), else without.
fn unversioned(object: &Value, before: Option<&Value>, keep: bool) -> Option<Value> {
    let mut object = object.as_object()?.clone();
    if object.get("version").and_then(Value::as_str) != Some(V04) {
        return None;
    }
    if before.map_or(keep, |b| b.get("version").is_some()) {
        object.insert("version".into(), json!(V05));
    } else {
        object.shift_remove("version");
    }
    Some(Value::Object(object))
}

/// True when one of the objects 0.4 versions says 0.4.
fn marked_v04(attributes: &Map<String, Value>) -> bool {
    let says_v04 = |object: &Value| object.get("version").and_then(Value::as_str) == Some(V04);
    let multiscales = attributes.get("multiscales").and_then(Value::as_array);
    multiscales.is_some_and(|list| list.iter().any(says_v04))
        || VERSIONED.iter().any(|key| attributes.get(*key).is_some_and(says_v04))
}

/// Why 0.4 cannot express the 0.5 multiscales entry `entry`, if it cannot.
fn check_multiscale(entry: &Value) -> Result<(), Unsupported> {
    let entry = entry.as_object().ok_or("not a JSON object")?;
    if entry.contains_key("coordinateSystems") {
        return Err("coordinateSystems (RFC-5) have no 0.4 form".into());
    }
    let axes = entry.get("axes").and_then(Value::as_array).ok_or("no list of axes")?;
    check_axes(axes)?;
    let datasets = entry.get("datasets").and_then(Value::as_array).ok_or("no list of datasets")?;
    if datasets.is_empty() {
        return Err("no datasets".into());
    }
    for (i, dataset) in datasets.iter().enumerate() {
        let dataset = dataset.as_object().ok_or_else(|| format!("datasets[{i}] is not a JSON object"))?;
        if !dataset.get("path").is_some_and(Value::is_string) {
            return Err(format!("datasets[{i}] has no path").into());
        }
        let transforms = dataset.get("coordinateTransformations");
        let transforms = transforms.ok_or_else(|| format!("datasets[{i}] has no coordinateTransformations"))?;
        check_transforms(transforms, axes.len()).map_err(|why| format!("datasets[{i}]: {why}"))?;
    }
    if let Some(transforms) = entry.get("coordinateTransformations") {
        check_transforms(transforms, axes.len())?;
    }
    Ok(())
}

/// 0.4's axes: 2 to 5, unique names, 2 or 3 of type space, at most one time and one channel
/// (or custom) axis, ordered time, channel, space.
fn check_axes(axes: &[Value]) -> Result<(), Unsupported> {
    if !(2..=5).contains(&axes.len()) {
        return Err(format!("{} axes (0.4 has 2 to 5)", axes.len()).into());
    }
    let mut names = Vec::new();
    let mut ranks = Vec::new();
    for axis in axes {
        let name = axis.get("name").and_then(Value::as_str).ok_or("an axis has no name")?;
        if names.contains(&name) {
            return Err(format!("two axes named {name}").into());
        }
        names.push(name);
        ranks.push(match axis.get("type") {
            Some(Value::String(t)) if t == "time" => 0,
            Some(Value::String(t)) if t == "space" => 2,
            None | Some(Value::Null | Value::String(_)) => 1,
            Some(other) => return Err(format!("axis {name} has type {other}").into()),
        });
    }
    let count = |rank| ranks.iter().filter(|r| **r == rank).count();
    if !ranks.is_sorted() || count(0) > 1 || count(1) > 1 || !(2..=3).contains(&count(2)) {
        return Err(
            format!("axes {names:?}: 0.4 wants 2 or 3 space axes, after one time and one other axis at most").into()
        );
    }
    Ok(())
}

/// 0.4's transformations: one `scale`, then at most one `translation`, each a vector of `rank`
/// numbers (or a `path`), and nothing else.
fn check_transforms(transforms: &Value, rank: usize) -> Result<(), Unsupported> {
    let list = transforms.as_array().ok_or("coordinateTransformations is not a list")?;
    let types: Vec<_> = list.iter().map(|t| t.get("type").and_then(Value::as_str).unwrap_or("")).collect();
    if !matches!(types.as_slice(), ["scale"] | ["scale", "translation"]) {
        return Err(format!("transformations {types:?}: 0.4 has one scale, then one translation at most").into());
    }
    for (transform, kind) in list.iter().zip(types) {
        let transform = transform.as_object().ok_or("a transformation is not a JSON object")?;
        if let Some(extra) = transform.keys().find(|k| !["type", kind, "path"].contains(&k.as_str())) {
            return Err(format!("a {kind} transformation has {extra}, which 0.4 has no place for").into());
        }
        match (transform.get(kind), transform.get("path")) {
            (Some(Value::Array(v)), None) if v.len() == rank && v.iter().all(Value::is_number) => {}
            (None, Some(Value::String(_))) => {}
            _ => return Err(format!("a {kind} transformation is not {rank} numbers nor a path").into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Value {
        json!({
            "version": "0.5",
            "multiscales": [{
                "axes": [{"name": "c", "type": "channel"}, {"name": "y", "type": "space", "unit": "micrometer"},
                         {"name": "x", "type": "space", "unit": "micrometer"}],
                "datasets": [
                    {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 0.5, 0.5]}]},
                    {"path": "1", "coordinateTransformations": [{"type": "scale", "scale": [1, 1, 1]},
                                                                {"type": "translation", "translation": [0, 0.25, 0.25]}]}
                ],
                "name": "img",
                "@type": "ngff:Image"
            }],
            "omero": {"channels": [{"label": "DAPI", "color": "0000FF", "window": {"start": 0, "end": 100, "min": 0, "max": 255}}]}
        })
    }

    fn round_trip(attributes: &Value) -> Value {
        let shown = to_v04(attributes).unwrap().unwrap();
        assert_eq!(from_v04(&shown, attributes).as_ref(), Some(attributes), "{shown}");
        // Byte for byte too: the view keeps the order of keys.
        let back = from_v04(&shown, attributes).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(attributes).unwrap());
        shown
    }

    #[test]
    fn an_image_moves_to_the_top_level_with_versions_where_0_4_puts_them() {
        let attributes = json!({"before": 1, "ome": image(), "after": [2]});
        let shown = round_trip(&attributes);
        let keys: Vec<_> = shown.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["before", "multiscales", "omero", "after"]);
        assert_eq!(shown["multiscales"][0]["version"], "0.4");
        assert_eq!(shown["multiscales"][0]["name"], "img");
        assert_eq!(shown["multiscales"][0]["datasets"], image()["multiscales"][0]["datasets"]);
        assert_eq!(shown["omero"]["version"], "0.4");
        assert_eq!(shown["omero"]["channels"], image()["omero"]["channels"]);
        assert_eq!(shown["after"], json!([2]));
    }

    #[test]
    fn labels_plates_wells_and_collections_round_trip() {
        let label = json!({"ome": {"version": "0.5", "image-label": {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}],
            "source": {"image": "../../"}}, "multiscales": image()["multiscales"]}});
        let shown = round_trip(&label);
        assert_eq!(shown["image-label"]["version"], "0.4");
        let labels = round_trip(&json!({"ome": {"version": "0.5", "labels": ["cells"]}}));
        assert_eq!(labels, json!({"labels": ["cells"]}));
        // 0.5 allows a plate, well or image-label its own version; it comes back where it was.
        let plate = json!({"ome": {"version": "0.5", "plate": {"columns": [{"name": "1"}], "rows": [{"name": "A"}],
            "wells": [{"path": "A/1", "rowIndex": 0, "columnIndex": 0}], "version": "0.5", "field_count": 1}}});
        let shown = round_trip(&plate);
        let keys: Vec<_> = shown["plate"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["columns", "rows", "wells", "version", "field_count"]);
        assert_eq!(shown["plate"]["version"], "0.4");
        let well = json!({"ome": {"version": "0.5", "well": {"images": [{"path": "0"}]}}});
        assert_eq!(round_trip(&well), json!({"well": {"images": [{"path": "0"}], "version": "0.4"}}));
        let well = json!({"ome": {"well": {"images": [{"path": "0"}], "version": "0.5"}, "version": "0.5"}});
        assert_eq!(round_trip(&well), json!({"well": {"images": [{"path": "0"}], "version": "0.4"}}));
        round_trip(&json!({"ome": {"version": "0.5", "bioformats2raw.layout": 3}, "x": null}));
    }

    #[test]
    fn no_ome_no_translation() {
        assert_eq!(to_v04(&json!({"multiscales": [1], "a": 1})), Ok(None));
        assert_eq!(to_v04(&json!([])), Ok(None));
        assert_eq!(to_v04(&json!({})), Ok(None));
    }

    #[test]
    fn what_0_4_cannot_express_is_refused() {
        let refused = |ome: Value| to_v04(&json!({"ome": ome})).unwrap_err().0;
        let mut rfc5 = image();
        rfc5["version"] = json!("0.6");
        assert!(refused(rfc5).contains("0.6"));
        let mut systems = image();
        systems["multiscales"][0]["coordinateSystems"] = json!([{"name": "physical", "axes": []}]);
        assert!(refused(systems).contains("coordinateSystems"));
        let mut affine = image();
        affine["multiscales"][0]["datasets"][0]["coordinateTransformations"] =
            json!([{"type": "affine", "affine": [[1, 0, 0], [0, 1, 0]]}]);
        assert!(refused(affine).contains("one scale"));
        let mut in_out = image();
        in_out["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]["input"] = json!("array");
        assert!(refused(in_out).contains("input"));
        let mut short = image();
        short["multiscales"][0]["datasets"][1]["coordinateTransformations"][1]["translation"] = json!([0, 0]);
        assert!(refused(short).contains("3 numbers"));
        let mut six = image();
        let axes = six["multiscales"][0]["axes"].as_array_mut().unwrap();
        axes.extend([
            json!({"name": "a", "type": "space"}),
            json!({"name": "b"}),
            json!({"name": "t", "type": "time"}),
        ]);
        assert!(refused(six).contains("6 axes"));
        let mut order = image();
        order["multiscales"][0]["axes"].as_array_mut().unwrap().swap(0, 2);
        assert!(refused(order).contains("axes"));
        let mut twice = image();
        twice["multiscales"][0]["axes"][2]["name"] = json!("y");
        assert!(refused(twice).contains("two axes named y"));
        let mut one_space = image();
        one_space["multiscales"][0]["axes"][1]["type"] = json!("time");
        assert!(refused(one_space).contains("axes"));
        let mut versioned = image();
        versioned["multiscales"][0]["version"] = json!("0.3");
        assert!(refused(versioned).contains("0.3"));
        let mut unknown = image();
        unknown["coordinateSystems"] = json!([]);
        assert!(refused(unknown).contains("ome.coordinateSystems"));
        assert!(refused(json!({"multiscales": []})).contains("no version"));
        assert!(refused(json!({"version": "0.5"})).contains("none"));
        assert!(refused(json!("0.5")).contains("not a JSON object"));
        let both = json!({"ome": image(), "labels": ["x"]});
        assert!(to_v04(&both).unwrap_err().0.contains("labels"));
    }

    #[test]
    fn a_written_0_4_image_is_stored_as_0_5() {
        let written = json!({"multiscales": [{"axes": image()["multiscales"][0]["axes"],
            "datasets": image()["multiscales"][0]["datasets"], "version": "0.4"}], "other": 1});
        let stored = from_v04(&written, &json!({})).unwrap();
        assert_eq!(stored["ome"]["version"], "0.5");
        assert!(stored["ome"]["multiscales"][0].get("version").is_none());
        assert_eq!(stored["other"], 1);
        assert_eq!(to_v04(&stored).unwrap().unwrap(), written);
        // A new 0.5 plate gets a version; a well does not.
        let plate = json!({"plate": {"wells": [], "version": "0.4"}, "well": {"images": [], "version": "0.4"}});
        let stored = from_v04(&plate, &json!({})).unwrap();
        assert_eq!(
            stored["ome"],
            json!({"version": "0.5", "plate": {"wells": [], "version": "0.5"}, "well": {"images": []}})
        );
    }

    #[test]
    fn what_would_not_show_again_exactly_is_stored_as_written() {
        // Not OME-Zarr, or not 0.4: nothing to translate.
        assert_eq!(from_v04(&json!({"a": 1}), &json!({"ome": image()})), None);
        assert_eq!(from_v04(&json!({"ome": image()}), &json!({})), None);
        assert_eq!(from_v04(&json!([1]), &json!({})), None);
        let v03 = json!({"multiscales": [{"version": "0.3", "datasets": [{"path": "0"}], "axes": ["y", "x"]}]});
        assert_eq!(from_v04(&v03, &json!({})), None);
        // `labels` alone is no sign of OME-Zarr, unless the group was OME-Zarr 0.5 already.
        assert_eq!(from_v04(&json!({"labels": ["a"]}), &json!({})), None);
        let was = json!({"ome": {"version": "0.5", "labels": ["a"]}});
        assert_eq!(
            from_v04(&json!({"labels": ["a", "b"]}), &was),
            Some(json!({"ome": {"version": "0.5", "labels": ["a", "b"]}}))
        );
        // An image 0.4 cannot express would not be shown as 0.4 again.
        let mut six = to_v04(&json!({"ome": image()})).unwrap().unwrap();
        six["multiscales"][0]["axes"].as_array_mut().unwrap().push(json!({"name": "t", "type": "time"}));
        assert_eq!(from_v04(&six, &json!({})), None);
        // One object of a 0.4 image without its version.
        let mut unversioned = to_v04(&json!({"ome": image()})).unwrap().unwrap();
        unversioned["omero"].as_object_mut().unwrap().remove("version");
        assert_eq!(from_v04(&unversioned, &json!({"ome": image()})), None);
        // Emptied through the view: the OME-Zarr metadata goes.
        assert_eq!(from_v04(&json!({}), &json!({"ome": image()})), None);
    }
}
