//! OME-Zarr in the Zarr v2 view, through the filesystem without FUSE: a group's OME-Zarr 0.5
//! metadata is its `.zattrs` in 0.4 form (and in `.zmetadata`), a group 0.4 cannot express keeps
//! its 0.5 form, a `.zattrs` written back is stored in 0.5 form, exactly as it was when unchanged,
//! and `shardfs info --zarr-format 2` names each group. The field's own tools check the same on a
//! mount in tests/interop/test_ome.py.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use shardfs::fs::{ShardFs, WriteOptions};
use shardfs::write::pending::Policy;

fn multiscales(axes: Value) -> Value {
    json!([{
        "axes": axes,
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [0.5, 0.5]}]}],
        "name": "image"
    }])
}

fn yx() -> Value {
    json!([{"name": "y", "type": "space"}, {"name": "x", "type": "space"}])
}

fn write_group(store: &Path, dir: &str, attributes: Value) {
    let path = store.join(dir);
    std::fs::create_dir_all(&path).unwrap();
    let doc = json!({"zarr_format": 3, "node_type": "group", "attributes": attributes});
    std::fs::write(path.join("zarr.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// An image with labels, and an image whose axes 0.4 forbids (one space axis).
fn ome_store() -> TempDir {
    let store = TempDir::new("ome");
    let image = json!({"ome": {"version": "0.5", "multiscales": multiscales(yx()),
        "omero": {"channels": [{"label": "DAPI", "color": "0000FF"}]}}, "note": "kept"});
    write_group(store.path(), "", image);
    write_group(store.path(), "labels", json!({"ome": {"version": "0.5", "labels": ["cells"]}}));
    let cells = json!({"ome": {"version": "0.5", "multiscales": multiscales(yx()),
        "image-label": {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}], "version": "0.5"}}});
    write_group(store.path(), "labels/cells", cells);
    let odd = json!({"ome": {"version": "0.5", "multiscales":
        multiscales(json!([{"name": "t", "type": "time"}, {"name": "x", "type": "space"}]))}});
    write_group(store.path(), "odd", odd);
    store
}

fn v2_fs(store: &Path, writable: bool) -> ShardFs {
    let cache = shardfs::view::index_cache::IndexCache::new(1 << 20);
    let presentation = Arc::new(shardfs::view::presentation::ZarrV2);
    let writes = writable.then(|| WriteOptions {
        policy: Policy { shard_bytes: usize::MAX, idle: Duration::from_secs(3600), ..Policy::default() },
        shard_new: None,
    });
    let store = shardfs::mount::open_store(store).unwrap();
    shardfs::mount::filesystem_showing(store, presentation, cache, writes).unwrap()
}

/// Replaces the content of the existing view file `path`, as `cat > path` does.
fn overwrite(fs: &ShardFs, path: &str, bytes: &[u8]) {
    let mode = shardfs::fs::OpenMode { write: true, truncate: true, append: false };
    let fh = fs.open(lookup(fs, path).unwrap(), mode).unwrap();
    fs.write(fh, 0, bytes).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
}

fn json_at(fs: &ShardFs, path: &str) -> Value {
    serde_json::from_slice(&read_path(fs, path).unwrap()).unwrap()
}

#[test]
fn ome_zarr_0_5_groups_are_shown_in_0_4_form_and_zmetadata_agrees() {
    let store = ome_store();
    let fs = v2_fs(store.path(), false);
    let root = json_at(&fs, ".zattrs");
    let keys: Vec<_> = root.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["multiscales", "omero", "note"]);
    assert_eq!(root["multiscales"][0]["version"], "0.4");
    assert_eq!(root["multiscales"][0]["datasets"], multiscales(yx())[0]["datasets"]);
    assert_eq!(root["omero"]["version"], "0.4");
    assert_eq!(json_at(&fs, "labels/.zattrs"), json!({"labels": ["cells"]}));
    let cells = json_at(&fs, "labels/cells/.zattrs");
    assert_eq!(cells["image-label"]["version"], "0.4");
    assert_eq!(cells["multiscales"][0]["version"], "0.4");
    // One space axis: a 0.4 reader would misread it, so it keeps its 0.5 form.
    let odd = json_at(&fs, "odd/.zattrs");
    assert_eq!(odd["ome"]["version"], "0.5");
    assert!(odd.get("multiscales").is_none());
    let consolidated = json_at(&fs, ".zmetadata");
    for path in [".zattrs", "labels/.zattrs", "labels/cells/.zattrs", "odd/.zattrs"] {
        assert_eq!(consolidated["metadata"][path], json_at(&fs, path), "{path}");
    }
}

#[test]
fn zattrs_written_through_the_v2_view_are_stored_in_0_5_form() {
    let store = ome_store();
    let before = std::fs::read(store.path().join("zarr.json")).unwrap();
    let label_before = std::fs::read(store.path().join("labels/cells/zarr.json")).unwrap();
    let fs = v2_fs(store.path(), true);
    // Written back unchanged, as a 0.4 tool rewriting its metadata does: the same bytes stored.
    let shown = read_path(&fs, ".zattrs").unwrap();
    overwrite(&fs, ".zattrs", &shown);
    assert_eq!(std::fs::read(store.path().join("zarr.json")).unwrap(), before);
    let shown = read_path(&fs, "labels/cells/.zattrs").unwrap();
    overwrite(&fs, "labels/cells/.zattrs", &shown);
    assert_eq!(std::fs::read(store.path().join("labels/cells/zarr.json")).unwrap(), label_before);
    // Indented by 4, as zarr-python writes it, with the well's version last, as ngff-zarr does.
    let well = json!({"zarr_format": 3, "node_type": "group",
        "attributes": {"ome": {"well": {"images": [{"path": "0"}]}, "version": "0.5"}}});
    let mut four = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    serde::Serialize::serialize(&well, &mut serde_json::Serializer::with_formatter(&mut four, formatter)).unwrap();
    std::fs::create_dir(store.path().join("well")).unwrap();
    std::fs::write(store.path().join("well/zarr.json"), &four).unwrap();
    let shown = read_path(&fs, "well/.zattrs").unwrap();
    overwrite(&fs, "well/.zattrs", &shown);
    assert_eq!(std::fs::read(store.path().join("well/zarr.json")).unwrap(), four);
    // Changed: a channel renamed and an attribute added, in 0.4 form.
    let mut changed = json_at(&fs, ".zattrs");
    changed["omero"]["channels"][0]["label"] = json!("Hoechst");
    changed["added"] = json!(1);
    overwrite(&fs, ".zattrs", &serde_json::to_vec(&changed).unwrap());
    let doc: Value = serde_json::from_slice(&std::fs::read(store.path().join("zarr.json")).unwrap()).unwrap();
    let expected = json!({"ome": {"version": "0.5", "multiscales": multiscales(yx()),
        "omero": {"channels": [{"label": "Hoechst", "color": "0000FF"}]}}, "note": "kept", "added": 1});
    assert_eq!(doc["attributes"], expected);
    assert_eq!(json_at(&fs, ".zattrs"), changed);
    // A 0.4 image written where there was none becomes 0.5.
    let mut new = json_at(&fs, "labels/cells/.zattrs");
    new.as_object_mut().unwrap().remove("image-label");
    overwrite(&fs, "odd/.zattrs", &serde_json::to_vec(&new).unwrap());
    let doc: Value = serde_json::from_slice(&std::fs::read(store.path().join("odd/zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"], json!({"ome": {"version": "0.5", "multiscales": multiscales(yx())}}));
}

#[test]
fn info_names_the_groups_shown_as_0_4_and_those_kept() {
    let store = ome_store();
    let out = std::process::Command::new(BIN).args(["info", "--zarr-format", "2"]).arg(store.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = |dir: &str| text.lines().find(|l| l.split_whitespace().next() == Some(dir)).unwrap_or("").to_string();
    assert!(line("/").contains("OME-Zarr 0.5 shown as 0.4"), "{text}");
    assert!(line("labels/cells").contains("shown as 0.4"), "{text}");
    assert!(line("odd").contains("kept in 0.5 form") && line("odd").contains("space axes"), "{text}");
}
