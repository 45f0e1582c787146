"""Interop test of OME-Zarr in the Zarr v2 view: OME-Zarr 0.5 images shown as 0.4 to the tools
that read only 0.4.

    target/venv-ome/bin/python scripts/interop_ome.py [path/to/shardfs]

ngff-zarr writes OME-Zarr 0.5 with sharding: a 3-level image (c, y, x) with omero channels, a
label image under it (written with zarr-python 3 as the 0.5 spec puts it, since ngff-zarr writes
no label metadata), and an HCS plate of two wells. shardfs
mounts the store twice, read-only: with `--zarr-format 2` ome-zarr-models validates each group as
OME-Zarr 0.4 (Image, Labels, ImageLabel, HCS, Well), and ome-zarr 0.9 on zarr-python 2.18
(target/venv-ome04) finds the image, its labels, the wells and their fields and reads every level
exactly;
with the v3 view (the default) ome-zarr-models validates each group as 0.5. A group whose
metadata OME-Zarr 0.4 cannot express keeps its 0.5 form in the v2 view, with a log line and a
line in `shardfs info --zarr-format 2`. Then through a writable v2 mount: a `.zattrs` written back
unchanged leaves the stored zarr.json as it was, zarr-python 2.18 renames a channel (its
`.zattrs` in 0.4 form) and the store holds it in 0.5 form, and ome-zarr 0.9 writes a new 0.4
image, which the store holds with valid OME-Zarr 0.5 metadata, sharded, and zarr-python 3 reads
exactly.
Every mount is unmounted, whatever fails.
"""

import json
import os
import subprocess
import sys
import tempfile

import ngff_zarr as nz
import numpy as np
import zarr
from ome_zarr_models import v04, v05

sys.path.insert(0, os.path.dirname(__file__))
from checks import Checks  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
V04_PYTHON = os.path.join(ROOT, "target", "venv-ome04", "bin", "python")

# Run by ome-zarr 0.9 on zarr-python 2.18: every node its Reader finds at each path, with the
# names of its specs and each level of its data compared with the .npy files written beside.
READER = r"""
import json, sys, numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader
mnt, expected_dir = sys.argv[1], sys.argv[2]
expected = json.load(open(expected_dir + "/levels.json"))
result = {}
for path in ("image", "image/labels/cells", "plate/A/1/0", "plate/A/2/0"):
    location = parse_url(f"{mnt}/{path}")
    if location is None:
        result[path] = "not found"
        continue
    nodes = list(Reader(location)())
    # The Reader starts from the image above a label image; the node asked for is the one here.
    node = next(n for n in nodes if str(n.zarr.path).rstrip("/").endswith(path))
    levels = []
    for level, data in enumerate(node.data):
        key = f"{path}/{level}"
        if key in expected:
            want = np.load(f"{expected_dir}/{expected[key]}")
            levels.append(bool(np.array_equal(np.asarray(data), want)))
        else:
            levels.append(list(np.asarray(data).shape))
    result[path] = {"specs": [type(s).__name__ for s in node.specs], "levels": levels,
                    "nodes": [str(n.zarr.path).rstrip("/").rsplit("/", 1)[-1] for n in nodes]}
print(json.dumps(result))
"""

# Run by zarr-python 2.18 through a writable v2 view: renames the first channel of the image.
RENAME = r"""
import sys, zarr
group = zarr.open_group(sys.argv[1] + "/image", mode="r+")
omero = group.attrs["omero"]
omero["channels"][0]["label"] = "Hoechst"
group.attrs["omero"] = omero
"""

# Run by ome-zarr 0.9 on zarr-python 2.18 through a writable v2 view: a new 0.4 image.
WRITE = r"""
import sys, numpy as np, zarr
from ome_zarr.writer import write_image
data = (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 3) % 1000
np.save(sys.argv[2], data)
# zarr-python 2's DirectoryStore writes each file to a temporary and renames it, as the v2 view
# needs to make a node (parse_url's FSStore creates .zgroup in place, which the view refuses).
group = zarr.open_group(zarr.DirectoryStore(sys.argv[1] + "/written"), mode="w")
write_image(data, group, axes="yx", storage_options={"chunks": (16, 16)})
"""


def image_pyramid():
    data = ((np.arange(2 * 64 * 96, dtype=np.uint32).reshape(2, 64, 96) * 7) % 5000).astype(np.uint16)
    image = nz.to_ngff_image(data, dims=["c", "y", "x"], scale={"y": 0.5, "x": 0.5}, name="image")
    multiscales = nz.to_multiscales(image, scale_factors=[2, 4], chunks=16)
    window = nz.OmeroWindow(min=0, max=5000, start=0, end=4000)
    multiscales.metadata.omero = nz.Omero(channels=[nz.OmeroChannel(color="0000FF", label="DAPI", window=window),
                                                    nz.OmeroChannel(color="00FF00", label="GFP", window=window)])
    return multiscales


def write_labels(image_path):
    """A label image under the image, written with zarr-python 3 as OME-Zarr 0.5 puts it: ngff-zarr
    writes no label metadata, and ome-zarr-models checks a label image's levels only at dataset
    paths directly below it ("0", not ngff-zarr's "scale0/cells")."""
    zarr.open_group(os.path.join(image_path, "labels"), mode="w", zarr_format=3).attrs["ome"] = \
        {"version": "0.5", "labels": ["cells"]}
    cells = np.zeros((1, 64, 96), dtype=np.uint32)
    cells[0, 8:24, 8:40] = 1
    cells[0, 30:60, 50:90] = 2
    group = zarr.open_group(os.path.join(image_path, "labels", "cells"), mode="w", zarr_format=3)
    datasets = []
    for level in range(3):
        data = cells[:, ::2 ** level, ::2 ** level]
        group.create_array(str(level), shape=data.shape, chunks=(1, 16, 16), shards=(1, 32, 32), dtype="uint32",
                           dimension_names=["c", "y", "x"])[...] = data
        step = 0.5 * 2 ** level
        datasets.append({"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": [1.0, step, step]}]})
    axes = [{"name": "c", "type": "channel"}, {"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    group.attrs["ome"] = {
        "version": "0.5",
        "multiscales": [{"axes": axes, "datasets": datasets, "name": "cells"}],
        "image-label": {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]},
                                   {"label-value": 2, "rgba": [0, 255, 0, 255]}],
                        "properties": [{"label-value": 1, "class": "nucleus"}, {"label-value": 2, "class": "cell"}],
                        "source": {"image": "../../"}}}


def write_store(store):
    """ngff-zarr writes the OME-Zarr 0.5 image, its labels and a plate, sharded."""
    zarr.open_group(store, mode="w", zarr_format=3)
    image_path = os.path.join(store, "image")
    nz.to_ngff_zarr(image_path, image_pyramid(), version="0.5", chunks_per_shard=2)
    write_labels(image_path)
    zarr.consolidate_metadata(image_path)
    plate_path = os.path.join(store, "plate")
    wells = [nz.PlateWell(path="A/1", rowIndex=0, columnIndex=0), nz.PlateWell(path="A/2", rowIndex=0, columnIndex=1)]
    plate = nz.Plate(columns=[nz.PlateColumn(name="1"), nz.PlateColumn(name="2")], rows=[nz.PlateRow(name="A")],
                     wells=wells, name="plate", field_count=1, version="0.5")
    nz.to_hcs_zarr(nz.HCSPlate(plate_path, plate), plate_path)
    for column, offset in (("1", 0), ("2", 500)):
        field = ((np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) + offset) % 4000).astype(np.uint16)
        pyramid = nz.to_multiscales(nz.to_ngff_image(field, dims=["y", "x"]), scale_factors=[2], chunks=16)
        nz.write_hcs_well_image(plate_path, pyramid, plate, "A", column, 0, version="0.5", chunks_per_shard=2)
    # An image 0.4 cannot express: one space axis (as 0.6 may allow), written as 0.5 by hand.
    odd = zarr.open_group(os.path.join(store, "odd"), mode="w", zarr_format=3)
    odd.create_array("0", shape=(4, 8), chunks=(2, 4), shards=(4, 8), dtype="uint8")[...] = 1
    odd.attrs["ome"] = {"version": "0.5", "multiscales": [{
        "axes": [{"name": "t", "type": "time"}, {"name": "x", "type": "space"}],
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1]}]}]}]}


def level_paths(store, group):
    """The dataset paths of the multiscales of `group`, from its stored 0.5 metadata."""
    ome = zarr.open_group(os.path.join(store, group), mode="r", zarr_format=3).attrs["ome"]
    return [d["path"] for d in ome["multiscales"][0]["datasets"]]


def save_expected(store, expected):
    """Each level of each image as zarr-python 3 reads it from the sharded store."""
    levels = {}
    for group in ("image", "image/labels/cells", "plate/A/1/0", "plate/A/2/0"):
        for level, path in enumerate(level_paths(store, group)):
            name = f"{group}/{level}".replace("/", "_") + ".npy"
            np.save(os.path.join(expected, name), zarr.open_array(os.path.join(store, group, path), mode="r")[...])
            levels[f"{group}/{level}"] = name
    with open(os.path.join(expected, "levels.json"), "w") as f:
        json.dump(levels, f)
    return levels


def validate(mnt, zarr_format, models, check):
    """ome-zarr-models validates each group of the view as the version of `models`."""
    version = "0.4" if zarr_format == 2 else "0.5"
    groups = (("image", models.image.Image), ("image/labels", models.labels.Labels),
              ("image/labels/cells", models.image_label.ImageLabel), ("plate", models.hcs.HCS),
              ("plate/A/1", models.well.Well), ("plate/A/2/0", models.image.Image))
    for path, model in groups:
        try:
            group = zarr.open_group(os.path.join(mnt, path), mode="r", zarr_format=zarr_format)
            model.from_zarr(group)
            error = None
        except Exception as e:
            error = repr(e)[:600]
        check(f"{path}: ome-zarr-models validates the v{zarr_format} view as OME-Zarr {version} "
              f"({model.__name__})", error is None, str(error))


def mount(binary, store, mnt, log, *flags):
    subprocess.run([binary, "mount", *flags, "--log-file", log, store, mnt], check=True)


def unmount(binary, mnt):
    subprocess.run([binary, "unmount", mnt], check=False)


def read_views(binary, store, work, levels, check):
    """ome-zarr-models and ome-zarr 0.9 over read-only v2 and v3 mounts."""
    mnt2, mnt3, log = (os.path.join(work, n) for n in ("mnt2", "mnt3", "read.log"))
    os.mkdir(mnt2)
    os.mkdir(mnt3)
    mount(binary, store, mnt2, log, "--zarr-format", "2", "--read-only")
    try:
        mount(binary, store, mnt3, log, "--read-only")
        try:
            validate(mnt2, 2, v04, check)
            validate(mnt3, 3, v05, check)
            attrs = json.load(open(os.path.join(mnt2, "image", ".zattrs")))
            stored = zarr.open_group(os.path.join(store, "image"), mode="r").attrs["ome"]
            check("image/.zattrs: the 0.5 metadata at the top level, version 0.4 in multiscales and omero",
                  "ome" not in attrs and attrs["multiscales"][0]["version"] == "0.4"
                  and attrs["omero"]["version"] == "0.4"
                  and attrs["multiscales"][0]["datasets"] == stored["multiscales"][0]["datasets"], str(attrs)[:400])
            plate = json.load(open(os.path.join(mnt2, "plate", ".zattrs")))
            check("plate/.zattrs: plate with its own version 0.4", plate.get("plate", {}).get("version") == "0.4",
                  str(plate)[:300])
            zmetadata = json.load(open(os.path.join(mnt2, ".zmetadata")))["metadata"]
            paths = ["image/.zattrs", "image/labels/.zattrs", "image/labels/cells/.zattrs", "plate/.zattrs",
                     "plate/A/1/.zattrs", "odd/.zattrs"]
            differ = [p for p in paths if zmetadata.get(p) != json.load(open(os.path.join(mnt2, p)))]
            check(".zmetadata holds each group's .zattrs as the view shows it", not differ, str(differ))
            odd = json.load(open(os.path.join(mnt2, "odd", ".zattrs")))
            check("odd: 0.4 cannot express one space axis: its .zattrs keeps the 0.5 form",
                  odd.get("ome", {}).get("version") == "0.5" and "multiscales" not in odd, str(odd)[:300])
            expected = os.path.join(work, "expected")
            run = subprocess.run([V04_PYTHON, "-c", READER, mnt2, expected], capture_output=True, text=True)
            result = json.loads(run.stdout) if run.returncode == 0 else {}
            check("ome-zarr 0.9 (zarr-python 2.18) reads the v2 view", run.returncode == 0, run.stderr[-800:])
            for path in ("image", "image/labels/cells", "plate/A/1/0", "plate/A/2/0"):
                got = result.get(path, {})
                want = [True] * sum(1 for k in levels if k.rsplit("/", 1)[0] == path)
                check(f"{path}: ome-zarr 0.9 finds a Multiscales image and reads its {len(want)} levels exactly",
                      "Multiscales" in got.get("specs", []) and got.get("levels") == want, str(got)[:400])
            image = result.get("image", {})
            check("image: ome-zarr 0.9 finds its omero channels and its labels (cells)",
                  "OMERO" in image.get("specs", []) and "cells" in image.get("nodes", []), str(image)[:400])
            check("image/labels/cells: ome-zarr 0.9 reads it as a label image",
                  "Label" in result.get("image/labels/cells", {}).get("specs", []),
                  str(result.get("image/labels/cells"))[:300])
            # ome-zarr 0.9 stitches a plate's and a well's images from `{well}/{field}/{level}`
            # (dataset paths "0", "1", ...), not ngff-zarr's "scale0/image": each field is read instead.
            with open(log) as f:
                lines = [line for line in f if "odd/zarr.json: OME-Zarr metadata kept in 0.5 form" in line]
            check("odd: one log line names the group and why", len(lines) == 1, str(lines))
        finally:
            unmount(binary, mnt3)
    finally:
        unmount(binary, mnt2)
    info = subprocess.run([binary, "info", "--zarr-format", "2", store], capture_output=True, text=True)
    line = [line for line in info.stdout.splitlines() if line.split() and line.split()[0] == "odd"
            and "group" in line]
    check("shardfs info --zarr-format 2: a line for the group kept in 0.5 form, with the reason",
          len(line) == 1 and "kept in 0.5 form" in line[0] and "space axes" in line[0], info.stdout[-800:])
    shown = [line for line in info.stdout.splitlines() if "OME-Zarr 0.5 shown as 0.4" in line]
    check("shardfs info --zarr-format 2: the other OME-Zarr groups shown as 0.4", len(shown) == 8, "\n".join(shown))


def writes(binary, store, work, check):
    """`.zattrs` written through a writable v2 mount is stored in 0.5 form."""
    mnt, log = os.path.join(work, "mnt-write"), os.path.join(work, "write.log")
    os.mkdir(mnt)
    well_doc = os.path.join(store, "plate", "A", "1", "zarr.json")
    image_doc = os.path.join(store, "image", "zarr.json")
    well_before, image_before = open(well_doc, "rb").read(), json.load(open(image_doc))
    new = os.path.join(work, "written.npy")
    mount(binary, store, mnt, log, "--zarr-format", "2", "--shard-new", "2")
    try:
        shown = open(os.path.join(mnt, "plate", "A", "1", ".zattrs"), "rb").read()
        with open(os.path.join(mnt, "plate", "A", "1", ".zattrs"), "wb") as f:
            f.write(shown)
        run = subprocess.run([V04_PYTHON, "-c", RENAME, mnt], capture_output=True, text=True)
        check("zarr-python 2.18 renames a channel through the v2 view", run.returncode == 0, run.stderr[-800:])
        renamed = json.load(open(os.path.join(mnt, "image", ".zattrs")))
        check("the renamed channel shows in the v2 view's 0.4 form",
              renamed.get("omero", {}).get("channels", [{}])[0].get("label") == "Hoechst", str(renamed)[:300])
        run = subprocess.run([V04_PYTHON, "-c", WRITE, mnt, new], capture_output=True, text=True)
        check("ome-zarr 0.9 writes a new 0.4 image through the v2 view", run.returncode == 0, run.stderr[-800:])
    finally:
        unmount(binary, mnt)
    check("plate/A/1: its .zattrs written back unchanged leaves zarr.json byte for byte as it was",
          open(well_doc, "rb").read() == well_before)
    image_after = json.load(open(image_doc))
    want = json.loads(json.dumps(image_before))
    want["attributes"]["ome"]["omero"]["channels"][0]["label"] = "Hoechst"
    check("image: the rename is stored in 0.5 form, all else as it was", image_after == want,
          json.dumps(image_after["attributes"])[:600])
    try:
        v05.image.Image.from_zarr(zarr.open_group(os.path.join(store, "image"), mode="r", zarr_format=3))
        error = None
    except Exception as e:
        error = repr(e)[:600]
    check("image: ome-zarr-models validates the store as OME-Zarr 0.5 after the rename", error is None, str(error))
    written = os.path.join(store, "written")
    attrs = json.load(open(os.path.join(written, "zarr.json")))["attributes"]
    check("written: stored in 0.5 form (under ome, version 0.5, none per multiscales)",
          attrs.get("ome", {}).get("version") == "0.5" and "multiscales" not in attrs
          and "version" not in attrs.get("ome", {}).get("multiscales", [{}])[0], json.dumps(attrs)[:400])
    # Its metadata only: ome-zarr 0.9 writes no _ARRAY_DIMENSIONS, so its arrays have no
    # dimension_names, which 0.5 wants (the view does not take them from the group's axes).
    try:
        model = v05.image.ImageAttrs.model_validate(attrs["ome"])
        error = None
    except Exception as e:
        model, error = None, repr(e)[:600]
    check("written: ome-zarr-models validates its metadata as OME-Zarr 0.5", error is None, str(error))
    if model is not None:
        first = model.multiscales[0].datasets[0].path
        got = zarr.open_array(os.path.join(written, first), mode="r")
        check("written: zarr-python 3 reads its first level exactly, stored sharded",
              np.array_equal(got[...], np.load(new)) and got.metadata.codecs[0].__class__.__name__ == "ShardingCodec",
              str(got.metadata.codecs)[:200])
    result = subprocess.run([binary, "check", store], capture_output=True, text=True)
    check("shardfs check passes after the writes", result.returncode == 0, result.stdout[-500:])


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()
    with tempfile.TemporaryDirectory(prefix="shardfs-interop-ome.") as work:
        store = os.path.join(work, "store")
        write_store(store)
        os.mkdir(os.path.join(work, "expected"))
        levels = save_expected(store, os.path.join(work, "expected"))
        sharded = json.load(open(os.path.join(store, "image", level_paths(store, "image")[0], "zarr.json")))
        check("ngff-zarr wrote the image sharded", sharded["codecs"][0]["name"] == "sharding_indexed")
        read_views(binary, store, work, levels, check)
        writes(binary, store, work, check)
    return check.summary("interop_ome")


if __name__ == "__main__":
    sys.exit(main())
