"""evaluate reads images faithfully and validates what it is given (audit 3: B8, B9, B11, B19,
B20, B26, B33): every image mode read as its 8-bit picture or refused with the reason, fixed-batch
models evaluated with any --batch, memory bounded before allocating, the calibration/evaluation
split checked on real files, every numeric flag validated.
"""
from __future__ import annotations

import os
import struct
from dataclasses import replace
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from torq.errors import TorqError
from torq.data.datasets import load_dataset, read_image
from torq.evaluate.run import EvalOptions, split
from torq.gen_config.cli import main


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return code, err


def one_line(code, err, *needles):
    assert code == 2 and err.count("\n") == 0 and "error:" in err, err
    for n in needles:
        assert n in err, err


PHOTO = np.add.outer(np.arange(40), np.arange(40)).astype(np.float64) * (255 / 78)   # 0..255 ramp


def test_sixteen_bit_and_float_images_keep_their_picture(tmp_path):                 # B8
    Image.fromarray((PHOTO * 257).astype(np.uint16)).save(tmp_path / "p16.png")
    assert Image.open(tmp_path / "p16.png").mode.startswith("I")
    got = read_image(tmp_path / "p16.png")
    assert got.shape == (40, 40, 3) and abs(got.mean() - PHOTO.mean()) < 1.0
    Image.fromarray((PHOTO / 255).astype(np.float32), mode="F").save(tmp_path / "f.tif")
    got = read_image(tmp_path / "f.tif")
    assert abs(got.mean() - PHOTO.mean()) < 1.0
    Image.fromarray(np.full((4, 4), 7.5e3, np.float32), mode="F").save(tmp_path / "bad.tif")
    with pytest.raises(TorqError, match="float image with values outside"):
        read_image(tmp_path / "bad.tif")


def test_palette_cmyk_and_exif_orientation(tmp_path):                                # B8
    rgb = np.zeros((10, 20, 3), np.uint8)
    rgb[:, :10] = (255, 0, 0)
    Image.fromarray(rgb).convert("P").save(tmp_path / "p.png")
    assert (read_image(tmp_path / "p.png") == rgb).all()
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "c.jpg", quality=100)
    assert np.abs(read_image(tmp_path / "c.jpg").astype(int) - rgb).max() < 40
    im = Image.fromarray(rgb)
    exif = im.getexif()
    exif[0x0112] = 6                      # rotate 90° clockwise to display
    im.save(tmp_path / "r.jpg", exif=exif, quality=100)
    assert read_image(tmp_path / "r.jpg").shape == (20, 10, 3)


def _png_header(path, w, h):
    """A PNG that declares w×h pixels (no pixel data): what Image.open sees first."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("side", [10000, 20000])
def test_huge_images_are_refused_before_decoding(tmp_path, side):                   # B26
    with pytest.raises(TorqError, match=r"larger than the 67 MP evaluate reads"):
        read_image(_png_header(tmp_path / "big.png", side, side))


def test_dataset_files_are_confined_and_checked(tmp_path):                           # B26, B33
    ds = tmp_path / "ds"
    ds.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "outside.png")
    for entry in (str(tmp_path / "outside.png"), "../outside.png"):
        (ds / "labels.tsv").write_text(f"file\tclass_index\n{entry}\t1\n")
        with pytest.raises(TorqError, match="outside the dataset folder"):
            load_dataset(ds)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(ds / "a.png")
    (ds / "labels.tsv").write_text(f"file\tclass_index\na.png\t{10**30}\n")
    with pytest.raises(TorqError, match="out of range"):
        load_dataset(ds)
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 32, 32, 3), np.uint8), y=np.zeros(0, np.int64))
    with pytest.raises(TorqError, match="holds no images"):
        load_dataset(tmp_path / "empty.npz")


def test_calibration_is_never_evaluation_through_any_path(tmp_path, monkeypatch):   # B19
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(3):
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(ds / f"{i}.png")
    (ds / "labels.tsv").write_text("file\tclass_index\n" + "".join(f"{i}.png\t{i}\n" for i in range(3)))
    os.symlink(ds, tmp_path / "link")
    other = tmp_path / "calib"
    other.mkdir()
    os.symlink(ds / "1.png", other / "x.png")
    monkeypatch.chdir(tmp_path)
    for spec in (str(ds.resolve()), "./ds/", "link", str(other)):
        with pytest.raises(TorqError, match="shares"):
            base = EvalOptions()
            split(load_dataset("ds"), replace(base, recipe=base.recipe.replace(calibration_data=spec)))


def test_numeric_flags_are_validated(capsys, tmp_path):                              # B20, B26
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    for flag, value in (("--calibration-split", "-5"), ("--sqnr-images", "-3"), ("--batch", "0"),
                        ("--jobs", "0"), ("--limit", "-1"), ("--num-calib", "0"), ("--threads", "-1")):
        code, err = cli(capsys, "evaluate", "--model", model, "--dataset", tmp_path, flag, value)
        one_line(code, err, flag)


def _huge(path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "h",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8192, 8192])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8192, 8192])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_a_huge_declared_input_is_refused_before_allocating(capsys, tmp_path):       # B11
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, err = cli(capsys, "quantize", "--model", _huge(tmp_path / "huge.onnx"), "-o", tmp_path / "q.onnx")
    one_line(code, err, "--num-calib")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 << 10     # KiB
    assert not (tmp_path / "q.onnx").exists()


def test_default_batch_on_a_fixed_batch_one_model(capsys, tmp_path):                 # B9
    from torq.examples import build_example_cnn
    model = build_example_cnn(tmp_path / "m.onnx") and tmp_path / "m.onnx"
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ev.npz", x=rng.integers(0, 256, (11, 32, 32, 3), np.uint8), y=rng.integers(0, 10, 11))
    np.savez(tmp_path / "cal.npz", x=rng.integers(0, 256, (4, 32, 32, 3), np.uint8), y=rng.integers(0, 10, 4))
    code = main(["evaluate", "--model", str(model), "--dataset", str(tmp_path / "ev.npz"), "--calibration-data",
                 str(tmp_path / "cal.npz"), "--preprocess", "norm=unit", "--sqnr-images", "3",
                 "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "11" in out.out and (tmp_path / "out" / "evaluation.json").exists()
