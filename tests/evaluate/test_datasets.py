"""Dataset SPECs: labels.tsv folders, IDX pairs (gzip or not), .npz; bad specs name the fault."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from torq.errors import TorqError
from torq.data.datasets import load_dataset, parse_labels_file, read_idx
from torq.data.preprocess import parse_preprocess

from .conftest import need_fmnist
from .fmnist_probe import TEST


def _idx(path, arr, gz=False):
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    data = head + arr.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_idx_pair_found_by_name(tmp_path, gz):
    x = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    suffix = ".gz" if gz else ""
    images = _idx(tmp_path / f"t-images-idx3-ubyte{suffix}", x, gz)
    _idx(tmp_path / f"t-labels-idx1-ubyte{suffix}", np.array([7, 0, 2]), gz)
    ds = load_dataset(images)
    assert len(ds) == 3 and ds.labels.tolist() == [7, 0, 2]
    assert np.array_equal(ds.load(1), x[1])


def test_idx_explicit_pair_and_bad_files(tmp_path):
    images = _idx(tmp_path / "a.idx", np.zeros((2, 3, 3)))
    labels = _idx(tmp_path / "b.idx", np.array([1, 2, 3]))
    with pytest.raises(TorqError, match=r"2 images but .*b\.idx has 3 labels"):
        load_dataset(f"{images},{labels}")
    (tmp_path / "bad.idx").write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00")
    with pytest.raises(TorqError, match="not an unsigned-byte IDX file"):
        read_idx(tmp_path / "bad.idx")
    short = bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x01\x02"
    (tmp_path / "short.idx").write_bytes(short)
    with pytest.raises(TorqError, match=r"says \[10\] \(10 bytes\) but holds 2 bytes"):
        read_idx(tmp_path / "short.idx")


def test_fashion_mnist_test_split():
    need_fmnist()
    ds = load_dataset(TEST)
    assert len(ds) == 10000 and ds.load(0).shape == (28, 28)
    assert np.bincount(ds.labels).tolist() == [1000] * 10       # balanced, as published
    assert ds.labels[:5].tolist() == [9, 2, 1, 1, 6]            # the well-known first test labels


def test_labels_tsv_folder(imagenet20):
    ds = load_dataset(imagenet20)
    assert len(ds) == 20
    assert ds.files[0] == "n01440764_tench.JPEG" and ds.labels[0] == 0 and ds.labels[1] == 2
    img = ds.load(0)
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    x = parse_preprocess("resize=256,crop=224,norm=tf").batch([img], (3, 224, 224))
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    assert x.min() >= -127 / 128 - 1e-6 and x.max() <= 1.0


def test_labels_file_errors(tmp_path):
    (tmp_path / "labels.tsv").write_text("file\tclass_index\na.png\tcat\n")
    with pytest.raises(TorqError, match=r"labels.tsv:2: class_index 'cat' is not an integer"):
        parse_labels_file(tmp_path / "labels.tsv")
    (tmp_path / "labels.tsv").write_text("name\tlabel\na.png\t1\n")
    with pytest.raises(TorqError, match=r"labels.tsv:1: header must name"):
        parse_labels_file(tmp_path / "labels.tsv")
    (tmp_path / "labels.tsv").write_text("file\tclass_index\nmissing.png\t1\n")
    with pytest.raises(TorqError, match="image missing.png is listed but missing"):
        load_dataset(tmp_path)


def test_missing_labels_and_unknown_spec(tmp_path):
    with pytest.raises(TorqError, match="no labels.tsv"):
        load_dataset(tmp_path)
    with pytest.raises(TorqError, match="no such file or folder"):
        load_dataset(tmp_path / "nope")
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(TorqError, match="unknown format"):
        load_dataset(tmp_path / "data.csv")


def test_npz_dataset_and_errors(tmp_path):
    np.savez(tmp_path / "ok.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.array([0, 1, 2, 3]))
    assert load_dataset(tmp_path / "ok.npz").labels.tolist() == [0, 1, 2, 3]
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((4, 8, 8), np.uint8))
    with pytest.raises(TorqError, match=r"missing array\(s\) y"):
        load_dataset(tmp_path / "nolabels.npz")
    np.savez(tmp_path / "mismatch.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.array([0, 1]))
    with pytest.raises(TorqError, match="x has 4 images but y has 2 labels"):
        load_dataset(tmp_path / "mismatch.npz")


def test_class_index_out_of_range(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((3, 8, 8), np.uint8), y=np.array([0, 12, 3]))
    with pytest.raises(TorqError, match=r"class index 12 of sample 1 is out of range: the model has 10 classes"):
        load_dataset(tmp_path / "d.npz").check_classes(10)


def test_preprocess_parsing_and_size_mismatch():
    p = parse_preprocess("resize=112,channels=3,norm=tf,order=bgr,layout=nhwc")
    img = (np.arange(28 * 28) % 256).astype(np.uint8).reshape(28, 28)
    x = p.batch([img], (112, 112, 3))
    assert x.shape == (1, 112, 112, 3) and np.array_equal(x[..., 0], x[..., 2])
    with pytest.raises(TorqError, match=r"unknown norm=foo"):
        parse_preprocess("norm=foo")
    with pytest.raises(TorqError, match=r"bad item 'size'"):
        parse_preprocess("size")
    with pytest.raises(TorqError, match=r"preprocessed image is 28×28×1 but model input 'input' expects 32×32×1"):
        parse_preprocess("norm=unit").batch([img], (1, 32, 32))
    exact = parse_preprocess("mean=127,std=128").batch([img], (1, 28, 28))
    assert np.array_equal(exact[0, 0], (img.astype(np.float32) - 127) / 128)


def test_unreadable_image(tmp_path):
    (tmp_path / "bad.JPEG").write_bytes(b"not a jpeg at all")
    (tmp_path / "labels.tsv").write_text("file\tclass_index\nbad.JPEG\t3\n")
    ds = load_dataset(tmp_path)
    with pytest.raises(TorqError, match=r"bad.JPEG: unreadable image"):
        ds.load(0)


def test_calibration_split_is_disjoint_from_evaluation(tmp_path):
    from torq.evaluate.run import EvalOptions, split
    x = np.arange(50, dtype=np.uint8).reshape(50, 1, 1) * np.ones((1, 4, 4), np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(50) % 10)
    ds = load_dataset(tmp_path / "d.npz")
    evaluation, calib = split(ds, EvalOptions(calibration_split=10, limit=30))
    ev_ids = {int(evaluation.load(i)[0, 0]) for i in range(len(evaluation))}
    cal_ids = {int(calib.load(i)[0, 0]) for i in range(len(calib))}
    assert len(calib) == 10 and len(evaluation) == 30 and not ev_ids & cal_ids
    with pytest.raises(TorqError, match="leaves no evaluation images"):
        split(ds, EvalOptions(calibration_split=50))
