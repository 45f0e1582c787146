"""OME-Zarr in the Zarr v2 view: OME-Zarr 0.5 images shown as 0.4 to the tools that read only 0.4.
Runs in ``target/venv-ome`` (ngff-zarr 0.50.0, ome-zarr-models 1.7, zarr-python 3.1.6), with
ome-zarr 0.9 on zarr-python 2.18 in ``target/venv-ome04`` as the 0.4 reader and writer.

ngff-zarr writes OME-Zarr 0.5 with sharding: a 3-level image (c, y, x) with omero channels, a
label image under it (written with zarr-python 3 as the 0.5 spec puts it, since ngff-zarr writes
no label metadata), and an HCS plate of two wells. Read-only mounts: with ``--zarr-format 2``
ome-zarr-models validates each group as OME-Zarr 0.4 (Image, Labels, ImageLabel, HCS, Well), and
ome-zarr 0.9 finds the image, its labels, the wells and their fields and reads every level
exactly; with the v3 view ome-zarr-models validates each group as 0.5. A group whose metadata
OME-Zarr 0.4 cannot express keeps its 0.5 form in the v2 view, with a log line and a line in
``shardfs info --zarr-format 2``. Through a writable v2 mount of a copy: a ``.zattrs`` written back
unchanged leaves the stored zarr.json as it was, zarr-python 2.18 renames a channel (its
``.zattrs`` in 0.4 form) and the store holds it in 0.5 form, and ome-zarr 0.9 writes a new 0.4
image, which the store holds with valid OME-Zarr 0.5 metadata, sharded, and zarr-python 3 reads
exactly.
"""

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import ngff_zarr as nz
import numpy as np
import pytest
import shardfs
import zarr
from conftest import BINARY, ROOT
from ome_zarr_models import v04, v05

V04_PYTHON = ROOT / "target/venv-ome04/bin/python"
IMAGES = ("image", "image/labels/cells", "plate/A/1/0", "plate/A/2/0")

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
    zarr.open_group(image_path / "labels", mode="w", zarr_format=3).attrs["ome"] = \
        {"version": "0.5", "labels": ["cells"]}
    cells = np.zeros((1, 64, 96), dtype=np.uint32)
    cells[0, 8:24, 8:40] = 1
    cells[0, 30:60, 50:90] = 2
    group = zarr.open_group(image_path / "labels" / "cells", mode="w", zarr_format=3)
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


def write_store(store: Path):
    """ngff-zarr writes the OME-Zarr 0.5 image, its labels and a plate, sharded."""
    zarr.open_group(store, mode="w", zarr_format=3)
    image_path = store / "image"
    nz.to_ngff_zarr(str(image_path), image_pyramid(), version="0.5", chunks_per_shard=2)
    write_labels(image_path)
    zarr.consolidate_metadata(str(image_path))
    plate_path = str(store / "plate")
    wells = [nz.PlateWell(path="A/1", rowIndex=0, columnIndex=0), nz.PlateWell(path="A/2", rowIndex=0, columnIndex=1)]
    plate = nz.Plate(columns=[nz.PlateColumn(name="1"), nz.PlateColumn(name="2")], rows=[nz.PlateRow(name="A")],
                     wells=wells, name="plate", field_count=1, version="0.5")
    nz.to_hcs_zarr(nz.HCSPlate(plate_path, plate), plate_path)
    for column, offset in (("1", 0), ("2", 500)):
        field = ((np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) + offset) % 4000).astype(np.uint16)
        pyramid = nz.to_multiscales(nz.to_ngff_image(field, dims=["y", "x"]), scale_factors=[2], chunks=16)
        nz.write_hcs_well_image(plate_path, pyramid, plate, "A", column, 0, version="0.5", chunks_per_shard=2)
    # An image 0.4 cannot express: one space axis (as 0.6 may allow), written as 0.5 by hand.
    odd = zarr.open_group(store / "odd", mode="w", zarr_format=3)
    odd.create_array("0", shape=(4, 8), chunks=(2, 4), shards=(4, 8), dtype="uint8")[...] = 1
    odd.attrs["ome"] = {"version": "0.5", "multiscales": [{
        "axes": [{"name": "t", "type": "time"}, {"name": "x", "type": "space"}],
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1]}]}]}]}


def level_paths(store: Path, group: str):
    """The dataset paths of the multiscales of `group`, from its stored 0.5 metadata."""
    ome = zarr.open_group(store / group, mode="r", zarr_format=3).attrs["ome"]
    return [d["path"] for d in ome["multiscales"][0]["datasets"]]


def save_expected(store: Path, expected: Path):
    """Each level of each image as zarr-python 3 reads it from the sharded store."""
    levels = {}
    for group in IMAGES:
        for level, path in enumerate(level_paths(store, group)):
            name = f"{group}/{level}".replace("/", "_") + ".npy"
            np.save(expected / name, zarr.open_array(store / group / path, mode="r")[...])
            levels[f"{group}/{level}"] = name
    (expected / "levels.json").write_text(json.dumps(levels))
    return levels


@pytest.fixture(scope="module")
def ome(tmp_path_factory):
    """The OME-Zarr 0.5 store as ngff-zarr writes it, and each level as zarr-python 3 reads it."""
    work = tmp_path_factory.mktemp("ome")
    store, expected = work / "store", work / "expected"
    write_store(store)
    expected.mkdir()
    return SimpleNamespace(store=store, expected=expected, levels=save_expected(store, expected))


@pytest.fixture(scope="module")
def views(ome, tmp_path_factory):
    """Read-only mounts of the store: the v2 view and the v3 view, logging to one file."""
    log = tmp_path_factory.mktemp("log") / "read.log"
    with shardfs.mount(ome.store, zarr_format=2, read_only=True, log_file=log) as v2, \
            shardfs.mount(ome.store, read_only=True, log_file=log) as v3:
        yield SimpleNamespace(v2=Path(v2), v3=Path(v3), log=log)


@pytest.fixture(scope="module")
def ome_zarr_read(ome, views):
    """What ome-zarr 0.9 (zarr-python 2.18) finds and reads in the v2 view."""
    run = subprocess.run([V04_PYTHON, "-c", READER, views.v2, ome.expected], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-800:]
    return json.loads(run.stdout)


def test_ngff_zarr_wrote_the_image_sharded(ome):
    sharded = json.loads((ome.store / "image" / level_paths(ome.store, "image")[0] / "zarr.json").read_text())
    assert sharded["codecs"][0]["name"] == "sharding_indexed"


GROUPS = (("image", "image.Image"), ("image/labels", "labels.Labels"), ("image/labels/cells", "image_label.ImageLabel"),
          ("plate", "hcs.HCS"), ("plate/A/1", "well.Well"), ("plate/A/2/0", "image.Image"))


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("path,model", GROUPS)
def test_ome_zarr_models_validates_each_group(views, zarr_format, path, model):
    """The v2 view as OME-Zarr 0.4, the v3 view as 0.5."""
    models = v04 if zarr_format == 2 else v05
    module, name = model.split(".")
    group = zarr.open_group((views.v2 if zarr_format == 2 else views.v3) / path, mode="r", zarr_format=zarr_format)
    getattr(getattr(models, module), name).from_zarr(group)


def test_the_v2_view_shows_0_5_metadata_in_0_4_form(ome, views):
    attrs = json.loads((views.v2 / "image/.zattrs").read_text())
    stored = zarr.open_group(ome.store / "image", mode="r").attrs["ome"]
    assert "ome" not in attrs and attrs["multiscales"][0]["version"] == "0.4", attrs
    assert attrs["omero"]["version"] == "0.4", attrs
    assert attrs["multiscales"][0]["datasets"] == stored["multiscales"][0]["datasets"]
    plate = json.loads((views.v2 / "plate/.zattrs").read_text())
    assert plate.get("plate", {}).get("version") == "0.4", plate


def test_zmetadata_holds_each_groups_zattrs_as_the_view_shows_it(views):
    zmetadata = json.loads((views.v2 / ".zmetadata").read_text())["metadata"]
    paths = ["image/.zattrs", "image/labels/.zattrs", "image/labels/cells/.zattrs", "plate/.zattrs",
             "plate/A/1/.zattrs", "odd/.zattrs"]
    assert [p for p in paths if zmetadata.get(p) != json.loads((views.v2 / p).read_text())] == []


def test_a_group_0_4_cannot_express_keeps_its_0_5_form_with_one_log_line(views):
    """One space axis: 0.4 cannot say it."""
    odd = json.loads((views.v2 / "odd/.zattrs").read_text())
    assert odd.get("ome", {}).get("version") == "0.5" and "multiscales" not in odd, odd
    (views.v2 / ".zmetadata").read_bytes()
    lines = [line for line in views.log.read_text().splitlines()
             if "odd/zarr.json: OME-Zarr metadata kept in 0.5 form" in line]
    assert len(lines) == 1, lines


@pytest.mark.parametrize("path", IMAGES)
def test_ome_zarr_0_9_reads_each_image_of_the_v2_view_exactly(ome, ome_zarr_read, path):
    got = ome_zarr_read.get(path, {})
    want = [True] * sum(1 for k in ome.levels if k.rsplit("/", 1)[0] == path)
    assert "Multiscales" in got.get("specs", []) and got.get("levels") == want, got


def test_ome_zarr_0_9_finds_the_channels_and_the_label_image(ome_zarr_read):
    image = ome_zarr_read["image"]
    assert "OMERO" in image["specs"] and "cells" in image["nodes"], image
    assert "Label" in ome_zarr_read["image/labels/cells"]["specs"], ome_zarr_read["image/labels/cells"]


def test_info_names_the_group_kept_in_0_5_form_and_the_others(ome):
    info = subprocess.run([BINARY, "info", "--zarr-format", "2", ome.store], capture_output=True, text=True)
    lines = info.stdout.splitlines()
    odd = [line for line in lines if line.split() and line.split()[0] == "odd" and "group" in line]
    assert len(odd) == 1 and "kept in 0.5 form" in odd[0] and "space axes" in odd[0], info.stdout[-800:]
    shown = [line for line in lines if "OME-Zarr 0.5 shown as 0.4" in line]
    assert len(shown) == 8, shown


@pytest.fixture(scope="module")
def written(ome, tmp_path_factory):
    """A copy of the store after writes through a writable v2 mount: a .zattrs written back
    unchanged, a channel renamed by zarr-python 2.18 and a new image by ome-zarr 0.9."""
    work = tmp_path_factory.mktemp("written")
    store = work / "store"
    shutil.copytree(ome.store, store)
    before = SimpleNamespace(well=(store / "plate/A/1/zarr.json").read_bytes(),
                             image=json.loads((store / "image/zarr.json").read_text()))
    new = work / "written.npy"
    with shardfs.mount(store, zarr_format=2, shard_new=2, log_file=work / "write.log") as mnt:
        zattrs = Path(mnt) / "plate/A/1/.zattrs"
        zattrs.write_bytes(zattrs.read_bytes())
        rename = subprocess.run([V04_PYTHON, "-c", RENAME, mnt], capture_output=True, text=True)
        renamed = json.loads((Path(mnt) / "image/.zattrs").read_text())
        write = subprocess.run([V04_PYTHON, "-c", WRITE, mnt, new], capture_output=True, text=True)
    return SimpleNamespace(store=store, before=before, new=new, rename=rename, renamed=renamed, write=write)


def test_zarr_python_2_renames_a_channel_through_the_v2_view(written):
    assert written.rename.returncode == 0, written.rename.stderr[-800:]
    assert written.renamed.get("omero", {}).get("channels", [{}])[0].get("label") == "Hoechst", written.renamed


def test_a_zattrs_written_back_unchanged_leaves_the_document_as_it_was(written):
    assert (written.store / "plate/A/1/zarr.json").read_bytes() == written.before.well


def test_the_rename_is_stored_in_0_5_form_and_validates(written):
    after = json.loads((written.store / "image/zarr.json").read_text())
    want = json.loads(json.dumps(written.before.image))
    want["attributes"]["ome"]["omero"]["channels"][0]["label"] = "Hoechst"
    assert after == want
    v05.image.Image.from_zarr(zarr.open_group(written.store / "image", mode="r", zarr_format=3))


def test_an_image_ome_zarr_0_9_writes_is_stored_as_valid_0_5_sharded(written):
    assert written.write.returncode == 0, written.write.stderr[-800:]
    attrs = json.loads((written.store / "written/zarr.json").read_text())["attributes"]
    ome = attrs.get("ome", {})
    assert ome.get("version") == "0.5" and "multiscales" not in attrs, attrs
    assert "version" not in ome.get("multiscales", [{}])[0], attrs
    # Its metadata only: ome-zarr 0.9 writes no _ARRAY_DIMENSIONS, so its arrays have no
    # dimension_names, which 0.5 wants (the view does not take them from the group's axes).
    model = v05.image.ImageAttrs.model_validate(ome)
    got = zarr.open_array(written.store / "written" / model.multiscales[0].datasets[0].path, mode="r")
    assert np.array_equal(got[...], np.load(written.new))
    assert got.metadata.codecs[0].__class__.__name__ == "ShardingCodec", got.metadata.codecs


def test_shardfs_check_passes_after_the_writes(written):
    result = subprocess.run([BINARY, "check", written.store], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-500:]
